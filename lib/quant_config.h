/* quant_config.h - the `quantization_config` object of config.json: which
 * quantized weight format a checkpoint holds, and whether libdsqwen can run
 * it.  See docs/quantization.md for the formats themselves.
 *
 * Accepted (everything else is refused, the message naming the field):
 *   quant_method "awq":    bits 4, group_size 128, zero_point true (default),
 *                          version "gemm" (default; any case).  AutoAWQ's own
 *                          quant_config.json names "w_bit" / "q_group_size"
 *                          are read too; "backend" absent or "autoawq".
 *   quant_method "gptq":   bits 4, group_size 128, desc_act false (default),
 *                          sym true or false (default true), checkpoint_format
 *                          (or GPTQModel's "format") "gptq" (v1: stored zero
 *                          = zero - 1; the default) or "gptq_v2" (zero as
 *                          is); "dynamic" absent/null/{}; "lm_head" bool;
 *                          "pack_dtype" absent or "int32".
 *   GPTQModel's "method" is read as an alias of "quant_method".
 *   quant_method "dsqwen": version 1; bits 8 with group_size -1 (Q8_ROW) or
 *                          bits 4 with group_size 128 (Q4_G128, zero points).
 * No quantization_config (or null) means an unquantized checkpoint.
 * Wrong JSON types are DSQ_ERR_CONFIG; valid but unsupported values
 * DSQ_ERR_UNSUPPORTED. */
#ifndef DSQ_QUANT_CONFIG_H
#define DSQ_QUANT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dsq_quant_method and dsq_quant_config live in internal.h (dsq_config
 * holds one). */

/* Parse quantization_config out of a whole config.json text.  Absent or null
 * gives method DSQ_QM_NONE and DSQ_OK.  The text is checked as config.c
 * checks it (NUL in strings -> DSQ_ERR_FORMAT, repeated keys ->
 * DSQ_ERR_CONFIG).  *out is written only on DSQ_OK.  DSQ_ERR_INVALID_ARG on
 * NULL, DSQ_ERR_FORMAT (not JSON), DSQ_ERR_CONFIG, DSQ_ERR_UNSUPPORTED,
 * DSQ_ERR_OUT_OF_MEMORY.  Thread-safe. */
dsq_status dsq_quant_config_parse(const char *json, size_t len, dsq_quant_config *out);

/* The same from an already parsed config.json root object (what config.c
 * holds): reads root["quantization_config"]. */
dsq_status dsq_quant_config_from_root(const cJSON *root, dsq_quant_config *out);

/* "none", "awq", "gptq", "dsqwen". */
const char *dsq_quant_method_name(dsq_quant_method m);

#ifdef __cplusplus
}
#endif

#endif
