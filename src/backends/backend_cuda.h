/* backend_cuda.h — the CUDA backend's own options and facts, for the callers that choose among its variants
 * (CLI, API, bench, tests). Plain C, no CUDA types: it compiles in builds without CUDA too (the stub answers).
 *
 * dt_cuda_opts is given at creation through dt_backend_opts.cuda (NULL: dt_cuda_opts_from_env). The backend
 * keeps its own copy; dt_backend_cuda_opts returns it, so tests and bench arms can pin a variant between two
 * ops. Fields marked "per call" are read by each op and may be changed that way; "per Linear" ones when a
 * Linear is created; the rest only at creation. No field is read from the environment by the backend: the few
 * environment variables that remain are mapped in one place, dt_cuda_opts_from_env (backend_env.c), and listed
 * in docs/environment.md. */
#ifndef DT_BACKEND_CUDA_H
#define DT_BACKEND_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which attention kernel runs a bf16 attention with head dim 128 (other shapes take the generic path). */
typedef enum {
    DT_CUDA_ATTN_AUTO = 0,   /* cuDNN's fused SDPA where it measured faster (no key bias) and loads, else ours */
    DT_CUDA_ATTN_OWN,        /* our own flash kernel (sm_90a paths: wgmma with ping-pong; others: mma.sync) */
    DT_CUDA_ATTN_CUDNN,      /* cuDNN's fused SDPA; fatal when cuDNN cannot be loaded */
    DT_CUDA_ATTN_MMA,        /* our portable mma.sync kernel even on sm_90 (what other GPUs run; for tests) */
} dt_cuda_attn;

/* Which of our kernels the backend may take (--kernels; DITRUN_CUDA_KERNELS for the test suite). */
typedef enum {
    DT_CUDA_KERNELS_AUTO = 0,   /* the card's best: the sm_90a kernels (wgmma, TMA, setmaxnreg) on compute 9.0 */
    DT_CUDA_KERNELS_PORTABLE,   /* exactly the paths a non-Hopper card (Ampere, Ada, Blackwell) takes, on any card */
} dt_cuda_kernels;

/* The op families whose CUDA path can depend on the card (dt_cuda_ops_path). */
typedef enum {
    DT_CUDA_OPS_ATTENTION = 0,  /* bf16 attention, head dim 128 */
    DT_CUDA_OPS_QLINEAR,        /* 4/8-bit quantized Linears (qpath: mixed-input GEMM, qmm, dequantize + cuBLASLt) */
    DT_CUDA_OPS_FP8,            /* fp8 Linears (--precision fp8, fp8 files) */
    DT_CUDA_OPS_ELEMENTWISE,    /* norms, RoPE, activations, gated residuals, copies */
    DT_CUDA_OPS_IMAGE,          /* VAE convolutions, group norm, upsampling, RGB8 output */
    DT_CUDA_OPS_GGML,           /* GGUF block dequantization */
    DT_CUDA_OPS_COUNT
} dt_cuda_ops;

/* The kind of path an op family takes. */
typedef enum {
    DT_CUDA_PATH_SM90A = 0,     /* our Hopper kernels (compiled for sm_90a only) */
    DT_CUDA_PATH_PORTABLE,      /* our kernels for every card from sm_80 on */
    DT_CUDA_PATH_CUBLASLT,      /* NVIDIA's library, which picks its kernels for the card */
    DT_CUDA_PATH_NONE,          /* not available on this card: asking for it is a clear error */
} dt_cuda_path;

/* The one place that decides whether the sm_90a kernels may run: compute capability exactly 9.0 (sm_90a code
 * runs on no other card) and kernels not DT_CUDA_KERNELS_PORTABLE. Pure functions (backends/cuda_paths.c),
 * present in builds without CUDA too. */
int dt_cuda_hopper_paths(int cc_major, int cc_minor, dt_cuda_kernels kernels);
/* fp8 (e4m3) GEMMs through cuBLASLt: compute capability 8.9 (Ada) or newer. */
int dt_cuda_fp8_supported(int cc_major, int cc_minor);
/* The path of an op family on a card of this compute capability under this kernel mode. */
dt_cuda_path dt_cuda_ops_path(dt_cuda_ops ops, int cc_major, int cc_minor, dt_cuda_kernels kernels);
/* Words for -v and `ditrun info --devices`: the family ("attention"), the path in a line. */
const char *dt_cuda_ops_name(dt_cuda_ops ops);
const char *dt_cuda_path_text(dt_cuda_ops ops, dt_cuda_path path);
/* "auto" / "portable" and back (-1 with dt_last_error for another name). */
const char *dt_cuda_kernels_name(dt_cuda_kernels k);
int dt_cuda_kernels_from_name(const char *name, dt_cuda_kernels *out);

typedef struct dt_cuda_opts {
    /* ---- read at creation ---- */
    dt_cuda_kernels kernels;  /* AUTO, or PORTABLE: the paths of a non-Hopper card (dt_cuda_hopper_paths) */
    char cudnn_lib[512];      /* cuDNN library to load ("": the system's libcudnn.so.9; the first backend of a
                               * process that loads cuDNN decides) */
    int cudnn_debug;          /* 1: print each cuDNN plan build and rejection */
    int fp8_attn_unsafe;      /* 1: offer attention_fp8 even with a cuDNN older than 9.19, whose fp8 SDPA gave
                               * intermittently wrong outputs (NOTES.md; measurements only) */
    int gemm_tune;            /* 1: time cuBLASLt's top candidates once per large GEMM shape (default); 0: its
                               * heuristic's first pick */
    char gemm_cache[512];     /* file persisting the tuned choices ("": in memory only) */
    int no_prefetch;          /* 1: dequantize each transient 4/8-bit Linear right before its GEMM (no hints, no
                               * low-priority stream) */
    int serial;               /* 1: ignore stream_switch (one queue; the two-queue schedule's A/B) */
    int trace;                /* per-op trace printed at destroy: 0 off, 1 host time, 2 host + device time
                               * (synchronizing), 3 device time in the running queue (events) */
    double trace_ms;          /* trace 1-2: print calls at least this long as they happen (default 0.5 ms) */
    /* ---- per Linear ---- */
    int qgemm_f32_math;       /* --qpath mixed: dequantize in f32 even where the scales are bf16-exact */
    int host_weights;         /* 1: MLX 4/8-bit Linears on the transient / fused paths keep their packed weights and
                               * scales in mapped pinned host memory, outside the pool: each dequantization reads
                               * them over the bus (on the prefetch stream, overlapping the previous GEMM). Set by
                               * the memory plan (pipeline/budget.c) when the weights do not fit the budget */
    /* ---- per call ---- */
    int64_t max_vram;         /* the pool's budget in bytes (--max-vram), read at each device allocation: one that
                               * would take the bytes the pool holds (live blocks, its cache of freed ones, the
                               * cuBLASLt workspaces) past it is refused with an error naming the budget, the use and
                               * the request (the cache is given back first); 0 = none beyond the card's memory */
    dt_cuda_attn attn;        /* attention kernel choice */
    int qgemm_direct_epilogue; /* --qpath mixed: per-element stores from registers instead of the shared-memory
                                * staged epilogue (also taken for unaligned outputs) */
    int fp8_accurate_accum;   /* fp8 GEMMs with cuBLASLt's periodic promotion of partial sums (default: fast
                               * accumulation, -2.6 ms per 1024² forward at the same error) */
    int fp8_epilogue_scales;  /* fp8 GEMMs unscaled, the scales applied in a pass of their own (the fallback where
                               * cuBLASLt has no outer-vector algorithm) */
    int cudnn_ws_poison;      /* fp8 attention: fill cuDNN's workspace with 0xff before each call (a test: the
                               * result must not change) */
} dt_cuda_opts;

/* The defaults: every field 0 except gemm_tune = 1 and trace_ms = 0.5 (no cache file, no library path). */
void dt_cuda_opts_default(dt_cuda_opts *o);
/* The defaults plus the environment variables of docs/environment.md (DITRUN_CUDNN_LIB, DITRUN_GEMM_TUNE,
 * DITRUN_GEMM_CACHE with its XDG_CACHE_HOME / HOME default, DITRUN_CUDA_TRACE, DITRUN_CUDA_TRACE_MS,
 * DITRUN_CUDNN_DEBUG, DITRUN_CUDA_KERNELS). 0, or -1 with dt_last_error naming a variable whose value is not understood (o then holds
 * the defaults for it). The only function of the backends that reads the environment. */
int dt_cuda_opts_from_env(dt_cuda_opts *o);

/* Device d's name and compute capability, without creating a backend (loads the plugin): 0, or -1 with
 * dt_last_error (no such device, a build without CUDA). */
int dt_backend_cuda_device_info(int device, char *name, size_t name_size, int *cc_major, int *cc_minor);
/* A CUDA backend's device memory: *held = the bytes its pool holds now (live + cached blocks, workspaces),
 * *budget = what it may hold: opts.max_vram, or without one the card's free memory plus *held. 0, or -1 (not a CUDA
 * backend, a build without CUDA; no error set). */
int dt_backend_cuda_mem_budget(dt_backend *be, int64_t *budget, int64_t *held);
/* A CUDA backend's live options (NULL for any other backend, and in builds without CUDA). */
dt_cuda_opts *dt_backend_cuda_opts(dt_backend *be);
/* cuDNN fused attention on a CUDA backend: the loaded cuDNN version (0 = not loadable, not a CUDA backend, or a
 * build without CUDA); *calls = attention calls cuDNN has run on it. */
int dt_backend_cuda_cudnn_info(dt_backend *be, long long *calls);

#ifdef __cplusplus
}
#endif
#endif
