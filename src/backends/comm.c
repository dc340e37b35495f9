/* comm.c — dt_comm_create (comm.h): the communicator for a set of rank backends, by their kind. */
#include <string.h>

#include "backends/comm.h"

dt_comm *dt_comm_create(dt_backend *const *ranks, int n) {
    if (n < 1 || n > DT_COMM_MAX_RANKS) {
        dt_set_error("communicator: %d ranks (1 to %d)", n, DT_COMM_MAX_RANKS);
        return NULL;
    }
    for (int r = 0; r < n; r++) {
        if (!ranks[r] || !ranks[r]->name) { dt_set_error("communicator: rank %d has no backend", r); return NULL; }
        if (strcmp(ranks[r]->name, ranks[0]->name)) {
            dt_set_error("communicator: rank %d is a %s backend, rank 0 a %s one (all ranks must be of one kind)", r,
                         ranks[r]->name, ranks[0]->name);
            return NULL;
        }
    }
    if (!strcmp(ranks[0]->name, "cpu")) return dt_comm_threads_create(n);
    if (!strcmp(ranks[0]->name, "cuda")) {
        for (int r = 0; r < n; r++)
            for (int s = 0; s < r; s++)
                if (ranks[r]->opts.device == ranks[s]->opts.device) {
                    dt_set_error("communicator: ranks %d and %d are both on CUDA device %d (one GPU per rank)", s, r,
                                 ranks[r]->opts.device);
                    return NULL;
                }
        return dt_comm_nccl_create(ranks, n);
    }
    dt_set_error("communicator: the %s backend has none (cpu: threads, cuda: NCCL)", ranks[0]->name);
    return NULL;
}
