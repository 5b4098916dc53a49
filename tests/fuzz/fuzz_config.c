/*
 * fuzz_config.c - config.json parser (dsq_config_parse) on arbitrary bytes.
 *
 * The text is handed over in a buffer of exactly `size` bytes with no NUL
 * after it: the parser takes (pointer, length), so reading one byte past the
 * end is a bug ASan must see.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    if (size)
        memcpy(text, data, size);
    dsq_config cfg;
    memset(&cfg, 0xA5, sizeof cfg);
    dsq_status st = dsq_config_parse(text, size, &cfg);
    if (st == DSQ_OK) {
        /* What the rest of the library relies on once a config was accepted. */
        if (cfg.n_vocab < 1 || cfg.n_embd < 1 || cfg.n_layers < 1 || cfg.n_heads < 1 ||
            cfg.n_kv_heads < 1 || cfg.head_dim < 1 || cfg.n_ff < 1 || cfg.max_pos < 1 ||
            !(cfg.rms_eps > 0.0f) || !(cfg.rope_theta > 0.0f) ||
            cfg.n_heads % cfg.n_kv_heads != 0 || cfg.head_dim % 2 != 0 ||
            cfg.bos_token < -1 || cfg.bos_token >= cfg.n_vocab || cfg.eos_token < -1 ||
            cfg.eos_token >= cfg.n_vocab)
            abort();
    } else if (dsq_last_error_message()[0] == '\0') {
        abort(); /* every refusal must say why */
    }
    free(text);
    return 0;
}
