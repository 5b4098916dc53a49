/* cmd_quantize.c - `dsqwen quantize IN_DIR OUT_DIR [--bits 8|4] [--head]`:
 * load IN_DIR on the CPU with dsq_model_params.quantize (the library
 * quantizes every linear of the layers, and the head with --head, over the
 * load threads) and write the result with dsq_model_save().  --head alone
 * quantizes only the head (an AWQ / GPTQ checkpoint, whose layers are
 * 4-bit already, is written as a dsqwen 4-bit checkpoint with an int8
 * head). */
#include <stdio.h>

#include "cli.h"

int cli_quantize(const cli_opts *o)
{
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU; /* the weights must stay on the host to be written */
    mp.n_threads = o->threads;
    mp.quantize = o->bits == 8 ? DSQ_QUANTIZE_INT8 : o->bits == 4 ? DSQ_QUANTIZE_Q4 : DSQ_QUANTIZE_NONE;
    mp.quantize_head = o->quantize_head;
    mp.load_tokenizer = 0; /* copied as a file, never parsed here */
    double t0 = cli_now();
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(o->in_dir, &mp, &m);
    if (st != DSQ_OK)
        return cli_report(st, "quantizing the model");
    dsq_model_info info = { .struct_size = sizeof info };
    (void)dsq_model_get_info(m, &info);
    double t1 = cli_now();
    st = dsq_model_save(m, o->out_dir);
    dsq_model_free(m);
    if (st != DSQ_OK)
        return cli_report(st, "writing the quantized model");
    char what[48];
    if (o->bits)
        snprintf(what, sizeof what, "%d-bit linear weights", (int)o->bits);
    else
        snprintf(what, sizeof what, "linear weights as stored");
    fprintf(stderr, "dsqwen: wrote %s: %s%s, %.1f MB of weights (quantized in %.2f s, "
                    "written in %.2f s)\n",
            o->out_dir, what, o->quantize_head ? " and an int8 head" : "",
            (double)info.weight_bytes / 1e6, t1 - t0, cli_now() - t1);
    return CLI_EXIT_OK;
}
