/* y = x @ W.T for W stored as raw ggml blocks (Q4_0, Q4_1, Q8_0), float32 activations, on the CPU.
 *
 * w:  [N][row_bytes] uint8, each row K / 32 blocks of the ggml type (d and m are float16):
 *       Q4_0 {d, qs[16]}:    weight j = ((qs[j % 16] >> 4 * (j / 16)) & 15) - 8) * d
 *       Q4_1 {d, m, qs[16]}: weight j = (qs[j % 16] >> 4 * (j / 16)) & 15) * d + m
 *       Q8_0 {d, qs[32]}:    weight j = qs[j] * d
 * x:  [M][K] float32, contiguous.   y: [M][y_stride] float32; row m gets columns [0, N).
 *
 * Each block is multiplied into up to ROWS rows of x at once: with AVX-512 as the exact float32
 * weights that dequantizing at load gives (only the order of the sums differs from x @ W.T), in the
 * other paths as d * dot(q, x) + m * sum(x), the same products regrouped.
 * Decoding is bound by memory bandwidth, and 4.5 bits per weight read instead of 32 is the point.
 * OpenMP splits the output columns (weight rows) across threads. weight_row exists three times: with
 * AVX-512F or AVX2+FMA intrinsics (GCC 12 scalarises byte-vector conversions written with vector
 * extensions: Q8_0 rows ran 7x slower), and in portable vector extensions for other CPUs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
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

#if defined(__AVX512F__)
#define X_SUMS 0 /* the exact weights below carry the 4-bit types' offsets themselves */

/* One weight row against `rows` rows of x (x86 with AVX-512F). Each block becomes its 32 float32
 * weights exactly as dequantizing at load computes them (Q4_1 d * q + m, Q4_0 d * (q - 8), Q8_0
 * q * d, with separate roundings), the 4-bit ones by looking the nibbles up in a 16-entry table of
 * the block's weights (vpermps reads an index's low 4 bits), and then go into every row with two FMAs. */
static inline __attribute__((always_inline)) void weight_row(const float *x, const float *x_sums, int64_t rows,
                                                               int64_t K, const uint8_t *row, int64_t block_bytes,
                                                               int type, float *y, int64_t y_stride) {
    (void)x_sums;
    const int64_t blocks = K / BLOCK;
    const int rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 levels = type == Q4_0 ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                                       : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc_low[ROWS], acc_high[ROWS];
    for (int64_t m = 0; m < rows; ++m) acc_low[m] = acc_high[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *block = row + b * block_bytes;
        const __m512 d = _mm512_set1_ps(half_to_float(block));
        __m512 low, high;
        if (type == Q8_0) {
            low = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 2)))),
                                      d, rounding);
            high = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 18)))),
                                       d, rounding);
        } else {
            __m512 table = _mm512_mul_round_ps(d, levels, rounding);
            if (type == Q4_1) table = _mm512_add_round_ps(table, _mm512_set1_ps(half_to_float(block + 2)), rounding);
            const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(block + (type == Q4_1 ? 4 : 2))));
            low = _mm512_permutexvar_ps(bytes, table);
            high = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
        }
        for (int64_t m = 0; m < rows; ++m) {
            const float *xb = x + m * K + b * BLOCK;
            acc_low[m] = _mm512_fmadd_ps(low, _mm512_loadu_ps(xb), acc_low[m]);
            acc_high[m] = _mm512_fmadd_ps(high, _mm512_loadu_ps(xb + 16), acc_high[m]);
        }
    }
    for (int64_t m = 0; m < rows; ++m) y[m * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc_low[m], acc_high[m]));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define X_SUMS 1
/* Eight float lanes of bytes 0-7 of `bytes`, zero- or sign-extended. */
#define U8_LANES(bytes) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
#define S8_LANES(bytes) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))

/* One weight row against `rows` rows of x (x86 with AVX2 and FMA): sum_b d_b * dot_b(q, x) +
 * m_b * sum_b(x), where x_sums holds each row's per-block sums of x ([rows][K / 32]). */
static inline __attribute__((always_inline)) void weight_row(const float *x, const float *x_sums, int64_t rows,
                                                               int64_t K, const uint8_t *row, int64_t block_bytes,
                                                               int type, float *y, int64_t y_stride) {
    const int64_t blocks = K / BLOCK;
    const __m128i nibble = _mm_set1_epi8(15);
    __m256 acc[ROWS];
    float offsets[ROWS];
    for (int64_t m = 0; m < rows; ++m) {
        acc[m] = _mm256_setzero_ps();
        offsets[m] = 0.0f;
    }
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *block = row + b * block_bytes;
        const __m256 d = _mm256_set1_ps(half_to_float(block));
        __m256 q[4];
        if (type == Q8_0) {
            const __m128i first = _mm_loadu_si128((const __m128i *)(block + 2));
            const __m128i second = _mm_loadu_si128((const __m128i *)(block + 18));
            q[0] = S8_LANES(first);
            q[1] = S8_LANES(_mm_srli_si128(first, 8));
            q[2] = S8_LANES(second);
            q[3] = S8_LANES(_mm_srli_si128(second, 8));
        } else {
            const __m128i bytes = _mm_loadu_si128((const __m128i *)(block + (type == Q4_1 ? 4 : 2)));
            const __m128i low = _mm_and_si128(bytes, nibble), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
            q[0] = U8_LANES(low);
            q[1] = U8_LANES(_mm_srli_si128(low, 8));
            q[2] = U8_LANES(high);
            q[3] = U8_LANES(_mm_srli_si128(high, 8));
        }
        for (int64_t m = 0; m < rows; ++m) {
            const float *xb = x + m * K + b * BLOCK;
            __m256 dot = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
            dot = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), dot);
            dot = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), dot);
            dot = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), dot);
            acc[m] = _mm256_fmadd_ps(dot, d, acc[m]);
        }
        if (type != Q8_0) {
            const float min = type == Q4_1 ? half_to_float(block + 2) : -8.0f * half_to_float(block);
            for (int64_t m = 0; m < rows; ++m) offsets[m] += min * x_sums[m * blocks + b];
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
        const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        y[m * y_stride] = offsets[m] + _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
    }
}
#else
#define X_SUMS 1
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

/* One weight row against `rows` rows of x (portable vector extensions): sum_b dot_b(q * d_b, x) + m_b * sum_b(x), where x_sums
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
#endif

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
    float *x_sums = malloc(sizeof(float) * (size_t)(X_SUMS && M * blocks > 0 ? M * blocks : 1));
    if (x_sums == NULL) return -1;
    for (int64_t i = 0; X_SUMS && i < M * blocks; ++i) {
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
