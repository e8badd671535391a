/* Greedy decoding's last step: the index of each row's largest logit.
 *
 * argmax_rows_f32 scans float32 logits [rows][cols] as torch.argmax does: the first index of the
 * maximum, or the first NaN of a row that has one.
 *
 * greedy_head_f32 answers the same question for logits = x @ w.T (float32 x [rows][depth] and
 * w [vocab][depth]) from a bfloat16 estimate of every logit plus an exact float32 dot product for the
 * few tokens the estimate cannot rule out. The caller bounds the estimate's error per token as
 *     err[j] <= rel * |x| * |w_j| + out_rel * |est[j]|
 * (|.| the Euclidean norms; Cauchy-Schwarz bounds sum_i |x_i w_ji|). A token whose upper bound
 * est + err lies below the best lower bound est - err of some other token cannot be the argmax of the
 * float32 product, so only tokens at or above that lower bound are recomputed, in vocabulary order,
 * keeping the first of equal maxima. The bounds include the float32 product's own rounding, so every
 * token the float32 product could rank first is recomputed. Returns the number of rows it could not
 * settle (a non-finite input, estimate or logit); the caller then computes every logit, so that
 * NaNs and infinities get torch.argmax's answer. greedy_head_f32_est_f32 takes float32 estimates, as
 * int8_estimate_f32 makes them: s_j * (x . q_j) for a weight stored as int8 rows q_j with a float32
 * scale s_j each (a quarter of the float32 head's bytes, for the memory-bound steps of one or two rows).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

#define BLOCK 64 /* tokens whose upper bounds are summarised by one maximum */

static int64_t row_argmax(const float *x, int64_t cols) {
    float best = x[0];
    int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
    for (int64_t j = 0; j < cols; ++j) {
        best = x[j] > best ? x[j] : best;
        nan |= x[j] != x[j];
    }
    for (int64_t j = 0; j < cols; ++j)
        if (nan ? x[j] != x[j] : x[j] == best)
            return j;
    return 0;
}

void argmax_rows_f32(const float *x, int64_t rows, int64_t cols, int64_t ldx, int64_t *out) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r)
        out[r] = row_argmax(x + r * ldx, cols);
}

static float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i)
        sum += a[i] * b[i];
    return sum;
}

/* Estimate j of a bfloat16 (bf16 = 1) or float32 row of estimates. */
static inline __attribute__((always_inline)) float estimate_at(const void *est, int64_t j, const int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)est)[j]) : ((const float *)est)[j];
}

/* Row r's argmax into *out; 0 when settled, 1 when the row, its estimate or a recomputed logit is
 * not finite. A first pass finds the best lower bound and each block's highest upper bound (vectorised
 * sweeps over the estimate); the second recomputes the tokens of the blocks that reach that bound. */
static inline __attribute__((always_inline)) int settle_row(
        const void *est, const float *x, const float *w, int64_t ldw, const float *w_norm, int64_t vocab,
        int64_t depth, double rel, double out_rel, float *block_high, int64_t *out, const int bf16) {
    double squares = 0.0;
    for (int64_t i = 0; i < depth; ++i)
        squares += (double)x[i] * x[i];
    const float scale = (float)(rel * sqrt(squares));
    const float out_scale = (float)out_rel;
    if (!isfinite(scale))
        return 1;
    float floor = -INFINITY;
    int not_finite = 0;
    for (int64_t b = 0; b < vocab; b += BLOCK) {
        const int64_t end = b + BLOCK < vocab ? b + BLOCK : vocab;
        float low = -INFINITY, high = -INFINITY;
#pragma omp simd reduction(max : low, high) reduction(| : not_finite)
        for (int64_t j = b; j < end; ++j) {
            const float e = estimate_at(est, j, bf16);
            const float err = scale * w_norm[j] + out_scale * fabsf(e);
            low = e - err > low ? e - err : low;
            high = e + err > high ? e + err : high;
            not_finite |= !(fabsf(e) <= 3.40282347e38f);
        }
        block_high[b / BLOCK] = high;
        floor = low > floor ? low : floor;
    }
    if (not_finite)
        return 1;
    int64_t best_index = -1;
    float best = 0.0f;
    for (int64_t b = 0; b < vocab; b += BLOCK) {
        if (block_high[b / BLOCK] < floor)
            continue;
        const int64_t end = b + BLOCK < vocab ? b + BLOCK : vocab;
        for (int64_t j = b; j < end; ++j) {
            const float e = estimate_at(est, j, bf16);
            if (e + scale * w_norm[j] + out_scale * fabsf(e) < floor)
                continue;
            const float logit = dot(x, w + j * ldw, depth);
            if (logit != logit)
                return 1;
            if (best_index < 0 || logit > best) {
                best = logit;
                best_index = j;
            }
        }
    }
    *out = best_index;
    return 0;
}

/* Every row settled over the threads; the estimates' element type is branched on inside the loop (OpenMP
 * outlines it before inlining), so each branch inlines settle_row with a literal type. */
static int64_t greedy_head(const void *est, int64_t ld_est, const float *x, int64_t ldx, const float *w, int64_t ldw,
                           const float *w_norm, int64_t rows, int64_t vocab, int64_t depth, double rel, double out_rel,
                           int64_t *out, const int bf16) {
    int64_t unsettled = 0;
#pragma omp parallel reduction(+ : unsettled) if (rows > 1)
    {
        float *block_high = malloc(sizeof(float) * (size_t)((vocab + BLOCK - 1) / BLOCK));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (block_high == NULL)
                unsettled += 1;
            else if (bf16)
                unsettled += settle_row((const uint16_t *)est + r * ld_est, x + r * ldx, w, ldw, w_norm, vocab, depth,
                                        rel, out_rel, block_high, out + r, 1);
            else
                unsettled += settle_row((const float *)est + r * ld_est, x + r * ldx, w, ldw, w_norm, vocab, depth,
                                        rel, out_rel, block_high, out + r, 0);
        }
        free(block_high);
    }
    return unsettled;
}

int64_t greedy_head_f32(const uint16_t *est, int64_t ld_est, const float *x, int64_t ldx, const float *w,
                        int64_t ldw, const float *w_norm, int64_t rows, int64_t vocab, int64_t depth, double rel,
                        double out_rel, int64_t *out) {
    return greedy_head(est, ld_est, x, ldx, w, ldw, w_norm, rows, vocab, depth, rel, out_rel, out, 1);
}

int64_t greedy_head_f32_est_f32(const float *est, int64_t ld_est, const float *x, int64_t ldx, const float *w,
                                int64_t ldw, const float *w_norm, int64_t rows, int64_t vocab, int64_t depth,
                                double rel, double out_rel, int64_t *out) {
    return greedy_head(est, ld_est, x, ldx, w, ldw, w_norm, rows, vocab, depth, rel, out_rel, out, 0);
}

/* est[r][j] = scales[j] * (x_r . q_j) for one or two rows of float32 x against int8 rows q_j stored in
 * blocks of LANES tokens, depth-major within a block ([vocab / LANES][depth][LANES], the vocabulary padded
 * to whole blocks): each int8 load feeds LANES logits at once, so no sum is ever reduced across lanes,
 * and each block is read once for both rows. Blocks are split over the threads. */
#define LANES 16

#if defined(__AVX512F__)
#include <immintrin.h>

static inline __attribute__((always_inline)) void int8_block(const float *x, int64_t ldx, const int8_t *q,
                                                             const float *scales, int64_t depth, int64_t count,
                                                             float *est, int64_t ld_est, const int rows) {
    /* two independent sums per row (even and odd depths): one chain would wait out each FMA's latency */
    __m512 even0 = _mm512_setzero_ps(), odd0 = even0, even1 = even0, odd1 = even0;
    int64_t i = 0;
    for (; i + 1 < depth; i += 2) {
        if (i % 4 == 0)  /* a line four blocks ahead (the thread's next blocks follow in memory): 2.1 -> 1.3 ms */
            _mm_prefetch((const char *)(q + (4 * depth + i) * LANES), _MM_HINT_T2);
        const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i * LANES)));
        const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(pair)));
        const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(pair, 1)));
        even0 = _mm512_fmadd_ps(_mm512_set1_ps(x[i]), a, even0);
        odd0 = _mm512_fmadd_ps(_mm512_set1_ps(x[i + 1]), b, odd0);
        if (rows == 2) {
            even1 = _mm512_fmadd_ps(_mm512_set1_ps(x[ldx + i]), a, even1);
            odd1 = _mm512_fmadd_ps(_mm512_set1_ps(x[ldx + i + 1]), b, odd1);
        }
    }
    if (i < depth) {
        const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + i * LANES))));
        even0 = _mm512_fmadd_ps(_mm512_set1_ps(x[i]), a, even0);
        if (rows == 2)
            even1 = _mm512_fmadd_ps(_mm512_set1_ps(x[ldx + i]), a, even1);
    }
    const __m512 acc0 = _mm512_add_ps(even0, odd0), acc1 = _mm512_add_ps(even1, odd1);
    const __mmask16 valid = (__mmask16)((1u << count) - 1u);
    const __m512 s = _mm512_maskz_loadu_ps(valid, scales);
    _mm512_mask_storeu_ps(est, valid, _mm512_mul_ps(s, acc0));
    if (rows == 2)
        _mm512_mask_storeu_ps(est + ld_est, valid, _mm512_mul_ps(s, acc1));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* As the AVX-512 block, each 16 tokens in two 8-lane halves. */
static inline __attribute__((always_inline)) void int8_block(const float *x, int64_t ldx, const int8_t *q,
                                                             const float *scales, int64_t depth, int64_t count,
                                                             float *est, int64_t ld_est, const int rows) {
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
    for (int64_t i = 0; i < depth; ++i) {
        if (i % 4 == 0)
            _mm_prefetch((const char *)(q + (4 * depth + i) * LANES), _MM_HINT_T2);
        const __m128i column = _mm_loadu_si128((const __m128i *)(q + i * LANES));
        const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(column));
        const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(column, column)));
        const __m256 x0 = _mm256_broadcast_ss(x + i);
        lo0 = _mm256_fmadd_ps(x0, a, lo0);
        hi0 = _mm256_fmadd_ps(x0, b, hi0);
        if (rows == 2) {
            const __m256 x1 = _mm256_broadcast_ss(x + ldx + i);
            lo1 = _mm256_fmadd_ps(x1, a, lo1);
            hi1 = _mm256_fmadd_ps(x1, b, hi1);
        }
    }
    float acc[2][LANES];
    _mm256_storeu_ps(acc[0], lo0);
    _mm256_storeu_ps(acc[0] + 8, hi0);
    _mm256_storeu_ps(acc[1], lo1);
    _mm256_storeu_ps(acc[1] + 8, hi1);
    for (int r = 0; r < rows; ++r)
        for (int64_t l = 0; l < count; ++l)
            est[r * ld_est + l] = scales[l] * acc[r][l];
}
#else
static inline __attribute__((always_inline)) void int8_block(const float *x, int64_t ldx, const int8_t *q,
                                                             const float *scales, int64_t depth, int64_t count,
                                                             float *est, int64_t ld_est, const int rows) {
    float acc0[LANES] = {0.0f}, acc1[LANES] = {0.0f};
    for (int64_t i = 0; i < depth; ++i) {
        const int8_t *column = q + i * LANES;
        const float x0 = x[i], x1 = rows == 2 ? x[ldx + i] : 0.0f;
#pragma omp simd
        for (int l = 0; l < LANES; ++l) {
            const float value = (float)column[l];
            acc0[l] += x0 * value;
            acc1[l] += x1 * value;
        }
    }
    for (int64_t l = 0; l < count; ++l) {
        est[l] = scales[l] * acc0[l];
        if (rows == 2)
            est[ld_est + l] = scales[l] * acc1[l];
    }
}
#endif

void int8_estimate_f32(const float *x, int64_t rows, int64_t ldx, const int8_t *q, const float *scales, int64_t vocab,
                       int64_t depth, float *est, int64_t ld_est) {
    const int64_t blocks = (vocab + LANES - 1) / LANES;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t count = vocab - b * LANES < LANES ? vocab - b * LANES : LANES;
        const int8_t *block = q + b * depth * LANES;
        if (rows == 1)
            int8_block(x, ldx, block, scales + b * LANES, depth, count, est + b * LANES, ld_est, 1);
        else
            int8_block(x, ldx, block, scales + b * LANES, depth, count, est + b * LANES, ld_est, 2);
    }
}
