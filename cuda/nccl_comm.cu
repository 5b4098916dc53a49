/* nccl_comm.cu - non-blocking NCCL communicators with bounded waits (see
 * nccl_comm.h for the contract). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "internal.h"
#include "kernels.h"
#include "nccl_comm.h"

#ifndef DSQ_HAVE_NCCL

/* Built without NCCL headers: tensor parallelism is not available. */
static const char no_nccl[] = "libdsqwen was built without NCCL (DSQ_NCCL=OFF, or no nccl.h found)";

extern "C" const char *dsq_nccl_problem(void) { return no_nccl; }
extern "C" dsq_status dsq_comm_unique_id(uint8_t id[DSQ_COMM_ID_BYTES])
{
    (void)id;
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "%s", no_nccl);
}
extern "C" dsq_status dsq_comm_init_rank(const uint8_t id[DSQ_COMM_ID_BYTES], int rank, int world, int device,
                                         double timeout_s, dsq_comm **out)
{
    (void)id, (void)rank, (void)world, (void)device, (void)timeout_s;
    if (out)
        *out = NULL;
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "%s", no_nccl);
}
extern "C" dsq_status dsq_comm_init_local(const int *devices, int n, double timeout_s, dsq_comm **comms)
{
    (void)devices, (void)timeout_s;
    for (int i = 0; comms && i < n; i++)
        comms[i] = NULL;
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "%s", no_nccl);
}
extern "C" dsq_status dsq_comm_all_reduce_sum(dsq_comm *c, void *buf, size_t count, dsq_comm_dtype dt,
                                              void *stream)
{
    (void)c, (void)buf, (void)count, (void)dt, (void)stream;
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "%s", no_nccl);
}
extern "C" dsq_status dsq_comm_wait(dsq_comm *c)
{
    (void)c;
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "%s", no_nccl);
}
extern "C" dsq_status dsq_comm_sync_stream(dsq_comm *c, void *stream)
{
    (void)c, (void)stream;
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "%s", no_nccl);
}
extern "C" int dsq_comm_rank(const dsq_comm *c) { return c ? 0 : -1; }
extern "C" int dsq_comm_world(const dsq_comm *c) { return c ? 1 : 0; }
extern "C" void dsq_comm_free(dsq_comm *c) { (void)c; }

#else /* DSQ_HAVE_NCCL */

#include <dlfcn.h>
#include <pthread.h>

#include <nccl.h>

#include "dl_util.h"

/* ---- libnccl.so.2 opened on first use ----------------------------------------- */

typedef struct nccl_fns {
    decltype(&ncclGetVersion) GetVersion;
    decltype(&ncclGetUniqueId) GetUniqueId;
    decltype(&ncclCommInitRankConfig) CommInitRankConfig;
    decltype(&ncclCommGetAsyncError) CommGetAsyncError;
    decltype(&ncclCommFinalize) CommFinalize;
    decltype(&ncclCommDestroy) CommDestroy;
    decltype(&ncclCommAbort) CommAbort;
    decltype(&ncclGetErrorString) GetErrorString;
    decltype(&ncclGetLastError) GetLastError;
    decltype(&ncclGroupStart) GroupStart;
    decltype(&ncclGroupEnd) GroupEnd;
    decltype(&ncclAllReduce) AllReduce;
} nccl_fns;

static pthread_once_t nc_once = PTHREAD_ONCE_INIT;
static nccl_fns nc_table;
static const nccl_fns *nc; /* &nc_table once complete */
static char nc_problem[768];

/* Non-blocking communicators and ncclCommFinalize arrived in NCCL 2.14. */
#define NC_MIN_VERSION 21400

static void nc_load(void)
{
    static const char *const names[] = { "libnccl.so.2", "libnccl.so",
#ifdef DSQ_CUDA_TOOLKIT_LIBDIR
                                         DSQ_CUDA_TOOLKIT_LIBDIR "/libnccl.so.2"
#endif
    };
    void *h = dsq_dlopen_first(names, sizeof names / sizeof names[0], nc_problem, sizeof nc_problem);
    if (!h)
        return;
    int missing = 0;
#define NC_SYM(field, sym)                                                                             \
    do {                                                                                               \
        *(void **)&nc_table.field = dlsym(h, #sym);                                                    \
        if (!nc_table.field && !missing++)                                                             \
            snprintf(nc_problem, sizeof nc_problem, "libnccl lacks the symbol %s (NCCL >= 2.14 needed)", \
                     #sym);                                                                            \
    } while (0)
    NC_SYM(GetVersion, ncclGetVersion);
    NC_SYM(GetUniqueId, ncclGetUniqueId);
    NC_SYM(CommInitRankConfig, ncclCommInitRankConfig);
    NC_SYM(CommGetAsyncError, ncclCommGetAsyncError);
    NC_SYM(CommFinalize, ncclCommFinalize);
    NC_SYM(CommDestroy, ncclCommDestroy);
    NC_SYM(CommAbort, ncclCommAbort);
    NC_SYM(GetErrorString, ncclGetErrorString);
    NC_SYM(GetLastError, ncclGetLastError);
    NC_SYM(GroupStart, ncclGroupStart);
    NC_SYM(GroupEnd, ncclGroupEnd);
    NC_SYM(AllReduce, ncclAllReduce);
#undef NC_SYM
    int v = 0;
    if (!missing && (nc_table.GetVersion(&v) != ncclSuccess || v < NC_MIN_VERSION)) {
        snprintf(nc_problem, sizeof nc_problem, "the NCCL found is version %d, libdsqwen needs >= %d", v,
                 NC_MIN_VERSION);
        missing = 1;
    }
    if (missing) {
        dlclose(h);
        return;
    }
    nc = &nc_table;
}

extern "C" const char *dsq_nccl_problem(void)
{
    pthread_once(&nc_once, nc_load);
    return nc ? NULL : nc_problem;
}

static dsq_status need_nccl(void)
{
    const char *p = dsq_nccl_problem();
    return p ? dsq_fail(DSQ_ERR_UNSUPPORTED, "NCCL cannot be used: %s", p) : DSQ_OK;
}

/* ---- communicators ------------------------------------------------------------ */

struct dsq_comm {
    ncclComm_t comm;
    int rank, world, device;
    double timeout_s;
    int failed; /* aborted: every later call fails */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pause_briefly(void)
{
    struct timespec d = { 0, 20000 }; /* 20 us: NCCL's proxy threads do the work */
    nanosleep(&d, NULL);
}

static dsq_status comm_error(dsq_comm *c, ncclResult_t r, const char *what)
{
    const char *last = c && c->comm ? nc->GetLastError(c->comm) : NULL;
    dsq_status st = dsq_fail(DSQ_ERR_DEVICE, "NCCL %s (rank %d of %d): %s%s%s", what, c ? c->rank : -1,
                             c ? c->world : 0, nc->GetErrorString(r), last && *last ? ": " : "",
                             last ? last : "");
    if (c && c->comm && !c->failed) {
        c->failed = 1;
        (void)nc->CommAbort(c->comm); /* frees peers blocked in our collectives */
        c->comm = NULL;
    }
    return st;
}

/* Poll until no operation is in progress on c's host side; deadline in
 * seconds since now_s()'s epoch. */
static dsq_status wait_until(dsq_comm *c, double deadline, const char *what)
{
    for (;;) {
        ncclResult_t a = ncclInProgress;
        ncclResult_t r = nc->CommGetAsyncError(c->comm, &a);
        if (r != ncclSuccess)
            return comm_error(c, r, what);
        if (a == ncclSuccess)
            return DSQ_OK;
        if (a != ncclInProgress)
            return comm_error(c, a, what);
        if (now_s() > deadline) {
            dsq_status st = comm_error(c, ncclInProgress, what);
            return dsq_fail(st, "NCCL %s (rank %d of %d) timed out after %.1f s: a peer did not answer",
                            what, c->rank, c->world, c->timeout_s);
        }
        pause_briefly();
    }
}

static dsq_comm *comm_alloc(int rank, int world, int device, double timeout_s)
{
    dsq_comm *c = (dsq_comm *)calloc(1, sizeof *c);
    if (c) {
        c->rank = rank;
        c->world = world;
        c->device = device;
        c->timeout_s = timeout_s;
    }
    return c;
}

static dsq_status check_device(int device)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsq_fail(DSQ_ERR_NO_DEVICE, "CUDA: %s", cudaGetErrorString(e));
    }
    if (device < 0 || device >= n)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "CUDA device %d is outside 0..%d", device, n - 1);
    return DSQ_OK;
}

static ncclConfig_t nonblocking_config(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

extern "C" dsq_status dsq_comm_unique_id(uint8_t id[DSQ_COMM_ID_BYTES])
{
    if (!id)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_unique_id: NULL id");
    dsq_status st = need_nccl();
    if (st != DSQ_OK)
        return st;
    static_assert(sizeof(ncclUniqueId) == DSQ_COMM_ID_BYTES, "NCCL unique id size");
    ncclUniqueId u;
    ncclResult_t r = nc->GetUniqueId(&u);
    if (r != ncclSuccess)
        return dsq_fail(DSQ_ERR_DEVICE, "ncclGetUniqueId: %s", nc->GetErrorString(r));
    memcpy(id, u.internal, DSQ_COMM_ID_BYTES);
    return DSQ_OK;
}

extern "C" dsq_status dsq_comm_init_rank(const uint8_t id[DSQ_COMM_ID_BYTES], int rank, int world, int device,
                                         double timeout_s, dsq_comm **out)
{
    if (out)
        *out = NULL;
    if (!id || !out || world < 1 || rank < 0 || rank >= world || !(timeout_s > 0))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_init_rank: rank %d of world %d, timeout %.3g s", rank,
                        world, timeout_s);
    dsq_status st = need_nccl();
    if (st == DSQ_OK)
        st = check_device(device);
    if (st != DSQ_OK)
        return st;
    dsq_comm *c = comm_alloc(rank, world, device, timeout_s);
    if (!c)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_comm_init_rank: out of memory");
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    ncclUniqueId u;
    memcpy(u.internal, id, DSQ_COMM_ID_BYTES);
    ncclConfig_t cfg = nonblocking_config();
    ncclResult_t r = nc->CommInitRankConfig(&c->comm, world, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        st = comm_error(c, r, "communicator init");
    else
        st = wait_until(c, now_s() + timeout_s, "communicator init");
    if (prev >= 0)
        cudaSetDevice(prev);
    if (st != DSQ_OK) {
        dsq_comm_free(c);
        return st;
    }
    *out = c;
    return DSQ_OK;
}

extern "C" dsq_status dsq_comm_init_local(const int *devices, int n, double timeout_s, dsq_comm **comms)
{
    if (!devices || !comms || n < 1 || !(timeout_s > 0))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_init_local: %d devices, timeout %.3g s", n, timeout_s);
    for (int i = 0; i < n; i++)
        comms[i] = NULL;
    dsq_status st = need_nccl();
    for (int i = 0; st == DSQ_OK && i < n; i++) {
        st = check_device(devices[i]);
        for (int j = 0; st == DSQ_OK && j < i; j++)
            if (devices[j] == devices[i])
                st = dsq_fail(DSQ_ERR_INVALID_ARG, "device %d is listed twice", devices[i]);
    }
    if (st != DSQ_OK)
        return st;
    uint8_t id[DSQ_COMM_ID_BYTES];
    if ((st = dsq_comm_unique_id(id)) != DSQ_OK)
        return st;
    for (int i = 0; i < n; i++)
        if (!(comms[i] = comm_alloc(i, n, devices[i], timeout_s))) {
            for (int j = 0; j < i; j++) {
                free(comms[j]);
                comms[j] = NULL;
            }
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_comm_init_local: out of memory");
        }
    int prev = -1;
    cudaGetDevice(&prev);
    ncclUniqueId u;
    memcpy(u.internal, id, DSQ_COMM_ID_BYTES);
    ncclConfig_t cfg = nonblocking_config();
    /* one thread initialises every rank: inside a group, or the first
     * init would wait for the others forever */
    ncclResult_t r = nc->GroupStart();
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
        cudaSetDevice(devices[i]);
        r = nc->CommInitRankConfig(&comms[i]->comm, n, u, i, &cfg);
    }
    ncclResult_t g = nc->GroupEnd();
    if (r == ncclSuccess || r == ncclInProgress)
        r = g;
    const double deadline = now_s() + timeout_s;
    if (r != ncclSuccess && r != ncclInProgress)
        st = dsq_fail(DSQ_ERR_DEVICE, "NCCL communicator init of %d local devices: %s", n, nc->GetErrorString(r));
    for (int i = 0; st == DSQ_OK && i < n; i++)
        st = comms[i]->comm ? wait_until(comms[i], deadline, "communicator init")
                            : dsq_fail(DSQ_ERR_DEVICE, "NCCL communicator init: rank %d got no communicator", i);
    if (prev >= 0)
        cudaSetDevice(prev);
    if (st != DSQ_OK) {
        for (int i = 0; i < n; i++) {
            if (comms[i] && comms[i]->comm && !comms[i]->failed)
                (void)nc->CommAbort(comms[i]->comm);
            free(comms[i]);
            comms[i] = NULL;
        }
        return st;
    }
    return DSQ_OK;
}

extern "C" dsq_status dsq_comm_all_reduce_sum(dsq_comm *c, void *buf, size_t count, dsq_comm_dtype dt,
                                              void *stream)
{
    if (!c || (!buf && count))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_all_reduce_sum: NULL argument");
    if (c->failed)
        return dsq_fail(DSQ_ERR_DEVICE, "NCCL communicator (rank %d of %d) was aborted after an error", c->rank,
                        c->world);
    ncclDataType_t t = dt == DSQ_COMM_F32 ? ncclFloat32 : dt == DSQ_COMM_BF16 ? ncclBfloat16 : ncclFloat16;
    if (dt != DSQ_COMM_F32 && dt != DSQ_COMM_BF16 && dt != DSQ_COMM_F16)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_all_reduce_sum: unknown dtype %d", (int)dt);
    ncclResult_t r = nc->AllReduce(buf, buf, count, t, ncclSum, c->comm, (cudaStream_t)stream);
    if (r == ncclSuccess)
        return DSQ_OK;
    if (r != ncclInProgress)
        return comm_error(c, r, "all-reduce");
    return wait_until(c, now_s() + c->timeout_s, "all-reduce");
}

extern "C" dsq_status dsq_comm_wait(dsq_comm *c)
{
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_wait: NULL communicator");
    if (c->failed)
        return dsq_fail(DSQ_ERR_DEVICE, "NCCL communicator (rank %d of %d) was aborted after an error", c->rank,
                        c->world);
    return wait_until(c, now_s() + c->timeout_s, "wait");
}

/* Wait for `stream` to drain, watching the communicator: a collective whose
 * peer vanished spins on the GPU forever, so the wait is bounded by the
 * communicator's timeout and ends with an abort (which stops the kernel). */
extern "C" dsq_status dsq_comm_sync_stream(dsq_comm *c, void *stream)
{
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_comm_sync_stream: NULL communicator");
    const double deadline = now_s() + c->timeout_s;
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess)
            return DSQ_OK;
        if (e != cudaErrorNotReady)
            return dsq_cu_status(e, "stream of a tensor-parallel step");
        if (c->failed)
            return dsq_fail(DSQ_ERR_DEVICE, "NCCL communicator (rank %d of %d) was aborted after an error",
                            c->rank, c->world);
        ncclResult_t a = ncclSuccess;
        ncclResult_t r = nc->CommGetAsyncError(c->comm, &a);
        if (r != ncclSuccess)
            return comm_error(c, r, "step");
        if (a != ncclSuccess && a != ncclInProgress)
            return comm_error(c, a, "step");
        if (now_s() > deadline) {
            dsq_status st = comm_error(c, ncclInProgress, "step");
            return dsq_fail(st, "tensor-parallel step (rank %d of %d) timed out after %.1f s: a peer did not answer",
                            c->rank, c->world, c->timeout_s);
        }
        pause_briefly();
    }
}

extern "C" int dsq_comm_rank(const dsq_comm *c) { return c ? c->rank : -1; }
extern "C" int dsq_comm_world(const dsq_comm *c) { return c ? c->world : 0; }

extern "C" void dsq_comm_free(dsq_comm *c)
{
    if (!c)
        return;
    if (c->comm && !c->failed) {
        int prev = -1;
        cudaGetDevice(&prev);
        cudaSetDevice(c->device);
        ncclResult_t r = nc->CommFinalize(c->comm);
        dsq_status st = r == ncclSuccess || r == ncclInProgress ? wait_until(c, now_s() + c->timeout_s, "finalize")
                                                                : comm_error(c, r, "finalize");
        if (st == DSQ_OK)
            (void)nc->CommDestroy(c->comm);
        /* else wait_until/comm_error aborted it (which frees it) */
        if (prev >= 0)
            cudaSetDevice(prev);
    }
    free(c);
}

#endif /* DSQ_HAVE_NCCL */
