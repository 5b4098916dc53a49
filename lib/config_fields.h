/*
 * config_fields.h - typed readers of config.json fields (lib/config.c), for
 * the architectures' parse_config (lib/arch_*.c).  Each refusal names the
 * field and returns DSQ_ERR_CONFIG.
 */
#ifndef DSQ_CONFIG_FIELDS_H
#define DSQ_CONFIG_FIELDS_H

#include <cjson/cJSON.h>

#include "internal.h"

/* Upper bound for every size field: far above any real model, low enough
 * that products of two such values fit comfortably in int64. */
#define DSQ_CFG_MAX_DIM (1 << 24)

/* Required positive integer < DSQ_CFG_MAX_DIM. */
dsq_status dsq_cfg_size(const cJSON *root, const char *key, int32_t *out);
/* 1 if `key` is present and not null. */
int dsq_cfg_has(const cJSON *root, const char *key);
/* Positive finite float below `max`; `dflt` when absent unless required. */
dsq_status dsq_cfg_float(const cJSON *root, const char *key, int required, double dflt, double max,
                         float *out);
/* Boolean; `dflt` when absent or null. */
dsq_status dsq_cfg_bool(const cJSON *root, const char *key, int dflt, int *out);
/* Optional string (NULL when absent or null) in *out. */
dsq_status dsq_cfg_string(const cJSON *root, const char *key, const char **out);

#endif
