/* y = x @ w.T for float32 decode batches (a few to a few hundred rows of x [M][K], row stride ldx)
 * against a weight packed once into panels of PANEL columns: packed[p][k][j] = w[p * PANEL + j][k],
 * zero past the last row of w. Written with AVX-512 intrinsics, and with AVX2 + FMA ones (6 rows x
 * 16 columns a block in 16 registers, 128 depths a chunk for a 32 KiB L1);
 * on other CPUs nothing is built and panel_matmul_offered says so (oneDNN stays).
 *
 * Each thread takes a contiguous range of panels (sequential reads for the prefetchers; ranges.h
 * lets a thread that finishes early take panels from the other's range) and, per
 * chunk of KC depths, runs every block of ROWS rows of x against it: 8 rows x 48 columns are 24
 * vector accumulators, each depth step loads three weight vectors and broadcasts eight x values, so
 * the weight chunk (36 KiB: it fits a 48 KiB L1 data cache) is read from memory once and then from
 * L1 (a 512-deep, 96 KiB chunk, read from L2 by every block, was 20-35% slower at 8-64 rows and
 * no faster at 256). The first block of a chunk waits on memory; the blocks spread software
 * prefetches of the thread's next chunk over their depth steps. Sums run over k in order per output (a different order than oneDNN's: the
 * results differ by rounding only). Rows are taken MC at a time so that x stays in the L2 cache.
 */
#include <stdint.h>

#define PANEL 48

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#include "ranges.h"

#define MC 256

void pack_panels_f32(const float *w, int64_t N, int64_t K, int64_t ldw, float *packed) {
    const int64_t panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
        float *dst = packed + p * K * PANEL;
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < PANEL; ++j) {
                const int64_t n = p * PANEL + j;
                dst[k * PANEL + j] = n < N ? w[n * ldw + k] : 0.0f;
            }
    }
}

#if defined(__AVX512F__)
#include "lanes.h"

#define ROWS 8
#define KC 192
#define MASKS 3
typedef __mmask16 mask_t; /* three 16-lane masks: the lanes of a panel's columns below its width */

static inline void panel_masks(int64_t width, mask_t *masks) {
    masks[0] = lanes(width), masks[1] = lanes(width - 16), masks[2] = lanes(width - 32);
}

/* `rows` rows of x against kc depths of one panel into y (adding to y when `accumulate`), with
 * masks for a last panel narrower than PANEL; prefetches `fetch_lines` cache lines from `fetch`. */
static inline __attribute__((always_inline)) void block(const float *x, int64_t ldx, const int rows, int64_t kc,
                                                         const float *panel, float *y, int64_t ldy,
                                                         const __mmask16 *masks, const int accumulate,
                                                         const char *fetch, int64_t fetch_lines) {
    __m512 a0[ROWS], a1[ROWS], a2[ROWS];
    for (int m = 0; m < rows; ++m) {
        a0[m] = accumulate ? _mm512_maskz_loadu_ps(masks[0], y + m * ldy) : _mm512_setzero_ps();
        a1[m] = accumulate ? _mm512_maskz_loadu_ps(masks[1], y + m * ldy + 16) : _mm512_setzero_ps();
        a2[m] = accumulate ? _mm512_maskz_loadu_ps(masks[2], y + m * ldy + 32) : _mm512_setzero_ps();
    }
    int64_t fetched = 0;
    for (int64_t k = 0; k < kc; ++k) {
        const float *w = panel + k * PANEL;
        const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
        while (fetched < fetch_lines && fetched * kc <= k * fetch_lines) _mm_prefetch(fetch + 64 * fetched++, _MM_HINT_T1);
        for (int m = 0; m < rows; ++m) {
            const __m512 xm = _mm512_set1_ps(x[m * ldx + k]);
            a0[m] = _mm512_fmadd_ps(xm, w0, a0[m]);
            a1[m] = _mm512_fmadd_ps(xm, w1, a1[m]);
            a2[m] = _mm512_fmadd_ps(xm, w2, a2[m]);
        }
    }
    for (int m = 0; m < rows; ++m) {
        _mm512_mask_storeu_ps(y + m * ldy, masks[0], a0[m]);
        _mm512_mask_storeu_ps(y + m * ldy + 16, masks[1], a1[m]);
        _mm512_mask_storeu_ps(y + m * ldy + 32, masks[2], a2[m]);
    }
}

#else
#define ROWS 6
#define KC 128
#define MASKS 6
typedef __m256i mask_t; /* six 8-lane masks: the lanes of a panel's columns below its width */

static inline void panel_masks(int64_t width, mask_t *masks) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int v = 0; v < MASKS; ++v) masks[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(width - 8 * v)), lane);
}

/* As the AVX-512 block, a third of the panel (16 columns) at a time: 6 rows x 16 columns are 12
 * accumulators, each depth step loads two weight vectors (from L1) and broadcasts six x values. */
static inline __attribute__((always_inline)) void block(const float *x, int64_t ldx, const int rows, int64_t kc,
                                                         const float *panel, float *y, int64_t ldy,
                                                         const mask_t *masks, const int accumulate,
                                                         const char *fetch, int64_t fetch_lines) {
    int64_t fetched = 0;
    for (int third = 0; third < 3; ++third) {
        const mask_t lo = masks[2 * third], hi = masks[2 * third + 1];
        float *out = y + 16 * third;
        __m256 a0[ROWS], a1[ROWS];
        for (int m = 0; m < rows; ++m) {
            a0[m] = accumulate ? _mm256_maskload_ps(out + m * ldy, lo) : _mm256_setzero_ps();
            a1[m] = accumulate ? _mm256_maskload_ps(out + m * ldy + 8, hi) : _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < kc; ++k) {
            const float *w = panel + k * PANEL + 16 * third;
            if (third == 0)
                while (fetched < fetch_lines && fetched * kc <= k * fetch_lines)
                    _mm_prefetch(fetch + 64 * fetched++, _MM_HINT_T1);
            const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
            for (int m = 0; m < rows; ++m) {
                const __m256 xm = _mm256_broadcast_ss(x + m * ldx + k);
                a0[m] = _mm256_fmadd_ps(xm, w0, a0[m]);
                a1[m] = _mm256_fmadd_ps(xm, w1, a1[m]);
            }
        }
        for (int m = 0; m < rows; ++m) {
            _mm256_maskstore_ps(out + m * ldy, lo, a0[m]);
            _mm256_maskstore_ps(out + m * ldy + 8, hi, a1[m]);
        }
    }
}
#endif

/* block with the row count and `accumulate` as constants, so the accumulators stay in registers. */
#define BLOCK(R)                                                                                               \
    static void block_##R(const float *x, int64_t ldx, int64_t kc, const float *panel, float *y, int64_t ldy,  \
                          const mask_t *masks, int accumulate, const char *fetch, int64_t fetch_lines) {      \
        if (accumulate) block(x, ldx, R, kc, panel, y, ldy, masks, 1, fetch, fetch_lines);                     \
        else block(x, ldx, R, kc, panel, y, ldy, masks, 0, fetch, fetch_lines);                                \
    }
BLOCK(1) BLOCK(2) BLOCK(3) BLOCK(4) BLOCK(5) BLOCK(6)
#if ROWS == 8
BLOCK(7) BLOCK(8)
#endif
typedef void (*block_fn)(const float *, int64_t, int64_t, const float *, float *, int64_t, const mask_t *, int,
                         const char *, int64_t);
static const block_fn BLOCKS[ROWS] = {block_1, block_2, block_3, block_4, block_5, block_6,
#if ROWS == 8
                                      block_7, block_8
#endif
};

static inline int64_t depth_chunk(int64_t k0, int64_t K) { return K - k0 < KC ? K - k0 : KC; }

void panel_matmul_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N, float *y,
                      int64_t ldy) {
    const int64_t panels = (N + PANEL - 1) / PANEL;
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t rows = M - m0 < MC ? M - m0 : MC, blocks = (rows + ROWS - 1) / ROWS;
        ranges_t ranges;
#pragma omp parallel
        {
            claimer_t me = ranges_begin(&ranges, panels);
            int64_t end;
            for (int64_t p; (p = ranges_claim(&ranges, &me, &end)) >= 0;) {
                const int64_t width = N - p * PANEL;
                mask_t masks[MASKS];
                panel_masks(width, masks);
                for (int64_t k0 = 0; k0 < K; k0 += KC) {
                    const int64_t kc = depth_chunk(k0, K);
                    const float *panel = packed + (p * K + k0) * PANEL;
                    /* the thread's next chunk follows this one in memory: the next depths, or the next panel */
                    const int64_t next_kc = k0 + kc < K ? depth_chunk(k0 + kc, K) : p + 1 < end ? depth_chunk(0, K) : 0;
                    const int64_t lines = next_kc * PANEL * 4 / 64;
                    const char *next = (const char *)(panel + kc * PANEL);
                    for (int64_t b = 0; b < blocks; ++b) {
                        const int64_t r = b * ROWS, count = rows - r < ROWS ? rows - r : ROWS;
                        const int64_t from = lines * b / blocks, to = lines * (b + 1) / blocks;
                        BLOCKS[count - 1](x + (m0 + r) * ldx + k0, ldx, kc, panel, y + (m0 + r) * ldy + p * PANEL,
                                          ldy, masks, k0 > 0, next + 64 * from, to - from);
                    }
                }
            }
        }
    }
}

int panel_matmul_offered(void) { return 1; }

#else

void pack_panels_f32(const float *w, int64_t N, int64_t K, int64_t ldw, float *packed) {
    (void)w, (void)N, (void)K, (void)ldw, (void)packed;
}

void panel_matmul_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N, float *y,
                      int64_t ldy) {
    (void)x, (void)M, (void)K, (void)ldx, (void)packed, (void)N, (void)y, (void)ldy;
}

int panel_matmul_offered(void) { return 0; }

#endif

/* Floats of the packed form of an N x K weight. */
int64_t panel_matmul_packed_size(int64_t N, int64_t K) { return (N + PANEL - 1) / PANEL * PANEL * K; }
