/* klein.c — the FLUX.2-klein family of the engine (diffusers Flux2KleinPipeline):
 * chat-template tokens -> Qwen3 hidden-state taps -> seeded noise in packed latent space ->
 * Euler steps over the DiT with the klein schedule (CFG with the negative prompt for base models) ->
 * unpack, batch-norm de-normalization, unpatchify -> VAE decoder -> 8-bit RGB.
 * Editing (klein_edit.h): reference images' tokens go into the DiT with every step (appended after the noise, or
 * KV-cached for Flux2KleinKVPipeline); inpainting (Flux2KleinInpaintPipeline) starts at the strength's first kept
 * step from the noise mixed with the init latents and restores the kept region after each step (inpaint.h).
 *
 * Resident: tokenizer, text encoder (the layers up to the deepest tap), DiT and VAE stay loaded. With
 * opts.release_text_encoder (one-shot runs) the text encoder is loaded for each prompt and freed before
 * the DiT and VAE load, so peak memory is the larger of the two, not their sum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/flux2.h"
#include "models/flux2_dit.h"
#include "models/flux2_layouts.h"
#include "models/flux2_sp.h"
#include "models/qwen3.h"
#include "models/vae_flux2.h"
#include "models/vae_tiling.h"
#include "pipeline/family.h"
#include "pipeline/generate_run.h"
#include "pipeline/inpaint.h"
#include "pipeline/klein_edit.h"
#include "pipeline/latents.h"
#include "pipeline/sampler.h"
#include "pipeline/scheduler.h"
#include "text/tokenizer.h"

_Static_assert(DT_GEN_MAX_RANKS == FLUX2_SP_MAX_RANKS, "dt_pipeline_opts.sp_devices holds one device per rank");

typedef struct {
    char *te_dir, *vae_dir;
    dt_tokenizer *tok;
    dt_qwen3_config tcfg;
    dt_qwen3 *te;               /* NULL between prompts with release_text_encoder */
    int taps[DT_GEN_MAX_TAPS], n_taps, max_tap;
    flux2_config fc;            /* the DiT's geometry (read before loading it) */
    dt_dit *dit;                /* NULL until first needed with release_text_encoder; split over ranks with
                                 * opts.sequence_parallel > 1 */
    dt_vae *vae;
    dt_sched_config sched;
    dt_mat txt[2];              /* the prompt's and the negative prompt's features [T, joint] on the device */
    int txt_T;
    char *txt_prompt[2];        /* the text whose features txt[slot] holds (NULL: none valid); a request with the
                                 * same text and length reuses them instead of running the text encoder again */
    klein_ref_cache refc;       /* the last cacheable edit's reference images and tokens */
    int dit_refs;               /* the DiT holds references (set by an earlier request) */
    int dit_refs_valid;         /* ... and they are refc's tokens (in the pipeline's own mode: KV, their K|V computed
                                 * once; inpainting, the other mode, never keeps them) */
} klein_state;

/* Default taps: the reference's (9, 18, 27) for Qwen3's 36 layers, i.e. k·L/(n+1) for k = 1..n,
 * where n = joint_attention_dim / text hidden size (the number of taps the DiT expects). */
static int default_taps(int layers, int n, int *taps) {
    for (int k = 1; k <= n; k++) {
        taps[k - 1] = (int)((int64_t)k * layers / (n + 1));   /* layers may be up to 2^30 */
        if (taps[k - 1] < 1) taps[k - 1] = 1;
    }
    return n;
}

static int read_dit_config(const char *root, flux2_config *fc) {
    char *cfg_path = dt_path_join(root, "transformer/config.json");
    int rc = -1;
    if (dt_path_exists(cfg_path)) {
        json *j = json_parse_file(cfg_path);
        rc = j ? flux2_config_parse(j, cfg_path, fc) : -1;
        json_free(j);
    } else {
        char *dir = dt_path_join(root, "transformer");
        dt_weights *w = dt_weights_open(dir);
        if (w) {
            rc = flux2_layout_install(w) == 0 ? flux2_layout_infer_config(w, fc) : -1;
            dt_weights_close(w);
        }
        free(dir);
    }
    free(cfg_path);
    return rc;
}

static void klein_free(dt_pipeline *p) {
    klein_state *s = p->fam;
    if (!s) return;
    if (s->tok) dt_tokenizer_free(s->tok);
    if (s->te) dt_qwen3_free(s->te);
    dt_dit_free(s->dit);
    if (s->vae) dt_vae_free(s->vae);
    for (int i = 0; i < 2; i++) {
        if (s->txt[i].data) p->be->free(p->be, &s->txt[i]);
        free(s->txt_prompt[i]);
    }
    klein_ref_cache_clear(&s->refc);
    free(s->te_dir);
    free(s->vae_dir);
    free(s);
    p->fam = NULL;
}

static int ensure_te(dt_pipeline *p) {
    klein_state *s = p->fam;
    return dt_family_ensure_text_encoder(p, s->te_dir, s->max_tap, &s->te);
}

static int ensure_dit_vae(dt_pipeline *p) {
    klein_state *s = p->fam;
    if (!s->dit) {
        const dt_dit_load_opts o = dt_family_dit_opts(p);
        if (!(s->dit = flux2_dit_load(p->be, p->root, &o))) return -1;
    }
    if (!s->vae) {
        s->vae = dt_vae_load(p->be, s->vae_dir);
        if (!s->vae || dt_vae_set_tiling(s->vae, p->opts.vae_tiling, p->opts.vae_tile)) return -1;
    }
    const dt_vae_config *vc = dt_vae_get_config(s->vae);
    const flux2_config *c = flux2_dit_config(s->dit);
    if (c->in_channels != vc->latent_channels * vc->patch * vc->patch) {
        dt_set_error("%s: transformer in_channels %d != VAE latent channels %d x patch %d^2", p->root, c->in_channels,
                     vc->latent_channels, vc->patch);
        return -1;
    }
    if (c->n_axes != 4) { dt_set_error("%s: the pipeline needs 4 RoPE axes, the transformer has %d", p->root, c->n_axes); return -1; }
    int bn_n;
    const float *bm, *bv;
    float eps;
    dt_vae_bn_stats(s->vae, &bm, &bv, &bn_n, &eps);
    if (bn_n != c->in_channels) {
        dt_set_error("%s: VAE batch-norm has %d channels, the latents %d", p->root, bn_n, c->in_channels);
        return -1;
    }
    return 0;
}

static int klein_load(dt_pipeline *p, const json *idx) {
    klein_state *s = dt_calloc(1, sizeof *s);
    p->fam = s;
    const char *root = p->root;
    int distilled = json_get_bool(idx, "is_distilled", 0);
    char *tok_dir = dt_path_join(root, "tokenizer"), *sch_dir = dt_path_join(root, "scheduler");
    s->te_dir = dt_path_join(root, "text_encoder");
    s->vae_dir = dt_path_join(root, "vae");
    int rc = -1;
    s->tok = dt_tokenizer_load(tok_dir);
    if (!s->tok) goto out;
    /* the DiT's joint_attention_dim tells how many taps it expects: read its config first (or infer it from the
     * tensor shapes for layouts shipped without config.json, e.g. mflux) */
    if (read_dit_config(root, &s->fc)) goto out;
    if (dt_qwen3_read_config(s->te_dir, &s->tcfg)) goto out;
    const int hidden = s->tcfg.hidden, layers = s->tcfg.num_layers;
    s->n_taps = p->opts.n_taps;
    if (s->n_taps) {
        memcpy(s->taps, p->opts.taps, sizeof(int) * s->n_taps);
    } else {
        if (s->fc.joint_dim % hidden || s->fc.joint_dim / hidden > DT_GEN_MAX_TAPS) {
            dt_set_error("%s: joint_attention_dim %d is not a multiple of the text encoder's hidden size %d", root,
                         s->fc.joint_dim, hidden);
            goto out;
        }
        s->n_taps = default_taps(layers, s->fc.joint_dim / hidden, s->taps);
    }
    for (int i = 0; i < s->n_taps; i++) {
        if (s->taps[i] < 0 || s->taps[i] > layers) {
            dt_set_error("generate: text-encoder layer %d out of range 0..%d", s->taps[i], layers);
            goto out;
        }
        if (s->taps[i] > s->max_tap) s->max_tap = s->taps[i];
    }
    if ((int64_t)s->n_taps * hidden != s->fc.joint_dim) {
        dt_set_error("generate: %d taps x hidden %d = %lld features, but the transformer expects joint_attention_dim %d",
                     s->n_taps, hidden, (long long)s->n_taps * hidden, s->fc.joint_dim);
        goto out;
    }
    if (dt_path_exists(sch_dir)) { if (dt_sched_config_load(sch_dir, &s->sched)) goto out; }
    else dt_sched_config_default(&s->sched);
    if (p->opts.vae_tiling) {   /* a tile size that cannot work is refused before anything loads */
        dt_vae_config vc;
        if (dt_vae_read_config(s->vae_dir, &vc) ||
            vae_tiling_check(s->vae_dir, p->opts.vae_tile ? p->opts.vae_tile : vc.sample_size, vc.scale_factor))
            goto out;
    }
    if (!p->opts.release_text_encoder && (ensure_te(p) || ensure_dit_vae(p))) goto out;

    p->info.distilled = distilled;
    p->info.default_steps = distilled ? 4 : 50;
    p->info.default_guidance = 4.0f;
    /* 16 for FLUX.2: VAE x8, then 2x2 patches; from the VAE config when it is loaded */
    p->info.size_multiple = 16;
    if (s->vae) {
        const dt_vae_config *vc = dt_vae_get_config(s->vae);
        p->info.size_multiple = vc->scale_factor * vc->patch;
    } else {
        dt_vae_config vc;
        if (dt_vae_read_config(s->vae_dir, &vc) == 0) p->info.size_multiple = vc.scale_factor * vc.patch;
        else goto out;
    }
    p->info.max_side = 8192;
    p->info.editing = 1;
    p->info.kv_refs = !strcmp(p->class_name, "Flux2KleinKVPipeline");
    if (s->sched.use_dynamic_shifting && s->sched.time_shift_type == DT_TIME_SHIFT_EXPONENTIAL)
        p->info.max_image_tokens = dt_schedule_max_image_tokens();
    rc = 0;
out:
    free(tok_dir);
    free(sch_dir);
    if (rc) klein_free(p);
    return rc;
}

/* Whether s->txt[slot] already holds the features of prompt at length T (an observer wants the tokens too: no). */
static int prompt_cached(const klein_state *s, int slot, const char *prompt, int T, dt_gen_observer obs) {
    return !obs && prompt && s->txt_T == T && s->txt_prompt[slot] && !strcmp(s->txt_prompt[slot], prompt);
}

/* Encode one prompt into s->txt[slot] [T, n_taps * hidden] on the device (it never visits the host unless an observer
 * wants it). 0 or -1. */
static int encode_prompt(dt_pipeline *p, int slot, const char *prompt, int T, dt_gen_observer obs, void *ud) {
    klein_state *s = p->fam;
    const int hidden = s->tcfg.hidden, F = s->n_taps * hidden;
    free(s->txt_prompt[slot]);   /* (valid again only once the encode below succeeded) */
    s->txt_prompt[slot] = NULL;
    if (s->txt_T != T) {
        for (int i = 0; i < 2; i++) {
            if (s->txt[i].data) p->be->free(p->be, &s->txt[i]);
            free(s->txt_prompt[i]);
            s->txt_prompt[i] = NULL;
        }
        s->txt_T = 0;
        for (int i = 0; i < 2; i++)
            if (p->be->alloc(p->be, &s->txt[i], T, F, p->be->act_dtype)) return -1;
        s->txt_T = T;
    }
    int32_t *ids = dt_malloc(sizeof(int32_t) * T), *mask = dt_malloc(sizeof(int32_t) * T);
    int rc = -1;
    int real = dt_tokenize_chat(s->tok, prompt, T, ids, mask);
    if (real < 0) goto out;
    if (real == T) dt_log(1, "ditrun: note: the prompt fills all %d text tokens (it may have been truncated)\n", T);
    if (obs && slot == 0) {
        float *f = dt_malloc(sizeof(float) * T);
        for (int i = 0; i < T; i++) f[i] = (float)ids[i];
        dt_gen_observe(obs, ud, "input_ids", f, 2, 1, T, 0, 0);
        for (int i = 0; i < T; i++) f[i] = (float)mask[i];
        dt_gen_observe(obs, ud, "attention_mask", f, 2, 1, T, 0, 0);
        free(f);
    }
    if (dt_qwen3_encode_to(s->te, ids, mask, T, s->taps, s->n_taps, s->txt[slot])) goto out;
    if (obs && slot == 0) {
        float *emb = dt_malloc(sizeof(float) * (size_t)T * F);
        p->be->download(p->be, emb, s->txt[slot]);
        dt_gen_observe(obs, ud, "prompt_embeds", emb, 3, 1, T, F, 0);
        free(emb);
    }
    s->txt_prompt[slot] = dt_strdup(prompt);
    rc = 0;
out:
    free(ids);
    free(mask);
    return rc;
}

/* One request (the generate skeleton's ctx, generate_run.h): its editing inputs, the geometry, the positions, and
 * what the sampling loop's model callback needs (and, inpainting, its after-step restoration). */
typedef struct {
    klein_state *s;
    klein_edit ed;              /* editing inputs (prepared, then encoded) */
    int inpaint, edit, cacheable, ref_hit, refs_set;
    int keep_pos, keep_neg;     /* the prompt's / negative prompt's features are the previous request's */
    int h, w;                   /* the packed latent grid (N = h·w tokens) */
    float *img_ids, *txt_ids;   /* positions [N, 4] and [T, 4] */
    const float *timesteps;
    int N, T;
    const float *sigmas;
    float *noise;               /* inpainting: the noise [N, C] before it was mixed with the init latents */
    int C, last;                /* last: the index of the final step */
} klein_request;

/* Inpainting after step i: the kept region back to the init latents re-noised at the next sigma (or the init
 * latents themselves after the last step). */
static void klein_restore(void *ctx, int i, float *x) {
    klein_request *k = ctx;
    dt_inpaint_restore(x, k->ed.init_tok, k->noise, k->ed.mask_tok, k->N, k->C, k->sigmas[i + 1], i == k->last);
}

static int klein_predict(void *ctx, int i, const float *x, int pass, float *v, dt_fbc_branch *fbc) {
    klein_request *k = ctx;
    /* the pipeline passes timestep/1000 (in float32 on every backend: NOTES.md, "the schedule stays float32") */
    float t = k->timesteps[i] / 1000.0f;
    dt_dit_step st = {.img = x, .n_img = k->N, .n_txt = k->T, .text = pass ? 1 : 0, .timestep = t,
                      .img_ids = k->img_ids, .txt_ids = k->txt_ids, .out = v, .fbc = fbc};
    return dt_dit_forward(k->s->dit, &st);
}

/* Both passes of step i in one forward (the guidance batch): the prompt's velocity into v, the negative prompt's
 * into u. */
static int klein_predict_pair(void *ctx, int i, const float *x, float *v, float *u) {
    klein_request *k = ctx;
    float t = k->timesteps[i] / 1000.0f;
    dt_dit_step s0 = {.img = x, .n_img = k->N, .n_txt = k->T, .text = 0, .timestep = t, .img_ids = k->img_ids,
                      .txt_ids = k->txt_ids, .out = v};
    dt_dit_step s1 = s0;
    s1.text = 1;
    s1.out = u;
    return dt_dit_forward_pair(k->s->dit, &s0, &s1);
}

static int set_refs(klein_state *s, const float *tok, const float *ids, int r, int kv) {
    return dt_dit_set_refs(s->dit, tok, ids, r, kv);
}

/* The DiT's references dropped (a request that set its own, or a failed one). */
static void drop_refs(klein_state *s) {
    set_refs(s, NULL, NULL, 0, 0);
    s->dit_refs = s->dit_refs_valid = 0;
}

/* Editing inputs checked and prepared first (a bad image fails before any model runs); they may set the size. */
static int klein_prepare(void *ctx, dt_gen_run *r) {
    klein_request *k = ctx;
    dt_pipeline *p = r->p;
    const dt_gen_params *g = r->g;
    r->cfg = !p->info.distilled && g->guidance > 1.0f;
    if (p->info.distilled && g->guidance != p->info.default_guidance && g->guidance != 1.0f)
        dt_log(1, "ditrun: note: guidance is ignored by distilled models (is_distilled in model_index.json)\n");
    if (p->opts.sequence_parallel > 1 && g->cache.kind == DT_CACHE_FIRST_BLOCK) {
        dt_set_error("generate: --cache first-block is not supported with --sequence-parallel (the split forward has "
                     "no block hooks); taylorseer is");
        return -1;
    }
    k->inpaint = g->init_image != NULL;
    k->edit = k->inpaint || g->n_refs > 0;
    /* references (not inpainting) may be reused by the next request with the same images (an observer wants the
     * tokens computed: never) */
    k->cacheable = k->edit && !k->inpaint && !r->obs;
    k->ed.H = g->height;
    k->ed.W = g->width;
    if (k->edit) {
        double ti = dt_now();
        if (klein_edit_prepare(g, p->info.size_multiple, &k->ed)) return -1;
        r->tm->t_images = dt_now() - ti;
        if (k->ed.W > p->info.max_side || k->ed.H > p->info.max_side) {
            dt_set_error("generate: image size %dx%d is over %d pixels a side (this model's limit)", k->ed.W, k->ed.H,
                         p->info.max_side);
            return -1;
        }
    }
    return 0;
}

/* The text encoder, unless both prompts' features are the previous request's at this length. */
static int klein_load_text(void *ctx, dt_gen_run *r) {
    klein_request *k = ctx;
    klein_state *s = k->s;
    const dt_gen_params *g = r->g;
    k->keep_pos = prompt_cached(s, 0, g->prompt, g->max_seq_len, r->obs);
    k->keep_neg = !r->cfg || prompt_cached(s, 1, g->negative_prompt, g->max_seq_len, NULL);
    r->tm->prompts_cached = k->keep_pos + (r->cfg && k->keep_neg);
    return k->keep_pos && k->keep_neg ? 0 : ensure_te(r->p);
}

/* Tokenizer + Qwen3 taps into s->txt[0] (and s->txt[1] with guidance). */
static int klein_encode(void *ctx, dt_gen_run *r) {
    klein_request *k = ctx;
    klein_state *s = k->s;
    const dt_gen_params *g = r->g;
    const int T = g->max_seq_len;
    dt_gen_log_encoding(g, T, s->taps, s->n_taps, r->cfg,
                        k->keep_pos && k->keep_neg ? ": the previous request's features" : "");
    if (!k->keep_pos && encode_prompt(r->p, 0, g->prompt, T, r->obs, r->ud)) return -1;
    if (!k->keep_neg && encode_prompt(r->p, 1, g->negative_prompt, T, NULL, NULL)) return -1;
    dt_family_release_text_encoder(r->p, &s->te);
    return 0;
}

static int klein_load_models(void *ctx, dt_gen_run *r) {
    klein_request *k = ctx;
    if (ensure_dit_vae(r->p)) return -1;
    r->dit = k->s->dit;
    return 0;
}

/* The editing inputs encoded (prepared before the text encoder ran; the previous request's reference tokens when
 * the images are the same), then the size and the packed grid [C, h, w] the noise is drawn in. */
static int klein_geometry(void *ctx, dt_gen_run *r) {
    klein_request *k = ctx;
    klein_state *s = k->s;
    klein_edit *ed = &k->ed;
    const dt_vae_config *vc = dt_vae_get_config(s->vae);
    const flux2_config *c = flux2_dit_config(s->dit);
    const int mult = vc->scale_factor * vc->patch, C = c->in_channels;
    if (k->edit) {
        double ti = dt_now();
        k->ref_hit = k->cacheable && klein_ref_cache_matches(&s->refc, ed);
        if (k->ref_hit) {   /* the previous request's references: their tokens, no VAE encoder */
            ed->r = s->refc.r;
            r->tm->refs_cached = 1;
        } else {
            if (k->cacheable) {
                klein_ref_cache_set_images(&s->refc, ed);   /* (the DiT's references are no longer refc's) */
                s->dit_refs_valid = 0;
            }
            if (klein_edit_encode(s->vae, C, ed)) {
                if (k->cacheable) klein_ref_cache_clear(&s->refc);
                return -1;
            }
            if (k->cacheable) klein_ref_cache_set_tokens(&s->refc, ed, C);
        }
        r->tm->t_images += dt_now() - ti;
        dt_log(1, "ditrun: %d reference tokens%s%s (%.2f s)\n", ed->r, k->inpaint ? ", inpainting" : "",
               k->ref_hit ? ", the previous request's" : "", r->tm->t_images);
        if (k->inpaint && r->p->info.kv_refs)
            dt_log(1, "ditrun: note: inpainting follows Flux2KleinInpaintPipeline (references appended, not KV-cached)\n");
        dt_gen_observe(r->obs, r->ud, "ref_latents_packed", ed->ref_tok, 3, 1, ed->r, C, 0);
        dt_gen_observe(r->obs, r->ud, "ref_ids", ed->ref_ids, 3, 1, ed->r, 4, 0);
    }
    r->H = ed->H;
    r->W = ed->W;
    k->h = r->H / mult;
    k->w = r->W / mult;
    k->N = k->h * k->w;
    k->C = C;
    k->T = r->g->max_seq_len;
    r->nc = C;
    r->nh = k->h;
    r->nw = k->w;
    r->N = k->N;
    r->C = C;
    snprintf(r->layout, sizeof r->layout, "[1, %d, %d, %d] for a %dx%d image", C, k->h, k->w, r->W, r->H);
    return 0;
}

/* noise [C, h, w] (packed, normalized latent space) -> tokens [N, C]; positions of the image and text tokens. */
static void klein_pack(void *ctx, dt_gen_run *r, const float *noise, float *x) {
    klein_request *k = ctx;
    (void)r;
    dt_latents_pack(noise, k->C, k->h, k->w, x);
    k->img_ids = dt_malloc(sizeof(float) * (size_t)k->N * 4);
    k->txt_ids = dt_malloc(sizeof(float) * (size_t)k->T * 4);
    dt_latents_img_ids(k->h, k->w, 0.0f, k->img_ids);
    dt_latents_txt_ids(k->T, k->txt_ids);
}

/* The klein schedule, its shift from the noise tokens only. */
static int klein_schedule(void *ctx, dt_gen_run *r, float *sigmas, float *timesteps) {
    klein_request *k = ctx;
    return dt_schedule_make(&k->s->sched, r->g->steps, k->N, sigmas, timesteps);
}

/* Inpainting's first kept step and its noise mix; the prompt features and reference tokens onto the DiT; the
 * model callback. */
static int klein_sampler(void *ctx, dt_gen_run *r, float *x, dt_sampler *sm) {
    klein_request *k = ctx;
    klein_state *s = k->s;
    const dt_gen_params *g = r->g;
    const int N = k->N, C = k->C;
    k->timesteps = sm->timesteps;
    k->sigmas = sm->sigmas;
    /* inpainting: the strength's steps; the noise mixed with the init latents at the first kept sigma */
    int first = 0, run = g->steps;
    if (k->inpaint) {
        if (dt_inpaint_steps(g->steps, g->strength, &first, &run)) return -1;
        k->noise = dt_malloc(sizeof(float) * (size_t)N * C);
        memcpy(k->noise, x, sizeof(float) * (size_t)N * C);
        dt_scale_noise(x, k->ed.init_tok, k->noise, (size_t)N * C, sm->sigmas[first]);
        r->tm->steps = run;
    }
    k->last = first + run - 1;
    /* the prompt features and the reference tokens stay on the device for all steps (KV-cached references for
     * Flux2KleinKVPipeline; inpainting follows Flux2KleinInpaintPipeline, which appends them) */
    if (dt_dit_text_resident_mat(s->dit, 0, s->txt[0]) || (r->cfg && dt_dit_text_resident_mat(s->dit, 1, s->txt[1])))
        return -1;
    /* references: a cacheable request's stay in the DiT for the next one (not with a split DiT); the DiT drops kept
     * ones before a request without them or with others */
    const klein_edit *ed = &k->ed;
    const int kv = r->p->info.kv_refs && !k->inpaint, keep_refs = k->cacheable && flux2_dit_whole(s->dit);
    if (ed->r) {
        if (!(k->ref_hit && keep_refs && s->dit_refs_valid)) {
            s->dit_refs_valid = 0;
            if (set_refs(s, k->ref_hit ? s->refc.tok : ed->ref_tok, k->ref_hit ? s->refc.ids : ed->ref_ids, ed->r, kv))
                return -1;
            s->dit_refs = 1;
            s->dit_refs_valid = keep_refs;
        }
        k->refs_set = !keep_refs;
    } else if (s->dit_refs) {
        drop_refs(s);
    }
    sm->steps = run;
    sm->first = first;
    sm->rule = DT_CFG_FROM_UNCOND;
    sm->predict = klein_predict;
    /* the guidance batch (--guidance-batch on) where the DiT runs it: not split over ranks, no KV-cached references
     * (their cached keys sit behind one sequence's rows); the sampler runs two passes under a step cache */
    if (r->cfg && r->p->opts.guidance_batch) {
        if (!dt_dit_can_pair(s->dit))
            dt_log(2, "ditrun: guidance batch: two passes per step (the transformer is split over ranks)\n");
        else if (ed->r && kv)
            dt_log(2, "ditrun: guidance batch: two passes per step (KV-cached references)\n");
        else
            sm->predict_pair = klein_predict_pair;
    }
    sm->after_step = k->inpaint ? klein_restore : NULL;
    sm->ctx = k;
    return 0;
}

/* A request's own references leave the DiT after its loop. */
static void klein_sampled(void *ctx, dt_gen_run *r, int rc) {
    klein_request *k = ctx;
    (void)r;
    (void)rc;
    if (k->refs_set) drop_refs(k->s);
    k->refs_set = 0;
}

/* tokens [N, C] -> unpack, batch-norm de-normalization, unpatchify [lc, 2h, 2w] -> the VAE decoder. */
static int klein_decode(void *ctx, dt_gen_run *r, const float *x, float *img, uint8_t *rgb) {
    klein_request *k = ctx;
    klein_state *s = k->s;
    const int C = k->C, N = k->N, h = k->h, w = k->w;
    const dt_vae_config *vc = dt_vae_get_config(s->vae);
    float *lat_c = dt_malloc(sizeof(float) * (size_t)C * N), *lat_u = dt_malloc(sizeof(float) * (size_t)C * N);
    dt_latents_unpack(x, C, h, w, lat_c);
    const float *bn_mean, *bn_var;
    int bn_n;
    float bn_eps;
    dt_vae_bn_stats(s->vae, &bn_mean, &bn_var, &bn_n, &bn_eps);
    dt_latents_bn_denorm(lat_c, C, N, bn_mean, bn_var, bn_eps);
    const int lc = vc->latent_channels;
    dt_latents_unpatchify(lat_c, lc, h, w, lat_u);
    dt_gen_observe(r->obs, r->ud, "latents_unpacked", lat_u, 4, 1, lc, 2 * h, 2 * w);
    int rc = img ? dt_vae_decode(s->vae, lat_u, 2 * h, 2 * w, img) : dt_vae_decode_rgb8(s->vae, lat_u, 2 * h, 2 * w, rgb);
    free(lat_c);
    free(lat_u);
    return rc;
}

static void klein_finish(void *ctx, dt_gen_run *r, int rc) {
    klein_request *k = ctx;
    klein_state *s = k->s;
    (void)r;
    if (k->refs_set || (rc != 0 && s->dit_refs)) drop_refs(s);   /* (a failed or cancelled request keeps none) */
    klein_edit_free(&k->ed);
    free(k->img_ids);
    free(k->txt_ids);
    free(k->noise);
}

static const dt_gen_hooks klein_hooks = {
    .prepare = klein_prepare, .load_text = klein_load_text, .encode = klein_encode, .load_models = klein_load_models,
    .geometry = klein_geometry, .pack = klein_pack, .schedule = klein_schedule, .sampler = klein_sampler,
    .sampled = klein_sampled, .decode = klein_decode, .finish = klein_finish,
};

static int klein_generate(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                          dt_gen_observer obs, void *ud) {
    klein_request k = {.s = p->fam};
    return dt_generate_run(p, g, &klein_hooks, &k, rgb, w, h, tm, obs, ud);
}

/* The memory planner's FLUX.2 part (dt_family.place_sizes): the DiT's widths, the FLUX.2 VAE's decode. */
static int klein_place_sizes(const json *cfg, const char *tr, const char *va, int W, int H, int tile, int elem,
                             dt_family_place *o) {
    flux2_config c;
    dt_vae_config fv;
    if (flux2_config_parse(cfg, tr, &c) || dt_vae_read_config(va, &fv)) return -1;
    o->hidden = c.hidden;
    o->mlp = c.mlp_hidden;
    o->head_dim = c.head_dim;
    dt_family_place_vae(&fv, W, H, tile, elem, o);
    o->side_queue = 1;
    return 0;
}

static const char *const klein_pipelines[] = {"Flux2KleinPipeline", "Flux2KleinKVPipeline", NULL};
static const char *const klein_transformers[] = {"Flux2Transformer2DModel", NULL};
static const char *const klein_presets[] = {"klein-4b", "klein-9b", "tiny", NULL};

const dt_family dt_family_klein = {
    .name = "flux2-klein", .title = "FLUX.2", .pipeline_classes = klein_pipelines,
    .transformer_classes = klein_transformers, .presets = klein_presets, .is_config = flux2_config_is_flux2,
    .infers_config = 1, .fp8 = 1, .guidance_batch = 1, .load = klein_load, .free = klein_free, .generate = klein_generate,
    .sequence_parallel = 1, .dit_load = flux2_dit_load, .describe = flux2_config_describe, .synth = dt_synth_flux2,
    .read_inputs = flux2_dit_read_inputs, .place_sizes = klein_place_sizes,
};
