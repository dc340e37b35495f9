/* comm_threads.c — the "threads" communicator (comm.h): ranks are threads of this process on CPU backends, so every
 * rank's memory is host memory and a message moves by memcpy.
 *
 * One lock (the turn) and one condition variable. A rank works while it holds the turn (enter .. leave); a barrier
 * waits on the condition variable, which gives the turn to another rank until the last one arrives. An exchange:
 *   1. publish this rank's send list, barrier (every rank has published);
 *   2. for each receive from peer p: the matching send of p (the k-th message p sends here for the k-th receive
 *      from p), sizes and dtypes checked, copied;
 *   3. barrier (no rank returns, and reuses a send buffer, before every peer has copied out of it).
 * The result does not depend on the order in which the ranks take turns: step 2 only reads published sends. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backends/comm.h"

typedef struct {
    pthread_mutex_t turn;
    pthread_cond_t cv;
    int n, arrived;
    unsigned long gen;
    const dt_comm_msg *send[DT_COMM_MAX_RANKS];
    int ns[DT_COMM_MAX_RANKS];
} thr_comm;

static void thr_enter(dt_comm *c, int rank) {
    (void)rank;
    pthread_mutex_lock(&((thr_comm *)c->impl)->turn);
}

static void thr_leave(dt_comm *c, int rank) {
    (void)rank;
    pthread_mutex_unlock(&((thr_comm *)c->impl)->turn);
}

/* Called with the turn held; returns with it held. */
static void barrier(thr_comm *t) {
    unsigned long g = t->gen;
    if (++t->arrived == t->n) {
        t->arrived = 0;
        t->gen++;
        pthread_cond_broadcast(&t->cv);
        return;
    }
    while (g == t->gen) pthread_cond_wait(&t->cv, &t->turn);
}

/* A message list is usable: peers in range, contiguous non-empty matrices with data. */
static int check_list(const char *what, int rank, int n, const dt_comm_msg *m, int k) {
    for (int i = 0; i < k; i++) {
        if (m[i].peer < 0 || m[i].peer >= n) {
            dt_set_error("comm threads: rank %d %s message %d names rank %d of %d", rank, what, i, m[i].peer, n);
            return -1;
        }
        if (m[i].m.rows > 0 && (!m[i].m.data || !dt_comm_msg_contiguous(&m[i].m))) {
            dt_set_error("comm threads: rank %d %s message %d is not a contiguous matrix", rank, what, i);
            return -1;
        }
    }
    return 0;
}

/* The k-th non-empty message of list m (count entries) for `peer`, or NULL; *total gets how many there are. */
static const dt_mat *nth_for(const dt_comm_msg *m, int count, int peer, int k, int *total) {
    const dt_mat *hit = NULL;
    int j = 0;
    for (int i = 0; i < count; i++) {
        if (m[i].peer != peer || m[i].m.rows <= 0) continue;
        if (j == k) hit = &m[i].m;
        j++;
    }
    *total = j;
    return hit;
}

static int thr_exchange(dt_comm *c, int rank, const dt_comm_msg *send, int ns, const dt_comm_msg *recv, int nr) {
    thr_comm *t = c->impl;
    int rc = 0;
    if (check_list("send", rank, t->n, send, ns) || check_list("receive", rank, t->n, recv, nr)) {
        rc = -1;
        ns = nr = 0;   /* take part in the barriers with nothing, so no peer waits forever */
    }
    t->send[rank] = send;
    t->ns[rank] = ns;
    barrier(t);
    int got[DT_COMM_MAX_RANKS] = {0};
    for (int i = 0; i < nr && rc == 0; i++) {
        const dt_mat *dst = &recv[i].m;
        if (dst->rows <= 0) continue;
        int p = recv[i].peer, have;
        const dt_mat *src = nth_for(t->send[p], t->ns[p], rank, got[p], &have);
        if (!src) {
            dt_set_error("comm threads: rank %d expects message %d from rank %d, which sends %d", rank, got[p] + 1, p,
                         have);
            rc = -1;
        } else if (dt_comm_msg_elems(src) != dt_comm_msg_elems(dst) || src->dtype != dst->dtype) {
            dt_set_error("comm threads: rank %d receives %lld %s values from rank %d (message %d), which sends %lld %s",
                         rank, (long long)dt_comm_msg_elems(dst), dt_dtype_name(dst->dtype), p, got[p] + 1,
                         (long long)dt_comm_msg_elems(src), dt_dtype_name(src->dtype));
            rc = -1;
        } else {
            memcpy(dst->data, src->data, (size_t)dt_comm_msg_elems(dst) * dt_dtype_size(dst->dtype));
        }
        got[p]++;
    }
    /* every message sent here must have been received: a peer sending more than this rank takes is an error too */
    for (int p = 0; p < t->n && rc == 0; p++) {
        int have;
        nth_for(t->send[p], t->ns[p], rank, 0, &have);
        if (have != got[p]) {
            dt_set_error("comm threads: rank %d takes %d message%s from rank %d, which sends %d", rank, got[p],
                         got[p] == 1 ? "" : "s", p, have);
            rc = -1;
        }
    }
    barrier(t);
    t->send[rank] = NULL;
    t->ns[rank] = 0;
    return rc;
}

static void thr_destroy(dt_comm *c) {
    thr_comm *t = c->impl;
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->turn);
    free(t);
    free(c);
}

dt_comm *dt_comm_threads_create(int n) {
    if (n < 1 || n > DT_COMM_MAX_RANKS) {
        dt_set_error("comm threads: %d ranks (1 to %d)", n, DT_COMM_MAX_RANKS);
        return NULL;
    }
    thr_comm *t = dt_calloc(1, sizeof *t);
    t->n = n;
    pthread_mutex_init(&t->turn, NULL);
    pthread_cond_init(&t->cv, NULL);
    dt_comm *c = dt_calloc(1, sizeof *c);
    c->name = "threads";
    c->size = n;
    c->impl = t;
    c->enter = thr_enter;
    c->leave = thr_leave;
    c->exchange = thr_exchange;
    c->destroy = thr_destroy;
    return c;
}
