/* weight.c - dsq_weight helpers shared by the backends (lib/weight.h). */
#include "weight.h"

const char *dsq_wformat_name(dsq_wformat f)
{
    switch (f) {
    case DSQ_WF_F32: return "f32";
    case DSQ_WF_F16: return "f16";
    case DSQ_WF_BF16: return "bf16";
    case DSQ_WF_Q8_ROW: return "q8_row";
    case DSQ_WF_Q4_AWQ: return "q4_awq";
    case DSQ_WF_Q4_GPTQ: return "q4_gptq";
    case DSQ_WF_Q4_G128: return "q4_g128";
    }
    return "?";
}

dsq_status dsq_weight_from_tensor(const dsq_tensor *t, dsq_weight *w)
{
    dsq_weight d = { 0 };
    switch (t->dtype) {
    case DSQ_DT_F32: d.format = DSQ_WF_F32; break;
    case DSQ_DT_F16: d.format = DSQ_WF_F16; break;
    case DSQ_DT_BF16: d.format = DSQ_WF_BF16; break;
    default:
        return dsq_fail(DSQ_ERR_DTYPE, "a %s tensor is no weight format", dsq_dtype_name(t->dtype));
    }
    d.rows = t->ndim >= 1 ? t->shape[0] : 1;
    d.cols = t->ndim >= 2 ? t->shape[1] : 1;
    d.data = t->data;
    d.layout = DSQ_WL_ROWS;
    *w = d;
    return DSQ_OK;
}
