/* quant_decode.cuh - code -> float conversions of the quantized GEMV
 * (gemv_quant.cu), shared with a host test (tests/test_cuda_quant_decode.cu)
 * that checks them exhaustively without a GPU.
 *
 * A code c in 0..255 OR'ed into the mantissa of the float 2^23 (bits
 * 0x4B000000) reads as exactly 2^23 + c; subtracting 2^23 + offset leaves
 * c - offset exactly (every value involved is an integer below 2^24).  That
 * turns an integer into a float with one logic op and one subtraction, no
 * int -> float conversion instruction. */
#ifndef DSQ_CUDA_QUANT_DECODE_CUH
#define DSQ_CUDA_QUANT_DECODE_CUH

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#endif

#define DSQ_QD __host__ __device__ __forceinline__

DSQ_QD float dsq_qd_as_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* Signed byte j (0..3) of word w (little endian) as a float: the sign bit is
 * flipped (b ^ 0x80 = b + 128 as unsigned), so the result is
 * (2^23 + b + 128) - (2^23 + 128). */
DSQ_QD float dsq_qd_s8(uint32_t w, int j)
{
    const uint32_t u = ((w ^ 0x80808080u) >> (8 * j)) & 0xffu;
    return dsq_qd_as_float(0x4B000000u | u) - 8388736.0f;
}

/* 4-bit code j (0..7) of word w minus a zero point, given as
 * zbias = 2^23 + zero: (2^23 + code) - (2^23 + zero). */
DSQ_QD float dsq_qd_u4(uint32_t w, int j, float zbias)
{
    return dsq_qd_as_float(0x4B000000u | ((w >> (4 * j)) & 15u)) - zbias;
}

/* zbias for a zero point (0..255). */
DSQ_QD float dsq_qd_zbias(uint32_t zero) { return 8388608.0f + (float)zero; }

/* ---- bf16 pairs for the tensor cores (gemm_rows.cu) ------------------------------
 * An m16n8k16 bf16 MMA takes its A operand as 32-bit registers of two bf16s
 * (low half: the lower k).  Both conversions below are exact: 4-bit codes
 * and signed bytes are integers of at most 8 significant bits. */

/* __byte_perm on the device; its definition on the host: byte n of the
 * result is byte ((s >> 4n) & 7) of the 8 bytes y:x (x bytes 0..3). */
DSQ_QD uint32_t dsq_qd_prmt(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++)
        r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xffu) << (8 * n);
    return r;
#endif
}

/* 4-bit codes 2i and 2i+1 (i = 0..3) of word w, given u = w >> 4, as the
 * bf16 pair (128 + code 2i, 128 + code 2i+1): in [128, 256) a bf16 steps
 * by 1, so 0x4300 | c is exactly 128 + c.  One byte permute puts byte i of
 * w (code 2i in its low nibble) in the low half and byte i of u (code 2i+1
 * in its low nibble) in the high half; one logic op masks and adds the
 * exponent. */
DSQ_QD uint32_t dsq_qd_q4_bf16x2(uint32_t w, uint32_t u, int i)
{
    const uint32_t sel = (uint32_t)(i | i << 4 | (4 + i) << 8 | (4 + i) << 12);
    return (dsq_qd_prmt(w, u, sel) & 0x000F000Fu) | 0x43004300u;
}

/* The pair (128 + zero, 128 + zero) to subtract from dsq_qd_q4_bf16x2's
 * (zero 0..16: exact, and so is the difference code - zero). */
DSQ_QD uint32_t dsq_qd_q4_zero_bf16x2(uint32_t zero) { return 0x43004300u | zero * 0x00010001u; }

/* float -> bf16 bits, round to nearest even (finite input). */
DSQ_QD uint32_t dsq_qd_f2bf_bits(float f)
{
    uint32_t u;
#ifdef __CUDA_ARCH__
    u = __float_as_uint(f);
#else
    memcpy(&u, &f, 4);
#endif
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* bf16 pair a - b (each half), on the host for the tests: exact when the
 * difference is (small integers here). */
DSQ_QD uint32_t dsq_qd_bf16x2_sub_host(uint32_t a, uint32_t b)
{
    const float alo = dsq_qd_as_float(a << 16), ahi = dsq_qd_as_float(a & 0xffff0000u);
    const float blo = dsq_qd_as_float(b << 16), bhi = dsq_qd_as_float(b & 0xffff0000u);
    return dsq_qd_f2bf_bits(alo - blo) | dsq_qd_f2bf_bits(ahi - bhi) << 16;
}

/* Signed bytes 2i and 2i+1 (i = 0, 1) of word w as a bf16 pair: each byte
 * becomes a float by the 2^23 trick (dsq_qd_s8; the permute writes the
 * byte, two zero bytes and the exponent byte 0x4B at once), the pair is
 * rounded to bf16, exactly (|b| <= 128). */
DSQ_QD uint32_t dsq_qd_s8_bf16x2(uint32_t w, int i)
{
    const uint32_t f = w ^ 0x80808080u;
    const float lo = dsq_qd_as_float(dsq_qd_prmt(f, 0x4B000000u, (uint32_t)(0x7540 | (2 * i)))) - 8388736.0f;
    const float hi = dsq_qd_as_float(dsq_qd_prmt(f, 0x4B000000u, (uint32_t)(0x7540 | (2 * i + 1)))) - 8388736.0f;
#ifdef __CUDA_ARCH__
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&p);
#else
    return dsq_qd_f2bf_bits(lo) | dsq_qd_f2bf_bits(hi) << 16;
#endif
}

#endif /* DSQ_CUDA_QUANT_DECODE_CUH */
