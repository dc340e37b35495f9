/* krea2_export.c — a Krea 2 transformer written as an fp8 checkpoint folder (krea2_export.h: krea2_export_fp8): the
 * transformer blocks' eight Linears (attn.to_q/k/v/gate/out.0, ff.gate/up/down) as F8_E4M3 or F8_E5M2 codes +
 * NAME.weight_scale (F32 [] per tensor, or [out] per output channel) + NAME.input_scale (F32 [] = 1: ditrun scales
 * activations per token), every other tensor as stored, diffusers names, and the input's config.json.
 * Streamed tensor by tensor: memory stays near one weight row. */
#include "krea2_export.h"

#include "models/krea2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp8.h"
#include "core/outfile.h"
#include "io/safetensors.h"
#include "krea2_export.h"

/* Is NAME ("transformer_blocks.3.attn.to_q.weight") a block Linear's weight? Its base (without ".weight") into base. */
static int block_linear(const char *name, char *base, size_t blen) {
    static const char *const lin[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_gate", "attn.to_out.0",
                                      "ff.gate", "ff.up", "ff.down"};
    int blk, off = 0;
    if (sscanf(name, "transformer_blocks.%d.%n", &blk, &off) != 1 || off == 0) return 0;
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        size_t l = strlen(lin[i]);
        if (!strncmp(name + off, lin[i], l) && !strcmp(name + off + l, ".weight")) {
            snprintf(base, blen, "%.*s", (int)(strlen(name) - 7), name);
            return 1;
        }
    }
    return 0;
}

/* Is NAME a companion of a block Linear's weight (an MLX NAME.scales / NAME.biases, an fp8 NAME.weight_scale /
 * NAME.input_scale / ComfyUI spelling) that the fp8 weight replaces? */
static int block_companion(const char *name) {
    static const char *const suf[] = {".scales", ".biases", ".weight_scale", ".input_scale", ".scale_weight",
                                      ".scale_input"};
    char probe[600], base[600];
    for (size_t i = 0; i < sizeof suf / sizeof suf[0]; i++) {
        size_t n = strlen(name), l = strlen(suf[i]);
        if (n > l && !strcmp(name + n - l, suf[i])) {
            snprintf(probe, sizeof probe, "%.*s.weight", (int)(n - l), name);
            if (block_linear(probe, base, sizeof base)) return 1;
        }
    }
    return 0;
}

int krea2_export_fp8(const char *input, const char *output, dt_dtype type, int per_channel, int *written) {
    *written = 0;
    if (type != DT_F8_E4M3 && type != DT_F8_E5M2) {
        dt_set_error("%s: export type %s is not fp8", output, dt_dtype_name(type));
        return -1;
    }
    char *dir = dt_weights_component_dir(input, "transformer");
    if (!dir) return -1;
    dt_weights *w = dt_weights_open(dir);
    char what[4200], cfg_in[4200];
    snprintf(cfg_in, sizeof cfg_in, "%s/config.json", dir);
    const json *cfg = w ? dt_weights_class_config(w, dir, "Krea2Transformer2DModel", "Krea 2", what, sizeof what) : NULL;
    free(dir);
    krea2_config c;
    int rc = -1;
    dt_outdir *stage = NULL;
    st_stream *s = NULL;
    float *row = NULL, *sc = NULL;
    uint8_t *codes = NULL;
    char *text = NULL, path[4200], base[600], nm[700];
    if (!cfg || krea2_config_parse(cfg, what, &c)) goto done;
    const char *inputs[1] = {input};
    if (dt_output_not_input(output, inputs, 1)) goto done;   /* before any writing */
    size_t tlen = 0;
    FILE *f = fopen(cfg_in, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = dt_malloc((size_t)(n > 0 ? n : 0) + 1);
        tlen = n > 0 ? fread(text, 1, (size_t)n, f) : 0;
        fclose(f);
    }
    if (!text || !tlen) { dt_set_error("%s: cannot read", cfg_in); goto done; }
    if (!(stage = dt_outdir_begin(output))) goto done;
    snprintf(path, sizeof path, "%s/config.json", dt_outdir_path(stage));
    if (!(f = fopen(path, "wb")) || fwrite(text, 1, tlen, f) != tlen || fclose(f)) {
        dt_set_error("%s: cannot write", path);
        goto done;
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dt_outdir_path(stage));
    if (!(s = st_stream_open(path))) goto done;
    /* the header: block Linears as codes + scales, their companions dropped, the rest as stored */
    int64_t maxin = 1, nlin = 0;
    for (size_t i = 0; i < dt_weights_count(w); i++) {
        const st_tensor *t = dt_weights_at(w, i);
        if (block_companion(t->name)) continue;
        if (block_linear(t->name, base, sizeof base)) {
            dt_linear_src src;
            if (dt_weights_linear(w, base, -1, -1, 0, &src)) goto done;
            int64_t shape[2] = {src.out, src.in}, sshape[1] = {src.out};
            st_stream_declare(s, t->name, type, 2, shape);
            snprintf(nm, sizeof nm, "%s.weight_scale", base);
            st_stream_declare(s, nm, DT_F32, per_channel ? 1 : 0, sshape);
            snprintf(nm, sizeof nm, "%s.input_scale", base);
            st_stream_declare(s, nm, DT_F32, 0, sshape);
            if (src.in > maxin) maxin = src.in;
            nlin++;
        } else {
            if (dt_dtype_is_block(t->dtype)) {
                dt_set_error("%s: %s is a GGUF block tensor (%s); fp8 export reads safetensors checkpoints",
                             dt_weights_path(w), t->name, dt_dtype_name(t->dtype));
                goto done;
            }
            st_stream_declare(s, t->name, t->dtype, t->ndim, t->shape);
        }
    }
    if (!nlin) { dt_set_error("%s: no transformer block Linears", dt_weights_path(w)); goto done; }
    if (st_stream_begin_data(s)) goto done;
    row = dt_malloc(sizeof(float) * (size_t)maxin);
    codes = dt_malloc((size_t)maxin);
    const float maxc = type == DT_F8_E4M3 ? DT_E4M3_MAX : 57344.0f;
    for (size_t i = 0; i < dt_weights_count(w); i++) {
        const st_tensor *t = dt_weights_at(w, i);
        if (block_companion(t->name)) continue;
        if (!block_linear(t->name, base, sizeof base)) {
            if (st_stream_write(s, t->data, t->nbytes)) goto done;
            (*written)++;
            continue;
        }
        dt_linear_src src;
        if (dt_weights_linear(w, base, -1, -1, 0, &src)) goto done;
        /* scales: amax / max code per tensor or per row; codes = fp8(w / scale) */
        free(sc);
        sc = dt_malloc(sizeof(float) * (size_t)src.out);
        float amax = 0;
        for (int64_t r = 0; r < src.out; r++) {
            dt_linear_src_rows_f32(&src, r, 1, row);
            sc[r] = dt_fp8_amax(row, src.in);
            amax = fmaxf(amax, sc[r]);
        }
        for (int64_t r = 0; r < src.out; r++) {
            float a = per_channel ? sc[r] : amax;
            sc[r] = a > 0 ? a / maxc : 1.0f;
        }
        for (int64_t r = 0; r < src.out; r++) {
            dt_linear_src_rows_f32(&src, r, 1, row);
            const float inv = 1.0f / sc[r];
            for (int64_t j = 0; j < src.in; j++)
                codes[j] = type == DT_F8_E4M3 ? dt_f32_to_e4m3(row[j] * inv) : dt_f32_to_e5m2(row[j] * inv);
            if (st_stream_write(s, codes, (size_t)src.in)) goto done;
        }
        const float one = 1.0f;
        if (st_stream_write(s, sc, sizeof(float) * (size_t)(per_channel ? src.out : 1)) ||
            st_stream_write(s, &one, sizeof one))
            goto done;
        (*written)++;
    }
    st_stream *sd = s;
    s = NULL;
    if (st_stream_close(sd)) goto done;
    dt_outdir *st = stage;
    stage = NULL;
    if (dt_outdir_commit(st)) goto done;
    rc = 0;
done:
    if (s) st_stream_abort(s);
    dt_outdir_abort(stage);
    free(row); free(sc); free(codes); free(text);
    if (w) dt_weights_close(w);
    return rc;
}
