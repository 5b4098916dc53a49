/* cpu_threadpool.h - a fixed set of worker threads for the CPU backend's
 * parallel-for.  One pool per context, alive as long as the context. */
#ifndef DSQ_CPU_THREADPOOL_H
#define DSQ_CPU_THREADPOOL_H

#include <stdint.h>

#include "internal.h"

typedef struct dsq_cpu_pool dsq_cpu_pool;

/* Task `task` (0..n_tasks-1) run by thread `thread` (0..n_threads-1; 0 is the
 * caller).  `thread` indexes per-thread scratch; which thread runs which task
 * is not fixed, so a task's result must not depend on it. */
typedef void (*dsq_cpu_task_fn)(void *arg, int64_t task, int thread);

/* Start n_threads-1 workers (the caller is the n-th).  n_threads >= 1.
 * DSQ_ERR_OUT_OF_MEMORY when memory or a thread cannot be had. */
dsq_status dsq_cpu_pool_new(int n_threads, dsq_cpu_pool **out);
/* Stop and join the workers.  NULL is a no-op. */
void dsq_cpu_pool_free(dsq_cpu_pool *p);
int dsq_cpu_pool_threads(const dsq_cpu_pool *p);
/* Run fn(arg, i, thread) for every i in 0..n_tasks-1 across the pool and
 * return when all are done.  Tasks are claimed dynamically (one at a time),
 * so make each a worthwhile amount of work.  Not reentrant. */
void dsq_cpu_pool_run(dsq_cpu_pool *p, int64_t n_tasks, dsq_cpu_task_fn fn, void *arg);

#endif
