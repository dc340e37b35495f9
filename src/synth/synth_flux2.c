/* synth_flux2.c — FLUX.2-klein's synthetic writers (its family's `synth`, family.h): a whole pipeline folder (random
 * weights at a real geometry): transformer (flux2_synth_write), Qwen3 text encoder, VAE (decoder and encoder), plus
 * the bundled tokenizer and scheduler config, so `ditrun generate` runs end to end at klein-4B/9B size without
 * downloading weights (speed runs, memory checks); and random forward inputs for `ditrun forward`. */
#include "synth_pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "models/flux2.h"
#include "synth.h"
#include "synth_dit.h"

typedef dt_synth_vae_geom vae_geom;

int dt_synth_write_qwen3(const char *dir, const dt_synth_text_geom *g, int bits, int group, uint64_t seed) {
    char cfg[2048], quant[96];
    synth_quantization_entry(quant, sizeof quant, bits, group);   /* the group size the weights are written with */
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"model_type\": \"qwen3\",\n  \"hidden_size\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
             "  \"intermediate_size\": %d,\n  \"vocab_size\": %d,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 1000000.0,\n"
             "  \"tie_word_embeddings\": true%s\n}\n",
             g->hidden, g->layers, g->heads, g->kv, g->hd, g->inter, g->vocab, quant);
    return dt_synth_write_text_model(dir, cfg, "model", g, bits, group, seed);
}

static void add_conv(synth_list *l, const char *name, int64_t cout, int64_t cin, int k) {
    char nm[300];
    int64_t s[4] = {cout, cin, k, k};
    snprintf(nm, sizeof nm, "%s.weight", name);
    synth_add(l, nm, 4, s, 0.0f, 1.7320508f / sqrtf((float)(cin * k * k)));
    snprintf(nm, sizeof nm, "%s.bias", name);
    synth_add(l, nm, 1, &cout, 0.0f, 0.02f);
}

static void add_gn(synth_list *l, const char *name, int64_t c) {
    char nm[300];
    snprintf(nm, sizeof nm, "%s.weight", name); synth_add(l, nm, 1, &c, 1.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.bias", name); synth_add(l, nm, 1, &c, 0.0f, 0.05f);
}

static void add_resnet(synth_list *l, const char *name, int64_t cin, int64_t cout) {
    char nm[300];
    snprintf(nm, sizeof nm, "%s.norm1", name); add_gn(l, nm, cin);
    snprintf(nm, sizeof nm, "%s.conv1", name); add_conv(l, nm, cout, cin, 3);
    snprintf(nm, sizeof nm, "%s.norm2", name); add_gn(l, nm, cout);
    snprintf(nm, sizeof nm, "%s.conv2", name); add_conv(l, nm, cout, cout, 3);
    if (cin != cout) { snprintf(nm, sizeof nm, "%s.conv_shortcut", name); add_conv(l, nm, cout, cin, 1); }
}

int dt_synth_write_vae(const char *dir, const vae_geom *g, int kl, uint64_t seed) {
    if (synth_mkdir(dir)) return -1;
    char p[8500], cfg[2048], blk[128] = "", types[512] = "", dtypes[512] = "";
    for (int i = 0; i < g->nblk; i++) {
        size_t n = strlen(blk);
        snprintf(blk + n, sizeof blk - n, "%s%d", i ? ", " : "", g->blk[i]);
        n = strlen(types);
        snprintf(types + n, sizeof types - n, "%s\"UpDecoderBlock2D\"", i ? ", " : "");
        n = strlen(dtypes);
        snprintf(dtypes + n, sizeof dtypes - n, "%s\"DownEncoderBlock2D\"", i ? ", " : "");
    }
    if (kl)   /* FLUX.1's / Z-Image's AutoencoderKL: no latent batch norm, no quant convs, scaling and shift */
        snprintf(cfg, sizeof cfg,
                 "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"act_fn\": \"silu\",\n  \"block_out_channels\": [%s],\n"
                 "  \"down_block_types\": [%s],\n  \"force_upcast\": true,\n  \"in_channels\": 3,\n  \"out_channels\": 3,\n"
                 "  \"latent_channels\": %d,\n  \"layers_per_block\": %d,\n  \"mid_block_add_attention\": true,\n"
                 "  \"norm_num_groups\": %d,\n  \"sample_size\": 1024,\n  \"scaling_factor\": 0.3611,\n  \"shift_factor\": 0.1159,\n"
                 "  \"up_block_types\": [%s],\n  \"use_post_quant_conv\": false,\n  \"use_quant_conv\": false\n}\n",
                 blk, dtypes, g->latent, g->lpb, g->groups, types);
    else
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"AutoencoderKLFlux2\",\n  \"act_fn\": \"silu\",\n  \"batch_norm_eps\": 0.0001,\n"
             "  \"block_out_channels\": [%s],\n  \"down_block_types\": [%s],\n  \"in_channels\": 3,\n  \"out_channels\": 3,\n  \"latent_channels\": %d,\n"
             "  \"layers_per_block\": %d,\n  \"mid_block_add_attention\": true,\n  \"norm_num_groups\": %d,\n"
             "  \"patch_size\": [2, 2],\n  \"up_block_types\": [%s],\n  \"use_post_quant_conv\": true,\n  \"use_quant_conv\": true\n}\n",
             blk, dtypes, g->latent, g->lpb, g->groups, types);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (synth_write_text(p, cfg)) return -1;
    synth_list l = {0};
    char nm[300];
    int64_t lat = g->latent, bn = 4 * g->latent, top = g->blk[g->nblk - 1];
    if (!kl) {
        synth_add(&l, "bn.running_mean", 1, &bn, 0.0f, 0.3f);
        synth_add(&l, "bn.running_var", 1, &bn, 1.0f, 0.5f);
        add_conv(&l, "post_quant_conv", lat, lat, 1);
    }
    add_conv(&l, "decoder.conv_in", top, lat, 3);
    add_resnet(&l, "decoder.mid_block.resnets.0", top, top);
    add_gn(&l, "decoder.mid_block.attentions.0.group_norm", top);
    synth_add_linear(&l, "decoder.mid_block.attentions.0.to_q", top, top, 1);
    synth_add_linear(&l, "decoder.mid_block.attentions.0.to_k", top, top, 1);
    synth_add_linear(&l, "decoder.mid_block.attentions.0.to_v", top, top, 1);
    synth_add_linear(&l, "decoder.mid_block.attentions.0.to_out.0", top, top, 1);
    add_resnet(&l, "decoder.mid_block.resnets.1", top, top);
    int64_t prev = top;
    for (int b = 0; b < g->nblk; b++) {
        int64_t out = g->blk[g->nblk - 1 - b];
        for (int r = 0; r <= g->lpb; r++) {
            snprintf(nm, sizeof nm, "decoder.up_blocks.%d.resnets.%d", b, r);
            add_resnet(&l, nm, r == 0 ? prev : out, out);
        }
        if (b < g->nblk - 1) { snprintf(nm, sizeof nm, "decoder.up_blocks.%d.upsamplers.0.conv", b); add_conv(&l, nm, out, out, 3); }
        prev = out;
    }
    add_gn(&l, "decoder.conv_norm_out", g->blk[0]);
    add_conv(&l, "decoder.conv_out", 3, g->blk[0], 3);
    /* the encoder (reference images and inpainting): conv_in, down blocks (layers_per_block resnets, a stride-2
     * conv between blocks), mid block, conv_out to 2 x latent channels, quant_conv */
    add_conv(&l, "encoder.conv_in", g->blk[0], 3, 3);
    prev = g->blk[0];
    for (int b = 0; b < g->nblk; b++) {
        int64_t out = g->blk[b];
        for (int r = 0; r < g->lpb; r++) {
            snprintf(nm, sizeof nm, "encoder.down_blocks.%d.resnets.%d", b, r);
            add_resnet(&l, nm, r == 0 ? prev : out, out);
        }
        if (b < g->nblk - 1) { snprintf(nm, sizeof nm, "encoder.down_blocks.%d.downsamplers.0.conv", b); add_conv(&l, nm, out, out, 3); }
        prev = out;
    }
    add_resnet(&l, "encoder.mid_block.resnets.0", top, top);
    add_gn(&l, "encoder.mid_block.attentions.0.group_norm", top);
    synth_add_linear(&l, "encoder.mid_block.attentions.0.to_q", top, top, 1);
    synth_add_linear(&l, "encoder.mid_block.attentions.0.to_k", top, top, 1);
    synth_add_linear(&l, "encoder.mid_block.attentions.0.to_v", top, top, 1);
    synth_add_linear(&l, "encoder.mid_block.attentions.0.to_out.0", top, top, 1);
    add_resnet(&l, "encoder.mid_block.resnets.1", top, top);
    add_gn(&l, "encoder.conv_norm_out", top);
    add_conv(&l, "encoder.conv_out", 2 * lat, top, 3);
    if (!kl) add_conv(&l, "quant_conv", 2 * lat, 2 * lat, 1);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    int rc = synth_write(&l, p, 0, 64, DT_F32, seed);
    synth_list_free(&l);
    return rc;
}

int dt_synth_pipeline(const char *preset, const char *dir, int bits, int group, uint64_t seed, const char *fixtures_model) {
    flux2_config c;
    if (flux2_preset(preset, &c)) return -1;
    dt_synth_text_geom te;
    vae_geom vg = {32, 4, {128, 256, 512, 512}, 2, 32};
    if (!strcmp(preset, "klein-4b")) te = (dt_synth_text_geom){2560, 36, 32, 8, 128, 9728, 151936};
    else if (!strcmp(preset, "klein-9b")) te = (dt_synth_text_geom){4096, 36, 32, 8, 128, 12288, 151936};
    else { te = (dt_synth_text_geom){32, 4, 4, 2, 16, 96, 705}; vg = (vae_geom){8, 3, {32, 32, 32}, 1, 8}; }
    if (c.joint_dim != 3 * te.hidden || c.in_channels != 4 * vg.latent) {
        dt_set_error("synthetic pipeline: preset '%s' geometry is inconsistent", preset);
        return -1;
    }
    char p[4200];
    if (synth_mkdir(dir)) return -1;
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    if (synth_write_text(p, "{\n  \"_class_name\": \"Flux2KleinPipeline\",\n  \"is_distilled\": true,\n"
                            "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
                            "  \"text_encoder\": [\"transformers\", \"Qwen3ForCausalLM\"],\n"
                            "  \"tokenizer\": [\"transformers\", \"TokenizersBackend\"],\n"
                            "  \"transformer\": [\"diffusers\", \"Flux2Transformer2DModel\"],\n"
                            "  \"vae\": [\"diffusers\", \"AutoencoderKLFlux2\"]\n}\n"))
        return -1;
    dt_log(1, "ditrun: synthetic pipeline: transformer ...\n");
    snprintf(p, sizeof p, "%s/transformer", dir);
    if (flux2_synth_write(&c, p, bits, group, seed)) return -1;
    /* the reference pipeline can load the same folder for side-by-side runs (bf16 weights) */
    if (dt_synth_name_transformer_for_diffusers(dir)) return -1;
    return dt_synth_qwen3_pipeline_parts(dir, "pipeline", &te, &vg, 0, bits, group, seed, fixtures_model);
}

/* Random forward inputs for a grid x grid latent and t text tokens (uniform values, never zeros), and with
 * ref_grid > 0 the tokens of one ref_grid x ref_grid reference image (ids T = 10, row, column, 0). */
static int write_inputs(const flux2_config *c, const char *path, int grid, int t, int ref_grid, uint64_t seed) {
    int64_t n = (int64_t)grid * grid, nr = (int64_t)ref_grid * ref_grid;
    float *img = dt_malloc(sizeof(float) * n * c->in_channels), *txt = dt_malloc(sizeof(float) * (t ? t : 1) * c->joint_dim);
    float *iid = dt_calloc((size_t)n * 4, sizeof(float)), *tid = dt_calloc((size_t)(t ? t : 1) * 4, sizeof(float));
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
    for (int64_t i = 0; i < n * c->in_channels; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; img[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
    for (int64_t i = 0; i < (int64_t)t * c->joint_dim; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; txt[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
    for (int r = 0; r < grid; r++)
        for (int col = 0; col < grid; col++) { iid[(r * grid + col) * 4 + 1] = (float)r; iid[(r * grid + col) * 4 + 2] = (float)col; }
    for (int l = 0; l < t; l++) tid[l * 4 + 3] = (float)l;
    float ts = 0.75f;
    st_writer *w = st_writer_new();
    int64_t si[3] = {1, n, c->in_channels}, st[3] = {1, t, c->joint_dim}, sii[3] = {1, n, 4}, sti[3] = {1, t, 4}, s1[1] = {1};
    st_writer_add_f32(w, "in.hidden_states", 3, si, img);
    st_writer_add_f32(w, "in.encoder_hidden_states", 3, st, txt);
    st_writer_add_f32(w, "in.img_ids", 3, sii, iid);
    st_writer_add_f32(w, "in.txt_ids", 3, sti, tid);
    st_writer_add_f32(w, "in.timestep", 1, s1, &ts);
    float *ref = NULL, *rid = NULL;
    if (nr > 0) {
        ref = dt_malloc(sizeof(float) * nr * c->in_channels);
        rid = dt_calloc((size_t)nr * 4, sizeof(float));
        for (int64_t i = 0; i < nr * c->in_channels; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; ref[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
        for (int64_t i = 0; i < nr; i++) { rid[i * 4] = 10; rid[i * 4 + 1] = (float)(i / ref_grid); rid[i * 4 + 2] = (float)(i % ref_grid); }
        int64_t sr[3] = {1, nr, c->in_channels}, sri[3] = {1, nr, 4};
        st_writer_add_f32(w, "in.ref_hidden_states", 3, sr, ref);
        st_writer_add_f32(w, "in.ref_ids", 3, sri, rid);
    }
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    free(img); free(txt); free(iid); free(tid); free(ref); free(rid);
    if (rc) return -1;
    dt_log(1, "ditrun: wrote %s (%lld image + %d text tokens", path, (long long)n, t);
    if (nr > 0) dt_log(1, " + %lld reference tokens", (long long)nr);
    dt_log(1, ")\n");
    return 0;
}

int dt_synth_flux2(const dt_synth_req *r) {
    flux2_config c;
    if (flux2_preset(r->preset, &c)) return -1;
    if (r->inputs) return write_inputs(&c, r->inputs, r->grid, r->text_tokens, r->ref_grid, r->seed);
    dt_log(1, "ditrun: writing synthetic %s checkpoint (%s) to %s ...\n", r->preset,
           r->bits ? (r->bits == 4 ? "q4" : "q8") : "bf16", r->out);
    return r->pipeline ? dt_synth_pipeline(r->preset, r->dir, r->bits, r->group, r->seed, r->bundled_model)
                       : flux2_synth_write(&c, r->dir, r->bits, r->group, r->seed);
}
