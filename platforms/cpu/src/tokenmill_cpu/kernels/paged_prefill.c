/* Paged prefill attention on the CPU: the query tokens of each request (a chunk that starts at
 * position context_lens[r], its rows query_starts[r] .. query_starts[r + 1] of query/out, laid out
 * [token][num_heads][head_size]) attend causally to the request's keys in the cache, which already
 * hold the chunk's own keys and values. head_size must be a multiple of 16.
 *
 * A task is one kv head of one request and up to QUERY_TILE of its tokens (fewer where group *
 * head_size is large): with the group's query heads, up to QUERY_TILE * group rows, taken ROW_BLOCK
 * rows at a time against one cache block of keys (KEY_TILE tokens at most) as two small matrix
 * products. The key tile is transposed first, so a row's scores are a sum of head_size key vectors
 * [KEY_TILE] each scaled by one query element (no horizontal sums), and values add into the rows'
 * accumulators a value row at a time; written with GCC vector types (16 floats: one AVX-512
 * register, two AVX2 ones) so that the sums stay in registers as independent chains instead of
 * making one dependency through memory per step. Keys past a row's position or before its window
 * are masked to -inf; key blocks past the task's last token are never read. Unlike padding every
 * request to the longest and masking (the reference path), the work follows each request's length.
 *
 * paged_prefill_f32 and write_kv_f32 work on float32; paged_prefill_bf16 and write_kv_bf16 on
 * bfloat16 query, cache, keys, values and output, computing in float32 (the output rounded once).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "exp_approx.h"

#define MAX_GROUP 64
#define MAX_HEAD 256
#define QUERY_TILE 16
#define KEY_TILE 16 /* one vector of scores; keys gathered by position, so a tile may span two blocks */
#define ROW_BLOCK 8
#define TILE_FLOATS (64 * 256) /* a task's rows x head_size, so its buffers stay 64 KiB each on the stack */

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64)));
typedef uint16_t h16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t u16 __attribute__((vector_size(64)));

/* 16 consecutive elements of a float32 or bfloat16 array from element i, as floats. */
static inline __attribute__((always_inline)) v16 load16(const void *base, int64_t i, const int bf16) {
    if (!bf16) return *(const v16u *)((const float *)base + i);
    const u16 widened = __builtin_convertvector(*(const h16 *)((const uint16_t *)base + i), u16) << 16;
    return (v16)widened;
}

/* Scores of ROW_BLOCK query rows (q, head_size apart) against a transposed key tile kt[head_size][16]. */
static inline __attribute__((always_inline)) void score_rows(const float *q, const float *kt, int64_t head_size,
                                                             v16 scores[ROW_BLOCK]) {
    v16 s[ROW_BLOCK] = {0};
    for (int64_t d = 0; d < head_size; ++d) {
        const v16 k = *(const v16 *)(kt + d * KEY_TILE);
        for (int r = 0; r < ROW_BLOCK; ++r) s[r] += q[r * head_size + d] * k;
    }
    for (int r = 0; r < ROW_BLOCK; ++r) scores[r] = s[r];
}

/* acc rows (head_size apart) = acc * correction + p @ values, for `count` value rows at values + at[t]. */
static inline __attribute__((always_inline)) void add_values(float *acc, const float *correction, const float *p,
                                                             const void *values, const int64_t *at,
                                                             int64_t count, int64_t head_size, const int bf16) {
    for (int64_t c = 0; c < head_size; c += 16) {
        v16 a[ROW_BLOCK];
        for (int r = 0; r < ROW_BLOCK; ++r) a[r] = *(v16 *)(acc + r * head_size + c) * correction[r];
        for (int64_t t = 0; t < count; ++t) {
            const v16 v = load16(values, at[t] + c, bf16);
            for (int r = 0; r < ROW_BLOCK; ++r) a[r] += p[r * KEY_TILE + t] * v;
        }
        for (int r = 0; r < ROW_BLOCK; ++r) *(v16 *)(acc + r * head_size + c) = a[r];
    }
}

/* Masks one row's scores (keys key0 .. key0 + count - 1 against its position and window) into p,
 * updates its running maximum and total, and leaves exp(score - maximum) in p; returns the factor
 * its accumulator must be scaled by first. */
static inline __attribute__((always_inline)) float softmax_row(const v16 *scores, float *p, int64_t key0,
                                                               int64_t count, int64_t row_pos, int64_t window,
                                                               float soft_cap, float *running_max, float *total) {
    const v16 minus_inf = (v16){0} - INFINITY;
    v16 s = *scores;
    if (soft_cap > 0.0f)
        for (int t = 0; t < KEY_TILE; ++t) s[t] = soft_cap * tanhf(s[t] / soft_cap);
    i16 lane;
    for (int t = 0; t < KEY_TILE; ++t) lane[t] = t;
    const i16 key = lane + (int32_t)key0;
    i16 valid = (lane < (int32_t)count) & (key <= (int32_t)row_pos);
    if (window > 0) valid &= key > (int32_t)(row_pos - window);
    *(v16 *)p = (v16)(((i16)s & valid) | ((i16)minus_inf & ~valid));
    float tile_max = *running_max, correction = 1.0f, sum = 0.0f;
    for (int t = 0; t < KEY_TILE; ++t) tile_max = p[t] > tile_max ? p[t] : tile_max;
    if (tile_max > *running_max) {
        correction = expf(*running_max - tile_max);
        *total *= correction;
        *running_max = tile_max;
    }
    /* a row with no key yet keeps -inf: its p are exp(-inf - 0) = 0 */
    const float row_max = *running_max == -INFINITY ? 0.0f : *running_max;
    for (int t = 0; t < KEY_TILE; ++t) {
        p[t] = exp_approx(p[t] - row_max);
        sum += p[t];
    }
    *total += sum;
    return correction;
}

/* One task's tile; offsets into query, keys, values and out count elements of the type bf16 selects. */
static inline __attribute__((always_inline)) void prefill_tile(
        const void *query, const void *keys, const void *values, const int32_t *table, int64_t first_pos,
        int64_t tokens, int64_t group, int64_t num_heads, int64_t head_size, int64_t block_size,
        int64_t block_stride, int64_t token_stride, float scale, int64_t window, float soft_cap, void *out,
        const int bf16) {
    const int64_t rows = tokens * group, padded = (rows + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    /* rows are padded up to a multiple of ROW_BLOCK, past TILE_FLOATS by less than a block */
    float q[TILE_FLOATS + ROW_BLOCK * MAX_HEAD] __attribute__((aligned(64)));
    float acc[TILE_FLOATS + ROW_BLOCK * MAX_HEAD] __attribute__((aligned(64)));
    float kt[MAX_HEAD * KEY_TILE] __attribute__((aligned(64)));
    float p[ROW_BLOCK * KEY_TILE] __attribute__((aligned(64)));
    float running_max[QUERY_TILE * MAX_GROUP + ROW_BLOCK], total[QUERY_TILE * MAX_GROUP + ROW_BLOCK];
    int64_t row_pos[QUERY_TILE * MAX_GROUP + ROW_BLOCK], at[KEY_TILE];
    for (int64_t i = 0; i < padded; ++i) {
        const int64_t row = i < rows ? i : rows - 1; /* padding rows repeat the last row, never stored */
        const int64_t src = (row / group) * num_heads * head_size + (row % group) * head_size;
        for (int64_t d = 0; d < head_size; ++d) q[i * head_size + d] = element(query, src + d, bf16) * scale;
        memset(acc + i * head_size, 0, sizeof(float) * head_size);
        row_pos[i] = first_pos + row / group;
        running_max[i] = -INFINITY;
        total[i] = 0.0f;
    }
    const int64_t last_pos = first_pos + tokens - 1;
    const int64_t start = window > 0 && first_pos - window + 1 > 0 ? first_pos - window + 1 : 0;
    for (int64_t key0 = start; key0 <= last_pos; key0 += KEY_TILE) {
        const int64_t count = last_pos + 1 - key0 < KEY_TILE ? last_pos + 1 - key0 : KEY_TILE;
        for (int64_t t = 0; t < count; ++t)
            at[t] = (int64_t)table[(key0 + t) / block_size] * block_stride + (key0 + t) % block_size * token_stride;
        for (int64_t d = 0; d < head_size; ++d)
            for (int64_t t = 0; t < KEY_TILE; ++t)
                kt[d * KEY_TILE + t] = t < count ? element(keys, at[t] + d, bf16) : 0.0f;
        for (int64_t i = 0; i < padded; i += ROW_BLOCK) {
            if (key0 > row_pos[i + ROW_BLOCK - 1]) continue; /* rows ascend: all of them before this tile */
            v16 scores[ROW_BLOCK];
            float correction[ROW_BLOCK];
            score_rows(q + i * head_size, kt, head_size, scores);
            for (int r = 0; r < ROW_BLOCK; ++r)
                correction[r] = softmax_row(scores + r, p + r * KEY_TILE, key0, count, row_pos[i + r], window,
                                            soft_cap, running_max + i + r, total + i + r);
            add_values(acc + i * head_size, correction, p, values, at, count, head_size, bf16);
        }
    }
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t dst = (i / group) * num_heads * head_size + (i % group) * head_size;
        const float inv = total[i] > 0.0f ? 1.0f / total[i] : 0.0f;
        for (int64_t d = 0; d < head_size; ++d) store(out, dst + d, acc[i * head_size + d] * inv, bf16);
    }
}

/* prefill_tile with the common head sizes as constants, for a literal bf16: OpenMP outlines the task
 * loop before inlining, so the loop branches on the element type and each branch gets its own body. */
static inline __attribute__((always_inline)) void sized_tile(
        const void *q, const void *k, const void *v, const int32_t *table, int64_t first_pos, int64_t tokens,
        int64_t group, int64_t num_heads, int64_t head_size, int64_t block_size, int64_t block_stride,
        int64_t token_stride, float scale, int64_t window, float soft_cap, void *o, const int bf16) {
    if (head_size == 64)
        prefill_tile(q, k, v, table, first_pos, tokens, group, num_heads, 64, block_size, block_stride, token_stride,
                     scale, window, soft_cap, o, bf16);
    else if (head_size == 128)
        prefill_tile(q, k, v, table, first_pos, tokens, group, num_heads, 128, block_size, block_stride, token_stride,
                     scale, window, soft_cap, o, bf16);
    else
        prefill_tile(q, k, v, table, first_pos, tokens, group, num_heads, head_size, block_size, block_stride,
                     token_stride, scale, window, soft_cap, o, bf16);
}

static void paged_prefill(
        const void *query, const void *cache, const int32_t *block_tables, const int32_t *query_starts,
        const int32_t *context_lens, void *out, int64_t num_requests, int64_t num_heads, int64_t num_kv_heads,
        int64_t head_size, int64_t block_size, int64_t num_blocks, int64_t max_blocks, float scale, int64_t window,
        float soft_cap, const int bf16) {
    const int64_t width = bf16 ? 2 : 4;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_size;
    const int64_t block_stride = block_size * token_stride;
    const char *values = (const char *)cache + num_blocks * block_stride * width;
    const int64_t fit = TILE_FLOATS / (group * head_size);
    const int64_t per_tile = fit < 1 ? 1 : fit > QUERY_TILE ? QUERY_TILE : fit;
    int64_t tiles = 0;
    for (int64_t r = 0; r < num_requests; ++r)
        tiles += (query_starts[r + 1] - query_starts[r] + per_tile - 1) / per_tile;
    /* task -> (tile, kv head); the tile's request is found by a walk (a few hundred tasks per call) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < tiles * num_kv_heads; ++task) {
        int64_t tile = task / num_kv_heads, r = 0;
        const int64_t kvh = task % num_kv_heads;
        for (;; ++r) {
            const int64_t own = (query_starts[r + 1] - query_starts[r] + per_tile - 1) / per_tile;
            if (tile < own) break;
            tile -= own;
        }
        const int64_t row0 = query_starts[r] + tile * per_tile;
        const int64_t tokens = query_starts[r + 1] - row0 < per_tile ? query_starts[r + 1] - row0 : per_tile;
        const int64_t first_pos = context_lens[r] + tile * per_tile;
        const int64_t head0 = (row0 * num_heads * head_size + kvh * group * head_size) * width;
        const int32_t *table = block_tables + r * max_blocks;
        const char *k = (const char *)cache + kvh * head_size * width, *v = values + kvh * head_size * width;
        const char *q = (const char *)query + head0;
        char *o = (char *)out + head0;
        if (bf16)
            sized_tile(q, k, v, table, first_pos, tokens, group, num_heads, head_size, block_size, block_stride,
                       token_stride, scale, window, soft_cap, o, 1);
        else
            sized_tile(q, k, v, table, first_pos, tokens, group, num_heads, head_size, block_size, block_stride,
                       token_stride, scale, window, soft_cap, o, 0);
    }
}

void paged_prefill_f32(const float *query, const float *cache, const int32_t *block_tables,
                       const int32_t *query_starts, const int32_t *context_lens, float *out, int64_t num_requests,
                       int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                       int64_t num_blocks, int64_t max_blocks, float scale, int64_t window, float soft_cap) {
    paged_prefill(query, cache, block_tables, query_starts, context_lens, out, num_requests, num_heads, num_kv_heads,
                  head_size, block_size, num_blocks, max_blocks, scale, window, soft_cap, 0);
}

void paged_prefill_bf16(const uint16_t *query, const uint16_t *cache, const int32_t *block_tables,
                        const int32_t *query_starts, const int32_t *context_lens, uint16_t *out,
                        int64_t num_requests, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                        int64_t block_size, int64_t num_blocks, int64_t max_blocks, float scale, int64_t window,
                        float soft_cap) {
    paged_prefill(query, cache, block_tables, query_starts, context_lens, out, num_requests, num_heads, num_kv_heads,
                  head_size, block_size, num_blocks, max_blocks, scale, window, soft_cap, 1);
}

/* Stores n rows of new keys and values ([n][num_kv_heads][head_size] with row strides key_stride and
 * value_stride elements, heads contiguous within a row) at cache slots slots[i]: what a prefill writes
 * before its rows attend. A slot outside the cache is skipped and counted; returns that count. */
static inline __attribute__((always_inline)) int64_t write_kv(
        char *cache, int64_t num_blocks, int64_t block_size, int64_t token_elements, const char *keys,
        int64_t key_stride, const char *values, int64_t value_stride, const int64_t *slots, int64_t n,
        const int64_t width) {
    const int64_t num_slots = num_blocks * block_size, token_bytes = token_elements * width;
    char *value_cache = cache + num_slots * token_bytes;
    int64_t refused = 0;
#pragma omp parallel for schedule(static) reduction(+ : refused) if (n >= 256)
    for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = slots[i];
        if (slot < 0 || slot >= num_slots) {
            ++refused;
            continue;
        }
        memcpy(cache + slot * token_bytes, keys + i * key_stride * width, token_bytes);
        memcpy(value_cache + slot * token_bytes, values + i * value_stride * width, token_bytes);
    }
    return refused;
}

int64_t write_kv_f32(float *cache, int64_t num_blocks, int64_t block_size, int64_t token_floats,
                     const float *keys, int64_t key_stride, const float *values, int64_t value_stride,
                     const int64_t *slots, int64_t n) {
    return write_kv((char *)cache, num_blocks, block_size, token_floats, (const char *)keys, key_stride,
                    (const char *)values, value_stride, slots, n, 4);
}

int64_t write_kv_bf16(uint16_t *cache, int64_t num_blocks, int64_t block_size, int64_t token_elements,
                      const uint16_t *keys, int64_t key_stride, const uint16_t *values, int64_t value_stride,
                      const int64_t *slots, int64_t n) {
    return write_kv((char *)cache, num_blocks, block_size, token_elements, (const char *)keys, key_stride,
                    (const char *)values, value_stride, slots, n, 2);
}
