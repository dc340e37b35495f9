/* bench_internal.h — the bench's inside: the interface a model family offers the bench (bench_family: set-up,
 * the model's own forward, one block's ops for the ledger, GEMM shapes and attention for the utilization, its
 * arms and its own report sections; bench_flux2.c and bench_krea2.c), the run's shared state (bench_ctx), and
 * the shared pieces: timers that end with a device synchronization, statistics, random device buffers,
 * rotating weight sets, the FLUX.2 replica of bench_model.c and the A/B-arm runner. */
#ifndef DT_BENCH_INTERNAL_H
#define DT_BENCH_INTERNAL_H

#include "bench.h"
#include "io/json.h"
#include "io/weights.h"
#include "models/linear_set.h"
#include "pipeline/family.h"

/* ---- timing (bench_util.c) ---- */
typedef struct {
    dt_backend *be;
    const dt_ext_profiling *pf;   /* the backend's events (NULL: none) */
    void *e0, *e1;     /* backend events, or NULL: sync + dt_now() */
    double t0;
} bench_timer;

void bench_timer_init(bench_timer *t, dt_backend *be);
void bench_timer_free(bench_timer *t);
void bench_timer_start(bench_timer *t);
/* Milliseconds since start; waits for the device (event elapsed + sync). Exits on a device error. */
double bench_timer_stop(bench_timer *t);
void bench_sync_or_die(dt_backend *be);

bench_stat bench_stats(const double *v, int n);
/* run(ud) timed device-only reps times after warmup (at least 1) untimed calls, the activations live [rows, cols]
 * restored from saved (same shape) before each call outside the timed region, and once more at the end (the
 * blocks of a forward timed on that forward's own stream: Krea 2, Z-Image); the statistic. */
bench_stat bench_time_restored(dt_backend *be, dt_mat live, dt_mat saved, int warmup, int reps, void (*run)(void *ud),
                               void *ud);
/* Sustained timing (a GPU at the power state of a long run, not of a short burst): op(ud, i) runs back to back
 * for heat_ms (a synchronization every 8 calls), then reps more calls each between two events with no
 * synchronization between them; their statistic. n = 0 on a CPU backend (no power state to speak of) or one
 * without events. */
bench_stat bench_time_sustained(dt_backend *be, int is_cpu, void (*op)(void *ud, int i), void *ud, double heat_ms,
                                int reps);
#define BENCH_HEAT_MS 200.0
/* Fill m with normal(0, sd) values (never zeros): host Philox normals uploaded. */
void bench_fill_randn(dt_backend *be, dt_mat m, uint64_t seed, float sd);
/* Attention operands for L tokens: q, o [L, hq*hd] and k, v [L, hkv*hd], q/k/v random (seeds seed..seed+2). */
void bench_attn_inputs(dt_backend *be, int64_t L, int hq, int hkv, int hd, uint64_t seed, dt_mat *q, dt_mat *k, dt_mat *v,
                       dt_mat *o);
double bench_max_abs_diff(const float *a, const float *b, size_t n);
double bench_max_abs(const float *a, size_t n);
/* Add a note to the report (printed under the tables). */
void bench_note(bench_report *r, const char *fmt, ...) DT_PRINTF(2, 3);
/* Exit with the last error (the bench cannot go on: a device or a loader failed mid-run). */
void bench_die(void) __attribute__((noreturn));
/* JSON-lines fields: "key":"escaped string"; ,"key":number (null when not finite); the six fields
 * PREFIX_{median,p10,p90,min,max}_ms and PREFIX_n of a statistic. */
void bench_jstr(FILE *f, const char *key, const char *v);
void bench_jnum(FILE *f, const char *key, double v);
void bench_jstat(FILE *f, const char *prefix, bench_stat s);
/* The setup table's last rows (repetitions, cache, synthetic checkpoint, load time by `loader`, memory peak). */
void bench_md_setup_end(const bench_report *r, FILE *f, const char *loader);
/* The GPU-state line (nothing when p->n = 0); what = the runs it follows. */
void bench_md_power(FILE *f, const bench_power *p, const char *what);
/* GFLOP per millisecond = TFLOP/s (0 when ms is not positive). */
double bench_tflops(double gflop, double ms);
/* A "| what | median | p10-p90 | min-max | TFLOPS |" row of a statistic in ms for gflop of work. */
void bench_md_stat_row(FILE *f, const char *what, bench_stat s, double gflop);
void bench_json_power(FILE *f, const bench_power *p);
/* Device copy bandwidth (the elementwise ops' reference): a bf16/f32 copy of ~4 x rot_bytes (64 MB .. 1 GB,
 * 256 MB on a CPU), warmup + reps timed copies; its statistic, bytes moved and GB/s. */
void bench_copy_bandwidth(dt_backend *be, double rot_bytes, int is_cpu, int warmup, int reps, bench_stat *copy,
                          double *bytes, double *gbs);
/* --model: the transformer folder (*dir, caller frees; set even when parsing fails) and its parsed config.json
 * (path written to cfg_path); NULL with the error set. */
json *bench_open_config(const char *model_dir, char **dir, char *cfg_path, size_t n);
/* Clears an A/B-arm table row and sets its names and note (the caller fills the numbers); returns row. */
bench_arm *bench_arm_row(bench_arm *row, const char *arm, const char *what, const char *a, const char *b, const char *note);
/* The cache size the weight rotations must exceed (twice), in MB: --l2-mb when given, 60 on a GPU (the H200's
 * L2), else the CPU's last-level cache capped at 32 MB (a VM often reports the host's whole shared L3); *llc_mb =
 * the reported size when the cap applied, else 0. */
double bench_cache_mb(const bench_opts *o, int is_cpu, double *llc_mb);
/* The nominal peak of the utilization tables: --peak-tflops, the H200's dense bf16 989 on a GPU, else none (0);
 * src names where it came from. */
double bench_peak_tflops(const bench_opts *o, int is_cpu, char *src, size_t n);
/* An arm's variants 0..nv-1 timed interleaved: warmup + reps rounds, each running every variant once with the
 * order rotating every round (A B, B A, ...), so each variant takes each position equally often (under a power
 * cap the position in a back-to-back sequence alone moved an identical forward by 1.6%: PERF.md, stop 13).
 * time(ctx, v) returns one sample in ms. Returns the samples [nv][reps] (dt_malloc'd; the caller frees). */
double *bench_time_interleaved(int nv, int reps, int warmup, double (*time)(void *ctx, int v), void *ctx);
/* Progress line on stderr. */
void bench_progress(const char *fmt, ...) DT_PRINTF(1, 2);

/* ---- rotating weight sets (bench_util.c) ----
 * A set of distinct Linears of one shape, enough of them that one pass exceeds the cache. */
typedef struct {
    dt_backend *be;
    dt_linear **w;
    int n, n_owned;    /* owned ones are destroyed with the set (the first n - n_owned are borrowed) */
    void **host;       /* host copies kept alive for the owned ones (CPU linears are zero-copy views) */
    int n_host;
    double mb;         /* total bytes of the distinct weights, MB */
} bench_wset;

size_t bench_src_bytes(const dt_linear_src *s);
/* The weight bytes (bench_src_bytes) of one block's Linears: "PREFIX.NAME" for each of the n names in w; a name the
 * checkpoint lacks counts 0. */
double bench_block_weight_bytes(const dt_weights *w, const char *prefix, const char *const *names, size_t n);
/* Borrow `n` existing Linears (bytes each), then add copies of `src` until bytes >= target (max 64). */
void bench_wset_init(bench_wset *ws, dt_backend *be, dt_linear **borrow, int n, const dt_linear_src *src,
                     double target_bytes);
/* A set of random dense bf16 [N, K] weights reaching target bytes (max 64 copies). */
void bench_wset_dense(bench_wset *ws, dt_backend *be, int64_t N, int64_t K, double target_bytes, uint64_t seed,
                      dt_precision prec);
void bench_wset_free(bench_wset *ws);
/* One timed pass over the set: y = x · Wᵀ for each W; returns ms per GEMM. */
double bench_wset_time(bench_wset *ws, bench_timer *tm, dt_mat y, dt_mat x);
/* The set's GEMMs under sustained load (bench_time_sustained, 2 x reps calls rotating through the set). */
bench_stat bench_wset_time_sustained(bench_wset *ws, dt_mat y, dt_mat x, int reps, int is_cpu);

/* ---- the FLUX.2 replica (bench_model.c): flux2.c's block functions on the bench's copy of the weights ---- */
typedef struct {
    flux2_double_w w;                       /* the block's weights, run by flux2_double_block as in flux2.c */
    dt_linear_src to_qkv_src, add_qkv_src;  /* the stacked Q/K/V host sources (utilization table) */
} bm_double;

typedef flux2_single_w bm_single;   /* run by flux2_single_op as in flux2.c */

typedef struct {
    dt_backend *be;
    dt_weights *w;
    flux2_config c;
    int embed;                  /* embedders / modulations / final layer loaded */
    int nd, ns;                 /* double / single blocks loaded */
    flux2_outer_w ow;           /* embedders, timestep MLP, modulation, final layer (flux2.c's) */
    bm_double *db;
    bm_single *sb;
    dt_linear_set lin;          /* every created Linear */
    int to_f32;
    /* activations for (n, t) */
    int n, t;
    flux2_acts x;               /* flux2.c's activation set (double / single buffers as blocks are loaded) */
} bm_model;

/* Load from a transformer folder: nd/ns = how many double/single blocks (-1 = all), embed = 1 to load
 * the embedders, modulations and final layer. to_f32 = 1 converts dense weights to f32 host copies. */
bm_model *bm_load(dt_backend *be, const bench_opts *o, const char *dir, int nd, int ns, int embed, int to_f32);
void bm_free(bm_model *m);
/* Allocate activations for n image + t text tokens and build the RoPE tables from the ids. */
void bm_alloc(bm_model *m, int n, int t, const float *img_ids, const float *txt_ids);
/* Upload inputs and the timestep sinusoid (needs embed). Contents of s/mods random when !embed. */
void bm_inputs(bm_model *m, const float *img, const float *txt, float timestep);
void bm_randomize(bm_model *m, uint64_t seed);
/* Device ops only (no host transfer, no allocation): capturable. */
void bm_pre(bm_model *m);                       /* timestep MLP, modulations, embedders */
void bm_double_block(bm_model *m, int i, int join);
void bm_single_op(bm_model *m, int i, int k, int split);   /* flux2_single_op on single block i */
void bm_single_block(bm_model *m, int i);                  /* its ops in order (QK norm and RoPE in one pass) */
void bm_final(bm_model *m);                     /* final norm + proj_out into m->out */
void bm_forward(bm_model *m, int nd, int ns);   /* pre + first nd doubles + first ns singles + final */

/* FLOPs of one forward and of its parts (1 MAC = 2 FLOP), in GFLOP. */
typedef struct {
    double embed, single_proj, single_out, single_attn, double_img, double_txt, double_attn, total_gemm, total_attn;
} bm_flops;
void bm_count_flops(const flux2_config *c, int n, int t, bm_flops *f);

/* ---- what the parts of a run share (bench.c) ---- */
typedef struct bench_ctx bench_ctx;
struct bench_ctx {
    const bench_opts *o;
    bench_report *r;
    const bench_family *fam;
    dt_backend *be;           /* the backend under test */
    int is_cpu;
    char *dir;                /* checkpoint folder */
    json *cfg;                /* --model: its config.json (NULL for a preset) */
    char cfg_path[4300];
    int n, t, h, w;           /* image tokens (h x w grid), text tokens */
    int reps, warmup;
    double rot_bytes;         /* rotations must exceed this many bytes (2 x cache) */
    int arm_tokens[8], n_arm_tokens;
    /* FLUX.2 (bench_flux2.c): the replica with every block, activations for (n, t), after a forward; inputs */
    bm_model *bm;
    float *img, *txt, *img_ids, *txt_ids;
    /* Krea 2 (bench_krea2.c): its replica, inputs and traces */
    struct k2_state *k2;
    /* Z-Image (bench_zimage.c): its model and inputs */
    struct zi_bench *zi;
};

/* ---- the interface of a model family: what the bench runs and asks ---- */

/* One op of the ledger's block. */
typedef struct { const char *name; int cat; } bench_op_desc;

/* A GEMM shape of the forward for the utilization table (bench_perf.c times it). */
typedef struct {
    const char *name;
    int64_t M, K, N;
    int count;                /* per forward */
    dt_linear *w[64];         /* the model's distinct Linears of this shape (borrowed; may be none) */
    int nw;
    dt_linear_src src;        /* the host source of one of them (more copies are made from it) */
    int have_src;
    int inmodel_op;           /* the ledger op running these GEMMs (-1: none); its time is split over the op's */
    int per_block;            /* shapes in proportion to per_block x isolated time; per_block = GEMMs per block */
    int fp8;                  /* the model runs them as fp8 Linears: the ceiling is the fp8 Linear */
} bench_gemm_shape;

/* The attention of one block for the utilization table. */
typedef struct {
    int hq, hkv, hd;
    dt_mat bias;              /* the model's [1, L] key-padding bias, or null data */
    int fp8;                  /* the model attends in fp8 */
    int calls;                /* attention calls per forward */
} bench_attn_shape;

/* An arm of a family: run when --arms names it (or by default). */
typedef struct { const char *name; void (*run)(bench_ctx *x); } bench_arm_entry;

struct bench_family {
    const char *name;                          /* "FLUX.2", "Krea 2" */
    const struct dt_family *family;            /* the family it measures (pipeline/family.h: presets, classes) */
    /* a run calls these in order (0 or -1 with the error set) */
    int (*setup)(bench_ctx *x);                /* geometry, checkpoint (bench_checkpoint), workload (bench_workload),
                                                * inputs, work per forward */
    int (*whole_forward)(bench_ctx *x);        /* the model's own forward timed; its replica loaded and checked */
    void (*release)(bench_ctx *x);             /* the replica and inputs freed */
    /* the ledger's block (bench_ledger.c): the model's ops of one block, in order */
    const char *block_kind;                    /* "single block", "transformer block" */
    const char *ledger_note;                   /* a sentence under the ledger table, or NULL */
    int n_ops;
    const bench_op_desc *ops;
    int op_qknorm, op_rope;                    /* op op_qknorm rotates too (one pass) in a prefix that reaches op_rope */
    int hints;                                 /* the block functions issue prefetch hints (the ledger drops them) */
    int (*blocks)(bench_ctx *x);               /* blocks of the ledger's kind loaded */
    double (*block_bytes)(bench_ctx *x);       /* weight bytes of one (0: unknown) */
    void (*op)(bench_ctx *x, int b, int k, int split);   /* op k of block b; split: QK norm and RoPE apart */
    dt_mat (*stream)(bench_ctx *x);            /* the residual stream the ops update (restored around each region) */
    void (*op_work)(bench_ctx *x, bench_op *ops);   /* GFLOP and least bytes of each op; notes on the ledger */
    void (*scaling)(bench_ctx *x);             /* block-count scaling */
    void (*shares)(bench_ctx *x);              /* the step's shares (bench_add_share), total_ms, shares_of/how */
    /* utilization (bench_perf.c) */
    int (*gemm_shapes)(bench_ctx *x, bench_gemm_shape *s, int max);
    void (*attention)(bench_ctx *x, bench_attn_shape *a);
    /* arms (bench_arms.c runs those --arms names; the list ends with a NULL name) */
    const bench_arm_entry *arms;
    /* report (bench_report.c prints the common sections around these) */
    void (*md_head)(const bench_report *r, FILE *f);      /* title, setup table, whole forward */
    void (*md_scaling)(const bench_report *r, FILE *f);
    void (*json_head)(const bench_report *r, FILE *f);    /* setup, forward and power lines */
    void (*json_scaling)(const bench_report *r, FILE *f);
};
extern const bench_family bench_flux2_family, bench_krea2_family, bench_zimage_family;
/* The bench family of a registry family (bench.c; NULL when it has none). */
const bench_family *bench_family_of(const struct dt_family *f);

/* ---- helpers of the families' set-up (bench.c) ---- */
/* The synthetic checkpoint DIR = cache/KEY (the cache: --cache-dir, else $TMPDIR/ditrun-bench-cache): reused when
 * complete (unless --fresh), else written by write(x, folder) into a private folder and renamed into place (so
 * concurrent runs never see half a checkpoint); r->synth_s its time. Returns DIR (malloc'd) or NULL. */
char *bench_checkpoint(bench_ctx *x, const char *key, int (*write)(bench_ctx *x, const char *dir));
/* Remove a checkpoint folder the bench wrote (its known files, then the folder; text_encoder/ and vae/ first). */
void bench_remove_checkpoint(const char *dir);
/* The workload: each of image size, text tokens, repetitions and warm-up from the options, else the defaults for
 * the backend: CUDA 1024 px, 512 tokens, 20 reps, 3 warm-up; a CPU gets the family's smaller cpu_dflt ones (and a
 * note saying so). arm_tokens_cpu > 0: the quantized-path arm's token counts too (CUDA 256..16384, that on a CPU).
 * Sets x's n, t, h, w, reps, warmup, rot_bytes and the report's workload, cache and peak. 0 or -1 (bad size). */
typedef struct { int img_size, txt, reps, warmup; } bench_workload_base;
int bench_workload(bench_ctx *x, const bench_workload_base *cpu_dflt, int arm_tokens_cpu);
const char *bench_fmt_name(int format);

/* ---- the parts of a run (generic over the family) ---- */
int bench_ledger(bench_ctx *x);   /* bench_ledger.c: prefix ledger, then the family's block scaling and shares */
int bench_perf(bench_ctx *x);     /* bench_perf.c: utilization (GEMM shapes, attention, copy bandwidth) */
int bench_arms(bench_ctx *x);     /* bench_arms.c: the family's interleaved A/B arms */

/* Ops 0..last of block b as the model runs them (QK norm and RoPE in one pass once the prefix reaches RoPE). */
void bench_block_prefix(bench_ctx *x, int b, int last);
/* Timed points: warmup + reps rounds, each running run(ud, p) for p = 0..np-1 between two events after
 * prepare(ud, p) (may be NULL; outside the timing); out[p] their statistics. */
void bench_time_points(bench_ctx *x, int np, void (*prepare)(void *ud, int p), void (*run)(void *ud, int p), void *ud,
                       bench_stat *out);
/* Least-squares slope of ys over xs (n points; 0 when fewer than 2 distinct xs). */
double bench_slope(const double *xs, const double *ys, int n);
/* Block-count scaling of a stack of nl identical blocks: run(ud, k) runs the first k blocks on the stream live, which
 * is restored from saved (same shape) before each timing, outside it, and once more at the end; the first
 * {1, nl/4, nl/2} blocks are timed here, the whole stack is `all` (timed with the whole forward). */
void bench_block_scaling(bench_ctx *x, int nl, dt_mat live, dt_mat saved, bench_stat all,
                         void (*run)(void *ud, int blocks), void *ud, bench_block_scale *out);
/* Its Markdown section (heading "Ledger: block-count scaling (WHAT)") and JSON lines (one "scale" per point and a
 * "blocks" line with the slope beside ledger_ms, the prefix ledger's block); nothing when it has no points. */
void bench_md_block_scaling(FILE *f, const bench_block_scale *s, double ledger_ms, const char *what);
void bench_json_block_scaling(FILE *f, const bench_block_scale *s, double ledger_ms);
/* A share row (bounded by the table) with its percentage of r->total_ms. */
void bench_add_share(bench_report *r, const char *name, double ms, int level);
/* The ledger's op times summed by category (cat[BENCH_CAT_GEMM / ATTN / ELEM]). */
void bench_ledger_by_cat(const bench_report *r, double cat[3]);
/* The last rows of a family whose forward is blocks plus a rest: the rest (rest_ms: the forward less its blocks
 * device-only, row rest_name) and the unexplained remainder (total - blocks_ledger_ms - rest_ms, row remainder_name),
 * its share set in r. */
void bench_shares_rest(bench_report *r, double blocks_ledger_ms, double rest_ms, const char *rest_name,
                       const char *remainder_name);

/* ---- the A/B-arm runner (bench_arms.c) ---- */
typedef struct {
    const char *arm;
    char what[96];
    const char *names[4];
    int nv;
    double (*time)(void *ctx, int v);            /* one timed sample of variant v (ms) */
    void (*output)(void *ctx, int v, float *out); /* the comparable output of variant v */
    size_t out_n;
    double tol;
    unsigned differ;                             /* variants that compute something else by design (bit v) */
    char note[200];
} arm_spec;
/* The variants timed interleaved, each B row compared with variant 0's output. */
void run_arm(bench_ctx *x, arm_spec *a, void *ctx);
void skip_arm(bench_report *r, const char *arm, const char *a, const char *b, const char *why);
/* A second backend like the one under test with other options (exits on failure). */
dt_backend *bench_backend_variant(bench_ctx *x, dt_backend_opts o);
/* FLUX.2's arms (bench_arms.c; qpath and fp8 in bench_arms_gemm.c). */
extern const bench_arm_entry bench_flux2_arms[];
void bench_arm_qpath(bench_ctx *x);
void bench_arm_fp8(bench_ctx *x);

/* Attention arms both families run (bench_arms_attn.c): native grouped-query attention vs K/V repeated to every
 * query head, on [L, .] random Q/K/V with the key bias (null data: none); nv = 3 adds the attention alone on
 * pre-repeated K/V. */
void bench_arm_gqa(bench_ctx *x, int64_t L, int hq, int hkv, int hd, dt_mat bias, int nv, const char *how);
/* The text key-padding mask [t] (1 = real token) as the [1, L] bias vs compacted keys vs no mask (arm "mask"). */
void bench_arm_key_padding(bench_ctx *x, int hq, int hkv, int hd, dt_mat bias, const uint8_t *mask);

#endif
