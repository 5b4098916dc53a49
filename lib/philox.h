/* philox.h - the counter-based random numbers of dsq_step() sampling:
 * Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11), keyed by the sequence's 64-bit seed, counter = the
 * position of the token being drawn.  A draw then depends on nothing but
 * (seed, position), so it is the same whatever the batch holds and on the
 * host and the GPU.  Header-only; compiles as C and as CUDA device code. */
#ifndef DSQ_PHILOX_H
#define DSQ_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define DSQ_HD __host__ __device__ __forceinline__
#else
#define DSQ_HD static inline
#endif

DSQ_HD uint32_t dsq_philox_mulhi(uint32_t a, uint32_t b, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * b;
    *lo = (uint32_t)p;
    return (uint32_t)(p >> 32);
}

/* 64 random bits for (seed, counter). */
DSQ_HD uint64_t dsq_philox64(uint64_t seed, uint64_t counter)
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0x5eedu, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t lo0, lo1;
        uint32_t hi0 = dsq_philox_mulhi(0xD2511F53u, c0, &lo0);
        uint32_t hi1 = dsq_philox_mulhi(0xCD9E8D57u, c2, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return (uint64_t)c0 | ((uint64_t)c1 << 32);
}

#endif /* DSQ_PHILOX_H */
