/* synth_flux2_dit.c — synthetic FLUX.2-klein transformer checkpoints with random weights (synth_dit.h; for tests at
 * the real geometry, the bench and GPU runs; no real weights are needed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "synth.h"
#include "synth_dit.h"

/* Every tensor of the diffusers layout for geometry c. */
static void list_tensors(const flux2_config *c, synth_list *l) {
    int64_t D = c->hidden, F = c->mlp_hidden, hd = c->head_dim;
    char nm[256];
    synth_add_linear(l, "x_embedder", D, c->in_channels, 0);
    synth_add_linear(l, "context_embedder", D, c->joint_dim, 0);
    synth_add_linear(l, "time_guidance_embed.timestep_embedder.linear_1", D, c->tg_channels, 0);
    synth_add_linear(l, "time_guidance_embed.timestep_embedder.linear_2", D, D, 0);
    synth_add_linear(l, "double_stream_modulation_img.linear", 6 * D, D, 0);
    synth_add_linear(l, "double_stream_modulation_txt.linear", 6 * D, D, 0);
    synth_add_linear(l, "single_stream_modulation.linear", 3 * D, D, 0);
    synth_add_linear(l, "norm_out.linear", 2 * D, D, 0);
    synth_add_linear(l, "proj_out", c->out_channels, D, 0);
    const char *dl[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                        "attn.add_v_proj", "attn.to_add_out"};
    const char *dn[] = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"};
    for (int i = 0; i < c->num_layers; i++) {
        for (int k = 0; k < 8; k++) { snprintf(nm, sizeof nm, "transformer_blocks.%d.%s", i, dl[k]); synth_add_linear(l, nm, D, D, 0); }
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff.linear_in", i); synth_add_linear(l, nm, 2 * F, D, 0);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff.linear_out", i); synth_add_linear(l, nm, D, F, 0);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff_context.linear_in", i); synth_add_linear(l, nm, 2 * F, D, 0);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff_context.linear_out", i); synth_add_linear(l, nm, D, F, 0);
        for (int k = 0; k < 4; k++) { snprintf(nm, sizeof nm, "transformer_blocks.%d.%s.weight", i, dn[k]); synth_add(l, nm, 1, &hd, 1.0f, 0.5f); }
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i); synth_add_linear(l, nm, 3 * D + 2 * F, D, 0);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_out", i); synth_add_linear(l, nm, D, D + F, 0);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_q.weight", i); synth_add(l, nm, 1, &hd, 1.0f, 0.5f);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_k.weight", i); synth_add(l, nm, 1, &hd, 1.0f, 0.5f);
    }
}

static int write_config(const flux2_config *c, const char *dir, int bits, int group) {
    dt_outfile *of = synth_config_begin(dir, "Flux2Transformer2DModel", c->head_dim, c->axes, c->n_axes);
    if (!of) return -1;
    fprintf(dt_outfile_fp(of),
            ",\n  \"eps\": %g,\n  \"guidance_embeds\": false,\n  \"in_channels\": %d,\n  \"out_channels\": %d,\n"
            "  \"joint_attention_dim\": %d,\n  \"mlp_ratio\": %.17g,\n  \"num_attention_heads\": %d,\n  \"num_layers\": %d,\n"
            "  \"num_single_layers\": %d,\n  \"patch_size\": 1,\n  \"rope_theta\": %g,\n  \"timestep_guidance_channels\": %d",
            c->eps, c->in_channels, c->out_channels, c->joint_dim, (double)c->mlp_hidden / c->hidden, c->heads,
            c->num_layers, c->num_single_layers, c->rope_theta, c->tg_channels);
    return synth_config_end(of, bits, group);
}

int flux2_synth_write(const flux2_config *c, const char *dir, int bits, int group, uint64_t seed) {
    if (bits && bits != 4 && bits != 8) { dt_set_error("synthetic checkpoint: bits must be 0, 4 or 8"); return -1; }
    if (synth_mkdir(dir)) return -1;
    if (write_config(c, dir, bits, group)) return -1;
    synth_list l = {0};
    list_tensors(c, &l);
    for (int i = 0; i < l.n && bits; i++)
        if (l.t[i].quantizable && l.t[i].shape[1] % group) {
            dt_set_error("synthetic checkpoint: %s has %lld inputs, not a multiple of group %d", l.t[i].name,
                         (long long)l.t[i].shape[1], group);
            synth_list_free(&l);
            return -1;
        }
    return synth_write_model(&l, dir, bits, group, seed);
}
