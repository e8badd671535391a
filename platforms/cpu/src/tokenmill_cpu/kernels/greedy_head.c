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
 * NaNs and infinities get torch.argmax's answer.
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

/* Row r's argmax into *out; 0 when settled, 1 when the row, its estimate or a recomputed logit is
 * not finite. A first pass finds the best lower bound and each block's highest upper bound (vectorised
 * sweeps over the estimate); the second recomputes the tokens of the blocks that reach that bound. */
static int settle_row(const uint16_t *est, const float *x, const float *w, int64_t ldw, const float *w_norm,
                      int64_t vocab, int64_t depth, double rel, double out_rel, float *block_high, int64_t *out) {
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
            const float e = bf16_to_f32(est[j]);
            const float err = scale * w_norm[j] + out_scale * fabsf(e);
            low = e - err > low ? e - err : low;
            high = e + err > high ? e + err : high;
            not_finite |= (est[j] & 0x7F80) == 0x7F80;
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
            const float e = bf16_to_f32(est[j]);
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

int64_t greedy_head_f32(const uint16_t *est, int64_t ld_est, const float *x, int64_t ldx, const float *w,
                        int64_t ldw, const float *w_norm, int64_t rows, int64_t vocab, int64_t depth, double rel,
                        double out_rel, int64_t *out) {
    int64_t unsettled = 0;
#pragma omp parallel reduction(+ : unsettled) if (rows > 1)
    {
        float *block_high = malloc(sizeof(float) * (size_t)((vocab + BLOCK - 1) / BLOCK));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r)
            unsettled += block_high == NULL ? 1
                         : settle_row(est + r * ld_est, x + r * ldx, w, ldw, w_norm, vocab, depth, rel, out_rel,
                                      block_high, out + r);
        free(block_high);
    }
    return unsettled;
}
