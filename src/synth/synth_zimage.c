/* synth_zimage.c — Z-Image's synthetic writers (its family's `synth`, family.h): a whole pipeline folder (random
 * weights at a real geometry): the Z-Image transformer (zimage_synth_write), a Qwen3 text encoder, FLUX.1's
 * AutoencoderKL (decoder and encoder), plus the bundled tokenizer (with its chat template) and scheduler config, so
 * `ditrun generate` and diffusers' ZImagePipeline run the same folder; and random forward inputs for `ditrun forward`.
 * Weight files are named as diffusers and transformers name them. */
#include "synth_pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "synth.h"
#include "synth_dit.h"
#include "models/zimage.h"

int dt_synth_zimage_pipeline(const char *preset, const char *dir, int bits, int group, uint64_t seed,
                             const char *zimage_root) {
    zimage_config c;
    if (zimage_preset(preset, &c)) return -1;
    dt_synth_text_geom te;
    dt_synth_vae_geom vg;
    if (!strcmp(preset, "z-image-turbo")) {
        /* Qwen/Qwen3-4B; FLUX.1's VAE (8x, 16 latent channels) */
        te = (dt_synth_text_geom){2560, 36, 32, 8, 128, 9728, 151936};
        vg = (dt_synth_vae_geom){16, 4, {128, 256, 512, 512}, 2, 32};
    } else {
        /* tests/fixtures/zimage/model */
        te = (dt_synth_text_geom){32, 4, 4, 2, 16, 96, 705};
        vg = (dt_synth_vae_geom){16, 3, {8, 16, 16}, 2, 4};
    }
    if (c.cap_dim != te.hidden || c.in_channels != vg.latent) {
        dt_set_error("synthetic pipeline: preset '%s' geometry is inconsistent", preset);
        return -1;
    }
    char p[4200];
    if (synth_mkdir(dir)) return -1;
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    if (synth_write_text(p, "{\n  \"_class_name\": \"ZImagePipeline\",\n"
                            "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
                            "  \"text_encoder\": [\"transformers\", \"Qwen3ForCausalLM\"],\n"
                            "  \"tokenizer\": [\"transformers\", \"Qwen2Tokenizer\"],\n"
                            "  \"transformer\": [\"diffusers\", \"ZImageTransformer2DModel\"],\n"
                            "  \"vae\": [\"diffusers\", \"AutoencoderKL\"]\n}\n"))
        return -1;
    dt_log(1, "ditrun: synthetic Z-Image pipeline: transformer ...\n");
    snprintf(p, sizeof p, "%s/transformer", dir);
    if (zimage_synth_write(&c, p, bits, group, seed)) return -1;
    if (dt_synth_name_transformer_for_diffusers(dir)) return -1;
    return dt_synth_qwen3_pipeline_parts(dir, "Z-Image pipeline", &te, &vg, 1, bits, group, seed, zimage_root);
}

/* Random inputs for a grid x grid token grid and t caption tokens (uniform in [−1, 1], never zeros). */
static int write_inputs(const zimage_config *c, const char *path, int grid, int t, uint64_t seed) {
    if (t < 1) { dt_set_error("synth: Z-Image inputs need at least one caption token (--text-tokens)"); return -1; }
    const int64_t n = (int64_t)grid * grid, F = c->patch_channels;
    float *img = dt_malloc(sizeof(float) * (size_t)(n * F)), *txt = dt_malloc(sizeof(float) * (size_t)t * c->cap_dim);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 11;
    for (int64_t i = 0; i < n * F; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; img[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
    for (int64_t i = 0; i < (int64_t)t * c->cap_dim; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; txt[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
    float ts = 0.75f, g2[2] = {(float)grid, (float)grid};
    st_writer *w = st_writer_new();
    int64_t si[3] = {1, n, F}, st[3] = {1, t, c->cap_dim}, s1[1] = {1}, s2[1] = {2};
    st_writer_add_f32(w, "in.hidden_states", 3, si, img);
    st_writer_add_f32(w, "in.encoder_hidden_states", 3, st, txt);
    st_writer_add_f32(w, "in.timestep", 1, s1, &ts);
    st_writer_add_f32(w, "in.grid", 1, s2, g2);
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    free(img);
    free(txt);
    if (rc) return -1;
    dt_log(1, "ditrun: wrote %s (%lld image + %d caption tokens)\n", path, (long long)n, t);
    return 0;
}

int dt_synth_zimage(const dt_synth_req *r) {
    zimage_config c;
    if (zimage_preset(r->preset, &c)) return -1;
    if (r->ref_grid) { dt_set_error("--ref-size: Z-Image takes no reference images (FLUX.2 --inputs only)"); return -1; }
    if (r->inputs) return write_inputs(&c, r->inputs, r->grid, r->text_tokens, r->seed);
    const char *q = r->bits ? (r->bits == 4 ? "q4" : "q8") : "bf16";
    if (r->pipeline) {
        /* tokenizer and scheduler from the bundled tiny Z-Image pipeline, beside the bundled FLUX.2 one */
        char root[4300];
        dt_synth_bundled_sibling(r->bundled_model, "zimage/model", root, sizeof root);
        dt_log(1, "ditrun: writing a synthetic %s pipeline (%s) to %s ...\n", r->preset, q, r->out);
        return dt_synth_zimage_pipeline(r->preset, r->dir, r->bits, r->group, r->seed, root);
    }
    dt_log(1, "ditrun: writing synthetic %s checkpoint (%s) to %s ...\n", r->preset, q, r->out);
    return zimage_synth_write(&c, r->dir, r->bits, r->group, r->seed);
}
