/* flux2_export.c — a FLUX.2 transformer (any layout and format ditrun reads) written as the single files other
 * tools publish, with BFL key names (flux2_export.h):
 *   fp8 (BFL)      safetensors: the blocks' Linears as F8_E4M3 (or E5M2) + NAME.weight_scale (F32 [], or [out]
 *                  per output channel) + NAME.input_scale (F32 [], 1: ditrun scales activations per token), the
 *                  rest bf16
 *   fp8 (ComfyUI)  the same weights as ComfyUI's scaled-fp8 files: "model.diffusion_model." prefix, NAME.scale_weight,
 *                  and the model.diffusion_model.scaled_fp8 marker tensor
 *   GGUF           ComfyUI-GGUF's layout (bare BFL names, general.architecture "flux") or stable-diffusion.cpp's
 *                  (model.diffusion_model. prefix, no architecture): Linear weights in the block type except img_in,
 *                  txt_in, time_in and final_layer (ComfyUI-GGUF's rule) and rows that are not whole blocks (Q8_0,
 *                  else bf16: the converters' fallback), 1-D tensors F32
 * Streamed tensor by tensor: memory stays near one weight row (fp8 per-tensor scales read the rows twice). */
#include "flux2_export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp8.h"
#include "core/outfile.h"
#include "models/flux2_layouts.h"
#include "io/gguf.h"
#include "quant/ggml_quants.h"

#define BFL_PREFIX "model.diffusion_model."

/* One BFL tensor: its diffusers sources (1 part, 3 fused q|k|v parts, or 1 with swapped halves). */
typedef struct {
    char name[300];          /* BFL name with suffix */
    int is_linear;           /* a Linear's weight (else a 1-D parameter: norm scale or bias) */
    dt_linear_src part[3];
    int nparts, swap;
    char src1d[300];         /* 1-D parameter: its diffusers name */
    int64_t out, in;         /* weight [out, in]; 1-D: [out] */
    dt_dtype type;           /* written dtype */
    int scaled;              /* fp8 with scales */
} entry;

static int block_linear(const char *bfl) { return !strncmp(bfl, "double_blocks.", 14) || !strncmp(bfl, "single_blocks.", 14); }

static int gguf_keeps(const char *bfl) {   /* ComfyUI-GGUF's unquantized Linears for flux */
    return !strncmp(bfl, "img_in.", 7) || !strncmp(bfl, "txt_in.", 7) || !strncmp(bfl, "time_in.", 8) ||
           !strncmp(bfl, "final_layer.", 12);
}

/* Resolves BFL tensor NAME (with suffix) against w's diffusers names; 0 = absent in this checkpoint. */
static int resolve(const dt_weights *w, const char *name, entry *e) {
    flux2_key_map m[3];
    int k = flux2_map_key(FLUX2_LAYOUT_BFL, name, m);
    if (k <= 0) return 0;
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    size_t len = strlen(m[0].name);
    if (len > 7 && !strcmp(m[0].name + len - 7, ".weight") && strcmp(name + strlen(name) - 6, ".scale")) {
        e->is_linear = 1;
        for (int j = 0; j < k; j++) {
            char base[300];
            snprintf(base, sizeof base, "%.*s", (int)(strlen(m[j].name) - 7), m[j].name);
            if (dt_weights_linear(w, base, -1, -1, 0, &e->part[j])) { dt_clear_error(); return 0; }
            if (j && e->part[j].in != e->part[0].in) return 0;
            e->out += e->part[j].out;
        }
        e->nparts = k;
        e->swap = m[0].part == FLUX2_PART_SWAP;
        e->in = e->part[0].in;
        return 1;
    }
    const st_tensor *t = dt_weights_find(w, m[0].name);
    if (!t || k != 1) return 0;
    snprintf(e->src1d, sizeof e->src1d, "%s", m[0].name);
    e->out = t->numel;
    return 1;
}

/* Rows [r0, r0 + n) of a Linear entry in BFL order, f32. */
static void rows_f32(const entry *e, int64_t r0, int64_t n, float *dst) {
    for (int64_t r = r0; r < r0 + n; r++, dst += e->in) {
        int64_t rr = r;
        if (e->swap) rr = r < e->out / 2 ? r + e->out / 2 : r - e->out / 2;
        int j = 0;
        while (rr >= e->part[j].out) rr -= e->part[j++].out;
        dt_linear_src_rows_f32(&e->part[j], rr, 1, dst);
    }
}

/* The BFL tensor names of geometry c (Linears: their weight; 1-D: norm scales). */
static int bfl_names(const flux2_config *c, char (**out)[300]) {
    static const char *const glob[] = {"img_in", "txt_in", "time_in.in_layer", "time_in.out_layer",
        "double_stream_modulation_img.lin", "double_stream_modulation_txt.lin", "single_stream_modulation.lin",
        "final_layer.adaLN_modulation.1", "final_layer.linear"};
    static const char *const dbl[] = {"img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj",
                                      "img_mlp.0", "img_mlp.2", "txt_mlp.0", "txt_mlp.2"};
    static const char *const dnorm[] = {"img_attn.norm.query_norm", "img_attn.norm.key_norm", "txt_attn.norm.query_norm",
                                        "txt_attn.norm.key_norm"};
    int cap = 2 * (9 + c->num_layers * 12 + c->num_single_layers * 4), n = 0;
    char (*v)[300] = dt_calloc((size_t)cap, sizeof *v);
#define ADD(...) snprintf(v[n++], 300, __VA_ARGS__)
    for (size_t i = 0; i < 9; i++) { ADD("%s.weight", glob[i]); ADD("%s.bias", glob[i]); }
    for (int b = 0; b < c->num_layers; b++) {
        for (int i = 0; i < 8; i++) { ADD("double_blocks.%d.%s.weight", b, dbl[i]); ADD("double_blocks.%d.%s.bias", b, dbl[i]); }
        for (int i = 0; i < 4; i++) ADD("double_blocks.%d.%s.scale", b, dnorm[i]);
    }
    for (int b = 0; b < c->num_single_layers; b++) {
        ADD("single_blocks.%d.linear1.weight", b);
        ADD("single_blocks.%d.linear1.bias", b);
        ADD("single_blocks.%d.linear2.weight", b);
        ADD("single_blocks.%d.linear2.bias", b);
        ADD("single_blocks.%d.norm.query_norm.scale", b);
        ADD("single_blocks.%d.norm.key_norm.scale", b);
    }
#undef ADD
    *out = v;
    return n;
}

/* The written dtype of a Linear weight. */
static dt_dtype linear_type(const flux2_export_opts *o, const entry *e) {
    if (!o->gguf) return block_linear(e->name) ? o->type : DT_BF16;
    if (!dt_dtype_is_block(o->type)) return o->type;
    if (gguf_keeps(e->name)) return DT_BF16;
    if (e->in % dt_dtype_block_elems(o->type) == 0) return o->type;
    return e->in % 32 == 0 ? DT_Q8_0 : DT_BF16;
}

typedef struct {
    gguf_stream *g;
    st_stream *s;
} sink;

static void sink_declare(sink *k, const char *name, dt_dtype t, int ndim, const int64_t *shape) {
    if (k->g) gguf_stream_declare(k->g, name, t, ndim, shape);
    else st_stream_declare(k->s, name, t, ndim, shape);
}
static int sink_write(sink *k, const void *d, size_t n) { return k->g ? gguf_stream_write(k->g, d, n) : st_stream_write(k->s, d, n); }

int flux2_export(const char *input, const char *output, const flux2_export_opts *o, int *written) {
    *written = 0;
    char *dir = dt_weights_component_dir(input, "transformer");
    if (!dir) return -1;
    dt_weights *w = dt_weights_open(dir);
    free(dir);
    if (!w) return -1;
    int rc = -1, n = 0, ne = 0;
    char (*names)[300] = NULL;
    entry *es = NULL;
    sink k = {0};
    float *row = NULL, *sc = NULL;
    void *qbuf = NULL;
    if (o->gguf ? !(dt_dtype_is_block(o->type) || o->type == DT_BF16 || o->type == DT_F16 || o->type == DT_F32)
                : !dt_dtype_is_fp8(o->type)) {
        dt_set_error("%s: export type %s does not fit a %s file", output, dt_dtype_name(o->type), o->gguf ? "GGUF" : "fp8");
        goto done;
    }
    if (flux2_layout_detect(w) == FLUX2_LAYOUT_UNKNOWN) {
        dt_set_error("%s: not a FLUX.2 transformer checkpoint", dt_weights_path(w));
        goto done;
    }
    if (flux2_layout_install(w)) goto done;
    flux2_config c;
    if (flux2_config_parse(dt_weights_config(w), "config", &c)) goto done;
    n = bfl_names(&c, &names);
    es = dt_calloc((size_t)n, sizeof *es);
    for (int i = 0; i < n; i++)
        if (resolve(w, names[i], &es[ne])) {
            entry *e = &es[ne++];
            e->type = e->is_linear ? linear_type(o, e) : (o->gguf ? DT_F32 : DT_BF16);
            e->scaled = dt_dtype_is_fp8(e->type);
        }
    const char *prefix = o->comfy == (o->gguf ? 0 : 1) ? BFL_PREFIX : "";   /* fp8 ComfyUI and sd.cpp GGUF: prefixed */
    const char *inputs[1] = {input};
    if (dt_output_not_input(output, inputs, 1)) goto done;   /* before any writing */
    if (o->gguf) {
        if (!(k.g = gguf_stream_open(output))) goto done;
        if (o->comfy) gguf_stream_meta_str(k.g, "general.architecture", "flux");
        gguf_stream_meta_u32(k.g, "general.quantization_version", 2);
    } else {
        if (!(k.s = st_stream_open(output))) goto done;
    }
    char nm[400];
    for (int i = 0; i < ne; i++) {
        const entry *e = &es[i];
        snprintf(nm, sizeof nm, "%s%s", prefix, e->name);
        int64_t shape[2] = {e->out, e->in};
        sink_declare(&k, nm, e->type, e->is_linear ? 2 : 1, shape);
        if (e->scaled) {
            size_t bl = strlen(e->name) - 7;   /* without ".weight" */
            int64_t sshape[1] = {e->out};
            snprintf(nm, sizeof nm, "%s%.*s.%s", prefix, (int)bl, e->name, o->comfy ? "scale_weight" : "weight_scale");
            sink_declare(&k, nm, DT_F32, o->per_channel ? 1 : 0, sshape);
            if (!o->comfy) {
                snprintf(nm, sizeof nm, "%s%.*s.input_scale", prefix, (int)bl, e->name);
                sink_declare(&k, nm, DT_F32, 0, sshape);
            }
        }
    }
    if (!o->gguf && o->comfy) {   /* ComfyUI's marker of a scaled-fp8 file (its dtype names the fp8 format) */
        int64_t zero[1] = {0};
        sink_declare(&k, BFL_PREFIX "scaled_fp8", o->type, 1, zero);
    }
    if (k.g ? gguf_stream_begin_data(k.g) : st_stream_begin_data(k.s)) goto done;
    int64_t maxin = 1;
    for (int i = 0; i < ne; i++) {
        if (es[i].in > maxin) maxin = es[i].in;
        if (es[i].out > maxin) maxin = es[i].out;
    }
    row = dt_malloc(sizeof(float) * (size_t)maxin);
    qbuf = dt_malloc(dt_dtype_bytes(DT_F32, maxin));
    for (int i = 0; i < ne; i++) {
        const entry *e = &es[i];
        if (!e->is_linear) {
            if (dt_weights_read_f32(w, e->src1d, row, e->out)) goto done;
            if (e->type == DT_F32) {
                if (sink_write(&k, row, sizeof(float) * (size_t)e->out)) goto done;
            } else {
                uint16_t *h = qbuf;
                for (int64_t j = 0; j < e->out; j++) h[j] = dt_f32_to_bf16(row[j]);
                if (sink_write(&k, h, sizeof(uint16_t) * (size_t)e->out)) goto done;
            }
            continue;
        }
        if (e->scaled) {
            /* scales: amax / max code per tensor or per row; codes = fp8(w / scale) */
            const float maxc = e->type == DT_F8_E4M3 ? DT_E4M3_MAX : 57344.0f;
            free(sc);
            sc = dt_malloc(sizeof(float) * (size_t)e->out);
            float amax = 0;
            for (int64_t r = 0; r < e->out; r++) {
                rows_f32(e, r, 1, row);
                sc[r] = dt_fp8_amax(row, e->in);
                amax = fmaxf(amax, sc[r]);
            }
            for (int64_t r = 0; r < e->out; r++) {
                float a = o->per_channel ? sc[r] : amax;
                sc[r] = a > 0 ? a / maxc : 1.0f;
            }
            uint8_t *codes = qbuf;
            for (int64_t r = 0; r < e->out; r++) {
                rows_f32(e, r, 1, row);
                const float inv = 1.0f / sc[r];
                for (int64_t j = 0; j < e->in; j++)
                    codes[j] = e->type == DT_F8_E4M3 ? dt_f32_to_e4m3(row[j] * inv) : dt_f32_to_e5m2(row[j] * inv);
                if (sink_write(&k, codes, (size_t)e->in)) goto done;
            }
            if (sink_write(&k, sc, sizeof(float) * (size_t)(o->per_channel ? e->out : 1))) goto done;
            if (!o->comfy) {
                const float one = 1.0f;
                if (sink_write(&k, &one, sizeof one)) goto done;
            }
            continue;
        }
        for (int64_t r = 0; r < e->out; r++) {
            rows_f32(e, r, 1, row);
            size_t nb = dt_dtype_bytes(e->type, e->in);
            if (dt_dtype_is_block(e->type)) {
                dt_ggml_quant(e->type, row, e->in, qbuf);
            } else if (e->type == DT_F32) {
                memcpy(qbuf, row, nb);
            } else {
                uint16_t *h = qbuf;
                for (int64_t j = 0; j < e->in; j++) h[j] = e->type == DT_BF16 ? dt_f32_to_bf16(row[j]) : dt_f32_to_f16(row[j]);
            }
            if (sink_write(&k, qbuf, nb)) goto done;
        }
    }
    if (k.g) {
        gguf_stream *g = k.g;
        k.g = NULL;
        if (gguf_stream_close(g)) goto done;
    } else {
        st_stream *s = k.s;
        k.s = NULL;
        if (st_stream_close(s)) goto done;
    }
    *written = ne;
    rc = 0;
done:
    if (k.g) gguf_stream_abort(k.g);
    if (k.s) st_stream_abort(k.s);
    free(row);
    free(sc);
    free(qbuf);
    free(names);
    free(es);
    dt_weights_close(w);
    return rc;
}
