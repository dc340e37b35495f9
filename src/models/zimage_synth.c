/* zimage_synth.c — Z-Image geometry presets and synthetic checkpoints with random weights (the diffusers
 * ZImageTransformer2DModel layout: config.json + model.safetensors, bf16 or MLX-quantized Linears), for tests at
 * the real geometry, the bench and GPU runs without real weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"
#include "zimage.h"

int zimage_preset(const char *name, zimage_config *c) {
    memset(c, 0, sizeof *c);
    c->in_channels = 16;
    c->patch = 2;
    c->qk_norm = 1;
    c->rope_theta = 256.0f;
    c->t_scale = 1000.0f;
    c->eps = 1e-5f;
    c->t_mid = 1024;   /* fixed in the reference's code */
    if (!strcmp(name, "z-image-turbo")) {
        /* ZImageTransformer2DModel's defaults (diffusers transformer_z_image.py): Z-Image(-Turbo), 6 B */
        c->dim = 3840; c->n_layers = 30; c->n_refiner = 2; c->heads = 30; c->cap_dim = 2560;
        c->axes[0] = 32; c->axes[1] = 48; c->axes[2] = 48;
        c->axes_len[0] = 1024; c->axes_len[1] = 512; c->axes_len[2] = 512;
    } else if (!strcmp(name, "z-image-tiny")) {
        /* tests/fixtures/zimage/model/transformer/config.json */
        c->dim = 32; c->n_layers = 2; c->n_refiner = 2; c->heads = 2; c->cap_dim = 32;
        c->axes[0] = 4; c->axes[1] = 6; c->axes[2] = 6;
        c->axes_len[0] = 256; c->axes_len[1] = 32; c->axes_len[2] = 32;
    } else {
        dt_set_error("unknown Z-Image preset '%s' (z-image-turbo, z-image-tiny)", name);
        return -1;
    }
    c->head_dim = c->dim / c->heads;
    c->patch_channels = c->patch * c->patch * c->in_channels;
    c->ffn = (int)((double)c->dim / 3.0 * 8.0);
    c->adaln = c->dim < ZIMAGE_ADALN_MAX ? c->dim : ZIMAGE_ADALN_MAX;
    return 0;
}

/* A block under PREFIX (its adaLN only when modulated). */
static void add_block(synth_list *l, const zimage_config *c, const char *prefix, int modulated) {
    char nm[256];
    int64_t D = c->dim, F = c->ffn, hd = c->head_dim;
    const char *lin[4] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int j = 0; j < 4; j++) {
        snprintf(nm, sizeof nm, "%s.attention.%s", prefix, lin[j]);
        synth_add_linear(l, nm, D, D, 0);
    }
    snprintf(nm, sizeof nm, "%s.attention.norm_q.weight", prefix); synth_add(l, nm, 1, &hd, 1.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.attention.norm_k.weight", prefix); synth_add(l, nm, 1, &hd, 1.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.feed_forward.w1", prefix); synth_add_linear(l, nm, F, D, 0);
    snprintf(nm, sizeof nm, "%s.feed_forward.w2", prefix); synth_add_linear(l, nm, D, F, 0);
    snprintf(nm, sizeof nm, "%s.feed_forward.w3", prefix); synth_add_linear(l, nm, F, D, 0);
    const char *norms[4] = {"attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"};
    for (int j = 0; j < 4; j++) {
        snprintf(nm, sizeof nm, "%s.%s.weight", prefix, norms[j]);
        synth_add(l, nm, 1, &D, 1.0f, 0.1f);
    }
    if (modulated) {   /* scales and gates around 0.1 in magnitude (trained models have small gates) */
        snprintf(nm, sizeof nm, "%s.adaLN_modulation.0", prefix);
        synth_add_linear(l, nm, 4 * D, c->adaln, 1);
        for (int i = l->n - 2; i < l->n; i++) l->t[i].amp *= 0.2f;
    }
}

int zimage_synth_write(const zimage_config *c, const char *dir, int bits, int group, uint64_t seed) {
    if (bits && bits != 4 && bits != 8) { dt_set_error("synthetic checkpoint: bits must be 0, 4 or 8"); return -1; }
    if (bits && group != 32 && group != 64 && group != 128) {
        dt_set_error("synthetic checkpoint: group size must be 32, 64 or 128");
        return -1;
    }
    if (c->heads < 1 || c->dim != c->heads * c->head_dim || c->axes[0] + c->axes[1] + c->axes[2] != c->head_dim ||
        c->t_mid < 1 || c->patch < 1) {
        dt_set_error("synthetic checkpoint: inconsistent Z-Image geometry (dim, heads, axes)");
        return -1;
    }
    if (synth_mkdir(dir)) return -1;
    char q[128], path[1024], text[2048];
    synth_quantization_entry(q, sizeof q, bits, group);
    snprintf(text, sizeof text,
             "{\n  \"_class_name\": \"ZImageTransformer2DModel\",\n  \"all_f_patch_size\": [1],\n"
             "  \"all_patch_size\": [%d],\n  \"axes_dims\": [%d, %d, %d],\n  \"axes_lens\": [%d, %d, %d],\n"
             "  \"cap_feat_dim\": %d,\n  \"dim\": %d,\n  \"in_channels\": %d,\n  \"n_heads\": %d,\n"
             "  \"n_kv_heads\": %d,\n  \"n_layers\": %d,\n  \"n_refiner_layers\": %d,\n  \"norm_eps\": %.9g,\n"
             "  \"qk_norm\": %s,\n  \"rope_theta\": %.9g,\n  \"t_scale\": %.9g%s\n}\n",
             c->patch, c->axes[0], c->axes[1], c->axes[2], c->axes_len[0], c->axes_len[1], c->axes_len[2], c->cap_dim,
             c->dim, c->in_channels, c->heads, c->heads, c->n_layers, c->n_refiner, (double)c->eps,
             c->qk_norm ? "true" : "false", (double)c->rope_theta, (double)c->t_scale, q);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (synth_write_text(path, text)) return -1;
    synth_list l = {0};
    const int64_t D = c->dim, one_d[2] = {1, D};
    char nm[256];
    snprintf(nm, sizeof nm, "all_x_embedder.%d-1", c->patch); synth_add_linear(&l, nm, D, c->patch_channels, 1);
    snprintf(nm, sizeof nm, "all_final_layer.%d-1.linear", c->patch); synth_add_linear(&l, nm, c->patch_channels, D, 1);
    snprintf(nm, sizeof nm, "all_final_layer.%d-1.adaLN_modulation.1", c->patch); synth_add_linear(&l, nm, D, c->adaln, 1);
    synth_add_linear(&l, "t_embedder.mlp.0", c->t_mid, ZIMAGE_T_FREQ, 1);
    synth_add_linear(&l, "t_embedder.mlp.2", c->adaln, c->t_mid, 1);
    const int64_t cap = c->cap_dim;
    synth_add(&l, "cap_embedder.0.weight", 1, &cap, 1.0f, 0.1f);
    synth_add_linear(&l, "cap_embedder.1", D, c->cap_dim, 1);
    synth_add(&l, "x_pad_token", 2, one_d, 0.0f, 1.0f);
    synth_add(&l, "cap_pad_token", 2, one_d, 0.0f, 1.0f);
    for (int i = 0; i < c->n_refiner; i++) {
        snprintf(nm, sizeof nm, "noise_refiner.%d", i); add_block(&l, c, nm, 1);
        snprintf(nm, sizeof nm, "context_refiner.%d", i); add_block(&l, c, nm, 0);
    }
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(nm, sizeof nm, "layers.%d", i);
        add_block(&l, c, nm, 1);
    }
    return synth_write_model(&l, dir, bits, group, seed);
}
