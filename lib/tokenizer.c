/* PLACEHOLDER until the tokenizer lands (issue 4): every call refuses. */
#include "internal.h"
dsq_status dsq_tokenizer_load(const char *path, dsq_tokenizer **out) { if (out) *out = NULL; return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer not implemented yet"); }
void dsq_tokenizer_free(dsq_tokenizer *tok) { (void)tok; }
dsq_status dsq_tokenize(const dsq_tokenizer *tok, const char *text, size_t len, uint32_t flags, int32_t *tokens, size_t cap, size_t *n_out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer not implemented yet"); }
dsq_status dsq_detokenize(const dsq_tokenizer *tok, const int32_t *tokens, size_t n, int skip_special, char *text, size_t cap, size_t *len_out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer not implemented yet"); }
int32_t dsq_tokenizer_n_tokens(const dsq_tokenizer *tok) { return 0; }
int32_t dsq_tokenizer_token_id(const dsq_tokenizer *tok, const char *text) { return -1; }
const char *dsq_token_text(const dsq_tokenizer *tok, int32_t id) { return NULL; }
int dsq_token_is_special(const dsq_tokenizer *tok, int32_t id) { return 0; }
int32_t dsq_tokenizer_bos(const dsq_tokenizer *tok) { return -1; }
int32_t dsq_tokenizer_eos(const dsq_tokenizer *tok) { return -1; }
dsq_status dsq_detok_stream_new(const dsq_tokenizer *tok, int skip_special, dsq_detok_stream **out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer not implemented yet"); }
void dsq_detok_stream_free(dsq_detok_stream *s) { (void)s; }
dsq_status dsq_detok_stream_push(dsq_detok_stream *s, int32_t token, char *text, size_t cap, size_t *len_out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer not implemented yet"); }
dsq_status dsq_detok_stream_flush(dsq_detok_stream *s, char *text, size_t cap, size_t *len_out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer not implemented yet"); }
