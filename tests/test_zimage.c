/* test_zimage.c — the Z-Image parts against the reference fixtures of tests/fixtures/zimage/ (made by
 * tools/zimage_reference.py with diffusers; README there).
 *
 * Always: config.json errors (inconsistent or missing dims, unsupported variants) name the file and the field; the
 * patch layout (channel fastest within a patch) and its inverse; the guidance definitions; synthetic checkpoints of
 * the tiny preset (bf16 and MLX q4) load and run, and a q4 copy matches its dequantized f32 twin. With the fixtures (skipped with the reason when the
 * folder is absent): the transformer forward (out.sample of two geometries, every mid.* intermediate), repeated and
 * regrown buffers; the AutoencoderKL decode and encode (raw VAE latents) and a missing tensor reported by name; the
 * prompt (chat template ids and mask, hidden_states[-2] of the real tokens); then the engine (the Z-Image family,
 * zimage_family.c) on the fixture's ZImagePipeline folder: the 3-step pipelines, guidance 0 and CFG (with
 * cfg_truncation and cfg_normalization), from the reference's initial latents (--noise), img2img and inpainting from
 * init.png / mask.png with the reference's recorded draws — sigmas, each step's latents and the image's pixels; step
 * caching per guidance branch (first-block=0 and taylorseer=1 byte-identical to no cache, guidance 0 and CFG; skipping
 * settings' pass counts and per-branch decisions, their latents closer to the uncached ones than half the steps). CUDA
 * (when a GPU is usable): the transformer and the VAE decode against the reference within the GPU tolerances, the
 * transformer and both engine pipelines against the CPU's; with DITRUN_SLOW=1 also Z-Image-Turbo's geometry (2 of its
 * 30 joint blocks) at 1024² with the time per forward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/backend.h"
#include "core/fp8.h"
#include "export/zimage_export.h"
#include "io/json.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "models/qwen3.h"
#include "models/vae_kl.h"
#include "models/zimage.h"
#include "pipeline/engine.h"
#include "pipeline/scheduler.h"
#include "image/image.h"
#include "pipeline/zimage_guidance.h"
#include "pipeline/zimage_prompt.h"
#include "quant/ggml_quants.h"
#include "synth/synth_dit.h"
#include "quant/mlx_affine.h"
#include "test.h"
#include "zimage_fixture.h"
#include "trace_check.h"

/* f32 implementation vs a float32 reference on the same bf16-rounded weights: summation order, libm ulps
 * (sinusoid, RoPE) and the host-folded modulation (scale and tanh gate folded into the norm weights) differ
 * (~1e-6); the FLUX.2 fixtures' contract. */
#define ZIMAGE_CPU_TOL 1e-4
/* bf16 activations and weights on CUDA: 2^-9 relative per rounding, over 2 refiners + 2 joint blocks. */
#define ZIMAGE_GPU_TOL 1e-2
/* the VAE's contract (tests/test_vae.c): f32 convolutions and GroupNorms, ~1e-6 expected. The decode is compared as
 * the [0, 1] image (x / 2 + 0.5, clamped: what test_vae compares and what is written). */
#define VAE_CPU_TOL 1e-4
/* CUDA stores the VAE's activations in bf16: dev/study_vae_bf16 (the CPU rounding what CUDA rounds) puts the floor of
 * this fixture (8-16 channels, 3 resnets a level) at 0.0072-0.0083 for the [0, 1] image, H100 within 5% of it. */
#define VAE_GPU_TOL 1e-2
/* the encode's scaled posterior mean has no offset to hide behind: bf16 storage alone gives 0.017-0.025 here (the
 * study; H100 0.0255), so 1.6x the worst floor. */
#define VAE_GPU_ENC_TOL 4e-2
/* sigmas: diffusers draws linspace in float32 where the scheduler here rounds a float64 linspace; 1 ulp apart. */
#define SIGMA_TOL 1e-6
/* a repeated forward on the same cached buffers and tables: deterministic CPU kernels, identical output. */
#define REPEAT_TOL 0.0
/* --precision fp8 (CPU: the emulation of the CUDA fp8 GEMM; CUDA: cuBLASLt e4m3) vs the f32 reference: e4m3 keeps 3
 * mantissa bits (~2.6% rms per operand); the window proves the fp8 path ran (> 1e-4, the f32 forward's distance) and
 * is not garbage (measured on the CPU: 0.0416, with fp8 attention 0.0444 — this fixture's blocks move the stream more
 * than Krea 2's, whose window is 1e-4..5e-2; klein's 1e-4..0.3; CUDA adds bf16 activations, ~1e-2). */
#define ZIMAGE_FP8_MIN 1e-4
#define ZIMAGE_FP8_MAX 0.1
/* The norms feeding the fp8 Linears (fuse_inputs) vs each Linear quantizing its own input: on the CPU the fused op
 * is the composed one (bit-identical); on CUDA the norm writes the e4m3 codes from f32 where the separate path
 * rounds the normed rows to bf16 first, so a code may flip at a rounding boundary (Krea 2's KREA2_FP8_FUSE_TOL). */
#define ZIMAGE_FP8_FUSE_CPU_TOL 0.0
#define ZIMAGE_FP8_FUSE_GPU_TOL 2e-2

/* ------------------------------------------------------------------ config errors (no fixture needed) */

static const char *CFG_OK =
    "{\"_class_name\": \"ZImageTransformer2DModel\", \"all_patch_size\": [2], \"all_f_patch_size\": [1], "
    "\"in_channels\": 16, \"dim\": 3840, \"n_layers\": 30, \"n_refiner_layers\": 2, \"n_heads\": 30, "
    "\"n_kv_heads\": 30, \"norm_eps\": 1e-05, \"qk_norm\": true, \"cap_feat_dim\": 2560, \"rope_theta\": 256.0, "
    "\"t_scale\": 1000.0, \"axes_dims\": [32, 48, 48], \"axes_lens\": [1536, 512, 512]}";

/* CFG_OK with the text `from` replaced by `to`, parsed; expect an error mentioning `want` and the file. */
static void config_case(const char *name, const char *from, const char *to, const char *want) {
    char text[2048];
    const char *p = strstr(CFG_OK, from);
    if (!p) { T_FAIL(name, "test bug: '%s' not in the config", from); return; }
    snprintf(text, sizeof text, "%.*s%s%s", (int)(p - CFG_OK), CFG_OK, to, p + strlen(from));
    json *j = json_parse(text, strlen(text), "cfg");
    zimage_config c;
    int rc = j ? zimage_config_parse(j, "zi/transformer/config.json", &c) : -2;
    const char *e = dt_last_error();
    T_CHECK(name, rc == -1 && strstr(e, "zi/transformer/config.json") && strstr(e, want), "rc %d, error '%s'", rc, e);
    json_free(j);
}

static void test_config(void) {
    json *j = json_parse(CFG_OK, strlen(CFG_OK), "cfg");
    zimage_config c;
    int rc = zimage_config_parse(j, "cfg", &c);
    /* Z-Image-Turbo's geometry: head dim 128, FFN int(3840 / 3 * 8) = 10240, adaLN width min(3840, 256) */
    T_CHECK("config: Z-Image-Turbo geometry", rc == 0 && c.head_dim == 128 && c.ffn == 10240 && c.adaln == 256 &&
            c.patch == 2 && c.patch_channels == 64 && c.axes_len[0] == 1536 && c.qk_norm && c.eps == 1e-5f,
            "rc %d (%s): head %d ffn %d adaln %d patch %d", rc, rc ? dt_last_error() : "", c.head_dim, c.ffn, c.adaln,
            c.patch);
    json_free(j);
    config_case("config: axes_dims not summing to the head dim", "[32, 48, 48]", "[32, 48, 32]", "axes_dims sum to 112");
    config_case("config: dim not divisible by n_heads", "\"n_heads\": 30", "\"n_heads\": 31", "not divisible by n_heads");
    config_case("config: a missing dim", "\"dim\": 3840, ", "", "missing 'dim'");
    config_case("config: an odd axis", "[32, 48, 48]", "[33, 47, 48]", "odd");
    config_case("config: two axes only", "[32, 48, 48]", "[64, 64]", "axes_dims");
    config_case("config: video patches", "\"all_f_patch_size\": [1]", "\"all_f_patch_size\": [2]", "single-frame");
    config_case("config: Omni's SigLIP features", "\"qk_norm\": true", "\"qk_norm\": true, \"siglip_feat_dim\": 1152",
                "siglip_feat_dim");
    config_case("config: a non-integer dim", "\"dim\": 3840", "\"dim\": 38.5", "'dim'");
}

/* ------------------------------------------------------------------ patches */

static void test_patches(void) {
    zimage_config c = {.in_channels = 3, .patch = 2, .patch_channels = 12};
    const int H = 4, W = 6;
    float lat[3 * 4 * 6], tok[6 * 12], back[3 * 4 * 6];
    for (int i = 0; i < 3 * H * W; i++) lat[i] = (float)i;
    zimage_patchify(&c, lat, H, W, tok);
    /* token (h=1, w=2), feature (ph=1, pw=0, ch=2): latent[2][3][4] — channel fastest within the patch */
    const int tk = 1 * 3 + 2, f = (1 * 2 + 0) * 3 + 2;
    T_CHECK("patchify: token (1, 2), feature (row 1, column 0, channel 2)", tok[tk * 12 + f] == lat[(2 * H + 3) * W + 4],
            "got %g want %g", tok[tk * 12 + f], lat[(2 * H + 3) * W + 4]);
    zimage_unpatchify(&c, tok, H, W, back);
    T_CHECK("unpatchify inverts patchify", !memcmp(lat, back, sizeof lat), "the latent differs after the round trip");
}

/* ------------------------------------------------------------------ synthetic checkpoints (no fixture needed) */

/* The tiny preset written dense and MLX q4: both load with the preset's geometry and give a finite forward that the
 * inputs change (a forward that ignored them would pass a finiteness check alone). */
static void test_synth(void) {
    char dir[512], sub[600], name[160];
    if (t_tmpdir(dir, sizeof dir, "zimage-synth")) { T_FAIL("synth", "no temp folder"); return; }
    zimage_config pc;
    dt_backend_opts o = {0};
    o.rope_fp32 = 1;
    dt_backend *be = dt_backend_cpu_create(&o);
    if (zimage_preset("z-image-tiny", &pc)) { T_FAIL("synth", "%s", dt_last_error()); goto done; }
    for (int bits = 0; bits <= 4; bits += 4) {
        snprintf(sub, sizeof sub, "%s/b%d", dir, bits);
        snprintf(name, sizeof name, "synth z-image-tiny %s: loads with the preset's geometry, inputs matter",
                 bits ? "q4 g32" : "bf16");
        if (zimage_synth_write(&pc, sub, bits, 32, 7)) { T_FAIL(name, "write: %s", dt_last_error()); continue; }
        zimage_model *m = zimage_load(be, sub);
        if (!m) { T_FAIL(name, "load: %s", dt_last_error()); continue; }
        const zimage_config *c = zimage_get_config(m);
        char fmt[64];
        zimage_weight_info(m, NULL, fmt, sizeof fmt);
        const int gh = 3, gw = 5, N = gh * gw, T = 7;
        float *img = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels), *cap = dt_malloc(sizeof(float) * (size_t)T * c->cap_dim);
        float *o1 = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels), *o2 = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels);
        for (int i = 0; i < N * c->patch_channels; i++) img[i] = sinf(0.37f * (float)i);
        for (int i = 0; i < T * c->cap_dim; i++) cap[i] = cosf(0.11f * (float)i);
        int rc = zimage_forward(m, img, gh, gw, cap, T, 0.25f, o1, NULL, NULL);
        cap[3] += 1.0f;   /* another caption: the image tokens attend to it in the joint blocks */
        rc |= zimage_forward(m, img, gh, gw, cap, T, 0.25f, o2, NULL, NULL);
        int finite = 1;
        for (int i = 0; i < N * c->patch_channels; i++) finite &= isfinite(o1[i]) && isfinite(o2[i]);
        const double d = dt_rel_l2(o2, o1, (size_t)N * c->patch_channels);
        T_CHECK(name, rc == 0 && finite && d > 1e-6 && c->dim == pc.dim && c->t_mid == 1024 && c->ffn == pc.ffn &&
                (bits ? strstr(fmt, "q4 g32") != NULL : !strcmp(fmt, "bf16")),
                "rc %d (%s), finite %d, caption change moved the output by %.3g, dim %d, t_mid %d, '%s'", rc,
                rc ? dt_last_error() : "", finite, d, c->dim, c->t_mid, fmt);
        free(img); free(cap); free(o1); free(o2);
        zimage_free(m);
    }
done:
    be->destroy(be);
    t_rmtree(dir);
}

/* DIR/model.safetensors of `src` (a dense checkpoint) with every Linear weight whose input width is a multiple of 32
 * either quantized to MLX q4 g32 (min/max rule; deq 0) or replaced by exactly those dequantized values in f32
 * (deq 1), and its config.json. 0 or -1. */
static int write_q4_variant(const char *src, const char *dir, int deq) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    st_file *f = st_open(p);
    if (!f || mkdir(dir, 0755)) { if (f) st_close(f); return -1; }
    st_writer *w = st_writer_new();
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        const size_t nl = strlen(t->name);
        const int lin = t->ndim == 2 && t->shape[1] % 32 == 0 && nl > 7 && !strcmp(t->name + nl - 7, ".weight") &&
                        strcmp(t->name, "x_pad_token") && strcmp(t->name, "cap_pad_token");
        if (!lin) { st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data); continue; }
        const int64_t out = t->shape[0], in = t->shape[1], ng = in / 32;
        float *wf = st_to_f32(t);
        uint32_t *pk = dt_malloc(sizeof(uint32_t) * (size_t)(out * in / 8));
        uint16_t *sc = dt_malloc(sizeof(uint16_t) * (size_t)(out * ng)), *bi = dt_malloc(sizeof(uint16_t) * (size_t)(out * ng));
        for (int64_t r = 0; r < out; r++) {
            mlx_quant_row(wf + r * in, in, 4, 32, MLX_RULE_MINMAX, pk + r * (in / 8), sc + r * ng, bi + r * ng);
            mlx_dequant_row(wf + r * in, pk + r * (in / 8), sc + r * ng, bi + r * ng, DT_BF16, in, 4, 32);
        }
        if (deq) {
            st_writer_add_f32(w, t->name, 2, t->shape, wf);
        } else {
            char nm[300];
            const int64_t sh[2] = {out, in / 8}, sg[2] = {out, ng};
            st_writer_add(w, t->name, DT_U32, 2, sh, pk);
            snprintf(nm, sizeof nm, "%.*s.scales", (int)(nl - 7), t->name); st_writer_add(w, nm, DT_BF16, 2, sg, sc);
            snprintf(nm, sizeof nm, "%.*s.biases", (int)(nl - 7), t->name); st_writer_add(w, nm, DT_BF16, 2, sg, bi);
        }
        free(wf); free(pk); free(sc); free(bi);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int rc = st_writer_save(w, p);
    st_writer_free(w);
    st_close(f);
    char *cfg = NULL;
    if (rc == 0) {
        snprintf(p, sizeof p, "%s/config.json", src);
        cfg = t_slurp(p, NULL);
        snprintf(p, sizeof p, "%s/config.json", dir);
        FILE *o = cfg ? fopen(p, "wb") : NULL;
        /* the quantization entry, as a quantized checkpoint's config names it */
        char *brace = cfg ? strrchr(cfg, '}') : NULL;
        if (!o || !brace) rc = -1;
        else {
            *brace = 0;
            fprintf(o, "%s%s", cfg, deq ? "}\n" : ",\n  \"quantization\": {\"group_size\": 32, \"bits\": 4}\n}\n");
            rc = fclose(o) ? -1 : 0;
        }
    }
    free(cfg);
    return rc;
}

/* MLX q4 Linears in the forward: a q4 copy of a synthetic checkpoint against its twin holding exactly the
 * dequantized weights in f32 (same effective weights: only the CPU's per-tile dequantization differs). */
#define Q4_TWIN_TOL 1e-5
static void test_q4_twin(void) {
    char dir[512], src[600], dq[600], dd[600];
    if (t_tmpdir(dir, sizeof dir, "zimage-q4")) { T_FAIL("q4 twin", "no temp folder"); return; }
    zimage_config pc;
    dt_backend_opts o = {0};
    o.rope_fp32 = 1;
    dt_backend *be = dt_backend_cpu_create(&o);
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(dq, sizeof dq, "%s/q4", dir);
    snprintf(dd, sizeof dd, "%s/deq", dir);
    zimage_model *mq = NULL, *md = NULL;
    if (zimage_preset("z-image-tiny", &pc) || zimage_synth_write(&pc, src, 0, 0, 11) || write_q4_variant(src, dq, 0) ||
        write_q4_variant(src, dd, 1) || !(mq = zimage_load(be, dq)) || !(md = zimage_load(be, dd))) {
        T_FAIL("q4 twin", "%s", dt_last_error());
    } else {
        const zimage_config *c = zimage_get_config(mq);
        const int gh = 4, gw = 6, N = gh * gw, T = 9;
        const size_t n = (size_t)N * c->patch_channels;
        float *img = dt_malloc(sizeof(float) * n), *cap = dt_malloc(sizeof(float) * (size_t)T * c->cap_dim);
        float *oq = dt_malloc(sizeof(float) * n), *od = dt_malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) img[i] = sinf(0.23f * (float)i);
        for (int i = 0; i < T * c->cap_dim; i++) cap[i] = cosf(0.17f * (float)i);
        char fmt[64];
        zimage_weight_info(mq, NULL, fmt, sizeof fmt);
        int rc = zimage_forward(mq, img, gh, gw, cap, T, 0.6f, oq, NULL, NULL) |
                 zimage_forward(md, img, gh, gw, cap, T, 0.6f, od, NULL, NULL);
        if (rc || !strstr(fmt, "q4 g32")) T_FAIL("q4 twin", "rc %d (%s), format '%s'", rc, rc ? dt_last_error() : "", fmt);
        else t_check_rel_l2("q4 g32 transformer vs its dequantized f32 twin", oq, od, n, Q4_TWIN_TOL);
        free(img); free(cap); free(oq); free(od);
    }
    zimage_free(mq);
    zimage_free(md);
    be->destroy(be);
    t_rmtree(dir);
}

/* ------------------------------------------------------------------ guidance */

static void test_guidance(void) {
    /* t_norm = (1000 - timestep) / 1000: 0.4 at timestep 600 is past cfg_truncation 0.3, 0.2 at 800 is not */
    T_CHECK("guidance: truncated once t_norm exceeds cfg_truncation", zimage_step_guidance(3.0f, 0.3f, 600.0f) == 0.0f &&
            zimage_step_guidance(3.0f, 0.3f, 800.0f) == 3.0f, "%g, %g", zimage_step_guidance(3.0f, 0.3f, 600.0f),
            zimage_step_guidance(3.0f, 0.3f, 800.0f));
    T_CHECK("guidance: off at 0, never truncated above 1", zimage_step_guidance(0.0f, 1.0f, 999.0f) == 0.0f &&
            zimage_step_guidance(2.0f, 1.5f, 0.0f) == 2.0f, "unexpected scale");
    /* pos (3, 4) norm 5, neg 0, g 1: pred (6, 8) norm 10; normalization 1 brings it back to norm 5, 0 leaves it */
    float pos[2] = {3, 4}, neg[2] = {0, 0}, a[2], b[2];
    zimage_cfg_combine(pos, neg, 2, 1.0f, 0.0f, a);
    zimage_cfg_combine(pos, neg, 2, 1.0f, 1.0f, b);
    T_CHECK("guidance: pos + g(pos - neg), renormalized to cfg_normalization x |pos|",
            a[0] == 6 && a[1] == 8 && fabsf(b[0] - 3) < 1e-6f && fabsf(b[1] - 4) < 1e-6f, "(%g, %g) (%g, %g)", a[0], a[1],
            b[0], b[1]);
}

/* ------------------------------------------------------------------ transformer */

/* The trace: intermediate NAME against mid.NAME; the reference's embedder and final-layer hooks see the padded
 * sequence, so the first rows of the reference (as many as the forward gives) are compared. */
static void check_prefix(void *ud, const char *name, dt_mat m) {
    trace_ctx *tc = ud;
    char ref_name[128], test_name[200];
    snprintf(ref_name, sizeof ref_name, "mid.%s", name);
    snprintf(test_name, sizeof test_name, "%s mid.%s", tc->prefix, name);
    const st_tensor *r = st_find(tc->ref, ref_name);
    if (!r) { T_FAIL(test_name, "no %s in the fixture", ref_name); return; }
    const int64_t n = m.rows * m.cols;
    if (r->shape[r->ndim - 1] != m.cols || r->numel < n) {
        T_FAIL(test_name, "[%lld, %lld] does not fit the reference's %lld values of rows %lld", (long long)m.rows,
               (long long)m.cols, (long long)r->numel, (long long)r->shape[r->ndim - 1]);
        return;
    }
    float *got = dt_malloc(sizeof(float) * (size_t)n), *ref = st_to_f32(r);
    tc->be->download(tc->be, got, m);
    check_l2(test_name, got, ref, (size_t)n, tc->tol);
    tc->checked++;
    free(got);
    free(ref);
}

typedef struct {
    st_file *io;
    float *lat, *cap, t;
    int H, W, n_cap;
} fwd_case;

static int case_load(const char *file, fwd_case *fc) {
    char p[600];
    memset(fc, 0, sizeof *fc);
    fc->io = st_open(fx(file, p, sizeof p));
    if (!fc->io) return -1;
    const st_tensor *l = st_find(fc->io, "in.latents"), *c = st_find(fc->io, "in.cap_feats");
    const st_tensor *t = st_find(fc->io, "in.timestep");
    if (!l || !c || !t || l->ndim != 4 || c->ndim != 3) { dt_set_error("%s: missing or misshapen in.*", p); return -1; }
    fc->H = (int)l->shape[2];
    fc->W = (int)l->shape[3];
    fc->n_cap = (int)c->shape[1];
    fc->lat = st_to_f32(l);
    fc->cap = st_to_f32(c);
    float *tv = st_to_f32(t);
    fc->t = tv[0];
    free(tv);
    return 0;
}

static void case_free(fwd_case *fc) {
    free(fc->lat);
    free(fc->cap);
    if (fc->io) st_close(fc->io);
}

/* The forward of a case as [C, H, W] (NULL on failure, reported). */
static float *forward_case(dt_backend *be, zimage_model *m, const fwd_case *fc, const char *tag, int trace, double tol) {
    const zimage_config *c = zimage_get_config(m);
    const int p = c->patch, N = (fc->H / p) * (fc->W / p);
    float *tok = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels);
    float *out = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels);
    float *lat = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels);
    zimage_patchify(c, fc->lat, fc->H, fc->W, tok);
    trace_ctx tc = {be, fc->io, tol, tag, 0, 1};
    double t0 = dt_now();
    int rc = zimage_forward(m, tok, fc->H / p, fc->W / p, fc->cap, fc->n_cap, fc->t, out, trace ? check_prefix : NULL, &tc);
    if (rc) {
        T_FAIL(tag, "forward failed: %s", dt_last_error());
        free(lat);
        lat = NULL;
    } else {
        printf("# %s: forward %.1f ms\n", tag, (dt_now() - t0) * 1e3);
        zimage_unpatchify(c, out, fc->H, fc->W, lat);
        /* t_emb, x_embed, cap_embed, each refiner of both streams, each joint block, final */
        const int want = 4 + 2 * c->n_refiner + c->n_layers;
        char nm[200];
        snprintf(nm, sizeof nm, "%s: every intermediate compared", tag);
        if (trace) T_CHECK(nm, tc.checked == want, "%d of %d", tc.checked, want);
    }
    free(tok);
    free(out);
    return lat;
}

static void transformer_on(dt_backend *be, const char *tag, double tol) {
    char p[600], name[200];
    fwd_case a, b;
    if (case_load("transformer_io.safetensors", &a) || case_load("transformer_io_b.safetensors", &b)) {
        T_FAIL(tag, "fixture inputs: %s", dt_last_error());
        return;
    }
    zimage_model *m = zimage_load(be, fx("model", p, sizeof p));   /* the pipeline root resolves to transformer/ */
    if (!m) { T_FAIL(tag, "load: %s", dt_last_error()); case_free(&a); case_free(&b); return; }
    const zimage_config *c = zimage_get_config(m);
    size_t bytes;
    char fmt[64];
    zimage_weight_info(m, &bytes, fmt, sizeof fmt);
    snprintf(name, sizeof name, "%s: weights bf16, timestep MLP width from the file", tag);
    T_CHECK(name, !strcmp(fmt, "bf16") && bytes > 0 && c->t_mid == 1024, "'%s', %zu bytes, t_mid %d", fmt, bytes, c->t_mid);
    const size_t na = (size_t)c->in_channels * a.H * a.W, nb = (size_t)c->in_channels * b.H * b.W;
    float *ra = st_to_f32(st_find(a.io, "out.sample")), *rb = st_to_f32(st_find(b.io, "out.sample"));

    /* b (64 joint tokens) first, then a (96: the buffers grow), a again (cached tables and buffers), b again (a
     * smaller call on the larger buffers) */
    snprintf(name, sizeof name, "%s transformer_io_b out.sample (other geometry, unpadded streams)", tag);
    float *o2 = forward_case(be, m, &b, name, 0, tol);
    if (o2) check_l2(name, o2, rb, nb, tol);
    snprintf(name, sizeof name, "%s transformer_io out.sample", tag);
    float *o1 = forward_case(be, m, &a, name, 1, tol);
    if (o1) check_l2(name, o1, ra, na, tol);
    snprintf(name, sizeof name, "%s transformer_io again", tag);
    float *o3 = forward_case(be, m, &a, name, 0, tol);
    snprintf(name, sizeof name, "%s transformer_io_b again on the grown buffers", tag);
    float *o4 = forward_case(be, m, &b, name, 0, tol);
    const double rep = be->act_dtype == DT_F32 ? REPEAT_TOL : tol;
    if (o1 && o3) {
        double e = dt_rel_l2(o3, o1, na);
        snprintf(name, sizeof name, "%s repeated forward", tag);
        T_CHECK(name, e <= rep, "rel_l2 %.3g between identical calls", e);
    }
    if (o2 && o4) {
        double e = dt_rel_l2(o4, o2, nb);
        snprintf(name, sizeof name, "%s smaller forward on grown buffers", tag);
        T_CHECK(name, e <= rep, "rel_l2 %.3g from the first call", e);
    }
    free(o4);
    /* positions past axes_lens are refused, as the reference's tables end there */
    {
        float dummy = 0;
        int rc = zimage_forward(m, &dummy, c->axes_len[1] + 1, 1, a.cap, a.n_cap, 0.5f, &dummy, NULL, NULL);
        snprintf(name, sizeof name, "%s grid past axes_lens refused", tag);
        T_CHECK(name, rc == -1 && strstr(dt_last_error(), "axes_lens"), "rc %d: %s", rc, dt_last_error());
    }
    free(o1); free(o2); free(o3); free(ra); free(rb);
    zimage_free(m);
    case_free(&a);
    case_free(&b);
}

/* --precision fp8 (and with fp8 attention where the backend has it) on transformer_io: within ZIMAGE_FP8_MIN..MAX of
 * the reference, the formats say fp8, and the fused norm inputs equal the separate ops (fuse_tol). */
static void fp8_on(dt_backend *be, const char *tag, double fuse_tol) {
    char p[600], name[200], fmt[64];
    fwd_case a;
    if (case_load("transformer_io.safetensors", &a)) { T_FAIL(tag, "fixture inputs: %s", dt_last_error()); return; }
    float *ref = st_to_f32(st_find(a.io, "out.sample"));
    for (int attn = 0; attn < 2; attn++) {
        if (attn && !be->attention_fp8) {
            snprintf(name, sizeof name, "%s fp8 attention", tag);
            T_SKIP(name, "%s", be->attention_fp8_off ? be->attention_fp8_off : "the backend has no fp8 attention");
            continue;
        }
        const char *what = attn ? "fp8 Linears + attention" : "fp8 Linears";
        float *out[2] = {NULL, NULL};
        size_t n = 0;
        for (int unfused = 0; unfused < 2; unfused++) {
            const zimage_load_opts lo = {.precision = DT_PREC_FP8, .attn_precision = attn ? DT_PREC_FP8 : DT_PREC_BF16,
                                         .fp8_unfused = unfused};
            zimage_model *m = zimage_load_ex(be, fx("model", p, sizeof p), &lo);
            snprintf(name, sizeof name, "%s %s%s", tag, what, unfused ? " (unfused)" : "");
            if (!m) { T_FAIL(name, "load: %s", dt_last_error()); continue; }
            size_t bytes;
            zimage_weight_info(m, &bytes, fmt, sizeof fmt);
            n = (size_t)zimage_get_config(m)->in_channels * a.H * a.W;
            out[unfused] = forward_case(be, m, &a, name, 0, 0);
            zimage_free(m);
        }
        if (out[0]) {
            const double e = dt_rel_l2(out[0], ref, n);
            snprintf(name, sizeof name, "%s %s forward is %g..%g from the reference (rel L2 %.3g)", tag, what,
                     ZIMAGE_FP8_MIN, ZIMAGE_FP8_MAX, e);
            T_CHECK(name, e > ZIMAGE_FP8_MIN && e < ZIMAGE_FP8_MAX && strstr(fmt, "fp8"), "rel L2 %.3g, formats '%s'",
                    e, fmt);
        }
        if (out[0] && out[1]) {
            snprintf(name, sizeof name, "%s %s: the norms feeding the Linears equal the separate ops", tag, what);
            check_l2(name, out[0], out[1], n, fuse_tol);
        }
        free(out[0]);
        free(out[1]);
    }
    free(ref);
    case_free(&a);
}

/* ------------------------------------------------------------------ LoRA */

/* The fixture transformer's config.json copied into folder a, and b unless NULL (a file and its twin). 0 or -1. */
static int copy_transformer_config(const char *a, const char *b) {
    char src[600], p[700];
    char *cfg = t_slurp(fx("model/transformer/config.json", src, sizeof src), NULL);
    int rc = cfg ? 0 : -1;
    for (int k = 0; k < (b ? 2 : 1) && cfg; k++) {
        snprintf(p, sizeof p, "%s/config.json", k ? b : a);
        FILE *cf = fopen(p, "w");
        if (!cf || fputs(cfg, cf) < 0) rc = -1;
        if (cf && fclose(cf)) rc = -1;
    }
    free(cfg);
    return rc;
}

/* The fixture's transformer written in the original implementation's layout as single files have it (diffusers'
 * convert_z_image_transformer_checkpoint_to_diffusers inverted): prefix model.diffusion_model., x_embedder,
 * final_layer, attention.qkv fused (to_q | to_k | to_v rows), attention.out, attention.q_norm / k_norm; config.json
 * beside. 0 or -1. */
static int write_original_layout(const char *dir) {
    char src[600], p[700];
    snprintf(src, sizeof src, "%s/model/transformer/diffusion_pytorch_model.safetensors", g_dir);
    st_file *f = st_open(src);
    if (!f || mkdir(dir, 0755)) { if (f) st_close(f); return -1; }
    st_writer *w = st_writer_new();
    uint8_t *keep[64];
    int nk = 0, rc = 0;
    for (size_t i = 0; i < st_count(f) && !rc; i++) {
        const st_tensor *t = st_at(f, i);
        char n[300], o[400];
        snprintf(n, sizeof n, "%s", t->name);
        char *q = strstr(n, ".attention.to_q.weight");
        if (strstr(n, ".attention.to_k.weight") || strstr(n, ".attention.to_v.weight")) continue;   /* in the qkv */
        if (q) {   /* rows of to_q, to_k, to_v concatenated */
            char base[300], kn[340], vn[340];
            snprintf(base, sizeof base, "%.*s", (int)(q - n), n);
            snprintf(kn, sizeof kn, "%s.attention.to_k.weight", base);
            snprintf(vn, sizeof vn, "%s.attention.to_v.weight", base);
            const st_tensor *tk = st_find(f, kn), *tv = st_find(f, vn);
            if (!tk || !tv || nk == 64) { rc = -1; break; }
            uint8_t *cat = keep[nk++] = dt_malloc(3 * t->nbytes);
            memcpy(cat, t->data, t->nbytes);
            memcpy(cat + t->nbytes, tk->data, t->nbytes);
            memcpy(cat + 2 * t->nbytes, tv->data, t->nbytes);
            const int64_t sh[2] = {3 * t->shape[0], t->shape[1]};
            snprintf(o, sizeof o, "model.diffusion_model.%s.attention.qkv.weight", base);
            st_writer_add(w, o, t->dtype, 2, sh, cat);
            continue;
        }
        static const char *const ren[][2] = {{"all_x_embedder.2-1", "x_embedder"}, {"all_final_layer.2-1", "final_layer"},
                                             {".attention.to_out.0", ".attention.out"}, {".attention.norm_q", ".attention.q_norm"},
                                             {".attention.norm_k", ".attention.k_norm"}};
        for (size_t r = 0; r < sizeof ren / sizeof ren[0]; r++) {
            char *at = strstr(n, ren[r][0]);
            if (!at) continue;
            char rest[300];
            snprintf(rest, sizeof rest, "%s", at + strlen(ren[r][0]));
            snprintf(at, sizeof n - (size_t)(at - n), "%s%s", ren[r][1], rest);
        }
        snprintf(o, sizeof o, "model.diffusion_model.%s", n);
        st_writer_add(w, o, t->dtype, t->ndim, t->shape, t->data);
    }
    snprintf(p, sizeof p, "%s/z_image_turbo.safetensors", dir);
    if (!rc) rc = st_writer_save(w, p);
    st_writer_free(w);
    for (int i = 0; i < nk; i++) free(keep[i]);
    st_close(f);
    if (copy_transformer_config(dir, NULL)) rc = -1;
    return rc;
}

/* The original layout as a GGUF file (city96-style Z-Image GGUFs: the original names, no prefix) with every 2-D
 * weight whose input width is a multiple of 32 in Q8_0 and the rest F32, config.json beside; and its twin: the same
 * names in a safetensors file holding the Q8_0 weights dequantized (f32). 0 or -1. */
static int write_gguf_pair(const char *gdir, const char *tdir) {
    char src[600], p[700];
    snprintf(src, sizeof src, "%s/model/transformer/diffusion_pytorch_model.safetensors", g_dir);
    snprintf(p, sizeof p, "%s/orig-src", tdir);
    st_file *f = NULL;
    int rc = mkdir(gdir, 0755) | mkdir(tdir, 0755) | write_original_layout(p);
    char of[800];
    snprintf(of, sizeof of, "%s/z_image_turbo.safetensors", p);
    if (rc || !(f = st_open(of))) { if (f) st_close(f); return -1; }
    snprintf(p, sizeof p, "%s/z_image_turbo-Q8_0.gguf", gdir);
    gguf_stream *gs = gguf_stream_open(p);
    st_writer *tw = st_writer_new();
    const size_t n = st_count(f);
    void **data = dt_calloc(n, sizeof *data);
    size_t *bytes = dt_calloc(n, sizeof *bytes);
    float **deq = dt_calloc(n, sizeof *deq);
    for (size_t i = 0; i < n && gs; i++) {
        const st_tensor *t = st_at(f, i);
        const char *name = t->name + strlen("model.diffusion_model.");
        float *v = st_to_f32(t);
        const int q8 = t->ndim == 2 && t->shape[1] % 32 == 0 && strcmp(name, "x_pad_token") && strcmp(name, "cap_pad_token");
        if (q8) {
            bytes[i] = dt_dtype_bytes(DT_Q8_0, t->numel);
            data[i] = dt_malloc(bytes[i]);
            deq[i] = dt_malloc(sizeof(float) * (size_t)t->numel);
            rc |= dt_ggml_quant(DT_Q8_0, v, t->numel, data[i]) | dt_ggml_dequant(DT_Q8_0, data[i], t->numel, deq[i]);
            free(v);
        } else {
            bytes[i] = sizeof(float) * (size_t)t->numel;
            data[i] = v;
        }
        gguf_stream_declare(gs, name, q8 ? DT_Q8_0 : DT_F32, t->ndim, t->shape);
        st_writer_add_f32(tw, name, t->ndim, t->shape, q8 ? deq[i] : v);
    }
    rc |= !gs || gguf_stream_begin_data(gs);
    for (size_t i = 0; i < n && !rc; i++) rc |= gguf_stream_write(gs, data[i], bytes[i]);
    if (gs) rc |= rc ? (gguf_stream_abort(gs), -1) : gguf_stream_close(gs);
    snprintf(p, sizeof p, "%s/model.safetensors", tdir);
    if (!rc) rc = st_writer_save(tw, p);
    st_writer_free(tw);
    for (size_t i = 0; i < n; i++) { free(data[i]); free(deq[i]); }
    free(data); free(bytes); free(deq);
    st_close(f);
    if (copy_transformer_config(gdir, tdir)) rc = -1;
    snprintf(p, sizeof p, "rm -rf '%s/orig-src'", tdir);
    if (system(p)) rc = -1;
    return rc;
}

/* An fp8 checkpoint as BFL/ComfyUI-style fp8 files have it (diffusers names here): the blocks' attention and FFN
 * Linear weights as F8_E4M3 codes + NAME.weight_scale (F32, one per tensor), the rest as stored; and its twin holding
 * those weights decoded (codes x scale, f32). Both with config.json. 0 or -1. */
static int write_fp8_pair(const char *fdir, const char *tdir) {
    char src[600], p[700];
    snprintf(src, sizeof src, "%s/model/transformer/diffusion_pytorch_model.safetensors", g_dir);
    st_file *f = st_open(src);
    if (!f || mkdir(fdir, 0755) || mkdir(tdir, 0755)) { if (f) st_close(f); return -1; }
    st_writer *fw = st_writer_new(), *tw = st_writer_new();
    const size_t n = st_count(f);
    void **keep = dt_calloc(3 * n, sizeof *keep);
    int nk = 0, rc = 0;
    static const char *const lin[] = {".attention.to_q.weight", ".attention.to_k.weight", ".attention.to_v.weight",
                                      ".attention.to_out.0.weight", ".feed_forward.w1.weight", ".feed_forward.w2.weight",
                                      ".feed_forward.w3.weight"};
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(f, i);
        int is_lin = 0;
        for (size_t k = 0; k < sizeof lin / sizeof lin[0]; k++) {
            const size_t ln = strlen(lin[k]), tn = strlen(t->name);
            is_lin |= tn > ln && !strcmp(t->name + tn - ln, lin[k]);
        }
        if (!is_lin) {
            st_writer_add(fw, t->name, t->dtype, t->ndim, t->shape, t->data);
            st_writer_add(tw, t->name, t->dtype, t->ndim, t->shape, t->data);
            continue;
        }
        float *v = keep[nk++] = st_to_f32(t);
        uint8_t *codes = keep[nk++] = dt_malloc((size_t)t->numel);
        float *sc = keep[nk++] = dt_malloc(sizeof(float));
        *sc = dt_fp8_amax(v, t->numel) / DT_E4M3_MAX;
        for (int64_t k = 0; k < t->numel; k++) {
            codes[k] = dt_f32_to_e4m3(v[k] / *sc);
            v[k] = dt_e4m3_to_f32(codes[k]) * *sc;
        }
        char sn[300];
        const int64_t one[1] = {1};
        snprintf(sn, sizeof sn, "%.*s.weight_scale", (int)(strlen(t->name) - 7), t->name);
        st_writer_add(fw, t->name, DT_F8_E4M3, t->ndim, t->shape, codes);
        st_writer_add_f32(fw, sn, 0, one, sc);
        st_writer_add_f32(tw, t->name, t->ndim, t->shape, v);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", fdir);
    rc |= st_writer_save(fw, p);
    snprintf(p, sizeof p, "%s/model.safetensors", tdir);
    rc |= st_writer_save(tw, p);
    st_writer_free(fw);
    st_writer_free(tw);
    for (int i = 0; i < nk; i++) free(keep[i]);
    free(keep);
    st_close(f);
    if (copy_transformer_config(fdir, tdir)) rc = -1;
    return rc;
}

/* A transformer file written by write_pair (into DIR/file and DIR/twin) against its f32 twin on the CPU: the
 * tiles are decoded from the same values, so only summation order differs (tol). Its weight format is printed and,
 * with want_fmt, must name it. */
static void twin_case(dt_backend *be, const char *tag, int (*write_pair)(const char *, const char *), const char *what,
                      const char *want_fmt, double tol) {
    char dir[512], fd[600], td[600], name[200];
    fwd_case a;
    if (t_tmpdir(dir, sizeof dir, "zimage-twin") || case_load("transformer_io.safetensors", &a)) {
        T_FAIL(tag, "setup: %s", dt_last_error());
        return;
    }
    snprintf(fd, sizeof fd, "%s/file", dir);
    snprintf(td, sizeof td, "%s/twin", dir);
    zimage_model *mf = NULL, *mt = NULL;
    if (write_pair(fd, td) || !(mf = zimage_load(be, fd)) || !(mt = zimage_load(be, td))) {
        snprintf(name, sizeof name, "%s: loads", tag);
        T_FAIL(name, "%s", dt_last_error());
    } else {
        char fmt[64];
        zimage_weight_info(mf, NULL, fmt, sizeof fmt);
        printf("# %s: weights '%s'\n", tag, fmt);
        if (want_fmt) {
            snprintf(name, sizeof name, "%s: its Linears run as %s", tag, want_fmt);
            T_CHECK(name, strstr(fmt, want_fmt) != NULL, "format '%s'", fmt);
        }
        const size_t n = (size_t)zimage_get_config(mf)->in_channels * a.H * a.W;
        float *of = forward_case(be, mf, &a, tag, 0, 0), *ot = forward_case(be, mt, &a, "twin", 0, 0);
        if (of && ot) t_check_rel_l2(what, of, ot, n, tol);
        free(of);
        free(ot);
    }
    zimage_free(mf);
    zimage_free(mt);
    case_free(&a);
    t_rmtree(dir);
}

/* A GGUF Z-Image transformer (Q8_0 blocks + F32, the original names) against its dequantized f32 twin: the CPU
 * dequantizes the same blocks per tile, so only summation order differs. */
#define GGUF_TWIN_TOL 1e-5
static void test_gguf(dt_backend *be) {
    twin_case(be, "gguf", write_gguf_pair, "gguf Q8_0 (original layout) vs its dequantized f32 twin", "Q8_0",
              GGUF_TWIN_TOL);
}

/* An fp8 file's Linears against its decoded twin: on the CPU the e4m3 weights are decoded per tile (the activations
 * stay f32 without --precision fp8), so only summation order differs. */
#define FP8_FILE_TOL 1e-5
static void test_fp8_file(dt_backend *be) {
    twin_case(be, "fp8 file", write_fp8_pair, "fp8 file (F8_E4M3 + weight_scale) vs its decoded f32 twin", NULL,
              FP8_FILE_TOL);
}

/* zimage_export_fp8 (convert --format fp8 / fp8-channel): the written folder loads with its blocks' Linears in e4m3,
 * and its forward stays near the bf16 one. */
#define FP8_EXPORT_TOL 0.05   /* e4m3 weights (3 mantissa bits, ~3% per weight) through 6 blocks, activations f32 */
static void test_fp8_export(dt_backend *be) {
    char dir[512], out[600], p[600];
    fwd_case a;
    if (t_tmpdir(dir, sizeof dir, "zimage-fp8x") || case_load("transformer_io.safetensors", &a)) {
        T_FAIL("fp8 export", "setup: %s", dt_last_error());
        return;
    }
    for (int per_channel = 0; per_channel < 2; per_channel++) {
        char name[160];
        snprintf(name, sizeof name, "convert --format %s: e4m3 blocks near the bf16 forward",
                 per_channel ? "fp8-channel" : "fp8");
        snprintf(out, sizeof out, "%s/fp8-%d", dir, per_channel);
        int written = 0;
        zimage_model *mb = zimage_load(be, fx("model", p, sizeof p)), *mx = NULL;
        if (zimage_export_fp8(p, out, DT_F8_E4M3, per_channel, &written) || !(mx = zimage_load(be, out)) || !mb) {
            T_FAIL(name, "%s", dt_last_error());
        } else {
            char fmt[64];
            zimage_weight_info(mx, NULL, fmt, sizeof fmt);
            const size_t n = (size_t)zimage_get_config(mx)->in_channels * a.H * a.W;
            float *ob = forward_case(be, mb, &a, "fp8 export base", 0, 0), *ox = forward_case(be, mx, &a, "fp8 export", 0, 0);
            const double e = ob && ox ? dt_rel_l2(ox, ob, n) : 1;
            T_CHECK(name, strstr(fmt, "e4m3") && written == 101 && e > 0 && e <= FP8_EXPORT_TOL,
                    "format '%s', %d tensors, rel_l2 %.4g", fmt, written, e);
            printf("# %s: rel_l2 %.4g from bf16\n", name, e);
            free(ob);
            free(ox);
        }
        zimage_free(mb);
        zimage_free(mx);
    }
    case_free(&a);
    t_rmtree(dir);
}

/* A transformer file without config.json (single files as ComfyUI ships them): a head-dim-128 synthetic checkpoint's
 * geometry is read from its tensors and its forward equals the one with config.json; the fixture's head dim 16
 * (axes_dims unknowable) is refused asking for config.json. */
static void test_infer_config(dt_backend *be) {
    char dir[512], a[600], b[600], p[700];
    if (t_tmpdir(dir, sizeof dir, "zimage-infer")) { T_FAIL("infer config", "no temp folder"); return; }
    zimage_config pc;
    zimage_preset("z-image-tiny", &pc);
    pc.dim = 256; pc.heads = 2; pc.head_dim = 128; pc.n_layers = 2; pc.n_refiner = 1; pc.cap_dim = 32;
    pc.axes[0] = 32; pc.axes[1] = 48; pc.axes[2] = 48;
    pc.ffn = (int)(256.0 / 3.0 * 8.0);
    pc.adaln = 256;
    snprintf(a, sizeof a, "%s/with", dir);
    snprintf(b, sizeof b, "%s/without", dir);
    zimage_model *ma = NULL, *mb = NULL;
    int rc = zimage_synth_write(&pc, a, 0, 0, 5) || zimage_synth_write(&pc, b, 0, 0, 5);
    snprintf(p, sizeof p, "%s/config.json", b);
    if (rc || unlink(p) || !(ma = zimage_load(be, a)) || !(mb = zimage_load(be, b))) {
        T_FAIL("infer config: a file without config.json loads", "%s", dt_last_error());
    } else {
        const zimage_config *ca = zimage_get_config(ma), *cb = zimage_get_config(mb);
        T_CHECK("infer config: dim, heads, joint and refiner blocks, caption width from the tensors",
                cb->dim == ca->dim && cb->heads == ca->heads && cb->n_layers == ca->n_layers &&
                cb->n_refiner == ca->n_refiner && cb->cap_dim == ca->cap_dim && cb->axes[1] == 48,
                "dim %d heads %d layers %d refiners %d cap %d", cb->dim, cb->heads, cb->n_layers, cb->n_refiner, cb->cap_dim);
        const int gh = 3, gw = 4, N = gh * gw, T = 5;
        const size_t n = (size_t)N * ca->patch_channels;
        float *img = dt_malloc(sizeof(float) * n), *cap = dt_malloc(sizeof(float) * (size_t)T * ca->cap_dim);
        float *oa = dt_malloc(sizeof(float) * n), *ob = dt_malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) img[i] = sinf(0.3f * (float)i);
        for (int i = 0; i < T * ca->cap_dim; i++) cap[i] = cosf(0.2f * (float)i);
        rc = zimage_forward(ma, img, gh, gw, cap, T, 0.4f, oa, NULL, NULL) |
             zimage_forward(mb, img, gh, gw, cap, T, 0.4f, ob, NULL, NULL);
        if (rc) T_FAIL("infer config: forward", "%s", dt_last_error());
        else t_check_rel_l2("infer config: the forward equals the one with config.json", ob, oa, n, REPEAT_TOL);
        free(img); free(cap); free(oa); free(ob);
    }
    zimage_free(ma);
    zimage_free(mb);
    /* the fixture's tiny geometry without config.json */
    char c[600], q[2048];
    snprintf(c, sizeof c, "%s/tiny", dir);
    snprintf(q, sizeof q, "mkdir -p '%s' && cp '%s/model/transformer/diffusion_pytorch_model.safetensors' '%s/'", c, g_dir, c);
    zimage_model *mt = system(q) ? NULL : zimage_load(be, c);
    T_CHECK("infer config: head dim 16 without config.json is refused asking for it", !mt &&
            strstr(dt_last_error(), "add config.json"), "%s", mt ? "(loaded)" : dt_last_error());
    zimage_free(mt);
    t_rmtree(dir);
}

/* A rank-R update of module `name` (out x in): A [R, in], B [out, R] with deterministic values; *ba the product
 * B·A [out, in] (double sums, f32). */
static void lora_pair(int64_t out, int64_t in, int R, int seed, float **A, float **B, float **ba) {
    *A = dt_malloc(sizeof(float) * (size_t)(R * in));
    *B = dt_malloc(sizeof(float) * (size_t)(out * R));
    *ba = dt_malloc(sizeof(float) * (size_t)(out * in));
    for (int64_t i = 0; i < R * in; i++) (*A)[i] = 0.2f * sinf(0.7f * (float)i + (float)seed);
    for (int64_t i = 0; i < out * R; i++) (*B)[i] = 0.2f * cosf(0.3f * (float)i + 2.0f * (float)seed);
    for (int64_t r = 0; r < out; r++)
        for (int64_t c = 0; c < in; c++) {
            double acc = 0;
            for (int k = 0; k < R; k++) acc += (double)(*B)[r * R + k] * (*A)[k * in + c];
            (*ba)[r * in + c] = (float)acc;
        }
}

/* Adapters in both layouts Z-Image files use — diffusers (transformer.layers.0.attention.to_q, layers.1.
 * feed_forward.w2; PEFT keys) and the original implementation's (diffusion_model.layers.0.attention.qkv fused: its
 * B's thirds update to_q/k/v; noise_refiner.1.attention.out = to_out.0) — against a twin checkpoint holding
 * W + B·A in f32: side products exactly (summation order only), merged into the bf16 weights within their rounding,
 * and an adapter naming no module refused by name. */
#define LORA_SIDE_TOL 1e-5
#define LORA_MERGE_TOL 5e-3   /* merged weights rounded to the file's bf16 (2^-9 relative) */
#define ORIG_LAYOUT_TOL 1e-6  /* the same bf16 values, the q/k/v rows stacked either way: summation order at most */
static void test_lora(dt_backend *be) {
    char dir[512], p[700], src[600];
    fwd_case a;
    if (t_tmpdir(dir, sizeof dir, "zimage-lora") || case_load("transformer_io.safetensors", &a)) {
        T_FAIL("lora", "setup: %s", dt_last_error());
        return;
    }
    snprintf(src, sizeof src, "%s/model/transformer/diffusion_pytorch_model.safetensors", g_dir);
    st_file *f = st_open(src);
    json *cj = json_parse_file(fx("model/transformer/config.json", p, sizeof p));
    zimage_config c;
    if (!f || !cj || zimage_config_parse(cj, "config", &c)) { T_FAIL("lora", "fixture: %s", dt_last_error()); goto out0; }
    {
        const int R = 2;
        const int64_t D = c.dim, F = c.ffn;
        /* the updates: to_q of layers.0 (diffusers), w2 of layers.1 (diffusers), qkv of layers.0 (fused),
         * to_out.0 of noise_refiner.1 (as attention.out) */
        float *A[4], *B[4], *BA[4];
        lora_pair(D, D, R, 1, &A[0], &B[0], &BA[0]);
        lora_pair(D, F, R, 2, &A[1], &B[1], &BA[1]);
        lora_pair(3 * D, D, R, 3, &A[2], &B[2], &BA[2]);
        lora_pair(D, D, R, 4, &A[3], &B[3], &BA[3]);
        char f1[600], f2[600];
        snprintf(f1, sizeof f1, "%s/diffusers.safetensors", dir);
        snprintf(f2, sizeof f2, "%s/original.safetensors", dir);
        st_writer *w1 = st_writer_new(), *w2 = st_writer_new();
        const int64_t sa0[2] = {R, D}, sb0[2] = {D, R}, sa1[2] = {R, F}, sb1[2] = {D, R}, sb2[2] = {3 * D, R};
        st_writer_add_f32(w1, "transformer.layers.0.attention.to_q.lora_A.weight", 2, sa0, A[0]);
        st_writer_add_f32(w1, "transformer.layers.0.attention.to_q.lora_B.weight", 2, sb0, B[0]);
        st_writer_add_f32(w1, "transformer.layers.1.feed_forward.w2.lora_A.weight", 2, sa1, A[1]);
        st_writer_add_f32(w1, "transformer.layers.1.feed_forward.w2.lora_B.weight", 2, sb1, B[1]);
        st_writer_add_f32(w2, "diffusion_model.layers.0.attention.qkv.lora_A.weight", 2, sa0, A[2]);
        st_writer_add_f32(w2, "diffusion_model.layers.0.attention.qkv.lora_B.weight", 2, sb2, B[2]);
        st_writer_add_f32(w2, "diffusion_model.noise_refiner.1.attention.out.lora_A.weight", 2, sa0, A[3]);
        st_writer_add_f32(w2, "diffusion_model.noise_refiner.1.attention.out.lora_B.weight", 2, sb0, B[3]);
        int rc = st_writer_save(w1, f1) | st_writer_save(w2, f2);
        st_writer_free(w1);
        st_writer_free(w2);
        /* the twin: every tensor as stored, the updated weights W + B·A (both adapters) in f32 */
        char twin[600];
        snprintf(twin, sizeof twin, "%s/twin", dir);
        mkdir(twin, 0755);
        st_writer *tw = st_writer_new();
        float *keep[8];
        int nk = 0;
        for (size_t i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_at(f, i);
            const float *add[2] = {NULL, NULL};
            if (!strcmp(t->name, "layers.0.attention.to_q.weight")) { add[0] = BA[0]; add[1] = BA[2]; }
            else if (!strcmp(t->name, "layers.0.attention.to_k.weight")) add[0] = BA[2] + D * D;
            else if (!strcmp(t->name, "layers.0.attention.to_v.weight")) add[0] = BA[2] + 2 * D * D;
            else if (!strcmp(t->name, "layers.1.feed_forward.w2.weight")) add[0] = BA[1];
            else if (!strcmp(t->name, "noise_refiner.1.attention.to_out.0.weight")) add[0] = BA[3];
            if (!add[0]) { st_writer_add(tw, t->name, t->dtype, t->ndim, t->shape, t->data); continue; }
            float *wf = keep[nk++] = st_to_f32(t);
            for (int64_t k = 0; k < t->numel; k++) wf[k] += add[0][k] + (add[1] ? add[1][k] : 0.0f);
            st_writer_add_f32(tw, t->name, t->ndim, t->shape, wf);
        }
        snprintf(p, sizeof p, "%s/model.safetensors", twin);
        rc |= st_writer_save(tw, p);
        st_writer_free(tw);
        for (int i = 0; i < nk; i++) free(keep[i]);
        char *cfg = t_slurp(fx("model/transformer/config.json", src, sizeof src), NULL);
        snprintf(p, sizeof p, "%s/config.json", twin);
        FILE *cf = cfg ? fopen(p, "w") : NULL;
        if (!cf || fputs(cfg, cf) < 0) rc = -1;
        if (cf && fclose(cf)) rc = -1;
        free(cfg);
        for (int i = 0; i < 4; i++) { free(A[i]); free(B[i]); free(BA[i]); }
        if (rc) { T_FAIL("lora", "writing the adapters and the twin failed"); goto out0; }

        dt_lora_spec specs[2];
        dt_lora_spec_parse(f1, &specs[0]);
        dt_lora_spec_parse(f2, &specs[1]);
        zimage_model *mt = zimage_load(be, twin);
        zimage_model *mb = zimage_load(be, fx("model", p, sizeof p));
        const zimage_load_opts side = {specs, 2, 1, DT_PREC_BF16, DT_PREC_BF16, 0}, merged = {specs, 2, 0, DT_PREC_BF16, DT_PREC_BF16, 0};
        zimage_model *ms = zimage_load_ex(be, p, &side), *mm = zimage_load_ex(be, p, &merged);
        char orig[600];
        snprintf(orig, sizeof orig, "%s/original", dir);
        zimage_model *mo = write_original_layout(orig) ? NULL : zimage_load(be, orig);
        zimage_model *mol = mo ? zimage_load_ex(be, orig, &side) : NULL;
        if (!mo || !mol) T_FAIL("original layout", "%s", dt_last_error());
        if (!mt || !mb || !ms || !mm) {
            T_FAIL("lora", "load: %s", dt_last_error());
        } else {
            const size_t n = (size_t)c.in_channels * a.H * a.W;
            float *ot = forward_case(be, mt, &a, "lora twin", 0, 0), *ob = forward_case(be, mb, &a, "lora base", 0, 0);
            float *os = forward_case(be, ms, &a, "lora side", 0, 0), *om = forward_case(be, mm, &a, "lora merged", 0, 0);
            if (ot && ob && os && om) {
                const double eff = dt_rel_l2(ot, ob, n);
                T_CHECK("lora: the adapters change the forward", eff > 1e-3, "rel_l2 %.3g from the base", eff);
                t_check_rel_l2("lora: diffusers + original (fused qkv, attention.out) layouts as side products vs the "
                               "f32 twin", os, ot, n, LORA_SIDE_TOL);
                t_check_rel_l2("lora: merged into the bf16 weights vs the f32 twin", om, ot, n, LORA_MERGE_TOL);
            }
            if (mo && mol && ob && ot) {   /* the same weights under the original names: the same forward */
                float *oo = forward_case(be, mo, &a, "original layout", 0, 0);
                float *ool = forward_case(be, mol, &a, "original layout + lora", 0, 0);
                if (oo) t_check_rel_l2("original layout (model.diffusion_model., fused qkv, x_embedder, final_layer): the "
                                       "diffusers layout's forward", oo, ob, n, ORIG_LAYOUT_TOL);
                if (ool) t_check_rel_l2("original layout + both adapters as side products vs the f32 twin", ool, ot, n,
                                        LORA_SIDE_TOL);
                free(oo);
                free(ool);
            }
            free(ot); free(ob); free(os); free(om);
        }
        zimage_free(mt); zimage_free(mb); zimage_free(ms); zimage_free(mm); zimage_free(mo); zimage_free(mol);
        /* a module the model does not have */
        char f3[600];
        snprintf(f3, sizeof f3, "%s/wrong.safetensors", dir);
        st_writer *w3 = st_writer_new();
        float z[2 * 32] = {0};
        st_writer_add_f32(w3, "transformer.layers.9.attention.to_q.lora_A.weight", 2, sa0, z);
        st_writer_add_f32(w3, "transformer.layers.9.attention.to_q.lora_B.weight", 2, sb0, z);
        st_writer_save(w3, f3);
        st_writer_free(w3);
        dt_lora_spec bad;
        dt_lora_spec_parse(f3, &bad);
        const zimage_load_opts wo = {&bad, 1, 0, DT_PREC_BF16, DT_PREC_BF16, 0};
        zimage_model *mw = zimage_load_ex(be, fx("model", p, sizeof p), &wo);
        T_CHECK("lora: an adapter for a module the model lacks is refused naming it", !mw &&
                strstr(dt_last_error(), "layers.9.attention.to_q"), "%s", mw ? "(loaded)" : dt_last_error());
        zimage_free(mw);
    }
out0:
    if (f) st_close(f);
    json_free(cj);
    case_free(&a);
    t_rmtree(dir);
}

/* A copy of the fixture's transformer without tensor `skip`: the error names the file and the tensor. */
static void test_missing_tensor(dt_backend *be) {
    char src[600], dir[512], p[700];
    if (t_tmpdir(dir, sizeof dir, "zimage")) { T_FAIL("missing tensor", "no temp folder"); return; }
    st_file *f = st_open(fx("model/transformer/diffusion_pytorch_model.safetensors", src, sizeof src));
    st_writer *w = st_writer_new();
    const char *skip = "layers.1.feed_forward.w3.weight";
    for (size_t i = 0; f && i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (strcmp(t->name, skip)) st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    int ok = f && st_writer_save(w, p) == 0;
    st_writer_free(w);
    if (f) st_close(f);
    char *cfg = t_slurp(fx("model/transformer/config.json", src, sizeof src), NULL);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *o = cfg ? fopen(p, "wb") : NULL;
    if (o) { fputs(cfg, o); fclose(o); }
    free(cfg);
    zimage_model *m = ok && o ? zimage_load(be, dir) : NULL;
    const char *e = dt_last_error();
    T_CHECK("transformer: a missing tensor is named", !m && strstr(e, skip) && strstr(e, dir), "error '%s'", e);
    zimage_free(m);
    t_rmtree(dir);
}

/* ------------------------------------------------------------------ VAE */

static void vae_on(dt_backend *be, const char *tag, double tol, double enc_tol) {
    char p[600], name[200];
    st_file *io = st_open(fx("vae_io.safetensors", p, sizeof p));
    dt_vae *v = io ? dt_vae_kl_load(be, fx("model", p, sizeof p)) : NULL;
    if (!v) { T_FAIL(tag, "vae: %s", dt_last_error()); if (io) st_close(io); return; }
    const dt_vae_config *c = dt_vae_get_config(v);
    snprintf(name, sizeof name, "%s vae config: AutoencoderKL, no batch norm, scaling and shift", tag);
    T_CHECK(name, !c->batch_norm && c->latent_channels == 16 && fabsf(c->scaling_factor - 0.3611f) < 1e-7f &&
            fabsf(c->shift_factor - 0.1159f) < 1e-7f && c->patch == 1, "bn %d, latent %d, scaling %g, shift %g",
            c->batch_norm, c->latent_channels, c->scaling_factor, c->shift_factor);
    const st_tensor *zl = st_find(io, "in.latents"), *im = st_find(io, "in.image");
    const st_tensor *dec = st_find(io, "out.decoded"), *mean = st_find(io, "out.mean");
    if (!zl || !im || !dec || !mean) { T_FAIL(tag, "vae_io lacks a tensor"); goto done; }
    {
        const int h = (int)zl->shape[2], w = (int)zl->shape[3], s = c->scale_factor;
        float *z = st_to_f32(zl), *ref = st_to_f32(dec), *rgb = dt_malloc(sizeof(float) * 3 * (size_t)(h * s) * (w * s));
        snprintf(name, sizeof name, "%s vae decode ([0, 1] image)", tag);
        if (dec->numel != 3 * (int64_t)(h * s) * (w * s)) T_FAIL(name, "the reference has %lld values", (long long)dec->numel);
        else if (dt_vae_decode(v, z, h, w, rgb)) T_FAIL(name, "%s", dt_last_error());
        else {   /* both as the [0, 1] image the pipeline writes (dt_vae_postprocess: [H, W, 3]) */
            float *i01 = dt_malloc(sizeof(float) * (size_t)dec->numel), *r01 = dt_malloc(sizeof(float) * (size_t)dec->numel);
            dt_vae_postprocess(rgb, h * s, w * s, i01, NULL);
            dt_vae_postprocess(ref, h * s, w * s, r01, NULL);
            check_l2(name, i01, r01, (size_t)dec->numel, tol);
            free(i01);
            free(r01);
        }
        free(z); free(ref); free(rgb);
    }
    {
        const int H = (int)im->shape[2], W = (int)im->shape[3], s = c->scale_factor;
        float *img = st_to_f32(im), *ref = st_to_f32(mean), *lat = dt_malloc(sizeof(float) * 16 * (size_t)(H / s) * (W / s));
        snprintf(name, sizeof name, "%s vae encode (posterior mean)", tag);
        if (mean->numel != 16 * (int64_t)(H / s) * (W / s)) T_FAIL(name, "the reference has %lld values", (long long)mean->numel);
        else if (dt_vae_encode(v, img, H, W, lat)) T_FAIL(name, "%s", dt_last_error());
        else check_l2(name, lat, ref, (size_t)mean->numel, enc_tol);
        free(img); free(ref); free(lat);
    }
done:
    dt_vae_free(v);
    st_close(io);
}

/* The FLUX.2 loader (batch norm required) and the AutoencoderKL one refuse each other's folders by name. */
static void test_vae_kinds(dt_backend *be) {
    char p[600];
    dt_vae *v = dt_vae_load(be, fx("model", p, sizeof p));
    T_CHECK("vae: the FLUX.2 loader names the missing batch norm of an AutoencoderKL", !v &&
            strstr(dt_last_error(), "bn.running_mean"), "error '%s'", v ? "(loaded)" : dt_last_error());
    dt_vae_free(v);
    snprintf(p, sizeof p, "%s/model", t_fixtures());
    v = dt_vae_kl_load(be, p);
    T_CHECK("vae: the AutoencoderKL loader refuses an AutoencoderKLFlux2 folder", !v &&
            strstr(dt_last_error(), "AutoencoderKLFlux2") && strstr(dt_last_error(), "not AutoencoderKL"), "error '%s'",
            v ? "(loaded)" : dt_last_error());
    dt_vae_free(v);
}

/* ------------------------------------------------------------------ prompt and pipeline */

/* The prompt features of case NAME ("prompt", "negative", "empty") against text_io.safetensors; *feats / *n the
 * computed features (caller frees). */
static void prompt_case(dt_qwen3 *te, const dt_tokenizer *tok, st_file *io, const json *cases, const char *key,
                        float **feats, int *n) {
    char name[200], tn[128];
    *feats = NULL;
    const json *cj = json_get(json_get(json_get(cases, "text_io"), "cases"), key);
    const char *text = json_get_str(cj, "text");
    const int max_len = (int)json_get_int(json_get(cases, "text_io"), "max_sequence_length", 0);
    snprintf(tn, sizeof tn, "in.%s.input_ids", key);
    const st_tensor *rid = st_find(io, tn);
    snprintf(tn, sizeof tn, "out.%s.prompt_embeds", key);
    const st_tensor *remb = st_find(io, tn);
    snprintf(name, sizeof name, "prompt '%s': ids and mask", key);
    if (!text || max_len < 1 || !rid || !remb || rid->numel != max_len) { T_FAIL(name, "fixture lacks the case"); return; }
    int32_t *ids = dt_malloc(sizeof(int32_t) * (size_t)max_len), *mask = dt_malloc(sizeof(int32_t) * (size_t)max_len);
    int real = zimage_tokenize(tok, text, max_len, ids, mask);
    float *rf = st_to_f32(rid);
    int same = real == (int)json_get_int(cj, "real_tokens", -1);
    for (int i = 0; same && i < max_len; i++) same = ids[i] == (int32_t)rf[i] && mask[i] == (i < real);
    T_CHECK(name, same, "%d real tokens (reference %lld) or an id differs", real, (long long)json_get_int(cj, "real_tokens", -1));
    free(rf); free(ids); free(mask);
    snprintf(name, sizeof name, "prompt '%s': hidden_states[-2] of the real tokens", key);
    if (zimage_encode_prompt(te, tok, text, max_len, feats, n)) { T_FAIL(name, "%s", dt_last_error()); return; }
    const int64_t D = dt_qwen3_get_config(te)->hidden;
    float *ref = st_to_f32(remb);
    if (remb->numel != (int64_t)*n * D) T_FAIL(name, "%d tokens x %lld vs the reference's %lld values", *n, (long long)D, (long long)remb->numel);
    else check_l2(name, *feats, ref, (size_t)remb->numel, ZIMAGE_CPU_TOL);
    free(ref);
}

/* ------------------------------------------------------------------ the engine's pipelines (zimage_family.c) */

/* What a request's observer saw: the sigmas and each step's latents [C, h, w] (stepK.latents_packed). */
#define MAX_OBS_STEPS 8
typedef struct {
    float *sigmas, *steps[MAX_OBS_STEPS];
    int64_t n_sigmas, n_step[MAX_OBS_STEPS];
    int n_steps;
} obs_t;

static void observe(void *ud, const char *name, const float *d, int ndim, const int64_t *shape) {
    obs_t *o = ud;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    int k;
    if (!strcmp(name, "sigmas")) {
        free(o->sigmas);
        o->sigmas = dt_malloc(sizeof(float) * (size_t)n);
        memcpy(o->sigmas, d, sizeof(float) * (size_t)n);
        o->n_sigmas = n;
    } else if (sscanf(name, "step%d.latents_packed", &k) == 1 && k >= 0 && k < MAX_OBS_STEPS) {
        free(o->steps[k]);
        o->steps[k] = dt_malloc(sizeof(float) * (size_t)n);
        memcpy(o->steps[k], d, sizeof(float) * (size_t)n);
        o->n_step[k] = n;
        if (k + 1 > o->n_steps) o->n_steps = k + 1;
    }
}

static void obs_free(obs_t *o) {
    free(o->sigmas);
    for (int i = 0; i < MAX_OBS_STEPS; i++) free(o->steps[i]);
    memset(o, 0, sizeof *o);
}

/* Pixels of rgb [n] against the reference's bytes: all but 0.1 % within ±1 (rounding at .5 boundaries after ~1e-6
 * differences upstream: test_generate's rule). */
static void check_pixels(const char *name, const uint8_t *rgb, const st_tensor *ru8, size_t n) {
    if (!ru8 || ru8->numel != (int64_t)n) { T_FAIL(name, "the reference has no image of %zu bytes", n); return; }
    size_t ok = 0;
    int wd = 0;
    const uint8_t *r = ru8->data;
    for (size_t k = 0; k < n; k++) {
        const int d = abs((int)rgb[k] - (int)r[k]);
        ok += d <= 1;
        if (d > wd) wd = d;
    }
    T_CHECK(name, ok >= 0.999 * n, "%zu of %zu, max difference %d", ok, n, wd);
    printf("# %s: %.3f%% of pixels within +-1, max difference %d\n", name, 100.0 * ok / n, wd);
}

/* A request from cases.json's KEY (prompt, negative prompt, size, steps, guidance, cfg options, strength). */
static void case_params(const json *pc, dt_gen_params *g) {
    dt_gen_params_default(g);
    g->prompt = json_get_str(pc, "prompt");
    const char *neg = json_get_str(pc, "negative_prompt");
    if (neg) g->negative_prompt = neg;
    g->height = (int)json_get_int(pc, "height", 0);
    g->width = (int)json_get_int(pc, "width", 0);
    g->steps = (int)json_get_int(pc, "steps", 0);
    g->guidance = (float)json_get_num(pc, "guidance_scale", -1);
    g->max_seq_len = (int)json_get_int(pc, "max_sequence_length", 0);
    const json *cn = json_get(pc, "cfg_normalization");   /* false, true or a number */
    if (cn && cn->type != JSON_NULL) {
        g->cfg_normalization_set = 1;
        g->cfg_normalization = cn->type == JSON_BOOL ? (float)cn->boolean : (float)json_get_num(pc, "cfg_normalization", 0);
    }
    if (json_get(pc, "cfg_truncation")) {
        g->cfg_truncation_set = 1;
        g->cfg_truncation = (float)json_get_num(pc, "cfg_truncation", 1);
    }
    g->strength = json_get_num(pc, "strength", 0);
}

/* One engine request of cases.json's KEY against FILE's tensors: sigmas (when recorded), each step's latents
 * (mid.stepK.latents) and the image's pixels. noise_file: the request's --noise. */
static void engine_case(dt_pipeline *pl, const json *cases, const char *key, const char *file, const char *noise_file,
                        const dt_image *init, const dt_image *mask) {
    char p[600], name[200];
    st_file *io = st_open(fx(file, p, sizeof p));
    const json *pc = json_get(cases, key);
    if (!io || !pc) { T_FAIL(key, "fixture lacks %s or the case", file); if (io) st_close(io); return; }
    dt_gen_params g;
    case_params(pc, &g);
    g.noise_file = noise_file;
    g.init_image = init;
    g.mask = mask;
    obs_t o = {0};
    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    dt_gen_timings tm;
    int rc = dt_pipeline_generate(pl, &g, &rgb, &w, &h, &tm, observe, &o);
    snprintf(name, sizeof name, "%s: the engine runs it", key);
    T_CHECK(name, rc == 0 && w == g.width && h == g.height, "rc %d (%s), %dx%d", rc, rc ? dt_last_error() : "", w, h);
    if (rc) { st_close(io); obs_free(&o); return; }
    const st_tensor *rs = st_find(io, "mid.sigmas");
    if (rs) {
        float *r = st_to_f32(rs);
        double worst = rs->numel == o.n_sigmas ? 0 : 1;
        for (int64_t i = 0; i < rs->numel && i < o.n_sigmas; i++) worst = fmax(worst, fabs((double)o.sigmas[i] - r[i]));
        snprintf(name, sizeof name, "%s: sigmas (linspace(1, 1/n, n), the scheduler's shift, final 0)", key);
        T_CHECK(name, worst <= SIGMA_TOL, "%lld sigmas, largest difference %.3g", (long long)o.n_sigmas, worst);
        free(r);
    }
    int ref_steps = 0;
    for (char tn[64];; ref_steps++) {
        snprintf(tn, sizeof tn, "mid.step%d.latents", ref_steps);
        if (!st_find(io, tn)) break;
    }
    snprintf(name, sizeof name, "%s: %d steps run", key, ref_steps);
    T_CHECK(name, ref_steps > 0 && o.n_steps == ref_steps, "%d observed", o.n_steps);
    for (int k = 0; k < ref_steps && k < o.n_steps; k++) {
        char tn[64];
        snprintf(tn, sizeof tn, "mid.step%d.latents", k);
        const st_tensor *r = st_find(io, tn);
        snprintf(name, sizeof name, "%s: latents after step %d", key, k);
        if (r->numel != o.n_step[k]) { T_FAIL(name, "%lld values vs the reference's %lld", (long long)o.n_step[k], (long long)r->numel); continue; }
        float *ref = st_to_f32(r);
        check_l2(name, o.steps[k], ref, (size_t)r->numel, ZIMAGE_CPU_TOL);
        free(ref);
    }
    snprintf(name, sizeof name, "%s: image pixels within +-1", key);
    check_pixels(name, rgb, st_find(io, "out.image_u8"), (size_t)3 * w * h);
    free(rgb);
    obs_free(&o);
    st_close(io);
}

/* Turbo or base: a folder whose path says "turbo" takes Z-Image-Turbo's model card defaults (9 steps, guidance 0)
 * unless model_index.json's is_distilled says otherwise (the fixture's components linked into DIR/NAME). */
static void turbo_case(dt_backend *be, const char *dir, const char *name, const char *distilled, int steps, float g) {
    char root[700], p[800], src[600], what[200];
    snprintf(root, sizeof root, "%s/%s", dir, name);
    mkdir(root, 0755);
    static const char *const comps[] = {"transformer", "text_encoder", "tokenizer", "vae", "scheduler"};
    int ok = 1;
    for (size_t i = 0; i < sizeof comps / sizeof comps[0]; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "model/%s", comps[i]);
        snprintf(p, sizeof p, "%s/%s", root, comps[i]);
        char *abs = realpath(fx(rel, src, sizeof src), NULL);
        ok &= abs && symlink(abs, p) == 0;
        free(abs);
    }
    snprintf(p, sizeof p, "%s/model_index.json", root);
    FILE *f = fopen(p, "w");
    if (f) {
        fprintf(f, "{\"_class_name\": \"ZImagePipeline\"%s%s}\n", distilled ? ", \"is_distilled\": " : "",
                distilled ? distilled : "");
        ok &= fclose(f) == 0;
    }
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = root;
    lo.release_text_encoder = 1;   /* nothing loads before a request */
    dt_pipeline *pl = ok && f ? dt_pipeline_load(be, &lo) : NULL;
    const dt_pipeline_info *in = pl ? dt_pipeline_get_info(pl) : NULL;
    snprintf(what, sizeof what, "defaults: %s%s%s -> %d steps, guidance %g", name, distilled ? ", is_distilled " : "",
             distilled ? distilled : "", steps, g);
    T_CHECK(what, in && in->default_steps == steps && in->default_guidance == g, "%s: %d steps, guidance %g",
            in ? "loaded" : dt_last_error(), in ? in->default_steps : -1, in ? in->default_guidance : -1.0f);
    dt_pipeline_free(pl);
}

/* The schedules the family computes (dt_schedule_make_mu with mu = calculate_shift of the image tokens, as
 * zimage_family.c) against the reference's for the other scheduler configuration the pipeline supports — dynamic
 * exponential shifting — at 48, 1024 and 4096 image tokens, and Z-Image-Turbo's static shift 3 at 9 steps
 * (cases.json "sigmas"). */
static void test_sigmas(const json *cases) {
    static const char *const dyn_cfg = "{\"num_train_timesteps\": 1000, \"use_dynamic_shifting\": true, \"base_shift\": 0.5, "
                                       "\"max_shift\": 1.15, \"base_image_seq_len\": 256, \"max_image_seq_len\": 4096}";
    static const char *const static_cfg = "{\"num_train_timesteps\": 1000, \"shift\": 3.0, \"use_dynamic_shifting\": false}";
    const json *sg = json_get(cases, "sigmas");
    for (size_t i = 0; sg && i < sg->len; i++) {
        const char *key = sg->keys[i];
        const json *c = sg->items[i], *ref = json_get(c, "sigmas");
        const int steps = (int)json_get_int(c, "steps", 0);
        const int64_t seq = json_get_int(c, "image_seq_len", 4096);
        const int dyn = strncmp(key, "static", 6) != 0;
        char name[160];
        snprintf(name, sizeof name, "sigmas %s (%s, %d steps)", key, dyn ? "dynamic shifting" : "static shift 3", steps);
        json *cj = json_parse(dyn ? dyn_cfg : static_cfg, strlen(dyn ? dyn_cfg : static_cfg), "scheduler");
        dt_sched_config sc;
        if (!cj || !ref || steps < 1 || steps > 64 || (int)ref->len != steps + 1 || dt_sched_config_parse(cj, "cfg", &sc)) {
            T_FAIL(name, "fixture or config: %s", dt_last_error());
            json_free(cj);
            continue;
        }
        float sig[65], ts[64];
        int rc = dt_schedule_make_mu(&sc, steps, dt_calculate_shift(&sc, seq), sig, ts);
        double worst = 0;
        for (int k = 0; rc == 0 && k <= steps; k++) worst = fmax(worst, fabs((double)sig[k] - json_at(ref, (size_t)k)->number));
        T_CHECK(name, rc == 0 && worst <= SIGMA_TOL, "rc %d, largest difference %.3g", rc, worst);
        json_free(cj);
    }
}

/* ---- step caching (--cache) on Z-Image: one sampler pass per guidance branch, each with its own cache state, the
 * family's guidance (cfg_truncation, cfg_normalization) as the sampler's hooks ---- */

#define ZI_CACHE_MAX_STEPS 16
/* first-block=T this large caches every pass it may: the head residual's relative change is O(1) on the fixture */
#define ZI_CACHE_SKIP_ALL "first-block=1000000"

typedef struct {
    float *lat;                        /* latents_unpacked */
    int64_t n;
    float dec[2 * ZI_CACHE_MAX_STEPS]; /* cache_computed [steps, 2] */
    float ts[ZI_CACHE_MAX_STEPS];      /* timesteps */
    int steps;
} cache_obs;

static void cache_observe(void *ud, const char *name, const float *d, int ndim, const int64_t *shape) {
    cache_obs *o = ud;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (!strcmp(name, "latents_unpacked")) {
        free(o->lat);
        o->lat = dt_malloc(sizeof(float) * (size_t)n);
        memcpy(o->lat, d, sizeof(float) * (size_t)n);
        o->n = n;
    } else if (!strcmp(name, "cache_computed") && n <= 2 * ZI_CACHE_MAX_STEPS) {
        memcpy(o->dec, d, sizeof(float) * (size_t)n);
    } else if (!strcmp(name, "timesteps") && n <= ZI_CACHE_MAX_STEPS) {
        memcpy(o->ts, d, sizeof(float) * (size_t)n);
        o->steps = (int)n;
    }
}

/* ‖a − b‖ / ‖b‖ over n values */
static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t j = 0; j < n; j++) {
        num += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
        den += (double)b[j] * b[j];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

/* cases.json's KEY with `steps` steps (0: the case's) and cache SPEC from the case's noise: 0 or -1 */
static int cache_run(dt_pipeline *pl, const json *pc, const char *noise, int steps, const char *spec, cache_obs *o,
                     dt_gen_timings *tm) {
    dt_gen_params g;
    case_params(pc, &g);
    g.noise_file = noise;
    if (steps) g.steps = steps;
    memset(o, 0, sizeof *o);
    memset(tm, 0, sizeof *tm);
    if (dt_cache_parse(spec, &g.cache)) return -1;
    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    int rc = dt_pipeline_generate(pl, &g, &rgb, &w, &h, tm, cache_observe, o);
    free(rgb);
    return rc || !o->lat ? -1 : 0;
}

/* Steps of the run whose guidance is on (the negative prompt's pass runs): zimage_step_guidance > 0. */
static int guided_at(const json *pc, const cache_obs *o, int k) {
    const double cn = json_get_num(pc, "cfg_truncation", 1);
    return zimage_step_guidance((float)json_get_num(pc, "guidance_scale", 0), (float)cn, o->ts[k]) > 0.0f;
}

static void cache_case(dt_pipeline *pl, const json *cases, const char *key, const char *noise) {
    const json *pc = json_get(cases, key);
    char nm[200];
    cache_obs base, o;
    dt_gen_timings tb, tm;
    /* the case's 3 steps: no cache, first-block=0 and taylorseer=1 byte for byte, every pass computed */
    if (!pc || cache_run(pl, pc, noise, 0, "off", &base, &tb)) {
        T_FAIL(key, "cache: uncached run: %s", dt_last_error());
        return;
    }
    int guided = 0;
    for (int k = 0; k < base.steps; k++) guided += guided_at(pc, &base, k);
    snprintf(nm, sizeof nm, "%s cache off: %d steps + %d guided passes, all computed", key, base.steps, guided);
    T_CHECK(nm, tb.passes == base.steps + guided && tb.passes_computed == tb.passes, "%d of %d", tb.passes_computed,
            tb.passes);
    const char *same[] = {"first-block=0", "taylorseer=1"};
    for (int i = 0; i < 2; i++) {
        int rc = cache_run(pl, pc, noise, 0, same[i], &o, &tm);
        snprintf(nm, sizeof nm, "%s %s: latents byte-identical to no cache, %d passes computed", key, same[i], tb.passes);
        T_CHECK(nm, rc == 0 && o.n == base.n && !memcmp(o.lat, base.lat, sizeof(float) * (size_t)o.n) &&
                tm.passes == tb.passes && tm.passes_computed == tb.passes, "rc %d (%s), %d of %d passes", rc,
                rc ? dt_last_error() : "", tm.passes_computed, tm.passes);
        free(o.lat);
    }
    float *lat3 = base.lat;   /* the 3-step result: the scale of the cache's error below */
    /* 6 steps: caching skips the passes the rules say, per branch (pass 1 only on guided steps) */
    const int S = 6;
    if (cache_run(pl, pc, noise, S, "off", &base, &tb)) {
        T_FAIL(key, "cache: 6-step run: %s", dt_last_error());
        free(lat3);
        return;
    }
    guided = 0;
    int g_ends = 0, g_ts = 0;   /* guided steps; of them forced (first, last); of them computed by taylorseer=2 */
    for (int k = 0; k < S; k++) {
        if (!guided_at(pc, &base, k)) continue;
        guided++;
        g_ends += k == 0 || k == S - 1;
        g_ts += k != 3;   /* taylorseer=2 over 6 steps: 0, 1, 2 (warm-up), 4, 5 (last) computed */
    }
    /* Tolerance: a cache that stands in for passes must stay closer to the 6-step result than the 3-step one is
     * (half the passes, all computed): the fixture's random blocks give no meaningful absolute scale, the sampler's
     * own discretisation error does. */
    const double tol = rel_l2(lat3, base.lat, (size_t)base.n);
    free(lat3);
    struct { const char *spec; int computed; } sk[] = {{ZI_CACHE_SKIP_ALL, 2 + g_ends}, {"taylorseer=2", 5 + g_ts}};
    for (int i = 0; i < 2; i++) {
        int rc = cache_run(pl, pc, noise, S, sk[i].spec, &o, &tm);
        int dec_ok = rc == 0;
        for (int k = 0; k < S && dec_ok; k++) {
            const float want0 = i == 0 ? (k == 0 || k == S - 1) : k != 3;
            const float want1 = !guided_at(pc, &base, k) ? 0.0f : i == 0 ? (k == 0 || k == S - 1) : k != 3;
            dec_ok = o.dec[2 * k] == want0 && o.dec[2 * k + 1] == want1;
        }
        const double rel = rc == 0 && o.n == base.n ? rel_l2(o.lat, base.lat, (size_t)o.n) : INFINITY;
        snprintf(nm, sizeof nm, "%s %s, %d steps (%d guided): %d of %d passes computed, per-branch decisions, final "
                 "latents closer to uncached than 3 steps are", key, sk[i].spec, S, guided, sk[i].computed, S + guided);
        T_CHECK(nm, rc == 0 && dec_ok && tm.passes == S + guided && tm.passes_computed == sk[i].computed &&
                rel > 0 && rel < tol, "rc %d (%s), decisions %s, %d of %d passes, rel L2 %.3g (3 steps: %.3g)", rc,
                rc ? dt_last_error() : "", dec_ok ? "ok" : "differ", tm.passes_computed, tm.passes, rel, tol);
        printf("  %s %s: %d of %d passes, final latents rel L2 vs uncached %.3g (3 uncached steps: %.3g)\n", key,
               sk[i].spec, tm.passes_computed, tm.passes, rel, tol);
        free(o.lat);
    }
    free(base.lat);
}

static void pipeline_cpu(dt_backend *be) {
    char p[600], dir[512], nf[700];
    json *cases = json_parse_file(fx("cases.json", p, sizeof p));
    st_file *tio = st_open(fx("text_io.safetensors", p, sizeof p));
    dt_tokenizer *tok = dt_tokenizer_load(fx("model/tokenizer", p, sizeof p));
    dt_qwen3_config qc;
    dt_qwen3 *te = NULL;
    if (!dt_qwen3_read_config(fx("model/text_encoder", p, sizeof p), &qc))
        te = dt_qwen3_load(be, p, zimage_prompt_tap(qc.num_layers));   /* the last layer is never needed */
    float *neg = NULL, *emp = NULL, *feats = NULL;
    int n_neg = 0, n_emp = 0, n_cap = 0;
    dt_image init = {0}, mask = {0};
    dt_pipeline *pl = NULL;
    if (!cases || !tio || !tok || !te || t_tmpdir(dir, sizeof dir, "zimage-engine")) {
        T_FAIL("pipeline", "setup: %s", dt_last_error());
        goto done;
    }
    test_sigmas(cases);
    prompt_case(te, tok, tio, cases, "negative", &neg, &n_neg);
    prompt_case(te, tok, tio, cases, "empty", &emp, &n_emp);
    prompt_case(te, tok, tio, cases, "prompt", &feats, &n_cap);

    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = fx("model", p, sizeof p);
    pl = dt_pipeline_load(be, &lo);
    if (!pl) { T_FAIL("engine: load the ZImagePipeline folder", "%s", dt_last_error()); goto rm; }
    const dt_pipeline_info *in = dt_pipeline_get_info(pl);
    /* the fixture's folder is no Turbo checkpoint (no is_distilled, no "turbo" in its path): the pipeline's defaults */
    T_CHECK("engine: Z-Image family, base defaults (50 steps, guidance 5), size multiple 2 x vae scale",
            !strcmp(in->family, "z-image") && in->default_steps == 50 && in->default_guidance == 5.0f &&
            in->size_multiple == 8 && in->img2img && in->cfg_shaping && !in->distilled,
            "%s, %d steps, guidance %g, multiple %d", in->family, in->default_steps, in->default_guidance, in->size_multiple);
    turbo_case(be, dir, "Z-Image-Turbo", NULL, 9, 0.0f);
    turbo_case(be, dir, "z-image-turbo-explicit", "false", 50, 5.0f);
    turbo_case(be, dir, "zimage-distilled", "true", 9, 0.0f);
    engine_case(pl, cases, "pipeline", "pipeline_io.safetensors", fx("pipeline_io.safetensors", nf, sizeof nf), NULL, NULL);
    engine_case(pl, cases, "pipeline_cfg", "pipeline_cfg_io.safetensors", fx("pipeline_cfg_io.safetensors", nf, sizeof nf),
                NULL, NULL);
    cache_case(pl, cases, "pipeline", fx("pipeline_io.safetensors", nf, sizeof nf));
    cache_case(pl, cases, "pipeline_cfg", fx("pipeline_cfg_io.safetensors", nf, sizeof nf));
    if (dt_image_read_file(fx("init.png", p, sizeof p), &init) || dt_image_read_file(fx("mask.png", p, sizeof p), &mask)) {
        T_FAIL("edit inputs", "%s", dt_last_error());
        goto rm;
    }
    snprintf(nf, sizeof nf, "%s/img2img_noise.safetensors", dir);
    if (zimage_edit_noise("img2img", "img2img_io.safetensors", nf)) T_FAIL("img2img", "fixture lacks its draws");
    else engine_case(pl, cases, "img2img", "img2img_io.safetensors", nf, &init, NULL);
    snprintf(nf, sizeof nf, "%s/inpaint_noise.safetensors", dir);
    if (zimage_edit_noise("inpaint", "inpaint_io.safetensors", nf)) T_FAIL("inpaint", "fixture lacks its draws");
    else engine_case(pl, cases, "inpaint", "inpaint_io.safetensors", nf, &init, &mask);
rm:
    t_rmtree(dir);
done:
    dt_pipeline_free(pl);
    dt_image_free(&init);
    dt_image_free(&mask);
    free(neg);
    free(emp);
    free(feats);
    dt_qwen3_free(te);
    dt_tokenizer_free(tok);
    if (tio) st_close(tio);
    json_free(cases);
}

/* CUDA against the CPU on the same inputs: the transformer forward of transformer_io (ZIMAGE_GPU_TOL) and the whole
 * engine pipelines (guidance 0, and CFG with cfg_normalization / cfg_truncation) from the reference's noise: the final
 * latents (rel L2) and the 8-bit images (mean |difference|). */
/* bf16 activations and weights through 3 steps of 6 blocks, then the bf16 VAE: the per-forward 1e-2 contract,
 * accumulated over the steps; the image's mean byte difference a small fraction of the range. */
#define ZIMAGE_GPU_PIPE_TOL 2e-2
#define ZIMAGE_GPU_PIXEL_MEAN 2.0

typedef struct { float *lat; int64_t n; } final_obs;
static void observe_final(void *ud, const char *name, const float *d, int ndim, const int64_t *shape) {
    final_obs *o = ud;
    if (strcmp(name, "latents_unpacked")) return;
    o->n = 1;
    for (int i = 0; i < ndim; i++) o->n *= shape[i];
    free(o->lat);
    o->lat = dt_malloc(sizeof(float) * (size_t)o->n);
    memcpy(o->lat, d, sizeof(float) * (size_t)o->n);
}

static void gpu_vs_cpu(dt_backend *cuda) {
    char p[600], name[200];
    dt_backend_opts o = {0};
    o.rope_fp32 = 1;
    dt_backend *cpu = dt_backend_cpu_create(&o);
    fwd_case a;
    zimage_model *mc = NULL, *mg = NULL;
    if (case_load("transformer_io.safetensors", &a) || !(mc = zimage_load(cpu, fx("model", p, sizeof p))) ||
        !(mg = zimage_load(cuda, p))) {
        T_FAIL("cuda vs cpu: transformer", "%s", dt_last_error());
    } else {
        float *oc = forward_case(cpu, mc, &a, "cpu transformer_io (for cuda)", 0, ZIMAGE_CPU_TOL);
        float *og = forward_case(cuda, mg, &a, "cuda transformer_io (vs cpu)", 0, ZIMAGE_GPU_TOL);
        if (oc && og)
            t_check_rel_l2("cuda vs cpu: transformer forward (transformer_io)", og, oc,
                           (size_t)zimage_get_config(mc)->in_channels * a.H * a.W, ZIMAGE_GPU_TOL);
        free(oc);
        free(og);
    }
    zimage_free(mc);
    zimage_free(mg);
    case_free(&a);
    json *cases = json_parse_file(fx("cases.json", p, sizeof p));
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = fx("model", p, sizeof p);
    dt_pipeline *pc = dt_pipeline_load(cpu, &lo), *pg = dt_pipeline_load(cuda, &lo);
    static const char *const keys[2][2] = {{"pipeline", "pipeline_io.safetensors"}, {"pipeline_cfg", "pipeline_cfg_io.safetensors"}};
    for (int k = 0; k < 2 && pc && pg && cases; k++) {
        dt_gen_params g;
        char nf[600];
        case_params(json_get(cases, keys[k][0]), &g);
        g.noise_file = fx(keys[k][1], nf, sizeof nf);
        final_obs fc = {0}, fg = {0};
        uint8_t *rc8 = NULL, *rg8 = NULL;
        int w, h, w2, h2;
        int rc = dt_pipeline_generate(pc, &g, &rc8, &w, &h, NULL, observe_final, &fc) |
                 dt_pipeline_generate(pg, &g, &rg8, &w2, &h2, NULL, observe_final, &fg);
        snprintf(name, sizeof name, "cuda vs cpu: %s final latents", keys[k][0]);
        if (rc || !fc.lat || !fg.lat || fc.n != fg.n || w != w2 || h != h2) {
            T_FAIL(name, "rc %d (%s)", rc, dt_last_error());
        } else {
            t_check_rel_l2(name, fg.lat, fc.lat, (size_t)fc.n, ZIMAGE_GPU_PIPE_TOL);
            double sum = 0;
            for (size_t i = 0; i < (size_t)3 * w * h; i++) sum += abs((int)rg8[i] - (int)rc8[i]);
            const double mean = sum / (3.0 * w * h);
            snprintf(name, sizeof name, "cuda vs cpu: %s image, mean |byte difference| <= %g", keys[k][0],
                     ZIMAGE_GPU_PIXEL_MEAN);
            T_CHECK(name, mean <= ZIMAGE_GPU_PIXEL_MEAN, "%.3f", mean);
            printf("# %s: mean |byte difference| %.3f\n", name, mean);
        }
        free(fc.lat); free(fg.lat); free(rc8); free(rg8);
    }
    if (!pc || !pg || !cases) T_FAIL("cuda vs cpu: pipelines", "%s", dt_last_error());
    dt_pipeline_free(pc);
    dt_pipeline_free(pg);
    json_free(cases);
    cpu->destroy(cpu);
}

/* DITRUN_SLOW=1 with a GPU: Z-Image-Turbo's geometry (the 2 refiners of each stream and 2 of its 30 joint blocks,
 * random bf16 weights) at 1024² (a 64 x 64 token grid) with a 128-token caption: finite, and the time per forward. */
static void slow_real_geometry(dt_backend *cuda) {
    char dir[512], name[160];
    zimage_config pc;
    if (zimage_preset("z-image-turbo", &pc) || t_tmpdir(dir, sizeof dir, "zimage-turbo")) {
        T_FAIL("slow: z-image-turbo geometry", "%s", dt_last_error());
        return;
    }
    pc.n_layers = 2;
    snprintf(name, sizeof name, "slow: z-image-turbo geometry (2 of 30 joint blocks), 1024x1024, 128 caption tokens");
    zimage_model *m = zimage_synth_write(&pc, dir, 0, 0, 3) ? NULL : zimage_load(cuda, dir);
    if (!m) { T_FAIL(name, "%s", dt_last_error()); t_rmtree(dir); return; }
    const int g = 64, N = g * g, T = 128;
    const zimage_config *c = zimage_get_config(m);
    float *img = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels), *cap = dt_malloc(sizeof(float) * (size_t)T * c->cap_dim);
    float *out = dt_malloc(sizeof(float) * (size_t)N * c->patch_channels);
    for (int i = 0; i < N * c->patch_channels; i++) img[i] = sinf(0.01f * (float)i);
    for (int i = 0; i < T * c->cap_dim; i++) cap[i] = cosf(0.003f * (float)i);
    int rc = 0, finite = 1;
    double best = 1e30;
    for (int r = 0; r < 3 && rc == 0; r++) {   /* the first includes the tables and buffers */
        double t0 = dt_now();
        rc = zimage_forward(m, img, g, g, cap, T, 0.5f, out, NULL, NULL);
        best = fmin(best, dt_now() - t0);
    }
    for (int i = 0; rc == 0 && i < N * c->patch_channels; i++) finite &= isfinite(out[i]);
    T_CHECK(name, rc == 0 && finite, "rc %d (%s), finite %d", rc, rc ? dt_last_error() : "", finite);
    printf("# %s: %.1f ms per forward (6 blocks; Turbo runs 34)\n", name, best * 1e3);
    free(img); free(cap); free(out);
    zimage_free(m);
    t_rmtree(dir);
}

int main(void) {
    test_config();
    test_patches();
    test_guidance();
    test_synth();
    test_q4_twin();
    if (!zimage_fixtures_present()) {
        T_SKIP("zimage fixtures", "%s is absent (tools/zimage_reference.py writes it; tests/fixtures/README.md)", g_dir);
        return T_DONE();
    }
    dt_backend_opts o = {0};
    o.rope_fp32 = 1;
    dt_backend *cpu = dt_backend_cpu_create(&o);
    transformer_on(cpu, "cpu", ZIMAGE_CPU_TOL);
    fp8_on(cpu, "cpu", ZIMAGE_FP8_FUSE_CPU_TOL);
    test_missing_tensor(cpu);
    test_lora(cpu);
    test_gguf(cpu);
    test_fp8_file(cpu);
    test_fp8_export(cpu);
    test_infer_config(cpu);
    vae_on(cpu, "cpu", VAE_CPU_TOL, VAE_CPU_TOL);
    test_vae_kinds(cpu);
    pipeline_cpu(cpu);
    cpu->destroy(cpu);

    if (dt_backend_cuda_available()) {
        dt_backend *cuda = dt_backend_cuda_create(&o);
        if (!cuda) {
            T_FAIL("cuda", "backend: %s", dt_last_error());
        } else {
            transformer_on(cuda, "cuda", ZIMAGE_GPU_TOL);
            fp8_on(cuda, "cuda", ZIMAGE_FP8_FUSE_GPU_TOL);
            vae_on(cuda, "cuda", VAE_GPU_TOL, VAE_GPU_ENC_TOL);
            gpu_vs_cpu(cuda);
            const char *slow = getenv("DITRUN_SLOW");
            if (slow && *slow == '1') slow_real_geometry(cuda);
            cuda->destroy(cuda);
        }
    } else if (t_require_gpu_env()) {
        T_FAIL("cuda", "DITRUN_REQUIRE_GPU=1 but no usable GPU");
    } else {
        T_SKIP("cuda", "no usable GPU");
    }
    return T_DONE();
}
