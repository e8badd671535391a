/* Paged attention on the CPU: decode (paged_decode_f32 and paged_decode_bf16, below) and float32
 * prefill chunks (paged_prefill_f32, after it, and write_kv_f32, which stores a prefill's new keys
 * and values first). Decode: one query token per request, keys and values read in place from the
 * block-structured cache (no gather), GQA, sliding window, soft-cap. The bf16 decode takes query,
 * cache, new keys and values and output in bfloat16 and computes in float32 (as PyTorch's CPU
 * attention does), rounding the output to nearest even.
 *
 * cache layout: [2][num_blocks][block_size][num_kv_heads][head_size] (keys, then values), contiguous.
 * query/out:    [num_requests][num_heads][head_size], contiguous.
 * Each (request, kv head) pair is independent: OpenMP splits requests (or, with few requests, pairs)
 * across threads. With `keys` given, each task first stores its request's new key and value heads at
 * cache slot slots[r] (rows of keys / values are key_stride / value_stride floats apart), so one call
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
 * none at or past len) whose first token is `base` floats into the keys (and values). */
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

/* Element i of a float32 (bf16 = 0) or bfloat16 (bf16 = 1) array, as a float. */
static inline __attribute__((always_inline)) float element(const void *base, int64_t i, const int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* Stores x at element i of a float32 or bfloat16 array (rounded to nearest even). */
static inline __attribute__((always_inline)) void store(void *base, int64_t i, float x, const int bf16) {
    if (bf16)
        ((uint16_t *)base)[i] = f32_to_bf16(x);
    else
        ((float *)base)[i] = x;
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

/* The decode of every request, for one element type (sizes in elements; see the file comment). */
static inline __attribute__((always_inline)) void paged_decode(
        const void *query, void *cache, const int32_t *block_tables, const int32_t *seq_lens, void *out,
        int64_t num_requests, int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
        int64_t num_blocks, int64_t max_blocks, float scale, int64_t window, float soft_cap, const void *keys,
        int64_t key_stride, const void *values_in, int64_t value_stride, const int64_t *slots, const int bf16) {
    const int64_t width = bf16 ? 2 : 4;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_size;
    const int64_t block_stride = block_size * token_stride;
    char *values = (char *)cache + num_blocks * block_stride * width;
    /* With many requests each takes all its kv heads at once (a token's heads are adjacent in the cache:
     * one contiguous read per token); with few, each (request, kv head) pair is its own task. */
    const int64_t split = (num_requests >= 8 && num_heads <= MAX_GROUP) ? 1 : num_kv_heads;
    const int64_t heads_per_task = num_heads / split;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_requests * split; ++task) {
        const int64_t r = task / split, kv0 = task % split;
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
            attend_kv_head(q, k, v, table, first, len, o, heads_per_task, group, head_size, block_size,
                           block_stride, token_stride, scale, soft_cap, bf16);
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

/* Paged prefill attention for float32: the query tokens of each request (a chunk that starts at
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
 */
#define QUERY_TILE 16
#define KEY_TILE 16 /* one vector of scores; keys gathered by position, so a tile may span two blocks */
#define ROW_BLOCK 8
#define TILE_FLOATS (64 * 256) /* a task's rows x head_size, so its buffers stay 64 KiB each on the stack */

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64)));

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
                                                             const float *values, const int64_t *at,
                                                             int64_t count, int64_t head_size) {
    for (int64_t c = 0; c < head_size; c += 16) {
        v16 a[ROW_BLOCK];
        for (int r = 0; r < ROW_BLOCK; ++r) a[r] = *(v16 *)(acc + r * head_size + c) * correction[r];
        for (int64_t t = 0; t < count; ++t) {
            const v16 v = *(const v16u *)(values + at[t] + c);
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

static inline __attribute__((always_inline)) void prefill_tile(
        const float *query, const float *keys, const float *values, const int32_t *table, int64_t first_pos,
        int64_t tokens, int64_t group, int64_t num_heads, int64_t head_size, int64_t block_size,
        int64_t block_stride, int64_t token_stride, float scale, int64_t window, float soft_cap, float *out) {
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
        const float *src = query + (row / group) * num_heads * head_size + (row % group) * head_size;
        for (int64_t d = 0; d < head_size; ++d) q[i * head_size + d] = src[d] * scale;
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
            for (int64_t t = 0; t < KEY_TILE; ++t) kt[d * KEY_TILE + t] = t < count ? keys[at[t] + d] : 0.0f;
        for (int64_t i = 0; i < padded; i += ROW_BLOCK) {
            if (key0 > row_pos[i + ROW_BLOCK - 1]) continue; /* rows ascend: all of them before this tile */
            v16 scores[ROW_BLOCK];
            float correction[ROW_BLOCK];
            score_rows(q + i * head_size, kt, head_size, scores);
            for (int r = 0; r < ROW_BLOCK; ++r)
                correction[r] = softmax_row(scores + r, p + r * KEY_TILE, key0, count, row_pos[i + r], window,
                                            soft_cap, running_max + i + r, total + i + r);
            add_values(acc + i * head_size, correction, p, values, at, count, head_size);
        }
    }
    for (int64_t i = 0; i < rows; ++i) {
        float *dst = out + (i / group) * num_heads * head_size + (i % group) * head_size;
        const float inv = total[i] > 0.0f ? 1.0f / total[i] : 0.0f;
        for (int64_t d = 0; d < head_size; ++d) dst[d] = acc[i * head_size + d] * inv;
    }
}

void paged_prefill_f32(const float *query, const float *cache, const int32_t *block_tables,
                       const int32_t *query_starts, const int32_t *context_lens, float *out, int64_t num_requests,
                       int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                       int64_t num_blocks, int64_t max_blocks, float scale, int64_t window, float soft_cap) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_size;
    const int64_t block_stride = block_size * token_stride;
    const float *values = cache + num_blocks * block_stride;
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
        const int64_t head0 = row0 * num_heads * head_size + kvh * group * head_size;
        const int32_t *table = block_tables + r * max_blocks;
        const float *k = cache + kvh * head_size, *v = values + kvh * head_size;
        if (head_size == 64)
            prefill_tile(query + head0, k, v, table, first_pos, tokens, group, num_heads, 64, block_size,
                         block_stride, token_stride, scale, window, soft_cap, out + head0);
        else if (head_size == 128)
            prefill_tile(query + head0, k, v, table, first_pos, tokens, group, num_heads, 128, block_size,
                         block_stride, token_stride, scale, window, soft_cap, out + head0);
        else
            prefill_tile(query + head0, k, v, table, first_pos, tokens, group, num_heads, head_size, block_size,
                         block_stride, token_stride, scale, window, soft_cap, out + head0);
    }
}

/* Stores n rows of new keys and values ([n][num_kv_heads][head_size] with row strides key_stride and
 * value_stride floats, heads contiguous within a row) at cache slots slots[i]: what a prefill writes
 * before its rows attend. A slot outside the cache is skipped and counted; returns that count. */
int64_t write_kv_f32(float *cache, int64_t num_blocks, int64_t block_size, int64_t token_floats,
                     const float *keys, int64_t key_stride, const float *values, int64_t value_stride,
                     const int64_t *slots, int64_t n) {
    const int64_t num_slots = num_blocks * block_size;
    float *value_cache = cache + num_slots * token_floats;
    int64_t refused = 0;
#pragma omp parallel for schedule(static) reduction(+ : refused) if (n >= 256)
    for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = slots[i];
        if (slot < 0 || slot >= num_slots) {
            ++refused;
            continue;
        }
        memcpy(cache + slot * token_floats, keys + i * key_stride, sizeof(float) * token_floats);
        memcpy(value_cache + slot * token_floats, values + i * value_stride, sizeof(float) * token_floats);
    }
    return refused;
}
