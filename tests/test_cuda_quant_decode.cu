/*
 * test_cuda_quant_decode.cu - the code -> float conversions the quantized
 * GPU kernels use (cuda/quant_decode.cuh), compiled by nvcc for the host
 * and checked exhaustively against plain integer conversion: every signed
 * byte in every position of a word (Q8) and every 4-bit code in every
 * position with every zero point 0..16 (Q4).  Needs no GPU (it checks the
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_s8_all_bytes),
        cmocka_unit_test(test_u4_all_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
