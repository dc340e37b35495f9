/* dit.h — one interface over the diffusion transformers the pipelines run: FLUX.2 (models/flux2.h), FLUX.2 split
 * over ranks (models/flux2_sp.h), Krea 2 (models/krea2.h) and Z-Image (models/zimage.h). Each model implements
 * dt_dit_ops in its own file (flux2_dit.c, krea2_dit.c, zimage_dit.c); what differs between the models (their
 * geometry, their position inputs) stays in the family's own types (the config behind dt_dit_config). */
#ifndef DT_DIT_H
#define DT_DIT_H

#include <stdint.h>

#include "backends/backend.h"
#include "io/safetensors.h"
#include "models/block_cache.h"
#include "models/lora.h"

typedef struct dt_dit dt_dit;

/* Observer of intermediate tensors (tests, debugging); the names are the model's. */
typedef void (*dt_dit_trace_fn)(void *ud, const char *name, dt_mat m);

/* Resident text slots a DiT keeps on the device (CFG's positive and negative prompt). */
#define DT_DIT_TEXT_SLOTS 2

/* One forward's inputs and output. */
typedef struct {
    const float *img;               /* [n_img, in_channels] latent tokens */
    int n_img;
    const float *txt;               /* [n_txt, text features] host text, when text < 0 */
    int n_txt;
    int text;                       /* the resident text slot (dt_dit_text_resident*) to use, or -1: txt */
    float timestep;                 /* the model's input (FLUX.2: timestep / 1000) */
    const float *img_ids, *txt_ids; /* FLUX.2: position ids [n_img, axes], [n_txt, axes] */
    const float *pos;               /* Krea 2: position ids [n_txt + n_img, axes] */
    const uint8_t *mask;            /* Krea 2: text mask [n_txt] (1 = attend; NULL: all) */
    int grid_h, grid_w;             /* Z-Image: the image token grid (grid_h · grid_w = n_img) */
    float *out;                     /* [n_img, out_channels] */
    dt_dit_trace_fn trace;          /* NULL: none (a split DiT ignores it) */
    void *trace_ud;
    dt_fbc_branch *fbc;             /* First Block Cache state of the pass (models/block_cache.h; NULL: every block
                                     * runs; a split DiT refuses it) */
} dt_dit_step;

/* How to load a DiT (each model's *_dit_load). */
typedef struct {
    const dt_lora_spec *loras;  /* LoRA adapters (models/lora.h), all applied; n_loras of them */
    int n_loras;
    int lora_side;              /* 1: side products for dense weights too instead of merging (comparisons) */
    int ranks;                  /* > 1: split over this many ranks (models that can: FLUX.2) */
    const int *devices;         /* CUDA device of each rank (n_devices of them; 0: the backend's device + rank) */
    int n_devices;
    int cuda_graph;             /* replay the forward as a CUDA graph where the model can */
    dt_precision precision;     /* --precision: the DiT blocks' Linears (fp8: e4m3 where the model has an fp8 mode) */
    dt_precision attn_precision;/* --attn-precision: the DiT blocks' attention */
    int fp8_unfused;            /* A/B arm of fp8 Linears: input quantized in a pass of its own (flux2_load_opts) */
} dt_dit_load_opts;

/* What a model implements. m is its model object. 0 or -1 (dt_last_error) where an int is returned. */
typedef struct {
    const char *name;   /* "flux2", "flux2 split", "krea2" */
    int (*forward)(dt_dit *d, const dt_dit_step *s);
    /* Reference tokens [r, in_channels] with ids [r, axes], appended or KV-cached; tokens NULL drops them.
     * NULL: the model takes no references. */
    int (*set_refs)(dt_dit *d, const float *tokens, const float *ids, int r, int kv_cached);
    /* Text features [t, features] kept in slot from host txt / from a backend matrix on the device. */
    int (*text_resident)(dt_dit *d, int slot, const float *txt, int t);
    int (*text_resident_mat)(dt_dit *d, int slot, dt_mat src);
    /* Bytes of weights as stored and a short description of their formats ("bf16", "q4 g64", ...). */
    void (*weight_info)(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len);
    void (*free)(void *m);
    /* A cancellation flag (dt_cancel_requested) the forwards poll before each block: a cancelled request's forward
     * stops within one block and fails with "cancelled". NULL flag: none. NULL op: checked between steps only. */
    void (*set_cancel)(dt_dit *d, const volatile int *flag);
    /* Two steps of the same image size and timestep (classifier-free guidance's prompt and negative prompt) in one
     * forward: every Linear once on both sequences' rows, attention per sequence; each step's out as its own forward
     * would give it (traces and First Block Cache not taken). NULL: the model runs one sequence per forward. */
    int (*forward_pair)(dt_dit *d, const dt_dit_step *s0, const dt_dit_step *s1);
} dt_dit_ops;

/* A DiT over model m (freed with it through ops->free) whose geometry is config (the model's own struct). */
dt_dit *dt_dit_new(const dt_dit_ops *ops, void *m, const void *config);
void dt_dit_free(dt_dit *d);
void *dt_dit_model(const dt_dit *d);
const dt_dit_ops *dt_dit_get_ops(const dt_dit *d);
const void *dt_dit_config(const dt_dit *d);
/* A resident slot's text as its model knows it: host text (text_resident) or the slot's own key address
 * (text_resident_mat: an address unique to this DiT and slot, never read). NULL when the slot holds none. */
const void *dt_dit_text_key(const dt_dit *d, int slot);
/* For a model's text_resident_mat: the slot's own key address (unique to this DiT and slot). */
const void *dt_dit_slot_key(const dt_dit *d, int slot);

int dt_dit_forward(dt_dit *d, const dt_dit_step *s);
/* ops->forward_pair (an error naming the model where it has none); dt_dit_can_pair says whether it has one. */
int dt_dit_forward_pair(dt_dit *d, const dt_dit_step *s0, const dt_dit_step *s1);
int dt_dit_can_pair(const dt_dit *d);
void dt_dit_set_cancel(dt_dit *d, const volatile int *flag);   /* ops->set_cancel where the model has one */
int dt_dit_set_refs(dt_dit *d, const float *tokens, const float *ids, int r, int kv_cached);
int dt_dit_text_resident(dt_dit *d, int slot, const float *txt, int t);
int dt_dit_text_resident_mat(dt_dit *d, int slot, dt_mat src);
void dt_dit_weight_info(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len);
/* The host text a step's model call takes: s->txt, or the slot's key (dt_dit_text_key). */
const float *dt_dit_step_text(const dt_dit *d, const dt_dit_step *s);


/* One forward's inputs as `ditrun forward` reads them from a file (each model's *_dit_read_inputs, the tensor names
 * its synth writes: in.hidden_states, in.encoder_hidden_states, in.timestep, and the model's own). */
typedef struct {
    dt_dit_step step;           /* img, n_img, txt, n_txt, timestep, ids / pos / mask (out: the caller's) */
    int64_t cin;                /* in.hidden_states' channels (dt_dit_read_common; the model checks them) */
    const st_tensor *t_txt;     /* in.encoder_hidden_states (its shape is the model's to check) */
    int out_channels;
    int n_refs;                 /* reference tokens set on the DiT (0: none) */
    const float *ref_tok, *ref_ids;   /* them [n_refs, in_channels] and their ids [n_refs, axes] (to set again) */
    float *owned[8];            /* the buffers behind step (dt_dit_inputs_free) */
    uint8_t *owned_mask;
    char geometry[160];         /* the load line's description ("FLUX.2 transformer (D=3072, 5 double + 20 single blocks") */
    char what[96];              /* the timing line's note (" (KV-cached references)", " (text mask)") */
} dt_dit_inputs;
void dt_dit_inputs_free(dt_dit_inputs *fi);
/* Shared by the readers: tensor name of f as f32 (NULL: absent, an error when required; *t its tensor), and the
 * rows x cols of a [1, rows, cols] or [rows, cols] tensor (-1 otherwise, with the error). */
float *dt_dit_input_f32(const st_file *f, const char *name, int required, const st_tensor **t);
int dt_dit_input_shape2(const st_tensor *t, int64_t *rows, int64_t *cols);
/* The inputs every model takes, read before the model loads: in.hidden_states [1, N, C], in.timestep (one finite
 * value) and in.encoder_hidden_states into fi (its cin and t_txt for the model's reader to check). 0 or -1. */
int dt_dit_read_common(const st_file *f, dt_dit_inputs *fi);

#endif
