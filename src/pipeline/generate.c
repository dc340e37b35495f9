/* generate.c — the FLUX.2-klein text-to-image pipeline on one backend (spec section 2):
 * chat-template tokens -> Qwen3 hidden-state taps -> seeded noise in packed latent space ->
 * Euler steps over the DiT with the klein schedule (CFG with the empty prompt for base models) ->
 * unpack, batch-norm de-normalization, unpatchify -> VAE decoder -> 8-bit RGB.
 * Components are loaded one after the other and the text encoder is freed before the DiT loads,
 * so peak memory is the larger of the two, not their sum. */
#include "generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/flux2.h"
#include "models/flux2_layouts.h"
#include "models/qwen3.h"
#include "models/vae_flux2.h"
#include "pipeline/latents.h"
#include "pipeline/scheduler.h"
#include "pipeline/tokenizer.h"

void dt_gen_params_default(dt_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->negative_prompt = "";
    p->height = p->width = 1024;
    p->seed = 0;
    p->guidance = -1;
    p->max_seq_len = 512;
}

static void observe(dt_gen_observer obs, void *ud, const char *name, const float *d, int ndim, int64_t d0, int64_t d1,
                    int64_t d2, int64_t d3) {
    if (!obs) return;
    int64_t shape[4] = {d0, d1, d2, d3};
    obs(ud, name, d, ndim, shape);
}

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = dt_malloc(n);
    snprintf(s, n, "%s/%s", a, b);
    return s;
}

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

/* Default taps: the reference's (9, 18, 27) for Qwen3's 36 layers, i.e. k·L/(n+1) for k = 1..n,
 * where n = joint_attention_dim / text hidden size (the number of taps the DiT expects). */
static int default_taps(int layers, int n, int *taps) {
    for (int k = 1; k <= n; k++) {
        taps[k - 1] = k * layers / (n + 1);
        if (taps[k - 1] < 1) taps[k - 1] = 1;
    }
    return n;
}

/* Encode one prompt to [T, n_taps * hidden] features. */
static float *encode_prompt(dt_qwen3 *te, const dt_tokenizer *tok, const char *prompt, int T, const int *taps, int n_taps,
                            int hidden, dt_gen_observer obs, void *ud, int observe_ids) {
    int32_t *ids = dt_malloc(sizeof(int32_t) * T), *mask = dt_malloc(sizeof(int32_t) * T);
    float *emb = NULL;
    int real = dt_tokenize_chat(tok, prompt, T, ids, mask);
    if (real < 0) goto out;
    if (real == T) dt_log(1, "ditrun: note: the prompt fills all %d text tokens (it may have been truncated)\n", T);
    if (observe_ids && obs) {
        float *f = dt_malloc(sizeof(float) * T);
        for (int i = 0; i < T; i++) f[i] = (float)ids[i];
        observe(obs, ud, "input_ids", f, 2, 1, T, 0, 0);
        for (int i = 0; i < T; i++) f[i] = (float)mask[i];
        observe(obs, ud, "attention_mask", f, 2, 1, T, 0, 0);
        free(f);
    }
    emb = dt_malloc(sizeof(float) * (size_t)T * n_taps * hidden);
    if (dt_qwen3_encode(te, ids, mask, T, taps, n_taps, emb)) { free(emb); emb = NULL; }
out:
    free(ids);
    free(mask);
    return emb;
}

static int read_dit_config(const char *root, flux2_config *fc) {
    char *cfg_path = join(root, "transformer/config.json");
    int rc = -1;
    if (exists(cfg_path)) {
        json *j = json_parse_file(cfg_path);
        rc = j ? flux2_config_parse(j, cfg_path, fc) : -1;
        json_free(j);
    } else {
        char *dir = join(root, "transformer");
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

int dt_generate(dt_backend *be, const dt_gen_params *p, uint8_t **rgb_out, int *w_out, int *h_out, dt_gen_timings *tm,
                dt_gen_observer obs, void *ud) {
    dt_gen_timings tl;
    if (!tm) tm = &tl;
    memset(tm, 0, sizeof *tm);
    double t_start = dt_now(), t0 = t_start;
    int rc = -1;
    char *idx_path = join(p->model, "model_index.json"), *tok_dir = join(p->model, "tokenizer"),
         *te_dir = join(p->model, "text_encoder"), *vae_dir = join(p->model, "vae"), *sch_dir = join(p->model, "scheduler");
    dt_tokenizer *tok = NULL;
    dt_qwen3 *te = NULL;
    flux2_model *dit = NULL;
    dt_vae *vae = NULL;
    float *pos = NULL, *neg = NULL, *x = NULL, *v = NULL, *vneg = NULL, *img_ids = NULL, *txt_ids = NULL, *lat = NULL,
          *lat_c = NULL, *lat_u = NULL, *img = NULL, *img01 = NULL, *sigmas = NULL, *timesteps = NULL;
    uint8_t *rgb = NULL;

    if (!p->prompt) { dt_set_error("generate: a prompt is required"); goto done; }
    if (!exists(p->model)) { dt_set_error("%s: no such model folder", p->model); goto done; }
    /* model_index.json: distilled or not (CFG) */
    int distilled = 0;
    if (exists(idx_path)) {
        json *idx = json_parse_file(idx_path);
        if (!idx) goto done;
        distilled = json_get_bool(idx, "is_distilled", 0);
        json_free(idx);
    } else {
        dt_set_error("%s: missing (generate needs a pipeline root with model_index.json, tokenizer/, text_encoder/, "
                     "transformer/, vae/, scheduler/)", idx_path);
        goto done;
    }
    int steps = p->steps > 0 ? p->steps : distilled ? 4 : 50;
    float guidance = p->guidance >= 0 ? p->guidance : 4.0f;
    int cfg = !distilled && guidance > 1.0f;
    if (distilled && p->guidance >= 0 && p->guidance != 1.0f)
        dt_log(1, "ditrun: note: guidance is ignored by distilled models (is_distilled in model_index.json)\n");
    if (steps > 1000) { dt_set_error("generate: --steps %d is too many (max 1000)", steps); goto done; }

    /* ---- text: tokenizer + Qwen3 taps ---- */
    tok = dt_tokenizer_load(tok_dir);
    if (!tok) goto done;
    int T = p->max_seq_len > 0 ? p->max_seq_len : 512;
    /* the DiT's joint_attention_dim tells how many taps it expects: read its config first (or infer
     * it from the tensor shapes for layouts shipped without config.json, e.g. mflux) */
    flux2_config fc;
    if (read_dit_config(p->model, &fc)) goto done;
    dt_qwen3_config tcfg;   /* geometry first: only the layers the taps need are loaded below */
    if (dt_qwen3_read_config(te_dir, &tcfg)) goto done;
    const dt_qwen3_config *tc = &tcfg;
    int hidden = tc->hidden, layers = tc->num_layers;
    int taps[DT_GEN_MAX_TAPS], n_taps = p->n_taps;
    if (n_taps) memcpy(taps, p->taps, sizeof(int) * n_taps);
    else {
        if (fc.joint_dim % hidden || fc.joint_dim / hidden > DT_GEN_MAX_TAPS) {
            dt_set_error("%s: joint_attention_dim %d is not a multiple of the text encoder's hidden size %d",
                         p->model, fc.joint_dim, hidden);
            goto done;
        }
        n_taps = default_taps(layers, fc.joint_dim / hidden, taps);
    }
    int max_tap = 0;
    for (int i = 0; i < n_taps; i++) {
        if (taps[i] < 0 || taps[i] > layers) { dt_set_error("generate: text-encoder layer %d out of range 0..%d", taps[i], layers); goto done; }
        if (taps[i] > max_tap) max_tap = taps[i];
    }
    if (n_taps * hidden != fc.joint_dim) {
        dt_set_error("generate: %d taps x hidden %d = %d features, but the transformer expects joint_attention_dim %d",
                     n_taps, hidden, n_taps * hidden, fc.joint_dim);
        goto done;
    }
    te = dt_qwen3_load(be, te_dir, max_tap > 0 ? max_tap : 1);
    if (!te) goto done;
    dt_qwen3_set_inv_freq_bf16(te, p->te_inv_freq_bf16);
    tm->t_load += dt_now() - t0;
    t0 = dt_now();
    dt_log(1, "ditrun: encoding the prompt (%d tokens, taps", T);
    for (int i = 0; i < n_taps; i++) dt_log(1, "%s%d", i ? "," : " ", taps[i]);
    dt_log(1, ")%s\n", cfg ? " and the negative prompt" : "");
    pos = encode_prompt(te, tok, p->prompt, T, taps, n_taps, hidden, obs, ud, 1);
    if (!pos) goto done;
    observe(obs, ud, "prompt_embeds", pos, 3, 1, T, (int64_t)n_taps * hidden, 0);
    if (cfg && !(neg = encode_prompt(te, tok, p->negative_prompt ? p->negative_prompt : "", T, taps, n_taps, hidden, NULL, NULL, 0)))
        goto done;
    dt_qwen3_free(te);
    te = NULL;
    tm->t_encode = dt_now() - t0;
    t0 = dt_now();

    /* ---- DiT + VAE ---- */
    dit = flux2_load(be, p->model);
    if (!dit) goto done;
    flux2_set_graph(dit, p->cuda_graph);
    vae = dt_vae_load(be, vae_dir);
    if (!vae) goto done;
    tm->t_load += dt_now() - t0;
    const dt_vae_config *vc = dt_vae_get_config(vae);
    const flux2_config *c = flux2_get_config(dit);
    int mult = vc->scale_factor * vc->patch;    /* 16 for FLUX.2: VAE x8, then 2x2 patches */
    if (c->in_channels != vc->latent_channels * vc->patch * vc->patch) {
        dt_set_error("%s: transformer in_channels %d != VAE latent channels %d x patch %d^2", p->model, c->in_channels,
                     vc->latent_channels, vc->patch);
        goto done;
    }
    int H = p->height / mult * mult, W = p->width / mult * mult;
    if (H <= 0 || W <= 0) { dt_set_error("generate: image size %dx%d is smaller than %d pixels", p->width, p->height, mult); goto done; }
    if (H != p->height || W != p->width)
        dt_log(1, "ditrun: warning: size %dx%d rounded down to %dx%d (multiples of %d)\n", p->width, p->height, W, H, mult);
    int h = H / mult, w = W / mult, C = c->in_channels, N = h * w;
    tm->height = H; tm->width = W; tm->steps = steps;

    /* ---- noise (packed, normalized latent space) ---- */
    lat = dt_malloc(sizeof(float) * (size_t)C * N);
    if (p->noise_file) {
        st_file *nf = st_open(p->noise_file);
        if (!nf) goto done;
        const st_tensor *t = st_find(nf, "in.initial_latents");
        if (!t || t->numel != (int64_t)C * N) {
            dt_set_error("%s: need in.initial_latents with %d x %d x %d values for a %dx%d image", p->noise_file, C, h, w, W, H);
            st_close(nf);
            goto done;
        }
        float *f = st_to_f32(t);
        memcpy(lat, f, sizeof(float) * (size_t)C * N);
        free(f);
        st_close(nf);
    } else {
        dt_latents_noise(p->seed, C, h, w, lat);
    }
    x = dt_malloc(sizeof(float) * (size_t)N * C);
    dt_latents_pack(lat, C, h, w, x);
    img_ids = dt_malloc(sizeof(float) * (size_t)N * 4);
    txt_ids = dt_malloc(sizeof(float) * (size_t)T * 4);
    if (c->n_axes != 4) { dt_set_error("%s: the pipeline needs 4 RoPE axes, the transformer has %d", p->model, c->n_axes); goto done; }
    dt_latents_img_ids(h, w, 0.0f, img_ids);
    dt_latents_txt_ids(T, txt_ids);

    /* ---- schedule ---- */
    dt_sched_config sc;
    if (exists(sch_dir)) { if (dt_sched_config_load(sch_dir, &sc)) goto done; }
    else dt_sched_config_default(&sc);
    sigmas = dt_malloc(sizeof(float) * (steps + 1));
    timesteps = dt_malloc(sizeof(float) * steps);
    if (dt_schedule_make(&sc, steps, N, sigmas, timesteps)) goto done;
    observe(obs, ud, "sigmas", sigmas, 1, steps + 1, 0, 0, 0);
    observe(obs, ud, "timesteps", timesteps, 1, steps, 0, 0, 0);

    /* ---- denoising loop ---- */
    v = dt_malloc(sizeof(float) * (size_t)N * C);
    if (cfg) vneg = dt_malloc(sizeof(float) * (size_t)N * C);
    int bf16 = be->act_dtype == DT_BF16;
    double td = dt_now();
    /* the prompt features stay on the device for all steps */
    if (T > 0 && flux2_text_resident(dit, pos, T)) goto done;
    if (T > 0 && cfg && flux2_text_resident(dit, neg, T)) goto done;
    for (int i = 0; i < steps; i++) {
        double ts0 = dt_now();
        /* the pipeline passes timestep/1000; in bf16 pipelines t is rounded to bf16 first */
        float t_in = bf16 ? dt_bf16_round(dt_bf16_round(timesteps[i]) / 1000.0f) : timesteps[i] / 1000.0f;
        if (flux2_forward(dit, x, N, pos, T, t_in, img_ids, txt_ids, v, NULL, NULL)) goto done;
        if (cfg) {
            if (flux2_forward(dit, x, N, neg, T, t_in, img_ids, txt_ids, vneg, NULL, NULL)) goto done;
            for (size_t k = 0; k < (size_t)N * C; k++) v[k] = vneg[k] + guidance * (v[k] - vneg[k]);
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
    flux2_text_resident(dit, NULL, 0);

    /* ---- latents -> image ---- */
    double tdec = dt_now();
    lat_c = dt_malloc(sizeof(float) * (size_t)C * N);
    dt_latents_unpack(x, C, h, w, lat_c);
    const float *bn_mean, *bn_var;
    int bn_n;
    float bn_eps;
    dt_vae_bn_stats(vae, &bn_mean, &bn_var, &bn_n, &bn_eps);
    if (bn_n != C) { dt_set_error("%s: VAE batch-norm has %d channels, the latents %d", p->model, bn_n, C); goto done; }
    dt_latents_bn_denorm(lat_c, C, N, bn_mean, bn_var, bn_eps);
    int lc = vc->latent_channels;
    lat_u = dt_malloc(sizeof(float) * (size_t)C * N);
    dt_latents_unpatchify(lat_c, lc, h, w, lat_u);
    observe(obs, ud, "latents_unpacked", lat_u, 4, 1, lc, 2 * h, 2 * w);
    img = dt_malloc(sizeof(float) * 3 * (size_t)H * W);
    if (dt_vae_decode(vae, lat_u, 2 * h, 2 * w, img)) goto done;
    img01 = dt_malloc(sizeof(float) * 3 * (size_t)H * W);
    rgb = dt_malloc(3 * (size_t)H * W);
    dt_vae_postprocess(img, H, W, img01, rgb);
    observe(obs, ud, "image_float", img01, 4, 1, H, W, 3);
    tm->t_decode = dt_now() - tdec;
    tm->t_total = dt_now() - t_start;
    dt_log(1, "ditrun: %dx%d, %d steps: load %.2f s, encode %.2f s, denoise %.2f s (%.3f s/step), decode %.2f s, total %.2f s\n",
           W, H, steps, tm->t_load, tm->t_encode, tm->t_denoise, tm->t_denoise / steps, tm->t_decode, tm->t_total);
    *rgb_out = rgb;
    rgb = NULL;
    *w_out = W;
    *h_out = H;
    rc = 0;
done:
    if (tok) dt_tokenizer_free(tok);
    if (te) dt_qwen3_free(te);
    if (dit) flux2_free(dit);
    if (vae) dt_vae_free(vae);
    free(pos); free(neg); free(x); free(v); free(vneg); free(img_ids); free(txt_ids); free(lat); free(lat_c);
    free(lat_u); free(img); free(img01); free(sigmas); free(timesteps); free(rgb);
    free(idx_path); free(tok_dir); free(te_dir); free(vae_dir); free(sch_dir);
    return rc;
}
