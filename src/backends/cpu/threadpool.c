/* threadpool.c — pthread pool with dynamic chunk scheduling (see threadpool.h). */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/common.h"

struct dt_pool {
    int threads;
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;     /* bumped for each job (under mu) */
    int stop;
    int active;              /* workers still running the current job (under mu) */
    /* current job */
    dt_pool_fn fn;
    void *ctx;
    int64_t n, grain;
    atomic_int_fast64_t next;
};

typedef struct { dt_pool *p; int tid; } worker_arg;

static void run_chunks(dt_pool *p, int tid) {
    for (;;) {
        int64_t i0 = atomic_fetch_add(&p->next, p->grain);
        if (i0 >= p->n) break;
        int64_t i1 = i0 + p->grain < p->n ? i0 + p->grain : p->n;
        p->fn(p->ctx, i0, i1, tid);
    }
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    dt_pool *p = wa.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dt_pool *dt_pool_create(int threads) {
    if (threads < 1) threads = 1;
    dt_pool *p = dt_calloc(1, sizeof *p);
    p->threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    p->tids = dt_calloc((size_t)threads, sizeof *p->tids);
    for (int t = 1; t < threads; t++) {
        worker_arg *wa = dt_malloc(sizeof *wa);
        wa->p = p; wa->tid = t;
        if (pthread_create(&p->tids[t], NULL, worker_main, wa) != 0) {
            free(wa);
            p->threads = t;          /* keep the workers that started */
            dt_pool_destroy(p);
            dt_set_error("cpu backend: cannot start worker thread %d", t);
            return NULL;
        }
    }
    return p;
}

void dt_pool_destroy(dt_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->threads; t++) pthread_join(p->tids[t], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
}

int dt_pool_threads(const dt_pool *p) { return p ? p->threads : 1; }

void dt_pool_run(dt_pool *p, int64_t n, int64_t grain, dt_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->threads == 1 || n <= grain) {
        for (int64_t i0 = 0; i0 < n; i0 += grain) fn(ctx, i0, i0 + grain < n ? i0 + grain : n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn; p->ctx = ctx; p->n = n; p->grain = grain;
    atomic_store(&p->next, 0);
    p->active = p->threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
