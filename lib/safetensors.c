/* PLACEHOLDER until the loader lands (issue 2). */
#include "internal.h"
dsq_status dsq_st_open_file(const char *path, dsq_st_set **out) { *out = NULL; return dsq_fail(DSQ_ERR_UNSUPPORTED, "safetensors not implemented yet"); }
dsq_status dsq_st_open_dir(const char *dir, dsq_st_set **out) { *out = NULL; return dsq_fail(DSQ_ERR_UNSUPPORTED, "safetensors not implemented yet"); }
void dsq_st_close(dsq_st_set *set) { (void)set; }
const dsq_st_entry *dsq_st_find(const dsq_st_set *set, const char *name) { return NULL; }
int32_t dsq_st_count(const dsq_st_set *set) { return 0; }
const dsq_st_entry *dsq_st_at(const dsq_st_set *set, int32_t i) { return NULL; }
