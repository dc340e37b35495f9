/* test_formats.c — fp8 and GGUF checkpoints end to end on the CPU: the bundled model written in each layout
 * (export/flux2_export: BFL fp8 per tensor / per channel / e5m2, ComfyUI scaled fp8, GGUF in every block type as
 * ComfyUI-GGUF and stable-diffusion.cpp name it) loads, and its forward
 *   - equals the forward of the same weights written densely as F32 (the file dequantized: only the order of
 *     the sums may differ), and
 *   - is within the format's own rounding of the bf16 model's forward (bounds below, per format);
 * the format descriptions name the formats; broken scale tensors and shapes get clear errors. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flux2_fixture_io.h"
#include "io/gguf.h"
#include "io/weights.h"
#include "models/flux2_layouts.h"
#include "export/flux2_export.h"

/* Same weights, dense F32 vs the format's own dequantization inside the CPU Linear: the products are equal,
 * only the summation order of the tiled GEMM may differ. */
#define SAME_WEIGHTS_TOL 1e-5

/* Forward error against the bf16 model: at most the format's own relative rounding error of a weight (RMS over
 * Gaussian-like weights, tests/test_ggml_quants.c; e4m3 3 mantissa bits ~ 2.5%, e5m2 2 bits ~ 5%): the blocks
 * of the tiny fixture do not amplify weight errors (measured outputs are 20-100x below these). */
static const struct { const char *format; flux2_export_opts o; const char *ext; double tol; const char *fmt; } cases[] = {
    {"fp8", {0, DT_F8_E4M3, 0, 0}, "safetensors", 0.025, "e4m3"},
    {"fp8-channel", {0, DT_F8_E4M3, 0, 1}, "safetensors", 0.025, "e4m3"},
    {"fp8-e5m2", {0, DT_F8_E5M2, 0, 0}, "safetensors", 0.05, "e5m2"},
    {"fp8-comfy", {0, DT_F8_E4M3, 1, 0}, "safetensors", 0.025, "e4m3"},
    {"gguf-q4_0", {1, DT_Q4_0, 1, 0}, "gguf", 0.086, "Q4_0"},
    {"gguf-q4_1", {1, DT_Q4_1, 1, 0}, "gguf", 0.079, "Q4_1"},
    {"gguf-q5_0", {1, DT_Q5_0, 1, 0}, "gguf", 0.042, "Q5_0"},
    {"gguf-q5_1", {1, DT_Q5_1, 1, 0}, "gguf", 0.038, "Q5_1"},
    {"gguf-q8_0", {1, DT_Q8_0, 1, 0}, "gguf", 0.0053, "Q8_0"},
    {"gguf-q4_k", {1, DT_Q4_K, 1, 0}, "gguf", 0.079, "Q4_K"},
    {"gguf-q5_k", {1, DT_Q5_K, 1, 0}, "gguf", 0.038, "Q5_K"},
    {"gguf-q6_k", {1, DT_Q6_K, 1, 0}, "gguf", 0.019, "Q6_K"},
    {"sdcpp-q8_0", {1, DT_Q8_0, 0, 0}, "gguf", 0.0053, "Q8_0"},
    {"gguf-bf16", {1, DT_BF16, 1, 0}, "gguf", 1e-5, "bf16"},
};

static char tmp[512];

/* forward of MODEL on the fixture inputs; malloc'd out.sample or NULL; fmt (may be NULL) gets the formats */
static float *forward(const char *model, size_t *n, char *fmt, size_t fmt_len) {
    fx_inputs fi;
    if (fx_load_inputs(&fi)) return NULL;
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){.rope_fp32 = 1});
    float *out = NULL;
    flux2_model *m = flux2_load(be, model);
    if (m) {
        *n = (size_t)fi.n * flux2_get_config(m)->out_channels;
        out = dt_malloc(sizeof(float) * *n);
        if (flux2_forward(m, fi.img, fi.n, fi.txt, fi.t, fi.ts, fi.img_ids, fi.txt_ids, out, NULL, NULL)) {
            free(out);
            out = NULL;
        }
        if (fmt) flux2_weight_info(m, NULL, fmt, fmt_len);
        flux2_free(m);
    }
    be->destroy(be);
    fx_free_inputs(&fi);
    return out;
}

static const char *path(const char *name, const char *ext) {
    static char b[4][600];
    static int k;
    k = (k + 1) & 3;
    snprintf(b[k], sizeof b[k], "%s/%s.%s", tmp, name, ext);
    return b[k];
}

int main(void) {
    (void)fx_forward_check;   /* (shared header; this test compares forwards itself) */
    if (t_tmpdir(tmp, sizeof tmp, "formats")) { T_FAIL("formats_tmpdir", "mkdtemp"); return T_DONE(); }
    dt_log_level = 0;
    char model[512], name[160], fmt[128];
    snprintf(model, sizeof model, "%s/model", t_fixtures());
    size_t nref = 0;
    float *ref = forward(model, &nref, NULL, 0);
    if (!ref) { T_FAIL("formats_reference_forward", "%s", dt_last_error()); return T_DONE(); }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *file = path(cases[k].format, cases[k].ext), *dense = path("dense", "gguf");
        int written = 0;
        snprintf(name, sizeof name, "formats_write_%s", cases[k].format);
        if (flux2_export(model, file, &cases[k].o, &written)) { T_FAIL(name, "%s", dt_last_error()); continue; }
        flux2_export_opts f32 = {1, DT_F32, 1, 0};
        if (flux2_export(file, dense, &f32, &written)) { T_FAIL(name, "dense copy: %s", dt_last_error()); continue; }
        size_t nq = 0, nd = 0;
        float *q = forward(file, &nq, fmt, sizeof fmt), *d = forward(dense, &nd, NULL, 0);
        snprintf(name, sizeof name, "formats_load_forward_%s", cases[k].format);
        if (!q || !d || nq != nref || nd != nref) {
            T_FAIL(name, "%s", dt_last_error());
        } else {
            T_PASS(name);
            snprintf(name, sizeof name, "formats_same_weights_dense_%s", cases[k].format);
            t_check_rel_l2(name, q, d, nref, SAME_WEIGHTS_TOL);
            snprintf(name, sizeof name, "formats_vs_bf16_model_%s", cases[k].format);
            t_check_rel_l2(name, q, ref, nref, cases[k].tol);
            snprintf(name, sizeof name, "formats_describe_%s", cases[k].format);
            T_CHECK(name, strstr(fmt, cases[k].fmt) != NULL, "format description '%s' lacks '%s'", fmt, cases[k].fmt);
        }
        free(q);
        free(d);
    }
    /* the reader's view of the files: container, dtypes, scales */
    {
        dt_weights *w = dt_weights_open(path("gguf-q4_k", "gguf"));
        const st_tensor *t = w ? dt_weights_find(w, "double_blocks.0.img_attn.qkv.weight") : NULL;
        T_CHECK("formats_gguf_container", w && !strcmp(dt_weights_container(w), "GGUF v3") && t && t->dtype == DT_Q4_K &&
                !strcmp(dt_weights_metadata(w, "general.architecture"), "flux"), "%s", w ? dt_weights_container(w) : dt_last_error());
        dt_weights_close(w);
        w = dt_weights_open(path("sdcpp-q8_0", "gguf"));
        T_CHECK("formats_sdcpp_names", w && dt_weights_find(w, "model.diffusion_model.single_blocks.0.linear1.weight") &&
                !dt_weights_metadata(w, "general.architecture"), "prefixed names, no architecture");
        dt_weights_close(w);
        w = dt_weights_open(path("fp8", "safetensors"));
        dt_linear_src s;
        int ok = w && !dt_weights_linear(w, "double_blocks.0.img_attn.qkv", -1, -1, 0, &s);
        T_CHECK("formats_fp8_scales", ok && s.dtype == DT_F8_E4M3 && s.w_scale > 0 && !s.w_scales && s.input_scale == 1.0f,
                "dtype %s scale %g per-channel %p input %g", ok ? dt_dtype_name(s.dtype) : "?", ok ? s.w_scale : 0,
                ok ? s.w_scales : NULL, ok ? s.input_scale : 0);
        dt_weights_close(w);
        w = dt_weights_open(path("fp8-comfy", "safetensors"));
        ok = w && flux2_layout_install(w) == 0 && !dt_weights_linear(w, "transformer_blocks.0.attn.to_k", -1, -1, 0, &s);
        T_CHECK("formats_comfy_fp8_mapped", ok && s.dtype == DT_F8_E4M3 && s.w_scale > 0 && s.out == 256,
                "the fused qkv's scale_weight under diffusers names: %s", ok ? "wrong values" : dt_last_error());
        dt_weights_close(w);
    }
    /* broken fp8 scales and GGUF shapes */
    {
        const char *bad = path("bad", "safetensors");
        st_writer *wr = st_writer_new();
        uint8_t codes[64 * 32] = {0};
        float sc3[3] = {1, 2, 3};
        int64_t ws[2] = {64, 32}, ss[1] = {3};
        st_writer_add(wr, "lin.weight", DT_F8_E4M3, 2, ws, codes);
        st_writer_add(wr, "lin.weight_scale", DT_F32, 1, ss, sc3);
        st_writer_save(wr, bad);
        st_writer_free(wr);
        dt_weights *w = dt_weights_open(bad);
        dt_linear_src s;
        dt_clear_error();
        int rc = w ? dt_weights_linear(w, "lin", -1, -1, 0, &s) : 0;
        T_CHECK("formats_fp8_bad_scale_shape", rc == -1 && strstr(dt_last_error(), "weight_scale") &&
                strstr(dt_last_error(), "per output channel"), "%s", dt_last_error());
        dt_weights_close(w);
        /* a GGUF transformer whose qkv lost a row: the loader names the tensor */
        const char *g = path("short", "gguf");
        gguf_stream *gs = gguf_stream_open(g);
        dt_weights *src = dt_weights_open(path("gguf-q8_0", "gguf"));
        for (size_t i = 0; src && i < dt_weights_count(src); i++) {
            const st_tensor *t = dt_weights_at(src, i);
            int64_t sh[4];
            for (int d = 0; d < t->ndim; d++) sh[d] = t->shape[d];
            if (!strcmp(t->name, "double_blocks.0.img_attn.qkv.weight")) sh[0] -= 3;
            gguf_stream_declare(gs, t->name, t->dtype, t->ndim, sh);
        }
        for (size_t i = 0; src && i < dt_weights_count(src); i++) {
            const st_tensor *t = dt_weights_at(src, i);
            size_t nb = t->nbytes;
            if (!strcmp(t->name, "double_blocks.0.img_attn.qkv.weight")) nb -= 3 * dt_dtype_bytes(t->dtype, t->shape[1]);
            gguf_stream_write(gs, t->data, nb);
        }
        gguf_stream_close(gs);
        dt_weights_close(src);
        dt_clear_error();
        size_t n;
        float *o = forward(g, &n, NULL, 0);
        T_CHECK("formats_gguf_wrong_shape", !o && strstr(dt_last_error(), "short.gguf") && strstr(dt_last_error(), "wrong shape"),
                "error: %s", dt_last_error());
        free(o);
    }
    free(ref);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
    return T_DONE();
}
