/* Work sharing for a loop over items [0, n) inside an OpenMP parallel region: each thread starts on
 * its own contiguous range (sequential reads for the hardware prefetchers, and its software
 * prefetches of the next item are usually for itself) and claims its items one at a time; a thread
 * that finishes its range goes on to claim from the other threads' ranges, in thread order. On a
 * shared machine one core often runs slower than the other (another tenant), and a static split waits
 * for it: the panel matmul's 30 SmolLM2 layers at 64 rows took 3-13% less time this way here (paired
 * medians of 15 interleaved runs: 0.87-0.97), at 16 rows the same. An item should be worth far more
 * than an atomic add on a shared line: claimed pair by pair, the small-batch matmul ran 20-35%
 * slower (16 pairs a claim: even), so it keeps its static split.
 *
 *     ranges_t ranges;
 *     #pragma omp parallel
 *     {
 *         claimer_t me = ranges_begin(&ranges, n);
 *         int64_t end;
 *         for (int64_t i; (i = ranges_claim(&ranges, &me, &end)) >= 0;) ...item i, of a range ending at end...
 *     }
 */
#ifndef TOKENMILL_RANGES_H
#define TOKENMILL_RANGES_H

#include <omp.h>
#include <stdint.h>

#define RANGES_MAX_THREADS 64

typedef struct {
    struct {
        int64_t next; /* the next unclaimed item of a thread's range, alone in its cache line */
        char pad[64 - sizeof(int64_t)];
    } cursor[RANGES_MAX_THREADS];
    int64_t n, threads;
} ranges_t;

typedef struct {
    int64_t id, visited; /* the claiming thread, and how many ranges it has emptied */
} claimer_t;

/* Called by every thread of the region; threads past RANGES_MAX_THREADS claim nothing. */
static inline claimer_t ranges_begin(ranges_t *r, int64_t n) {
#pragma omp single
    {
        r->n = n;
        r->threads = omp_get_num_threads() < RANGES_MAX_THREADS ? omp_get_num_threads() : RANGES_MAX_THREADS;
    }
    const int64_t id = omp_get_thread_num();
    if (id < r->threads)
        r->cursor[id].next = n * id / r->threads;
#pragma omp barrier
    return (claimer_t){.id = id, .visited = id < r->threads ? 0 : r->threads};
}

/* The thread's next item (from its own range, then the others'), or -1 when every item is claimed;
 * *end is the end of the range the item came from. */
static inline int64_t ranges_claim(ranges_t *r, claimer_t *c, int64_t *end) {
    for (; c->visited < r->threads; ++c->visited) {
        const int64_t owner = (c->id + c->visited) % r->threads;
        const int64_t item = __atomic_fetch_add(&r->cursor[owner].next, 1, __ATOMIC_RELAXED);
        *end = r->n * (owner + 1) / r->threads;
        if (item < *end)
            return item;
    }
    return -1;
}

#endif
