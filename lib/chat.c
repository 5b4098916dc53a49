/* PLACEHOLDER until the chat format lands (issue 4). */
#include "internal.h"
dsq_status dsq_chat_format(const dsq_chat_message *msgs, size_t n_msgs, int add_generation_prompt, char *text, size_t cap, size_t *len_out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "chat format not implemented yet"); }
