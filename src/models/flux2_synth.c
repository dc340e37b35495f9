/* flux2_synth.c — FLUX.2-klein geometry presets and synthetic checkpoints with random weights
 * (for tests at the real geometry, the bench and GPU runs; no real weights are needed). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/outfile.h"
#include "io/safetensors.h"
#include "flux2.h"
#include "synth.h"

int flux2_preset(const char *name, flux2_config *c) {
    memset(c, 0, sizeof *c);
    c->head_dim = 128; c->tg_channels = 256; c->n_axes = 4;
    c->axes[0] = c->axes[1] = c->axes[2] = c->axes[3] = 32;
    c->rope_theta = 2000; c->eps = 1e-6f;
    if (!strcmp(name, "klein-4b")) {
        c->in_channels = 128; c->num_layers = 5; c->num_single_layers = 20; c->heads = 24; c->joint_dim = 7680;
    } else if (!strcmp(name, "klein-9b")) {
        c->in_channels = 128; c->num_layers = 8; c->num_single_layers = 24; c->heads = 32; c->joint_dim = 12288;
    } else if (!strcmp(name, "tiny")) {
        c->in_channels = 32; c->num_layers = 1; c->num_single_layers = 2; c->heads = 2; c->joint_dim = 96;
    } else {
        dt_set_error("unknown FLUX.2 preset '%s' (klein-4b, klein-9b, tiny)", name);
        return -1;
    }
    c->out_channels = c->in_channels;
    c->hidden = c->heads * c->head_dim;
    c->mlp_hidden = c->hidden * 3;
    return 0;
}

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
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    dt_outfile *of = dt_outfile_open(p);   /* a temporary renamed into place when complete */
    if (!of) return -1;
    FILE *f = dt_outfile_fp(of);
    fprintf(f, "{\n  \"_class_name\": \"Flux2Transformer2DModel\",\n  \"attention_head_dim\": %d,\n  \"axes_dims_rope\": [",
            c->head_dim);
    for (int a = 0; a < c->n_axes; a++) fprintf(f, "%s%d", a ? ", " : "", c->axes[a]);
    fprintf(f, "],\n  \"eps\": %g,\n  \"guidance_embeds\": false,\n  \"in_channels\": %d,\n  \"out_channels\": %d,\n"
               "  \"joint_attention_dim\": %d,\n  \"mlp_ratio\": %.17g,\n  \"num_attention_heads\": %d,\n  \"num_layers\": %d,\n"
               "  \"num_single_layers\": %d,\n  \"patch_size\": 1,\n  \"rope_theta\": %g,\n  \"timestep_guidance_channels\": %d",
            c->eps, c->in_channels, c->out_channels, c->joint_dim, (double)c->mlp_hidden / c->hidden, c->heads,
            c->num_layers, c->num_single_layers, c->rope_theta, c->tg_channels);
    if (bits) fprintf(f, ",\n  \"quantization\": {\"group_size\": %d, \"bits\": %d}", group, bits);
    fprintf(f, "\n}\n");
    return dt_outfile_commit(of);
}

int flux2_synth_write(const flux2_config *c, const char *dir, int bits, int group, uint64_t seed) {
    if (bits && bits != 4 && bits != 8) { dt_set_error("synthetic checkpoint: bits must be 0, 4 or 8"); return -1; }
    if (mkdir(dir, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", dir, strerror(errno)); return -1; }
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
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int rc = synth_write(&l, p, bits, group, DT_BF16, seed);
    synth_list_free(&l);
    return rc;
}

/* A random LoRA adapter (PEFT / diffusers layout, bf16, alpha = rank) for every Linear of the blocks of geometry
 * c: A [rank, in] ~ U(-1, 1)/sqrt(in), B [out, rank] ~ U(-0.01, 0.01). Streamed: memory ~ one tensor. */
int flux2_synth_lora(const flux2_config *c, const char *path, int rank, uint64_t seed) {
    if (rank < 1 || rank > 4096) { dt_set_error("synth lora: rank %d (1..4096)", rank); return -1; }
    const int64_t D = c->hidden, F = c->mlp_hidden;
    struct { char name[160]; int64_t out, in; } *m = NULL;
    int n = 0;
    static const char *const dl[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
                                     "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"};
    m = dt_calloc((size_t)(c->num_layers * 12 + c->num_single_layers * 2 + 1), sizeof *m);
#define MOD(o, i, ...) do { snprintf(m[n].name, sizeof m[n].name, __VA_ARGS__); m[n].out = (o); m[n].in = (i); n++; } while (0)
    for (int b = 0; b < c->num_layers; b++) {
        for (int k = 0; k < 8; k++) MOD(D, D, "transformer_blocks.%d.%s", b, dl[k]);
        MOD(2 * F, D, "transformer_blocks.%d.ff.linear_in", b);
        MOD(D, F, "transformer_blocks.%d.ff.linear_out", b);
        MOD(2 * F, D, "transformer_blocks.%d.ff_context.linear_in", b);
        MOD(D, F, "transformer_blocks.%d.ff_context.linear_out", b);
    }
    for (int b = 0; b < c->num_single_layers; b++) {
        MOD(3 * D + 2 * F, D, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", b);
        MOD(D, D + F, "single_transformer_blocks.%d.attn.to_out", b);
    }
#undef MOD
    st_stream *s = st_stream_open(path);
    if (!s) { free(m); return -1; }
    char nm[200], meta[96];
    for (int i = 0; i < n; i++) {
        int64_t sa[2] = {rank, m[i].in}, sb[2] = {m[i].out, rank};
        snprintf(nm, sizeof nm, "transformer.%s.lora_A.weight", m[i].name);
        st_stream_declare(s, nm, DT_BF16, 2, sa);
        snprintf(nm, sizeof nm, "transformer.%s.lora_B.weight", m[i].name);
        st_stream_declare(s, nm, DT_BF16, 2, sb);
    }
    snprintf(meta, sizeof meta, "{\"transformer.r\": %d, \"transformer.lora_alpha\": %d}", rank, rank);
    st_stream_set_metadata(s, "lora_adapter_metadata", meta);
    int rc = st_stream_begin_data(s);
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 11;
    for (int i = 0; i < n && !rc; i++)
        for (int ab = 0; ab < 2 && !rc; ab++) {
            int64_t cnt = ab ? m[i].out * rank : rank * m[i].in;
            float amp = ab ? 0.01f : 1.0f / sqrtf((float)m[i].in);
            uint16_t *h = dt_malloc(sizeof(uint16_t) * (size_t)cnt);
            for (int64_t k = 0; k < cnt; k++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                h[k] = dt_f32_to_bf16(amp * (float)((double)(st >> 40) / 8388608.0 - 1.0));
            }
            rc = st_stream_write(s, h, sizeof(uint16_t) * (size_t)cnt);
            free(h);
        }
    free(m);
    if (rc) { st_stream_abort(s); return -1; }
    return st_stream_close(s);
}
