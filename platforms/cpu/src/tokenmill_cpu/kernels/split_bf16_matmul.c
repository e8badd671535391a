/* y = x @ w.T for float32 operands, computed from bfloat16 products on AMX tiles ("bf16x3").
 *
 * Each float32 operand is split into two bfloat16 parts, v = hi + lo + r with hi = bf16(v),
 * lo = bf16(v - hi) and |r| <= 2^-16 |v| (ties to even). The product x w is then taken as
 * xh wh + xh wl + xl wh: every bfloat16 product is exact in float32 and AMX sums them in float32, so
 * the result differs from a float32 product only by the dropped terms (xl wl, and the parts' own
 * residues: a relative error of about 3 * 2^-16 per product) and by the order of the sums. AMX
 * multiplies bfloat16 some 5-8 times faster than AVX-512 multiplies float32 here, so three
 * products still come out well ahead.
 *
 * The weight is packed once: for each pair of 16-column blocks and each 32-deep slice of K, four
 * AMX B tiles (block 0 hi, block 0 lo, block 1 hi, block 1 lo: 16 rows of 16 column pairs of two
 * depths, VNNI order), zero past N and K, so a thread streams one contiguous run of memory per
 * column pair. Its size is that of the float32 weight (two bfloat16 parts). Each call splits x into
 * row-major hi and lo copies (padded to 32 rows and to the packed depth, rows an odd number of cache
 * lines apart so a tile's 16 rows spread over the L1 sets) in a scratch buffer kept between calls,
 * then, per block of rows that fits the L2 cache, runs every column pair over the threads (ranges.h),
 * 32 x 32 of y per pass: tiles 0-3 accumulate, 4-5 hold x, 6-7 the weight.
 *
 * Nothing is built without AMX-BF16 and AVX512-BF16, and split_bf16_matmul_offered says 0 there and
 * where Linux does not grant the process the AMX tile state.
 */
#include <stdint.h>

#define BLOCK_N 16
#define DEPTH 32
#define PAIR_N (2 * BLOCK_N)

/* Depth padded to whole AMX slices, and the columns padded to whole pairs of blocks. */
static inline int64_t padded(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

/* bfloat16 elements of the packed form of an N x K weight. */
int64_t split_bf16_packed_size(int64_t N, int64_t K) { return 2 * padded(N, PAIR_N) * padded(K, DEPTH); }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lanes.h"
#include "ranges.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_ELEMENTS 512 /* bfloat16 elements of one 16 x 64-byte tile */
#define ROW_BLOCK_BYTES (512 * 1024) /* the split rows of one block of rows stay in the L2 cache */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config_t;

/* Every tile 16 rows of 64 bytes (this thread's state: each thread of a parallel region loads it). */
static void configure_tiles(void) {
    tile_config_t config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.bytes_per_row[t] = 64;
        config.rows[t] = 16;
    }
    _tile_loadconfig(&config);
}

int split_bf16_matmul_offered(void) {
    static int granted = -1;
    if (granted < 0)
        granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return granted;
}

/* hi and lo parts of 16 floats (lanes past `valid` are zero). */
static inline void split16(const float *v, int64_t valid, uint16_t *hi, uint16_t *lo) {
    const __m512 x = _mm512_maskz_loadu_ps(lanes(valid), v);
    const __m256bh h = _mm512_cvtneps_pbh(x);
    const __m512 rest = _mm512_sub_ps(x, _mm512_cvtpbh_ps(h));
    _mm256_storeu_si256((__m256i *)hi, (__m256i)h);
    _mm256_storeu_si256((__m256i *)lo, (__m256i)_mm512_cvtneps_pbh(rest));
}

void split_bf16_pack(const float *w, int64_t N, int64_t K, int64_t ldw, uint16_t *packed) {
    const int64_t slices = padded(K, DEPTH) / DEPTH, pairs = padded(N, PAIR_N) / PAIR_N;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
        float column[DEPTH];
        uint16_t hi[DEPTH], lo[DEPTH];
        for (int64_t s = 0; s < slices; ++s) {
            uint16_t *tiles = packed + (p * slices + s) * 4 * TILE_ELEMENTS;
            for (int64_t j = 0; j < PAIR_N; ++j) {
                const int64_t n = p * PAIR_N + j, block = j / BLOCK_N, col = j % BLOCK_N;
                for (int64_t d = 0; d < DEPTH; ++d) {
                    const int64_t k = s * DEPTH + d;
                    column[d] = n < N && k < K ? w[n * ldw + k] : 0.0f;
                }
                split16(column, 16, hi, lo);
                split16(column + 16, 16, hi + 16, lo + 16);
                uint16_t *h = tiles + 2 * block * TILE_ELEMENTS, *l = h + TILE_ELEMENTS;
                for (int64_t d = 0; d < DEPTH; ++d) { /* row d/2 of the tile, column pair col, depth d%2 */
                    h[(d / 2) * 32 + col * 2 + d % 2] = hi[d];
                    l[(d / 2) * 32 + col * 2 + d % 2] = lo[d];
                }
            }
        }
    }
}

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static uint16_t *scratch;
static int64_t scratch_elements;

/* One pass: up to 32 rows of the split x (16 unless both_rows) against one column pair, into y (rows x
 * cols of it valid), prefetching fetch_lines lines from fetch spread over the slices. */
static inline void pair_block(const uint16_t *xh, const uint16_t *xl, int64_t ldx, const uint16_t *tiles,
                              int64_t slices, int both_rows, float *y, int64_t ldy, int64_t rows, int64_t cols,
                              const char *fetch, int64_t fetch_lines) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const int64_t stride = ldx * 2;
    for (int64_t s = 0; s < slices; ++s) {
        const uint16_t *b = tiles + s * 4 * TILE_ELEMENTS;
        const int64_t first = fetch_lines * s / slices, quota = fetch_lines * (s + 1) / slices - first;
#define FETCH(part)                                                                                            \
    for (int64_t line = first + quota * (part) / 4; line < first + quota * ((part) + 1) / 4; ++line)         \
        _mm_prefetch(fetch + 64 * line, _MM_HINT_T1)
        const uint16_t *xh0 = xh + s * DEPTH, *xl0 = xl + s * DEPTH;
        if (both_rows) { /* each tile is loaded right after its last reader: the loads overlap the products */
            _tile_loadd(4, xh0, stride);
            _tile_loadd(6, b, 64);
            _tile_loadd(7, b + 2 * TILE_ELEMENTS, 64);
            _tile_loadd(5, xh0 + 16 * ldx, stride);
            FETCH(0);
            _tile_dpbf16ps(0, 4, 6); /* hi x, hi w */
            _tile_dpbf16ps(2, 5, 6);
            _tile_loadd(6, b + TILE_ELEMENTS, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
            _tile_loadd(7, b + 3 * TILE_ELEMENTS, 64);
            FETCH(1);
            _tile_dpbf16ps(0, 4, 6); /* hi x, lo w */
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(4, xl0, stride);
            _tile_dpbf16ps(2, 5, 6);
            _tile_loadd(6, b, 64);
            _tile_dpbf16ps(3, 5, 7);
            _tile_loadd(5, xl0 + 16 * ldx, stride);
            _tile_loadd(7, b + 2 * TILE_ELEMENTS, 64);
            FETCH(2);
            _tile_dpbf16ps(0, 4, 6); /* lo x, hi w */
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
            FETCH(3);
        } else {
            _tile_loadd(4, xh0, stride);
            _tile_loadd(6, b, 64);
            _tile_loadd(7, b + 2 * TILE_ELEMENTS, 64);
            _tile_loadd(5, xl0, stride);
            FETCH(0);
            _tile_dpbf16ps(0, 4, 6); /* hi x, hi w */
            _tile_dpbf16ps(1, 4, 7);
            FETCH(1);
            _tile_dpbf16ps(0, 5, 6); /* lo x, hi w */
            _tile_loadd(6, b + TILE_ELEMENTS, 64);
            _tile_dpbf16ps(1, 5, 7);
            _tile_loadd(7, b + 3 * TILE_ELEMENTS, 64);
            FETCH(2);
            _tile_dpbf16ps(0, 4, 6); /* hi x, lo w */
            _tile_dpbf16ps(1, 4, 7);
            FETCH(3);
        }
    }
#undef FETCH
    if (rows >= 32 && cols >= PAIR_N) {
        _tile_stored(0, y, ldy * 4);
        _tile_stored(1, y + BLOCK_N, ldy * 4);
        _tile_stored(2, y + 16 * ldy, ldy * 4);
        _tile_stored(3, y + 16 * ldy + BLOCK_N, ldy * 4);
        return;
    }
    float out[32 * PAIR_N];
    _tile_stored(0, out, PAIR_N * 4);
    _tile_stored(1, out + BLOCK_N, PAIR_N * 4);
    if (both_rows) {
        _tile_stored(2, out + 16 * PAIR_N, PAIR_N * 4);
        _tile_stored(3, out + 16 * PAIR_N + BLOCK_N, PAIR_N * 4);
    }
    const int64_t width = cols < PAIR_N ? cols : PAIR_N, height = rows < 32 ? rows : 32;
    for (int64_t m = 0; m < height; ++m)
        memcpy(y + m * ldy, out + m * PAIR_N, (size_t)width * sizeof(float));
}

/* 0 on success, -1 when the scratch buffer cannot be allocated. */
int split_bf16_matmul(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *packed, int64_t N,
                      float *y, int64_t ldy) {
    const int64_t depth = padded(K, DEPTH), slices = depth / DEPTH, pairs = padded(N, PAIR_N) / PAIR_N;
    const int64_t rows_padded = padded(M, 32);
    /* an odd number of cache lines per split row: 16 rows of a tile load do not share a few L1 sets */
    const int64_t ld = depth / DEPTH % 2 ? depth : depth + DEPTH;
    int64_t block_rows = ROW_BLOCK_BYTES / (ld * 4) / 32 * 32;
    if (block_rows < 32)
        block_rows = 32;
    pthread_mutex_lock(&scratch_lock);
    const int64_t needed = 2 * rows_padded * ld;
    if (needed > scratch_elements) {
        free(scratch);
        scratch = aligned_alloc(64, (size_t)padded(needed * 2, 64));
        scratch_elements = scratch ? needed : 0;
        if (!scratch) {
            pthread_mutex_unlock(&scratch_lock);
            return -1;
        }
    }
    uint16_t *xh = scratch, *xl = scratch + rows_padded * ld;
    ranges_t ranges;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < rows_padded; ++m)
            for (int64_t k = 0; k < depth; k += 16)
                split16(x + m * ldx + k, m < M ? K - k : 0, xh + m * ld + k, xl + m * ld + k);
        configure_tiles();
        for (int64_t r0 = 0; r0 < M; r0 += block_rows) {
            const int64_t rows = M - r0 < block_rows ? M - r0 : block_rows;
            claimer_t me = ranges_begin(&ranges, pairs);
            int64_t end;
            for (int64_t p; (p = ranges_claim(&ranges, &me, &end)) >= 0;) {
                const uint16_t *tiles = packed + p * slices * 4 * TILE_ELEMENTS;
                /* the passes over this pair spread prefetches of the thread's next pair (which follows it) */
                const char *next = (const char *)(tiles + slices * 4 * TILE_ELEMENTS);
                const int64_t lines = p + 1 < end ? slices * 4 * TILE_ELEMENTS * 2 / 64 : 0, passes = (rows + 31) / 32;
                for (int64_t m = 0, pass = 0; m < rows; m += 32, ++pass)
                    pair_block(xh + (r0 + m) * ld, xl + (r0 + m) * ld, ld, tiles, slices, rows - m > 16,
                               y + (r0 + m) * ldy + p * PAIR_N, ldy, rows - m, N - p * PAIR_N,
                               next + 64 * (lines * pass / passes), lines * (pass + 1) / passes - lines * pass / passes);
            }
#pragma omp barrier
        }
        _tile_release();
    }
    pthread_mutex_unlock(&scratch_lock);
    return 0;
}

#else

int split_bf16_matmul_offered(void) { return 0; }

void split_bf16_pack(const float *w, int64_t N, int64_t K, int64_t ldw, uint16_t *packed) {
    (void)w, (void)N, (void)K, (void)ldw, (void)packed;
}

int split_bf16_matmul(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *packed, int64_t N,
                      float *y, int64_t ldy) {
    (void)x, (void)M, (void)K, (void)ldx, (void)packed, (void)N, (void)y, (void)ldy;
    return -1;
}

#endif
