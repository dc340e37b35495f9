/* flux2_sp.h — the FLUX.2-klein transformer forward split over N ranks (sequence parallelism, DeepSpeed-Ulysses;
 * docs/sequence-parallel.md): every rank holds the whole model and 1/N of the text rows and of the image rows; before
 * each attention an all-to-all (backends/comm.h) turns the token split into a head split, after it back. Ranks are
 * threads of this process: rank 0 is the caller's thread on the caller's backend, ranks 1..N-1 threads started here,
 * each with its own backend (CUDA: its own GPU; CPU: N thread ranks taking turns, for tests).
 *
 * The entry points mirror flux2.h's (flux2_forward, flux2_text_resident[_mat], flux2_set_refs) and must all be called
 * from the thread that created it. The output equals flux2_forward's up to the summation order of GEMMs of fewer rows
 * (CPU f32: ~1e-7 relative; the tests bound it at 1e-5). */
#ifndef DT_FLUX2_SP_H
#define DT_FLUX2_SP_H

#include "backends/comm.h"
#include "models/flux2.h"

#define FLUX2_SP_MAX_RANKS DT_COMM_MAX_RANKS

typedef struct {
    int ranks;                          /* N >= 1 */
    int devices[FLUX2_SP_MAX_RANKS];    /* CUDA device of rank r (rank 0's must be the given backend's); */
    int n_devices;                      /* 0: the backend's device + r */
    flux2_load_opts load;               /* LoRA adapters, applied on every rank as flux2_load_ex does */
} flux2_sp_opts;

typedef struct flux2_sp flux2_sp;

/* Load the transformer at path on N ranks: rank 0 on be (the caller's thread), ranks 1..N-1 on backends of be's kind
 * with be's options (CUDA: device devices[r]). NULL with dt_last_error: N out of range, more ranks than attention heads,
 * a device that does not exist, NCCL missing (names libnccl.so.2), a load failure (names the rank). */
flux2_sp *flux2_sp_load(dt_backend *be, const char *path, const flux2_sp_opts *o);
void flux2_sp_free(flux2_sp *sp);
const flux2_config *flux2_sp_get_config(const flux2_sp *sp);
int flux2_sp_ranks(const flux2_sp *sp);
const char *flux2_sp_comm_name(const flux2_sp *sp);   /* "threads", "nccl" */

/* As flux2_text_resident / flux2_text_resident_mat: text features [t, joint_dim] kept on the ranks (each its rows),
 * from host txt or from src (a matrix of rank 0's backend, downloaded once). 0 or -1. */
int flux2_sp_text_resident(flux2_sp *sp, const float *txt, int t);
int flux2_sp_text_resident_mat(flux2_sp *sp, const void *key, dt_mat src);
/* As flux2_set_refs (appended reference tokens are split like the noise tokens; KV-cached ones are extracted by a
 * split reference-only pass and each rank keeps its heads' K|V). 0 or -1. */
int flux2_sp_set_refs(flux2_sp *sp, const float *tokens, const float *ids, int r, int kv_cached);
/* As flux2_forward (no trace). Needs at least N image tokens. 0 or -1 (dt_last_error). */
int flux2_sp_forward(flux2_sp *sp, const float *img, int n_img, const float *txt, int n_txt, float timestep,
                     const float *img_ids, const float *txt_ids, float *out);

/* The split of `total` rows over `ranks`: rank r gets the rows [*first, *first + return value); the first
 * total % ranks ranks one row more. The same rule splits text rows, image rows and heads. */
static inline int flux2_sp_part(int total, int ranks, int r, int *first) {
    int base = total / ranks, extra = total % ranks;
    *first = r * base + (r < extra ? r : extra);
    return base + (r < extra ? 1 : 0);
}

#endif
