/* flux2_internal.h — what the FLUX.2 transformer's two files share (private to them): the loaded model and its
 * activation buffers. flux2_load.c parses the config and loads the weights; flux2.c runs the forward and owns the
 * buffers, the CUDA graph, the resident text features and the reference tokens. */
#ifndef DT_FLUX2_INTERNAL_H
#define DT_FLUX2_INTERNAL_H

#include "flux2.h"
#include "linear_set.h"
#include "lora.h"

typedef flux2_double_w flux2_double;

typedef flux2_single_w flux2_single;

/* Activation buffers for one (N, T, KV, NB) shape; kept between calls (stable for graph capture). N counts every image
 * row (noise and appended reference tokens) of a sequence, KV the cached reference K|V rows behind qkv/p, NB the
 * sequences of a forward (2: the guidance batch, flux2_forward_pair; then the buffers hold 2N + 2T rows and T more
 * behind qkv/p and o/c, where the first sequence's text rows join its image rows for its attention). */
typedef struct {
    int n, t, kv, nb;
    flux2_acts x;
    float *ids;       /* host copy of the ids the tables were built from [(T+N) * n_axes] */
} flux2_bufs;

struct flux2_model {
    dt_backend *be;       /* the caller's backend, or the LoRA wrapper around it when adapters are loaded */
    dt_lora_set *lora;    /* loaded adapters (NULL: none) */
    dt_weights *w;
    flux2_config c;
    flux2_outer_w o;      /* embedders, timestep MLP, modulation, final layer */
    flux2_double *db;
    flux2_single *sb;
    dt_linear_set lin;   /* every created Linear (cleanup, format description) */
    size_t weight_bytes;
    flux2_bufs buf;
    /* CUDA-graph replay (flux2_set_graph): the device part of a forward is captured on the second call
     * with the same (N, T) (the first one, eager, lets every scratch buffer reach its size) and replayed */
    int use_graph;
    dt_fbc_branch *fbc;   /* First Block Cache state of the forwards (flux2_set_block_cache; NULL: none) */
    void *graph;
    const volatile int *cancel;   /* flux2_set_cancel: polled before each block of an eager forward (NULL: none) */
    int graph_n, graph_t, graph_nout, warm_n, warm_t, warm_nout;   /* the shape: rows, text rows, projected rows */
    int graph_nb, warm_nb;                                           /* ... and sequences */
    /* resident text features (flux2_text_resident): host buffers the caller keeps unchanged, uploaded once;
     * a forward whose txt matches one copies it on the device instead of uploading again. Two slots (the
     * positive and the negative prompt of CFG), least recently used replaced. */
    struct { const void *host; int t; dt_mat dev; unsigned long use; } res[2];
    unsigned long res_clock;
    /* reference tokens (flux2_set_refs): resident on the device; KV mode keeps each block's K|V after the
     * reference-only pass (cache[0 .. num_layers) the double blocks, then the single blocks) */
    struct {
        int r, kv_cached, filled;   /* r = 0: no references in the forwards (the buffers below may stay allocated) */
        dt_mat tok;      /* [rows, in]: rows = the last reference geometry's token count, kept for the next request */
        float *ids;      /* [rows, n_axes] host */
        dt_mat *cache;   /* [num_layers + num_single_layers] x [rows, 2D] (KV mode; NULL otherwise) */
        flux2_acts x;    /* KV mode: the reference-only pass's activations [rows] */
    } ref;
};

/* Everything flux2_load_ex made (Linears, block weights, the file, the LoRA wrapper and adapters) and m itself; what
 * the forward made is flux2_free's (flux2.c), which ends here. */
void flux2_weights_free(flux2_model *m);

#endif
