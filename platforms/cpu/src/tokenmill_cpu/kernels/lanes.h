/* The mask of the first `valid` of 16 float lanes (all for 16 or more, none for 0 or fewer), for the
 * AVX-512 kernels' loads and stores at the ragged end of a row. Included inside their AVX-512 parts. */
#ifndef TOKENMILL_LANES_H
#define TOKENMILL_LANES_H

#include <immintrin.h>
#include <stdint.h>

static inline __mmask16 lanes(int64_t valid) {
    return valid >= 16 ? (__mmask16)0xFFFF : valid <= 0 ? (__mmask16)0 : (__mmask16)((1u << valid) - 1u);
}

#endif
