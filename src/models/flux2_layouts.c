/* flux2_layouts.c — BFL and mflux FLUX.2 checkpoints presented under diffusers names, and the
 * geometry inferred from tensor shapes when a checkpoint comes without config.json.
 * Key rules: BFL names as in the original FLUX.2 code and ComfyUI, mflux names as its converter writes them
 * (both listed in flux2_layouts.h). The fused BFL qkv [3D, D] becomes three zero-copy row views (rows of a
 * row-major matrix are contiguous; the same holds for the packed U32 weight, scales and biases of a quantized
 * file); the final modulation's halves (BFL shift|scale, diffusers scale|shift) are copied once into a small
 * buffer owned by the dt_weights. */
#include "flux2_layouts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/outfile.h"
#include "io/config_file.h"

#define BFL_PREFIX "model.diffusion_model."
#define MAX_BLOCKS 4096

static int has(const dt_weights *w, const char *name) { return dt_weights_find(w, name) != NULL; }
static int has_bfl(const dt_weights *w, const char *name) {
    char p[256];
    snprintf(p, sizeof p, BFL_PREFIX "%s", name);
    return has(w, name) || has(w, p);
}

flux2_layout flux2_layout_detect(const dt_weights *w) {
    if (!w) return FLUX2_LAYOUT_UNKNOWN;
    if (has_bfl(w, "double_blocks.0.img_attn.qkv.weight") || has_bfl(w, "single_blocks.0.linear1.weight") ||
        has_bfl(w, "time_in.in_layer.weight"))
        return FLUX2_LAYOUT_BFL;
    if (has(w, "time_guidance_embed.linear_1.weight") ||
        (has(w, "x_embedder.weight") && has(w, "transformer_blocks.0.attn.to_out.weight")))
        return FLUX2_LAYOUT_MFLUX;
    if (has(w, "x_embedder.weight") || has(w, "time_guidance_embed.timestep_embedder.linear_1.weight"))
        return FLUX2_LAYOUT_DIFFUSERS;
    return FLUX2_LAYOUT_UNKNOWN;
}

const char *flux2_layout_name(flux2_layout l) {
    switch (l) {
    case FLUX2_LAYOUT_DIFFUSERS: return "diffusers";
    case FLUX2_LAYOUT_BFL: return "BFL";
    case FLUX2_LAYOUT_MFLUX: return "mflux";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------ key mapping */

static int starts(const char *s, const char *p, const char **rest) {
    size_t n = strlen(p);
    if (strncmp(s, p, n)) return 0;
    if (rest) *rest = s + n;
    return 1;
}

/* "N.rest" -> N (canonical decimal, < MAX_BLOCKS) and rest; 0 if it does not parse. */
static int block_index(const char *s, int *idx, const char **rest) {
    int v = 0, nd = 0;
    while (s[nd] >= '0' && s[nd] <= '9') {
        v = v * 10 + (s[nd] - '0');
        if (++nd > 4) return 0;
    }
    if (!nd || s[nd] != '.' || (nd > 1 && s[0] == '0') || v >= MAX_BLOCKS) return 0;
    *idx = v;
    *rest = s + nd + 1;
    return 1;
}

/* Splits NAME into base and parameter suffix (weight, bias, scales, biases, scale, and fp8 files' weight_scale,
 * scale_weight, input_scale, scale_input). */
static int split_suffix(const char *name, char *base, size_t cap, const char **suffix) {
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    const char *suf = dot + 1;
    static const char *const known[] = {"weight", "bias", "scales", "biases", "scale",
                                        "weight_scale", "scale_weight", "input_scale", "scale_input"};   /* fp8 scales */
    size_t k = 0;
    while (k < sizeof known / sizeof known[0] && strcmp(suf, known[k])) k++;
    if (k == sizeof known / sizeof known[0]) return 0;
    size_t n = (size_t)(dot - name);
    if (n + 1 > cap) return 0;
    memcpy(base, name, n);
    base[n] = 0;
    *suffix = suf;
    return 1;
}

static int emit(flux2_key_map *o, const char *base, const char *suffix, int part) {
    /* BFL's RMSNorm parameter is "scale"; diffusers calls it "weight" */
    const char *suf = strcmp(suffix, "scale") ? suffix : "weight";
    int n = snprintf(o->name, sizeof o->name, "%s.%s", base, suf);
    o->part = part;
    return n > 0 && (size_t)n < sizeof o->name;
}

static int map_bfl(const char *name, flux2_key_map out[3]) {
    const char *n = name, *rest, *suffix;
    starts(name, BFL_PREFIX, &n);
    char base[256], d[256];
    if (!split_suffix(n, base, sizeof base, &suffix)) return 0;
    static const struct { const char *bfl, *diff; int part; } globals[] = {
        {"img_in", "x_embedder", FLUX2_PART_WHOLE},
        {"txt_in", "context_embedder", FLUX2_PART_WHOLE},
        {"time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1", FLUX2_PART_WHOLE},
        {"time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2", FLUX2_PART_WHOLE},
        {"double_stream_modulation_img.lin", "double_stream_modulation_img.linear", FLUX2_PART_WHOLE},
        {"double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear", FLUX2_PART_WHOLE},
        {"single_stream_modulation.lin", "single_stream_modulation.linear", FLUX2_PART_WHOLE},
        {"final_layer.linear", "proj_out", FLUX2_PART_WHOLE},
        {"final_layer.adaLN_modulation.1", "norm_out.linear", FLUX2_PART_SWAP},
    };
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(base, globals[i].bfl)) return emit(&out[0], globals[i].diff, suffix, globals[i].part);
    int b;
    const char *r;
    if (starts(base, "double_blocks.", &rest) && block_index(rest, &b, &r)) {
        static const struct { const char *bfl, *diff; } dbl[] = {
            {"img_attn.norm.query_norm", "attn.norm_q"}, {"img_attn.norm.key_norm", "attn.norm_k"},
            {"txt_attn.norm.query_norm", "attn.norm_added_q"}, {"txt_attn.norm.key_norm", "attn.norm_added_k"},
            {"img_attn.proj", "attn.to_out.0"}, {"txt_attn.proj", "attn.to_add_out"},
            {"img_mlp.0", "ff.linear_in"}, {"img_mlp.2", "ff.linear_out"},
            {"txt_mlp.0", "ff_context.linear_in"}, {"txt_mlp.2", "ff_context.linear_out"},
        };
        if (!strcmp(r, "img_attn.qkv") || !strcmp(r, "txt_attn.qkv")) {
            static const char *img[3] = {"attn.to_q", "attn.to_k", "attn.to_v"};
            static const char *txt[3] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
            const char **parts = r[0] == 'i' ? img : txt;
            for (int k = 0; k < 3; k++) {
                snprintf(d, sizeof d, "transformer_blocks.%d.%s", b, parts[k]);
                if (!emit(&out[k], d, suffix, k)) return 0;
            }
            return 3;
        }
        for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++)
            if (!strcmp(r, dbl[i].bfl)) {
                snprintf(d, sizeof d, "transformer_blocks.%d.%s", b, dbl[i].diff);
                return emit(&out[0], d, suffix, FLUX2_PART_WHOLE);
            }
        return 0;
    }
    if (starts(base, "single_blocks.", &rest) && block_index(rest, &b, &r)) {
        static const struct { const char *bfl, *diff; } sgl[] = {
            {"linear1", "attn.to_qkv_mlp_proj"}, {"linear2", "attn.to_out"},
            {"norm.query_norm", "attn.norm_q"}, {"norm.key_norm", "attn.norm_k"},
        };
        for (size_t i = 0; i < sizeof sgl / sizeof sgl[0]; i++)
            if (!strcmp(r, sgl[i].bfl)) {
                snprintf(d, sizeof d, "single_transformer_blocks.%d.%s", b, sgl[i].diff);
                return emit(&out[0], d, suffix, FLUX2_PART_WHOLE);
            }
    }
    return 0;
}

static int map_mflux(const char *name, flux2_key_map out[3]) {
    const char *rest, *suffix, *r;
    char base[256], d[256];
    int b;
    if (!split_suffix(name, base, sizeof base, &suffix)) return 0;
    if (starts(base, "transformer_blocks.", &rest) && block_index(rest, &b, &r) && !strcmp(r, "attn.to_out")) {
        snprintf(d, sizeof d, "transformer_blocks.%d.attn.to_out.0", b);
        return emit(&out[0], d, suffix, FLUX2_PART_WHOLE);
    }
    if (!strcmp(base, "time_guidance_embed.linear_1"))
        return emit(&out[0], "time_guidance_embed.timestep_embedder.linear_1", suffix, FLUX2_PART_WHOLE);
    if (!strcmp(base, "time_guidance_embed.linear_2"))
        return emit(&out[0], "time_guidance_embed.timestep_embedder.linear_2", suffix, FLUX2_PART_WHOLE);
    return 0;
}

int flux2_map_key(flux2_layout l, const char *name, flux2_key_map out[3]) {
    if (!name) return 0;
    if (l == FLUX2_LAYOUT_BFL) return map_bfl(name, out);
    if (l == FLUX2_LAYOUT_MFLUX) return map_mflux(name, out);
    return 0;
}

/* ------------------------------------------------------------------ install */

static int install_one(dt_weights *w, const st_tensor *t, const flux2_key_map *m) {
    if (dt_weights_find(w, m->name)) return 0;   /* a stored tensor of that name wins */
    if (t->numel == 1 && t->ndim <= 1) return dt_weights_add_alias(w, m->name, t) ? 0 : -1;   /* per-tensor fp8 scales */
    int64_t rows = t->ndim >= 1 ? t->shape[0] : 0;
    if (m->part == FLUX2_PART_WHOLE) return dt_weights_add_view(w, m->name, t, 0, rows) ? 0 : -1;
    if (m->part == FLUX2_PART_SWAP) {
        if (t->ndim < 1 || rows % 2) {
            dt_set_error("%s: tensor '%s' has %lld rows; its shift|scale halves need an even count (for '%s')", t->file,
                         t->name, (long long)rows, m->name);
            return -1;
        }
        int64_t r0[2] = {rows / 2, 0}, nr[2] = {rows / 2, rows / 2};
        return dt_weights_add_rows(w, m->name, t, 2, r0, nr) ? 0 : -1;
    }
    if (t->ndim < 1 || rows % 3) {
        dt_set_error("%s: fused qkv tensor '%s' has %lld rows, not a multiple of 3 (for '%s')", t->file, t->name,
                     (long long)rows, m->name);
        return -1;
    }
    return dt_weights_add_view(w, m->name, t, m->part * (rows / 3), rows / 3) ? 0 : -1;
}

int flux2_layout_install(dt_weights *w) {
    flux2_layout l = flux2_layout_detect(w);
    if (l == FLUX2_LAYOUT_BFL || l == FLUX2_LAYOUT_MFLUX) {
        size_t n = dt_weights_count(w);
        for (size_t i = 0; i < n; i++) {
            const st_tensor *t = dt_weights_at(w, i);
            flux2_key_map m[3];
            int k = flux2_map_key(l, t->name, m);
            for (int j = 0; j < k; j++)
                if (install_one(w, t, &m[j])) return -1;
        }
        dt_log(2, "%s: %s layout, %zu tensors mapped to diffusers names\n", dt_weights_path(w), flux2_layout_name(l),
               dt_weights_derived_count(w));
    }
    if (dt_weights_config(w)) return 0;
    flux2_config c;
    if (flux2_layout_infer_config(w, &c)) return -1;
    char *body = flux2_config_json(&c, 0, 0), *text = dt_malloc(strlen(body) + 64);
    snprintf(text, strlen(body) + 64, "{\n  \"_ditrun_inferred\": true,%s", body + 1);   /* body starts with "{" */
    json *cfg = json_parse(text, strlen(text), "inferred config");
    free(body);
    free(text);
    if (!cfg) return -1;
    flux2_config back;
    if (flux2_config_parse(cfg, "inferred config", &back) || back.mlp_hidden != c.mlp_hidden) {
        dt_set_error("%s: no config.json, and the inferred geometry (D=%d, MLP %d) is not expressible as a config",
                     dt_weights_path(w), c.hidden, c.mlp_hidden);
        json_free(cfg);
        return -1;
    }
    dt_weights_set_config(w, cfg);
    dt_log(2, "%s: no config.json; inferred FLUX.2 geometry D=%d (%d x %d), %d double + %d single blocks, MLP %d, in %d, text %d\n",
           dt_weights_path(w), c.hidden, c.heads, c.head_dim, c.num_layers, c.num_single_layers, c.mlp_hidden,
           c.in_channels, c.joint_dim);
    return 0;
}

/* ------------------------------------------------------------------ geometry from shapes */

static void scan_blocks(const st_tensor *t, int *ndouble, int *nsingle) {
    const char *rest, *r;
    int b;
    if (starts(t->name, "transformer_blocks.", &rest) && block_index(rest, &b, &r) && b + 1 > *ndouble) *ndouble = b + 1;
    if (starts(t->name, "single_transformer_blocks.", &rest) && block_index(rest, &b, &r) && b + 1 > *nsingle) *nsingle = b + 1;
}

static int linear_shape(const dt_weights *w, const char *name, int64_t out, int64_t in, dt_linear_src *s, const char *what) {
    if (dt_weights_linear(w, name, out, in, 0, s) == 0) return 0;
    char e[1024];
    snprintf(e, sizeof e, "%s", dt_last_error());
    dt_set_error("%s: no config.json and the geometry cannot be inferred (%s: %s)", dt_weights_path(w), what, e);
    return -1;
}

int flux2_layout_infer_config(const dt_weights *w, flux2_config *c) {
    memset(c, 0, sizeof *c);
    const char *path = dt_weights_path(w);
    if (has_bfl(w, "guidance_in.in_layer.weight") || has(w, "time_guidance_embed.guidance_embedder.linear_1.weight")) {
        dt_set_error("%s: this checkpoint has a guidance embedder (FLUX.2-dev); only FLUX.2-klein (no guidance "
                     "embedding) is supported", path);
        return -1;
    }
    dt_linear_src s;
    if (linear_shape(w, "x_embedder", -1, -1, &s, "input projection")) return -1;
    int64_t D = s.out;
    c->in_channels = (int)s.in;
    const st_tensor *nq = dt_weights_find(w, "transformer_blocks.0.attn.norm_q.weight");
    if (!nq) nq = dt_weights_find(w, "single_transformer_blocks.0.attn.norm_q.weight");
    if (!nq) {
        dt_set_error("%s: no config.json and no 'transformer_blocks.0.attn.norm_q.weight' (or single-block norm_q) to infer the head size from",
                     path);
        return -1;
    }
    int64_t hd = nq->numel;
    if (hd <= 0 || hd % 8 || D <= 0 || D % hd || D > (1 << 20)) {
        dt_set_error("%s: inferred head size %lld does not divide the hidden size %lld into RoPE axes (need a multiple of 8)",
                     path, (long long)hd, (long long)D);
        return -1;
    }
    int nd = 0, ns = 0;
    for (size_t i = 0; i < dt_weights_count(w); i++) scan_blocks(dt_weights_at(w, i), &nd, &ns);
    for (size_t i = 0; i < dt_weights_derived_count(w); i++) scan_blocks(dt_weights_derived_at(w, i), &nd, &ns);
    if (linear_shape(w, "context_embedder", D, -1, &s, "text projection")) return -1;
    c->joint_dim = (int)s.in;
    if (linear_shape(w, "time_guidance_embed.timestep_embedder.linear_1", D, -1, &s, "timestep embedding")) return -1;
    c->tg_channels = (int)s.in;
    int64_t F;
    if (nd > 0) {
        if (linear_shape(w, "transformer_blocks.0.ff.linear_in", -1, D, &s, "MLP width")) return -1;
        F = s.out / 2;
    } else if (ns > 0) {
        if (linear_shape(w, "single_transformer_blocks.0.attn.to_qkv_mlp_proj", -1, D, &s, "MLP width")) return -1;
        F = (s.out - 3 * D) / 2;
    } else {
        dt_set_error("%s: no config.json and no transformer blocks", path);
        return -1;
    }
    if (F <= 0 || F > (1 << 22)) { dt_set_error("%s: inferred MLP width %lld is invalid", path, (long long)F); return -1; }
    if (linear_shape(w, "proj_out", -1, D, &s, "output projection")) return -1;
    c->out_channels = (int)s.out;
    c->hidden = (int)D;
    c->head_dim = (int)hd;
    c->heads = (int)(D / hd);
    c->num_layers = nd;
    c->num_single_layers = ns;
    c->mlp_hidden = (int)F;
    c->n_axes = 4;
    for (int a = 0; a < 4; a++) c->axes[a] = c->head_dim / 4;
    c->rope_theta = 2000.0f;
    c->eps = 1e-6f;
    if (c->tg_channels % 2) { dt_set_error("%s: inferred timestep channels %d must be even", path, c->tg_channels); return -1; }
    return 0;
}

char *flux2_config_json(const flux2_config *c, int bits, int group) {
    size_t cap = 1024;
    char *p = dt_malloc(cap), ax[128] = "";
    size_t an = 0;
    for (int a = 0; a < c->n_axes && a < 8; a++) an += (size_t)snprintf(ax + an, sizeof ax - an, "%s%d", a ? ", " : "", c->axes[a]);
    int n = snprintf(p, cap,
                     "{\n  \"_class_name\": \"Flux2Transformer2DModel\",\n  \"attention_head_dim\": %d,\n"
                     "  \"axes_dims_rope\": [%s],\n  \"eps\": %g,\n  \"guidance_embeds\": false,\n  \"in_channels\": %d,\n"
                     "  \"joint_attention_dim\": %d,\n  \"mlp_ratio\": %.17g,\n  \"num_attention_heads\": %d,\n"
                     "  \"num_layers\": %d,\n  \"num_single_layers\": %d,\n  \"out_channels\": %d,\n  \"patch_size\": 1,\n"
                     "  \"rope_theta\": %g,\n  \"timestep_guidance_channels\": %d",
                     c->head_dim, ax, c->eps, c->in_channels, c->joint_dim, c->hidden ? (double)c->mlp_hidden / c->hidden : 3.0,
                     c->heads, c->num_layers, c->num_single_layers, c->out_channels, c->rope_theta, c->tg_channels);
    if (n > 0 && bits > 0 && (size_t)n < cap)
        n += snprintf(p + n, cap - (size_t)n, ",\n  \"quantization\": {\"group_size\": %d, \"bits\": %d}", group, bits);
    if (n > 0 && (size_t)n < cap) snprintf(p + n, cap - (size_t)n, "\n}\n");
    return p;
}

int flux2_diffusers_names(const flux2_config *c, char ***names, int **is_norm) {
    int cap = 16 + c->num_layers * 16 + c->num_single_layers * 4, n = 0;
    char **nm = dt_calloc((size_t)cap, sizeof *nm);
    int *norm = dt_calloc((size_t)cap, sizeof *norm);
    char b[256];
#define ADD(isn, ...) (snprintf(b, sizeof b, __VA_ARGS__), nm[n] = dt_strdup(b), norm[n] = (isn), n++)
    ADD(0, "x_embedder");
    ADD(0, "context_embedder");
    ADD(0, "time_guidance_embed.timestep_embedder.linear_1");
    ADD(0, "time_guidance_embed.timestep_embedder.linear_2");
    ADD(0, "double_stream_modulation_img.linear");
    ADD(0, "double_stream_modulation_txt.linear");
    ADD(0, "single_stream_modulation.linear");
    static const char *dl[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                               "attn.add_v_proj", "attn.to_add_out", "ff.linear_in", "ff.linear_out", "ff_context.linear_in",
                               "ff_context.linear_out"};
    static const char *dn[] = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"};
    for (int i = 0; i < c->num_layers; i++) {
        for (int k = 0; k < 12; k++) ADD(0, "transformer_blocks.%d.%s", i, dl[k]);
        for (int k = 0; k < 4; k++) ADD(1, "transformer_blocks.%d.%s", i, dn[k]);
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        ADD(0, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i);
        ADD(0, "single_transformer_blocks.%d.attn.to_out", i);
        ADD(1, "single_transformer_blocks.%d.attn.norm_q", i);
        ADD(1, "single_transformer_blocks.%d.attn.norm_k", i);
    }
    ADD(0, "norm_out.linear");
    ADD(0, "proj_out");
#undef ADD
    *names = nm;
    *is_norm = norm;
    return n;
}

void flux2_names_free(char **names, int *is_norm, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(is_norm);
}

/* ------------------------------------------------------------------ convert to diffusers */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int flux2_convert_to_diffusers(const char *input, const char *output, int *written, int *skipped) {
    *written = *skipped = 0;
    char *dir = dt_weights_component_dir(input, "transformer");
    if (!dir) return -1;
    dt_weights *w = dt_weights_open(dir);
    free(dir);
    if (!w) return -1;
    int rc = -1, n = 0, *is_norm = NULL;
    char **names = NULL, *file = NULL, *cfg_path = NULL, *text = NULL;
    st_stream *s = NULL;
    dt_outdir *stage = NULL;
    const st_tensor **out = NULL;
    flux2_layout l = flux2_layout_detect(w);
    if (l == FLUX2_LAYOUT_UNKNOWN) {
        dt_set_error("%s: not a FLUX.2 transformer checkpoint (no x_embedder / img_in / double_blocks keys)", dt_weights_path(w));
        goto done;
    }
    if (flux2_layout_install(w)) goto done;
    flux2_config c;
    if (flux2_config_parse(dt_weights_config(w), "config", &c)) goto done;
    /* output locations */
    if (ends_with(output, ".safetensors")) {
        file = dt_strdup(output);
        const char *sl = strrchr(output, '/');
        size_t dl = sl ? (size_t)(sl - output) : 0;
        cfg_path = dt_malloc(dl + 16);
        if (sl) snprintf(cfg_path, dl + 16, "%.*s/config.json", (int)dl, output);
        else snprintf(cfg_path, dl + 16, "config.json");
    } else {
        /* a new folder is built beside and renamed into place when complete; an existing one gets its two files
         * replaced, each through a temporary */
        struct stat sb;
        const char *into = output;
        if (stat(output, &sb) != 0) {
            if (!(stage = dt_outdir_begin(output))) goto done;
            into = dt_outdir_path(stage);
        } else if (!S_ISDIR(sb.st_mode)) {
            dt_set_error("%s: exists and is not a folder (a FILE.safetensors output must end in .safetensors)", output);
            goto done;
        }
        size_t ol = strlen(into) + 48;
        file = dt_malloc(ol);
        cfg_path = dt_malloc(ol);
        snprintf(file, ol, "%s/diffusion_pytorch_model.safetensors", into);
        snprintf(cfg_path, ol, "%s/config.json", into);
    }
    /* every diffusers tensor of the geometry, with its quantization companions */
    n = flux2_diffusers_names(&c, &names, &is_norm);
    out = dt_calloc((size_t)n * 4 + 1, sizeof *out);
    int nout = 0, qbits = 0, qgroup = 0;
    char key[300];
    for (int i = 0; i < n; i++) {
        if (is_norm[i]) {
            snprintf(key, sizeof key, "%s.weight", names[i]);
            if (!(out[nout] = dt_weights_find(w, key))) { dt_set_error("%s: tensor '%s' not found", dt_weights_path(w), key); goto done; }
            nout++;
            continue;
        }
        dt_linear_src src;
        if (dt_weights_linear(w, names[i], -1, -1, -1, &src)) goto done;
        static const char *suf[4] = {"weight", "scales", "biases", "bias"};
        for (int k = 0; k < 4; k++) {
            snprintf(key, sizeof key, "%s.%s", names[i], suf[k]);
            const st_tensor *t = dt_weights_find(w, key);
            if (t && (k < 3 ? (k == 0 || src.bits) : src.bias != NULL)) out[nout++] = t;
        }
        if (src.bits && !qbits) { qbits = src.bits; qgroup = src.group_size; }
    }
    /* stored tensors that reach no output name (e.g. FLUX.2-dev's guidance_in) are reported */
    for (size_t i = 0; i < dt_weights_count(w); i++) {
        const st_tensor *t = dt_weights_at(w, i);
        flux2_key_map m[3];
        int used = 0;
        for (int k = 0; k < nout && !used; k++) used = out[k] == t;
        int nm = used ? 0 : flux2_map_key(l, t->name, m);
        for (int j = 0; j < nm && !used; j++)
            for (int k = 0; k < nout && !used; k++) used = !strcmp(out[k]->name, m[j].name);
        if (!used) {
            if (!*skipped) dt_log(1, "ditrun: note: skipping tensors the FLUX.2-klein transformer does not use, e.g. '%s'\n", t->name);
            (*skipped)++;
        }
    }
    /* before any writing: neither output is an input, a config.json already there describes this model */
    text = flux2_config_json(&c, qbits, qgroup);
    json *ours = json_parse(text, strlen(text), "generated config.json");
    const char *inputs[1] = {input};
    int bad = !ours || dt_output_not_input(file, inputs, 1) || dt_output_not_input(cfg_path, inputs, 1) ||
              dt_config_beside_ok(cfg_path, ours) || dt_output_check(cfg_path);
    json_free(ours);
    if (bad) goto done;
    s = st_stream_open(file);
    if (!s) goto done;
    for (int k = 0; k < nout; k++) st_stream_declare(s, out[k]->name, out[k]->dtype, out[k]->ndim, out[k]->shape);
    static const char *meta[] = {"quantization", "format", "quantization_level", "quantization_rule"};
    for (size_t k = 0; k < sizeof meta / sizeof meta[0]; k++) {
        const char *v = dt_weights_metadata(w, meta[k]);
        if (v) st_stream_set_metadata(s, meta[k], v);
    }
    if (st_stream_begin_data(s)) goto done;
    for (int k = 0; k < nout; k++) {
        if (st_stream_write(s, out[k]->data, out[k]->nbytes)) goto done;
        dt_weights_release(w, out[k]);
    }
    int r = st_stream_close(s);
    s = NULL;
    if (r) goto done;
    if (dt_write_file(cfg_path, text, strlen(text))) goto done;
    if (stage) {
        int r2 = dt_outdir_commit(stage);
        stage = NULL;
        if (r2) goto done;
    }
    *written = nout;
    rc = 0;
done:
    if (s) st_stream_abort(s);   /* an error before the end: nothing replaced */
    dt_outdir_abort(stage);
    free(out);
    flux2_names_free(names, is_norm, n);
    free(file);
    free(cfg_path);
    free(text);
    dt_weights_close(w);
    return rc;
}
