/* test_flux2_sp.c — the split (sequence-parallel) FLUX.2 forward on the CPU, N ranks as threads (models/flux2_sp.h):
 * its output against flux2_forward's on the same inputs — the tiny fixture (2 heads) with N = 1, 2, and a synthetic
 * 6-head model with N = 2, 3, 4 (4 ranks: heads 2+2+1+1) on token counts that do not divide by N, with appended and
 * KV-cached reference tokens, resident text, repeated forwards and shape changes, fp8 Linears; and the errors (more
 * ranks than heads or than image tokens, a rank count out of range). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "model_dirs.h"
#include "models/flux2_sp.h"
#include "test.h"

/* Split vs unsplit, f32 CPU: the same ops per row and the keys in the same order, but OpenBLAS picks its kernels and
 * blocking by the row count, so GEMMs of L/N rows may sum in another order (~1 ulp per GEMM); measured ~1e-7. A wrong
 * row, head or offset gives >= 1e-1. */
#define SP_CPU_TOL 1e-5
/* fp8 Linears quantize each activation row to e4m3 (steps of 1/8 relative): an ulp of difference upstream can move a
 * value across a rounding boundary and change it by 1/8; a few such flips carry through the blocks. Measured 1e-7 to
 * 7e-3 depending on the inputs; a wrong row, head or offset gives >= 1e-1. */
#define SP_FP8_TOL 2e-2

typedef struct {
    int n, t, r;                 /* image (noise) tokens, text tokens, reference tokens */
    float *img, *txt, *img_ids, *txt_ids, *ref, *ref_ids;
} inputs;

static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static float urand(void) {   /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

static void make_inputs(const flux2_config *c, int n, int t, int r, inputs *in) {
    memset(in, 0, sizeof *in);
    in->n = n; in->t = t; in->r = r;
    in->img = malloc(sizeof(float) * n * c->in_channels);
    in->txt = malloc(sizeof(float) * (t ? t : 1) * c->joint_dim);
    in->img_ids = calloc((size_t)n * 4, sizeof(float));
    in->txt_ids = calloc((size_t)(t ? t : 1) * 4, sizeof(float));
    for (int i = 0; i < n * c->in_channels; i++) in->img[i] = urand();
    for (int i = 0; i < t * c->joint_dim; i++) in->txt[i] = urand();
    for (int i = 0; i < n; i++) { in->img_ids[i * 4 + 1] = (float)(i / 7); in->img_ids[i * 4 + 2] = (float)(i % 7); }
    for (int i = 0; i < t; i++) in->txt_ids[i * 4 + 3] = (float)i;
    if (r) {
        in->ref = malloc(sizeof(float) * r * c->in_channels);
        in->ref_ids = calloc((size_t)r * 4, sizeof(float));
        for (int i = 0; i < r * c->in_channels; i++) in->ref[i] = urand();
        for (int i = 0; i < r; i++) {
            in->ref_ids[i * 4] = 10.0f;
            in->ref_ids[i * 4 + 1] = (float)(i / 5);
            in->ref_ids[i * 4 + 2] = (float)(i % 5);
        }
    }
}

static void free_inputs(inputs *in) {
    free(in->img); free(in->txt); free(in->img_ids); free(in->txt_ids); free(in->ref); free(in->ref_ids);
}

static dt_backend *cpu(void) {
    dt_backend_opts o = {0};
    o.threads = 2;
    return dt_backend_cpu_create(&o);
}

static flux2_load_opts g_load;   /* LoRA adapters of the model under test (none by default) */

/* The unsplit forward on a fresh model (refs: 0 none, 1 appended, 2 KV-cached). */
static float *single(const char *model, dt_precision prec, const inputs *in, float ts, int refs) {
    dt_backend *be = cpu();
    flux2_load_opts lo = g_load;
    lo.precision = prec;
    flux2_model *m = flux2_load_ex(be, model, &lo);
    float *out = NULL;
    if (m) {
        const flux2_config *c = flux2_get_config(m);
        out = malloc(sizeof(float) * in->n * c->out_channels);
        if ((refs && flux2_set_refs(m, in->ref, in->ref_ids, in->r, refs == 2)) ||
            flux2_forward(m, in->img, in->n, in->txt, in->t, ts, in->img_ids, in->txt_ids, out, NULL, NULL)) {
            printf("# single forward: %s\n", dt_last_error());
            free(out);
            out = NULL;
        }
        flux2_free(m);
    } else {
        printf("# single load: %s\n", dt_last_error());
    }
    be->destroy(be);
    return out;
}

/* The split forward with N ranks vs the unsplit one. */
static void compare(const char *name, const char *model, int N, dt_precision prec, const inputs *in, float ts, int refs,
                    double tol) {
    float *ref = single(model, prec, in, ts, refs);
    dt_backend *be = cpu();
    flux2_sp_opts o = {.ranks = N, .load = g_load};
    o.load.precision = prec;
    flux2_sp *sp = flux2_sp_load(be, model, &o);
    if (!ref || !sp) {
        T_FAIL(name, "load: %s", dt_last_error());
    } else {
        const flux2_config *c = flux2_sp_get_config(sp);
        float *out = malloc(sizeof(float) * in->n * c->out_channels);
        if ((refs && flux2_sp_set_refs(sp, in->ref, in->ref_ids, in->r, refs == 2)) ||
            flux2_sp_forward(sp, in->img, in->n, in->txt, in->t, ts, in->img_ids, in->txt_ids, out))
            T_FAIL(name, "forward: %s", dt_last_error());
        else
            t_check_rel_l2(name, out, ref, (size_t)in->n * c->out_channels, tol);
        free(out);
    }
    flux2_sp_free(sp);
    be->destroy(be);
    free(ref);
}

/* A rank-4 LoRA for the fixture model (D = 256, F = 768) in diffusers naming: the text stream's output projection and
 * the first single block's fused projection. */
static int write_lora(const char *path) {
    const int64_t D = 256, F = 768, R = 4;
    struct { const char *name; int64_t out, in; } m[] = {
        {"transformer.transformer_blocks.0.attn.to_add_out", D, D},
        {"transformer.single_transformer_blocks.0.attn.to_qkv_mlp_proj", 3 * D + 2 * F, D},
    };
    st_writer *w = st_writer_new();
    char nm[300];
    for (int k = 0; k < 2; k++) {
        float *a = malloc(sizeof(float) * (size_t)(R * m[k].in)), *b = malloc(sizeof(float) * (size_t)(m[k].out * R));
        for (int64_t i = 0; i < R * m[k].in; i++) a[i] = 0.2f * urand();
        for (int64_t i = 0; i < m[k].out * R; i++) b[i] = 0.2f * urand();
        int64_t sa[2] = {R, m[k].in}, sb[2] = {m[k].out, R};
        snprintf(nm, sizeof nm, "%s.lora_A.weight", m[k].name);
        st_writer_add_f32(w, nm, 2, sa, a);
        snprintf(nm, sizeof nm, "%s.lora_B.weight", m[k].name);
        st_writer_add_f32(w, nm, 2, sb, b);
        free(a);
        free(b);
    }
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    return rc;
}

int main(void) {
    char fixture[512], six[512], name[160];
    snprintf(fixture, sizeof fixture, "%s/model", t_fixtures());
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(six, sizeof six, "%s/ditrun-sp-six-%d", tmp, (int)getpid());

    /* the fixture model: 2 heads, 64 image + 16 text tokens (the fixture's inputs' shapes) */
    flux2_config tiny;
    flux2_preset("tiny", &tiny);
    inputs in;
    make_inputs(&tiny, 64, 16, 0, &in);
    compare("sp forward: fixture model, 1 rank == unsplit", fixture, 1, DT_PREC_BF16, &in, 0.7f, 0, SP_CPU_TOL);
    compare("sp forward: fixture model, 2 ranks == unsplit", fixture, 2, DT_PREC_BF16, &in, 0.7f, 0, SP_CPU_TOL);
    free_inputs(&in);
    make_inputs(&tiny, 63, 15, 0, &in);
    compare("sp forward: fixture model, 2 ranks, 63 image + 15 text tokens (odd) == unsplit", fixture, 2, DT_PREC_BF16,
            &in, 0.3f, 0, SP_CPU_TOL);
    free_inputs(&in);

    /* LoRA adapters on every rank: merged into the dense weights, and as side products through the model's LoRA
     * backend wrapper (the split forward must run the model's ops on that wrapper) */
    {
        char lora[600];
        snprintf(lora, sizeof lora, "%s/ditrun-sp-lora-%d.safetensors", tmp, (int)getpid());
        dt_lora_spec spec;
        if (write_lora(lora) || dt_lora_spec_parse(lora, &spec)) {
            T_FAIL("sp forward: LoRA", "cannot write %s: %s", lora, dt_last_error());
        } else {
            spec.scale = 0.8f;
            make_inputs(&tiny, 63, 15, 0, &in);
            for (int side = 0; side <= 1; side++) {
                g_load = (flux2_load_opts){.loras = &spec, .n_loras = 1, .lora_side = side};
                float *base = NULL;
                if (side == 0) {   /* the adapter changes the output (so the comparison below sees it) */
                    flux2_load_opts none = {0};
                    g_load = none;
                    base = single(fixture, DT_PREC_BF16, &in, 0.5f, 0);
                    g_load = (flux2_load_opts){.loras = &spec, .n_loras = 1, .lora_side = side};
                    float *with = single(fixture, DT_PREC_BF16, &in, 0.5f, 0);
                    double d = base && with ? dt_rel_l2(with, base, (size_t)63 * 32) : 0;
                    T_CHECK("sp forward: the test LoRA changes the fixture's output", d > 1e-3, "rel_l2 %.3g", d);
                    free(with);
                    free(base);
                }
                compare(side ? "sp forward: 2 ranks, LoRA as side products (the wrapper backend) == unsplit"
                             : "sp forward: 2 ranks, LoRA merged == unsplit",
                        fixture, 2, DT_PREC_BF16, &in, 0.5f, 0, SP_CPU_TOL);
            }
            g_load = (flux2_load_opts){0};
            free_inputs(&in);
        }
        unlink(lora);
    }

    if (write_six_heads(six, 23)) {
        T_FAIL("sp forward: synthetic 6-head model", "write: %s", dt_last_error());
        return T_DONE();
    }
    flux2_config c6;
    six_heads_config(&c6);
    for (int N = 2; N <= 4; N++) {
        make_inputs(&c6, 37, 10, 0, &in);   /* 37 and 10 divide by none of 2, 3, 4 */
        snprintf(name, sizeof name, "sp forward: 6 heads, %d ranks (heads %s), 37 image + 10 text tokens == unsplit", N,
                 N == 2 ? "3+3" : N == 3 ? "2+2+2" : "2+2+1+1");
        compare(name, six, N, DT_PREC_BF16, &in, 0.55f, 0, SP_CPU_TOL);
        free_inputs(&in);
    }
    make_inputs(&c6, 37, 2, 0, &in);
    compare("sp forward: 4 ranks, 2 text tokens (ranks without text rows) == unsplit", six, 4, DT_PREC_BF16, &in, 0.9f,
            0, SP_CPU_TOL);
    free_inputs(&in);
    make_inputs(&c6, 5, 0, 0, &in);
    compare("sp forward: 4 ranks, 5 image tokens, no text == unsplit", six, 4, DT_PREC_BF16, &in, 0.2f, 0, SP_CPU_TOL);
    free_inputs(&in);

    /* references: appended (split with the image rows, only noise rows projected) and KV-cached (split extract pass) */
    make_inputs(&c6, 29, 7, 11, &in);
    compare("sp forward: 3 ranks, 29 noise + 11 appended reference tokens == unsplit", six, 3, DT_PREC_BF16, &in, 0.6f,
            1, SP_CPU_TOL);
    compare("sp forward: 3 ranks, 11 KV-cached reference tokens == unsplit", six, 3, DT_PREC_BF16, &in, 0.6f, 2,
            SP_CPU_TOL);
    compare("sp forward: 4 ranks, 11 KV-cached reference tokens == unsplit", six, 4, DT_PREC_BF16, &in, 0.6f, 2,
            SP_CPU_TOL);
    free_inputs(&in);

    /* fp8 Linears (the CPU's emulation of --precision fp8) */
    make_inputs(&c6, 37, 10, 0, &in);
    compare("sp forward: 3 ranks, fp8 Linears == unsplit fp8", six, 3, DT_PREC_FP8, &in, 0.55f, 0, SP_FP8_TOL);
    free_inputs(&in);

    /* one loaded split model across forwards: resident text, repeats, shape changes, references set and removed */
    {
        dt_backend *be = cpu();
        flux2_sp_opts o = {.ranks = 3};
        flux2_sp *sp = flux2_sp_load(be, six, &o);
        inputs a, b;
        make_inputs(&c6, 37, 10, 9, &a);
        make_inputs(&c6, 22, 13, 0, &b);
        float *ra = single(six, DT_PREC_BF16, &a, 0.4f, 0), *rb = single(six, DT_PREC_BF16, &b, 0.8f, 0);
        float *rk = single(six, DT_PREC_BF16, &a, 0.4f, 2);
        float *o1 = malloc(sizeof(float) * 37 * 32), *o2 = malloc(sizeof(float) * 37 * 32);
        int ok = sp && ra && rb && rk;
        ok = ok && flux2_sp_text_resident(sp, a.txt, a.t) == 0;
        ok = ok && flux2_sp_forward(sp, a.img, a.n, a.txt, a.t, 0.4f, a.img_ids, a.txt_ids, o1) == 0;
        if (ok) t_check_rel_l2("sp forward: resident text == unsplit", o1, ra, 37 * 32, SP_CPU_TOL);
        ok = ok && flux2_sp_forward(sp, b.img, b.n, b.txt, b.t, 0.8f, b.img_ids, b.txt_ids, o2) == 0;
        if (ok) t_check_rel_l2("sp forward: another shape on the same ranks == unsplit", o2, rb, 22 * 32, SP_CPU_TOL);
        ok = ok && flux2_sp_set_refs(sp, a.ref, a.ref_ids, a.r, 1) == 0 && flux2_sp_set_refs(sp, NULL, NULL, 0, 0) == 0;
        ok = ok && flux2_sp_forward(sp, a.img, a.n, a.txt, a.t, 0.4f, a.img_ids, a.txt_ids, o2) == 0;
        if (ok) T_CHECK("sp forward: back to the first shape, references set and removed: the same output bit for bit",
                        !memcmp(o1, o2, sizeof(float) * 37 * 32), "outputs differ");
        ok = ok && flux2_sp_set_refs(sp, a.ref, a.ref_ids, a.r, 1) == 0;
        ok = ok && flux2_sp_set_refs(sp, a.ref, a.ref_ids, a.r, 1) == 0 && flux2_sp_set_refs(sp, a.ref, a.ref_ids, a.r, 2) == 0;
        ok = ok && flux2_sp_forward(sp, a.img, a.n, a.txt, a.t, 0.4f, a.img_ids, a.txt_ids, o2) == 0;
        if (ok) t_check_rel_l2("sp forward: KV references after appended ones on the same ranks == unsplit", o2, rk,
                               37 * 32, SP_CPU_TOL);
        ok = ok && flux2_sp_forward(sp, a.img, a.n, a.txt, a.t, 0.4f, a.img_ids, a.txt_ids, o1) == 0;
        if (ok) T_CHECK("sp forward: a second forward with the cached references: the same output bit for bit",
                        !memcmp(o1, o2, sizeof(float) * 37 * 32), "outputs differ");
        if (!ok) T_FAIL("sp forward: one model across forwards", "%s", dt_last_error());
        flux2_sp_free(sp);
        be->destroy(be);
        free(ra); free(rb); free(rk); free(o1); free(o2);
        free_inputs(&a);
        free_inputs(&b);
    }

    /* errors */
    {
        dt_backend *be = cpu();
        flux2_sp_opts o = {.ranks = 3};
        flux2_sp *sp = flux2_sp_load(be, fixture, &o);
        T_CHECK("sp errors: 3 ranks for 2 heads refused", !sp && strstr(dt_last_error(), "2 attention heads"), "%s",
                sp ? "loaded" : dt_last_error());
        flux2_sp_free(sp);
        o.ranks = 0;
        sp = flux2_sp_load(be, fixture, &o);
        T_CHECK("sp errors: 0 ranks refused", !sp && strstr(dt_last_error(), "--sequence-parallel 0"), "%s",
                sp ? "loaded" : dt_last_error());
        o.ranks = FLUX2_SP_MAX_RANKS + 1;
        sp = flux2_sp_load(be, fixture, &o);
        T_CHECK("sp errors: too many ranks refused", !sp && strstr(dt_last_error(), "ranks"), "%s",
                sp ? "loaded" : dt_last_error());
        o.ranks = 2;
        sp = flux2_sp_load(be, "/nonexistent/model", &o);
        T_CHECK("sp errors: a missing model folder is named", !sp && strstr(dt_last_error(), "/nonexistent/model"), "%s",
                sp ? "loaded" : dt_last_error());
        o.ranks = 4;
        sp = flux2_sp_load(be, six, &o);
        float img[3 * 32] = {0}, ids[3 * 4] = {0}, out[3 * 32];
        int rc = sp ? flux2_sp_forward(sp, img, 3, NULL, 0, 0.5f, ids, NULL, out) : 0;
        T_CHECK("sp errors: 3 image tokens over 4 ranks refused", sp && rc == -1 && strstr(dt_last_error(), "3 image tokens"),
                "%s", sp ? dt_last_error() : "not loaded");
        flux2_sp_free(sp);
        be->destroy(be);
    }
    t_rmtree(six);
    return T_DONE();
}
