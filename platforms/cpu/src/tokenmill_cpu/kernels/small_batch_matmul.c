/* y = x @ w.T for a few rows of float32 x [M][K] (row stride ldx) and a float32 weight w [N][K]
 * (row stride ldw), into y [M][ldy]: the matrix products of decode steps, where reading w once is
 * the whole cost (a token of a 135M-parameter model reads 538 MB of float32 weights).
 *
 * Two weight rows at a time go against up to ROWS rows of x held in vector accumulators (sums in
 * 16 lanes, then across them: only the order of the sums differs from x @ w.T). OpenMP gives each
 * thread one contiguous range of weight rows, so each streams memory sequentially, with software
 * prefetches of the rows ahead. The 16 lanes are a GCC vector (AVX-512), or with AVX2 + FMA two
 * 8-lane intrinsic halves (the GCC vector built for AVX2 ran at half of oneDNN's speed: 28.9 against
 * 14.7 ms for 30 SmolLM2 layers at one row). Other CPUs keep oneDNN (small_batch_matmul_offered).
 */
#include <stdint.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors between inlined helpers, without AVX-512 */

#define LANES 16
/* software prefetches, in pairs of weight rows ahead: the next pair into L1, the fourth into L2 (the
 * hardware prefetchers alone left a decode step at ~20 GB/s of ~26: measured on two Emerald Rapids
 * cores over SmolLM2's 537 MB, one row 23.0 -> 20.7 ms, two rows 36.6 -> 23.8 ms) */
#define NEAR_AHEAD 1
#define FAR_AHEAD 4
#if defined(__AVX512F__)
#define ROWS 8 /* 2 x 8 accumulators + operands fit the 32 vector registers */
#else
#define ROWS 2 /* a 16-lane vector is two (AVX2) or four (NEON) registers: 2 x 2 accumulators fit */
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>

#define SMALL_BATCH_AVX2 1

typedef struct {
    __m256 lo, hi;
} lanes;

static inline lanes load(const float *p) { return (lanes){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }

static inline lanes zero(void) { return (lanes){_mm256_setzero_ps(), _mm256_setzero_ps()}; }

static inline lanes fma_lanes(lanes a, lanes b, lanes acc) {
    return (lanes){_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
}

static inline float sum_lanes(lanes v) {
    float halves[8];
    _mm256_storeu_ps(halves, _mm256_add_ps(v.lo, v.hi));
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s += halves[i];
    return s;
}
#else
typedef float lanes __attribute__((vector_size(4 * LANES)));

static inline lanes load(const float *p) {
    lanes v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline lanes zero(void) { return (lanes){0}; }

static inline lanes fma_lanes(lanes a, lanes b, lanes acc) { return acc + a * b; }

static inline float sum_lanes(lanes v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; ++i) s += v[i];
    return s;
}
#endif

/* y[m][0..PAIR) for rows m < rows of x against weight rows w0 (and w1 when PAIR is 2). */
static inline __attribute__((always_inline)) void block(const float *x, int64_t ldx, int64_t rows, int64_t K,
                                                         const float *w0, const float *w1, int pair, float *y,
                                                         int64_t ldy) {
    lanes first[ROWS], second[ROWS];
    for (int64_t m = 0; m < rows; ++m) first[m] = second[m] = zero();
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        const lanes u = load(w0 + k), v = pair == 2 ? load(w1 + k) : u;
        for (int64_t m = 0; m < rows; ++m) {
            const lanes xs = load(x + m * ldx + k);
            first[m] = fma_lanes(u, xs, first[m]);
            if (pair == 2) second[m] = fma_lanes(v, xs, second[m]);
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        float a = sum_lanes(first[m]), b = pair == 2 ? sum_lanes(second[m]) : 0.0f;
        for (int64_t j = k; j < K; ++j) {
            a += w0[j] * x[m * ldx + j];
            if (pair == 2) b += w1[j] * x[m * ldx + j];
        }
        y[m * ldy] = a;
        if (pair == 2) y[m * ldy + 1] = b;
    }
}

/* block with the row count and the pairing as constants, so the accumulators stay in registers. */
#define BLOCK(ROWS_N, PAIR)                                                                                     \
    static void block_##ROWS_N##_##PAIR(const float *x, int64_t ldx, int64_t K, const float *w0, const float *w1, \
                                        float *y, int64_t ldy) {                                               \
        block(x, ldx, ROWS_N, K, w0, w1, PAIR, y, ldy);                                                        \
    }
#define BLOCKS(ROWS_N) BLOCK(ROWS_N, 1) BLOCK(ROWS_N, 2)
BLOCKS(1) BLOCKS(2)
#if ROWS == 8
BLOCKS(3) BLOCKS(4) BLOCKS(5) BLOCKS(6) BLOCKS(7) BLOCKS(8)
#endif

typedef void (*block_fn)(const float *, int64_t, int64_t, const float *, const float *, float *, int64_t);
static const block_fn SINGLE[ROWS] = {block_1_1, block_2_1,
#if ROWS == 8
                                      block_3_1, block_4_1, block_5_1, block_6_1, block_7_1, block_8_1
#endif
};
static const block_fn PAIRED[ROWS] = {block_1_2, block_2_2,
#if ROWS == 8
                                      block_3_2, block_4_2, block_5_2, block_6_2, block_7_2, block_8_2
#endif
};

void small_batch_matmul_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *w, int64_t N,
                            int64_t ldw, float *y, int64_t ldy) {
#pragma omp parallel for schedule(static)
    for (int64_t pair = 0; pair < (N + 1) / 2; ++pair) {
        const int64_t n = 2 * pair;
        const block_fn *kernels = n + 1 < N ? PAIRED : SINGLE;
        const char *near = n + 2 * NEAR_AHEAD < N ? (const char *)(w + (n + 2 * NEAR_AHEAD) * ldw) : NULL;
        const char *far = n + 2 * FAR_AHEAD < N ? (const char *)(w + (n + 2 * FAR_AHEAD) * ldw) : NULL;
        for (int64_t offset = 0; offset < 2 * ldw * (int64_t)sizeof(float); offset += 64) {
            if (near != NULL) __builtin_prefetch(near + offset, 0, 3);
            if (far != NULL) __builtin_prefetch(far + offset, 0, 2);
        }
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            const int64_t rows = M - m0 < ROWS ? M - m0 : ROWS;
            kernels[rows - 1](x + m0 * ldx, ldx, K, w + n * ldw, w + (n + 1 < N ? n + 1 : n) * ldw, y + m0 * ldy + n,
                              ldy);
        }
    }
}

/* 1 when this build should be used (AVX-512, or AVX2 with FMA), 0 where oneDNN stays faster. */
int small_batch_matmul_offered(void) {
#if defined(__AVX512F__) || defined(SMALL_BATCH_AVX2)
    return 1;
#else
    return 0;
#endif
}
