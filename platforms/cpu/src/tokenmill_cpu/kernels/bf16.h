/* bfloat16 <-> float32, shared by the layer kernels and the attention kernels (included by both
 * sources; build_native_library keys its cache on included local headers too). bfloat16 values
 * travel as their uint16 bits. */
#ifndef TOKENMILL_BF16_H
#define TOKENMILL_BF16_H

#include <stdint.h>

/* The float a bfloat16 stands for (exact: its bits are the float's upper half). */
static inline float bf16_to_f32(uint16_t h) {
    const union { uint32_t bits; float value; } widened = {.bits = (uint32_t)h << 16};
    return widened.value;
}

/* x rounded to the nearest bfloat16, ties to even (as PyTorch rounds); a NaN stays a quiet NaN. */
static inline uint16_t f32_to_bf16(float x) {
    const union { float value; uint32_t bits; } u = {.value = x};
    const uint32_t rounded = (u.bits + 0x7FFFu + ((u.bits >> 16) & 1u)) >> 16;
    return (uint16_t)((u.bits & 0x7FFFFFFFu) > 0x7F800000u ? (u.bits >> 16) | 0x40u : rounded);
}

#endif
