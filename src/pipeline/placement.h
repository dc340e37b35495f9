/* placement.h — where a pipeline's parts live under a device memory budget: a pure function of the budget and the
 * parts' sizes (weights and the activations of each phase at one image size) that picks the cheapest placement the
 * engine can run within it — everything resident, the VAE tiled, the text encoder released between phases — or
 * names the smallest budget that would work. Sizes are bytes on the device. No I/O: the CPU tests drive it directly.
 *
 * Phases and what they hold (the engine's order: pipeline/engine.c, klein.c, krea2_family.c):
 *   encode  — the text encoder's weights and activations, plus the transformer (weights, dequantized-weight
 *             buffers, the last forward's activations) and VAE when they are loaded already (a resident pipeline; in
 *             a one-shot run with the text encoder released they load after it is freed);
 *   denoise — the transformer's weights, buffers and one forward's activations, plus the VAE's weights, plus the
 *             text encoder (weights and its kept activation buffers) unless released;
 *   decode  — the VAE's activations (untiled, or one tile's) beside everything of the denoise phase (a model keeps
 *             its activation buffers for the next request);
 *   every phase — the backend's workspaces.
 * The last resort keeps the 4/8-bit weights in host memory (the CUDA backend's host_weights: each dequantization
 * reads them over the bus); dense weights that do not fit have no plan. */
#ifndef DT_PLACEMENT_H
#define DT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t text_encoder, transformer, vae;   /* weight bytes on the device */
    int64_t te_act;             /* peak activation bytes of encoding the prompts */
    int64_t dit_act;            /* ... of one transformer forward at the image size (of dit_batch sequences) */
    int dit_batch;              /* sequences per transformer forward: 2 with the guidance batch on for a family that
                                 * runs it and a pipeline that is not distilled (the prompt and the negative prompt in
                                 * one forward: activations for twice the rows), else 1 */
    int64_t vae_act;            /* ... of the untiled VAE decode at the image size */
    int64_t vae_tile_act;       /* ... of one tile's decode; 0 when the image is one tile (tiling changes nothing) */
    int vae_tile_px;            /* that tile's side in pixels (0: not known) */
    int64_t vae_small_tile_act; /* ... of one tile of vae_small_tile_px (half the tile), a further candidate when the
                                 * tile was not chosen by the caller; 0: none (the image is one such tile) */
    int vae_small_tile_px;
    int64_t vae_scratch[3];     /* the decode's grow-only backend scratch, untiled / tile / half tile (CUDA: the
                                 * convolutions' im2col columns, <= 256 MiB, and the mid-block attention's score
                                 * chunk, <= 384 MiB; each grown by 1/8): held from the first decode on */
    int resident;               /* 1: a loaded pipeline serving many requests (serve, --count): a released text
                                 * encoder is reloaded for every prompt; 0: one image (generate), where releasing it
                                 * costs nothing */
    int64_t workspace;          /* bytes the backend holds beside the parts in every phase (the CUDA backend's two
                                 * cuBLASLt workspaces: DT_PLACE_WORKSPACE) and the pool's slack (DT_PLACE_POOL_SLACK) */
    int64_t te_qbuf, dit_qbuf;  /* the buffers quantized Linears are dequantized into (CUDA: the transient GEMM's and
                                 * two prefetch slots, each the largest Linear in bf16): grow-only, so from a
                                 * component's first run on the larger of the two stays held */
    int64_t te_packed, transformer_packed;   /* of their weights, the MLX 4/8-bit Linears' packed weights, scales
                                 * and biases: what host weights (dt_cuda_opts.host_weights) keep off the device */
    int host_ok;                /* 1: host weights are a candidate (the CUDA backend on the transient / fused paths;
                                 * dt_place_sizes_for sets it, pipeline/budget.c clears it for other backends and
                                 * --qpath cached / mixed) */
} dt_place_sizes;

#define DT_PLACE_WORKSPACE (128LL << 20)
/* what the CUDA pool holds beyond the parts' estimates in any phase: its rounding (blocks of 1-64 MiB in 1 MiB steps,
 * larger ones in 8 MiB) and small buffers the estimate leaves out. Measured (H100): the pool's peak 1.7 MiB past the
 * prediction for klein-4B q4 1024² under --max-vram 6G, ~6 MiB past it for the bundled tiny pipeline at 256², which
 * then stopped at its budget. */
#define DT_PLACE_POOL_SLACK (16LL << 20)

enum { DT_PHASE_ENCODE, DT_PHASE_DENOISE, DT_PHASE_DECODE, DT_PHASES };

typedef struct {
    int release_text_encoder;   /* freed after the prompts are encoded, before the transformer runs */
    int vae_tiling;             /* the decode in tiles (models/vae_tiling.h) */
    int vae_tile_px;            /* their side in pixels (vae_tile_px or vae_small_tile_px of the sizes; 0: untiled,
                                 * or not known) */
    int host_weights;           /* the packed 4/8-bit weights in pinned host memory, read over the bus by each
                                 * dequantization (slower steps; the last resort) */
    int guidance_two_passes;    /* the guidance batch dropped: a guided step's two passes one after the other, each
                                 * with one sequence's activations (sizes with dit_batch 2 only) */
    int64_t phase_peak[DT_PHASES];   /* predicted bytes of each phase */
    int64_t peak;               /* their largest */
    int64_t min_budget;         /* the smallest budget any placement fits (the smallest peak) */
} dt_place_plan;

/* The cheapest placement whose peak fits budget (budget <= 0: no bound, the cheapest of all): one-shot runs release
 * the text encoder (free), then tile the VAE if needed (the tile, then the half tile); resident pipelines first tile
 * the VAE (a few percent of the decode), then release the text encoder (a reload per prompt), then both; each of
 * these first with the guidance batch (dit_batch 2), then with guidance in two passes; when none
 * fits and s->host_ok, the same again with host weights (every step reads the packed weights over the bus). 0, or -1 with the error "budget X is
 * below the smallest workable Y for these sizes (...)" when none fits; *p is filled in both cases (the placement
 * with the smallest peak on error). */
int dt_place_plan_make(int64_t budget, const dt_place_sizes *s, dt_place_plan *p);

/* One line: "text encoder resident|released, VAE untiled|tiled[ (N px tiles)][, guidance in two passes][, 4/8-bit
 * weights in host memory];
 * predicted peak X GiB (encode A, denoise B, decode C); smallest workable Y GiB". */
void dt_place_plan_describe(const dt_place_plan *p, char *buf, size_t n);

/* "12.00 GiB" (MiB below one GiB, KiB below one MiB) of b bytes into buf. */
const char *dt_place_bytes(int64_t b, char *buf, size_t n);

/* The sizes of the pipeline folder `root` (FLUX.2-klein, Krea 2 or Z-Image) for one W x H image with T text tokens and
 * activations of elem bytes (2: bf16 on a GPU): weights from the files (f32 tensors counted at elem bytes, as the
 * device keeps them), the VAE decode exactly (dt_vae_decode_act_bytes / dt_qvae_decode_act_bytes, tiles of the VAE's
 * default size or `tile` pixels; with tile 0 also the half of the default tile), the packed bytes (host_ok set), the transformer forward and the text encoding estimated from their widths:
 * (T + N)·(7·D + 3·F)·elem for the forward's stream, scratch and fused projections (N image tokens, D its width, F its
 * MLP width; flux2.h's activation set) and its RoPE tables; T·(6·D + 3·I)·elem for the text encoder (I its MLP
 * width), twice that with the guidance batch (guidance_batch 1, a family whose model runs it: dt_family
 * guidance_batch, and a pipeline that is not distilled: model_index.json's is_distilled); for quantized weights three
 * dequantized copies of the largest Linear ((3·D + 2·F) x D for the
 * transformer, plus one 2·F x D for FLUX.2's side queue; 2·I x D for the text encoder); DT_PLACE_WORKSPACE. Reads only configs and safetensors headers. 0 or -1. */
int dt_place_sizes_for(const char *root, int W, int H, int T, int elem, int tile, int resident, int guidance_batch,
                       dt_place_sizes *s);

#endif
