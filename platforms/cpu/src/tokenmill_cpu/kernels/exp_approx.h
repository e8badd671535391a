/* exp_approx, shared by the layer kernels' SiLU and the attention kernels' softmax (included by
 * both sources; build_native_library keys its cache on included local headers too). */
#ifndef TOKENMILL_EXP_APPROX_H
#define TOKENMILL_EXP_APPROX_H

#include <math.h>
#include <stdint.h>

/* exp(x): x = n ln2 + r, |r| <= ln2 / 2, e^r by its degree-7 Taylor polynomial (truncation below
 * 0.1 ulp), times 2^n built in the exponent bits; 0 below 2^-125 and infinity above 2^128, so no
 * result or intermediate is ever subnormal. The clamp is on the result, not on x: a clamped x lets
 * the compiler divide by the constant 1 + e^88 in every lane (subnormal quotients, a microcode
 * assist each: SiLU ran 10x slower). Vectorises (no library call). */
static inline float exp_approx(float x) {
    const float n = roundf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* Selects one condition at a time and a union for the bits: GCC if-converts and vectorises
     * this form, and leaves a nested ternary or memcpy scalar (a call per element). */
    const float at_least = n < -125.0f ? -125.0f : n;
    const float exponent = at_least > 127.0f ? 127.0f : at_least;
    const union { int32_t bits; float value; } scale = { .bits = ((int32_t)exponent + 127) << 23 };
    const float finite = n < -125.0f ? 0.0f : p * scale.value;
    return n > 127.0f ? INFINITY : finite;
}

#endif
