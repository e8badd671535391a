/* Paged decode attention for float32 on the CPU: one query token per request, keys and values read in
 * place from the block-structured cache (no gather), online softmax, GQA, sliding window, soft-cap.
 *
 * cache layout: [2][num_blocks][block_size][num_kv_heads][head_size] (keys, then values), contiguous.
 * query/out:    [num_requests][num_heads][head_size], contiguous.
 * Each (request, kv head) pair is independent: OpenMP splits them across threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

void paged_decode_f32(const float *query, const float *cache, const int32_t *block_tables, const int32_t *seq_lens,
                      float *out, int64_t num_requests, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                      int64_t block_size, int64_t num_blocks, int64_t max_blocks, float scale, int64_t window,
                      float soft_cap) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_size;
    const int64_t block_stride = block_size * token_stride;
    const float *values = cache + num_blocks * block_stride;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t r = 0; r < num_requests; ++r) {
        for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
            const int64_t len = seq_lens[r];
            const int64_t first = (window > 0 && len > window) ? len - window : 0;
            const int32_t *table = block_tables + r * max_blocks;
            float m[64], l[64], acc[64 * 256];
            float q[64 * 256];
            for (int64_t g = 0; g < group; ++g) {
                const float *src = query + (r * num_heads + kvh * group + g) * head_size;
                for (int64_t d = 0; d < head_size; ++d) q[g * head_size + d] = src[d] * scale;
                m[g] = -INFINITY;
                l[g] = 0.0f;
                memset(acc + g * head_size, 0, sizeof(float) * head_size);
            }
            for (int64_t pos = first; pos < len; ++pos) {
                const int64_t offset = (int64_t)table[pos / block_size] * block_stride + (pos % block_size) * token_stride +
                                       kvh * head_size;
                const float *k = cache + offset;
                const float *v = values + offset;
                for (int64_t g = 0; g < group; ++g) {
                    const float *qg = q + g * head_size;
                    float s = 0.0f;
                    for (int64_t d = 0; d < head_size; ++d) s += qg[d] * k[d];
                    if (soft_cap > 0.0f) s = soft_cap * tanhf(s / soft_cap);
                    float *ag = acc + g * head_size;
                    if (s > m[g]) {
                        const float correction = expf(m[g] - s);
                        l[g] *= correction;
                        for (int64_t d = 0; d < head_size; ++d) ag[d] *= correction;
                        m[g] = s;
                    }
                    const float p = expf(s - m[g]);
                    l[g] += p;
                    for (int64_t d = 0; d < head_size; ++d) ag[d] += p * v[d];
                }
            }
            for (int64_t g = 0; g < group; ++g) {
                float *dst = out + (r * num_heads + kvh * group + g) * head_size;
                const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
                for (int64_t d = 0; d < head_size; ++d) dst[d] = acc[g * head_size + d] * inv;
            }
        }
    }
}
