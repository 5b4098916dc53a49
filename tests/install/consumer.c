/* A downstream program built only from the installed header and library,
 * through pkg-config or find_package(dsqwen).  Loads a model on the CPU,
 * prefills a few tokens and checks that the logits are finite. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <dsqwen.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    printf("libdsqwen %s (header %d.%d.%d)\n", dsq_version_string(), DSQ_VERSION_MAJOR,
           DSQ_VERSION_MINOR, DSQ_VERSION_PATCH);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(argv[1], &mp, &m);
    if (st != DSQ_OK) {
        fprintf(stderr, "load: %s: %s\n", dsq_status_string(st), dsq_last_error_message());
        return 1;
    }
    dsq_model_info info = { .struct_size = sizeof info };
    dsq_model_get_info(m, &info);
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_context = 64;
    cp.kv_dtype = DSQ_KV_F32;
    dsq_ctx *c = NULL;
    st = dsq_ctx_new(m, &cp, &c);
    float *logits = malloc(sizeof(float) * (size_t)info.n_vocab);
    int32_t toks[3] = { 1, 2, 3 };
    if (st == DSQ_OK)
        st = dsq_prefill(c, 0, toks, 3, DSQ_LOGITS_LAST, logits);
    int ok = st == DSQ_OK;
    for (int i = 0; ok && i < info.n_vocab; i++)
        ok = isfinite(logits[i]);
    printf("prefill: %s, logits %s\n", dsq_status_string(st), ok ? "finite" : "BAD");
    free(logits);
    dsq_ctx_free(c);
    dsq_model_free(m);
    return ok ? 0 : 1;
}
