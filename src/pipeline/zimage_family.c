/* zimage_family.c — the Z-Image family of the engine (diffusers ZImagePipeline, ZImageImg2ImgPipeline,
 * ZImageInpaintPipeline): Qwen3 chat template -> hidden_states[-2] of the real tokens (zimage_prompt.h) -> noise
 * [C, H/s, W/s] (s = the VAE's scale factor) -> sigmas linspace(1, 1/n, n) through the scheduler's shift (mu from
 * the image token count when it shifts dynamically) -> flow-matching Euler loop (pipeline/sampler.h) whose velocity
 * is −(the transformer's output at t = (1000 − timestep)/1000), with classifier-free guidance whenever guidance > 0
 * shaped per step by cfg_truncation and cfg_normalization (zimage_guidance.h, as the sampler's guidance hooks: one
 * pass per guidance branch, so step caching keeps a state per branch as for the other families) -> latents / scaling
 * + shift -> the AutoencoderKL decoder -> 8-bit RGB.
 *
 * img2img (an init image, no mask): the image (sides floored to the size multiple, Lanczos-stretched when that
 * changes them) is encoded to a posterior *sample* (mean + std·eps, as retrieve_latents), scaled, and mixed with the
 * noise at the first kept step's sigma; the strength keeps the last floor-rule steps (dt_inpaint_steps).
 * Inpainting (with --mask): the same, and after every step the kept region (mask < 0.5 after Lanczos and
 * binarizing, nearest-sampled to the latent grid) is restored from the image latents re-noised at the next sigma
 * (the clean latents after the last step). The reference also encodes the masked image and never uses it: skipped.
 *
 * Draws: the noise is the request's (--noise: in.initial_latents [1, C, H/s, W/s]) or seeded; the posterior's eps is
 * the noise file's in.posterior_noise (same shape) when present, else seeded from seed ^ ZI_POSTERIOR_SEED.
 * Defaults: a Turbo checkpoint (model_index.json `is_distilled: true`, or "turbo" in the folder's path, as the
 * Tongyi-MAI/Z-Image-Turbo folders are named) runs 9 steps without guidance (its model card); otherwise the
 * pipeline's 50 steps and guidance 5. The request runs on the generate skeleton (generate_run.h). Observed:
 * prompt_embeds [1, T, D], sigmas, timesteps, stepK.latents_packed [1, C, h·w] (the latent grid itself: Z-Image
 * patchifies inside the model), latents_unpacked [1, C, h, w], image_float, cache_computed [steps, 2]. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/edit_prep.h"
#include "image/image_resample.h"
#include "io/safetensors.h"
#include "models/qwen3.h"
#include "models/vae_kl.h"
#include "models/zimage_dit.h"
#include "pipeline/family.h"
#include "pipeline/generate_run.h"
#include "pipeline/inpaint.h"
#include "pipeline/latents.h"
#include "pipeline/sampler.h"
#include "pipeline/scheduler.h"
#include "pipeline/zimage_guidance.h"
#include "pipeline/zimage_prompt.h"
#include "text/tokenizer.h"

static const char *const zi_pipelines[] = {"ZImagePipeline", "ZImageImg2ImgPipeline", "ZImageInpaintPipeline", NULL};
static const char *const zi_transformers[] = {"ZImageTransformer2DModel", NULL};
static const char *const zi_presets[] = {"z-image-turbo", "z-image-tiny", NULL};

#define ZI_DEFAULT_STEPS 50          /* ZImagePipeline's defaults */
#define ZI_DEFAULT_GUIDANCE 5.0f
#define ZI_TURBO_STEPS 9             /* Z-Image-Turbo's model card */
#define ZI_POSTERIOR_SEED 0x5eedface0b57e41ULL   /* the posterior draw's seed: seed ^ this */

typedef struct {
    char *te_dir;
    int distilled, max_tap;
    dt_tokenizer *tok;
    dt_sched_config sched;
    dt_qwen3_config tcfg;
    zimage_config dcfg;
    dt_vae_config vcfg;
    dt_qwen3 *te;             /* NULL between prompts with release_text_encoder */
    dt_dit *dit;              /* NULL until first needed with release_text_encoder */
    dt_vae *vae;
} zi_state;

static void zi_free(dt_pipeline *p) {
    zi_state *z = p->fam;
    if (!z) return;
    if (z->tok) dt_tokenizer_free(z->tok);
    if (z->te) dt_qwen3_free(z->te);
    dt_dit_free(z->dit);
    if (z->vae) dt_vae_free(z->vae);
    free(z->te_dir);
    free(z);
    p->fam = NULL;
}

static int ensure_te(dt_pipeline *p) {
    zi_state *z = p->fam;
    return dt_family_ensure_text_encoder(p, z->te_dir, z->max_tap, &z->te);
}

static int ensure_dit_vae(dt_pipeline *p) {
    zi_state *z = p->fam;
    const dt_dit_load_opts lo = dt_family_dit_opts(p);
    if (!z->dit && !(z->dit = zimage_dit_load(p->be, p->root, &lo))) return -1;
    if (!z->vae && (!(z->vae = dt_vae_kl_load(p->be, p->root)) ||
                    dt_vae_set_tiling(z->vae, p->opts.vae_tiling, p->opts.vae_tile)))
        return -1;
    return 0;
}

/* A Turbo checkpoint: is_distilled in model_index.json, else "turbo" (any case) in the folder's path. */
static int is_turbo(const json *idx, const char *root) {
    const json *d = json_get(idx, "is_distilled");
    if (d && d->type == JSON_BOOL) return d->boolean;
    for (const char *s = root; *s; s++)
        if (!strncasecmp(s, "turbo", 5)) return 1;
    return 0;
}

static int zi_load(dt_pipeline *p, const json *idx) {
    zi_state *z = dt_calloc(1, sizeof *z);
    p->fam = z;
    const char *root = p->root;
    char *tokd = dt_path_join(root, "tokenizer"), *sch = dt_path_join(root, "scheduler");
    char *vaed = dt_path_join(root, "vae");
    z->te_dir = dt_path_join(root, "text_encoder");
    int rc = -1;
    if (p->opts.n_taps) {
        dt_set_error("%s: Z-Image takes the text encoder's hidden_states[-2]; --taps does not apply", root);
        goto out;
    }
    if (!(z->tok = dt_tokenizer_load(tokd)) || dt_sched_config_load(sch, &z->sched)) goto out;
    if (dt_qwen3_read_config(z->te_dir, &z->tcfg) || zimage_config_read(root, &z->dcfg) ||
        dt_vae_kl_read_config(vaed, &z->vcfg))
        goto out;
    if (z->tcfg.num_layers < 2) {
        dt_set_error("%s/config.json: the text encoder has %d layers; Z-Image reads hidden_states[-2] (at least 2)",
                     z->te_dir, z->tcfg.num_layers);
        goto out;
    }
    z->max_tap = zimage_prompt_tap(z->tcfg.num_layers);   /* the last layer is never needed */
    if (z->tcfg.hidden != z->dcfg.cap_dim) {
        dt_set_error("%s/config.json: hidden_size %d != %s/transformer/config.json: cap_feat_dim %d (the caption "
                     "features are the text encoder's hidden states)", z->te_dir, z->tcfg.hidden, root, z->dcfg.cap_dim);
        goto out;
    }
    if (z->dcfg.in_channels != z->vcfg.latent_channels) {
        dt_set_error("%s/transformer/config.json: in_channels %d != %s/config.json: latent_channels %d", root,
                     z->dcfg.in_channels, vaed, z->vcfg.latent_channels);
        goto out;
    }
    if (z->sched.use_dynamic_shifting && z->sched.max_image_seq_len == z->sched.base_image_seq_len) {
        dt_set_error("%s: scheduler base_image_seq_len and max_image_seq_len are equal (no time shift line)", root);
        goto out;
    }
    if (!p->opts.release_text_encoder && (ensure_te(p) || ensure_dit_vae(p))) goto out;
    z->distilled = is_turbo(idx, root);
    p->info.distilled = z->distilled;
    p->info.default_steps = z->distilled ? ZI_TURBO_STEPS : ZI_DEFAULT_STEPS;
    p->info.default_guidance = z->distilled ? 0.0f : ZI_DEFAULT_GUIDANCE;
    p->info.size_multiple = z->vcfg.scale_factor * z->dcfg.patch;
    const int ax = z->dcfg.axes_len[1] < z->dcfg.axes_len[2] ? z->dcfg.axes_len[1] : z->dcfg.axes_len[2];
    p->info.max_side = ax * p->info.size_multiple > 16384 ? 16384 : ax * p->info.size_multiple;
    p->info.editing = 1;   /* img2img and inpainting (no reference images: refused in generate) */
    p->info.img2img = 1;
    p->info.cfg_shaping = 1;
    p->info.max_image_tokens = dt_calculate_shift_max_tokens(&z->sched);
    rc = 0;
out:
    free(tokd);
    free(sch);
    free(vaed);
    if (rc) zi_free(p);
    return rc;
}

/* What the sampling loop's model callback needs: the latents x [C, h, w] are the reference's (unpacked). */
typedef struct {
    dt_dit *dit;
    const zimage_config *c;
    const float *pos, *neg;           /* caption features [Tp, D], [Tn, D] (neg only with guidance) */
    int Tp, Tn, h, w;
    const float *timesteps;
    float guidance, cfg_norm, cfg_trunc;
    float *tok_in, *tok_out;          /* [N, p²C] each */
    size_t n;
    int cfg_steps;                    /* steps that ran the negative prompt */
    /* inpainting (mask NULL otherwise): image latents, noise [C, h, w], mask [h, w] (1 = repaint), sigmas */
    const float *init, *noise, *mask, *sigmas;
    int last;                         /* schedule index of the last step */
} zi_ctx;

/* v [C·h·w] = pass `pass`'s velocity at step i: −(the transformer's prediction for the prompt (0) or the negative
 * prompt (1)), with the pass's First Block Cache state (NULL: every block). The guidance combines the two in the
 * sampler (zi_combine); negating first changes no bit (rounding is symmetric, the norms' ratio is unchanged). */
static int zi_predict(void *ctx, int i, const float *x, int pass, float *v, dt_fbc_branch *fbc) {
    zi_ctx *c = ctx;
    const float t = (1000.0f - c->timesteps[i]) / 1000.0f;   /* f32, as the reference's tensor arithmetic */
    const int gh = c->h / c->c->patch, gw = c->w / c->c->patch;
    zimage_patchify(c->c, x, c->h, c->w, c->tok_in);
    dt_dit_step st = {.img = c->tok_in, .n_img = gh * gw, .txt = pass ? c->neg : c->pos, .n_txt = pass ? c->Tn : c->Tp,
                      .text = -1, .timestep = t, .grid_h = gh, .grid_w = gw, .out = c->tok_out, .fbc = fbc};
    if (dt_dit_forward(c->dit, &st)) return -1;
    zimage_unpatchify(c->c, c->tok_out, c->h, c->w, v);
    for (size_t k = 0; k < c->n; k++) v[k] = -v[k];
    return 0;
}

/* The sampler's guidance hooks: step i's scale (0 once cfg_truncation turns it off: pass 0 only) and the
 * combination with cfg_normalization over the whole prediction (zimage_guidance.h). */
static float zi_step_guidance(void *ctx, int i) {
    const zi_ctx *c = ctx;
    return zimage_step_guidance(c->guidance, c->cfg_trunc, c->timesteps[i]);
}

static void zi_combine(void *ctx, int i, float g, float *v, const float *u, size_t n) {
    zi_ctx *c = ctx;
    (void)i;
    zimage_cfg_combine(v, u, n, g, c->cfg_norm, v);
    c->cfg_steps++;
}

/* Inpainting after step i: x = (1 − m)·init' + m·x, init' the image latents re-noised at sigma[i + 1] (the clean
 * latents after the last step), m per latent pixel over every channel (float32 as the reference). */
static void zi_restore(void *ctx, int i, float *x) {
    zi_ctx *c = ctx;
    const size_t hw = (size_t)c->h * c->w, C = c->n / hw;
    const float s = c->sigmas[i + 1];
    for (size_t ch = 0; ch < C; ch++)
        for (size_t k = 0; k < hw; k++) {
            const size_t j = ch * hw + k;
            const float init = i == c->last ? c->init[j] : s * c->noise[j] + (1.0f - s) * c->init[j];
            const float m = c->mask[k];
            x[j] = (1.0f - m) * init + m * x[j];
        }
}

/* The init image as the reference's image processor prepares it: sides floored to `mult`, Lanczos-stretched when
 * that changes them, RGB in [−1, 1]. 0 or -1. */
static int prep_init(const dt_image *im, const char *name, int mult, dt_prep_image *out) {
    memset(out, 0, sizeof *out);
    const int w = im->w / mult * mult, h = im->h / mult * mult;
    if (w < mult || h < mult) {
        dt_set_error("%s: init image of %dx%d is too small (at least %d pixels per side)", name, im->w, im->h, mult);
        return -1;
    }
    dt_image fit = {0};
    if (dt_image_resize(im, w, h, &fit)) return -1;
    uint8_t *rgb = dt_image_to_rgb(&fit);
    dt_image_free(&fit);
    out->w = w;
    out->h = h;
    out->rgb = dt_malloc(sizeof(float) * 3 * (size_t)w * h);
    dt_prep_normalize(rgb, w, h, out->rgb);
    free(rgb);
    return 0;
}

/* The posterior's eps [n]: the noise file's in.posterior_noise, else seeded. 0 or -1. */
static int posterior_noise(const dt_gen_params *g, float *eps, int C, int h, int w) {
    const int64_t n = (int64_t)C * h * w;
    if (g->noise_file) {
        st_file *f = st_open(g->noise_file);
        if (!f) return -1;
        const st_tensor *t = st_find(f, "in.posterior_noise");
        int rc = 0;
        if (t && t->numel != n) {
            dt_set_error("%s: in.posterior_noise has %lld values, the init image's latents %lld ([1, %d, %d, %d])",
                         g->noise_file, (long long)t->numel, (long long)n, C, h, w);
            rc = -1;
        } else if (t) {
            float *v = st_to_f32(t);
            memcpy(eps, v, sizeof(float) * (size_t)n);
            free(v);
        }
        st_close(f);
        if (rc || t) return rc;
    }
    dt_latents_noise(g->seed ^ ZI_POSTERIOR_SEED, C, h, w, eps);
    return 0;
}

/* ---- one request on the generate skeleton (pipeline/generate_run.h) ---- */

/* A request's state (the hooks' ctx). The sampled latents x are the reference's own [C, h, w] (Z-Image patchifies
 * inside the model): the skeleton's tokens are N = C rows of h·w values. */
typedef struct {
    int guided;                       /* guidance > 0: the negative prompt too (a second sampler pass) */
    int h, w;                         /* latent grid */
    float *pos, *neg;                 /* caption features [Tp, D], [Tn, D] */
    int Tp, Tn;
    dt_prep_image prep;               /* the init image (img2img, inpainting) */
    float *m01, *mlat, *mask;         /* the mask at the image's size, at the packed grid (unused), at the latent grid */
    float *noise, *init, *eps;        /* [C·h·w] each (with an init image) */
    float *tok_in, *tok_out;          /* the callback's scratch */
    zi_ctx zc;
} zi_request;

static int zi_prepare(void *ctx, dt_gen_run *r) {
    zi_request *q = ctx;
    const dt_gen_params *g = r->g;
    if (g->n_refs) { dt_set_error("zimage: Z-Image takes no reference images (img2img and inpainting: --init-image)"); return -1; }
    q->guided = g->guidance > 0.0f;
    r->cfg = q->guided;   /* two sampler passes; the family's guidance hooks combine them (zi_combine) */
    if (!g->init_image) return 0;
    double ti = dt_now();
    const int mult = r->p->info.size_multiple;
    if (prep_init(g->init_image, g->init_name ? g->init_name : "init image", mult, &q->prep)) return -1;
    if (g->mask && dt_prep_mask(g->mask, g->mask_name ? g->mask_name : "mask", g->init_image->w, g->init_image->h,
                                q->prep.w, q->prep.h, mult, &q->m01, &q->mlat))
        return -1;
    r->tm->t_images += dt_now() - ti;
    return 0;
}

static int zi_load_text(void *ctx, dt_gen_run *r) { (void)ctx; return ensure_te(r->p); }

static int zi_encode(void *ctx, dt_gen_run *r) {
    zi_request *q = ctx;
    zi_state *z = r->p->fam;
    const dt_gen_params *g = r->g;
    const int tap = z->max_tap;
    dt_gen_log_encoding(g, g->max_seq_len, &tap, 1, q->guided, "");
    if (zimage_encode_prompt(z->te, z->tok, g->prompt, g->max_seq_len, &q->pos, &q->Tp)) return -1;
    dt_gen_observe(r->obs, r->ud, "prompt_embeds", q->pos, 3, 1, q->Tp, z->tcfg.hidden, 0);
    if (q->guided && zimage_encode_prompt(z->te, z->tok, g->negative_prompt, g->max_seq_len, &q->neg, &q->Tn))
        return -1;
    dt_family_release_text_encoder(r->p, &z->te);
    return 0;
}

static int zi_load_models(void *ctx, dt_gen_run *r) {
    (void)ctx;
    zi_state *z = r->p->fam;
    if (ensure_dit_vae(r->p)) return -1;
    r->dit = z->dit;
    return 0;
}

static int zi_geometry(void *ctx, dt_gen_run *r) {
    zi_request *q = ctx;
    zi_state *z = r->p->fam;
    const int vsf = z->vcfg.scale_factor, C = z->dcfg.in_channels;
    r->H = r->g->init_image ? q->prep.h : r->g->height;   /* the init image sets the size */
    r->W = r->g->init_image ? q->prep.w : r->g->width;
    q->h = r->H / vsf;
    q->w = r->W / vsf;
    r->nc = C;
    r->nh = q->h;
    r->nw = q->w;
    r->N = C;
    r->C = q->h * q->w;
    snprintf(r->layout, sizeof r->layout, "[1, %d, %d, %d], the latents for a %dx%d image%s", C, q->h, q->w, r->W,
             r->H, r->g->init_image ? " (the noise before it is mixed with the init image)" : "");
    return 0;
}

static void zi_pack(void *ctx, dt_gen_run *r, const float *noise, float *x) {
    (void)ctx;
    memcpy(x, noise, sizeof(float) * (size_t)r->N * r->C);   /* the latent grid as it is */
}

/* linspace(1, 1/n, n) shifted (get_default_z_image_sigmas), mu from the image token count */
static int zi_schedule(void *ctx, dt_gen_run *r, float *sigmas, float *timesteps) {
    zi_request *q = ctx;
    zi_state *z = r->p->fam;
    const int64_t seq = (int64_t)(q->h / z->dcfg.patch) * (q->w / z->dcfg.patch);
    return dt_schedule_make_mu(&z->sched, r->g->steps, dt_calculate_shift(&z->sched, seq), sigmas, timesteps);
}

static int zi_sampler(void *ctx, dt_gen_run *r, float *x, dt_sampler *sm) {
    zi_request *q = ctx;
    zi_state *z = r->p->fam;
    const dt_gen_params *g = r->g;
    const int C = z->dcfg.in_channels, vsf = z->vcfg.scale_factor;
    const size_t n = (size_t)C * q->h * q->w;
    const int64_t N = (int64_t)(q->h / z->dcfg.patch) * (q->w / z->dcfg.patch);
    if (g->init_image) {   /* img2img / inpainting: the kept steps, the image latents mixed in at the first one */
        int first, n_run;
        if (dt_inpaint_steps(g->steps, g->strength, &first, &n_run)) return -1;
        sm->first = first;
        sm->steps = n_run;
        r->tm->steps = n_run;
        double ti = dt_now();
        q->eps = dt_malloc(sizeof(float) * n);
        q->init = dt_malloc(sizeof(float) * n);
        q->noise = dt_malloc(sizeof(float) * n);
        memcpy(q->noise, x, sizeof(float) * n);
        if (posterior_noise(g, q->eps, C, q->h, q->w) ||
            dt_vae_kl_encode_sample(z->vae, q->prep.rgb, r->H, r->W, q->eps, q->init))
            return -1;
        r->tm->t_images += dt_now() - ti;
        dt_scale_noise(x, q->init, q->noise, n, sm->sigmas[first]);
        if (q->mlat) {   /* the binarized mask nearest-sampled to the latent grid (F.interpolate mode="nearest") */
            q->mask = dt_malloc(sizeof(float) * (size_t)q->h * q->w);
            for (int rr = 0; rr < q->h; rr++)
                for (int c = 0; c < q->w; c++)
                    q->mask[(size_t)rr * q->w + c] = q->m01[(size_t)rr * vsf * r->W + (size_t)c * vsf];
        }
    }
    q->tok_in = dt_malloc(sizeof(float) * (size_t)N * z->dcfg.patch_channels);
    q->tok_out = dt_malloc(sizeof(float) * (size_t)N * z->dcfg.patch_channels);
    q->zc = (zi_ctx){.dit = z->dit, .c = &z->dcfg, .pos = q->pos, .neg = q->neg, .Tp = q->Tp, .Tn = q->Tn, .h = q->h,
                     .w = q->w, .timesteps = sm->timesteps, .guidance = g->guidance, .cfg_norm = g->cfg_normalization,
                     .cfg_trunc = g->cfg_truncation, .tok_in = q->tok_in, .tok_out = q->tok_out, .n = n,
                     .init = q->init, .noise = q->noise, .mask = q->mask, .sigmas = sm->sigmas, .last = g->steps - 1};
    sm->predict = zi_predict;
    sm->step_guidance = zi_step_guidance;
    sm->combine = zi_combine;
    sm->after_step = q->mask ? zi_restore : NULL;
    sm->ctx = &q->zc;
    return 0;
}

static void zi_sampled(void *ctx, dt_gen_run *r, int rc) {
    zi_request *q = ctx;
    if (rc == 0 && q->guided)
        dt_log(2, "ditrun: zimage: %d of %d steps ran with guidance\n", q->zc.cfg_steps, r->tm->steps);
}

static int zi_decode(void *ctx, dt_gen_run *r, const float *x, float *img, uint8_t *rgb) {
    zi_request *q = ctx;
    zi_state *z = r->p->fam;
    dt_gen_observe(r->obs, r->ud, "latents_unpacked", x, 4, 1, z->dcfg.in_channels, q->h, q->w);
    return img ? dt_vae_kl_decode(z->vae, x, q->h, q->w, img) : dt_vae_kl_decode_rgb8(z->vae, x, q->h, q->w, rgb);
}

static void zi_finish(void *ctx, dt_gen_run *r, int rc) {
    zi_request *q = ctx;
    (void)r; (void)rc;
    free(q->pos); free(q->neg); free(q->m01); free(q->mlat); free(q->mask); free(q->noise); free(q->init);
    free(q->eps); free(q->tok_in); free(q->tok_out);
    dt_prep_image_free(&q->prep);
}

static const dt_gen_hooks zi_hooks = {
    .prepare = zi_prepare, .load_text = zi_load_text, .encode = zi_encode, .load_models = zi_load_models,
    .geometry = zi_geometry, .pack = zi_pack, .schedule = zi_schedule, .sampler = zi_sampler, .sampled = zi_sampled,
    .decode = zi_decode, .finish = zi_finish,
};

static int zi_generate(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                       dt_gen_observer obs, void *ud) {
    zi_request q = {0};
    return dt_generate_run(p, g, &zi_hooks, &q, rgb, w, h, tm, obs, ud);
}

/* The memory planner's Z-Image part (dt_family.place_sizes): the DiT's widths (config.json, or read from the
 * tensors), FLUX.1's AutoencoderKL decode. */
static int zi_place_sizes(const json *cfg, const char *tr, const char *va, int W, int H, int tile, int elem,
                          dt_family_place *o) {
    (void)cfg;   /* zimage_config_read: the same config, or the geometry of a file without one */
    zimage_config c;
    dt_vae_config v;
    if (zimage_config_read(tr, &c) || dt_vae_kl_read_config(va, &v)) return -1;
    o->hidden = c.dim;
    o->mlp = c.ffn;
    o->head_dim = c.head_dim;
    dt_family_place_vae(&v, W, H, tile, elem, o);
    o->side_queue = 0;   /* one stream of joint blocks, one queue */
    return 0;
}

/* sequence_parallel 0: Z-Image has no split forward; fp8 modes: the blocks' Linears (--precision fp8) and attention
 * (--attn-precision fp8) in zimage.c */
const dt_family dt_family_zimage = {
    .name = "z-image", .title = "Z-Image", .pipeline_classes = zi_pipelines, .transformer_classes = zi_transformers,
    .presets = zi_presets, .fp8 = 1, .load = zi_load, .free = zi_free, .generate = zi_generate,
    .dit_load = zimage_dit_load, .describe = zimage_config_describe, .synth = dt_synth_zimage,
    .read_inputs = zimage_dit_read_inputs, .place_sizes = zi_place_sizes,
};
