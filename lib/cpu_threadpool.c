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

struct dsq_cpu_pool {
    int n_threads;           /* including the caller */
    pthread_t *threads;      /* [n_threads - 1] */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* workers sleep here for a new generation */
    pthread_cond_t cv_done;  /* the caller sleeps here for pending == 0 */
    /* the current job; written before `gen` is bumped (release) */
    dsq_cpu_task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_llong next;       /* next unclaimed task */
    atomic_int pending;      /* workers still inside the current job */
    atomic_uint gen;         /* bumped once per job */
    atomic_int stop;
};

typedef struct worker_arg {
    dsq_cpu_pool *p;
    int idx;
} worker_arg;

static void run_tasks(dsq_cpu_pool *p, int thread)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_tasks)
            return;
        p->fn(p->arg, i, thread);
    }
}

static void *worker_main(void *v)
{
    worker_arg wa = *(worker_arg *)v;
    free(v);
    dsq_cpu_pool *p = wa.p;
    /* not a load of gen: the caller may publish a job before this thread
     * first runs, and that job must not be missed */
    unsigned seen = 0;
    for (;;) {
        unsigned g = seen;
        for (int s = 0; s < SPIN_ITERS; s++) {
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
                break;
            cpu_relax();
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_relaxed))
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = g;
        run_tasks(p, wa.idx);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            /* last one out wakes the caller if it went to sleep */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
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
    atomic_init(&p->next, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->gen, 0);
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
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; i++)
            fn(arg, i, 0);
        return;
    }
    int workers = p->n_threads - 1;
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, workers, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    run_tasks(p, 0);

    for (int s = 0; s < SPIN_ITERS; s++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
