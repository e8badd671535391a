/* y = x @ W.T for W stored as raw ggml blocks (Q4_0, Q4_1, Q8_0), float32 activations, on the CPU.
 *
 * w:  [N][row_bytes] uint8, each row K / 32 blocks of the ggml type (d and m are float16):
 *       Q4_0 {d, qs[16]}:    weight j = ((qs[j % 16] >> 4 * (j / 16)) & 15) - 8) * d
 *       Q4_1 {d, m, qs[16]}: weight j = (qs[j % 16] >> 4 * (j / 16)) & 15) * d + m
 *       Q8_0 {d, qs[32]}:    weight j = qs[j] * d
 * x:  [M][K] float32, contiguous.   y: [M][y_stride] float32; row m gets columns [0, N).
 *
 * Each block is expanded to the exact float32 weights that dequantizing at load would give, then
 * multiplied into up to ROWS rows of x at once; only the order of the sums differs from x @ W.T.
 * Decoding is bound by memory bandwidth, and 4.5 bits per weight read instead of 32 is the point.
 * OpenMP splits the output columns (weight rows) across threads.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#define BLOCK 32
#define ROWS 8

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {  /* subnormal: normalise */
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400)) {
                mantissa <<= 1;
                exponent--;
            }
            bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
        }
    } else if (exponent == 0x1f) {
        bits = sign | 0x7f800000 | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint8_t v16u8 __attribute__((vector_size(16), aligned(1)));
typedef int8_t v16s8 __attribute__((vector_size(16), aligned(1)));

static inline v16f load16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* A block's 32 quants as float lanes (0-15, 16-31): the raw nibbles for the 4-bit types (Q4_0's -8
 * offset is folded into the block's "min"), the signed bytes for Q8_0. */
static inline __attribute__((always_inline)) void block_quants(const uint8_t *qs, int type, v16f *low, v16f *high) {
    if (type == Q8_0) {
        v16s8 lo, hi;
        memcpy(&lo, qs, 16);
        memcpy(&hi, qs + 16, 16);
        *low = __builtin_convertvector(__builtin_convertvector(lo, v16i), v16f);
        *high = __builtin_convertvector(__builtin_convertvector(hi, v16i), v16f);
        return;
    }
    v16u8 bytes;
    memcpy(&bytes, qs, 16);
    *low = __builtin_convertvector(__builtin_convertvector(bytes & 15, v16i), v16f);
    *high = __builtin_convertvector(__builtin_convertvector(bytes >> 4, v16i), v16f);
}

/* One weight row against `rows` rows of x: sum_b dot_b(q * d_b, x) + m_b * sum_b(x), where x_sums
 * holds each row's per-block sums of x ([rows][K / 32]). */
static inline __attribute__((always_inline)) void weight_row(const float *x, const float *x_sums, int64_t rows,
                                                               int64_t K, const uint8_t *row, int64_t block_bytes,
                                                               int type, float *y, int64_t y_stride) {
    const int64_t blocks = K / BLOCK;
    const int64_t quant_offset = type == Q4_1 ? 4 : 2;
    v16f acc[ROWS];
    float offsets[ROWS];
    for (int64_t m = 0; m < rows; ++m) {
        acc[m] = (v16f){0};
        offsets[m] = 0.0f;
    }
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *block = row + b * block_bytes;
        const float d = half_to_float(block);
        const float min = type == Q4_1 ? half_to_float(block + 2) : type == Q4_0 ? -8.0f * d : 0.0f;
        v16f low, high;
        block_quants(block + quant_offset, type, &low, &high);
        low *= d;
        high *= d;
        for (int64_t m = 0; m < rows; ++m) {
            const float *xb = x + m * K + b * BLOCK;
            acc[m] += low * load16(xb) + high * load16(xb + 16);
            offsets[m] += min * x_sums[m * blocks + b];
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        float s = offsets[m];
        for (int j = 0; j < 16; ++j) s += acc[m][j];
        y[m * y_stride] = s;
    }
}

static int64_t block_bytes_of(int type) {
    return type == Q8_0 ? 34 : type == Q4_1 ? 20 : 18;
}

/* weight_row with the type and the row count as constants, so each instance keeps its accumulators in
 * registers (a variable count leaves them in memory: a load-add-store chain per block). */
#define ROW_KERNEL(TYPE, ROWS_N)                                                                                  \
    static void row_##TYPE##_##ROWS_N(const float *x, const float *sums, int64_t K, const uint8_t *row,          \
                                      int64_t block_bytes, float *y, int64_t y_stride) {                         \
        weight_row(x, sums, ROWS_N, K, row, block_bytes, TYPE, y, y_stride);                                     \
    }
#define ROW_KERNELS(TYPE) ROW_KERNEL(TYPE, 1) ROW_KERNEL(TYPE, 2) ROW_KERNEL(TYPE, 3) ROW_KERNEL(TYPE, 4)          \
    ROW_KERNEL(TYPE, 5) ROW_KERNEL(TYPE, 6) ROW_KERNEL(TYPE, 7) ROW_KERNEL(TYPE, 8)
ROW_KERNELS(Q4_0)
ROW_KERNELS(Q4_1)
ROW_KERNELS(Q8_0)

typedef void (*row_kernel)(const float *, const float *, int64_t, const uint8_t *, int64_t, float *, int64_t);
#define ROW_TABLE(TYPE) {row_##TYPE##_1, row_##TYPE##_2, row_##TYPE##_3, row_##TYPE##_4, row_##TYPE##_5,       \
                         row_##TYPE##_6, row_##TYPE##_7, row_##TYPE##_8}
static const row_kernel Q4_0_ROWS[ROWS] = ROW_TABLE(Q4_0);
static const row_kernel Q4_1_ROWS[ROWS] = ROW_TABLE(Q4_1);
static const row_kernel Q8_0_ROWS[ROWS] = ROW_TABLE(Q8_0);

/* Returns 0, or -1 for a type or shape this kernel does not handle (K must be a multiple of 32). */
int gguf_matmul_f32(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes, int64_t N, int type,
                    float *y, int64_t y_stride) {
    if ((type != Q4_0 && type != Q4_1 && type != Q8_0) || K % BLOCK != 0) return -1;
    const row_kernel *kernels = type == Q4_1 ? Q4_1_ROWS : type == Q8_0 ? Q8_0_ROWS : Q4_0_ROWS;
    const int64_t block_bytes = block_bytes_of(type), blocks = K / BLOCK;
    float *x_sums = malloc(sizeof(float) * (size_t)(M * blocks > 0 ? M * blocks : 1));
    if (x_sums == NULL) return -1;
    for (int64_t i = 0; i < M * blocks; ++i) {
        float s = 0.0f;
        for (int j = 0; j < BLOCK; ++j) s += x[i * BLOCK + j];
        x_sums[i] = s;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            const int64_t rows = M - m0 < ROWS ? M - m0 : ROWS;
            kernels[rows - 1](x + m0 * K, x_sums + m0 * blocks, K, w + n * row_bytes, block_bytes,
                              y + m0 * y_stride + n, y_stride);
        }
    }
    free(x_sums);
    return 0;
}
