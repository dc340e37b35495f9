/* test_lora.c — LoRA adapters on the bundled FLUX.2 model (CPU):
 *   - one random update written in the three key layouts (PEFT/diffusers with metadata alpha, kohya with .alpha
 *     tensors, BFL-named with fused qkv / linear1 and the final modulation's halves in BFL order) gives the same
 *     forward; scale 0 gives the base model;
 *   - merged (dense weights) and side-product paths agree within bf16 rounding;
 *   - the merged model equals a checkpoint merged by this test itself (naive loops over the known module mapping,
 *     W + s·B·A rounded to bf16), for one forward and a whole 64x64 generate;
 *   - quantized bases (MLX q4, GGUF Q4_K, fp8) take side products equal to the same weights dense + merged;
 *   - Krea 2: an adapter in diffusers and kohya spelling of its module names gives the same forward, merged and
 *     side product agree;
 *   - bad adapters (unmatched names, rank/shape mismatch, A without B, DoRA, text-encoder keys) fail clearly;
 *   - `synth --lora`'s random adapters (flux2_synth_lora): each layout holds exactly the keys diffusers' converters map
 *     (kohya: lora_unet_ + BFL names with underscores, .lora_down/.lora_up/.alpha; BFL: diffusion_model. + BFL names,
 *     lora_A/lora_B, no lora_down; diffusers: transformer. keys and the LoraConfig metadata), the layouts hold one
 *     update (shared A of a fused q|k|v, the final modulation's halves, alpha folded into the BFL B) and give the
 *     same forward. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flux2_fixture_io.h"
#include "io/json.h"
#include "io/weights.h"
#include "export/flux2_export.h"
#include "models/krea2.h"
#include "pipeline/generate.h"
#include "synth/synth_dit.h"

/* Identical updates written differently: the merged weights are bit-identical (same f32 products, power-of-two
 * scales), so only nothing may differ; the tolerance covers summation-order noise. */
#define SAME_UPDATE_TOL 1e-6
/* Merged (W + s·B·A rounded once to bf16) vs side product (exact W, f32 low-rank term): the bf16 rounding of the
 * merged weights (relative 2^-9 per weight) seen through one forward. */
#define MERGE_VS_SIDE_TOL 3e-3
/* Our merge vs the test's own naive merge: both round the same f32/f64 sums to bf16; a sum within an f32 ulp of
 * a bf16 rounding boundary may round the other way in a few weights. */
#define INDEPENDENT_MERGE_TOL 1e-4
/* Side product on quantized weights vs the same weights dense (F32) with the update merged exactly: f32 both. */
#define SIDE_EXACT_TOL 2e-5

enum { D = 256, F = 768, IN = 32, R = 4, R6 = 2 };

static char tmp[] = "/tmp/ditrun_lora_XXXXXX";
static char fixture_model[512];

static uint32_t seed = 7;
static float frand(void) { seed = seed * 1664525u + 1013904223u; return ((float)(seed >> 8) / 16777216.0f - 0.5f) * 2.0f; }
static float *rnd(size_t n, float amp) { float *v = dt_malloc(sizeof(float) * n); for (size_t i = 0; i < n; i++) v[i] = frand() * amp; return v; }

/* The update: module k has A [r, in] and B [out, r] (BFL row order), applied with scale 0.5. */
typedef struct { const char *bfl, *kohya, *diff; int64_t out, in; int r; float *A, *B; } module;
static module mods[] = {
    {"double_blocks.0.img_attn.qkv", "double_blocks_0_img_attn_qkv", NULL, 3 * D, D, R, NULL, NULL},
    {"double_blocks.0.txt_attn.proj", "double_blocks_0_txt_attn_proj", "transformer_blocks.0.attn.to_add_out", D, D, R, NULL, NULL},
    {"double_blocks.0.img_mlp.0", "double_blocks_0_img_mlp_0", "transformer_blocks.0.ff.linear_in", 2 * F, D, R, NULL, NULL},
    {"single_blocks.0.linear1", "single_blocks_0_linear1", "single_transformer_blocks.0.attn.to_qkv_mlp_proj", 3 * D + 2 * F, D, R, NULL, NULL},
    {"single_blocks.1.linear2", "single_blocks_1_linear2", "single_transformer_blocks.1.attn.to_out", D, D + F, R, NULL, NULL},
    {"final_layer.adaLN_modulation.1", "final_layer_adaLN_modulation_1", "norm_out.linear", 2 * D, D, R6, NULL, NULL},
    {"img_in", "img_in", "x_embedder", D, IN, R, NULL, NULL},
};
#define NMOD ((int)(sizeof mods / sizeof mods[0]))

static const char *tpath(const char *name) {
    static char b[8][600];
    static int k;
    k = (k + 1) & 7;
    snprintf(b[k], sizeof b[k], "%s/%s", tmp, name);
    return b[k];
}

static void add(st_writer *w, const char *name, int64_t r, int64_t c, const float *v) {
    int64_t sh[2] = {r, c};
    st_writer_add_f32(w, name, 2, sh, v);
}

/* B rows [r0, r0 + n) of module m, times s */
static float *brows(const module *m, int64_t r0, int64_t n, float s) {
    float *b = dt_malloc(sizeof(float) * (size_t)(n * m->r));
    for (int64_t i = 0; i < n * m->r; i++) b[i] = m->B[r0 * m->r + i] * s;
    return b;
}

/* diffusers: transformer. prefix, lora_A/lora_B, alpha 2 in metadata (norm_out: alpha_pattern 1) -> scale 0.5 */
static void write_diffusers(const char *path) {
    st_writer *w = st_writer_new();
    char nm[300];
    for (int k = 0; k < NMOD; k++) {
        const module *m = &mods[k];
        if (k == 0) {
            static const char *qkv[3] = {"to_q", "to_k", "to_v"};
            for (int j = 0; j < 3; j++) {
                snprintf(nm, sizeof nm, "transformer.transformer_blocks.0.attn.%s.lora_A.weight", qkv[j]);
                add(w, nm, m->r, m->in, m->A);
                snprintf(nm, sizeof nm, "transformer.transformer_blocks.0.attn.%s.lora_B.weight", qkv[j]);
                float *b = brows(m, j * D, D, 1);
                add(w, nm, D, m->r, b);
                free(b);
            }
            continue;
        }
        snprintf(nm, sizeof nm, "transformer.%s.lora_A.weight", m->diff);
        add(w, nm, m->r, m->in, m->A);
        snprintf(nm, sizeof nm, "transformer.%s.lora_B.weight", m->diff);
        float *b = dt_malloc(sizeof(float) * (size_t)(m->out * m->r));
        if (k == 5) {   /* diffusers norm_out rows: scale | shift = BFL's second half, then its first */
            memcpy(b, m->B + (m->out / 2) * m->r, sizeof(float) * (size_t)(m->out / 2 * m->r));
            memcpy(b + (m->out / 2) * m->r, m->B, sizeof(float) * (size_t)(m->out / 2 * m->r));
        } else {
            memcpy(b, m->B, sizeof(float) * (size_t)(m->out * m->r));
        }
        add(w, nm, m->out, m->r, b);
        free(b);
    }
    st_writer_set_metadata(w, "lora_adapter_metadata",
                           "{\"transformer.r\": 4, \"transformer.lora_alpha\": 2, \"transformer.alpha_pattern\": {\"norm_out.linear\": 1}}");
    st_writer_save(w, path);
    st_writer_free(w);
}

/* kohya: lora_unet_ + BFL names with underscores, lora_down/lora_up, alpha tensors r/2 -> scale 0.5 */
static void write_kohya(const char *path) {
    st_writer *w = st_writer_new();
    char nm[300];
    for (int k = 0; k < NMOD; k++) {
        const module *m = &mods[k];
        snprintf(nm, sizeof nm, "lora_unet_%s.lora_down.weight", m->kohya);
        add(w, nm, m->r, m->in, m->A);
        snprintf(nm, sizeof nm, "lora_unet_%s.lora_up.weight", m->kohya);
        add(w, nm, m->out, m->r, m->B);
        snprintf(nm, sizeof nm, "lora_unet_%s.alpha", m->kohya);
        float a = (float)m->r / 2;
        st_writer_add_f32(w, nm, 0, NULL, &a);
    }
    st_writer_save(w, path);
    st_writer_free(w);
}

/* BFL names (ai-toolkit's diffusion_model. prefix), lora_A/lora_B, no alpha (scale 1): B pre-scaled by 0.5 */
static void write_bfl(const char *path) {
    st_writer *w = st_writer_new();
    char nm[300];
    for (int k = 0; k < NMOD; k++) {
        const module *m = &mods[k];
        snprintf(nm, sizeof nm, "diffusion_model.%s.lora_A.weight", m->bfl);
        add(w, nm, m->r, m->in, m->A);
        snprintf(nm, sizeof nm, "diffusion_model.%s.lora_B.weight", m->bfl);
        float *b = brows(m, 0, m->out, 0.5f);
        add(w, nm, m->out, m->r, b);
        free(b);
    }
    st_writer_save(w, path);
    st_writer_free(w);
}

/* forward of MODEL with adapters; malloc'd out.sample or NULL (error in dt_last_error) */
static float *fwd(const char *model, const char *lora, float scale, int side, size_t *n) {
    fx_inputs fi;
    if (fx_load_inputs(&fi)) return NULL;
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){.rope_fp32 = 1});
    dt_lora_spec spec;
    flux2_load_opts o = {0};
    if (lora) {
        char arg[700];
        snprintf(arg, sizeof arg, "%s:%g", lora, scale);
        if (dt_lora_spec_parse(arg, &spec)) { be->destroy(be); fx_free_inputs(&fi); return NULL; }
        o.loras = &spec;
        o.n_loras = 1;
        o.lora_side = side;
    }
    float *out = NULL;
    flux2_model *m = flux2_load_ex(be, model, &o);
    if (m) {
        *n = (size_t)fi.n * flux2_get_config(m)->out_channels;
        out = dt_malloc(sizeof(float) * *n);
        if (flux2_forward(m, fi.img, fi.n, fi.txt, fi.t, fi.ts, fi.img_ids, fi.txt_ids, out, NULL, NULL)) { free(out); out = NULL; }
        flux2_free(m);
    }
    be->destroy(be);
    fx_free_inputs(&fi);
    return out;
}

static void cmp(const char *name, float *a, float *b, size_t n, double tol) {
    if (!a || !b) T_FAIL(name, "forward failed: %s", dt_last_error());
    else t_check_rel_l2(name, a, b, n, tol);
}

/* The fixture transformer with the update merged by naive loops (double sums), rounded to bf16, written as
 * DIR/transformer/{config.json, diffusion_pytorch_model.safetensors}, the other pipeline parts linked. */
static int write_merged_pipeline(const char *dir) {
    char p[700], q[700];
    mkdir(dir, 0755);
    static const char *parts[] = {"model_index.json", "scheduler", "text_encoder", "tokenizer", "vae"};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", fixture_model, parts[i]);
        char *abs = realpath(p, NULL);
        snprintf(q, sizeof q, "%s/%s", dir, parts[i]);
        if (!abs || symlink(abs, q)) { free(abs); return -1; }
        free(abs);
    }
    snprintf(q, sizeof q, "%s/transformer", dir);
    mkdir(q, 0755);
    snprintf(p, sizeof p, "%s/transformer/config.json", fixture_model);
    snprintf(q, sizeof q, "%s/transformer/config.json", dir);
    FILE *a = fopen(p, "rb"), *b = fopen(q, "wb");
    char buf[4096];
    size_t k;
    while (a && b && (k = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, k, b);
    if (a) fclose(a);
    if (b) fclose(b);
    snprintf(p, sizeof p, "%s/transformer/diffusion_pytorch_model.safetensors", fixture_model);
    st_file *f = st_open(p);
    if (!f) return -1;
    st_writer *w = st_writer_new();
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        /* which module rows this tensor is: diffusers name -> (module, first BFL row, swapped) */
        int mk = -1;
        int64_t r0 = 0;
        int swap = 0;
        size_t len = strlen(t->name);
        for (int m = 0; m < NMOD && mk < 0; m++) {
            char want[300];
            if (m == 0) {
                static const char *qkv[3] = {"to_q", "to_k", "to_v"};
                for (int j = 0; j < 3; j++) {
                    snprintf(want, sizeof want, "transformer_blocks.0.attn.%s.weight", qkv[j]);
                    if (!strcmp(t->name, want)) { mk = 0; r0 = j * D; }
                }
                continue;
            }
            snprintf(want, sizeof want, "%s.weight", mods[m].diff);
            if (!strcmp(t->name, want)) { mk = m; swap = m == 5; }
        }
        if (mk < 0 || len < 7) {
            st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
            continue;
        }
        const module *m = &mods[mk];
        int64_t rows = t->shape[0], cols = t->shape[1];
        float *v = st_to_f32(t);
        uint16_t *h = dt_malloc(sizeof(uint16_t) * (size_t)(rows * cols));
        for (int64_t r = 0; r < rows; r++) {
            int64_t br = r0 + r;   /* BFL row of diffusers row r */
            if (swap) br = r < rows / 2 ? r + rows / 2 : r - rows / 2;
            for (int64_t c = 0; c < cols; c++) {
                double s = 0;
                for (int k2 = 0; k2 < m->r; k2++) s += (double)m->B[br * m->r + k2] * m->A[k2 * m->in + c];
                h[r * cols + c] = dt_f32_to_bf16((float)((double)v[r * cols + c] + 0.5 * s));
            }
        }
        st_writer_add(w, t->name, DT_BF16, 2, t->shape, h);
        free(v);
        free(h);
    }
    snprintf(q, sizeof q, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    int rc = st_writer_save(w, q);
    st_writer_free(w);
    st_close(f);
    return rc;
}


/* Krea 2 fixture forward (krea2_io.safetensors inputs, with its mask) with an optional adapter */
static float *k2fwd(const char *lora, int side, size_t *n) {
    char p[600];
    snprintf(p, sizeof p, "%s/krea2_io.safetensors", t_fixtures());
    st_file *io = st_open(p);
    if (!io) return NULL;
    const st_tensor *h = st_find(io, "in.hidden_states"), *e = st_find(io, "in.encoder_hidden_states");
    float *img = st_to_f32(h), *txt = st_to_f32(e), *pos = st_to_f32(st_find(io, "in.position_ids"));
    float *mf = st_to_f32(st_find(io, "in.encoder_attention_mask")), *tsv = st_to_f32(st_find(io, "in.timestep"));
    int N = (int)h->shape[1], T = (int)e->shape[1];
    uint8_t *mask = dt_malloc((size_t)T);
    for (int i = 0; i < T; i++) mask[i] = mf[i] != 0;
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){.rope_fp32 = 1});
    dt_lora_spec spec;
    krea2_load_opts o = {0};
    if (lora && !dt_lora_spec_parse(lora, &spec)) { o.loras = &spec; o.n_loras = 1; o.lora_side = side; }
    snprintf(p, sizeof p, "%s/krea2", t_fixtures());
    krea2_model *m = krea2_load_ex(be, p, &o);
    float *out = NULL;
    if (m) {
        *n = (size_t)N * (size_t)h->shape[2];
        out = dt_malloc(sizeof(float) * *n);
        if (krea2_forward(m, img, N, txt, T, tsv[0], pos, mask, out, NULL, NULL)) { free(out); out = NULL; }
        krea2_free(m);
    }
    be->destroy(be);
    free(img); free(txt); free(pos); free(mf); free(tsv); free(mask);
    st_close(io);
    return out;
}

static void expect_load_error(const char *name, const char *file, const char *w1, const char *w2) {
    size_t n;
    dt_clear_error();
    float *o = fwd(fixture_model, file, 1, 0, &n);
    const char *e = dt_last_error();
    T_CHECK(name, !o && strstr(e, w1) && (!w2 || strstr(e, w2)), "%s (error: '%s'; wanted '%s' %s)", o ? "LOADED" : "failed", e,
            w1, w2 ? w2 : "");
    free(o);
}

/* a small adapter file with the given tensors (A then B per module; shapes given) */
static void write_pair(const char *path, const char *a_name, int64_t ar, int64_t ac, const char *b_name, int64_t br, int64_t bc) {
    st_writer *w = st_writer_new();
    float *a = rnd((size_t)(ar * ac), 0.1f), *b = rnd((size_t)(br * bc), 0.1f);
    if (a_name) add(w, a_name, ar, ac, a);
    if (b_name) add(w, b_name, br, bc, b);
    st_writer_save(w, path);
    st_writer_free(w);
    free(a);
    free(b);
}

/* ---- synth --lora's adapters: the key forms the reference's converters take, one update in three layouts ---- */

/* The modules of the fixture geometry (1 double block, 2 single blocks) that every layout carries: BFL name, its
 * diffusers modules (fused q|k|v: three), rows, inputs. With modulation, the last four too. */
static const struct { const char *bfl, *diff[3]; int64_t out, in; } synth_mods[] = {
    {"img_in", {"x_embedder"}, D, IN},
    {"txt_in", {"context_embedder"}, D, 96},
    {"time_in.in_layer", {"time_guidance_embed.timestep_embedder.linear_1"}, D, 256},
    {"time_in.out_layer", {"time_guidance_embed.timestep_embedder.linear_2"}, D, D},
    {"final_layer.linear", {"proj_out"}, IN, D},
    {"double_blocks.0.img_attn.qkv", {"transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k",
                                      "transformer_blocks.0.attn.to_v"}, 3 * D, D},
    {"double_blocks.0.img_attn.proj", {"transformer_blocks.0.attn.to_out.0"}, D, D},
    {"double_blocks.0.img_mlp.0", {"transformer_blocks.0.ff.linear_in"}, 2 * F, D},
    {"double_blocks.0.img_mlp.2", {"transformer_blocks.0.ff.linear_out"}, D, F},
    {"double_blocks.0.txt_attn.qkv", {"transformer_blocks.0.attn.add_q_proj", "transformer_blocks.0.attn.add_k_proj",
                                      "transformer_blocks.0.attn.add_v_proj"}, 3 * D, D},
    {"double_blocks.0.txt_attn.proj", {"transformer_blocks.0.attn.to_add_out"}, D, D},
    {"double_blocks.0.txt_mlp.0", {"transformer_blocks.0.ff_context.linear_in"}, 2 * F, D},
    {"double_blocks.0.txt_mlp.2", {"transformer_blocks.0.ff_context.linear_out"}, D, F},
    {"single_blocks.0.linear1", {"single_transformer_blocks.0.attn.to_qkv_mlp_proj"}, 3 * D + 2 * F, D},
    {"single_blocks.0.linear2", {"single_transformer_blocks.0.attn.to_out"}, D, D + F},
    {"single_blocks.1.linear1", {"single_transformer_blocks.1.attn.to_qkv_mlp_proj"}, 3 * D + 2 * F, D},
    {"single_blocks.1.linear2", {"single_transformer_blocks.1.attn.to_out"}, D, D + F},
    {"double_stream_modulation_img.lin", {"double_stream_modulation_img.linear"}, 6 * D, D},
    {"double_stream_modulation_txt.lin", {"double_stream_modulation_txt.linear"}, 6 * D, D},
    {"single_stream_modulation.lin", {"single_stream_modulation.linear"}, 3 * D, D},
    {"final_layer.adaLN_modulation.1", {"norm_out.linear"}, 2 * D, D},
};
enum { SYNTH_PLAIN = 17, SYNTH_ALL = 21, SYNTH_R = 6 };

/* tensor NAME of f with shape [r0, r1] (r1 < 0: a scalar), or NULL after a failed check */
static const st_tensor *want(const char *test, st_file *f, const char *name, int64_t r0, int64_t r1, int *bad) {
    const st_tensor *t = st_find(f, name);
    int ok = t && (r1 < 0 ? t->numel == 1 : t->ndim == 2 && t->shape[0] == r0 && t->shape[1] == r1);
    if (!ok && !*bad) T_FAIL(test, "tensor '%s' %s", name, t ? "has the wrong shape" : "missing");
    *bad |= !ok;
    return ok ? t : NULL;
}

/* value i of a bf16/f32 tensor */
static float tval(const st_tensor *t, int64_t i) {
    if (t->dtype == DT_F32) { float v; memcpy(&v, (const char *)t->data + 4 * i, 4); return v; }
    uint16_t h;
    memcpy(&h, (const char *)t->data + 2 * i, 2);
    return dt_bf16_to_f32(h);
}

static void synth_layouts(void) {
    flux2_config c;
    flux2_preset("tiny", &c);   /* the fixture's geometry */
    const char *names[3] = {"diffusers", "kohya", "bfl"};
    char path[2][3][600];
    for (int mod = 0; mod < 2; mod++)
        for (int l = 0; l < 3; l++) {
            snprintf(path[mod][l], sizeof path[mod][l], "%s/synth-%s%s.safetensors", tmp, names[l], mod ? "-mod" : "");
            flux2_synth_lora_opts o = {SYNTH_R, 11, (flux2_lora_layout)l, mod};
            if (flux2_synth_lora(&c, path[mod][l], &o)) { T_FAIL("synth_lora_write", "%s", dt_last_error()); return; }
        }
    flux2_lora_layout lay;
    T_CHECK("synth_lora_layout_names", !flux2_lora_layout_parse("kohya", &lay) && lay == FLUX2_LORA_KOHYA &&
            flux2_lora_layout_parse("peft", &lay) == -1 && strstr(dt_last_error(), "diffusers, kohya or bfl"), "%s",
            dt_last_error());
    flux2_synth_lora_opts bad = {0, 1, FLUX2_LORA_DIFFUSERS, 0};
    T_CHECK("synth_lora_rank_0_refused", flux2_synth_lora(&c, tpath("r0.safetensors"), &bad) == -1 &&
            strstr(dt_last_error(), "rank 0") && access(tpath("r0.safetensors"), F_OK) != 0, "%s", dt_last_error());
    for (int mod = 0; mod < 2; mod++) {
        const int nm = mod ? SYNTH_ALL : SYNTH_PLAIN;
        st_file *fd = st_open(path[mod][0]), *fk = st_open(path[mod][1]), *fb = st_open(path[mod][2]);
        if (!fd || !fk || !fb) { T_FAIL("synth_lora_open", "%s", dt_last_error()); st_close(fd); st_close(fk); st_close(fb); return; }
        char test[3][96], nm1[300], nm2[300], u[128];
        for (int l = 0; l < 3; l++) snprintf(test[l], sizeof test[l], "synth_lora_%s%s_keys", names[l], mod ? "_modulation" : "");
        int bad_d = 0, bad_k = 0, bad_b = 0, bad_same = 0, nd = 0;
        for (int k = 0; k < nm; k++) {
            int64_t out = synth_mods[k].out, in = synth_mods[k].in;
            size_t j = 0;
            for (; synth_mods[k].bfl[j]; j++) u[j] = synth_mods[k].bfl[j] == '.' ? '_' : synth_mods[k].bfl[j];
            u[j] = 0;
            /* kohya: what _convert_kohya_flux2_lora_to_diffusers looks up (alpha r/2: its scale, folded into A) */
            snprintf(nm1, sizeof nm1, "lora_unet_%s.lora_down.weight", u);
            const st_tensor *ka = want(test[1], fk, nm1, SYNTH_R, in, &bad_k);
            snprintf(nm1, sizeof nm1, "lora_unet_%s.lora_up.weight", u);
            const st_tensor *kb = want(test[1], fk, nm1, out, SYNTH_R, &bad_k);
            snprintf(nm1, sizeof nm1, "lora_unet_%s.alpha", u);
            const st_tensor *kal = want(test[1], fk, nm1, 1, -1, &bad_k);
            if (kal && tval(kal, 0) != SYNTH_R / 2.0f && !bad_k) { T_FAIL(test[1], "%s = %g, want %g", nm1, tval(kal, 0), SYNTH_R / 2.0); bad_k = 1; }
            /* BFL: what _convert_non_diffusers_flux2_lora_to_diffusers maps (diffusion_model. prefix, lora_A/lora_B) */
            snprintf(nm1, sizeof nm1, "diffusion_model.%s.lora_A.weight", synth_mods[k].bfl);
            const st_tensor *ba = want(test[2], fb, nm1, SYNTH_R, in, &bad_b);
            snprintf(nm1, sizeof nm1, "diffusion_model.%s.lora_B.weight", synth_mods[k].bfl);
            const st_tensor *bb = want(test[2], fb, nm1, out, SYNTH_R, &bad_b);
            /* diffusers: one module per diffusers Linear; a fused q|k|v's parts share A and take B's thirds */
            int parts = synth_mods[k].diff[1] ? 3 : 1;
            for (int p = 0; p < parts; p++) {
                snprintf(nm1, sizeof nm1, "transformer.%s.lora_A.weight", synth_mods[k].diff[p]);
                snprintf(nm2, sizeof nm2, "transformer.%s.lora_B.weight", synth_mods[k].diff[p]);
                const st_tensor *da = want(test[0], fd, nm1, SYNTH_R, in, &bad_d), *db = want(test[0], fd, nm2, out / parts, SYNTH_R, &bad_d);
                nd += 2;
                if (!da || !db || !ka || !kb || !ba || !bb) continue;
                /* one update: A equal everywhere; B rows (BFL order) = kohya up = 2 x BFL B (alpha / r folded) */
                for (int64_t i = 0; i < SYNTH_R * in; i++)
                    bad_same |= tval(da, i) != tval(ka, i) || tval(ba, i) != tval(ka, i);
                for (int64_t row = 0; row < out / parts; row++) {
                    int64_t br = p * (out / parts) + row;   /* BFL row of this diffusers row */
                    if (!strcmp(synth_mods[k].bfl, "final_layer.adaLN_modulation.1")) br = (row + out / 2) % out;
                    for (int r = 0; r < SYNTH_R; r++)
                        bad_same |= tval(db, row * SYNTH_R + r) != tval(kb, br * SYNTH_R + r) ||
                                    tval(bb, br * SYNTH_R + r) != 0.5f * tval(kb, br * SYNTH_R + r);
                }
            }
        }
        T_CHECK(test[1], !bad_k && st_count(fk) == (size_t)(3 * nm), "%zu tensors, want %d", st_count(fk), 3 * nm);
        T_CHECK(test[2], !bad_b && st_count(fb) == (size_t)(2 * nm), "%zu tensors, want %d", st_count(fb), 2 * nm);
        /* diffusers: the metadata PEFT's LoraConfig is built from: rank, alpha, every module of the keys */
        const char *ms = st_metadata(fd, "lora_adapter_metadata");
        json *meta = ms ? json_parse(ms, strlen(ms), "lora_adapter_metadata") : NULL;
        const json *tm = meta ? json_get(meta, "transformer.target_modules") : NULL;
        int tm_ok = tm && tm->type == JSON_ARRAY && (int)tm->len * 2 == nd;
        for (size_t i = 0; tm_ok && i < tm->len; i++) {
            snprintf(nm1, sizeof nm1, "transformer.%s.lora_A.weight", tm->items[i]->str ? tm->items[i]->str : "");
            tm_ok = st_find(fd, nm1) != NULL;
        }
        T_CHECK(test[0], !bad_d && st_count(fd) == (size_t)nd && meta && json_get_num(meta, "transformer.r", 0) == SYNTH_R &&
                json_get_num(meta, "transformer.lora_alpha", 0) == SYNTH_R / 2.0 && tm_ok,
                "%zu tensors (want %d), metadata %s", st_count(fd), nd, ms ? ms : "(none)");
        json_free(meta);
        char same[96];
        snprintf(same, sizeof same, "synth_lora%s_layouts_hold_one_update", mod ? "_modulation" : "");
        T_CHECK(same, !bad_same && !bad_d && !bad_k && !bad_b, "A / B values differ between the layouts");
        st_close(fd); st_close(fk); st_close(fb);
        /* the same forward from each layout (bit-identical merged weights: exact power-of-two scales) */
        size_t n = 0;
        float *base = fwd(fixture_model, NULL, 0, 0, &n);
        float *o[3] = {NULL, NULL, NULL};
        for (int l = 0; l < 3; l++) o[l] = fwd(fixture_model, path[mod][l], 1, 0, &n);
        snprintf(same, sizeof same, "synth_lora%s_kohya_forward_equals_diffusers", mod ? "_modulation" : "");
        cmp(same, o[1], o[0], n, SAME_UPDATE_TOL);
        snprintf(same, sizeof same, "synth_lora%s_bfl_forward_equals_diffusers", mod ? "_modulation" : "");
        cmp(same, o[2], o[0], n, SAME_UPDATE_TOL);
        /* visible but sane: the update moves the forward clearly (measured 0.26 relative here), no blow-up */
        double e = base && o[0] ? dt_rel_l2(o[0], base, n) : -1;
        snprintf(same, sizeof same, "synth_lora%s_effect_visible_and_bounded", mod ? "_modulation" : "");
        T_CHECK(same, e > 0.02 && e < 0.5, "relative change of the forward %.3g (want 0.02..0.5)", e);
        free(base);
        for (int l = 0; l < 3; l++) free(o[l]);
    }
}

int main(void) {
    (void)fx_forward_check;   /* (shared header; this test compares forwards itself) */
    if (!mkdtemp(tmp)) { T_FAIL("lora_tmpdir", "mkdtemp"); return T_DONE(); }
    dt_log_level = 0;
    snprintf(fixture_model, sizeof fixture_model, "%s/model", t_fixtures());

    /* FILE[:SCALE] */
    {
        dt_lora_spec s;
        int ok = !dt_lora_spec_parse("a.safetensors", &s) && !strcmp(s.path, "a.safetensors") && s.scale == 1.0f &&
                 !dt_lora_spec_parse("dir:x/a.safetensors:0.75", &s) && !strcmp(s.path, "dir:x/a.safetensors") && s.scale == 0.75f &&
                 !dt_lora_spec_parse("c:/x", &s) && !strcmp(s.path, "c:/x") && s.scale == 1.0f &&
                 !dt_lora_spec_parse("b.safetensors:-1e0", &s) && s.scale == -1.0f && dt_lora_spec_parse(":0.5", &s) == -1 &&
                 dt_lora_spec_parse("x:inf", &s) == -1 && dt_lora_spec_parse("", &s) == -1;
        T_CHECK("lora_spec_parse", ok, "FILE[:SCALE] parsing");
    }
    for (int k = 0; k < NMOD; k++) {
        mods[k].A = rnd((size_t)(mods[k].r * mods[k].in), 1.0f / 16);
        mods[k].B = rnd((size_t)(mods[k].out * mods[k].r), 0.6f);
    }
    const char *fd = tpath("diffusers.safetensors"), *fk = tpath("kohya.safetensors"), *fb = tpath("bfl.safetensors");
    write_diffusers(fd);
    write_kohya(fk);
    write_bfl(fb);
    size_t n = 0;
    float *base = fwd(fixture_model, NULL, 0, 0, &n);
    float *od = fwd(fixture_model, fd, 1, 0, &n), *ok_ = fwd(fixture_model, fk, 1, 0, &n), *ob = fwd(fixture_model, fb, 1, 0, &n);
    if (!base || !od) { T_FAIL("lora_forward", "%s", dt_last_error()); return T_DONE(); }
    T_CHECK("lora_changes_the_output", dt_rel_l2(od, base, n) > 0.02, "adapter effect only %.3g", dt_rel_l2(od, base, n));
    cmp("lora_same_update_kohya_vs_diffusers", ok_, od, n, SAME_UPDATE_TOL);
    cmp("lora_same_update_bfl_vs_diffusers", ob, od, n, SAME_UPDATE_TOL);
    float *z = fwd(fixture_model, fk, 0, 0, &n);
    cmp("lora_scale0_is_base", z, base, n, 0);
    free(z);
    /* merged vs side product, per layout */
    const char *files[3] = {fd, fk, fb}, *lay[3] = {"diffusers", "kohya", "bfl"};
    float *merged[3] = {od, ok_, ob};
    for (int i = 0; i < 3; i++) {
        char nm[96];
        float *s = fwd(fixture_model, files[i], 1, 1, &n);
        snprintf(nm, sizeof nm, "lora_merged_vs_side_%s", lay[i]);
        cmp(nm, s, merged[i], n, MERGE_VS_SIDE_TOL);
        free(s);
    }
    /* independent merge: this test's own W + 0.5·B·A in bf16, one forward and a whole image */
    {
        const char *mp = tpath("merged");
        if (write_merged_pipeline(mp)) T_FAIL("lora_independent_merge_write", "%s", dt_last_error());
        float *ref = fwd(mp, NULL, 0, 0, &n);
        cmp("lora_merged_equals_independent_merge", od, ref, n, INDEPENDENT_MERGE_TOL);
        free(ref);
        dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){.rope_fp32 = 1});
        dt_gen_params g;
        dt_gen_params_default(&g);
        g.prompt = "a red fox in fresh snow";
        g.width = g.height = 64;
        g.seed = 3;
        g.max_seq_len = 32;
        dt_pipeline_opts lo;
        dt_pipeline_opts_default(&lo);
        lo.model = fixture_model;
        dt_lora_spec spec;
        dt_lora_spec_parse(fd, &spec);
        lo.loras = &spec;
        lo.n_loras = 1;
        uint8_t *img1 = NULL, *img2 = NULL, *img0 = NULL;
        int w1, h1, w2, h2, w0, h0;
        int r1 = dt_generate(be, &lo, &g, &img1, &w1, &h1, NULL, NULL, NULL);
        lo.model = mp;
        lo.loras = NULL;
        lo.n_loras = 0;
        int r2 = dt_generate(be, &lo, &g, &img2, &w2, &h2, NULL, NULL, NULL);
        lo.model = fixture_model;
        int r0 = dt_generate(be, &lo, &g, &img0, &w0, &h0, NULL, NULL, NULL);
        int maxd = 0, maxb = 0;
        for (int i = 0; !r1 && !r2 && !r0 && i < w1 * h1 * 3; i++) {
            int d = abs((int)img1[i] - (int)img2[i]), db = abs((int)img1[i] - (int)img0[i]);
            maxd = d > maxd ? d : maxd;
            maxb = db > maxb ? db : maxb;
        }
        /* pixels: the forwards above agree to INDEPENDENT_MERGE_TOL; through 4 steps and the VAE that moves a
         * pixel by at most one step of 255 */
        T_CHECK("lora_generate_equals_independent_merge", !r1 && !r2 && w1 == w2 && h1 == h2 && maxd <= 1 && maxb > 8,
                "rc %d/%d, max pixel difference %d (vs the model without adapter: %d)", r1, r2, maxd, maxb);
        free(img0);
        free(img1);
        free(img2);
        be->destroy(be);
    }
    /* quantized bases: side products == the same weights dense (F32) with the update merged */
    {
        static const struct { const char *name; const char *src; flux2_export_opts o; const char *ext; } q[] = {
            {"mlx_q4", "transformer-q4", {0}, NULL},
            {"gguf_q4_k", NULL, {1, DT_Q4_K, 1, 0}, "gguf"},
            {"fp8", NULL, {0, DT_F8_E4M3, 0, 0}, "safetensors"},
        };
        for (int i = 0; i < 3; i++) {
            char qm[700], nm[128];
            int written;
            if (q[i].src) snprintf(qm, sizeof qm, "%s/%s", t_fixtures(), q[i].src);
            else {
                snprintf(qm, sizeof qm, "%s/base-%s.%s", tmp, q[i].name, q[i].ext);
                if (flux2_export(fixture_model, qm, &q[i].o, &written)) { T_FAIL(q[i].name, "%s", dt_last_error()); continue; }
            }
            const char *dense = tpath("dense.gguf");
            flux2_export_opts f32 = {1, DT_F32, 1, 0};
            if (flux2_export(qm, dense, &f32, &written)) { T_FAIL(q[i].name, "%s", dt_last_error()); continue; }
            /* (side products everywhere: these files keep some Linears bf16, which would otherwise be merged) */
            float *qs = fwd(qm, files[i], 1, 1, &n), *dm = fwd(dense, files[i], 1, 0, &n), *qb = fwd(qm, NULL, 0, 0, &n);
            snprintf(nm, sizeof nm, "lora_side_on_%s_equals_dense_merged (%s layout)", q[i].name, lay[i]);
            cmp(nm, qs, dm, n, SIDE_EXACT_TOL);
            snprintf(nm, sizeof nm, "lora_side_on_%s_changes_the_output", q[i].name);
            T_CHECK(nm, qs && qb && dt_rel_l2(qs, qb, n) > 0.02, "adapter effect %.3g", qs && qb ? dt_rel_l2(qs, qb, n) : -1.0);
            free(qs);
            free(dm);
            free(qb);
        }
    }
    /* Krea 2: the checkpoint's own module names, diffusers and kohya spelling */
    {
        const char *dk = tpath("k2-diffusers.safetensors"), *kk = tpath("k2-kohya.safetensors");
        static const struct { const char *name; int64_t out, in; } km[] = {
            {"transformer_blocks.0.attn.to_q", 512, 512}, {"transformer_blocks.1.ff.down", 512, 512},
            {"text_fusion.refiner_blocks.0.attn.to_v", 32, 64}};
        st_writer *wd = st_writer_new(), *wk = st_writer_new();
        char nm[400], u[200];
        for (int i = 0; i < 3; i++) {
            float *a = rnd((size_t)(2 * km[i].in), 1.0f / 16), *b = rnd((size_t)(km[i].out * 2), 0.6f);
            snprintf(nm, sizeof nm, "transformer.%s.lora_A.weight", km[i].name); add(wd, nm, 2, km[i].in, a);
            snprintf(nm, sizeof nm, "transformer.%s.lora_B.weight", km[i].name); add(wd, nm, km[i].out, 2, b);
            size_t j = 0;
            for (; km[i].name[j]; j++) u[j] = km[i].name[j] == '.' ? '_' : km[i].name[j];
            u[j] = 0;
            snprintf(nm, sizeof nm, "lora_transformer_%s.lora_down.weight", u); add(wk, nm, 2, km[i].in, a);
            snprintf(nm, sizeof nm, "lora_transformer_%s.lora_up.weight", u); add(wk, nm, km[i].out, 2, b);
            free(a);
            free(b);
        }
        st_writer_save(wd, dk);
        st_writer_save(wk, kk);
        st_writer_free(wd);
        st_writer_free(wk);
        size_t kn = 0;
        float *k0 = k2fwd(NULL, 0, &kn), *kd = k2fwd(dk, 0, &kn), *kkk = k2fwd(kk, 0, &kn), *ks = k2fwd(dk, 1, &kn);
        T_CHECK("lora_krea2_changes_the_output", k0 && kd && dt_rel_l2(kd, k0, kn) > 0.01, "%s",
                k0 && kd ? "no effect" : dt_last_error());
        cmp("lora_krea2_kohya_vs_diffusers", kkk, kd, kn, SAME_UPDATE_TOL);
        cmp("lora_krea2_merged_vs_side", ks, kd, kn, MERGE_VS_SIDE_TOL);
        free(k0); free(kd); free(kkk); free(ks);
    }
    /* bad adapters */
    {
        const char *p = tpath("bad.safetensors");
        write_pair(p, "transformer.transformer_blocks.0.attn.to_zz.lora_A.weight", R, D,
                   "transformer.transformer_blocks.0.attn.to_zz.lora_B.weight", D, R);
        expect_load_error("lora_error_unmatched_module", p, "match no module", "to_zz.lora_A.weight");
        write_pair(p, "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", R, 32,
                   "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight", 64, R);
        expect_load_error("lora_error_text_encoder_keys", p, "match no module", "lora_te1_");
        write_pair(p, "transformer.x_embedder.lora_A.weight", R, IN, "transformer.x_embedder.lora_B.weight", D, R - 1);
        expect_load_error("lora_error_rank_mismatch", p, "rank mismatch", "x_embedder");
        write_pair(p, "transformer.x_embedder.lora_A.weight", R, IN + 1, "transformer.x_embedder.lora_B.weight", D, R);
        expect_load_error("lora_error_shape_mismatch", p, "shape mismatch", "x_embedder");
        write_pair(p, "transformer.x_embedder.lora_A.weight", R, IN, NULL, 0, 0);
        expect_load_error("lora_error_a_without_b", p, "but no lora_B", "x_embedder");
        write_pair(p, "transformer.x_embedder.lora_A.weight", R, IN, "transformer.x_embedder.dora_scale", 1, D);
        expect_load_error("lora_error_dora", p, "not a plain LoRA", "dora_scale");
        expect_load_error("lora_error_missing_file", tpath("nope.safetensors"), "nope.safetensors", NULL);
    }
    synth_layouts();
    for (int k = 0; k < NMOD; k++) { free(mods[k].A); free(mods[k].B); }
    free(base);
    free(od);
    free(ok_);
    free(ob);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
    return T_DONE();
}
