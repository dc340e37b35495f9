/* krea2_family.c — the Krea 2 family of the engine (diffusers Krea2Pipeline):
 * Qwen-Image template -> Qwen3-VL hidden-state taps (krea2_prompt.h) -> noise [z, h, w] packed p×p ->
 * flow-matching Euler loop over the Krea 2 transformer (time shift mu from the image token count, or the
 * fixed 1.15 of distilled checkpoints; guidance cond + g·(cond − uncond) whenever g > 0, with the negative
 * prompt) -> unpack, de-normalize by latents_mean / latents_std -> Qwen-Image VAE decoder -> 8-bit RGB.
 *
 * model_index.json (`_class_name: Krea2Pipeline`) carries `text_encoder_select_layers` (the taps),
 * `is_distilled` and `patch_size`. Every component's geometry is read and cross-checked at load.
 * Resident like klein.c: tokenizer, text encoder (layers up to the deepest tap), transformer and VAE stay
 * loaded; with opts.release_text_encoder the encoder is loaded per prompt and freed before the rest loads.
 * Defaults (the reference's): 28 steps and guidance 4.5, or 8 steps and guidance 0 when distilled; sizes
 * rounded up to multiples of vae_scale_factor·patch_size; --noise is in.initial_latents [1, z, H/s, W/s],
 * the latent grid before packing. Observed: prompt_embeds [1,T,taps,D], prompt_mask [1,T], sigmas,
 * timesteps, stepK.latents_packed [1,N,z·p²], latents_unpacked [1,z,H/s,W/s] (de-normalized), image_float. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/krea2.h"
#include "models/krea2_dit.h"
#include "models/qwen3.h"
#include "models/vae_qwenimage.h"
#include "models/vae_tiling.h"
#include "pipeline/family.h"
#include "pipeline/generate_run.h"
#include "pipeline/krea2_prompt.h"

#include "pipeline/sampler.h"
#include "pipeline/scheduler.h"
#include "text/tokenizer.h"

static const char *const k2_pipelines[] = {"Krea2Pipeline", NULL};
static const char *const k2_transformers[] = {"Krea2Transformer2DModel", NULL};
static const char *const k2_presets[] = {"krea2", "krea2-tiny", NULL};

#define K2_DISTILLED_MU 1.15        /* the pipeline's fixed time shift for distilled checkpoints */
#define K2_DEFAULT_GUIDANCE 4.5f
#define K2_DEFAULT_STEPS 28
#define K2_DISTILLED_STEPS 8
/* The pipeline's taps when model_index.json has none (Qwen3-VL-4B, 36 layers). */
static const int k2_default_taps[] = {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35};

typedef struct {
    char *te_dir;
    int taps[DT_GEN_MAX_TAPS], n_taps, max_tap;
    int distilled, patch;
    dt_tokenizer *tok;
    dt_sched_config sched;
    dt_qwen3_config tcfg;
    krea2_config dcfg;
    dt_qvae_config vcfg;
    dt_qwen3 *te;             /* NULL between prompts with release_text_encoder */
    dt_dit *dit;              /* NULL until first needed with release_text_encoder */
    dt_qvae *vae;
} k2_state;

static int read_index(k2_state *k, const json *j, const char *path) {
    k->distilled = json_get_bool(j, "is_distilled", 0);
    int64_t ps = json_get_int(j, "patch_size", 2);
    if (ps < 1 || ps > 16) { dt_set_error("%s: patch_size %lld outside 1..16", path, (long long)ps); return -1; }
    k->patch = (int)ps;
    if (k->n_taps) return 0;
    const json *t = json_get(j, "text_encoder_select_layers");
    if (!t || t->type == JSON_NULL) {
        k->n_taps = (int)(sizeof k2_default_taps / sizeof *k2_default_taps);
        memcpy(k->taps, k2_default_taps, sizeof k2_default_taps);
        return 0;
    }
    if (t->type != JSON_ARRAY || t->len < 1 || t->len > DT_GEN_MAX_TAPS) {
        dt_set_error("%s: text_encoder_select_layers must list 1..%d layer numbers", path, DT_GEN_MAX_TAPS);
        return -1;
    }
    for (size_t i = 0; i < t->len; i++) {
        const json *e = json_at(t, i);
        if (!e || e->type != JSON_NUMBER || !e->is_integer || e->integer < 0 || e->integer > 4096) {
            dt_set_error("%s: text_encoder_select_layers[%zu] is not a layer number", path, i);
            return -1;
        }
        k->taps[k->n_taps++] = (int)e->integer;
    }
    return 0;
}

static int read_dit_config(const char *root, krea2_config *c) {
    char *p = dt_path_join(root, "transformer/config.json");
    json *j = json_parse_file(p);
    int rc = -1;
    if (j) {
        const char *cls = json_get_str(j, "_class_name");
        if (cls && !dt_family_name_in(k2_transformers, cls))
            dt_set_error("%s: _class_name is '%s', expected %s", p, cls, k2_transformers[0]);
        else
            rc = krea2_config_parse(j, p, c);
    }
    json_free(j);
    free(p);
    return rc;
}

static void k2_free(dt_pipeline *p) {
    k2_state *k = p->fam;
    if (!k) return;
    if (k->tok) dt_tokenizer_free(k->tok);
    if (k->te) dt_qwen3_free(k->te);
    dt_dit_free(k->dit);
    if (k->vae) dt_qvae_free(k->vae);
    free(k->te_dir);
    free(k);
    p->fam = NULL;
}

static int ensure_te(dt_pipeline *p) {
    k2_state *k = p->fam;
    return dt_family_ensure_text_encoder(p, k->te_dir, k->max_tap, &k->te);
}

static int ensure_dit_vae(dt_pipeline *p) {
    k2_state *k = p->fam;
    const dt_dit_load_opts lo = dt_family_dit_opts(p);
    if (!k->dit && !(k->dit = krea2_dit_load(p->be, p->root, &lo))) return -1;
    if (!k->vae && (!(k->vae = dt_qvae_load(p->be, p->root)) ||
                    dt_qvae_set_tiling(k->vae, p->opts.vae_tiling, p->opts.vae_tile)))
        return -1;
    return 0;
}

static int k2_load(dt_pipeline *p, const json *idx) {
    k2_state *k = dt_calloc(1, sizeof *k);
    p->fam = k;
    const char *root = p->root;
    char *idx_path = dt_path_join(root, "model_index.json"), *tokd = dt_path_join(root, "tokenizer"),
         *sch = dt_path_join(root, "scheduler");
    k->te_dir = dt_path_join(root, "text_encoder");
    int rc = -1;
    k->n_taps = p->opts.n_taps;
    if (k->n_taps < 0 || k->n_taps > DT_GEN_MAX_TAPS) { dt_set_error("generate: %d text-encoder taps", k->n_taps); goto out; }
    if (k->n_taps) memcpy(k->taps, p->opts.taps, sizeof(int) * (size_t)k->n_taps);
    if (read_index(k, idx, idx_path)) goto out;
    if (!(k->tok = dt_tokenizer_load(tokd)) || dt_sched_config_load(sch, &k->sched)) goto out;
    if (dt_qwen3_read_config(k->te_dir, &k->tcfg) || read_dit_config(root, &k->dcfg) || dt_qvae_read_config(root, &k->vcfg))
        goto out;
    for (int i = 0; i < k->n_taps; i++) {
        if (k->taps[i] < 0 || k->taps[i] > k->tcfg.num_layers) {
            dt_set_error("%s: text-encoder layer %d outside 0..%d", root, k->taps[i], k->tcfg.num_layers);
            goto out;
        }
        if (k->taps[i] > k->max_tap) k->max_tap = k->taps[i];
    }
    if (k->n_taps != k->dcfg.text_layers || k->tcfg.hidden != k->dcfg.text_dim) {
        dt_set_error("%s: %d text-encoder taps of width %d, but the transformer reads num_text_layers %d of "
                     "text_hidden_dim %d", root, k->n_taps, k->tcfg.hidden, k->dcfg.text_layers, k->dcfg.text_dim);
        goto out;
    }
    if (k->dcfg.in_channels != k->vcfg.z_dim * k->patch * k->patch) {
        dt_set_error("%s: transformer in_channels %d != VAE z_dim %d x patch_size %d^2", root, k->dcfg.in_channels,
                     k->vcfg.z_dim, k->patch);
        goto out;
    }
    if (k->dcfg.n_axes != 3) {
        dt_set_error("%s: the Krea 2 pipeline builds 3 RoPE coordinates (t, h, w); the transformer has %d axes", root,
                     k->dcfg.n_axes);
        goto out;
    }
    if (k->sched.use_dynamic_shifting && !k->distilled && k->sched.max_image_seq_len == k->sched.base_image_seq_len) {
        dt_set_error("%s: scheduler base_image_seq_len and max_image_seq_len are equal (no time shift line)", root);
        goto out;
    }
    if (p->opts.vae_tiling &&   /* a tile size that cannot work is refused before anything loads */
        vae_tiling_check(root, p->opts.vae_tile ? p->opts.vae_tile : DT_QVAE_DEFAULT_TILE, k->vcfg.scale_factor))
        goto out;
    if (!p->opts.release_text_encoder && (ensure_te(p) || ensure_dit_vae(p))) goto out;
    p->info.distilled = k->distilled;
    p->info.default_steps = k->distilled ? K2_DISTILLED_STEPS : K2_DEFAULT_STEPS;
    p->info.default_guidance = k->distilled ? 0.0f : K2_DEFAULT_GUIDANCE;
    p->info.size_multiple = k->vcfg.scale_factor * k->patch;
    p->info.size_round_up = 1;   /* Krea2Pipeline rounds height and width up */
    p->info.max_side = 8192;
    p->info.max_image_tokens = k->distilled ? 0 : dt_calculate_shift_max_tokens(&k->sched);
    rc = 0;
out:
    free(idx_path);
    free(tokd);
    free(sch);
    if (rc) k2_free(p);
    return rc;
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

/* One request (the generate skeleton's ctx, generate_run.h): the text features and what the sampling loop's model
 * callback needs. */
typedef struct {
    k2_state *k;
    float *pos, *neg;                 /* text features [T, taps, D] (prompt, negative) */
    uint8_t *pmask, *nmask;           /* [T] */
    float *ids;                       /* positions [T + N, 3] */
    const float *timesteps;
    float ntt;                        /* num_train_timesteps */
    int N, T;
    int lh, lw, gh, gw;               /* the latent grid [z, lh, lw] and the token grid gh x gw */
} k2_request;

static int k2_predict(void *ctx, int i, const float *x, int pass, float *v, dt_fbc_branch *fbc) {
    k2_request *c = ctx;
    /* the pipeline passes t / num_train_timesteps (float32 on every backend: NOTES.md, "the schedule stays float32") */
    float t = c->timesteps[i] / c->ntt;
    dt_dit_step st = {.img = x, .n_img = c->N, .txt = pass ? c->neg : c->pos, .n_txt = c->T, .text = -1, .timestep = t,
                      .pos = c->ids, .mask = pass ? c->nmask : c->pmask, .out = v, .fbc = fbc};
    return dt_dit_forward(c->k->dit, &st);
}

/* k2_predict on the backend's matrices: the latents and velocities stay there between steps (the sampler's
 * device path). */
static int k2_predict_dev(void *ctx, int i, dt_mat x, int pass, dt_mat v) {
    k2_request *c = ctx;
    float t = c->timesteps[i] / c->ntt;
    return krea2_forward_dev(krea2_dit_model(c->k->dit), x, pass ? c->neg : c->pos, c->T, t, c->ids,
                             pass ? c->nmask : c->pmask, v);
}

/* Both passes of step i in one forward (the guidance batch): the prompt's velocity into v, the negative prompt's
 * into u. */
static int k2_predict_pair(void *ctx, int i, const float *x, float *v, float *u) {
    k2_request *c = ctx;
    float t = c->timesteps[i] / c->ntt;
    krea2_seq q[2] = {
        {.img = x, .txt = c->pos, .n_txt = c->T, .pos = c->ids, .mask = c->pmask, .out = v},
        {.img = x, .txt = c->neg, .n_txt = c->T, .pos = c->ids, .mask = c->nmask, .out = u},
    };
    return krea2_forward_batch(krea2_dit_model(c->k->dit), q, 2, c->N, t);
}

/* The same on the backend's matrices (the sampler's device path): flow_step then combines v and u there. */
static int k2_predict_pair_dev(void *ctx, int i, dt_mat x, dt_mat v, dt_mat u) {
    k2_request *c = ctx;
    float t = c->timesteps[i] / c->ntt;
    krea2_seq q[2] = {
        {.img_m = x, .txt = c->pos, .n_txt = c->T, .pos = c->ids, .mask = c->pmask, .out_m = v},
        {.img_m = x, .txt = c->neg, .n_txt = c->T, .pos = c->ids, .mask = c->nmask, .out_m = u},
    };
    return krea2_forward_batch(krea2_dit_model(c->k->dit), q, 2, (int)x.rows, t);
}

static int k2_prepare(void *ctx, dt_gen_run *r) {
    (void)ctx;
    r->cfg = r->g->guidance > 0.0f;
    return 0;
}

static int k2_load_text(void *ctx, dt_gen_run *r) {
    (void)ctx;
    return ensure_te(r->p);
}

/* Qwen-Image template -> Qwen3-VL taps: the prompt's features and mask (and the negative prompt's with guidance). */
static int k2_encode(void *ctx, dt_gen_run *r) {
    k2_request *q = ctx;
    k2_state *k = q->k;
    const dt_gen_params *g = r->g;
    dt_gen_log_encoding(g, g->max_seq_len, k->taps, k->n_taps, r->cfg, "");
    int Tn = 0;
    if (krea2_encode_prompt(k->te, k->tok, g->prompt, g->max_seq_len, k->taps, k->n_taps, &q->pos, &q->pmask, &q->T))
        return -1;
    dt_gen_observe(r->obs, r->ud, "prompt_embeds", q->pos, 4, 1, q->T, k->n_taps, k->tcfg.hidden);
    if (r->obs) {
        float *f = dt_malloc(sizeof(float) * (size_t)q->T);
        for (int i = 0; i < q->T; i++) f[i] = q->pmask[i];
        dt_gen_observe(r->obs, r->ud, "prompt_mask", f, 2, 1, q->T, 0, 0);
        free(f);
    }
    if (r->cfg && krea2_encode_prompt(k->te, k->tok, g->negative_prompt, g->max_seq_len, k->taps, k->n_taps,
                                         &q->neg, &q->nmask, &Tn))
        return -1;
    if (r->cfg && Tn != q->T) { dt_set_error("krea2: the negative prompt has %d tokens, the prompt %d", Tn, q->T); return -1; }
    dt_family_release_text_encoder(r->p, &k->te);
    return 0;
}

static int k2_load_models(void *ctx, dt_gen_run *r) {
    k2_request *q = ctx;
    if (ensure_dit_vae(r->p)) return -1;
    r->dit = q->k->dit;
    return 0;
}

/* The noise is drawn in the VAE's latent grid [z, H/s, W/s] before packing. */
static int k2_geometry(void *ctx, dt_gen_run *r) {
    k2_request *q = ctx;
    k2_state *k = q->k;
    const int vsf = k->vcfg.scale_factor, P = k->patch, z = k->vcfg.z_dim;
    r->H = r->g->height;
    r->W = r->g->width;
    q->lh = r->H / vsf;
    q->lw = r->W / vsf;
    q->gh = q->lh / P;
    q->gw = q->lw / P;
    q->N = q->gh * q->gw;
    r->nc = z;
    r->nh = q->lh;
    r->nw = q->lw;
    r->N = q->N;
    r->C = k->dcfg.in_channels;
    snprintf(r->layout, sizeof r->layout, "[1, %d, %d, %d], the latent grid before packing, for a %dx%d image", z,
             q->lh, q->lw, r->W, r->H);
    return 0;
}

/* noise [z, lh, lw] -> tokens [N, C]; positions [T + N, 3]: text rows 0, image rows (0, row, col). */
static void k2_pack(void *ctx, dt_gen_run *r, const float *noise, float *x) {
    k2_request *q = ctx;
    (void)r;
    pack(noise, q->k->vcfg.z_dim, q->lh, q->lw, q->k->patch, x);
    q->ids = dt_calloc((size_t)(q->T + q->N) * 3, sizeof(float));
    for (int row = 0; row < q->gh; row++)
        for (int col = 0; col < q->gw; col++) {
            float *e = q->ids + ((size_t)q->T + (size_t)row * q->gw + col) * 3;
            e[1] = (float)row;
            e[2] = (float)col;
        }
}

/* The time shift mu from the image token count (distilled checkpoints: the pipeline's fixed one). */
static int k2_schedule(void *ctx, dt_gen_run *r, float *sigmas, float *timesteps) {
    k2_request *q = ctx;
    k2_state *k = q->k;
    const double mu = k->distilled ? K2_DISTILLED_MU : dt_calculate_shift(&k->sched, q->N);
    return dt_schedule_make_mu(&k->sched, r->g->steps, mu, sigmas, timesteps);
}

static int k2_sampler(void *ctx, dt_gen_run *r, float *x, dt_sampler *sm) {
    k2_request *q = ctx;
    (void)x;
    q->timesteps = sm->timesteps;
    q->ntt = (float)q->k->sched.num_train_timesteps;
    sm->rule = DT_CFG_FROM_COND;
    sm->predict = k2_predict;
    sm->predict_dev = k2_predict_dev;
    if (r->p->opts.guidance_batch) {   /* --guidance-batch on (the sampler runs two passes under a cache) */
        sm->predict_pair = k2_predict_pair;
        sm->predict_pair_dev = k2_predict_pair_dev;
    }
    sm->ctx = q;
    return 0;
}

/* tokens [N, C] -> unpack to [z, lh, lw], de-normalize by latents_mean / latents_std -> the Qwen-Image VAE decoder. */
static int k2_decode(void *ctx, dt_gen_run *r, const float *x, float *img, uint8_t *rgb) {
    k2_request *q = ctx;
    k2_state *k = q->k;
    const int z = k->vcfg.z_dim;
    float *lat = dt_malloc(sizeof(float) * (size_t)z * q->lh * q->lw);
    unpack(x, z, q->lh, q->lw, k->patch, lat);
    dt_qvae_denormalize(&k->vcfg, lat, (int64_t)q->lh * q->lw);
    dt_gen_observe(r->obs, r->ud, "latents_unpacked", lat, 4, 1, z, q->lh, q->lw);
    int rc = img ? dt_qvae_decode(k->vae, lat, q->lh, q->lw, img) : dt_qvae_decode_rgb8(k->vae, lat, q->lh, q->lw, rgb);
    free(lat);
    return rc;
}

static void k2_finish(void *ctx, dt_gen_run *r, int rc) {
    k2_request *q = ctx;
    (void)r;
    (void)rc;
    free(q->pos); free(q->neg); free(q->pmask); free(q->nmask); free(q->ids);
}

static const dt_gen_hooks k2_hooks = {
    .prepare = k2_prepare, .load_text = k2_load_text, .encode = k2_encode, .load_models = k2_load_models,
    .geometry = k2_geometry, .pack = k2_pack, .schedule = k2_schedule, .sampler = k2_sampler, .decode = k2_decode,
    .finish = k2_finish,
};

static int k2_generate(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                       dt_gen_observer obs, void *ud) {
    k2_request q = {.k = p->fam};
    return dt_generate_run(p, g, &k2_hooks, &q, rgb, w, h, tm, obs, ud);
}

/* The memory planner's Krea 2 part (dt_family.place_sizes): the transformer's widths, the Qwen-Image VAE's decode. */
static int k2_place_sizes(const json *cfg, const char *tr, const char *va, int W, int H, int tile, int elem,
                          dt_family_place *o) {
    krea2_config c;
    static dt_qvae_config qv;   /* (static: 2 KB of latent statistics) */
    if (krea2_config_parse(cfg, tr, &c) || dt_qvae_read_config(va, &qv)) return -1;
    o->hidden = c.hidden;
    o->mlp = c.intermediate;
    o->head_dim = c.head_dim;
    o->scale = qv.scale_factor;
    const int lh = H / o->scale, lw = W / o->scale, t = tile ? tile : DT_QVAE_DEFAULT_TILE;
    o->vae_act = dt_qvae_decode_act_bytes(&qv, 0, lh, lw, elem);
    o->vae_tile_act = lh > t / o->scale || lw > t / o->scale ? dt_qvae_decode_act_bytes(&qv, t, lh, lw, elem) : 0;
    o->vae_tile_px = t;
    o->vae_cmax = 0;
    for (int i = 0; i < qv.n_mult; i++)
        o->vae_cmax = qv.base_dim * qv.dim_mult[i] > o->vae_cmax ? qv.base_dim * qv.dim_mult[i] : o->vae_cmax;
    o->vae_attention = 1;
    o->side_queue = 0;
    return 0;
}

/* sequence_parallel 0: Krea 2 has no split forward (the engine refuses --sequence-parallel for it); fp8 modes: the
 * transformer blocks (krea2.c) */
const dt_family dt_family_krea2 = {
    .name = "krea2", .title = "Krea 2", .pipeline_classes = k2_pipelines, .transformer_classes = k2_transformers,
    .presets = k2_presets, .fp8 = 1, .guidance_batch = 1, .load = k2_load, .free = k2_free, .generate = k2_generate,
    .dit_load = krea2_dit_load,
    .describe = krea2_config_describe, .synth = dt_synth_krea2, .read_inputs = krea2_dit_read_inputs,
    .place_sizes = k2_place_sizes,
};
