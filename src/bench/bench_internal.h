/* bench_internal.h — shared pieces of the bench: timers that end with a device synchronization,
 * statistics, random device buffers, rotating weight sets, and the device-only replica of the
 * FLUX.2 forward (bench_model.c) that the ledger, the utilization and the arms issue ops from. */
#ifndef DT_BENCH_INTERNAL_H
#define DT_BENCH_INTERNAL_H

#include "bench.h"
#include "io/json.h"
#include "io/weights.h"
#include "models/linear_set.h"

/* ---- timing (bench_util.c) ---- */
typedef struct {
    dt_backend *be;
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
/* Sustained timing (a GPU at the power state of a long run, not of a short burst): op(ud, i) runs back to back
 * for heat_ms (a synchronization every 8 calls), then reps more calls each between two events with no
 * synchronization between them; their statistic. n = 0 on a CPU backend (no power state to speak of) or one
 * without events. */
bench_stat bench_time_sustained(dt_backend *be, int is_cpu, void (*op)(void *ud, int i), void *ud, double heat_ms,
                                int reps);
#define BENCH_HEAT_MS 200.0
/* Fill m with normal(0, sd) values (never zeros): host Philox normals uploaded. */
void bench_fill_randn(dt_backend *be, dt_mat m, uint64_t seed, float sd);
double bench_max_abs_diff(const float *a, const float *b, size_t n);
double bench_max_abs(const float *a, size_t n);
/* Add a note to the report (printed under the tables). */
void bench_note(bench_report *r, const char *fmt, ...) DT_PRINTF(2, 3);
/* JSON-lines fields: "key":"escaped string"; ,"key":number (null when not finite); the six fields
 * PREFIX_{median,p10,p90,min,max}_ms and PREFIX_n of a statistic. */
void bench_jstr(FILE *f, const char *key, const char *v);
void bench_jnum(FILE *f, const char *key, double v);
void bench_jstat(FILE *f, const char *prefix, bench_stat s);
/* JSON lines shared by the FLUX.2 and Krea 2 reports: copy bandwidth, arms, notes. */
void bench_json_tail(FILE *f, const bench_stat *copy, double copy_bytes, double copy_gbs, const bench_arm *arms,
                     int n_arms, const char (*notes)[240], int n_notes);
/* Markdown pieces shared by the FLUX.2 and Krea 2 reports (bench_report.c): the prefix ledger's table (rows and
 * the total row labelled total_label), the GEMM utilization rows (with their header), and the A/B arms and notes
 * sections. */
void bench_md_op_ledger(FILE *f, const bench_op *ops, int n, double block_ms, double copy_gbs, const char *total_label);
void bench_md_gemms(FILE *f, const bench_gemm *gemm, int n, double l2_mb, double peak);
void bench_md_arms_notes(FILE *f, const bench_arm *arms, int n_arms, const char (*notes)[240], int n_notes);
/* The GPU-state line (nothing when p->n = 0); what = the runs it follows. */
void bench_md_power(FILE *f, const bench_power *p, const char *what);
/* Issue 7's floor: every GEMM shape x its count at its ceiling (dense bf16, or the fp8 Linear for rows with
 * ceil_fp8) plus attn_calls attentions at the isolated rate (attn_fp8: of the fp8 attention), from the burst and (when every one was measured) the sustained ceilings, and the timed ms against each;
 * what = the name of the timed thing. Nothing without GEMMs or attention. */
void bench_md_floor(FILE *f, const bench_gemm *gemm, int n, bench_stat attn_iso, bench_stat attn_sus, int attn_calls,
                    int attn_fp8, double ms, const char *what);
void bench_json_power(FILE *f, const bench_power *p);
/* The utilization table's GEMM rows as JSON lines (type "gemm"). */
void bench_json_gemms(FILE *f, const bench_gemm *gemm, int n);
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
/* The workload both benches derive alike. Each of image size, text tokens, repetitions and warm-up comes from the
 * options, else from the defaults for the backend: CUDA 1024 px, 512 tokens, 20 reps, 3 warm-up; a CPU gets the
 * caller's smaller `cpu_dflt` ones and `scaled` lists the flags those amount to (" --image-size 64 ...", "" when
 * the options set everything). Then the image size is checked (a positive multiple of 16, else -1 and the error
 * set) and turned into an h x w latent grid; the cache size the rotations exceed and the nominal peak come from
 * bench_cache_mb and bench_peak_tflops. */
typedef struct {
    int img_size, txt, reps, warmup;   /* defaults for a CPU backend (bench_workload_resolve) or the result */
} bench_workload_base;
typedef struct {
    bench_workload_base v;   /* the values used */
    int h, w, n;             /* latent grid (16 px per token) and image tokens */
    char scaled[300];        /* CPU: the flags the scaled-down defaults amount to */
    double l2_mb, llc_mb;    /* bench_cache_mb: the size (MB) and the CPU's reported LLC when capped (else 0) */
    double rot_bytes;        /* bytes one rotation exceeds: 2 x l2_mb */
    double peak;             /* bench_peak_tflops (0: none) */
    char peak_src[64];
} bench_workload;
int bench_workload_resolve(const bench_opts *o, int is_cpu, const bench_workload_base *cpu_dflt, bench_workload *w);
/* Progress line on stderr. */
/* An arm's variants 0..nv-1 timed interleaved: warmup + reps rounds, each running every variant once with the
 * order rotating every round (A B, B A, ...), so each variant takes each position equally often (under a power
 * cap the position in a back-to-back sequence alone moved an identical forward by 1.6%: PERF.md, stop 13).
 * time(ctx, v) returns one sample in ms. Returns the samples [nv][reps] (dt_malloc'd; the caller frees). */
double *bench_time_interleaved(int nv, int reps, int warmup, double (*time)(void *ctx, int v), void *ctx);
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

/* ---- the device-only replica of the FLUX.2 forward (bench_model.c) ---- */
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

/* Stages of a single block for the cumulative-prefix ledger: the block's ops in order. */
enum {
    BM_ST_NORM = FLUX2_SB_NORM,     /* adaLN: layernorm_mod */
    BM_ST_PROJ = FLUX2_SB_PROJ,     /* fused projection GEMM [L, D] -> [L, 3D+2F] */
    BM_ST_QKNORM = FLUX2_SB_QKNORM, /* per-head RMSNorm of Q and K (head_norm_rope, no rotation) */
    BM_ST_ROPE = FLUX2_SB_ROPE,     /* the same op with the rotation (replaces the previous one) */
    BM_ST_ATTN = FLUX2_SB_ATTN,     /* attention */
    BM_ST_ACT = FLUX2_SB_ACT,       /* SwiGLU */
    BM_ST_OUT = FLUX2_SB_OUT,       /* output GEMM [L, D+F] -> [L, D] (+ gated residual when fused) */
    BM_ST_RESID = FLUX2_SB_RESID,   /* gated residual (when not fused) */
    BM_ST_FULL = FLUX2_SB_RESID
};

/* Load from a transformer folder: nd/ns = how many double/single blocks (-1 = all), embed = 1 to load
 * the embedders, modulations and final layer. to_f32 = 1 converts dense weights to f32 host copies. */
bm_model *bm_load(dt_backend *be, const char *dir, int nd, int ns, int embed, int to_f32);
void bm_free(bm_model *m);
/* Allocate activations for n image + t text tokens and build the RoPE tables from the ids. */
void bm_alloc(bm_model *m, int n, int t, const float *img_ids, const float *txt_ids);
/* Upload inputs and the timestep sinusoid (needs embed). Contents of s/mods random when !embed. */
void bm_inputs(bm_model *m, const float *img, const float *txt, float timestep);
void bm_randomize(bm_model *m, uint64_t seed);
/* Device ops only (no host transfer, no allocation): capturable. */
void bm_pre(bm_model *m);                       /* timestep MLP, modulations, embedders */
void bm_double_block(bm_model *m, int i, int join);
void bm_single_stages(bm_model *m, int i, int last_stage);
void bm_single_op(bm_model *m, int i, int k, int split);
void bm_final(bm_model *m);                     /* final norm + proj_out into m->out */
void bm_forward(bm_model *m, int nd, int ns);   /* pre + first nd doubles + first ns singles + final */

/* FLOPs of one forward and of its parts (1 MAC = 2 FLOP), in GFLOP. */
typedef struct {
    double embed, single_proj, single_out, single_attn, double_img, double_txt, double_attn, total_gemm, total_attn;
} bm_flops;
void bm_count_flops(const flux2_config *c, int n, int t, bm_flops *f);

/* ---- what the parts of a run share (bench.c) ---- */
typedef struct {
    const bench_opts *o;
    bench_report *r;
    dt_backend *be;           /* the backend under test */
    int is_cpu;
    bm_model *bm;             /* replica with every block, activations for (n, t), after a forward */
    const char *dir;          /* checkpoint folder */
    int n, t, h, w;           /* image tokens (h x w grid), text tokens */
    float *img, *txt, *img_ids, *txt_ids;
    int reps, warmup;
    double rot_bytes;         /* rotations must exceed this many bytes (2 x cache) */
    int arm_tokens[8], n_arm_tokens;
} bench_ctx;

int bench_ledger(bench_ctx *x);   /* bench_ledger.c: prefix ledger, block scaling, shares */
int bench_perf(bench_ctx *x);     /* bench_perf.c: utilization (GEMM shapes, attention, copy bandwidth) */
int bench_arms(bench_ctx *x);     /* bench_arms.c: interleaved A/B arms */

#endif
