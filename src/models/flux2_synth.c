/* flux2_synth.c — FLUX.2-klein geometry presets and synthetic checkpoints with random weights
 * (for tests at the real geometry, the bench and GPU runs; no real weights are needed). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flux2.h"

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

typedef struct { const char *name; int64_t out, in; int is_norm; } synth_tensor;

static uint64_t rng_next(uint64_t *s) {  /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}
static float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static int list_tensors(const flux2_config *c, synth_tensor **out) {
    int64_t D = c->hidden, F = c->mlp_hidden;
    int cap = 16 + c->num_layers * 16 + c->num_single_layers * 4, n = 0;
    synth_tensor *t = dt_calloc(cap, sizeof *t);
    char nm[256];
#define ADD(o, i, norm) (t[n].name = dt_strdup(nm), t[n].out = (o), t[n].in = (i), t[n].is_norm = (norm), n++)
    snprintf(nm, sizeof nm, "x_embedder"); ADD(D, c->in_channels, 0);
    snprintf(nm, sizeof nm, "context_embedder"); ADD(D, c->joint_dim, 0);
    snprintf(nm, sizeof nm, "time_guidance_embed.timestep_embedder.linear_1"); ADD(D, c->tg_channels, 0);
    snprintf(nm, sizeof nm, "time_guidance_embed.timestep_embedder.linear_2"); ADD(D, D, 0);
    snprintf(nm, sizeof nm, "double_stream_modulation_img.linear"); ADD(6 * D, D, 0);
    snprintf(nm, sizeof nm, "double_stream_modulation_txt.linear"); ADD(6 * D, D, 0);
    snprintf(nm, sizeof nm, "single_stream_modulation.linear"); ADD(3 * D, D, 0);
    snprintf(nm, sizeof nm, "norm_out.linear"); ADD(2 * D, D, 0);
    snprintf(nm, sizeof nm, "proj_out"); ADD(c->out_channels, D, 0);
    const char *dl[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                        "attn.add_v_proj", "attn.to_add_out"};
    const char *dn[] = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"};
    for (int i = 0; i < c->num_layers; i++) {
        for (int k = 0; k < 8; k++) { snprintf(nm, sizeof nm, "transformer_blocks.%d.%s", i, dl[k]); ADD(D, D, 0); }
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff.linear_in", i); ADD(2 * F, D, 0);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff.linear_out", i); ADD(D, F, 0);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff_context.linear_in", i); ADD(2 * F, D, 0);
        snprintf(nm, sizeof nm, "transformer_blocks.%d.ff_context.linear_out", i); ADD(D, F, 0);
        for (int k = 0; k < 4; k++) { snprintf(nm, sizeof nm, "transformer_blocks.%d.%s", i, dn[k]); ADD(c->head_dim, 0, 1); }
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i); ADD(3 * D + 2 * F, D, 0);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_out", i); ADD(D, D + F, 0);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_q", i); ADD(c->head_dim, 0, 1);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_k", i); ADD(c->head_dim, 0, 1);
    }
#undef ADD
    *out = t;
    return n;
}

static int write_config(const flux2_config *c, const char *dir, int bits, int group) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (!f) { dt_set_error("%s: cannot create (%s)", p, strerror(errno)); return -1; }
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
    if (fclose(f)) { dt_set_error("%s: write failed", p); return -1; }
    return 0;
}

int flux2_synth_write(const flux2_config *c, const char *dir, int bits, int group, uint64_t seed) {
    if (bits && bits != 4 && bits != 8) { dt_set_error("synthetic checkpoint: bits must be 0, 4 or 8"); return -1; }
    if (mkdir(dir, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", dir, strerror(errno)); return -1; }
    if (write_config(c, dir, bits, group)) return -1;
    synth_tensor *t;
    int n = list_tensors(c, &t);
    for (int i = 0; i < n && bits; i++)
        if (!t[i].is_norm && t[i].in % group) {
            dt_set_error("synthetic checkpoint: %s has %lld inputs, not a multiple of group %d", t[i].name, (long long)t[i].in, group);
            for (int j = 0; j < n; j++) free((void *)t[j].name);
            free(t);
            return -1;
        }
    char p[4200], nm[300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_stream *s = st_stream_open(p);
    if (!s) { for (int j = 0; j < n; j++) free((void *)t[j].name); free(t); return -1; }
    for (int i = 0; i < n; i++) {
        if (t[i].is_norm) {
            snprintf(nm, sizeof nm, "%s.weight", t[i].name);
            st_stream_declare(s, nm, DT_BF16, 1, &t[i].out);
        } else if (!bits) {
            int64_t sh[2] = {t[i].out, t[i].in};
            snprintf(nm, sizeof nm, "%s.weight", t[i].name);
            st_stream_declare(s, nm, DT_BF16, 2, sh);
        } else {
            int64_t sw[2] = {t[i].out, t[i].in * bits / 32}, sg[2] = {t[i].out, t[i].in / group};
            snprintf(nm, sizeof nm, "%s.weight", t[i].name); st_stream_declare(s, nm, DT_U32, 2, sw);
            snprintf(nm, sizeof nm, "%s.scales", t[i].name); st_stream_declare(s, nm, DT_BF16, 2, sg);
            snprintf(nm, sizeof nm, "%s.biases", t[i].name); st_stream_declare(s, nm, DT_BF16, 2, sg);
        }
    }
    if (bits) {
        char q[64];
        snprintf(q, sizeof q, "{\"group_size\": %d, \"bits\": %d, \"mode\": \"affine\"}", group, bits);
        st_stream_set_metadata(s, "quantization", q);
        st_stream_set_metadata(s, "format", "mlx");
    }
    int rc = st_stream_begin_data(s);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (t[i].is_norm) {
            uint16_t *v = dt_malloc(sizeof(uint16_t) * t[i].out);
            for (int64_t j = 0; j < t[i].out; j++) v[j] = dt_f32_to_bf16(1.0f + 0.5f * rng_uniform(&rng));
            rc = st_stream_write(s, v, sizeof(uint16_t) * t[i].out);
            free(v);
            continue;
        }
        int64_t out = t[i].out, in = t[i].in;
        float amp = sqrtf(3.0f / (float)in);   /* uniform(-a, a) has variance a^2/3 = 1/in */
        if (!bits) {
            uint16_t *w = dt_malloc(sizeof(uint16_t) * in);
            for (int64_t r = 0; r < out && rc == 0; r++) {
                for (int64_t j = 0; j < in; j++) w[j] = dt_f32_to_bf16(amp * rng_uniform(&rng));
                rc = st_stream_write(s, w, sizeof(uint16_t) * in);
            }
            free(w);
        } else {
            /* Random codes straight from the generator (no quantizer pass: a 4B model is written in
             * seconds), scale = 2a/(2^bits-1) and bias = -a jittered per group, so w is uniform in
             * about [-a, a] like the dense case. Written as weights, then scales, then biases. */
            int64_t ng = in / group, pw = in * bits / 32;
            uint32_t *packed = dt_malloc(sizeof(uint32_t) * pw);
            uint16_t *sc = dt_malloc(sizeof(uint16_t) * out * ng), *bi = dt_malloc(sizeof(uint16_t) * out * ng);
            float qmax = (float)((1 << bits) - 1);
            for (int64_t r = 0; r < out && rc == 0; r++) {
                for (int64_t j = 0; j < pw; j++) packed[j] = (uint32_t)(rng_next(&rng) >> 32);
                for (int64_t g = 0; g < ng; g++) {
                    float ag = amp * (1.0f + 0.25f * rng_uniform(&rng));
                    sc[r * ng + g] = dt_f32_to_bf16(2.0f * ag / qmax);
                    bi[r * ng + g] = dt_f32_to_bf16(-ag);
                }
                rc = st_stream_write(s, packed, sizeof(uint32_t) * pw);
            }
            if (rc == 0) rc = st_stream_write(s, sc, sizeof(uint16_t) * out * ng);
            if (rc == 0) rc = st_stream_write(s, bi, sizeof(uint16_t) * out * ng);
            free(packed); free(sc); free(bi);
        }
    }
    if (st_stream_close(s) && rc == 0) rc = -1;
    for (int j = 0; j < n; j++) free((void *)t[j].name);
    free(t);
    return rc;
}
