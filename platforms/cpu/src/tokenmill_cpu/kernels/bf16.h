/* bfloat16 <-> float32, shared by the layer kernels and the attention kernels (included by the
 * sources; build_native_library keys its cache on included local headers too). bfloat16 values
 * travel as their uint16 bits. element() and store() read and write either type, chosen by a flag
 * that is a constant where they are inlined. */
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

/* Element i of a float32 (bf16 = 0) or bfloat16 (bf16 = 1) array, as a float. */
static inline __attribute__((always_inline)) float element(const void *base, int64_t i, const int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* Stores x at element i of a float32 or bfloat16 array (rounded to nearest even). */
static inline __attribute__((always_inline)) void store(void *base, int64_t i, float x, const int bf16) {
    if (bf16)
        ((uint16_t *)base)[i] = f32_to_bf16(x);
    else
        ((float *)base)[i] = x;
}

#endif
