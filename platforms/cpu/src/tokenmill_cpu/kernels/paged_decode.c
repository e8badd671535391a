/* Paged decode attention on the CPU (prefill chunks: paged_prefill.c): one query token per request,
 * keys and values read in place from the block-structured cache (no gather), GQA, sliding window,
 * soft-cap. paged_decode_f32 works on float32; paged_decode_bf16 takes query, cache, new keys and
 * values and output in bfloat16 and computes in float32 (as PyTorch's CPU attention does), rounding
 * the output to nearest even.
 *
 * cache layout: [2][num_blocks][block_size][num_kv_heads][head_size] (keys, then values), contiguous.
 * query/out:    [num_requests][num_heads][head_size], contiguous.
 * Each (request, kv head) pair is independent: OpenMP splits requests (or, with few requests, pairs)
 * across threads. With `keys` given, each task first stores its request's new key and value heads at
 * cache slot slots[r] (rows of keys / values are key_stride / value_stride elements apart), so one call
 * replaces the cache write.
 *
 * Keys are taken a tile at a time (the tokens of one cache block): every score of the tile first, so
 * the loads are independent and the memory system keeps many in flight, then one online-softmax
 * update per tile and query head, then the values. Decoding is bound by memory bandwidth; reading
 * one key per softmax update (a serial chain through the running maximum) left most of it unused,
 * and so did libm's expf (a call per score, not vectorised): exp is a polynomial here (exp_approx,
 * 1.2 ulp at most over [-87, 0]), which halved the kernel's time at 64 requests.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "exp_approx.h"

#define MAX_TILE 64
#define MAX_GROUP 64
#define MAX_HEAD 256

/* The tile starting at position pos: n tokens (to the end of pos's cache block, at most MAX_TILE and
 * none at or past len) whose first token is `base` elements into the keys (and values). */
static inline void tile_at(const int32_t *table, int64_t pos, int64_t len, int64_t block_size,
                           int64_t block_stride, int64_t token_stride, int64_t *n, int64_t *base) {
    if (pos >= len) {
        *n = 0;
        return;
    }
    const int64_t in_block = pos % block_size;
    int64_t count = block_size - in_block;
    if (count > len - pos) count = len - pos;
    *n = count > MAX_TILE ? MAX_TILE : count;
    *base = (int64_t)table[pos / block_size] * block_stride + in_block * token_stride;
}

/* Asks for the cache lines of `bytes` bytes ahead of use: blocks sit anywhere in the cache, so the
 * hardware prefetcher loses the stream at every block (and 4 KiB page) boundary. */
static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)row + i, 0, 3);
}

static inline __attribute__((always_inline)) float dot(const float *a, const void *b, int64_t n, const int bf16) {
    float s = 0.0f;
    for (int64_t d = 0; d < n; ++d) s += a[d] * element(b, d, bf16);
    return s;
}

/* One kv head of one request: `group` query heads attend to positions [first, len). Inlined with a
 * constant head_size for the common sizes and a constant element type (bf16), so the inner loops
 * vectorise with known trip counts. Offsets into query, keys, values and out count elements. */
static inline __attribute__((always_inline)) void attend_kv_head(
        const void *query, const void *keys, const void *values, const int32_t *table, int64_t first,
        int64_t len, void *out, int64_t group, int64_t heads_per_kv, int64_t head_size, int64_t block_size,
        int64_t block_stride, int64_t token_stride, float scale, float soft_cap, const int bf16) {
    float q[MAX_GROUP * MAX_HEAD] __attribute__((aligned(64)));
    float acc[MAX_GROUP * MAX_HEAD] __attribute__((aligned(64)));
    float scores[MAX_GROUP * MAX_TILE] __attribute__((aligned(64)));
    float running_max[MAX_GROUP], total[MAX_GROUP];
    int64_t kv_offset[MAX_GROUP];
    const int64_t width = bf16 ? 2 : 4;
    for (int64_t g = 0; g < group; ++g) {
        kv_offset[g] = (g / heads_per_kv) * head_size;
        for (int64_t d = 0; d < head_size; ++d) q[g * head_size + d] = element(query, g * head_size + d, bf16) * scale;
        running_max[g] = -INFINITY;
        total[g] = 0.0f;
        memset(acc + g * head_size, 0, sizeof(float) * head_size);
    }
    const int64_t span = (group / heads_per_kv) * head_size * width;
    int64_t n = 0, base = 0;
    tile_at(table, first, len, block_size, block_stride, token_stride, &n, &base);
    for (int64_t pos = first; pos < len;) {
        int64_t next_n = 0, next_base = 0;
        tile_at(table, pos + n, len, block_size, block_stride, token_stride, &next_n, &next_base);
        for (int64_t t = 0; t < n; ++t) {
            prefetch_row((const char *)values + (base + t * token_stride) * width, span);
            const char *k = (const char *)keys + (base + t * token_stride) * width;
            for (int64_t g = 0; g < group; ++g)
                scores[g * MAX_TILE + t] = dot(q + g * head_size, k + kv_offset[g] * width, head_size, bf16);
        }
        for (int64_t g = 0; g < group; ++g) {
            float *s = scores + g * MAX_TILE;
            if (soft_cap > 0.0f)
                for (int64_t t = 0; t < n; ++t) s[t] = soft_cap * tanhf(s[t] / soft_cap);
            float tile_max = running_max[g];
            for (int64_t t = 0; t < n; ++t) tile_max = s[t] > tile_max ? s[t] : tile_max;
            if (tile_max > running_max[g]) {
                const float correction = expf(running_max[g] - tile_max);
                float *a = acc + g * head_size;
                total[g] *= correction;
                for (int64_t d = 0; d < head_size; ++d) a[d] *= correction;
                running_max[g] = tile_max;
            }
            float sum = 0.0f;
            for (int64_t t = 0; t < n; ++t) {
                s[t] = exp_approx(s[t] - tile_max);
                sum += s[t];
            }
            total[g] += sum;
        }
        for (int64_t t = 0; t < n; ++t) {
            if (t < next_n) prefetch_row((const char *)keys + (next_base + t * token_stride) * width, span);
            const char *v = (const char *)values + (base + t * token_stride) * width;
            for (int64_t g = 0; g < group; ++g) {
                const float p = scores[g * MAX_TILE + t];
                const char *vg = v + kv_offset[g] * width;
                float *a = acc + g * head_size;
                for (int64_t d = 0; d < head_size; ++d) a[d] += p * element(vg, d, bf16);
            }
        }
        pos += n;
        n = next_n;
        base = next_base;
    }
    for (int64_t g = 0; g < group; ++g) {
        const float inv = total[g] > 0.0f ? 1.0f / total[g] : 0.0f;
        for (int64_t d = 0; d < head_size; ++d) store(out, g * head_size + d, acc[g * head_size + d] * inv, bf16);
    }
}

/* One task of the decode: request r's kv heads kv0 .. kv0 + heads_per_task / group - 1 (sizes in
 * elements; see the file comment). */
static inline __attribute__((always_inline)) void decode_task(
        const void *query, void *cache, const int32_t *block_tables, const int32_t *seq_lens, void *out,
        int64_t r, int64_t kv0, int64_t split, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
        int64_t block_size, int64_t num_blocks, int64_t max_blocks, float scale, int64_t window, float soft_cap,
        const void *keys, int64_t key_stride, const void *values_in, int64_t value_stride, const int64_t *slots,
        const int bf16) {
    const int64_t width = bf16 ? 2 : 4;
    const int64_t group = num_heads / num_kv_heads, heads_per_task = num_heads / split;
    const int64_t token_stride = num_kv_heads * head_size;
    const int64_t block_stride = block_size * token_stride;
    char *values = (char *)cache + num_blocks * block_stride * width;
    const int64_t len = seq_lens[r];
    const int64_t first = (window > 0 && len > window) ? len - window : 0;
    const int64_t head0 = ((r * num_heads + kv0 * group) * head_size) * width;
    const int32_t *table = block_tables + r * max_blocks;
    const char *k = (const char *)cache + kv0 * head_size * width, *v = values + kv0 * head_size * width;
    if (keys != NULL) {
        for (int64_t kvh = kv0; kvh < kv0 + num_kv_heads / split; ++kvh) {
            const int64_t at = (slots[r] * token_stride + kvh * head_size) * width;
            memcpy((char *)cache + at, (const char *)keys + (r * key_stride + kvh * head_size) * width,
                   width * head_size);
            memcpy(values + at, (const char *)values_in + (r * value_stride + kvh * head_size) * width,
                   width * head_size);
        }
    }
    const char *q = (const char *)query + head0;
    char *o = (char *)out + head0;
    if (head_size == 64)
        attend_kv_head(q, k, v, table, first, len, o, heads_per_task, group, 64, block_size, block_stride,
                       token_stride, scale, soft_cap, bf16);
    else if (head_size == 128)
        attend_kv_head(q, k, v, table, first, len, o, heads_per_task, group, 128, block_size, block_stride,
                       token_stride, scale, soft_cap, bf16);
    else
        attend_kv_head(q, k, v, table, first, len, o, heads_per_task, group, head_size, block_size, block_stride,
                       token_stride, scale, soft_cap, bf16);
}

/* The decode of every request. OpenMP outlines the loop before inlining, so the element type is
 * branched on inside it: each branch inlines decode_task with a literal bf16, one body per type. */
static void paged_decode(const void *query, void *cache, const int32_t *block_tables, const int32_t *seq_lens,
                         void *out, int64_t num_requests, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                         int64_t block_size, int64_t num_blocks, int64_t max_blocks, float scale, int64_t window,
                         float soft_cap, const void *keys, int64_t key_stride, const void *values_in,
                         int64_t value_stride, const int64_t *slots, const int bf16) {
    /* With many requests each takes all its kv heads at once (a token's heads are adjacent in the cache:
     * one contiguous read per token); with few, each (request, kv head) pair is its own task. */
    const int64_t split = (num_requests >= 8 && num_heads <= MAX_GROUP) ? 1 : num_kv_heads;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_requests * split; ++task) {
        const int64_t r = task / split, kv0 = task % split;
        if (bf16)
            decode_task(query, cache, block_tables, seq_lens, out, r, kv0, split, num_heads, num_kv_heads, head_size,
                        block_size, num_blocks, max_blocks, scale, window, soft_cap, keys, key_stride, values_in,
                        value_stride, slots, 1);
        else
            decode_task(query, cache, block_tables, seq_lens, out, r, kv0, split, num_heads, num_kv_heads, head_size,
                        block_size, num_blocks, max_blocks, scale, window, soft_cap, keys, key_stride, values_in,
                        value_stride, slots, 0);
    }
}

void paged_decode_f32(const float *query, float *cache, const int32_t *block_tables, const int32_t *seq_lens,
                      float *out, int64_t num_requests, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                      int64_t block_size, int64_t num_blocks, int64_t max_blocks, float scale, int64_t window,
                      float soft_cap, const float *keys, int64_t key_stride, const float *values_in,
                      int64_t value_stride, const int64_t *slots) {
    paged_decode(query, cache, block_tables, seq_lens, out, num_requests, num_heads, num_kv_heads, head_size,
                 block_size, num_blocks, max_blocks, scale, window, soft_cap, keys, key_stride, values_in,
                 value_stride, slots, 0);
}

/* paged_decode_f32 over bfloat16 query, cache, new keys and values, and output (uint16 bits). */
void paged_decode_bf16(const uint16_t *query, uint16_t *cache, const int32_t *block_tables,
                       const int32_t *seq_lens, uint16_t *out, int64_t num_requests, int64_t num_heads,
                       int64_t num_kv_heads, int64_t head_size, int64_t block_size, int64_t num_blocks,
                       int64_t max_blocks, float scale, int64_t window, float soft_cap, const uint16_t *keys,
                       int64_t key_stride, const uint16_t *values_in, int64_t value_stride, const int64_t *slots) {
    paged_decode(query, cache, block_tables, seq_lens, out, num_requests, num_heads, num_kv_heads, head_size,
                 block_size, num_blocks, max_blocks, scale, window, soft_cap, keys, key_stride, values_in,
                 value_stride, slots, 1);
}
