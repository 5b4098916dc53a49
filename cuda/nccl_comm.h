/* nccl_comm.h - NCCL communicators for tensor parallelism, opened at run
 * time and never able to hang the caller.
 *
 * NCCL (libnccl.so.2) is opened with dlopen on first use, like cuBLASLt: a
 * libdsqwen.so built with NCCL support still loads where NCCL is absent,
 * and a tensor-parallel request there fails with DSQ_ERR_UNSUPPORTED and
 * the loader's reason.  Built without NCCL headers (DSQ_NCCL=OFF, or AUTO
 * with none found), every function below returns DSQ_ERR_UNSUPPORTED.
 *
 * Every communicator is created NON-BLOCKING (ncclConfig_t.blocking = 0):
 * NCCL calls return at once (ncclInProgress) and dsq_comm_wait() polls
 * ncclCommGetAsyncError() until the operation is done, NCCL reports an
 * error, or the communicator's timeout passes; on an error or a timeout
 * the communicator is aborted (ncclCommAbort) and the call returns
 * DSQ_ERR_DEVICE with NCCL's message.  A lost peer therefore costs at most
 * the timeout, never a hang.  The library never opens sockets itself: the
 * unique id travels through the application's own launcher (e.g. MPI).
 *
 * Thread safety: one dsq_comm is used by one thread at a time (the thread
 * driving its context); distinct communicators may be used concurrently.
 */
#ifndef DSQ_CUDA_NCCL_COMM_H
#define DSQ_CUDA_NCCL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dsqwen.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES in nccl.h). */
#define DSQ_COMM_ID_BYTES 128

typedef struct dsq_comm dsq_comm;

/* Element types an all-reduce takes. */
typedef enum dsq_comm_dtype { DSQ_COMM_F32 = 0, DSQ_COMM_BF16 = 1, DSQ_COMM_F16 = 2 } dsq_comm_dtype;

/* NULL when NCCL can be used, else why not (static text). */
const char *dsq_nccl_problem(void);

/* A fresh unique id for a communicator (rank 0 makes it and the launcher
 * hands it to every rank).  DSQ_ERR_UNSUPPORTED without NCCL. */
dsq_status dsq_comm_unique_id(uint8_t id[DSQ_COMM_ID_BYTES]);

/* Join communicator `id` as `rank` of `world` on CUDA device `device`;
 * waits (at most timeout_s seconds) until every rank has joined.
 * DSQ_ERR_INVALID_ARG (rank/world/device out of range, timeout <= 0),
 * DSQ_ERR_UNSUPPORTED, DSQ_ERR_DEVICE (NCCL's message; "timed out" when
 * ranks are missing), DSQ_ERR_OUT_OF_MEMORY.  The caller's current device
 * is restored. */
dsq_status dsq_comm_init_rank(const uint8_t id[DSQ_COMM_ID_BYTES], int rank, int world, int device,
                              double timeout_s, dsq_comm **out);

/* One process driving `n` local devices: comms[i] is rank i on devices[i]
 * (one unique id, every rank initialised inside one NCCL group).  On
 * failure no communicator is left.  Errors as dsq_comm_init_rank. */
dsq_status dsq_comm_init_local(const int *devices, int n, double timeout_s, dsq_comm **comms);

/* In-place sum over all ranks of buf[count] (device memory of the
 * communicator's device), enqueued on `stream` (a cudaStream_t).  Returns
 * once enqueued (non-blocking communicator): completion is ordered on the
 * stream; a failure found while enqueueing aborts the communicator. */
dsq_status dsq_comm_all_reduce_sum(dsq_comm *c, void *buf, size_t count, dsq_comm_dtype dt, void *stream);

/* All-gather: rank r's send[count] lands at recv[r * count] on every rank
 * (device memory of the communicator's device), enqueued on `stream`.
 * Returns as dsq_comm_all_reduce_sum. */
dsq_status dsq_comm_all_gather(dsq_comm *c, const void *send, void *recv, size_t count, dsq_comm_dtype dt,
                               void *stream);

/* One thread issuing collectives on several communicators (one process
 * driving several GPUs) brackets them in a group, or the first would wait
 * for the others forever: dsq_comm_group_start(), the collectives, then
 * dsq_comm_group_end(comms, n), which ends the group and waits (bounded by
 * each communicator's timeout) until every one of comms[0..n) has its
 * operations enqueued.  Inside a group the collectives only record their
 * arguments and return DSQ_OK. */
dsq_status dsq_comm_group_start(void);
dsq_status dsq_comm_group_end(dsq_comm *const *comms, int n);

/* Wait until the communicator has no operation in progress on the host
 * side and no asynchronous error: DSQ_OK, or DSQ_ERR_DEVICE (error or
 * timeout; the communicator is then aborted and every later call fails). */
dsq_status dsq_comm_wait(dsq_comm *c);

/* Wait until `stream` (a cudaStream_t carrying this communicator's
 * collectives) has drained, bounded by the communicator's timeout: a
 * collective whose peer vanished would spin on the GPU forever, so on a
 * timeout or an NCCL error the communicator is aborted (which stops its
 * kernels) and DSQ_ERR_DEVICE returned. */
dsq_status dsq_comm_sync_stream(dsq_comm *c, void *stream);

/* Rank and world size of a communicator. */
int dsq_comm_rank(const dsq_comm *c);
int dsq_comm_world(const dsq_comm *c);

/* Finalize (bounded by the timeout) and destroy; aborts instead when the
 * communicator failed or finalizing times out.  NULL is a no-op. */
void dsq_comm_free(dsq_comm *c);

#ifdef __cplusplus
}
#endif

#endif
