/* test_comm.c — the threads communicator (backends/comm.h) with real threads as ranks on CPU backends: all-to-alls
 * with blocks of different sizes (self messages, two messages per peer matched in order, empty ones skipped), many
 * exchanges in a row with send buffers rewritten right after each one, mismatched sizes reported on the receiving
 * rank without anybody hanging, one rank at a time between enter and leave, and dt_comm_create's checks. The NCCL
 * communicator is tested on GPUs by test_gpu_sp. Data moves by copies: every check is exact. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "backends/comm.h"
#include "test.h"

typedef struct {
    dt_comm *comm;
    dt_backend *be;
    int rank, n, rounds, bad;   /* bad: this rank receives one value too many from rank 0 (mismatch test) */
    int rc, errors;             /* exchange failures; wrong received values */
    char err[256];
} rank_arg;

static int g_running, g_max_running;   /* ranks between enter and leave (guarded by the turn itself) */

/* The value rank `from` puts at element i of its k-th message to rank `to` in round `round`. */
static float value(int round, int from, int to, int k, int64_t i) {
    return (float)(round * 1000000 + from * 100000 + to * 10000 + k * 1000) + (float)(i % 997);
}
/* Rows of rank from's k-th message to rank to (k = 0, 1; some are empty). */
static int64_t rows_of(int from, int to, int k) {
    if (k == 1 && (from + to) % 3 == 0) return 0;
    return 1 + from * 3 + to * 2 + k;
}
#define COLS 5

static void *rank_main(void *p) {
    rank_arg *a = p;
    int n = a->n;
    dt_comm_msg send[2 * DT_COMM_MAX_RANKS], recv[2 * DT_COMM_MAX_RANKS];
    dt_mat sm[2 * DT_COMM_MAX_RANKS], rm[2 * DT_COMM_MAX_RANKS];
    for (int s = 0; s < n; s++)
        for (int k = 0; k < 2; k++) {
            int64_t rs = rows_of(a->rank, s, k), rr = rows_of(s, a->rank, k);
            if (a->bad && s == 0 && k == 0) rr += 1;   /* expects one row more than rank 0 sends */
            sm[2 * s + k] = dt_alloc_or_die(a->be, rs ? rs : 1, COLS, DT_F32);
            sm[2 * s + k].rows = rs;
            rm[2 * s + k] = dt_alloc_or_die(a->be, rr ? rr : 1, COLS, DT_F32);
            rm[2 * s + k].rows = rr;
            send[2 * s + k] = (dt_comm_msg){s, sm[2 * s + k]};
            recv[2 * s + k] = (dt_comm_msg){s, rm[2 * s + k]};
        }
    for (int round = 0; round < a->rounds; round++) {
        a->comm->enter(a->comm, a->rank);
        if (++g_running > g_max_running) g_max_running = g_running;
        for (int s = 0; s < n; s++)   /* this round's values, written right after the last exchange returned */
            for (int k = 0; k < 2; k++) {
                float *d = sm[2 * s + k].data;
                for (int64_t i = 0; i < sm[2 * s + k].rows * COLS; i++) d[i] = value(round, a->rank, s, k, i);
            }
        if (round % 7 == 3) usleep(200);   /* ranks reach the exchange at different times */
        g_running--;
        int rc = a->comm->exchange(a->comm, a->rank, send, 2 * n, recv, 2 * n);
        g_running++;
        if (rc) {
            if (!a->rc) snprintf(a->err, sizeof a->err, "%s", dt_last_error());
            a->rc = -1;
        } else {
            for (int s = 0; s < n; s++)
                for (int k = 0; k < 2; k++) {
                    const float *d = rm[2 * s + k].data;
                    for (int64_t i = 0; i < rm[2 * s + k].rows * COLS; i++)
                        if (d[i] != value(round, s, a->rank, k, i)) a->errors++;
                }
        }
        g_running--;
        a->comm->leave(a->comm, a->rank);
    }
    for (int i = 0; i < 2 * n; i++) {
        sm[i].rows = rm[i].rows = 1;
        a->be->free(a->be, &sm[i]);
        a->be->free(a->be, &rm[i]);
    }
    return NULL;
}

/* n ranks, rounds exchanges; bad_rank >= 0 receives a wrong size from rank 0. Returns the rank args' summary. */
static void run(int n, int rounds, int bad_rank, int *rc_any, int *errors, char *err, size_t errn) {
    dt_backend_opts bo = {0};
    bo.threads = 1;
    dt_backend *be[DT_COMM_MAX_RANKS] = {0};   /* (ranks past n stay NULL) */
    for (int r = 0; r < n; r++) be[r] = dt_backend_cpu_create(&bo);
    dt_comm *c = dt_comm_create(be, n);
    rank_arg a[DT_COMM_MAX_RANKS];
    pthread_t th[DT_COMM_MAX_RANKS];
    g_running = g_max_running = 0;
    for (int r = 0; r < n; r++) {
        a[r] = (rank_arg){c, be[r], r, n, rounds, r == bad_rank, 0, 0, ""};
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    }
    *rc_any = 0;
    *errors = 0;
    err[0] = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (a[r].rc) { *rc_any = 1; if (!err[0]) snprintf(err, errn, "rank %d: %s", r, a[r].err); }
        *errors += a[r].errors;
    }
    dt_comm_destroy(c);
    for (int r = 0; r < n; r++) be[r]->destroy(be[r]);
}

int main(void) {
    char name[96], err[300];
    int rc, errors;
    for (int n = 1; n <= 4; n++) {
        run(n, 40, -1, &rc, &errors, err, sizeof err);
        snprintf(name, sizeof name, "comm threads: %d rank%s, 40 all-to-alls of uneven blocks", n, n > 1 ? "s" : "");
        T_CHECK(name, !rc && errors == 0, "rc %d (%s), %d wrong values", rc, err, errors);
    }
    T_CHECK("comm threads: one rank at a time between enter and leave", g_max_running == 1, "%d ranks ran at once",
            g_max_running);

    run(3, 2, 2, &rc, &errors, err, sizeof err);
    T_CHECK("comm threads: a receive larger than its send is an error naming both ranks (and nobody hangs)",
            rc && strstr(err, "rank 2 receives") && strstr(err, "from rank 0"), "rc %d, error '%s'", rc, err);

    /* creation checks */
    dt_backend_opts bo = {0};
    bo.threads = 1;
    dt_backend *be[DT_COMM_MAX_RANKS + 1];
    for (int r = 0; r <= DT_COMM_MAX_RANKS; r++) be[r] = dt_backend_cpu_create(&bo);
    dt_comm *c = dt_comm_create(be, 0);
    T_CHECK("comm: zero ranks refused", !c && strstr(dt_last_error(), "0 ranks"), "%s", dt_last_error());
    c = dt_comm_create(be, DT_COMM_MAX_RANKS + 1);
    T_CHECK("comm: more ranks than the limit refused", !c && strstr(dt_last_error(), "ranks (1 to"), "%s",
            dt_last_error());
    c = dt_comm_create(be, 2);
    T_CHECK("comm: CPU backends get the threads communicator", c && !strcmp(c->name, "threads") && c->size == 2,
            "%s", c ? c->name : dt_last_error());
    dt_comm_destroy(c);
    for (int r = 0; r <= DT_COMM_MAX_RANKS; r++) be[r]->destroy(be[r]);
    return T_DONE();
}
