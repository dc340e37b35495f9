/* synth_flux2_lora.c — random LoRA adapters for a FLUX.2 geometry, in the three key layouts adapter files come in
 * (tests, the reference check of tools/lora_reference.py, speed runs of the side product):
 *   diffusers  transformer.MODULE.lora_A.weight [r, in] / .lora_B.weight [out, r], alpha in the
 *              "lora_adapter_metadata" header (transformer.r, transformer.lora_alpha, transformer.target_modules:
 *              what diffusers' PEFT loader builds its LoraConfig from); a fused BFL q|k|v becomes to_q / to_k / to_v
 *              with the same A and a third of B each
 *   kohya      lora_unet_BFL_NAME_WITH_UNDERSCORES.lora_down.weight / .lora_up.weight / .alpha (F32 scalar)
 *   bfl        diffusion_model.BFL_NAME.lora_A.weight / .lora_B.weight (ai-toolkit; no alpha: B carries alpha / r)
 * One adapter module per BFL module (fused double_blocks.N.img_attn.qkv, single_blocks.N.linear1, ...), B in BFL row
 * order: final_layer.adaLN_modulation.1 is shift|scale, diffusers' norm_out.linear scale|shift (its B halves are
 * swapped in the diffusers layout, as the weights are). alpha = r / 2 everywhere, so every layout's scale is an exact
 * power of two and the three files of one (rank, seed) give bit-identical merged weights.
 *
 * The default set is what every peer loader maps (diffusers' kohya converter knows no modulation Linears): the
 * blocks' Linears, img_in, txt_in, time_in.in_layer / out_layer and final_layer.linear. `modulation` adds
 * double_stream_modulation_img / _txt.lin, single_stream_modulation.lin and final_layer.adaLN_modulation.1.
 *
 * Values: A ~ U(-1, 1)·sqrt(3 / in) (variance 1/in), B ~ U(-1, 1)·b with b chosen so that the update
 * (alpha / r)·B·A has a standard deviation of LORA_REL_AMPLITUDE / sqrt(in), i.e. that fraction of a Linear with
 * variance-1/in weights whatever the rank: a visible change of the image that keeps it in range (bundled model, 64²,
 * rank 8: mean 5 levels of 255, at most 35). The modulation Linears get LORA_MOD_REL_AMPLITUDE: their outputs (shift,
 * scale, gate) move the image less; at 0.1 their update moved it by at most one level there, too little to tell
 * whether a loader swapped the final modulation's halves (at 0.3: 8% of the values move by more than one). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "models/flux2.h"
#include "synth_dit.h"

#define LORA_REL_AMPLITUDE 0.1
#define LORA_MOD_REL_AMPLITUDE 0.3

int flux2_lora_layout_parse(const char *name, flux2_lora_layout *out) {
    static const struct { const char *name; flux2_lora_layout l; } t[] = {
        {"diffusers", FLUX2_LORA_DIFFUSERS}, {"kohya", FLUX2_LORA_KOHYA}, {"bfl", FLUX2_LORA_BFL}};
    for (size_t i = 0; name && i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(name, t[i].name)) { *out = t[i].l; return 0; }
    dt_set_error("LoRA layout '%s': expected diffusers, kohya or bfl", name ? name : "");
    return -1;
}

typedef struct {
    char bfl[96];           /* BFL module name */
    char diff[3][112];      /* its diffusers modules: one, or to_q | to_k | to_v of a fused projection */
    int ndiff;
    int swap;               /* B halves swapped between BFL and diffusers (final modulation) */
    int modulation;         /* a modulation Linear (LORA_MOD_REL_AMPLITUDE) */
    int64_t out, in;
} lora_module;

typedef struct { lora_module *m; int n, cap; } module_list;

static lora_module *add(module_list *l, int64_t out, int64_t in, const char *bfl) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->m = dt_realloc(l->m, sizeof *l->m * (size_t)l->cap);
    }
    lora_module *m = &l->m[l->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->bfl, sizeof m->bfl, "%s", bfl);
    m->out = out;
    m->in = in;
    return m;
}

static void list_modules(const flux2_config *c, int modulation, module_list *l) {
    const int64_t D = c->hidden, F = c->mlp_hidden;
    char b[96];
    lora_module *m;
#define DIFF(m, ...) snprintf((m)->diff[(m)->ndiff++], sizeof (m)->diff[0], __VA_ARGS__)
    m = add(l, D, c->in_channels, "img_in"); DIFF(m, "x_embedder");
    m = add(l, D, c->joint_dim, "txt_in"); DIFF(m, "context_embedder");
    m = add(l, D, c->tg_channels, "time_in.in_layer"); DIFF(m, "time_guidance_embed.timestep_embedder.linear_1");
    m = add(l, D, D, "time_in.out_layer"); DIFF(m, "time_guidance_embed.timestep_embedder.linear_2");
    m = add(l, c->out_channels, D, "final_layer.linear"); DIFF(m, "proj_out");
    static const char *const qkv[2][3] = {{"to_q", "to_k", "to_v"}, {"add_q_proj", "add_k_proj", "add_v_proj"}};
    static const char *const stream[2] = {"img", "txt"}, *const proj[2] = {"to_out.0", "to_add_out"},
                             *const ff[2] = {"ff", "ff_context"};
    for (int i = 0; i < c->num_layers; i++)
        for (int s = 0; s < 2; s++) {
            snprintf(b, sizeof b, "double_blocks.%d.%s_attn.qkv", i, stream[s]);
            m = add(l, 3 * D, D, b);
            for (int k = 0; k < 3; k++) DIFF(m, "transformer_blocks.%d.attn.%s", i, qkv[s][k]);
            snprintf(b, sizeof b, "double_blocks.%d.%s_attn.proj", i, stream[s]);
            m = add(l, D, D, b); DIFF(m, "transformer_blocks.%d.attn.%s", i, proj[s]);
            snprintf(b, sizeof b, "double_blocks.%d.%s_mlp.0", i, stream[s]);
            m = add(l, 2 * F, D, b); DIFF(m, "transformer_blocks.%d.%s.linear_in", i, ff[s]);
            snprintf(b, sizeof b, "double_blocks.%d.%s_mlp.2", i, stream[s]);
            m = add(l, D, F, b); DIFF(m, "transformer_blocks.%d.%s.linear_out", i, ff[s]);
        }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(b, sizeof b, "single_blocks.%d.linear1", i);
        m = add(l, 3 * D + 2 * F, D, b); DIFF(m, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i);
        snprintf(b, sizeof b, "single_blocks.%d.linear2", i);
        m = add(l, D, D + F, b); DIFF(m, "single_transformer_blocks.%d.attn.to_out", i);
    }
    if (modulation) {
        m = add(l, 6 * D, D, "double_stream_modulation_img.lin"); DIFF(m, "double_stream_modulation_img.linear");
        m = add(l, 6 * D, D, "double_stream_modulation_txt.lin"); DIFF(m, "double_stream_modulation_txt.linear");
        m = add(l, 3 * D, D, "single_stream_modulation.lin"); DIFF(m, "single_stream_modulation.linear");
        m = add(l, 2 * D, D, "final_layer.adaLN_modulation.1"); DIFF(m, "norm_out.linear");
        m->swap = 1;
        for (int k = l->n - 4; k < l->n; k++) l->m[k].modulation = 1;
    }
#undef DIFF
}

static void underscored(const char *name, char *out, size_t cap) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) out[i] = name[i] == '.' ? '_' : name[i];
    out[i] = 0;
}

/* splitmix64: a module's own stream, independent of the layout's write order */
static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A [r, in] and B [out, r] (BFL rows) of module k as bf16 */
static void draw(const lora_module *m, int k, int r, uint64_t seed, uint16_t *A, uint16_t *B) {
    uint64_t s = mix(mix(seed) ^ (uint64_t)(k + 1) * 0xD1B54A32D192ED03ull);
    const double a_amp = sqrt(3.0 / (double)m->in);
    /* std(s_alpha·B·A) = s_alpha·sqrt(r)·(b/sqrt 3)·(1/sqrt in) = REL/sqrt(in) with s_alpha = 1/2 */
    const double b_amp = 2.0 * (m->modulation ? LORA_MOD_REL_AMPLITUDE : LORA_REL_AMPLITUDE) * sqrt(3.0 / (double)r);
    for (int64_t i = 0; i < (int64_t)r * m->in; i++) {
        s = mix(s);
        A[i] = dt_f32_to_bf16((float)(a_amp * ((double)(s >> 11) / 4503599627370496.0 - 1.0)));
    }
    for (int64_t i = 0; i < m->out * r; i++) {
        s = mix(s);
        B[i] = dt_f32_to_bf16((float)(b_amp * ((double)(s >> 11) / 4503599627370496.0 - 1.0)));
    }
}

/* The diffusers metadata: rank, alpha and every target module (PEFT's LoraConfig) */
static char *diffusers_metadata(const module_list *l, int r, double alpha) {
    size_t cap = 256;
    for (int k = 0; k < l->n; k++) cap += (size_t)l->m[k].ndiff * (sizeof l->m[k].diff[0] + 4);
    char *s = dt_malloc(cap);
    size_t n = (size_t)snprintf(s, cap, "{\"transformer.r\": %d, \"transformer.lora_alpha\": %.17g, "
                                        "\"transformer.target_modules\": [", r, alpha);
    for (int k = 0; k < l->n; k++)
        for (int j = 0; j < l->m[k].ndiff; j++)
            n += (size_t)snprintf(s + n, cap - n, "%s\"%s\"", k || j ? ", " : "", l->m[k].diff[j]);
    snprintf(s + n, cap - n, "]}");
    return s;
}

int flux2_synth_lora(const flux2_config *c, const char *path, const flux2_synth_lora_opts *o) {
    const int r = o->rank;
    if (r < 1 || r > 4096) { dt_set_error("synth lora: rank %d (1..4096)", r); return -1; }
    if (o->layout != FLUX2_LORA_DIFFUSERS && o->layout != FLUX2_LORA_KOHYA && o->layout != FLUX2_LORA_BFL) {
        dt_set_error("synth lora: unknown layout %d", (int)o->layout);
        return -1;
    }
    const double alpha = r / 2.0;
    module_list l = {0};
    list_modules(c, o->modulation, &l);
    st_stream *s = st_stream_open(path);
    if (!s) { free(l.m); return -1; }
    /* declare in write order: per module, per piece, A then B (kohya: then alpha) */
    char nm[300], u[128];
    for (int k = 0; k < l.n; k++) {
        const lora_module *m = &l.m[k];
        int64_t sa[2] = {r, m->in};
        if (o->layout == FLUX2_LORA_DIFFUSERS) {
            for (int j = 0; j < m->ndiff; j++) {
                int64_t sb[2] = {m->out / m->ndiff, r};
                snprintf(nm, sizeof nm, "transformer.%s.lora_A.weight", m->diff[j]);
                st_stream_declare(s, nm, DT_BF16, 2, sa);
                snprintf(nm, sizeof nm, "transformer.%s.lora_B.weight", m->diff[j]);
                st_stream_declare(s, nm, DT_BF16, 2, sb);
            }
        } else {
            int64_t sb[2] = {m->out, r};
            const char *pre = o->layout == FLUX2_LORA_KOHYA ? "lora_unet_" : "diffusion_model.";
            const char *down = o->layout == FLUX2_LORA_KOHYA ? "lora_down" : "lora_A";
            const char *up = o->layout == FLUX2_LORA_KOHYA ? "lora_up" : "lora_B";
            const char *mod = m->bfl;
            if (o->layout == FLUX2_LORA_KOHYA) { underscored(m->bfl, u, sizeof u); mod = u; }
            snprintf(nm, sizeof nm, "%s%s.%s.weight", pre, mod, down);
            st_stream_declare(s, nm, DT_BF16, 2, sa);
            snprintf(nm, sizeof nm, "%s%s.%s.weight", pre, mod, up);
            st_stream_declare(s, nm, DT_BF16, 2, sb);
            if (o->layout == FLUX2_LORA_KOHYA) {
                snprintf(nm, sizeof nm, "%s%s.alpha", pre, mod);
                st_stream_declare(s, nm, DT_F32, 0, NULL);
            }
        }
    }
    if (o->layout == FLUX2_LORA_DIFFUSERS) {
        char *meta = diffusers_metadata(&l, r, alpha);
        st_stream_set_metadata(s, "lora_adapter_metadata", meta);
        free(meta);
    }
    int rc = st_stream_begin_data(s);
    for (int k = 0; k < l.n && !rc; k++) {
        const lora_module *m = &l.m[k];
        uint16_t *A = dt_malloc(sizeof(uint16_t) * (size_t)(r * m->in));
        uint16_t *B = dt_malloc(sizeof(uint16_t) * (size_t)(m->out * r));
        draw(m, k, r, o->seed, A, B);
        const size_t abytes = sizeof(uint16_t) * (size_t)(r * m->in), brow = sizeof(uint16_t) * (size_t)r;
        if (o->layout == FLUX2_LORA_DIFFUSERS) {
            const int64_t part = m->out / m->ndiff, half = m->out / 2;
            for (int j = 0; j < m->ndiff && !rc; j++) {
                rc = st_stream_write(s, A, abytes);
                if (rc) break;
                if (m->swap)   /* diffusers rows scale|shift = BFL's second half, then its first */
                    rc = st_stream_write(s, B + half * r, brow * (size_t)half) ||
                         st_stream_write(s, B, brow * (size_t)half);
                else
                    rc = st_stream_write(s, B + j * part * r, brow * (size_t)part);
            }
        } else {
            if (o->layout == FLUX2_LORA_BFL)   /* no alpha in this layout: B carries alpha / r = 1/2 (exact) */
                for (int64_t i = 0; i < m->out * r; i++) B[i] = dt_f32_to_bf16(0.5f * dt_bf16_to_f32(B[i]));
            rc = st_stream_write(s, A, abytes) || st_stream_write(s, B, brow * (size_t)m->out);
            if (!rc && o->layout == FLUX2_LORA_KOHYA) {
                float a = (float)alpha;
                rc = st_stream_write(s, &a, sizeof a);
            }
        }
        free(A);
        free(B);
    }
    free(l.m);
    if (rc) { st_stream_abort(s); return -1; }
    return st_stream_close(s);
}
