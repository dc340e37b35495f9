/* family_steps.c — the steps of a request the families share (family.h): observing tensors, the request's noise
 * (given values or a noise file's in.initial_latents, else seeded), the VAE image as 8-bit RGB, cancellation, the
 * text encoder's lifetime and its log line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "models/qwen3.h"
#include "models/vae_flux2.h"   /* dt_vae_postprocess: diffusers image post-processing */
#include "pipeline/family.h"
#include "pipeline/latents.h"

void dt_gen_observe(dt_gen_observer obs, void *ud, const char *name, const float *d, int ndim, int64_t d0, int64_t d1,
                    int64_t d2, int64_t d3) {
    if (!obs) return;
    int64_t shape[4] = {d0, d1, d2, d3};
    obs(ud, name, d, ndim, shape);
}

/* 1 when every value is finite; else -1 naming the first other one (a NaN or infinity would make the whole image NaN). */
static int noise_finite(const float *x, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            dt_set_error("%s: initial noise value %lld is %g; it must be finite", what, (long long)i, (double)x[i]);
            return -1;
        }
    return 1;
}

int dt_gen_read_noise(const dt_gen_params *g, float *out, int64_t n, const char *layout) {
    if (g->noise) {
        if (g->noise_len != n) {
            dt_set_error("generate: the noise has %lld values, this image needs %lld (%s)", (long long)g->noise_len,
                         (long long)n, layout);
            return -1;
        }
        memcpy(out, g->noise, sizeof(float) * (size_t)n);
        return noise_finite(out, n, "the given noise");
    }
    if (!g->noise_file) return 0;
    st_file *nf = st_open(g->noise_file);
    if (!nf) return -1;
    const st_tensor *t = st_find(nf, "in.initial_latents");
    if (!t || t->numel != n) {
        dt_set_error("%s: need in.initial_latents with %lld values (%s)", g->noise_file, (long long)n, layout);
        st_close(nf);
        return -1;
    }
    float *f = st_to_f32(t);
    memcpy(out, f, sizeof(float) * (size_t)n);
    free(f);
    st_close(nf);
    return noise_finite(out, n, g->noise_file);
}

int dt_gen_noise(const dt_gen_params *g, float *out, int c, int h, int w, const char *layout) {
    int have = dt_gen_read_noise(g, out, (int64_t)c * h * w, layout);
    if (have < 0) return -1;
    if (!have) dt_latents_noise(g->seed, c, h, w, out);
    return 0;
}

uint8_t *dt_gen_image_rgb(const float *img, int H, int W, dt_gen_observer obs, void *ud) {
    float *img01 = obs ? dt_malloc(sizeof(float) * 3 * (size_t)H * W) : NULL;
    uint8_t *rgb = dt_malloc(3 * (size_t)H * W);
    dt_vae_postprocess(img, H, W, img01, rgb);
    if (img01) dt_gen_observe(obs, ud, "image_float", img01, 4, 1, H, W, 3);
    free(img01);
    return rgb;
}

void dt_gen_log_encoding(const dt_gen_params *g, int T, const int *taps, int n_taps, int cfg, const char *note) {
    const int lv = g->progress ? 2 : 1;   /* callers with a progress callback report themselves */
    dt_log(lv, "ditrun: encoding the prompt (%d tokens, taps", T);
    for (int i = 0; i < n_taps; i++) dt_log(lv, "%s%d", i ? "," : " ", taps[i]);
    dt_log(lv, ")%s%s\n", cfg ? " and the negative prompt" : "", note);
}

dt_dit_load_opts dt_family_dit_opts(const dt_pipeline *p) {
    const dt_pipeline_opts *o = &p->opts;
    return (dt_dit_load_opts){.loras = o->loras, .n_loras = o->n_loras, .lora_side = o->lora_side,
                              .ranks = o->sequence_parallel, .devices = o->sp_devices, .n_devices = o->n_sp_devices,
                              .cuda_graph = o->cuda_graph, .precision = o->precision,
                              .attn_precision = o->attn_precision, .fp8_unfused = o->fp8_unfused};
}

int dt_family_ensure_text_encoder(dt_pipeline *p, const char *dir, int max_tap, dt_qwen3 **te) {
    if (*te) return 0;
    *te = dt_qwen3_load(p->be, dir, max_tap > 0 ? max_tap : 1);
    if (!*te) return -1;
    dt_qwen3_set_inv_freq_bf16(*te, p->opts.te_inv_freq_bf16);
    return 0;
}

void dt_family_release_text_encoder(dt_pipeline *p, dt_qwen3 **te) {
    if (p->opts.release_text_encoder && *te) {
        dt_qwen3_free(*te);
        *te = NULL;
    }
}

int dt_gen_cancelled(const dt_gen_params *g) {
    if (g->cancel && __atomic_load_n(g->cancel, __ATOMIC_RELAXED)) {
        dt_set_error("generate: cancelled");
        return 1;
    }
    return 0;
}
