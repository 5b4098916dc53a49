/*
 * json_strict.h - checks cJSON does not make, for the JSON files a model
 * directory ships (safetensors headers, the shard index, config.json,
 * generation_config.json).
 *
 * cJSON hands out keys and string values as C strings, so a string holding
 * NUL ("model.norm.weight\u0000evil") is silently cut at the NUL and aliases
 * another name; and it keeps every member of an object, while lookups return
 * the first of a repeated key where Python's json (and so Hugging Face)
 * takes the last.  Both would let a file mean one thing here and another to
 * the tools that wrote and checked it, so both are refused.
 */
#ifndef DSQ_JSON_STRICT_H
#define DSQ_JSON_STRICT_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Offset of the first NUL the parsed strings would hold -- a raw 0 byte
 * anywhere, or a \u0000 escape inside a string -- or `len` if there is none.
 * Works on the raw text (escapes are tracked, so "\\u0000" is not one). */
size_t dsq_json_nul_offset(const char *text, size_t len);

/* The first object member, anywhere in the tree under `node`, whose key an
 * earlier member of the same object already has; NULL if keys are unique.
 * O(n log n) per object.  Returns NULL also when memory for the check runs
 * out and sets *oom (never NULL) to 1 then. */
const cJSON *dsq_json_duplicate_key(const cJSON *node, int *oom);

#endif
