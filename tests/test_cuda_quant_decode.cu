/*
 * test_cuda_quant_decode.cu - the code -> float conversions the quantized
 * GPU kernels use (cuda/quant_decode.cuh), compiled by nvcc for the host
 * and checked exhaustively against plain integer conversion: every signed
 * byte in every position of a word (Q8) and every 4-bit code in every
 * position with every zero point 0..16 (Q4); and the bf16 pairs of the
 * tensor-core kernels (gemm_rows.cu): every code pair in every position,
 * every zero point, every pair of signed bytes.  Needs no GPU (it checks the
 * arithmetic, not the device), so it runs in every CUDA build; the kernels
 * themselves are tested on a device by test_cuda_quant.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "testutil.h"
}
#include "quant_decode.cuh"

static void test_s8_all_bytes(void **state)
{
    (void)state;
    for (int j = 0; j < 4; j++)
        for (int b = 0; b < 256; b++) {
            /* b at position j, other bytes busy with other values */
            uint32_t w = 0x5aa5c33cu & ~(0xffu << (8 * j));
            w |= (uint32_t)b << (8 * j);
            float want = (float)(int8_t)(uint8_t)b;
            float got = dsq_qd_s8(w, j);
            if (memcmp(&got, &want, 4) != 0)
                fail_msg("byte %d at %d: %g, want %g", b, j, (double)got, (double)want);
        }
}

static void test_u4_all_codes(void **state)
{
    (void)state;
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < 16; c++)
            for (int z = 0; z <= 16; z++) {
                uint32_t w = 0x9e3779b9u & ~(15u << (4 * j));
                w |= (uint32_t)c << (4 * j);
                float want = (float)(c - z);
                float got = dsq_qd_u4(w, j, dsq_qd_zbias((uint32_t)z));
                if (memcmp(&got, &want, 4) != 0 && !(got == 0.0f && want == 0.0f))
                    fail_msg("code %d at %d, zero %d: %g, want %g", c, j, z, (double)got, (double)want);
            }
}

static float bf16_bits_f32(uint32_t h)
{
    uint32_t u = h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The tensor-core kernels' Q4 pairs: every code pair (2i, 2i+1) in every
 * byte position i, the other bytes busy, each zero point 0..16 subtracted
 * as the kernel does (bf16 pair difference). */
static void test_q4_bf16_pairs(void **state)
{
    (void)state;
    const uint32_t junk[] = {0x00000000u, 0xffffffffu, 0x9e3779b9u, 0x5aa5c33cu};
    for (int i = 0; i < 4; i++)
        for (int lo = 0; lo < 16; lo++)
            for (int hi = 0; hi < 16; hi++)
                for (int jk = 0; jk < 4; jk++) {
                    uint32_t w = junk[jk] & ~(0xffu << (8 * i));
                    w |= (uint32_t)(lo | hi << 4) << (8 * i);
                    const uint32_t p = dsq_qd_q4_bf16x2(w, w >> 4, i);
                    if ((p & 0xffffu) != (0x4300u | (uint32_t)lo) || (p >> 16) != (0x4300u | (uint32_t)hi))
                        fail_msg("codes %d,%d at byte %d: pair %08x", lo, hi, i, p);
                    for (uint32_t z = 0; z <= 16; z++) {
                        const uint32_t d = dsq_qd_bf16x2_sub_host(p, dsq_qd_q4_zero_bf16x2(z));
                        if (bf16_bits_f32(d & 0xffffu) != (float)(lo - (int)z) ||
                            bf16_bits_f32(d >> 16) != (float)(hi - (int)z))
                            fail_msg("codes %d,%d zero %u: %g %g", lo, hi, z, (double)bf16_bits_f32(d & 0xffffu),
                                     (double)bf16_bits_f32(d >> 16));
                    }
                }
}

/* The Q8 pairs: every pair of signed bytes at (0,1) and (2,3). */
static void test_s8_bf16_pairs(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        for (int a = 0; a < 256; a++)
            for (int b = 0; b < 256; b++) {
                uint32_t w = 0xc35a6996u & ~(0xffffu << (16 * i));
                w |= (uint32_t)(a | b << 8) << (16 * i);
                const uint32_t p = dsq_qd_s8_bf16x2(w, i);
                const float want_lo = (float)(int8_t)(uint8_t)a, want_hi = (float)(int8_t)(uint8_t)b;
                if (bf16_bits_f32(p & 0xffffu) != want_lo || bf16_bits_f32(p >> 16) != want_hi)
                    fail_msg("bytes %d,%d at pair %d: %g %g", a, b, i, (double)bf16_bits_f32(p & 0xffffu),
                             (double)bf16_bits_f32(p >> 16));
            }
}

/* __byte_perm's host definition on a few selectors whose results are
 * known by hand. */
static void test_prmt_host(void **state)
{
    (void)state;
    assert_int_equal(dsq_qd_prmt(0x33221100u, 0x77665544u, 0x3210), 0x33221100u);
    assert_int_equal(dsq_qd_prmt(0x33221100u, 0x77665544u, 0x7654), 0x77665544u);
    assert_int_equal(dsq_qd_prmt(0x33221100u, 0x77665544u, 0x0415), 0x00441155u);
    assert_int_equal(dsq_qd_prmt(0x000000abu, 0x4B000000u, 0x7540), 0x4B0000abu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_s8_all_bytes),
        cmocka_unit_test(test_u4_all_codes),
        cmocka_unit_test(test_q4_bf16_pairs),
        cmocka_unit_test(test_s8_bf16_pairs),
        cmocka_unit_test(test_prmt_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
