/* Fused per-token layers for float32 and bfloat16 activations: residual add + RMSNorm, NeoX rotary
 * embedding of queries and keys, SiLU-gated multiply, and a row gather (token embeddings, rotary
 * angles). Each replaces a chain of small tensor operations whose dispatch costs more than their
 * arithmetic at decode batch sizes.
 *
 * Elementwise arithmetic follows core's PyTorch code operation by operation (no contraction into
 * FMAs, no reassociation: the pragma below overrides the build's -fassociative-math), so rotary
 * and the residual add give the same bits; only the RMSNorm sum of squares (16 partial sums) and
 * exp inside SiLU (a polynomial) round differently. Each kernel is one body for both dtypes: the
 * bfloat16 variants (values as uint16 bits) round to bfloat16 wherever PyTorch's bfloat16 operations
 * do, after every operation, each one computed in float32.
 * Rows are independent; OpenMP splits them across threads when there are many.
 */
#pragma GCC optimize("fp-contract=off", "no-associative-math")
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "exp_approx.h"

#define LANES 16
#define PARALLEL_ROWS 32

/* x as the dtype would hold it: rounded to bfloat16 (bf16 = 1), or unchanged (float32). One PyTorch
 * bfloat16 operation is its float32 result rounded so. */
static inline __attribute__((always_inline)) float rounded(float x, const int bf16) {
    return bf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

/* normed[t] = weight * (x' * 1 / sqrt(sum(x'^2) / H + eps)) with x' = x[t] (+ residual[t], also
 * written to sum[t] when residual is given), the product before the weight's rounded to the dtype
 * (core's RMSNorm casts back before multiplying). Strides are in elements, between rows. Row t only:
 * the callers' OpenMP loops pass bf16 as a literal, so each dtype gets its own vectorised body. */
static inline __attribute__((always_inline)) void rms_norm_row(const void *x, int64_t x_stride, const void *residual,
                                                               int64_t residual_stride, const void *weight, float eps,
                                                               int64_t t, int64_t H, void *normed, void *sum,
                                                               const int bf16) {
    const int64_t width = bf16 ? 2 : 4;
    const void *row = (const char *)x + t * x_stride * width;
    void *out = (char *)normed + t * H * width;
    if (residual != NULL) {
        const void *r = (const char *)residual + t * residual_stride * width;
        void *s = (char *)sum + t * H * width;
        for (int64_t i = 0; i < H; ++i) store(s, i, element(row, i, bf16) + element(r, i, bf16), bf16);
        row = s;
    }
    float partial[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= H; i += LANES)
        for (int j = 0; j < LANES; ++j) partial[j] += element(row, i + j, bf16) * element(row, i + j, bf16);
    for (; i < H; ++i) partial[0] += element(row, i, bf16) * element(row, i, bf16);
    float squares = 0.0f;
    for (int j = 0; j < LANES; ++j) squares += partial[j];
    const float scale = 1.0f / sqrtf(squares / (float)H + eps);
    for (int64_t k = 0; k < H; ++k)
        store(out, k, element(weight, k, bf16) * rounded(element(row, k, bf16) * scale, bf16), bf16);
}

void rms_norm_f32(const float *x, int64_t x_stride, const float *residual, int64_t residual_stride,
                  const float *weight, float eps, int64_t T, int64_t H, float *normed, float *sum) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t)
        rms_norm_row(x, x_stride, residual, residual_stride, weight, eps, t, H, normed, sum, 0);
}

void rms_norm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *residual, int64_t residual_stride,
                   const uint16_t *weight, float eps, int64_t T, int64_t H, uint16_t *normed, uint16_t *sum) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t)
        rms_norm_row(x, x_stride, residual, residual_stride, weight, eps, t, H, normed, sum, 1);
}

/* out[t, h] = (x1 cos - x2 sin, x2 cos + x1 sin, x[rotary_dim:]) for head h of row t of x, where x1 / x2
 * are the halves of the first rotary_dim features and cos / sin are [T][rotary_dim / 2]; every product
 * and sum rounded to the dtype, as PyTorch computes it. Offsets count elements. */
static inline __attribute__((always_inline)) void rotate_heads(const void *x, int64_t heads, int64_t head_size,
                                                               int64_t rotary_dim, const void *cos_t,
                                                               const void *sin_t, void *out, const int bf16) {
    const int64_t half = rotary_dim / 2, width = bf16 ? 2 : 4;
    for (int64_t h = 0; h < heads; ++h) {
        const char *in = (const char *)x + h * head_size * width;
        char *o = (char *)out + h * head_size * width;
        for (int64_t i = 0; i < half; ++i) {
            const float x1 = element(in, i, bf16), x2 = element(in, half + i, bf16);
            const float c = element(cos_t, i, bf16), s = element(sin_t, i, bf16);
            store(o, i, rounded(x1 * c, bf16) - rounded(x2 * s, bf16), bf16);
            store(o, half + i, rounded(x2 * c, bf16) + rounded(x1 * s, bf16), bf16);
        }
        if (rotary_dim < head_size)
            memcpy(o + rotary_dim * width, in + rotary_dim * width, width * (head_size - rotary_dim));
    }
}

/* Row t of queries [T][q_heads][D] and keys [T][k_heads][D], rows q_stride / k_stride elements apart
 * (heads contiguous within a row), rotated into contiguous q_out / k_out. */
static inline __attribute__((always_inline)) void rotary_row(const void *q, int64_t q_stride, int64_t q_heads,
                                                             const void *k, int64_t k_stride, int64_t k_heads,
                                                             int64_t t, int64_t head_size, int64_t rotary_dim,
                                                             const void *cos, const void *sin, void *q_out,
                                                             void *k_out, const int bf16) {
    const int64_t half = rotary_dim / 2, width = bf16 ? 2 : 4;
    const char *c = (const char *)cos + t * half * width, *s = (const char *)sin + t * half * width;
    rotate_heads((const char *)q + t * q_stride * width, q_heads, head_size, rotary_dim, c, s,
                 (char *)q_out + t * q_heads * head_size * width, bf16);
    rotate_heads((const char *)k + t * k_stride * width, k_heads, head_size, rotary_dim, c, s,
                 (char *)k_out + t * k_heads * head_size * width, bf16);
}

void rotary_f32(const float *q, int64_t q_stride, int64_t q_heads, const float *k, int64_t k_stride, int64_t k_heads,
                int64_t T, int64_t head_size, int64_t rotary_dim, const float *cos, const float *sin, float *q_out,
                float *k_out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t)
        rotary_row(q, q_stride, q_heads, k, k_stride, k_heads, t, head_size, rotary_dim, cos, sin, q_out, k_out, 0);
}

void rotary_bf16(const uint16_t *q, int64_t q_stride, int64_t q_heads, const uint16_t *k, int64_t k_stride,
                 int64_t k_heads, int64_t T, int64_t head_size, int64_t rotary_dim, const uint16_t *cos,
                 const uint16_t *sin, uint16_t *q_out, uint16_t *k_out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t)
        rotary_row(q, q_stride, q_heads, k, k_stride, k_heads, t, head_size, rotary_dim, cos, sin, q_out, k_out, 1);
}

/* out[t] = silu(gate) * up for row x[t] = (gate, up) of 2 * d elements, x_stride apart (silu rounded
 * to the dtype before the product, as PyTorch's two operations are). */
static inline __attribute__((always_inline)) void silu_and_mul_row(const void *x, int64_t x_stride, int64_t t,
                                                                   int64_t d, void *out, const int bf16) {
    const int64_t width = bf16 ? 2 : 4;
    const char *gate = (const char *)x + t * x_stride * width, *up = gate + d * width;
    char *o = (char *)out + t * d * width;
    for (int64_t i = 0; i < d; ++i) {
        const float g = element(gate, i, bf16);
        store(o, i, rounded(g / (1.0f + exp_approx(-g)), bf16) * element(up, i, bf16), bf16);
    }
}

void silu_and_mul_f32(const float *x, int64_t x_stride, int64_t T, int64_t d, float *out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) silu_and_mul_row(x, x_stride, t, d, out, 0);
}

void silu_and_mul_bf16(const uint16_t *x, int64_t x_stride, int64_t T, int64_t d, uint16_t *out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) silu_and_mul_row(x, x_stride, t, d, out, 1);
}

/* out[t] = table[indices[t]] for rows of row_bytes bytes (any dtype). An index outside
 * [0, num_rows) yields a zero row and is counted: the return value is the number of such indices. */
int64_t gather_rows(const char *table, int64_t num_rows, int64_t row_bytes, const int64_t *indices, int64_t T,
                    char *out) {
    int64_t refused = 0;
    for (int64_t t = 0; t < T; ++t) {
        const int64_t row = indices[t];
        if (row < 0 || row >= num_rows) {
            memset(out + t * row_bytes, 0, (size_t)row_bytes);
            ++refused;
        } else {
            memcpy(out + t * row_bytes, table + row * row_bytes, (size_t)row_bytes);
        }
    }
    return refused;
}
