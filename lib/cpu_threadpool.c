/* cpu_threadpool.c - worker threads for the CPU backend.
 *
 * A forward pass is a chain of short parallel regions (a decode step of the
 * 1.5B model has ~140 of them), so the cost of waking workers matters as
 * much as the work.  Workers and the waiting caller therefore spin briefly
 * (a bounded number of pause instructions, tens of microseconds) on an
 * atomic generation counter before falling back to a condition variable:
 * back-to-back regions hand over without a syscall, and an idle context
 * sleeps instead of burning cores. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_threadpool.h"

/* ~50 us on a current x86 core (pause is 40-140 cycles). */
#define SPIN_ITERS 2000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A job is identified by a generation number.  `claim` packs the current
 * generation, the job's task count and the next unclaimed task into one
 * 64-bit word, so a worker that wakes late, after its job finished and the
 * next one began, can neither take a task of a job it has not seen nor
 * misjudge where a job ends.  Completion is counted in tasks, not workers:
 * the caller never waits for a worker that was descheduled before it
 * claimed anything (cores shared with other processes), only for tasks
 * actually in flight. */
#define GEN_BITS 24
#define CNT_BITS 20
#define MAX_TASKS ((1u << CNT_BITS) - 1)
#define GEN_MASK ((1u << GEN_BITS) - 1)

static inline uint32_t w_gen(unsigned long long w) { return (uint32_t)(w >> (2 * CNT_BITS)); }
static inline uint32_t w_n(unsigned long long w) { return (uint32_t)(w >> CNT_BITS) & MAX_TASKS; }
static inline uint32_t w_next(unsigned long long w) { return (uint32_t)w & MAX_TASKS; }
static inline unsigned long long w_make(uint32_t gen, uint32_t n)
{
    return ((unsigned long long)gen << (2 * CNT_BITS)) | ((unsigned long long)n << CNT_BITS);
}

struct dsq_cpu_pool {
    int n_threads;           /* including the caller */
    pthread_t *threads;      /* [n_threads - 1] */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* workers sleep here for a new generation */
    pthread_cond_t cv_done;  /* the caller sleeps here for done == n */
    /* the current job's function; stored before `claim` is published */
    _Atomic(dsq_cpu_task_fn) fn;
    _Atomic(void *) arg;
    atomic_ullong claim;     /* generation | task count | next task */
    atomic_uint done;        /* tasks of the current job finished */
    atomic_int sleeping;     /* workers blocked (or about to block) on cv_work */
    atomic_int caller_sleeping;
    atomic_int stop;
};

typedef struct worker_arg {
    dsq_cpu_pool *p;
    int idx;
} worker_arg;

/* Claim and run tasks of generation g until none is left. */
static void run_tasks(dsq_cpu_pool *p, uint32_t g, int thread)
{
    /* Read after g was seen (acquire).  If g is over already, these may
     * belong to a later job, but then no claim below succeeds. */
    dsq_cpu_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
    void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
    unsigned long long w = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        if (w_gen(w) != g || w_next(w) >= w_n(w))
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &w, w + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* w was reloaded */
        fn(arg, (int64_t)w_next(w), thread);
        /* seq_cst pairs with the caller's caller_sleeping store / done load */
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_seq_cst) + 1 == w_n(w) &&
            atomic_load_explicit(&p->caller_sleeping, memory_order_seq_cst)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
        w = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker_main(void *v)
{
    worker_arg wa = *(worker_arg *)v;
    free(v);
    dsq_cpu_pool *p = wa.p;
    /* generation 0 is the pool's initial state, never a job */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = seen;
        for (int s = 0; s < SPIN_ITERS; s++) {
            g = w_gen(atomic_load_explicit(&p->claim, memory_order_acquire));
            if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
                break;
            cpu_relax();
        }
        if (g == seen && !atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            /* announce before the last check (seq_cst both sides): either
             * the caller sees us sleeping and broadcasts, or we see its job */
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add_explicit(&p->sleeping, 1, memory_order_seq_cst);
            while ((g = w_gen(atomic_load_explicit(&p->claim, memory_order_seq_cst))) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_relaxed))
                pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub_explicit(&p->sleeping, 1, memory_order_relaxed);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = g;
        run_tasks(p, g, wa.idx);
    }
}

dsq_status dsq_cpu_pool_new(int n_threads, dsq_cpu_pool **out)
{
    *out = NULL;
    if (n_threads < 1)
        n_threads = 1;
    dsq_cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the CPU thread pool");
    p->n_threads = n_threads;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "cannot create the thread pool mutex");
    }
    if (pthread_cond_init(&p->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "cannot create a thread pool condition variable");
    }
    if (pthread_cond_init(&p->cv_done, NULL) != 0) {
        pthread_cond_destroy(&p->cv_work);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "cannot create a thread pool condition variable");
    }
    atomic_init(&p->fn, NULL);
    atomic_init(&p->arg, NULL);
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            dsq_cpu_pool_free(p);
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d thread handles", n_threads - 1);
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) {
                dsq_cpu_pool_free(p);
                return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to start worker %d", i);
            }
            wa->p = p;
            wa->idx = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                dsq_cpu_pool_free(p);
                return dsq_fail(DSQ_ERR_OUT_OF_MEMORY,
                                "cannot start CPU worker thread %d of %d", i, n_threads - 1);
            }
            p->n_started++;
        }
    }
    *out = p;
    return DSQ_OK;
}

void dsq_cpu_pool_free(dsq_cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int dsq_cpu_pool_threads(const dsq_cpu_pool *p) { return p ? p->n_threads : 1; }

void dsq_cpu_pool_run(dsq_cpu_pool *p, int64_t n_tasks, dsq_cpu_task_fn fn, void *arg)
{
    if (n_tasks <= 0)
        return;
    if (p->n_threads == 1 || n_tasks == 1 || n_tasks > (int64_t)MAX_TASKS) {
        for (int64_t i = 0; i < n_tasks; i++)
            fn(arg, i, 0);
        return;
    }
    const uint32_t n = (uint32_t)n_tasks;
    uint32_t g = (w_gen(atomic_load_explicit(&p->claim, memory_order_relaxed)) + 1) & GEN_MASK;
    if (g == 0)
        g = 1; /* 0 is reserved for "no job yet" */
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, w_make(g, n), memory_order_seq_cst);
    if (atomic_load_explicit(&p->sleeping, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }

    run_tasks(p, g, 0);

    for (int s = 0; s < SPIN_ITERS; s++) {
        if (atomic_load_explicit(&p->done, memory_order_acquire) == n)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->caller_sleeping, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&p->done, memory_order_seq_cst) != n)
        pthread_cond_wait(&p->cv_done, &p->mu);
    atomic_store_explicit(&p->caller_sleeping, 0, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
}
