/* synth_krea2_dit.c — synthetic Krea 2 transformer checkpoints with random weights (synth_dit.h; the
 * diffusers Krea2Transformer2DModel layout: config.json + model.safetensors, bf16 or MLX-quantized
 * Linears), for tests at the real geometry, the bench and GPU runs without real weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "synth_dit.h"

/* Scale the amplitude of the last `n` tensors added (e.g. a Linear's weight and bias). */
static void scale_last(synth_list *l, int n, float f) {
    for (int i = l->n - n; i < l->n; i++) l->t[i].amp *= f;
}

/* Krea2Attention + Krea2SwiGLU + the two zero-centred norms of a block under PREFIX. */
static void add_attn_ff(synth_list *l, const char *prefix, int64_t dim, int heads, int kv_heads, int64_t inter) {
    char nm[512];
    int64_t hd = dim / heads, dkv = (int64_t)kv_heads * hd;
    snprintf(nm, sizeof nm, "%s.attn.norm_k.weight", prefix); synth_add(l, nm, 1, &hd, 0.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.attn.norm_q.weight", prefix); synth_add(l, nm, 1, &hd, 0.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.attn.to_gate", prefix); synth_add_linear(l, nm, dim, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_k", prefix); synth_add_linear(l, nm, dkv, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_out.0", prefix); synth_add_linear(l, nm, dim, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_q", prefix); synth_add_linear(l, nm, dim, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_v", prefix); synth_add_linear(l, nm, dkv, dim, 0);
    snprintf(nm, sizeof nm, "%s.ff.down", prefix); synth_add_linear(l, nm, dim, inter, 0);
    snprintf(nm, sizeof nm, "%s.ff.gate", prefix); synth_add_linear(l, nm, inter, dim, 0);
    snprintf(nm, sizeof nm, "%s.ff.up", prefix); synth_add_linear(l, nm, inter, dim, 0);
    snprintf(nm, sizeof nm, "%s.norm1.weight", prefix); synth_add(l, nm, 1, &dim, 0.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.norm2.weight", prefix); synth_add(l, nm, 1, &dim, 0.0f, 0.1f);
}

/* Every tensor of the diffusers layout for geometry c (names and shapes as in the fixture checkpoint;
 * biases only where diffusers has them: img_in, time_embed, time_mod_proj, txt_in, final_layer). */
static void list_tensors(const krea2_config *c, synth_list *l) {
    int64_t D = c->hidden, E = c->text_dim, Y = c->text_layers;
    char nm[256];
    int64_t s2[2];
    synth_add_linear(l, "final_layer.linear", c->out_channels, D, 1);
    synth_add(l, "final_layer.norm.weight", 1, &D, 0.0f, 0.1f);
    s2[0] = 2; s2[1] = D;
    synth_add(l, "final_layer.scale_shift_table", 2, s2, 0.0f, 0.05f);
    synth_add_linear(l, "img_in", D, c->in_channels, 1);
    for (int i = 0; i < c->n_layerwise; i++) {
        snprintf(nm, sizeof nm, "text_fusion.layerwise_blocks.%d", i);
        add_attn_ff(l, nm, E, c->text_heads, c->text_kv_heads, c->text_intermediate);
    }
    /* projector Linear(Y -> 1, bias=False): dense (Y is never a multiple of a quantization group), positive
     * weights summing to about 1 like a learned layer average */
    s2[0] = 1; s2[1] = Y;
    synth_add(l, "text_fusion.projector.weight", 2, s2, 1.0f / (float)Y, 0.5f / (float)Y);
    for (int i = 0; i < c->n_refiner; i++) {
        snprintf(nm, sizeof nm, "text_fusion.refiner_blocks.%d", i);
        add_attn_ff(l, nm, E, c->text_heads, c->text_kv_heads, c->text_intermediate);
    }
    synth_add_linear(l, "time_embed.linear_1", D, c->t_embed, 1);
    synth_add_linear(l, "time_embed.linear_2", D, D, 1);
    /* modulation: keep shift/scale/gate around 0.1 in magnitude (trained models have small gates) */
    synth_add_linear(l, "time_mod_proj", 6 * D, D, 1);
    scale_last(l, 2, 0.2f);
    for (int i = 0; i < c->num_layers; i++) {
        snprintf(nm, sizeof nm, "transformer_blocks.%d", i);
        add_attn_ff(l, nm, D, c->heads, c->kv_heads, c->intermediate);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.scale_shift_table", i);
        s2[0] = 6; s2[1] = D;
        synth_add(l, nm, 2, s2, 0.0f, 0.05f);
    }
    synth_add_linear(l, "txt_in.linear_1", D, E, 1);
    synth_add_linear(l, "txt_in.linear_2", D, D, 1);
    synth_add(l, "txt_in.norm.weight", 1, &E, 0.0f, 0.1f);
}

static int write_config(const krea2_config *c, const char *dir, int bits, int group) {
    dt_outfile *of = synth_config_begin(dir, "Krea2Transformer2DModel", c->head_dim, c->axes, c->n_axes);
    if (!of) return -1;
    fprintf(dt_outfile_fp(of),
            ",\n  \"in_channels\": %d,\n  \"intermediate_size\": %d,\n  \"norm_eps\": %.9g,\n"
            "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"num_layers\": %d,\n"
            "  \"num_layerwise_text_blocks\": %d,\n  \"num_refiner_text_blocks\": %d,\n  \"num_text_layers\": %d,\n"
            "  \"rope_theta\": %.9g,\n  \"text_hidden_dim\": %d,\n  \"text_intermediate_size\": %d,\n"
            "  \"text_num_attention_heads\": %d,\n  \"text_num_key_value_heads\": %d,\n  \"timestep_embed_dim\": %d",
            c->in_channels, c->intermediate, (double)c->eps, c->heads, c->kv_heads, c->num_layers, c->n_layerwise,
            c->n_refiner, c->text_layers, (double)c->rope_theta, c->text_dim, c->text_intermediate, c->text_heads,
            c->text_kv_heads, c->t_embed);
    return synth_config_end(of, bits, group);
}

int krea2_synth_write(const krea2_config *c, const char *dir, int bits, int group, uint64_t seed) {
    if (bits && bits != 4 && bits != 8) { dt_set_error("synthetic checkpoint: bits must be 0, 4 or 8"); return -1; }
    if (bits && group != 32 && group != 64 && group != 128) {
        dt_set_error("synthetic checkpoint: group size must be 32, 64 or 128");
        return -1;
    }
    if (c->heads < 1 || c->kv_heads < 1 || c->heads % c->kv_heads || c->text_heads < 1 || c->text_kv_heads < 1 ||
        c->text_dim % c->text_heads || c->text_heads % c->text_kv_heads || c->hidden != c->heads * c->head_dim) {
        dt_set_error("synthetic checkpoint: inconsistent Krea 2 geometry (heads/kv heads/dims)");
        return -1;
    }
    if (synth_mkdir(dir)) return -1;
    if (write_config(c, dir, bits, group)) return -1;
    /* Linears whose input width is not a multiple of the group stay dense (bf16), as MLX leaves them */
    synth_list l = {0};
    list_tensors(c, &l);
    return synth_write_model(&l, dir, bits, group, seed);
}

/* The pipeline's text layout after the system prefix is dropped: [prompt | PAD | 5 suffix tokens]
 * (pipeline_krea2.py pads in the middle of the template). A quarter of the rest is prompt. */
void krea2_synth_mask(int t, uint8_t *mask) {
    int suffix = t >= 8 ? 5 : t >= 2 ? 1 : 0;
    int prompt = (t - suffix) / 4;
    if (prompt < 1) prompt = t - suffix;
    for (int i = 0; i < t; i++) mask[i] = i < prompt || i >= t - suffix;
}

void krea2_synth_inputs(const krea2_config *c, int grid_h, int grid_w, int t, uint64_t seed, float *img, float *txt,
                        float *pos, uint8_t *mask) {
    int64_t n = (int64_t)grid_h * grid_w;
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 11;
    /* uniform in [-1, 1) (never exactly zero): packed latents and stacked text hidden states */
    for (int64_t i = 0; i < n * c->in_channels; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((s >> 40) / 16777216.0 * 2 - 1);
        img[i] = v != 0.0f ? v : 0.5f;
    }
    for (int64_t i = 0; i < (int64_t)t * c->text_layers * c->text_dim; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((s >> 40) / 16777216.0 * 2 - 1);
        txt[i] = v != 0.0f ? v : 0.5f;
    }
    /* Krea2Pipeline.prepare_position_ids: text rows all zero, image rows (0, row, col) */
    memset(pos, 0, sizeof(float) * (size_t)(t + n) * c->n_axes);
    for (int r = 0; r < grid_h; r++)
        for (int col = 0; col < grid_w; col++) {
            float *p = pos + (size_t)(t + (int64_t)r * grid_w + col) * c->n_axes;
            if (c->n_axes > 1) p[1] = (float)r;
            if (c->n_axes > 2) p[2] = (float)col;
        }
    if (mask) krea2_synth_mask(t, mask);
}
