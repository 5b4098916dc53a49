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

#endif /* DSQ_CUDA_QUANT_DECODE_CUH */
