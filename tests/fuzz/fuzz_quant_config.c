/*
 * fuzz_quant_config.c - quantization_config parser (dsq_quant_config_parse)
 * on arbitrary bytes, as a whole config.json text.
 *
 * The text is handed over in a buffer of exactly `size` bytes with no NUL
 * after it.  An accepted config must be one the loader can run: the values
 * lib/quant_config.h promises for its method.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "quant_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    if (size)
        memcpy(text, data, size);
    dsq_quant_config c;
    memset(&c, 0xA5, sizeof c);
    dsq_status st = dsq_quant_config_parse(text, size, &c);
    if (st == DSQ_OK) {
        int ok;
        switch (c.method) {
        case DSQ_QM_NONE: ok = c.bits == 0; break;
        case DSQ_QM_AWQ:
            ok = c.bits == 4 && c.group_size == 128 && c.zero_point == 1 && c.desc_act == 0 &&
                 c.gptq_zero_offset == 0;
            break;
        case DSQ_QM_GPTQ:
            ok = c.bits == 4 && c.group_size == 128 && c.desc_act == 0 &&
                 (c.zero_point == 0 || c.zero_point == 1) &&
                 (c.gptq_zero_offset == 0 || c.gptq_zero_offset == 1);
            break;
        case DSQ_QM_DSQWEN:
            ok = c.version == 1 && ((c.bits == 8 && c.group_size == -1 && c.zero_point == 0) ||
                                    (c.bits == 4 && c.group_size == 128 && c.zero_point == 1));
            break;
        default: ok = 0; break;
        }
        if (!ok)
            abort();
    } else if (dsq_last_error_message()[0] == '\0') {
        abort(); /* every refusal must say why */
    }
    free(text);
    return 0;
}
