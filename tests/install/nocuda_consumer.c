/* What a program sees from a libdsqwen built with CUDA, run where the CUDA
 * libraries are (mode "hidden") or may be (mode "visible") missing.
 * Driven by no_cuda_libs.sh; prints what it found and exits 1 on a
 * mismatch:
 *   - the library loads at all (this program links it: if it NEEDED a CUDA
 *     library, the dynamic loader would refuse to start us);
 *   - DSQ_BACKEND_AUTO falls back to the CPU and runs a prefill;
 *   - DSQ_BACKEND_CUDA fails with DSQ_ERR_NO_DEVICE, and in "hidden" mode
 *     the message names libcublasLt and libcuda (dlerror text included);
 *     in "visible" mode cuBLASLt must have loaded (the control run: the
 *     hidden run's failure is then due to the hiding);
 *   - in "hidden" mode no CUDA library ended up mapped into the process.
 *   nocuda_consumer MODEL_DIR hidden|visible */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dsqwen.h>

static int mapped_cuda_libs(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "libcublas") || strstr(line, "libcudart") || strstr(line, "libcuda.so")) {
            printf("mapped: %s", line);
            n++;
        }
    fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "hidden") && strcmp(argv[2], "visible"))) {
        fprintf(stderr, "usage: %s MODEL_DIR hidden|visible\n", argv[0]);
        return 2;
    }
    int hidden = !strcmp(argv[2], "hidden"), ok = 1;
    dsq_model_params mp = dsq_model_default_params();
    dsq_model *m = NULL;

    mp.backend = DSQ_BACKEND_CUDA;
    dsq_status st = dsq_model_load(argv[1], &mp, &m);
    const char *msg = dsq_last_error_message();
    printf("[%s] backend CUDA: %s: %s\n", argv[2], dsq_status_string(st), st ? msg : "");
    if (st == DSQ_OK) {
        ok = !hidden; /* a GPU machine with the libraries visible */
        dsq_model_free(m);
        m = NULL;
    } else if (st != DSQ_ERR_NO_DEVICE) {
        ok = 0;
    } else if (hidden) {
        ok = strstr(msg, "libcublasLt") != NULL && strstr(msg, "libcuda.so.1") != NULL;
    } else {
        ok = strstr(msg, "cuBLASLt could not be loaded") == NULL;
    }

    mp.backend = DSQ_BACKEND_AUTO;
    st = dsq_model_load(argv[1], &mp, &m);
    dsq_model_info info = { .struct_size = sizeof info };
    if (st == DSQ_OK)
        st = dsq_model_get_info(m, &info);
    printf("[%s] backend AUTO: %s, running on %s\n", argv[2], dsq_status_string(st),
           info.backend == DSQ_BACKEND_CPU ? "CPU" : info.backend == DSQ_BACKEND_CUDA ? "CUDA" : "?");
    if (st != DSQ_OK || (hidden && info.backend != DSQ_BACKEND_CPU))
        ok = 0;
    if (st == DSQ_OK) {
        dsq_ctx_params cp = dsq_ctx_default_params();
        cp.max_context = 64;
        dsq_ctx *c = NULL;
        float *logits = malloc(sizeof(float) * (size_t)info.n_vocab);
        int32_t toks[3] = { 1, 2, 3 };
        st = logits ? dsq_ctx_new(m, &cp, &c) : DSQ_ERR_OUT_OF_MEMORY;
        if (st == DSQ_OK)
            st = dsq_prefill(c, 0, toks, 3, DSQ_LOGITS_LAST, logits);
        int finite = st == DSQ_OK;
        for (int i = 0; finite && i < info.n_vocab; i++)
            finite = isfinite(logits[i]);
        printf("[%s] prefill: %s, logits %s\n", argv[2], dsq_status_string(st), finite ? "finite" : "BAD");
        ok = ok && finite;
        free(logits);
        dsq_ctx_free(c);
        dsq_model_free(m);
    }
    if (hidden && mapped_cuda_libs())
        ok = 0;
    printf("[%s] %s\n", argv[2], ok ? "as expected" : "NOT as expected");
    return ok ? 0 : 1;
}
