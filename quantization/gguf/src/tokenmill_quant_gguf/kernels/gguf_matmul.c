/* y = x @ W.T for W in ggml blocks (Q4_0, Q4_1, Q8_0) kept in the "CPU order", float32 activations.
 *
 * A checkpoint row is K / 32 blocks of its ggml type (d and m are float16):
 *   Q4_0 {d, qs[16]}:    weight j = ((qs[j % 16] >> 4 * (j / 16)) & 15) - 8) * d
 *   Q4_1 {d, m, qs[16]}: weight j = ((qs[j % 16] >> 4 * (j / 16)) & 15) * d + m
 *   Q8_0 {d, qs[32]}:    weight j = qs[j] * d
 * gguf_cpu_order rearranges a row in place, in the same bytes, into
 *   [K / 32 scale records: d (Q4_0, Q8_0) or d, m (Q4_1)] [K / 32 quant records: 16 bytes or Q8_0's 32]
 * where weight j of a 4-bit block is nibble j / 4 of the little-endian uint32 j % 4 of its record: one
 * 16-byte load broadcast to every 128-bit lane and shifted per 32-bit lane then holds 16 consecutive
 * weights' nibbles in lane order (no byte shuffle), and the scales of 16 blocks widen in one conversion.
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
#define SCALE_CHUNK 64 /* blocks whose float16 scales are widened at a time */
#define NEAR_AHEAD 2   /* prefetch distances, in steps of the loop over weight rows */
#define FAR_AHEAD 8

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };

static inline int64_t scales_per_block(int type) { return type == Q4_1 ? 2 : 1; }
static inline int64_t quant_bytes(int type) { return type == Q8_0 ? 32 : 16; }
static inline int64_t block_bytes_of(int type) { return 2 * scales_per_block(type) + quant_bytes(type); }

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

/* `count` float16 values at `h` (at most 2 * SCALE_CHUNK) widened into `out`. */
static inline void widen_halves(const uint8_t *h, int64_t count, float *out) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    for (int64_t i = 0; i < count; i += 16) {
        const int64_t left = count - i;
        const __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, h + 2 * i)));
    }
#else
    for (int64_t i = 0; i < count; ++i) out[i] = half_to_float(h + 2 * i);
#endif
}

#if defined(__AVX512F__)
#define X_SUMS 0 /* the exact weights below carry the 4-bit types' offsets themselves */

/* `weights` (1 or 2) consecutive weight rows against `rows` rows of x (x86 with AVX-512F; two weight rows
 * only with one row of x: two independent chains keep a decode step's loads in flight). Each block
 * becomes its 32 float32 weights exactly as dequantizing at load computes them (Q4_1 d * q + m, Q4_0
 * d * (q - 8), Q8_0 q * d, with separate roundings), the 4-bit ones by looking the nibbles up in a
 * 16-entry table of the block's weights (vpermps reads an index's low 4 bits), and then go into every
 * row with two FMAs. */
static inline __attribute__((always_inline)) void weight_rows(const float *x, const float *x_sums, int64_t rows,
                                                                int64_t K, const uint8_t *row, int64_t row_bytes,
                                                                int64_t weights, int type, float *y, int64_t y_stride) {
    (void)x_sums;
    const int64_t blocks = K / BLOCK, per = scales_per_block(type), qbytes = quant_bytes(type);
    const int rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 levels = type == Q4_0 ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                                       : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i low_shifts = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m512i high_shifts = _mm512_add_epi32(low_shifts, _mm512_set1_epi32(16));
    float scales[2][2 * SCALE_CHUNK];
    __m512 acc_low[2][ROWS], acc_high[2][ROWS];
    for (int64_t w = 0; w < weights; ++w)
        for (int64_t m = 0; m < rows; ++m) acc_low[w][m] = acc_high[w][m] = _mm512_setzero_ps();
    for (int64_t first = 0; first < blocks; first += SCALE_CHUNK) {
        const int64_t count = blocks - first < SCALE_CHUNK ? blocks - first : SCALE_CHUNK;
        for (int64_t w = 0; w < weights; ++w) widen_halves(row + w * row_bytes + 2 * per * first, per * count, scales[w]);
        for (int64_t c = 0; c < count; ++c) {
            const int64_t b = first + c;
            for (int64_t w = 0; w < weights; ++w) {
                const uint8_t *q = row + w * row_bytes + 2 * per * blocks + b * qbytes;
                const __m512 d = _mm512_set1_ps(scales[w][per * c]);
                __m512 low, high;
                if (type == Q8_0) {
                    low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
                    high = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
                    low = _mm512_mul_round_ps(low, d, rounding);
                    high = _mm512_mul_round_ps(high, d, rounding);
                } else {
                    __m512 table = _mm512_mul_round_ps(d, levels, rounding);
                    if (type == Q4_1) table = _mm512_add_round_ps(table, _mm512_set1_ps(scales[w][2 * c + 1]), rounding);
                    const __m512i nibbles = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q));
                    low = _mm512_permutexvar_ps(_mm512_srlv_epi32(nibbles, low_shifts), table);
                    high = _mm512_permutexvar_ps(_mm512_srlv_epi32(nibbles, high_shifts), table);
                }
                for (int64_t m = 0; m < rows; ++m) {
                    const float *xb = x + m * K + b * BLOCK;
                    acc_low[w][m] = _mm512_fmadd_ps(low, _mm512_loadu_ps(xb), acc_low[w][m]);
                    acc_high[w][m] = _mm512_fmadd_ps(high, _mm512_loadu_ps(xb + 16), acc_high[w][m]);
                }
            }
        }
    }
    for (int64_t w = 0; w < weights; ++w)
        for (int64_t m = 0; m < rows; ++m)
            y[m * y_stride + w] = _mm512_reduce_add_ps(_mm512_add_ps(acc_low[w][m], acc_high[w][m]));
}
#define PAIRS 1 /* weight_rows takes two weight rows at once */
#elif defined(__AVX2__) && defined(__FMA__)
#define X_SUMS 1
/* Eight float lanes of bytes 0-7 of `bytes`, sign-extended. */
#define S8_LANES(bytes) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))

/* One weight row against `rows` rows of x (x86 with AVX2 and FMA): sum_b d_b * dot_b(q, x) +
 * m_b * sum_b(x), where x_sums holds each row's per-block sums of x ([rows][K / 32]). */
static inline __attribute__((always_inline)) void weight_row(const float *x, const float *x_sums, int64_t rows,
                                                               int64_t K, const uint8_t *row, int type, float *y,
                                                               int64_t y_stride) {
    const int64_t blocks = K / BLOCK, per = scales_per_block(type), qbytes = quant_bytes(type);
    const uint8_t *quants = row + 2 * per * blocks;
    const __m256i nibble = _mm256_set1_epi32(15), shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    float scales[2 * SCALE_CHUNK];
    __m256 acc[ROWS];
    float offsets[ROWS];
    for (int64_t m = 0; m < rows; ++m) {
        acc[m] = _mm256_setzero_ps();
        offsets[m] = 0.0f;
    }
    for (int64_t first = 0; first < blocks; first += SCALE_CHUNK) {
        const int64_t count = blocks - first < SCALE_CHUNK ? blocks - first : SCALE_CHUNK;
        widen_halves(row + 2 * per * first, per * count, scales);
        for (int64_t c = 0; c < count; ++c) {
            const int64_t b = first + c;
            const uint8_t *qs = quants + b * qbytes;
            const __m256 d = _mm256_set1_ps(scales[per * c]);
            __m256 q[4];
            if (type == Q8_0) {
                const __m128i first_half = _mm_loadu_si128((const __m128i *)qs);
                const __m128i second_half = _mm_loadu_si128((const __m128i *)(qs + 16));
                q[0] = S8_LANES(first_half);
                q[1] = S8_LANES(_mm_srli_si128(first_half, 8));
                q[2] = S8_LANES(second_half);
                q[3] = S8_LANES(_mm_srli_si128(second_half, 8));
            } else {  /* lane i of q[k] is weight 8k + i: nibble 2k + i / 4 of word i % 4 */
                const __m256i words = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
                for (int k = 0; k < 4; ++k) {
                    const __m256i shift = _mm256_add_epi32(shifts, _mm256_set1_epi32(8 * k));
                    q[k] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(words, shift), nibble));
                }
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
                const float min = type == Q4_1 ? scales[2 * c + 1] : -8.0f * scales[c];
                for (int64_t m = 0; m < rows; ++m) offsets[m] += min * x_sums[m * blocks + b];
            }
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
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int8_t v16s8 __attribute__((vector_size(16), aligned(1)));

static inline v16f load16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline uint32_t load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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
    const uint32_t w0 = load_le32(qs), w1 = load_le32(qs + 4), w2 = load_le32(qs + 8), w3 = load_le32(qs + 12);
    const v16u words = {w0, w1, w2, w3, w0, w1, w2, w3, w0, w1, w2, w3, w0, w1, w2, w3};
    const v16u shifts = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12};
    *low = __builtin_convertvector((words >> shifts) & 15, v16f);
    *high = __builtin_convertvector((words >> (shifts + 16)) & 15, v16f);
}

/* One weight row against `rows` rows of x (portable vector extensions): sum_b dot_b(q * d_b, x) + m_b * sum_b(x), where x_sums
 * holds each row's per-block sums of x ([rows][K / 32]). */
static inline __attribute__((always_inline)) void weight_row(const float *x, const float *x_sums, int64_t rows,
                                                               int64_t K, const uint8_t *row, int type, float *y,
                                                               int64_t y_stride) {
    const int64_t blocks = K / BLOCK, per = scales_per_block(type), qbytes = quant_bytes(type);
    const uint8_t *quants = row + 2 * per * blocks;
    float scales[2 * SCALE_CHUNK];
    v16f acc[ROWS];
    float offsets[ROWS];
    for (int64_t m = 0; m < rows; ++m) {
        acc[m] = (v16f){0};
        offsets[m] = 0.0f;
    }
    for (int64_t first = 0; first < blocks; first += SCALE_CHUNK) {
        const int64_t count = blocks - first < SCALE_CHUNK ? blocks - first : SCALE_CHUNK;
        widen_halves(row + 2 * per * first, per * count, scales);
        for (int64_t c = 0; c < count; ++c) {
            const int64_t b = first + c;
            const float d = scales[per * c];
            const float min = type == Q4_1 ? scales[2 * c + 1] : type == Q4_0 ? -8.0f * d : 0.0f;
            v16f low, high;
            block_quants(quants + b * qbytes, type, &low, &high);
            low *= d;
            high *= d;
            for (int64_t m = 0; m < rows; ++m) {
                const float *xb = x + m * K + b * BLOCK;
                acc[m] += low * load16(xb) + high * load16(xb + 16);
                offsets[m] += min * x_sums[m * blocks + b];
            }
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        float s = offsets[m];
        for (int j = 0; j < 16; ++j) s += acc[m][j];
        y[m * y_stride] = s;
    }
}
#endif

#if !PAIRS
#define PAIRS 0
/* weight_row once per weight row (these paths take one weight row at a time). */
static inline __attribute__((always_inline)) void weight_rows(const float *x, const float *x_sums, int64_t rows,
                                                                int64_t K, const uint8_t *row, int64_t row_bytes,
                                                                int64_t weights, int type, float *y, int64_t y_stride) {
    for (int64_t w = 0; w < weights; ++w) weight_row(x, x_sums, rows, K, row + w * row_bytes, type, y + w, y_stride);
}
#endif

/* weight_rows with the type and both counts as constants, so each instance keeps its accumulators in
 * registers (a variable count leaves them in memory: a load-add-store chain per block). */
#define ROW_KERNEL(TYPE, ROWS_N, WEIGHTS_N)                                                                       \
    static void row_##TYPE##_##ROWS_N##_##WEIGHTS_N(const float *x, const float *sums, int64_t K,                 \
                                                    const uint8_t *row, int64_t row_bytes, float *y,              \
                                                    int64_t y_stride) {                                           \
        weight_rows(x, sums, ROWS_N, K, row, row_bytes, WEIGHTS_N, TYPE, y, y_stride);                            \
    }
#define ROW_KERNELS(TYPE) ROW_KERNEL(TYPE, 1, 1) ROW_KERNEL(TYPE, 2, 1) ROW_KERNEL(TYPE, 3, 1)                   \
    ROW_KERNEL(TYPE, 4, 1) ROW_KERNEL(TYPE, 5, 1) ROW_KERNEL(TYPE, 6, 1) ROW_KERNEL(TYPE, 7, 1)                  \
    ROW_KERNEL(TYPE, 8, 1) ROW_KERNEL(TYPE, 1, 2)
ROW_KERNELS(Q4_0)
ROW_KERNELS(Q4_1)
ROW_KERNELS(Q8_0)

typedef void (*row_kernel)(const float *, const float *, int64_t, const uint8_t *, int64_t, float *, int64_t);
/* [rows - 1] for one weight row; [ROWS] takes two weight rows against one row of x */
#define ROW_TABLE(TYPE) {row_##TYPE##_1_1, row_##TYPE##_2_1, row_##TYPE##_3_1, row_##TYPE##_4_1,                  \
                         row_##TYPE##_5_1, row_##TYPE##_6_1, row_##TYPE##_7_1, row_##TYPE##_8_1, row_##TYPE##_1_2}
static const row_kernel Q4_0_ROWS[ROWS + 1] = ROW_TABLE(Q4_0);
static const row_kernel Q4_1_ROWS[ROWS + 1] = ROW_TABLE(Q4_1);
static const row_kernel Q8_0_ROWS[ROWS + 1] = ROW_TABLE(Q8_0);

static int supported(int type, int64_t K) { return (type == Q4_0 || type == Q4_1 || type == Q8_0) && K % BLOCK == 0; }

/* Rearranges `count` rows of K weights (rows `row_bytes` apart, each starting with its K / 32 ggml
 * blocks) in place into the CPU order described above. Returns 0, or -1 for a type or shape this
 * kernel does not handle or when out of memory. */
int gguf_cpu_order(uint8_t *w, int64_t row_bytes, int64_t count, int64_t K, int type) {
    if (!supported(type, K)) return -1;
    const int64_t blocks = K / BLOCK, scale_bytes = 2 * scales_per_block(type), qbytes = quant_bytes(type);
    const int64_t raw_bytes = block_bytes_of(type);
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        uint8_t *ordered = malloc((size_t)(blocks * raw_bytes));
        failed = ordered == NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < count; ++r) {
            if (ordered == NULL) continue;
            uint8_t *row = w + r * row_bytes;
            for (int64_t b = 0; b < blocks; ++b) {
                const uint8_t *block = row + b * raw_bytes, *qs = block + scale_bytes;
                uint8_t *quants = ordered + blocks * scale_bytes + b * qbytes;
                memcpy(ordered + b * scale_bytes, block, (size_t)scale_bytes);
                if (type == Q8_0) {
                    memcpy(quants, qs, 32);
                    continue;
                }
                memset(quants, 0, 16);
                for (int j = 0; j < BLOCK; ++j) {
                    const int nibble = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
                    const int position = 4 * (j / 4);  /* bit offset inside little-endian word j % 4 */
                    quants[4 * (j % 4) + position / 8] |= (uint8_t)(nibble << (position % 8));
                }
            }
            memcpy(row, ordered, (size_t)(blocks * raw_bytes));
        }
        free(ordered);
    }
    return failed ? -1 : 0;
}

/* One block's 32 float32 weights, exactly as dequantizing at load computes them: two roundings for Q4_1
 * (d * q, then + m), never one fused multiply-add, hence no contraction here. */
__attribute__((optimize("fp-contract=off"))) static void dequantize_block(const uint8_t *q, int type, float d,
                                                                         float min, float *weights) {
#if defined(__AVX512F__)
    const int rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 scale = _mm512_set1_ps(d);
    if (type == Q8_0) {
        for (int half = 0; half < 2; ++half) {
            const __m512 levels = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * half))));
            _mm512_storeu_ps(weights + 16 * half, _mm512_mul_round_ps(levels, scale, rounding));
        }
        return;
    }
    const __m512i low_shifts = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m512i nibbles = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q)), fifteen = _mm512_set1_epi32(15);
    for (int half = 0; half < 2; ++half) {
        const __m512i shifts = _mm512_add_epi32(low_shifts, _mm512_set1_epi32(16 * half));
        __m512 levels = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(nibbles, shifts), fifteen));
        if (type == Q4_0) levels = _mm512_sub_ps(levels, _mm512_set1_ps(8.0f));
        __m512 values = _mm512_mul_round_ps(levels, scale, rounding);
        if (type == Q4_1) values = _mm512_add_round_ps(values, _mm512_set1_ps(min), rounding);
        _mm512_storeu_ps(weights + 16 * half, values);
    }
#else
    for (int j = 0; j < BLOCK; ++j) {
        if (type == Q8_0) {
            weights[j] = (float)(int8_t)q[j] * d;
            continue;
        }
        const float level = (float)((q[4 * (j % 4) + j / 8] >> (4 * (j / 4) % 8)) & 15);
        weights[j] = type == Q4_1 ? level * d + min : (level - 8.0f) * d;
    }
#endif
}

/* The float32 weights of `count` rows in the CPU order (rows `row_bytes` apart) into out [count][K],
 * exactly as dequantizing at load computes them. Returns 0, or -1 for a type or shape this kernel does
 * not handle. */
int gguf_dequantize_f32(const uint8_t *w, int64_t row_bytes, int64_t count, int64_t K, int type, float *out) {
    if (!supported(type, K)) return -1;
    const int64_t blocks = K / BLOCK, per = scales_per_block(type), qbytes = quant_bytes(type);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < count; ++r) {
        const uint8_t *row = w + r * row_bytes;
        float scales[2 * SCALE_CHUNK];
        for (int64_t first = 0; first < blocks; first += SCALE_CHUNK) {
            const int64_t chunk = blocks - first < SCALE_CHUNK ? blocks - first : SCALE_CHUNK;
            widen_halves(row + 2 * per * first, per * chunk, scales);
            for (int64_t c = 0; c < chunk; ++c) {
                const int64_t b = first + c;
                dequantize_block(row + 2 * per * blocks + b * qbytes, type, scales[per * c],
                                 type == Q4_1 ? scales[2 * c + 1] : 0.0f, out + r * K + b * BLOCK);
            }
        }
    }
    return 0;
}

/* y = x @ W.T for W's N rows in the CPU order (row_bytes apart). Returns 0, or -1 for a type or
 * shape this kernel does not handle (K must be a multiple of 32) or when out of memory. */
int gguf_matmul_f32(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes, int64_t N, int type,
                    float *y, int64_t y_stride) {
    if (!supported(type, K)) return -1;
    const row_kernel *kernels = type == Q4_1 ? Q4_1_ROWS : type == Q8_0 ? Q8_0_ROWS : Q4_0_ROWS;
    const int64_t blocks = K / BLOCK;
    float *x_sums = malloc(sizeof(float) * (size_t)(X_SUMS && M * blocks > 0 ? M * blocks : 1));
    if (x_sums == NULL) return -1;
    for (int64_t i = 0; X_SUMS && i < M * blocks; ++i) {
        float s = 0.0f;
        for (int j = 0; j < BLOCK; ++j) s += x[i * BLOCK + j];
        x_sums[i] = s;
    }
    /* weight rows taken at a time: two against a single row of x, where that path exists */
    const int64_t step = M == 1 && PAIRS ? 2 : 1;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n += step) {
        const int64_t weights = N - n < step ? N - n : step;
        /* the rows a few steps on: the next into L1, farther ones into L2 (decode streams every weight once) */
        for (int64_t offset = 0; offset < step * row_bytes; offset += 64) {
            if (n + NEAR_AHEAD * step < N) __builtin_prefetch(w + (n + NEAR_AHEAD * step) * row_bytes + offset, 0, 3);
            if (n + FAR_AHEAD * step < N) __builtin_prefetch(w + (n + FAR_AHEAD * step) * row_bytes + offset, 0, 2);
        }
        if (weights == 2) {
            kernels[ROWS](x, x_sums, K, w + n * row_bytes, row_bytes, y + n, y_stride);
            continue;
        }
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            const int64_t rows = M - m0 < ROWS ? M - m0 : ROWS;
            kernels[rows - 1](x + m0 * K, x_sums + m0 * blocks, K, w + n * row_bytes, row_bytes, y + m0 * y_stride + n,
                              y_stride);
        }
    }
    free(x_sums);
    return 0;
}
