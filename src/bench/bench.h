/* bench.h — `ditrun bench`: one DiT denoise step measured from the inside, on any backend, for both model
 * families (FLUX.2-klein, Krea 2 and Z-Image).
 *
 * A bench run loads a checkpoint (a real one, or a synthetic one written at a preset or custom geometry and
 * cached in $TMPDIR) and produces a bench_report:
 *   - whole forward: the model's own forward (flux2_forward / krea2_forward, wall clock incl. host I/O) and
 *     the model's block functions run device-only on the bench's copy of the weights (FLUX.2: the whole
 *     forward, its output compared with flux2_forward's; Krea 2: the transformer blocks, checked against the
 *     model's traced block outputs, with and without the text mask);
 *   - ledger: cumulative-prefix timing of the ops inside one block (FLUX.2's single-stream block, Krea 2's
 *     transformer block), block-count scaling, and the shares of the step that add up to 100 %;
 *   - utilization: TFLOPS of every GEMM shape (in-model and isolated) and attention next to ceilings
 *     measured in the same run (dense bf16 GEMM at each shape in bursts and, on a GPU, under sustained load;
 *     device copy bandwidth) and a nominal peak; the floor those ceilings give;
 *   - the GPU's clock and power right after each timed forward (power_sample);
 *   - A/B arms, interleaved in one process (FLUX.2: quantized paths, RoPE bf16/fp32, masks, cuDNN, fp8,
 *     GQA, CUDA graph, prefetch, threads; Krea 2: GQA and key-padding variants of its attention).
 * Every timed region ends with a device synchronization (backend events, or sync + wall clock).
 */
#ifndef DT_BENCH_H
#define DT_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "backends/backend.h"
#include "backends/backend_ext.h"
#include "models/flux2.h"
#include "models/krea2.h"
#include "models/zimage.h"

enum { BENCH_FMT_F32 = 1, BENCH_FMT_BF16, BENCH_FMT_Q4, BENCH_FMT_Q8 };
enum { BENCH_LEDGER = 1, BENCH_UTIL = 2, BENCH_ARMS = 4, BENCH_ALL = 7 };

typedef struct {
    const char *preset;        /* "klein-4b", "klein-9b", "tiny", "krea2", "krea2-tiny" (NULL with model_dir) */
    const char *model_dir;     /* real checkpoint instead of synthetic weights */
    /* geometry overrides (-1 = preset value; Krea 2: heads or hidden (D = heads x 128), kv_heads, n_single =
     * transformer blocks, mlp_ratio) */
    int hidden, heads, kv_heads, n_double, n_single;
    double mlp_ratio;          /* <= 0: preset */
    int format, group;         /* BENCH_FMT_*, quantization group (synthetic weights) */
    int image_size, text_tokens;   /* -1: backend default (CUDA 1024 / 512, CPU scaled down) */
    int reps, warmup;          /* -1: backend default */
    int arm_tokens[8], n_arm_tokens;   /* image tokens of the quantized-path arm (0 = default list) */
    double l2_mb;              /* cache size the rotations must exceed (<= 0: 60 on CUDA, LLC on CPU) */
    double peak_tflops;        /* nominal peak (<= 0: table) */
    const char *json_path;     /* JSON lines output or NULL */
    const char *cache_dir;     /* synthetic checkpoint cache (NULL: $TMPDIR or /tmp) */
    int fresh;                 /* rewrite the synthetic checkpoint */
    const char *backend;       /* "auto", "cpu", "cuda" */
    dt_backend_opts be;
    dt_precision precision;    /* --precision: the DiT blocks' Linears (the model's load options) */
    dt_precision attn_precision;   /* --attn-precision: the DiT blocks' attention */
    unsigned sections;         /* BENCH_LEDGER | BENCH_UTIL | BENCH_ARMS */
    const char *arms;          /* comma list of arms to run (qpath, rope, attention, graph, threads, fp8); NULL = all */
    uint64_t seed;
} bench_opts;

typedef struct { double med, min, max, p10, p90; int n; } bench_stat;
/* The GPU's clock and power right after each timed forward (n = 0: the backend cannot tell). */
typedef dt_power_summary bench_power;

enum { BENCH_CAT_GEMM = 0, BENCH_CAT_ATTN, BENCH_CAT_ELEM };

#define BENCH_MAX_OPS 16
typedef struct {
    const char *name;          /* "adaLN norm", "proj GEMM", ... */
    int cat;                   /* BENCH_CAT_* */
    bench_stat prefix;         /* time of the prefix ending with this op, per block (ms) */
    double ms;                 /* increment: median(prefix k) - median(prefix k-1) */
    bench_stat direct;         /* the op alone between two events (QK norm and RoPE as separate passes) */
    double ledger_ms;          /* what the shares and in-model rates use: ms, or (when an increment is
                                * negative, i.e. noise) the direct time scaled so the block sums to its prefix */
    double gflop;              /* work of the op per block (0 for elementwise) */
    double gbytes;             /* least bytes an elementwise op moves per block (read + write), 0 if n/a */
} bench_op;

typedef struct {
    char name[80];
    double ms, share;          /* share of the step's total, % */
    int level;                 /* 0 = category, 1 = detail line (not summed) */
} bench_share;

typedef struct {
    char name[48];
    int64_t M, K, N;
    int count;                 /* how many of these GEMMs one forward runs */
    double gflop;              /* one GEMM */
    double inmodel_ms;         /* from the ledger (< 0: not measured in-model) */
    bench_stat iso, ceil;      /* isolated with the model's weights / dense random weights, per GEMM */
    int ceil_fp8;              /* the ceiling is the fp8 Linear (e4m3 GEMM + its activation pass; the shapes of
                                * --precision fp8's Linears), else the dense bf16 GEMM */
    bench_stat ceil_sus;       /* the dense ceiling under sustained load (back to back after a heater; the
                                * power state a forward runs in), per GEMM; n = 0 when not measured */
    int iso_bufs, ceil_bufs;   /* distinct weight buffers rotated */
    double iso_mb, ceil_mb;    /* their total size */
} bench_gemm;

typedef struct {
    char arm[32];              /* "qpath", "rope", "mask", "gqa", "graph", "threads" */
    char what[96];             /* shape / workload */
    char a[24], b[24];         /* variant names (A = reference) */
    bench_stat sa, sb;         /* ms per sample */
    double ratio;              /* median B / median A */
    double maxdiff, ref_absmax;/* max |A - B| of the outputs, max |A| */
    double tol;                /* agreement tolerance relative to ref_absmax (INFINITY: differ by design) */
    int skipped;
    char note[200];
} bench_arm;

/* What a FLUX.2 run measures beyond the common part (bench_flux2.c). */
typedef struct { int nd, ns; bench_stat t; } bench_scale;
typedef struct {
    flux2_config c;
    int kv_heads;                      /* kv heads of the GQA arm */
    bench_stat fwd_model, fwd_dev;     /* flux2_forward wall (ms), the block functions device-only (ms) */
    double fwd_model_warm_ms, fwd_dev_warm_ms;
    double fwd_maxdiff, fwd_absmax;    /* max |device-only out - flux2_forward out|, max |out| */
    double gflop_gemm, gflop_attn;     /* per forward */
    bench_scale scale[8];              /* device-only forwards with (double, single) blocks */
    int n_scale;
    double embed_ms, double_ms, single_slope_ms;
} bench_flux2_part;

/* Block-count scaling of a stack of identical blocks (Krea 2, Z-Image; bench_block_scaling): the first
 * blocks[i] blocks took t[i] device-only, the last point being the whole stack; slope_ms is one block's cost in it. */
#define BENCH_MAX_SCALE 6
typedef struct {
    int n;
    int blocks[BENCH_MAX_SCALE];
    bench_stat t[BENCH_MAX_SCALE];
    double slope_ms;
} bench_block_scale;

/* What a Krea 2 run measures beyond the common part (bench_krea2.c). */
typedef struct {
    krea2_config c;
    int n_valid;                           /* text tokens the mask keeps */
    double gflop_forward_valid;            /* what the masked forward computes: krea2_text_rows(n_valid) text rows */
    double weight_gb;
    bench_stat fwd_mask, fwd_nomask;       /* krea2_forward wall clock (ms), with / without the text mask */
    bench_stat blocks_dev;                 /* every transformer block, device-only (ms) */
    double fwd_mask_warm_ms, fwd_nomask_warm_ms;
    int out_finite;                        /* both outputs finite */
    double out_absmax, mask_effect;        /* max |out|, max |out(mask) - out(no mask)| */
    int replica_checked;                   /* blocks 1..L-1 fed the model's block.0 output */
    double replica_maxdiff, replica_absmax;
    double gflop_block_gemm, gflop_block_attn;   /* one transformer block */
    double gflop_text, gflop_other;              /* text fusion; txt_in + img_in + timestep + final layer */
    bench_block_scale scale;                     /* block-count scaling */
    /* the rest of the image (a synthetic preset's text encoder and VAE, or a --model inside a pipeline folder) */
    int parts;                             /* measured */
    char parts_note[200];                  /* why not, when not */
    char parts_src[320];                   /* the folder of text_encoder/ and vae/ */
    int te_tokens, te_valid, te_layers;    /* encoder rows (the prompt block before the drop), real ones, layers run */
    int lat_h, lat_w, vae_scale;           /* the VAE's latent grid; image pixels per latent pixel */
    bench_stat te_enc, vae_dec;            /* text encode (one prompt) and VAE decode to 8-bit RGB, wall ms */
    double gflop_te, gflop_vae;
} bench_krea2_part;

/* What a Z-Image run measures beyond the common part (bench_zimage.c). */
typedef struct {
    zimage_config c;
    double weight_gb;
    int64_t rows;                          /* joint stream rows: image and caption each padded to 32 */
    bench_stat fwd;                        /* zimage_forward wall clock (ms) */
    bench_stat blocks_dev;                 /* every joint block, device-only (ms) */
    double fwd_warm_ms;
    int out_finite;
    double out_absmax;
    double gflop_block_gemm, gflop_block_attn;   /* one joint block */
    double gflop_refiners, gflop_other;          /* the 2 x n_refiner refiner blocks; embedders, adaLN, final */
    bench_block_scale scale;                     /* block-count scaling */
} bench_zimage_part;

typedef struct bench_family bench_family;

#define BENCH_MAX_NOTES 24
typedef struct {
    const bench_family *family;        /* the model family measured (its own sections of the report) */
    /* setup */
    char backend[16], source[320], fmt[96], preset[32];
    char precision[64];   /* "Linears bf16, attention bf16" (--precision / --attn-precision; FLUX.2) */
    int n_img, n_txt, image_size, reps, warmup;
    double synth_s, load_s, l2_mb;
    bench_power power;                 /* the GPU's state right after each timed forward pair */
    /* ledger: one block's ops */
    bench_op ops[BENCH_MAX_OPS];
    int n_ops, prefix_blocks;
    double block_ledger_ms;            /* the block's prefix total (= sum of the op increments) */
    bench_share shares[20];
    int n_shares;
    double remainder_ms, remainder_share, total_ms;
    char shares_basis[120];
    char shares_of[64];                /* what total_ms is ("device-only forward") */
    char shares_how[320];              /* how the blocks are counted (the shares' explanation) */
    /* utilization */
    bench_gemm gemm[16];
    int n_gemm;
    bench_stat attn_iso, attn_sus;     /* attention alone: bursts (synchronized per call) / sustained */
    int attn_calls;                    /* attention calls per forward (the floor's count) */
    int attn_fp8;                      /* attn_iso/attn_sus timed the fp8 attention (--attn-precision fp8) */
    double attn_gflop, attn_inmodel_ms;
    char attn_what[96];                /* the attention row's name ("attention", "attention, GQA 48/12 + mask") */
    bench_stat copy;
    double copy_bytes, copy_gbs;
    double peak_tflops;
    char peak_src[64];
    double fwd_gflop, fwd_ms;          /* work of one forward; the timed forward the utilization row shows */
    char fwd_what[64];                 /* that forward's name */
    double floor_ms;                   /* what the floor is compared with (<= 0: no floor line) */
    char floor_what[64];
    /* arms */
    bench_arm arms[48];
    int n_arms;
    char notes[BENCH_MAX_NOTES][240];
    int n_notes;
    double total_s;
    double mem_peak_gb;        /* backend memory peak (allocations through the backend) */
    union {                    /* the family's own numbers */
        bench_flux2_part flux2;
        bench_krea2_part krea2;
        bench_zimage_part zimage;
    };
} bench_report;

void bench_opts_default(bench_opts *o);
/* Run the bench (progress on stderr): FLUX.2 or Krea 2, from the preset or the checkpoint's config.json.
 * 0 ok, -1 error (dt_last_error). */
int bench_run(const bench_opts *o, bench_report *r);
/* Markdown tables. */
void bench_report_markdown(const bench_report *r, FILE *f);
/* Every number as JSON lines. 0 ok, -1 error. */
int bench_report_json(const bench_report *r, const char *path);

#endif
