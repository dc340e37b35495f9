/* bench_krea2.h — `ditrun bench --preset krea2`: one Krea 2 denoise step measured from the inside.
 *
 * A run loads a Krea 2 checkpoint (synthetic at a preset geometry, cached like the FLUX.2 ones, or
 * --model DIR) and reports:
 *   - whole forward: krea2_forward (wall clock incl. host I/O) with the text key-padding mask and
 *     without it, interleaved; the device-only replica of the transformer blocks (bench_krea2.c),
 *     checked against the model's own block outputs (trace);
 *   - ledger: cumulative-prefix timing of the ops of one transformer block (modulated norm, q/k/v +
 *     gate GEMMs, QK norm, RoPE, attention with GQA + mask, gate multiply, out GEMM, residual, second
 *     modulated norm, MLP GEMMs, SwiGLU, down GEMM, residual), block-count scaling, and the shares of
 *     the step (GEMMs, attention, elementwise, text fusion + embedders + host work, remainder) = 100 %;
 *   - utilization: TFLOPS of the block's GEMM shapes (in-model, isolated, dense bf16 ceiling) and of
 *     attention, device copy bandwidth;
 *   - A/B arms: native GQA vs repeated KV heads; key-padding bias vs compacted keys vs no mask (the
 *     backends have no dense [Lq, Lk] additive mask op, so a dense mask cannot be timed; see notes).
 */
#ifndef DT_BENCH_KREA2_H
#define DT_BENCH_KREA2_H

#include "bench.h"
#include "models/krea2.h"

#define K2B_N_OPS 13
#define K2B_MAX_SCALE 6

typedef struct {
    /* setup */
    char backend[16], source[320], fmt[96], preset[32];
    krea2_config c;
    int n_img, n_txt, n_valid, image_size, reps, warmup;
    double synth_s, load_s, l2_mb, weight_gb;
    /* whole forward */
    bench_stat fwd_mask, fwd_nomask;       /* krea2_forward wall clock (ms), with / without the text mask */
    bench_stat blocks_dev;                 /* replica: every transformer block, device-only (ms) */
    double fwd_mask_warm_ms, fwd_nomask_warm_ms;
    bench_power power;                     /* the GPU's state right after each timed forward pair */
    int out_finite;                        /* both outputs finite */
    double out_absmax, mask_effect;        /* max |out|, max |out(mask) - out(no mask)| */
    int replica_checked;                   /* replica blocks 1..L-1 fed the model's block.0 output */
    double replica_maxdiff, replica_absmax;
    double gflop_block_gemm, gflop_block_attn;   /* one transformer block */
    double gflop_text, gflop_other;              /* text fusion; txt_in + img_in + timestep + final layer */
    /* ledger */
    bench_op ops[K2B_N_OPS];
    int n_ops, prefix_blocks;
    double block_ledger_ms;
    char shares_basis[120];
    int scale_n[K2B_MAX_SCALE];
    bench_stat scale_t[K2B_MAX_SCALE];
    int n_scale;
    double block_slope_ms;
    bench_share shares[16];
    int n_shares;
    double total_ms, remainder_ms, remainder_share;
    /* utilization */
    bench_gemm gemm[8];
    int n_gemm;
    bench_stat attn_iso, attn_sus;         /* attention alone: bursts / sustained (back to back after a heater) */
    double attn_gflop, attn_inmodel_ms;
    bench_stat copy;
    double copy_bytes, copy_gbs;
    double peak_tflops;
    char peak_src[64];
    /* arms */
    bench_arm arms[12];
    int n_arms;
    char notes[BENCH_MAX_NOTES][240];
    int n_notes;
    double total_s;
    double mem_peak_gb;
} bench_k2_report;

/* Presets that go to this bench: "krea2", "krea2-tiny". */
int bench_is_krea2_preset(const char *preset);
/* Run (progress on stderr). Geometry overrides from o: heads (D = heads x 128), hidden, kv_heads,
 * n_single (= transformer blocks), mlp_ratio. 0 ok, -1 error (dt_last_error). */
int bench_krea2_run(const bench_opts *o, bench_k2_report *r);
void bench_krea2_markdown(const bench_k2_report *r, FILE *f);
int bench_krea2_json(const bench_k2_report *r, const char *path);

#endif
