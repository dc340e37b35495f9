/* flux2_lora.c — the FLUX.2 transformer's LoRA catalogue: every adapter module name users' files carry, mapped
 * onto the diffusers modules flux2_load asks for (models/lora.h).
 *   diffusers  transformer_blocks.N.attn.to_q, ..., single_transformer_blocks.N.attn.to_qkv_mlp_proj (as loaded)
 *   BFL        double_blocks.N.img_attn.qkv -> to_q | to_k | to_v (B's thirds, one A), single_blocks.N.linear1,
 *              final_layer.adaLN_modulation.1 -> norm_out.linear with B's halves swapped (BFL shift|scale,
 *              diffusers scale|shift: the same swap as the weights; see NOTES.md)
 *   mflux      attn.to_out (no .0), time_guidance_embed.linear_1/2
 *   split      FLUX.1-style single-block parts: attn.to_q / to_k / to_v / proj_mlp -> rows of to_qkv_mlp_proj,
 *              proj_out -> attn.to_out
 * Each also under kohya's underscore spelling (lora_unet_double_blocks_0_img_attn_qkv, ...). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux2_layouts.h"
#include "flux2_lora.h"
#include "lora.h"

/* rows and inputs of diffusers module NAME in w (after flux2_layout_install); 0 when absent */
static int shape_of(const dt_weights *w, const char *name, int64_t *out, int64_t *in) {
    dt_linear_src s;
    if (dt_weights_linear(w, name, -1, -1, 0, &s)) { dt_clear_error(); return 0; }
    *out = s.out;
    *in = s.in;
    return 1;
}

/* An adapter module in a non-diffusers layout: its diffusers targets through flux2_map_key. */
static void add_mapped(dt_lora_catalogue *cat, const dt_weights *w, flux2_layout l, const char *name) {
    char key[300];
    snprintf(key, sizeof key, "%s.weight", name);
    flux2_key_map m[3];
    int k = flux2_map_key(l, key, m);
    if (k <= 0) return;
    dt_lora_piece p[3];
    char targets[3][256];
    int np = 0;
    int64_t out = 0, in = -1;
    for (int j = 0; j < k; j++) {
        size_t len = strlen(m[j].name);
        if (len < 8 || strcmp(m[j].name + len - 7, ".weight")) return;
        snprintf(targets[j], sizeof targets[j], "%.*s", (int)(len - 7), m[j].name);
        int64_t o, i;
        if (!shape_of(w, targets[j], &o, &i) || (in >= 0 && i != in)) return;
        in = i;
        if (m[j].part == FLUX2_PART_SWAP) {
            if (o % 2) return;
            p[np++] = (dt_lora_piece){targets[j], 0, o / 2, o / 2};
            p[np++] = (dt_lora_piece){targets[j], o / 2, 0, o / 2};
            out += o;
        } else {
            /* WHOLE, or part j of a fused q|k|v: the parts are in order, each the size of its target */
            p[np++] = (dt_lora_piece){targets[j], 0, out, o};
            out += o;
        }
    }
    dt_lora_catalogue_add(cat, name, out, in, np, p);
}

dt_lora_catalogue *flux2_lora_catalogue(const dt_weights *w, const flux2_config *c) {
    dt_lora_catalogue *cat = dt_lora_catalogue_new();
    char **names;
    int *is_norm;
    int n = flux2_diffusers_names(c, &names, &is_norm);
    for (int i = 0; i < n; i++) {
        int64_t out, in;
        if (!is_norm[i] && shape_of(w, names[i], &out, &in)) dt_lora_catalogue_add_module(cat, names[i], out, in);
    }
    flux2_names_free(names, is_norm, n);
    char nm[256];
    static const char *const globals[] = {"img_in", "txt_in", "time_in.in_layer", "time_in.out_layer",
        "double_stream_modulation_img.lin", "double_stream_modulation_txt.lin", "single_stream_modulation.lin",
        "final_layer.linear", "final_layer.adaLN_modulation.1"};
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++) add_mapped(cat, w, FLUX2_LAYOUT_BFL, globals[i]);
    add_mapped(cat, w, FLUX2_LAYOUT_MFLUX, "time_guidance_embed.linear_1");
    add_mapped(cat, w, FLUX2_LAYOUT_MFLUX, "time_guidance_embed.linear_2");
    static const char *const dbl[] = {"img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj",
                                      "img_mlp.0", "img_mlp.2", "txt_mlp.0", "txt_mlp.2"};
    for (int b = 0; b < c->num_layers; b++) {
        for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++) {
            snprintf(nm, sizeof nm, "double_blocks.%d.%s", b, dbl[i]);
            add_mapped(cat, w, FLUX2_LAYOUT_BFL, nm);
        }
        snprintf(nm, sizeof nm, "transformer_blocks.%d.attn.to_out", b);
        add_mapped(cat, w, FLUX2_LAYOUT_MFLUX, nm);
    }
    const int64_t D = c->hidden, F = c->mlp_hidden;
    for (int b = 0; b < c->num_single_layers; b++) {
        snprintf(nm, sizeof nm, "single_blocks.%d.linear1", b);
        add_mapped(cat, w, FLUX2_LAYOUT_BFL, nm);
        snprintf(nm, sizeof nm, "single_blocks.%d.linear2", b);
        add_mapped(cat, w, FLUX2_LAYOUT_BFL, nm);
        char fused[256], out[256];
        snprintf(fused, sizeof fused, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", b);
        snprintf(out, sizeof out, "single_transformer_blocks.%d.attn.to_out", b);
        int64_t fo, fi, oo, oi;
        if (shape_of(w, fused, &fo, &fi) && fo == 3 * D + 2 * F) {
            static const char *const part[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
            for (int k = 0; k < 3; k++) {
                snprintf(nm, sizeof nm, "single_transformer_blocks.%d.%s", b, part[k]);
                dt_lora_piece p = {fused, k * D, 0, D};
                dt_lora_catalogue_add(cat, nm, D, fi, 1, &p);
            }
            snprintf(nm, sizeof nm, "single_transformer_blocks.%d.proj_mlp", b);
            dt_lora_piece p = {fused, 3 * D, 0, 2 * F};
            dt_lora_catalogue_add(cat, nm, 2 * F, fi, 1, &p);
        }
        if (shape_of(w, out, &oo, &oi)) {
            snprintf(nm, sizeof nm, "single_transformer_blocks.%d.proj_out", b);
            dt_lora_piece p = {out, 0, 0, oo};
            dt_lora_catalogue_add(cat, nm, oo, oi, 1, &p);
        }
    }
    return cat;
}
