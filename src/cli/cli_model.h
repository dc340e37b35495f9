/* cli_model.h — options shared by commands that run a model (backend, threads, quantized path,
 * verbosity). The model family is the registry's (pipeline/family.h). */
#ifndef DT_CLI_MODEL_H
#define DT_CLI_MODEL_H

#include "backends/backend.h"
#include "backends/backend_cuda.h"
#include "models/lora.h"

typedef struct {
    const char *backend;      /* "auto", "cpu", "cuda" */
    dt_backend_opts be;
    int cuda_graph;           /* --cuda-graph: replay the DiT forward as a CUDA graph (fixed shapes) */
    int guidance_batch;       /* --guidance-batch on (the default): a guided step's two passes in one forward */
    int guidance_batch_set;   /* --guidance-batch was given (commands without guided steps refuse it) */
    dt_precision precision;   /* --precision: the DiT blocks' Linears (the model's load options, not the backend's) */
    dt_precision attn_precision;   /* --attn-precision: the DiT blocks' attention */
    dt_cuda_opts cuda;        /* the CUDA options once --kernels, --max-vram or --no-prefetch is given (be.cuda
                               * then points here; else NULL: the environment's, at creation) */
    int64_t max_vram;         /* --max-vram SIZE: the CUDA pool's budget (cuda.max_vram) and the memory plan's
                               * (dt_pipeline_opts.max_vram); 0 = not given */
} cli_model_opts;

/* --lora FILE[:SCALE] (repeatable) and --lora-side: LoRA adapters for the DiT (models/lora.h). */
#define CLI_MAX_LORAS 8
typedef struct {
    dt_lora_spec loras[CLI_MAX_LORAS];
    int n;
    int side;      /* --lora-side: side products for dense weights too (comparisons) */
} cli_lora_opts;
/* Consumes argv[*i] (and its value) when it is --lora or --lora-side: 1 consumed, 0 not, -1 bad value. */
int cli_lora_opt(cli_lora_opts *l, int argc, char **argv, int *i);

/* --vae-tiling and --vae-tile-size N (generate, serve): tiled VAE decoding / encoding (models/vae_tiling.h). */
typedef struct {
    int tiling;    /* --vae-tiling */
    int tile;      /* --vae-tile-size N pixels (0: the VAE's default); it asks for tiles too, except where a memory
                    * budget (generate --max-vram) decides */
} cli_vae_opts;
/* Consumes argv[*i] (and its value) when it is a VAE tiling option: 1 consumed, 0 not, -1 bad value. */
int cli_vae_opt(cli_vae_opts *o, int argc, char **argv, int *i);

void cli_model_opts_default(cli_model_opts *o);
/* Consumes argv[*i] (and its value) if it is a shared option: returns 1 if consumed, 0 if not
 * a shared option, -1 on a bad value (error printed). Options: --backend, --threads, --qpath,
 * --precision (bf16 | fp8: the DiT blocks' Linears in e4m3, opt-in), --rope-bf16, --cuda-graph,
 * --guidance-batch on|off, --kernels (auto | portable: the CUDA paths of a non-Hopper
 * card), --max-vram SIZE (the CUDA pool's budget), --no-prefetch (CUDA: no transient-weight prefetch, the models'
 * hints ignored), -q/--quiet, -v/--verbose. */
int cli_model_opt(cli_model_opts *o, int argc, char **argv, int *i);
/* Create the backend; prints the error and returns NULL on failure. */
dt_backend *cli_model_backend(const cli_model_opts *o);
/* A note (log level 1) when --sequence-parallel N > 1 runs on the CPU backend: N thread ranks, not faster. */
void cli_sp_note(const dt_backend *be, int ranks);
/* Which parts run in fp8 under these options: "Linears", "attention", "Linears + attention" or "none". */
const char *cli_fp8_what(const cli_model_opts *o);
/* 0, or 1 with the error printed when the options ask for fp8 of a family without fp8 modes. */
struct dt_family;
int cli_check_fp8(const struct dt_family *fam, const cli_model_opts *o);
/* The --qpath spelling of a path (auto, mixed, fused, transient, cached). */
const char *cli_qpath_name(int qpath);
/* The bundled tiny pipeline: $DITRUN_DEFAULT_MODEL, else tests/fixtures/model beside the build folder, else
 * share/ditrun/model beside an installed bin/ (make install). */
const char *cli_bundled_model(void);

#endif
