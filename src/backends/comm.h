/* comm.h — a communicator between the ranks of one process: N backends of the same kind (one per GPU, or N CPU
 * backends), each driven by its own thread, that exchange matrices with point-to-point messages. The split
 * (sequence-parallel) transformer forward uses it for its all-to-alls (docs/sequence-parallel.md).
 *
 * Two implementations, chosen by the backends' kind:
 *   "nccl"    CUDA backends: NCCL loaded at run time (libnccl.so.2, never linked; backends/cuda/cuda_nccl.cu).
 *             An exchange is one NCCL group of ncclSend/ncclRecv on the rank backend's current queue: it returns
 *             at once and completes in order with the rank's other ops. NCCL failures are fatal (one line, exit 1),
 *             like device errors inside ops: a peer would otherwise wait forever.
 *   "threads" CPU backends (comm_threads.c): the same schedule with copies through shared memory and two
 *             barriers per exchange. The ranks take turns on the cores: a rank runs while it holds the
 *             communicator (enter .. leave) and gives it up while it waits at a barrier (OpenBLAS's thread count is
 *             process-wide and it is not re-entrant across concurrent callers).
 *
 * Rules for the callers (every rank, from its own thread):
 *   - do a rank's work between enter(rank) and leave(rank);
 *   - call exchange the same number of times in the same order on every rank;
 *   - the messages from rank a to rank b are matched in order: a's k-th send to b lands in b's k-th receive from a,
 *     with the same element count and dtype;
 *   - every message is a contiguous matrix (ld == cols, or one row) in the rank's backend memory.
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_COMM_MAX_RANKS 16

/* One message of an exchange: to (send) or from (receive) rank `peer`. A matrix of 0 rows is no message; both
 * sides must skip it. */
typedef struct {
    int peer;
    dt_mat m;
} dt_comm_msg;

typedef struct dt_comm dt_comm;
struct dt_comm {
    const char *name;   /* "threads", "nccl" */
    int size;           /* ranks */
    void *impl;

    /* The calling thread starts / stops running rank's work (threads: takes / gives back the cores). */
    void (*enter)(dt_comm *c, int rank);
    void (*leave)(dt_comm *c, int rank);
    /* Rank `rank`'s part of one exchange: its ns sends and nr receives (peer == rank allowed: a local copy).
     * 0, or -1 with dt_last_error (threads: a message whose size or dtype differs from its peer's; the exchange
     * still completes on every rank, so nobody waits forever; a receive that does not match is not copied). */
    int (*exchange)(dt_comm *c, int rank, const dt_comm_msg *send, int ns, const dt_comm_msg *recv, int nr);
    void (*destroy)(dt_comm *c);
};

/* A communicator over ranks[0..n) (1 <= n <= DT_COMM_MAX_RANKS, one backend per rank, all of one kind: "cpu" ->
 * threads, "cuda" -> NCCL on the backends' devices, which must differ). NULL with dt_last_error (CUDA: names
 * libnccl.so.2 when NCCL cannot be loaded). */
dt_comm *dt_comm_create(dt_backend *const *ranks, int n);
static inline void dt_comm_destroy(dt_comm *c) { if (c) c->destroy(c); }

/* The two implementations (dt_comm_create picks one). */
dt_comm *dt_comm_threads_create(int n);
dt_comm *dt_comm_nccl_create(dt_backend *const *ranks, int n);   /* cuda_loader.c -> the CUDA plugin */

/* Elements of a message matrix (rows x cols), and whether it is contiguous. */
static inline int64_t dt_comm_msg_elems(const dt_mat *m) { return m->rows * m->cols; }
static inline int dt_comm_msg_contiguous(const dt_mat *m) { return m->rows <= 1 || m->ld == m->cols; }

#ifdef __cplusplus
}
#endif
#endif
