/* tp_mpi.c - tensor parallelism with one process per GPU, launched by MPI:
 *
 *   mpirun -np 2 tp_mpi MODEL_DIR [ID...]
 *
 * Rank 0 makes the communicator id with dsq_tp_unique_id() and MPI_Bcast's
 * it; every rank loads the model with tp_world = the MPI world size, its
 * rank and the id, on GPU (rank % number of local GPUs, or $LOCAL_RANK when
 * the launcher sets it), and makes exactly the same calls with the same
 * inputs.  Every rank gets the same logits; rank 0 prints the ids.
 * libdsqwen itself opens no sockets: MPI carries the id, NCCL the data. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsqwen.h"

static int check(dsq_status st, const char *what, int rank)
{
    if (st != DSQ_OK)
        fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, dsq_status_string(st), dsq_last_error_message());
    return st != DSQ_OK;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, world = 1, rc = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N %s MODEL_DIR [ID...]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    int32_t prompt[256];
    int n_prompt = 0;
    for (int i = 2; i < argc && n_prompt < 256; i++)
        prompt[n_prompt++] = (int32_t)atoi(argv[i]);
    if (n_prompt == 0)
        for (; n_prompt < 16; n_prompt++)
            prompt[n_prompt] = 100 + 7 * n_prompt;

    /* the id: made once, carried by the application's launcher */
    unsigned char id[DSQ_TP_ID_BYTES];
    int ok = 1;
    if (rank == 0)
        ok = !check(dsq_tp_unique_id(id, sizeof id), "dsq_tp_unique_id", rank);
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        MPI_Finalize();
        return 1;
    }
    MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);

    const char *lr = getenv("LOCAL_RANK");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CUDA;
    mp.device = lr ? atoi(lr) : rank; /* one GPU per rank on this host */
    mp.tp_world = world;
    mp.tp_rank = rank;
    mp.tp_id = id;
    mp.tp_timeout_s = 120.0f;
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_context = n_prompt + 64;
    dsq_model *model = NULL;
    dsq_ctx *ctx = NULL;
    dsq_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    float *logits = NULL;
    if (check(dsq_model_load(argv[1], &mp, &model), "load", rank) ||
        check(dsq_model_get_info(model, &info), "info", rank) || check(dsq_ctx_new(model, &cp, &ctx), "context", rank))
        goto done;
    logits = malloc(sizeof(float) * (size_t)info.n_vocab); /* [n_vocab] */
    if (!logits || check(dsq_prefill(ctx, 0, prompt, n_prompt, DSQ_LOGITS_LAST, logits), "prefill", rank))
        goto done;
    const int32_t seq = 0;
    for (int step = 0; step < 32; step++) {
        int32_t best = 0;
        for (int32_t v = 1; v < info.n_vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        if (rank == 0)
            printf("%d%s", best, step < 31 ? " " : "\n");
        if (check(dsq_decode_step(ctx, 1, &seq, &best, logits), "decode", rank))
            goto done;
    }
    rc = 0;
done:
    free(logits);
    dsq_ctx_free(ctx);
    dsq_model_free(model);
    MPI_Finalize();
    return rc;
}
