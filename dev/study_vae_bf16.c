/* study_vae_bf16.c — CPU only: how much of the CUDA VAE's error against the f32 reference bf16 storage alone
 * explains, and which op's rounding dominates. The CPU backend (f32) is wrapped so that chosen ops round what the
 * CUDA backend stores in bf16 (round to nearest even, as __float2bfloat16_rn): the uploaded input, the conv and
 * Linear weights, the conv outputs (the GEMM's product, then again after the bias, as cuda_image.cu's conv_run and
 * dtc_add_col_bias do; one rounding for the direct small-cout kernel), the GroupNorm outputs (and the value
 * before its fused SiLU), the residual sums (gated_add), the attention's Linears and the attention itself (P
 * rounded as the generic fallback's softmax kernel writes it, the output rounded). Each configuration prints the
 * relative L2 of the Z-Image (AutoencoderKL, 8/16 channels, 2 layers per block) and FLUX.2 (32 channels, 1 layer
 * per block) fixture VAEs' decode and encode against the f32 CPU run; then the all-rounded run at other sizes.
 * With everything rounded it reproduces the H100's numbers (Z-Image decode 0.021, posterior mean 0.024-0.026;
 * FLUX.2 [0, 1] image 0.005, edit tokens 0.0085): what a VAE test's CUDA tolerance should be built on.
 *   build/dev/study_vae_bf16 [FIXTURES]   (from the repository root; default tests/fixtures) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/common.h"
#include "image/edit_prep.h"
#include "image/image.h"
#include "io/safetensors.h"
#include "models/vae_flux2.h"
#include "models/vae_kl.h"
#include "pipeline/ref_tokens.h"

enum {
    R_IN = 1,     /* upload (latent / image) */
    R_W = 2,      /* conv and Linear weights */
    R_CONV = 4,   /* conv outputs */
    R_GN = 8,     /* GroupNorm outputs (and pre-SiLU) */
    R_ADD = 16,   /* residual sums */
    R_LIN = 32,   /* attention Linears' outputs */
    R_ATT = 64,   /* attention P and output */
    R_ALL = 127,
    R_CIN = 128,  /* conv inputs (im2col's bf16 columns when the activations are F32) */
    R_FUSED = 256 /* conv bias in the GEMM's epilogue: one rounding instead of two */
};
static int g_flags;
static dt_backend *g_cpu;

static float bf(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static void round_mat(dt_mat m) {
    float *p = m.data;
    for (int64_t r = 0; r < m.rows; r++)
        for (int64_t c = 0; c < m.cols; c++) p[r * m.ld + c] = bf(p[r * m.ld + c]);
}

/* ---- the wrapped ops ---- */
typedef struct {
    dt_conv *inner;   /* the CPU conv without bias */
    float *bias;      /* [cout] */
    int cout, k;
} sim_conv;

static dt_conv *s_conv_create(dt_backend *be, const float *w, const float *bias, int cout, int cin, int k, int pad) {
    (void)be;
    const size_t n = (size_t)cout * cin * k * k;
    float *wr = dt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) wr[i] = (g_flags & R_W) ? bf(w[i]) : w[i];
    sim_conv *s = dt_calloc(1, sizeof *s);
    s->inner = g_cpu->conv_create(g_cpu, wr, NULL, cout, cin, k, pad);
    free(wr);
    s->cout = cout;
    s->k = k;
    if (bias) {
        s->bias = dt_malloc((size_t)cout * sizeof(float));
        memcpy(s->bias, bias, (size_t)cout * sizeof(float));
    }
    return (dt_conv *)s;
}
static void s_conv_destroy(dt_backend *be, dt_conv *c) {
    (void)be;
    sim_conv *s = (sim_conv *)c;
    g_cpu->conv_destroy(g_cpu, s->inner);
    free(s->bias);
    free(s);
}
static void conv_after(dt_mat y, const sim_conv *s) {
    float *p = y.data;
    const int direct = (s->cout <= 4 && s->k > 1) || (g_flags & R_FUSED);   /* cuda_image.cu's k_conv_small_cout: bias inside, one rounding */
    for (int64_t r = 0; r < y.rows; r++)
        for (int64_t c = 0; c < y.cols; c++) {
            float v = p[r * y.ld + c];
            if ((g_flags & R_CONV) && !direct) v = bf(v);
            if (s->bias) v += s->bias[r];
            if (g_flags & R_CONV) v = bf(v);
            p[r * y.ld + c] = v;
        }
}
/* x itself, or with R_CIN a rounded copy in *tmp (freed by the caller) */
static dt_mat conv_in(dt_mat x, float **tmp) {
    *tmp = NULL;
    if (!(g_flags & R_CIN)) return x;
    *tmp = aligned_alloc(64, ((size_t)x.rows * x.cols * sizeof(float) + 63) / 64 * 64);
    for (int64_t r = 0; r < x.rows; r++)
        for (int64_t c = 0; c < x.cols; c++) (*tmp)[r * x.cols + c] = bf(((const float *)x.data)[r * x.ld + c]);
    return (dt_mat){*tmp, x.rows, x.cols, x.cols, DT_F32};
}
static void s_conv2d(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w) {
    (void)be;
    const sim_conv *s = (const sim_conv *)c;
    float *tmp;
    g_cpu->conv2d(g_cpu, y, conv_in(x, &tmp), s->inner, h, w);
    free(tmp);
    conv_after(y, s);
}
static void s_conv2d_strided(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int st, int pt,
                             int pl, int pb, int pr) {
    (void)be;
    const sim_conv *s = (const sim_conv *)c;
    float *tmp;
    g_cpu->conv2d_strided(g_cpu, y, conv_in(x, &tmp), s->inner, h, w, st, pt, pl, pb, pr);
    free(tmp);
    conv_after(y, s);
}
static dt_linear *s_linear_create(dt_backend *be, const dt_linear_src *src) {
    (void)be;
    dt_linear_src s = *src;
    if ((g_flags & R_W) && src->dtype == DT_F32 && !src->bits) {   /* leaked: lives as long as the Linear may */
        const size_t n = (size_t)src->out * src->in;
        float *wr = dt_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) wr[i] = bf(((const float *)src->data)[i]);
        s.data = wr;
    }
    return g_cpu->linear_create(g_cpu, &s);
}
static void s_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w) {
    (void)be;
    g_cpu->linear(g_cpu, y, x, w);
    if (g_flags & R_LIN) round_mat(y);
}
static void s_group_norm(dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat gamma, dt_mat beta, float eps,
                         int silu) {
    (void)be;
    if (!(g_flags & R_GN)) { g_cpu->group_norm(g_cpu, y, x, groups, gamma, beta, eps, silu); return; }
    g_cpu->group_norm(g_cpu, y, x, groups, gamma, beta, eps, 0);
    float *p = y.data;
    for (int64_t r = 0; r < y.rows; r++)
        for (int64_t c = 0; c < y.cols; c++) {
            float v = p[r * y.ld + c];
            if (silu) { v = bf(v); v = v / (1.0f + expf(-v)); }
            p[r * y.ld + c] = bf(v);
        }
}
static void s_gated_add(dt_backend *be, dt_mat x, dt_mat gate, dt_mat y) {
    (void)be;
    g_cpu->gated_add(g_cpu, x, gate, y);
    if (g_flags & R_ADD) round_mat(x);
}
static void s_upload(dt_backend *be, dt_mat m, const float *src) {
    (void)be;
    g_cpu->upload(g_cpu, m, src);
    if (g_flags & R_IN) round_mat(m);
}
/* one head (the VAE's): S = scale·Q·Kᵀ in f32, P = softmax rounded to bf16, O = P·V rounded */
static void s_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                        dt_mat kb, int causal) {
    (void)be;
    if (!(g_flags & R_ATT) || hq != 1 || hkv != 1 || kb.data || causal) {
        g_cpu->attention(g_cpu, o, q, k, v, hq, hkv, hd, scale, kb, causal);
        return;
    }
    const float *Q = q.data, *K = k.data, *V = v.data;
    float *O = o.data;
    const int64_t Lq = q.rows, Lk = k.rows;
    float *s = dt_malloc((size_t)Lk * sizeof(float));
    for (int64_t i = 0; i < Lq; i++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < Lk; j++) {
            double acc = 0;
            for (int d = 0; d < hd; d++) acc += (double)Q[i * q.ld + d] * K[j * k.ld + d];
            s[j] = scale * (float)acc;
            if (s[j] > m) m = s[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < Lk; j++) sum += expf(s[j] - m);
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < Lk; j++) s[j] = bf(expf(s[j] - m) * inv);
        for (int d = 0; d < hd; d++) {
            double acc = 0;
            for (int64_t j = 0; j < Lk; j++) acc += (double)s[j] * V[j * v.ld + d];
            O[i * o.ld + d] = bf((float)acc);
        }
    }
    free(s);
}

static dt_backend *sim_create(void) {
    dt_backend *s = dt_malloc(sizeof *s);
    *s = *g_cpu;
    s->conv_create = s_conv_create;
    s->conv_destroy = s_conv_destroy;
    s->conv2d = s_conv2d;
    s->conv2d_strided = s_conv2d_strided;
    s->linear_create = s_linear_create;
    s->linear = s_linear;
    s->group_norm = s_group_norm;
    s->gated_add = s_gated_add;
    s->upload = s_upload;
    s->attention = s_attention;
    return s;
}

/* ---- the fixtures ---- */
/* One configuration's outputs: the raw decode [3, H, W], its [0, 1] image (dt_vae_postprocess, what FLUX.2's
 * test_vae compares), the raw posterior mean [L, h, w] and what the pipeline takes (Z-Image: dt_vae_kl_encode's
 * scaled latents; FLUX.2: the edit reference tokens of dt_ref_tokens_encode, test_vae_encoder's comparison). */
enum { O_DEC, O_IMG, O_ENC, O_PIPE, O_N };
typedef struct {
    float *v[O_N];
    size_t n[O_N];
} run_out;

static char g_fx[512];
static const char *fx(const char *rel, char *buf, size_t n) { snprintf(buf, n, "%s/%s", g_fx, rel); return buf; }
static void die(const char *what) { fprintf(stderr, "%s: %s\n", what, dt_last_error()); exit(1); }

/* the decode of latent [L, h, w] into o's O_DEC and O_IMG */
static void decode_into(dt_vae *v, const float *z, int h, int w, run_out *o) {
    const int s = dt_vae_get_config(v)->scale_factor;
    o->n[O_DEC] = o->n[O_IMG] = 3 * (size_t)(h * s) * (w * s);
    o->v[O_DEC] = dt_malloc(o->n[O_DEC] * sizeof(float));
    o->v[O_IMG] = dt_malloc(o->n[O_IMG] * sizeof(float));
    uint8_t *u8 = dt_malloc(o->n[O_IMG]);
    if (dt_vae_decode(v, z, h, w, o->v[O_DEC])) die("decode");
    dt_vae_postprocess(o->v[O_DEC], h * s, w * s, o->v[O_IMG], u8);
    free(u8);
}

/* Z-Image: vae_io's in.latents -> decode; in.image -> posterior mean and the scaled latents */
static run_out run_zimage(dt_backend *be) {
    char p[600];
    run_out o = {0};
    st_file *io = st_open(fx("zimage/vae_io.safetensors", p, sizeof p));
    dt_vae *v = io ? dt_vae_kl_load(be, fx("zimage/model", p, sizeof p)) : NULL;
    if (!v) die("zimage");
    const st_tensor *zl = st_find(io, "in.latents"), *im = st_find(io, "in.image");
    const dt_vae_config *c = dt_vae_get_config(v);
    const int H = (int)im->shape[2], W = (int)im->shape[3], s = c->scale_factor;
    float *z = st_to_f32(zl), *img = st_to_f32(im);
    decode_into(v, z, (int)zl->shape[2], (int)zl->shape[3], &o);
    o.n[O_ENC] = o.n[O_PIPE] = (size_t)c->latent_channels * (H / s) * (W / s);
    o.v[O_ENC] = dt_malloc(o.n[O_ENC] * sizeof(float));
    o.v[O_PIPE] = dt_malloc(o.n[O_PIPE] * sizeof(float));
    if (dt_vae_encode(v, img, H, W, o.v[O_ENC]) || dt_vae_kl_encode(v, img, H, W, o.v[O_PIPE])) die("zimage encode");
    free(z);
    free(img);
    dt_vae_free(v);
    st_close(io);
    return o;
}

/* FLUX.2: pipeline_io's out.latents_unpacked -> decode; edit/ref0.png -> posterior mean and the edit1 tokens */
static run_out run_flux2(dt_backend *be) {
    char p[600];
    run_out o = {0};
    st_file *io = st_open(fx("pipeline_io.safetensors", p, sizeof p));
    dt_vae *v = io ? dt_vae_load(be, fx("model/vae", p, sizeof p)) : NULL;
    if (!v) die("flux2");
    const st_tensor *zl = st_find(io, "out.latents_unpacked");   /* [8, 16, 16] */
    float *z = st_to_f32(zl);
    decode_into(v, z, 16, 16, &o);
    free(z);
    dt_image im;
    dt_prep_image pi = {0};
    if (dt_image_read_file(fx("edit/ref0.png", p, sizeof p), &im) || dt_prep_reference(&im, p, dt_ref_multiple(v), &pi))
        die("edit/ref0.png");
    dt_image_free(&im);
    const dt_vae_config *c = dt_vae_get_config(v);
    o.n[O_ENC] = (size_t)c->latent_channels * (pi.h / c->scale_factor) * (pi.w / c->scale_factor);
    o.v[O_ENC] = dt_malloc(o.n[O_ENC] * sizeof(float));
    dt_ref_tokens r = {0};
    if (dt_vae_encode(v, pi.rgb, pi.h, pi.w, o.v[O_ENC]) || dt_ref_tokens_encode(v, &pi, 1, &r)) die("flux2 encode");
    o.n[O_PIPE] = (size_t)r.n_tokens * r.channels;
    o.v[O_PIPE] = dt_malloc(o.n[O_PIPE] * sizeof(float));
    memcpy(o.v[O_PIPE], r.tokens, o.n[O_PIPE] * sizeof(float));
    dt_ref_tokens_free(&r);
    dt_prep_image_free(&pi);
    dt_vae_free(v);
    st_close(io);
    return o;
}

static void free_out(run_out *o) {
    for (int i = 0; i < O_N; i++) free(o->v[i]);
}

/* Other geometries (held-out cases): Gaussian latents [L, h, w] decoded, uniform [-1, 1] images [3, s·h, s·w]
 * encoded, the all-rounded run against the f32 one; raw outputs and the decode's [0, 1] image. */
static uint64_t g_rng = 88172645463325252ull;
static float urand(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0));
}
static float nrand(void) { float u = urand() + 1e-12f, v = urand(); return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v); }
static void sizes(const char *name, const char *dir, int kl, dt_backend *sim) {
    char p[600];
    static const int hw[][2] = {{6, 10}, {8, 8}, {16, 16}, {10, 14}, {24, 12}};
    for (size_t i = 0; i < sizeof hw / sizeof hw[0]; i++) {
        const int h = hw[i][0], w = hw[i][1];
        double e[3] = {0, 0, 0};
        for (int pass = 0; pass < 2; pass++) {   /* same inputs for the f32 and the bf16 run */
            const uint64_t seed = g_rng;
            float *out[2][2];
            int L = 0, s = 0;
            for (int r = 0; r < 2; r++) {
                g_rng = seed;
                g_flags = r ? R_ALL : 0;
                dt_backend *be = r ? sim : g_cpu;
                dt_vae *v = kl ? dt_vae_kl_load(be, fx(dir, p, sizeof p)) : dt_vae_load(be, fx(dir, p, sizeof p));
                if (!v) { fprintf(stderr, "%s\n", dt_last_error()); exit(1); }
                L = dt_vae_get_config(v)->latent_channels;
                s = dt_vae_get_config(v)->scale_factor;
                const size_t nl = (size_t)L * h * w, ni = 3 * (size_t)h * s * w * s;
                float *in = dt_malloc((pass ? ni : nl) * sizeof(float));
                for (size_t j = 0; j < (pass ? ni : nl); j++) in[j] = pass ? 2 * urand() - 1 : nrand();
                out[r][pass] = dt_malloc((pass ? nl : ni) * sizeof(float));
                int rc = pass ? dt_vae_encode(v, in, h * s, w * s, out[r][pass]) : dt_vae_decode(v, in, h, w, out[r][pass]);
                if (rc) { fprintf(stderr, "%s\n", dt_last_error()); exit(1); }
                free(in);
                dt_vae_free(v);
            }
            const size_t nl = (size_t)L * h * w, ni = 3 * (size_t)h * s * w * s;
            if (pass) {
                e[2] = dt_rel_l2(out[1][1], out[0][1], nl);
            } else {
                e[0] = dt_rel_l2(out[1][0], out[0][0], ni);
                float *a = dt_malloc(ni * sizeof(float)), *b = dt_malloc(ni * sizeof(float));
                uint8_t *u = dt_malloc(ni);
                dt_vae_postprocess(out[1][0], h * s, w * s, a, u);
                dt_vae_postprocess(out[0][0], h * s, w * s, b, u);
                e[1] = dt_rel_l2(a, b, ni);
                free(a); free(b); free(u);
            }
            free(out[0][pass]); free(out[1][pass]);
        }
        printf("%-7s latent %2dx%-2d  decode %.2e  img01 %.2e  encode %.2e\n", name, h, w, e[0], e[1], e[2]);
    }
}

int main(int argc, char **argv) {
    snprintf(g_fx, sizeof g_fx, "%s", argc > 1 ? argv[1] : "tests/fixtures");
    dt_backend_opts opts = {0};
    g_cpu = dt_backend_cpu_create(&opts);
    if (!g_cpu) { fprintf(stderr, "%s\n", dt_last_error()); return 1; }
    dt_backend *sim = sim_create();
    static const struct { const char *name; int flags; } cfg[] = {
        {"f32 (wrapper, no rounding)", 0},
        {"input only", R_IN},
        {"weights only", R_W},
        {"conv outputs only", R_CONV},
        {"GroupNorm outputs only", R_GN},
        {"residual sums only", R_ADD},
        {"attention Linears + attention", R_LIN | R_ATT},
        {"all (CUDA)", R_ALL},
        {"all but weights", R_ALL & ~R_W},
        {"all but conv outputs", R_ALL & ~R_CONV},
        {"all but GroupNorm outputs", R_ALL & ~R_GN},
        {"all but residual sums", R_ALL & ~R_ADD},
        {"all but attention", R_ALL & ~(R_LIN | R_ATT)},
        {"all, conv bias fused (1 rounding)", R_ALL | R_FUSED},
        {"all but conv outs + residuals", R_ALL & ~(R_CONV | R_ADD)},
        {"all but conv outs + GroupNorm", R_ALL & ~(R_CONV | R_GN)},
        {"all but GroupNorm + residuals", R_ALL & ~(R_GN | R_ADD)},
        {"F32 acts, bf16 GEMM inputs", R_W | R_CIN | R_LIN | R_ATT},
        {"F32 acts, f32 weights", R_CIN | R_LIN | R_ATT},
    };
    g_flags = 0;
    run_out zf = run_zimage(g_cpu), ff = run_flux2(g_cpu);
    char p[600];
    st_file *zio = st_open(fx("zimage/vae_io.safetensors", p, sizeof p));
    st_file *pio = st_open(fx("pipeline_io.safetensors", p, sizeof p));
    st_file *eio = st_open(fx("edit/edit1_io.safetensors", p, sizeof p));
    if (!zio || !pio || !eio) die("fixtures");
    float *zdec = st_to_f32(st_find(zio, "out.decoded")), *zmean = st_to_f32(st_find(zio, "out.mean"));
    float *fimg = st_to_f32(st_find(pio, "out.image_float")), *ftok = st_to_f32(st_find(eio, "mid.ref_latents_packed"));
    printf("f32 CPU vs the references: zimage decode %.2e, posterior mean %.2e | flux2 [0, 1] image %.2e, tokens %.2e\n",
           dt_rel_l2(zf.v[O_DEC], zdec, zf.n[O_DEC]), dt_rel_l2(zf.v[O_ENC], zmean, zf.n[O_ENC]),
           dt_rel_l2(ff.v[O_IMG], fimg, ff.n[O_IMG]), dt_rel_l2(ff.v[O_PIPE], ftok, ff.n[O_PIPE]));
    free(zdec); free(zmean); free(fimg); free(ftok);
    st_close(zio); st_close(pio); st_close(eio);
    printf("rel L2 against the f32 CPU run; dec: raw decode, img01: its [0, 1] image, enc: posterior mean, pipe: "
           "zimage scaled latents / flux2 edit tokens\n");
    printf("%-34s %9s %9s %9s %9s | %9s %9s %9s %9s\n", "rounded to bf16", "zi dec", "zi img01", "zi enc", "zi pipe",
           "fx dec", "fx img01", "fx enc", "fx pipe");
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        g_flags = cfg[i].flags;
        run_out z = run_zimage(sim), f = run_flux2(sim);
        printf("%-34s", cfg[i].name);
        for (int k = 0; k < O_N; k++) printf(" %9.2e", dt_rel_l2(z.v[k], zf.v[k], z.n[k]));
        printf(" |");
        for (int k = 0; k < O_N; k++) printf(" %9.2e", dt_rel_l2(f.v[k], ff.v[k], f.n[k]));
        printf("\n");
        free_out(&z);
        free_out(&f);
    }
    free_out(&zf);
    free_out(&ff);
    printf("all rounded vs f32 at other sizes (Gaussian latents, uniform [-1, 1] images of the latent's pixel size)\n");
    sizes("zimage", "zimage/model", 1, sim);
    sizes("flux2", "model/vae", 0, sim);
    free(sim);
    g_cpu->destroy(g_cpu);
    return 0;
}
