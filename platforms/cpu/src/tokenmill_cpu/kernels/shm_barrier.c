/* A barrier for processes that map one shared-memory segment (the CPU communicator's ranks).
 *
 * Two 32-bit words in the segment: `arrived` counts the ranks that reached the current round,
 * `generation` counts completed rounds. A rank reads the generation, then increments `arrived`; the
 * last of `parties` ranks resets `arrived` and increments `generation` (release: every rank's writes
 * before its arrival are visible to every rank that sees the new generation), and wakes the sleepers.
 * The others wait for the generation to move: a short spin, then the kernel's futex wait on the
 * shared word (Linux), or short sleeps elsewhere, so a waiting rank yields its CPU.
 *
 * `arrived` is reset before `generation` moves and nobody touches it again until they saw the new
 * generation, so the barrier can be reused at once. Waiting is split from arriving so the caller can
 * wait in slices, checking its deadline and signals between them.
 */
#include <stdint.h>
#include <time.h>

#ifdef __linux__
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define SPIN_CHECKS 256

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Arrive at the barrier: returns the generation to wait past, or -1 when this rank completed the
 * round (nothing to wait for). */
int64_t shm_barrier_arrive(uint32_t *arrived, uint32_t *generation, int32_t parties) {
    uint32_t seen = __atomic_load_n(generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(arrived, 1, __ATOMIC_ACQ_REL) == (uint32_t)parties) {
        __atomic_store_n(arrived, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(generation, 1, __ATOMIC_RELEASE);
#ifdef __linux__
        syscall(SYS_futex, generation, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
        return -1;
    }
    return (int64_t)seen;
}

static int64_t elapsed_ns(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)(now.tv_sec - start->tv_sec) * 1000000000 + (now.tv_nsec - start->tv_nsec);
}

/* Wait until the generation differs from `seen`, for at most `timeout_ns`: 0 once it moved, 1 when
 * the time ran out (the caller may wait again). */
int32_t shm_barrier_await(uint32_t *generation, int64_t seen, int64_t timeout_ns) {
    for (int i = 0; i < SPIN_CHECKS; i++) {
        if (__atomic_load_n(generation, __ATOMIC_ACQUIRE) != (uint32_t)seen) return 0;
        cpu_relax();
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        if (__atomic_load_n(generation, __ATOMIC_ACQUIRE) != (uint32_t)seen) return 0;
        int64_t left = timeout_ns - elapsed_ns(&start);
        if (left <= 0) return 1;
#ifdef __linux__
        struct timespec wait = {left / 1000000000, left % 1000000000};
        /* returns at once (EAGAIN) if the word no longer holds `seen`; EINTR and timeouts loop */
        syscall(SYS_futex, generation, FUTEX_WAIT, (uint32_t)seen, &wait, NULL, 0);
#else
        struct timespec nap = {0, left < 50000 ? left : 50000};
        nanosleep(&nap, NULL);
#endif
    }
}
