/* synth_pipeline.h — the synthetic writers of the families (synthetic pipeline folders, checkpoints and forward inputs
 * with random weights; family.h: dt_family.synth) and the pieces they share. */
#ifndef DT_SYNTH_PIPELINE_H
#define DT_SYNTH_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

/* One `ditrun synth` request for a family's preset (family.h: dt_family.synth). */
typedef struct {
    const char *preset;
    const char *dir;            /* the checkpoint or pipeline folder to write (NULL with inputs) */
    const char *out;            /* the folder's name in messages (--output; dir is its temporary) */
    const char *inputs;         /* instead: random forward inputs into this file */
    int pipeline;               /* a whole pipeline folder instead of the transformer */
    int bits, group;            /* 0 = bf16, 4 / 8 = MLX affine with this group */
    uint64_t seed;
    int grid, text_tokens;      /* inputs: a grid x grid latent and this many text tokens */
    int ref_grid;               /* inputs: one ref_grid x ref_grid reference image's tokens (0: none) */
    const char *bundled_model;  /* the bundled tiny pipeline root (tokenizer and scheduler are copied from there) */
} dt_synth_req;
/* The families' writers: FLUX.2-klein (synth_pipeline.c), Krea 2 (synth_krea2.c), Z-Image (synth_zimage.c). 0 or -1
 * (dt_last_error). */
int dt_synth_flux2(const dt_synth_req *r);
int dt_synth_krea2(const dt_synth_req *r);
int dt_synth_zimage(const dt_synth_req *r);

/* Z-Image (synth_zimage.c). preset: z-image-turbo (the released geometry: Z-Image transformer, Qwen3-4B text model,
 * FLUX.1's AutoencoderKL) or z-image-tiny (tests/fixtures/zimage). bits as below (transformer and text encoder);
 * the VAE is f32. Tokenizer and scheduler config are copied from zimage_root (the bundled tiny Z-Image pipeline). */
int dt_synth_zimage_pipeline(const char *preset, const char *dir, int bits, int group, uint64_t seed,
                             const char *zimage_root);

/* preset: klein-4b, klein-9b or tiny. bits 0 = bf16 Linears, 4/8 = MLX affine (transformer and text
 * encoder, group `group`); the VAE is f32. Tokenizer and scheduler config are copied from
 * fixtures_model (the bundled tiny pipeline root). 0 ok, -1 error (dt_last_error). */
int dt_synth_pipeline(const char *preset, const char *dir, int bits, int group, uint64_t seed, const char *fixtures_model);

/* Krea 2 (synth_krea2.c). preset: krea2 (the released geometry: Krea 2 transformer, Qwen3-VL-4B text model,
 * Qwen-Image VAE) or krea2-tiny (tests/fixtures/krea2). bits as above (transformer and text encoder); the VAE
 * is f32. Tokenizer and scheduler config are copied from krea2_root (the bundled tiny Krea 2 pipeline). */
int dt_synth_krea2_pipeline(const char *preset, const char *dir, int bits, int group, uint64_t seed,
                            const char *krea2_root);
/* The text encoder and VAE of that pipeline alone (DIR/text_encoder, DIR/vae: the same files), and the text encoder
 * layers its model_index.json taps (taps [16], *n_taps): `ditrun bench`'s text encode and VAE decode rows. 0 or -1. */
int dt_synth_krea2_text_vae(const char *preset, const char *dir, int bits, int group, uint64_t seed);
int dt_synth_krea2_taps(const char *preset, int *taps, int *n_taps);

/* ---- the pieces the synthetic pipelines share (synth_pipeline.c, synth_flux2.c) ---- */

/* A VAE folder DIR (config.json + diffusion_pytorch_model.safetensors, f32 random weights, encoder included):
 * latent channels, block_out_channels [nblk], layers_per_block, GroupNorm groups. kl 0: AutoencoderKLFlux2 (latent
 * batch norm, quant convs); kl 1: AutoencoderKL as FLUX.1 and Z-Image use it (no quant convs, scaling 0.3611, shift
 * 0.1159). 0 or -1. */
typedef struct { int latent, nblk, blk[4], lpb, groups; } dt_synth_vae_geom;
int dt_synth_write_vae(const char *dir, const dt_synth_vae_geom *g, int kl, uint64_t seed);

/* Geometry of a Qwen3 text model (Qwen3ForCausalLM, or Qwen3-VL's text layers). */
typedef struct { int hidden, layers, heads, kv, hd, inter, vocab; } dt_synth_text_geom;

/* A Qwen3 text model in folder DIR: config.json holding the text `config`, and model.safetensors with the
 * embedding, the decoder layers and the final norm named under PREFIX ("model" in Qwen3ForCausalLM,
 * "language_model" in Qwen3VLModel); Linears (the embedding too, as MLX quantizes it) bf16 or bits/group.
 * 0 ok, -1 error (dt_last_error). */
int dt_synth_write_text_model(const char *dir, const char *config, const char *prefix, const dt_synth_text_geom *g,
                              int bits, int group, uint64_t seed);

/* A Qwen3ForCausalLM text encoder (FLUX.2-klein's, Z-Image's) in DIR (dt_synth_write_text_model with its config). */
int dt_synth_write_qwen3(const char *dir, const dt_synth_text_geom *g, int bits, int group, uint64_t seed);

/* Renames the pipeline folder DIR's transformer/model.safetensors to diffusion_pytorch_model.safetensors, the
 * name diffusers' from_pretrained looks for, so the reference can load the same folder. 0 ok, -1 error. */
int dt_synth_name_transformer_for_diffusers(const char *dir);

/* The bundled tiny pipeline of another family beside the bundled FLUX.2 one: bundled_model ".../model" gives
 * ".../SUB" (e.g. "krea2", "zimage/model"); any other bundled root gives "tests/fixtures/SUB". Into root[n]. */
void dt_synth_bundled_sibling(const char *bundled_model, const char *sub, char *root, size_t n);

/* Copies n bundled files {folder, name} from the pipeline root `root` into the same folders of DIR (created as
 * needed). 0 ok, -1 error (dt_last_error). */
int dt_synth_copy_bundled(const char *dir, const char *root, const char *const files[][2], int n);

/* The parts a Qwen3-text pipeline (FLUX.2-klein, Z-Image) has beside its transformer, into the pipeline folder DIR:
 * text_encoder/ (dt_synth_write_qwen3, seed + 1), vae/ (dt_synth_write_vae, kl, seed + 2), and the bundled tokenizer
 * (with its Qwen3 chat template, which the reference pipeline applies; the tiny vocabulary's ids are valid in any
 * larger one) and scheduler config copied from the pipeline root `bundled`. `what` names the pipeline in the
 * progress lines. 0 ok, -1 error (dt_last_error). */
int dt_synth_qwen3_pipeline_parts(const char *dir, const char *what, const dt_synth_text_geom *te,
                                  const dt_synth_vae_geom *vg, int kl, int bits, int group, uint64_t seed,
                                  const char *bundled);

/* Copies the regular file src (a FIFO or device is refused) to dst through a temporary renamed into place.
 * 0 ok, -1 error (dt_last_error). */
int dt_synth_copy_file(const char *src, const char *dst);

#endif
