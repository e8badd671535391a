/* Fused per-token layers for float32 and bfloat16 activations: residual add + RMSNorm, NeoX rotary
 * embedding of queries and keys, SiLU-gated multiply, and a row gather (token embeddings, rotary
 * angles). Each replaces a chain of small tensor operations whose dispatch costs more than their
 * arithmetic at decode batch sizes.
 *
 * Elementwise arithmetic follows core's PyTorch code operation by operation (no contraction into
 * FMAs, no reassociation: the pragma below overrides the build's -fassociative-math), so rotary
 * and the residual add give the same bits; only the RMSNorm sum of squares (16 partial sums) and
 * exp inside SiLU (a polynomial) round differently. The bfloat16 variants (values as uint16 bits)
 * round to bfloat16 wherever PyTorch's bfloat16 operations do: after every operation, each one
 * computed in float32.
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

/* normed[t] = weight * (x' * 1 / sqrt(sum(x'^2) / H + eps)) with x' = x[t] (+ residual[t], also
 * written to sum[t] when residual is given). Strides are in floats, between rows. */
void rms_norm_f32(const float *x, int64_t x_stride, const float *residual, int64_t residual_stride,
                  const float *weight, float eps, int64_t T, int64_t H, float *normed, float *sum) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const float *row = x + t * x_stride;
        float *out = normed + t * H;
        if (residual != NULL) {
            const float *r = residual + t * residual_stride;
            float *s = sum + t * H;
            for (int64_t i = 0; i < H; ++i) s[i] = row[i] + r[i];
            row = s;
        }
        float partial[LANES] = {0};
        int64_t i = 0;
        for (; i + LANES <= H; i += LANES)
            for (int j = 0; j < LANES; ++j) partial[j] += row[i + j] * row[i + j];
        for (; i < H; ++i) partial[0] += row[i] * row[i];
        float squares = 0.0f;
        for (int j = 0; j < LANES; ++j) squares += partial[j];
        const float scale = 1.0f / sqrtf(squares / (float)H + eps);
        for (int64_t k = 0; k < H; ++k) out[k] = weight[k] * (row[k] * scale);
    }
}

/* out[t, h] = (x1 cos - x2 sin, x2 cos + x1 sin, x[rotary_dim:]) for head h of row t of x, where x1 / x2
 * are the halves of the first rotary_dim features and cos / sin are [T][rotary_dim / 2]. */
static void rotate_heads(const float *x, int64_t heads, int64_t head_size, int64_t rotary_dim,
                         const float *cos_t, const float *sin_t, float *out) {
    const int64_t half = rotary_dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const float *in = x + h * head_size;
        float *o = out + h * head_size;
        for (int64_t i = 0; i < half; ++i) {
            const float x1 = in[i], x2 = in[half + i];
            o[i] = x1 * cos_t[i] - x2 * sin_t[i];
            o[half + i] = x2 * cos_t[i] + x1 * sin_t[i];
        }
        if (rotary_dim < head_size) memcpy(o + rotary_dim, in + rotary_dim, sizeof(float) * (head_size - rotary_dim));
    }
}

/* Queries [T][q_heads][D] and keys [T][k_heads][D], rows q_stride / k_stride floats apart (heads
 * contiguous within a row), rotated into contiguous q_out / k_out. */
void rotary_f32(const float *q, int64_t q_stride, int64_t q_heads, const float *k, int64_t k_stride, int64_t k_heads,
                int64_t T, int64_t head_size, int64_t rotary_dim, const float *cos, const float *sin, float *q_out,
                float *k_out) {
    const int64_t half = rotary_dim / 2;
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        rotate_heads(q + t * q_stride, q_heads, head_size, rotary_dim, cos + t * half, sin + t * half,
                     q_out + t * q_heads * head_size);
        rotate_heads(k + t * k_stride, k_heads, head_size, rotary_dim, cos + t * half, sin + t * half,
                     k_out + t * k_heads * head_size);
    }
}

/* out[t] = silu(gate) * up for rows x[t] = (gate, up) of 2 * d floats, x_stride floats apart. */
void silu_and_mul_f32(const float *x, int64_t x_stride, int64_t T, int64_t d, float *out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const float *gate = x + t * x_stride, *up = gate + d;
        float *o = out + t * d;
        for (int64_t i = 0; i < d; ++i) o[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
    }
}

/* rms_norm_f32 for bfloat16 rows and weight: the residual add rounded to bfloat16, the norm in
 * float32 rounded to bfloat16, then times the weight (rounded again), as core's RMSNorm does. */
void rms_norm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *residual, int64_t residual_stride,
                   const uint16_t *weight, float eps, int64_t T, int64_t H, uint16_t *normed, uint16_t *sum) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t *row = x + t * x_stride;
        uint16_t *out = normed + t * H;
        if (residual != NULL) {
            const uint16_t *r = residual + t * residual_stride;
            uint16_t *s = sum + t * H;
            for (int64_t i = 0; i < H; ++i) s[i] = f32_to_bf16(bf16_to_f32(row[i]) + bf16_to_f32(r[i]));
            row = s;
        }
        float partial[LANES] = {0};
        int64_t i = 0;
        for (; i + LANES <= H; i += LANES)
            for (int j = 0; j < LANES; ++j) partial[j] += bf16_to_f32(row[i + j]) * bf16_to_f32(row[i + j]);
        for (; i < H; ++i) partial[0] += bf16_to_f32(row[i]) * bf16_to_f32(row[i]);
        float squares = 0.0f;
        for (int j = 0; j < LANES; ++j) squares += partial[j];
        const float scale = 1.0f / sqrtf(squares / (float)H + eps);
        for (int64_t k = 0; k < H; ++k)
            out[k] = f32_to_bf16(bf16_to_f32(weight[k]) * bf16_to_f32(f32_to_bf16(bf16_to_f32(row[k]) * scale)));
    }
}

/* a * b rounded to bfloat16, back as a float: one PyTorch bfloat16 multiply. */
static inline float mul_bf16(float a, float b) { return bf16_to_f32(f32_to_bf16(a * b)); }

static void rotate_heads_bf16(const uint16_t *x, int64_t heads, int64_t head_size, int64_t rotary_dim,
                              const uint16_t *cos_t, const uint16_t *sin_t, uint16_t *out) {
    const int64_t half = rotary_dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const uint16_t *in = x + h * head_size;
        uint16_t *o = out + h * head_size;
        for (int64_t i = 0; i < half; ++i) {
            const float x1 = bf16_to_f32(in[i]), x2 = bf16_to_f32(in[half + i]);
            const float c = bf16_to_f32(cos_t[i]), s = bf16_to_f32(sin_t[i]);
            o[i] = f32_to_bf16(mul_bf16(x1, c) - mul_bf16(x2, s));
            o[half + i] = f32_to_bf16(mul_bf16(x2, c) + mul_bf16(x1, s));
        }
        if (rotary_dim < head_size)
            memcpy(o + rotary_dim, in + rotary_dim, sizeof(uint16_t) * (head_size - rotary_dim));
    }
}

/* rotary_f32 for bfloat16 queries, keys and cos / sin (strides in elements). */
void rotary_bf16(const uint16_t *q, int64_t q_stride, int64_t q_heads, const uint16_t *k, int64_t k_stride,
                 int64_t k_heads, int64_t T, int64_t head_size, int64_t rotary_dim, const uint16_t *cos,
                 const uint16_t *sin, uint16_t *q_out, uint16_t *k_out) {
    const int64_t half = rotary_dim / 2;
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        rotate_heads_bf16(q + t * q_stride, q_heads, head_size, rotary_dim, cos + t * half, sin + t * half,
                          q_out + t * q_heads * head_size);
        rotate_heads_bf16(k + t * k_stride, k_heads, head_size, rotary_dim, cos + t * half, sin + t * half,
                          k_out + t * k_heads * head_size);
    }
}

/* silu_and_mul_f32 for bfloat16 rows: silu(gate) rounded to bfloat16, then times up (rounded). */
void silu_and_mul_bf16(const uint16_t *x, int64_t x_stride, int64_t T, int64_t d, uint16_t *out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t *gate = x + t * x_stride, *up = gate + d;
        uint16_t *o = out + t * d;
        for (int64_t i = 0; i < d; ++i) {
            const float g = bf16_to_f32(gate[i]);
            o[i] = f32_to_bf16(bf16_to_f32(f32_to_bf16(g / (1.0f + exp_approx(-g)))) * bf16_to_f32(up[i]));
        }
    }
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
