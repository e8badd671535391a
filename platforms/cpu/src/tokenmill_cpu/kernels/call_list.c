/* Runs a recorded list of C kernel calls (a CPU graph's replay) without returning to Python between
 * them: after a matrix product has streamed its weights through the caches, the interpreter's own
 * code and data are cold, and each call from Python cost tens of microseconds more than its kernel.
 *
 * Every call goes through one prototype of MAX_INTS integer-class and MAX_FLOATS float arguments.
 * Under the Linux calling conventions of x86-64 (System V) and AArch64, integer-class arguments
 * (integers, pointers) take the integer registers and then 8-byte stack slots in order, and float
 * arguments the vector registers in order, independently of each other; so a kernel with at most
 * MAX_INTS integer-class and MAX_FLOATS float parameters, in any interleaving, receives exactly its
 * own arguments and ignores the rest. call_list.py offers this only on those targets, and only for
 * calls whose declared argument types fit (no doubles, no structs); any other list is replayed
 * from Python. Return values are dropped, as a replay from Python drops them.
 */
#include <stdint.h>

#define MAX_INTS 20
#define MAX_FLOATS 8

typedef void (*kernel_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          float, float, float, float, float, float, float, float);

void run_call_list(int64_t count, void *const *functions, const int64_t *ints, const float *floats) {
    for (int64_t i = 0; i < count; ++i) {
        const int64_t *a = ints + i * MAX_INTS;
        const float *f = floats + i * MAX_FLOATS;
        ((kernel_fn)functions[i])(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                                  a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19],
                                  f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
    }
}
