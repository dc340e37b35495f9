/* synth_krea2.c — a whole synthetic Krea 2 pipeline folder (random weights at a real geometry):
 * the Krea 2 transformer (krea2_synth_write), a Qwen3-VL text encoder (Qwen3VLModel layout, text layers
 * only), the Qwen-Image VAE decoder (AutoencoderKLQwenImage layout: causal 3-D kernels), plus the bundled
 * tokenizer and Krea 2 scheduler config. Weight files are named as diffusers and transformers name them
 * (transformer/ and vae/: diffusion_pytorch_model.safetensors; text_encoder/: model.safetensors), so the
 * reference can load the same folder (its own bf16 after dequantizing any 4/8-bit Linears). */
#include "synth_pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "models/krea2.h"
#include "synth.h"
#include "synth_dit.h"

typedef struct {
    dt_synth_text_geom text;
    int sec[3];                  /* mrope_section */
    const char *vision;          /* vision_config JSON (never run; kept so the reference can build the model) */
} k2_te_geom;

typedef struct {
    int base, z, nmult, mult[4], nres;
    int tdown[3];                /* temperal_downsample */
} k2_vae_geom;

/* Qwen-Image VAE latents statistics (AutoencoderKLQwenImage defaults, z_dim 16). */
static const float k2_latents_mean[16] = {-0.7571f, -0.7089f, -0.9113f, 0.1075f, -0.1745f, 0.9653f, -0.1517f, 1.5508f,
                                          0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f};
static const float k2_latents_std[16] = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                         3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};

/* The Qwen3VLModel text encoder (text layers only; vision_config is kept so the reference can build the model). */
static int write_text_encoder(const char *dir, const k2_te_geom *g, int bits, int group, uint64_t seed) {
    const dt_synth_text_geom *t = &g->text;
    char cfg[4096], quant[96];
    synth_quantization_entry(quant, sizeof quant, bits, group);
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"Qwen3VLModel\"],\n  \"model_type\": \"qwen3_vl\",\n  \"tie_word_embeddings\": true,\n"
             "  \"image_token_id\": 151655,\n  \"video_token_id\": 151656,\n  \"vision_start_token_id\": 151652,\n"
             "  \"vision_end_token_id\": 151653,\n  \"text_config\": {\n    \"model_type\": \"qwen3_vl_text\",\n"
             "    \"attention_bias\": false,\n    \"hidden_act\": \"silu\",\n    \"hidden_size\": %d,\n"
             "    \"num_hidden_layers\": %d,\n    \"num_attention_heads\": %d,\n    \"num_key_value_heads\": %d,\n"
             "    \"head_dim\": %d,\n    \"intermediate_size\": %d,\n    \"vocab_size\": %d,\n"
             "    \"max_position_embeddings\": 262144,\n    \"rms_norm_eps\": 1e-06,\n    \"tie_word_embeddings\": true,\n"
             "    \"rope_theta\": 5000000,\n    \"rope_scaling\": {\"mrope_interleaved\": true, \"mrope_section\": [%d, %d, %d], "
             "\"rope_type\": \"default\"}\n  },\n  \"vision_config\": %s%s\n}\n",
             t->hidden, t->layers, t->heads, t->kv, t->hd, t->inter, t->vocab, g->sec[0], g->sec[1], g->sec[2], g->vision,
             quant);
    return dt_synth_write_text_model(dir, cfg, "language_model", t, bits, group, seed);
}

/* A causal 3-D conv NAME [cout, cin, kt, k, k] (kt = 1 for 1×1×1) or, with kt = 0, a 2-D one [cout, cin, k, k]. */
static void add_conv(synth_list *l, const char *name, int64_t cout, int64_t cin, int kt, int k) {
    char nm[400];
    int64_t s3[5] = {cout, cin, kt, k, k}, s2[4] = {cout, cin, k, k};
    snprintf(nm, sizeof nm, "%s.weight", name);
    if (kt) synth_add(l, nm, 5, s3, 0.0f, 1.7320508f / sqrtf((float)(cin * k * k)));
    else synth_add(l, nm, 4, s2, 0.0f, 1.7320508f / sqrtf((float)(cin * k * k)));
    snprintf(nm, sizeof nm, "%s.bias", name);
    synth_add(l, nm, 1, &cout, 0.0f, 0.02f);
}

/* RMS_norm gamma [c, 1, 1, 1] (resnets, norm_out) or [c, 1, 1] (attention) */
static void add_gamma(synth_list *l, const char *name, int64_t c, int image) {
    char nm[400];
    int64_t s[4] = {c, 1, 1, 1};
    snprintf(nm, sizeof nm, "%s.gamma", name);
    synth_add(l, nm, image ? 3 : 4, s, 1.0f, 0.1f);
}

static void add_resnet(synth_list *l, const char *name, int64_t cin, int64_t cout) {
    char nm[300];
    snprintf(nm, sizeof nm, "%s.norm1", name); add_gamma(l, nm, cin, 0);
    snprintf(nm, sizeof nm, "%s.conv1", name); add_conv(l, nm, cout, cin, 3, 3);
    snprintf(nm, sizeof nm, "%s.norm2", name); add_gamma(l, nm, cout, 0);
    snprintf(nm, sizeof nm, "%s.conv2", name); add_conv(l, nm, cout, cout, 3, 3);
    if (cin != cout) { snprintf(nm, sizeof nm, "%s.conv_shortcut", name); add_conv(l, nm, cout, cin, 1, 1); }
}

static int write_vae(const char *dir, const k2_vae_geom *g, uint64_t seed) {
    if (synth_mkdir(dir)) return -1;
    char p[8500], cfg[4096], mult[64] = "", td[64] = "", mean[512] = "", sd[512] = "";
    for (int i = 0; i < g->nmult; i++) {
        size_t n = strlen(mult);
        snprintf(mult + n, sizeof mult - n, "%s%d", i ? ", " : "", g->mult[i]);
        if (i < g->nmult - 1) {
            n = strlen(td);
            snprintf(td + n, sizeof td - n, "%s%s", i ? ", " : "", g->tdown[i] ? "true" : "false");
        }
    }
    for (int i = 0; i < g->z; i++) {   /* the released statistics (z 16), or a spread of them for other z */
        size_t n = strlen(mean);
        snprintf(mean + n, sizeof mean - n, "%s%.4f", i ? ", " : "", (double)k2_latents_mean[i % 16]);
        n = strlen(sd);
        snprintf(sd + n, sizeof sd - n, "%s%.4f", i ? ", " : "", (double)k2_latents_std[i % 16]);
    }
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"AutoencoderKLQwenImage\",\n  \"attn_scales\": [],\n  \"base_dim\": %d,\n"
             "  \"dim_mult\": [%s],\n  \"dropout\": 0.0,\n  \"input_channels\": 3,\n  \"latents_mean\": [%s],\n"
             "  \"latents_std\": [%s],\n  \"num_res_blocks\": %d,\n  \"temperal_downsample\": [%s],\n  \"z_dim\": %d\n}\n",
             g->base, mult, mean, sd, g->nres, td, g->z);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (synth_write_text(p, cfg)) return -1;
    /* decoder channels as the reference builds them: base·[mult[-1], mult reversed] */
    int64_t dims[6];
    dims[0] = (int64_t)g->base * g->mult[g->nmult - 1];
    for (int i = 0; i < g->nmult; i++) dims[i + 1] = (int64_t)g->base * g->mult[g->nmult - 1 - i];
    synth_list l = {0};
    char nm[300];
    const int64_t top = dims[0];
    add_conv(&l, "post_quant_conv", g->z, g->z, 1, 1);
    add_conv(&l, "decoder.conv_in", top, g->z, 3, 3);
    add_resnet(&l, "decoder.mid_block.resnets.0", top, top);
    add_gamma(&l, "decoder.mid_block.attentions.0.norm", top, 1);
    add_conv(&l, "decoder.mid_block.attentions.0.to_qkv", 3 * top, top, 0, 1);
    add_conv(&l, "decoder.mid_block.attentions.0.proj", top, top, 0, 1);
    add_resnet(&l, "decoder.mid_block.resnets.1", top, top);
    for (int b = 0; b < g->nmult; b++) {
        int64_t in = b > 0 ? dims[b] / 2 : dims[b], out = dims[b + 1];
        for (int r = 0; r <= g->nres; r++) {
            snprintf(nm, sizeof nm, "decoder.up_blocks.%d.resnets.%d", b, r);
            add_resnet(&l, nm, r == 0 ? in : out, out);
        }
        if (b < g->nmult - 1) {
            snprintf(nm, sizeof nm, "decoder.up_blocks.%d.upsamplers.0.resample.1", b);
            add_conv(&l, nm, out / 2, out, 0, 3);
            if (g->tdown[g->nmult - 2 - b]) {   /* upsample3d: the temporal conv (never run on one frame) */
                snprintf(nm, sizeof nm, "decoder.up_blocks.%d.upsamplers.0.time_conv", b);
                int64_t s[5] = {2 * out, out, 3, 1, 1}, c2 = 2 * out;
                char wn[320];
                snprintf(wn, sizeof wn, "%s.weight", nm);
                synth_add(&l, wn, 5, s, 0.0f, 0.02f);
                snprintf(wn, sizeof wn, "%s.bias", nm);
                synth_add(&l, wn, 1, &c2, 0.0f, 0.02f);
            }
        }
    }
    add_gamma(&l, "decoder.norm_out", dims[g->nmult], 0);
    add_conv(&l, "decoder.conv_out", 3, dims[g->nmult], 3, 3);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    int rc = synth_write(&l, p, 0, 64, DT_F32, seed);
    synth_list_free(&l);
    return rc;
}

static const char k2_vision_real[] =
    "{\"model_type\": \"qwen3_vl\", \"deepstack_visual_indexes\": [5, 11, 17], \"depth\": 24, "
    "\"hidden_act\": \"gelu_pytorch_tanh\", \"hidden_size\": 1024, \"in_channels\": 3, \"intermediate_size\": 4096, "
    "\"num_heads\": 16, \"num_position_embeddings\": 2304, \"out_hidden_size\": 2560, \"patch_size\": 16, "
    "\"spatial_merge_size\": 2, \"temporal_patch_size\": 2}";
static const char k2_vision_tiny[] =
    "{\"model_type\": \"qwen3_vl\", \"deepstack_visual_indexes\": [0], \"depth\": 1, \"hidden_act\": \"gelu_pytorch_tanh\", "
    "\"hidden_size\": 32, \"in_channels\": 3, \"intermediate_size\": 64, \"num_heads\": 2, \"num_position_embeddings\": 64, "
    "\"out_hidden_size\": 64, \"patch_size\": 16, \"spatial_merge_size\": 2, \"temporal_patch_size\": 2}";

/* The text encoder and VAE geometry of a preset and the taps its model_index.json names (taps [16]). */
static int k2_components(const char *preset, krea2_config *c, k2_te_geom *te, k2_vae_geom *vg, int *taps, int *n_taps) {
    if (krea2_preset(preset, c)) return -1;
    if (!strcmp(preset, "krea2")) {
        /* Qwen/Qwen3-VL-4B-Instruct text_config; the Qwen-Image VAE; Krea2Pipeline's default taps */
        *te = (k2_te_geom){{2560, 36, 32, 8, 128, 9728, 151936}, {24, 20, 20}, k2_vision_real};
        *vg = (k2_vae_geom){96, 16, 4, {1, 2, 4, 4}, 2, {0, 1, 1}};
        *n_taps = 12;
        for (int i = 0; i < *n_taps; i++) taps[i] = 2 + 3 * i;
    } else {
        /* tests/fixtures/krea2 */
        *te = (k2_te_geom){{64, 4, 4, 2, 16, 192, 705}, {2, 3, 3}, k2_vision_tiny};
        *vg = (k2_vae_geom){16, 4, 3, {1, 2, 2}, 1, {0, 1}};
        *n_taps = 3;
        taps[0] = 1; taps[1] = 2; taps[2] = 4;
    }
    if (c->text_layers != *n_taps || c->text_dim != te->text.hidden || c->in_channels != 4 * vg->z) {
        dt_set_error("synthetic pipeline: preset '%s' geometry is inconsistent", preset);
        return -1;
    }
    return 0;
}

/* DIR/text_encoder and DIR/vae (the text encoder's seed seed + 1, the VAE's seed + 2, as in the whole pipeline). */
static int write_text_vae(const char *dir, const k2_te_geom *te, const k2_vae_geom *vg, int bits, int group,
                          uint64_t seed) {
    char p[4200];
    dt_log(1, "ditrun: synthetic Krea 2 pipeline: text encoder ...\n");
    snprintf(p, sizeof p, "%s/text_encoder", dir);
    if (write_text_encoder(p, te, bits, group, seed + 1)) return -1;
    dt_log(1, "ditrun: synthetic Krea 2 pipeline: VAE ...\n");
    snprintf(p, sizeof p, "%s/vae", dir);
    return write_vae(p, vg, seed + 2);
}

int dt_synth_krea2_text_vae(const char *preset, const char *dir, int bits, int group, uint64_t seed) {
    krea2_config c;
    k2_te_geom te;
    k2_vae_geom vg;
    int taps[16], n_taps;
    if (k2_components(preset, &c, &te, &vg, taps, &n_taps) || synth_mkdir(dir)) return -1;
    return write_text_vae(dir, &te, &vg, bits, group, seed);
}

int dt_synth_krea2_taps(const char *preset, int *taps, int *n_taps) {
    krea2_config c;
    k2_te_geom te;
    k2_vae_geom vg;
    return k2_components(preset, &c, &te, &vg, taps, n_taps);
}

int dt_synth_krea2_pipeline(const char *preset, const char *dir, int bits, int group, uint64_t seed,
                            const char *krea2_root) {
    krea2_config c;
    k2_te_geom te;
    k2_vae_geom vg;
    int taps[16], n_taps;
    if (k2_components(preset, &c, &te, &vg, taps, &n_taps)) return -1;
    char p[4200], idx[1024], tl[128] = "";
    if (synth_mkdir(dir)) return -1;
    for (int i = 0; i < n_taps; i++) {
        size_t n = strlen(tl);
        snprintf(tl + n, sizeof tl - n, "%s%d", i ? ", " : "", taps[i]);
    }
    snprintf(idx, sizeof idx,
             "{\n  \"_class_name\": \"Krea2Pipeline\",\n  \"is_distilled\": false,\n  \"patch_size\": 2,\n"
             "  \"text_encoder_select_layers\": [%s],\n"
             "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
             "  \"text_encoder\": [\"transformers\", \"Qwen3VLModel\"],\n"
             "  \"tokenizer\": [\"transformers\", \"TokenizersBackend\"],\n"
             "  \"transformer\": [\"diffusers\", \"Krea2Transformer2DModel\"],\n"
             "  \"vae\": [\"diffusers\", \"AutoencoderKLQwenImage\"]\n}\n", tl);
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    if (synth_write_text(p, idx)) return -1;
    dt_log(1, "ditrun: synthetic Krea 2 pipeline: transformer ...\n");
    snprintf(p, sizeof p, "%s/transformer", dir);
    if (krea2_synth_write(&c, p, bits, group, seed)) return -1;
    if (dt_synth_name_transformer_for_diffusers(dir)) return -1;
    if (write_text_vae(dir, &te, &vg, bits, group, seed)) return -1;
    /* tokenizer and scheduler: the bundled Krea 2 ones (the tiny vocabulary's ids are valid in any larger one) */
    static const char *const files[][2] = {{"tokenizer", "tokenizer.json"}, {"tokenizer", "tokenizer_config.json"},
                                           {"scheduler", "scheduler_config.json"}};
    return dt_synth_copy_bundled(dir, krea2_root, files, 3);
}

/* Random inputs for a grid x grid latent and t text tokens (krea2_synth_inputs). */
static int write_inputs(const krea2_config *c, const char *path, int grid, int t, uint64_t seed) {
    if (t < 1) { dt_set_error("synth: Krea 2 inputs need at least one text token (--text-tokens)"); return -1; }
    int64_t n = (int64_t)grid * grid, L = n + t;
    float *img = dt_malloc(sizeof(float) * n * c->in_channels);
    float *txt = dt_malloc(sizeof(float) * (size_t)t * c->text_layers * c->text_dim);
    float *pos = dt_malloc(sizeof(float) * L * c->n_axes);
    uint8_t *mask = dt_malloc((size_t)t);
    krea2_synth_inputs(c, grid, grid, t, seed, img, txt, pos, mask);
    int valid = 0;
    for (int i = 0; i < t; i++) valid += mask[i];
    float ts = 0.75f;
    st_writer *w = st_writer_new();
    int64_t si[3] = {1, n, c->in_channels}, st[4] = {1, t, c->text_layers, c->text_dim}, sp[2] = {L, c->n_axes};
    int64_t sm[2] = {1, t}, s1[1] = {1};
    st_writer_add_f32(w, "in.hidden_states", 3, si, img);
    st_writer_add_f32(w, "in.encoder_hidden_states", 4, st, txt);
    st_writer_add_f32(w, "in.position_ids", 2, sp, pos);
    st_writer_add(w, "in.encoder_attention_mask", DT_U8, 2, sm, mask);
    st_writer_add_f32(w, "in.timestep", 1, s1, &ts);
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    free(img); free(txt); free(pos); free(mask);
    if (rc) return -1;
    dt_log(1, "ditrun: wrote %s (%lld image + %d text tokens, %d valid)\n", path, (long long)n, t, valid);
    return 0;
}

int dt_synth_krea2(const dt_synth_req *r) {
    krea2_config c;
    if (krea2_preset(r->preset, &c)) return -1;
    if (r->ref_grid) { dt_set_error("--ref-size: Krea 2 takes no reference images (FLUX.2 --inputs only)"); return -1; }
    if (r->inputs) return write_inputs(&c, r->inputs, r->grid, r->text_tokens, r->seed);
    const char *q = r->bits ? (r->bits == 4 ? "q4" : "q8") : "bf16";
    if (r->pipeline) {
        /* tokenizer and scheduler from the bundled tiny Krea 2 pipeline, beside the bundled FLUX.2 one */
        char root[4300];
        dt_synth_bundled_sibling(r->bundled_model, "krea2", root, sizeof root);
        dt_log(1, "ditrun: writing a synthetic %s pipeline (%s) to %s ...\n", r->preset, q, r->out);
        return dt_synth_krea2_pipeline(r->preset, r->dir, r->bits, r->group, r->seed, root);
    }
    dt_log(1, "ditrun: writing synthetic %s checkpoint (%s) to %s ...\n", r->preset, q, r->out);
    return krea2_synth_write(&c, r->dir, r->bits, r->group, r->seed);
}
