/* krea2_pipeline.c — the Krea 2 text-to-image pipeline (krea2_pipeline.h): component geometry checks,
 * prompt features (positive and, with guidance, negative), noise and p×p packing, the time-shifted
 * flow-matching schedule, the Euler loop with Krea 2's guidance convention, and the Qwen-Image VAE. */
#include "pipeline/krea2_pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/krea2.h"
#include "models/qwen3.h"
#include "models/vae_flux2.h"   /* dt_vae_postprocess: diffusers image post-processing */
#include "models/vae_qwenimage.h"
#include "pipeline/krea2_prompt.h"
#include "pipeline/latents.h"
#include "pipeline/scheduler.h"
#include "pipeline/tokenizer.h"

#define K2_DISTILLED_MU 1.15        /* the pipeline's fixed time shift for distilled checkpoints */
#define K2_DEFAULT_GUIDANCE 4.5f
#define K2_DEFAULT_STEPS 28
#define K2_DISTILLED_STEPS 8
/* The pipeline's taps when model_index.json has none (Qwen3-VL-4B, 36 layers). */
static const int k2_default_taps[] = {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35};

struct dt_krea2_pipe {
    dt_backend *be;
    char *root, *te_dir;
    int taps[DT_GEN_MAX_TAPS], n_taps, max_tap;
    int distilled, patch;
    int te_inv_freq_bf16, release_te;
    dt_tokenizer *tok;
    dt_sched_config sched;
    dt_qwen3_config tcfg;
    krea2_config dcfg;
    dt_qvae_config vcfg;
    dt_qwen3 *te;             /* loaded on first use */
    krea2_model *dit;
    dt_qvae *vae;
};

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = dt_malloc(n);
    snprintf(s, n, "%s/%s", a, b);
    return s;
}

int dt_krea2_is_pipeline(const char *root) {
    char *p = join(root, "model_index.json");
    struct stat st;
    int is = 0;
    if (stat(p, &st) == 0) {
        json *j = json_parse_file(p);
        const char *cls = j ? json_get_str(j, "_class_name") : NULL;
        is = cls && !strcmp(cls, "Krea2Pipeline");
        json_free(j);
    }
    dt_clear_error();
    free(p);
    return is;
}

static int read_index(dt_krea2_pipe *k, const char *path) {
    json *j = json_parse_file(path);
    if (!j) return -1;
    int rc = -1;
    k->distilled = json_get_bool(j, "is_distilled", 0);
    int64_t ps = json_get_int(j, "patch_size", 2);
    if (ps < 1 || ps > 16) { dt_set_error("%s: patch_size %lld outside 1..16", path, (long long)ps); goto out; }
    k->patch = (int)ps;
    if (k->n_taps == 0) {
        const json *t = json_get(j, "text_encoder_select_layers");
        if (t && t->type != JSON_NULL) {
            if (t->type != JSON_ARRAY || t->len < 1 || t->len > DT_GEN_MAX_TAPS) {
                dt_set_error("%s: text_encoder_select_layers must list 1..%d layer numbers", path, DT_GEN_MAX_TAPS);
                goto out;
            }
            for (size_t i = 0; i < t->len; i++) {
                const json *e = json_at(t, i);
                if (!e || e->type != JSON_NUMBER || !e->is_integer || e->integer < 0 || e->integer > 4096) {
                    dt_set_error("%s: text_encoder_select_layers[%zu] is not a layer number", path, i);
                    goto out;
                }
                k->taps[k->n_taps++] = (int)e->integer;
            }
        } else {
            k->n_taps = (int)(sizeof k2_default_taps / sizeof *k2_default_taps);
            memcpy(k->taps, k2_default_taps, sizeof k2_default_taps);
        }
    }
    rc = 0;
out:
    json_free(j);
    return rc;
}

static int read_dit_config(const char *root, krea2_config *c) {
    char *p = join(root, "transformer/config.json");
    json *j = json_parse_file(p);
    int rc = -1;
    if (j) {
        const char *cls = json_get_str(j, "_class_name");
        if (cls && strcmp(cls, "Krea2Transformer2DModel")) dt_set_error("%s: _class_name is '%s', expected Krea2Transformer2DModel", p, cls);
        else rc = krea2_config_parse(j, p, c);
    }
    json_free(j);
    free(p);
    return rc;
}

dt_krea2_pipe *dt_krea2_pipe_open(dt_backend *be, const char *root, const int *taps, int n_taps, int te_inv_freq_bf16) {
    dt_krea2_pipe *k = dt_calloc(1, sizeof *k);
    k->be = be;
    k->root = dt_strdup(root);
    k->te_dir = join(root, "text_encoder");
    k->te_inv_freq_bf16 = te_inv_freq_bf16;
    if (n_taps < 0 || n_taps > DT_GEN_MAX_TAPS) { dt_set_error("krea2: %d text-encoder taps (max %d)", n_taps, DT_GEN_MAX_TAPS); goto fail; }
    k->n_taps = n_taps;
    if (n_taps) memcpy(k->taps, taps, sizeof(int) * (size_t)n_taps);
    char *idx = join(root, "model_index.json"), *tokd = join(root, "tokenizer"), *sch = join(root, "scheduler");
    int rc = read_index(k, idx);
    if (rc == 0) rc = (k->tok = dt_tokenizer_load(tokd)) ? 0 : -1;
    if (rc == 0) rc = dt_sched_config_load(sch, &k->sched);
    free(idx);
    free(tokd);
    free(sch);
    if (rc) goto fail;
    if (dt_qwen3_read_config(k->te_dir, &k->tcfg) || read_dit_config(root, &k->dcfg) || dt_qvae_read_config(root, &k->vcfg))
        goto fail;
    for (int i = 0; i < k->n_taps; i++) {
        if (k->taps[i] < 0 || k->taps[i] > k->tcfg.num_layers) {
            dt_set_error("%s: text-encoder layer %d outside 0..%d", root, k->taps[i], k->tcfg.num_layers);
            goto fail;
        }
        if (k->taps[i] > k->max_tap) k->max_tap = k->taps[i];
    }
    if (k->n_taps != k->dcfg.text_layers || k->tcfg.hidden != k->dcfg.text_dim) {
        dt_set_error("%s: %d text-encoder taps of width %d, but the transformer reads num_text_layers %d of "
                     "text_hidden_dim %d", root, k->n_taps, k->tcfg.hidden, k->dcfg.text_layers, k->dcfg.text_dim);
        goto fail;
    }
    if (k->dcfg.in_channels != k->vcfg.z_dim * k->patch * k->patch) {
        dt_set_error("%s: transformer in_channels %d != VAE z_dim %d x patch_size %d^2", root, k->dcfg.in_channels,
                     k->vcfg.z_dim, k->patch);
        goto fail;
    }
    if (k->dcfg.n_axes != 3) {
        dt_set_error("%s: the Krea 2 pipeline builds 3 RoPE coordinates (t, h, w); the transformer has %d axes", root,
                     k->dcfg.n_axes);
        goto fail;
    }
    if (k->sched.use_dynamic_shifting && !k->distilled && k->sched.max_image_seq_len == k->sched.base_image_seq_len) {
        dt_set_error("%s: scheduler base_image_seq_len and max_image_seq_len are equal (no time shift line)", root);
        goto fail;
    }
    return k;
fail:
    dt_krea2_pipe_free(k);
    return NULL;
}

void dt_krea2_pipe_release_text_encoder(dt_krea2_pipe *k, int on) { k->release_te = on != 0; }

void dt_krea2_pipe_free(dt_krea2_pipe *k) {
    if (!k) return;
    if (k->tok) dt_tokenizer_free(k->tok);
    if (k->te) dt_qwen3_free(k->te);
    if (k->dit) krea2_free(k->dit);
    if (k->vae) dt_qvae_free(k->vae);
    free(k->root);
    free(k->te_dir);
    free(k);
}

static void observe(dt_gen_observer obs, void *ud, const char *name, const float *d, int ndim, int64_t d0, int64_t d1,
                    int64_t d2, int64_t d3) {
    if (!obs) return;
    int64_t shape[4] = {d0, d1, d2, d3};
    obs(ud, name, d, ndim, shape);
}

/* lat [z, h, w] -> tokens [(h/p)·(w/p), z·p·p]: token (r, c), feature ch·p² + dy·p + dx (diffusers _pack_latents) */
static void pack(const float *lat, int z, int h, int w, int p, float *tok) {
    const int gh = h / p, gw = w / p, F = z * p * p;
    for (int r = 0; r < gh; r++)
        for (int c = 0; c < gw; c++)
            for (int ch = 0; ch < z; ch++)
                for (int dy = 0; dy < p; dy++)
                    for (int dx = 0; dx < p; dx++)
                        tok[((size_t)r * gw + c) * F + (size_t)(ch * p + dy) * p + dx] =
                            lat[((size_t)ch * h + (size_t)(r * p + dy)) * w + (size_t)(c * p + dx)];
}

static void unpack(const float *tok, int z, int h, int w, int p, float *lat) {
    const int gh = h / p, gw = w / p, F = z * p * p;
    for (int r = 0; r < gh; r++)
        for (int c = 0; c < gw; c++)
            for (int ch = 0; ch < z; ch++)
                for (int dy = 0; dy < p; dy++)
                    for (int dx = 0; dx < p; dx++)
                        lat[((size_t)ch * h + (size_t)(r * p + dy)) * w + (size_t)(c * p + dx)] =
                            tok[((size_t)r * gw + c) * F + (size_t)(ch * p + dy) * p + dx];
}

static int read_noise(const char *file, int z, int h, int w, float *lat) {
    st_file *nf = st_open(file);
    if (!nf) return -1;
    const st_tensor *t = st_find(nf, "in.initial_latents");
    int ok = t && t->numel == (int64_t)z * h * w && (t->ndim != 4 || (t->shape[1] == z && t->shape[2] == h && t->shape[3] == w));
    if (!ok) {
        dt_set_error("%s: need in.initial_latents [1, %d, %d, %d] (the latent grid before packing) for this image size",
                     file, z, h, w);
        st_close(nf);
        return -1;
    }
    float *f = st_to_f32(t);
    memcpy(lat, f, sizeof(float) * (size_t)z * h * w);
    free(f);
    st_close(nf);
    return 0;
}

/* Prompt features with the text encoder loaded on demand. */
static int encode(dt_krea2_pipe *k, const char *prompt, int max_seq_len, float **emb, uint8_t **mask, int *T) {
    if (!k->te) {
        k->te = dt_qwen3_load(k->be, k->te_dir, k->max_tap > 0 ? k->max_tap : 1);
        if (!k->te) return -1;
        dt_qwen3_set_inv_freq_bf16(k->te, k->te_inv_freq_bf16);
    }
    return dt_krea2_encode_prompt(k->te, k->tok, prompt, max_seq_len, k->taps, k->n_taps, emb, mask, T);
}

int dt_krea2_pipe_generate(dt_krea2_pipe *k, const dt_gen_params *p, uint8_t **rgb_out, int *w_out, int *h_out,
                           dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
    dt_gen_timings tl;
    if (!tm) tm = &tl;
    memset(tm, 0, sizeof *tm);
    dt_backend *be = k->be;
    double t_start = dt_now(), t0 = t_start;
    int rc = -1;
    float *pos = NULL, *neg = NULL, *lat = NULL, *x = NULL, *v = NULL, *vneg = NULL, *ids = NULL, *sigmas = NULL,
          *timesteps = NULL, *img = NULL, *img01 = NULL;
    uint8_t *pmask = NULL, *nmask = NULL, *rgb = NULL;

    if (!p->prompt) { dt_set_error("generate: a prompt is required"); goto done; }
    const int steps = p->steps > 0 ? p->steps : k->distilled ? K2_DISTILLED_STEPS : K2_DEFAULT_STEPS;
    const float guidance = p->guidance >= 0 ? p->guidance : k->distilled ? 0.0f : K2_DEFAULT_GUIDANCE;
    const int cfg = guidance > 0.0f;
    if (steps > 1000) { dt_set_error("generate: --steps %d is too many (max 1000)", steps); goto done; }
    const int vsf = k->vcfg.scale_factor, P = k->patch, mult = vsf * P, z = k->vcfg.z_dim;
    if (p->height < 1 || p->width < 1 || p->height > 16384 || p->width > 16384) {
        dt_set_error("generate: image size %dx%d outside 1..16384", p->width, p->height);
        goto done;
    }
    const int H = (p->height + mult - 1) / mult * mult, W = (p->width + mult - 1) / mult * mult;
    if (H != p->height || W != p->width)
        dt_log(1, "ditrun: note: size %dx%d rounded up to %dx%d (multiples of %d)\n", p->width, p->height, W, H, mult);
    const int lh = H / vsf, lw = W / vsf, gh = lh / P, gw = lw / P, N = gh * gw, C = k->dcfg.in_channels;
    const int msl = p->max_seq_len > 0 ? p->max_seq_len : 512;
    tm->height = H;
    tm->width = W;
    tm->steps = steps;

    /* ---- text ---- */
    int T = 0, Tn = 0;
    dt_log(1, "ditrun: encoding the prompt (max %d tokens, %d taps)%s\n", msl, k->n_taps, cfg ? " and the negative prompt" : "");
    if (encode(k, p->prompt, msl, &pos, &pmask, &T)) goto done;
    observe(obs, ud, "prompt_embeds", pos, 4, 1, T, k->n_taps, k->tcfg.hidden);
    if (obs) {
        float *f = dt_malloc(sizeof(float) * (size_t)T);
        for (int i = 0; i < T; i++) f[i] = pmask[i];
        observe(obs, ud, "prompt_mask", f, 2, 1, T, 0, 0);
        free(f);
    }
    if (cfg && encode(k, p->negative_prompt ? p->negative_prompt : "", msl, &neg, &nmask, &Tn)) goto done;
    if (cfg && Tn != T) { dt_set_error("krea2: negative prompt has %d tokens, the prompt %d", Tn, T); goto done; }
    if (k->release_te) {
        dt_qwen3_free(k->te);
        k->te = NULL;
    }
    tm->t_encode = dt_now() - t0;
    t0 = dt_now();

    /* ---- transformer + VAE (kept loaded) ---- */
    if (!k->dit && !(k->dit = krea2_load(be, k->root))) goto done;
    if (!k->vae && !(k->vae = dt_qvae_load(be, k->root))) goto done;
    tm->t_load = dt_now() - t0;

    /* ---- noise [z, lh, lw] -> tokens [N, C]; position ids [T + N, 3] ---- */
    lat = dt_malloc(sizeof(float) * (size_t)z * lh * lw);
    if (p->noise_file) {
        if (read_noise(p->noise_file, z, lh, lw, lat)) goto done;
    } else {
        dt_latents_noise(p->seed, z, lh, lw, lat);
    }
    x = dt_malloc(sizeof(float) * (size_t)N * C);
    pack(lat, z, lh, lw, P, x);
    ids = dt_calloc((size_t)(T + N) * 3, sizeof(float));
    for (int r = 0; r < gh; r++)
        for (int c = 0; c < gw; c++) {
            float *q = ids + ((size_t)T + (size_t)r * gw + c) * 3;
            q[1] = (float)r;
            q[2] = (float)c;
        }

    /* ---- schedule ---- */
    const double mu = k->distilled ? K2_DISTILLED_MU : dt_calculate_shift(&k->sched, N);
    sigmas = dt_malloc(sizeof(float) * (size_t)(steps + 1));
    timesteps = dt_malloc(sizeof(float) * (size_t)steps);
    if (dt_schedule_make_mu(&k->sched, steps, mu, sigmas, timesteps)) goto done;
    observe(obs, ud, "sigmas", sigmas, 1, steps + 1, 0, 0, 0);
    observe(obs, ud, "timesteps", timesteps, 1, steps, 0, 0, 0);

    /* ---- denoising ---- */
    v = dt_malloc(sizeof(float) * (size_t)N * C);
    if (cfg) vneg = dt_malloc(sizeof(float) * (size_t)N * C);
    const int bf16 = be->act_dtype == DT_BF16;
    const float ntt = (float)k->sched.num_train_timesteps;
    double td = dt_now();
    for (int i = 0; i < steps; i++) {
        double ts0 = dt_now();
        /* the pipeline passes t / num_train_timesteps in the latents' dtype */
        float t_in = timesteps[i] / ntt;
        if (bf16) t_in = dt_bf16_round(t_in);
        if (krea2_forward(k->dit, x, N, pos, T, t_in, ids, pmask, v, NULL, NULL)) goto done;
        if (cfg) {
            if (krea2_forward(k->dit, x, N, neg, T, t_in, ids, nmask, vneg, NULL, NULL)) goto done;
            for (size_t e = 0; e < (size_t)N * C; e++) v[e] = v[e] + guidance * (v[e] - vneg[e]);
        }
        if (bf16) dt_euler_step_bf16(x, v, (size_t)N * C, sigmas[i], sigmas[i + 1]);
        else dt_euler_step(x, v, (size_t)N * C, sigmas[i], sigmas[i + 1]);
        double dt = dt_now() - ts0;
        if (i < 256) tm->t_step[i] = dt;
        char nm[48];
        snprintf(nm, sizeof nm, "step%d.latents_packed", i);
        observe(obs, ud, nm, x, 3, 1, N, C, 0);
        dt_log(1, "ditrun: step %d/%d  t=%.1f  %.3f s\n", i + 1, steps, timesteps[i], dt);
    }
    tm->t_denoise = dt_now() - td;

    /* ---- latents -> image ---- */
    double tdec = dt_now();
    unpack(x, z, lh, lw, P, lat);
    dt_qvae_denormalize(&k->vcfg, lat, (int64_t)lh * lw);
    observe(obs, ud, "latents_unpacked", lat, 4, 1, z, lh, lw);
    img = dt_malloc(sizeof(float) * 3 * (size_t)H * W);
    if (dt_qvae_decode(k->vae, lat, lh, lw, img)) goto done;
    img01 = dt_malloc(sizeof(float) * 3 * (size_t)H * W);
    rgb = dt_malloc(3 * (size_t)H * W);
    dt_vae_postprocess(img, H, W, img01, rgb);
    observe(obs, ud, "image_float", img01, 4, 1, H, W, 3);
    tm->t_decode = dt_now() - tdec;
    tm->t_total = dt_now() - t_start;
    dt_log(1, "ditrun: %dx%d, %d steps%s: load %.2f s, encode %.2f s, denoise %.2f s (%.3f s/step), decode %.2f s, "
           "total %.2f s\n", W, H, steps, cfg ? " with guidance" : "", tm->t_load, tm->t_encode, tm->t_denoise,
           tm->t_denoise / steps, tm->t_decode, tm->t_total);
    *rgb_out = rgb;
    rgb = NULL;
    *w_out = W;
    *h_out = H;
    rc = 0;
done:
    free(pos); free(neg); free(pmask); free(nmask); free(lat); free(x); free(v); free(vneg); free(ids);
    free(sigmas); free(timesteps); free(img); free(img01); free(rgb);
    return rc;
}

int dt_krea2_generate(dt_backend *be, const dt_gen_params *p, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                      dt_gen_observer obs, void *obs_ud) {
    double t0 = dt_now();
    dt_krea2_pipe *k = dt_krea2_pipe_open(be, p->model, p->taps, p->n_taps, p->te_inv_freq_bf16);
    if (!k) return -1;
    dt_krea2_pipe_release_text_encoder(k, 1);
    double t_open = dt_now() - t0;
    int rc = dt_krea2_pipe_generate(k, p, rgb, w, h, tm, obs, obs_ud);
    if (rc == 0 && tm) tm->t_load += t_open;
    dt_krea2_pipe_free(k);
    return rc;
}
