/* test_vae_tiling.c — tiled VAE decoding and encoding (models/vae_tiling.h, diffusers' enable_tiling) on the bundled
 * tiny VAEs (FLUX.2: tests/fixtures/model/vae, Qwen-Image: tests/fixtures/krea2/vae; both upsample by 4), with a
 * small tile so that test sizes make many tiles:
 *   - the tile semantics, exactly: the first tile's kept block is its own decode, the rows under it and the columns
 *     beside it are diffusers' linear blend (blend_v, blend_h) of the neighbouring tiles' own decodes;
 *   - the tiled decode against the untiled one (stated and bounded: the seams are diffusers' approximation);
 *   - an image no larger than a tile decodes exactly as without tiling; bad tile sizes are refused;
 *   - the FLUX.2 encoder tiled (its first tile exact, the whole close to the untiled encode);
 *   - the whole pipeline with the typed option (and its error before loading anything);
 *   - diffusers' own tiled decode when tests/fixtures/vae_tiling_reference.safetensors exists
 *     (tools/vae_tiling_reference.py writes it);
 *   - CUDA tiled against CPU tiled when a GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "io/safetensors.h"
#include "models/vae_flux2.h"
#include "models/vae_qwenimage.h"
#include "pipeline/engine.h"
#include "pipeline/latents.h"
#include "pipeline/placement.h"
#include "test.h"

#define S 4          /* both tiny VAEs: image pixels per latent pixel */
#define TILE 64      /* pixels: latent tile 16, stride 12 latent (48 px), blend 16 px, 48 px kept per tile */
#define LH 40        /* latent rows and columns of the test: 4 x 3 tiles, the last ones partial (4 latent rows) */
#define LW 28
/* The blend checks recompute diffusers' a·(1 - y/e) + b·(y/e) from the tiles' own decodes in double: only the
 * f32 rounding of the weights, the products and the sum differs (values ~1, 3 roundings of 2^-24). */
#define TOL_BLEND 1e-6
/* Tiled vs untiled, random-weight tiny VAEs on Gaussian latents: every tile runs the mid-block attention over its
 * own tokens only (the untiled one over the whole image) and sees zero padding at its edges, so every pixel moves,
 * not only the seams (a trained VAE is far more local). Measured on the CPU: FLUX.2 rel L2 0.23, Qwen-Image 0.22
 * (printed below); the bound says "the same picture, blended", the exact checks above pin the semantics. */
#define TOL_TILED_VS_UNTILED 0.35
/* The FLUX.2 encoder tiled (image tile 64 px, latent 16): measured rel L2 0.22 against the untiled encode. */
#define TOL_ENC_TILED 0.35
/* The whole tiny pipeline at 96x128 with 32 px tiles (8 latent: attention over 64 tokens, 20 tiles): measured mean
 * |diff| 18.7 of 255 levels from the untiled image, for the reasons of TOL_TILED_VS_UNTILED. */
#define TOL_PIPELINE_MEAN_LEVELS 32
/* diffusers' tiled decode in float32 on the CPU vs ours: the same tiles and blend, only summation order differs
 * (as test_vae's TOL_CPU). */
#define TOL_REFERENCE 1e-4
/* The planner's activation bytes: the same buffers the decoder allocates (the CPU backend counts them), so only
 * what the estimate leaves out (an op's small temporaries) may differ. */
#define TOL_ACT_BYTES 0.02
/* CUDA runs activations in bf16 through ~20 layers (test_vae's TOL_CUDA). */
#define TOL_CUDA 2e-2

static char path_buf[1024];
static const char *fx(const char *rel) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", t_fixtures(), rel);
    return path_buf;
}

/* dst [C, h, w] = src [C, H, W] rows y0.., columns x0.. */
static void crop(const float *src, int C, int H, int W, int y0, int x0, int h, int w, float *dst) {
    for (int c = 0; c < C; c++)
        for (int y = 0; y < h; y++)
            memcpy(dst + ((size_t)c * h + y) * w, src + ((size_t)c * H + y0 + y) * W + x0, sizeof(float) * w);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;   /* NaN too */
    }
    return m;
}

/* A VAE decoder of either family behind one face. */
typedef struct {
    const char *tag;
    dt_vae *f;
    dt_qvae *q;
    int C;   /* latent channels */
} vae;

static int set_tiling(vae *v, int on, int tile) {
    return v->f ? dt_vae_set_tiling(v->f, on, tile) : dt_qvae_set_tiling(v->q, on, tile);
}
static int decode(vae *v, const float *lat, int h, int w, float *rgb) {
    return v->f ? dt_vae_decode(v->f, lat, h, w, rgb) : dt_qvae_decode(v->q, lat, h, w, rgb);
}
static int decode8(vae *v, const float *lat, int h, int w, uint8_t *rgb8) {
    return v->f ? dt_vae_decode_rgb8(v->f, lat, h, w, rgb8) : dt_qvae_decode_rgb8(v->q, lat, h, w, rgb8);
}
static int last_tiled(const vae *v) { return v->f ? dt_vae_last_tiled(v->f) : dt_qvae_last_tiled(v->q); }

static int vae_open(vae *v, dt_backend *be, const char *tag, const char *dir) {
    memset(v, 0, sizeof *v);
    v->tag = tag;
    if (!strcmp(tag, "flux2")) {
        v->f = dt_vae_load(be, dir);
        v->C = v->f ? dt_vae_get_config(v->f)->latent_channels : 0;
    } else {
        v->q = dt_qvae_load(be, dir);
        v->C = v->q ? dt_qvae_get_config(v->q)->z_dim : 0;
    }
    return v->f || v->q ? 0 : -1;
}
static void vae_close(vae *v) {
    dt_vae_free(v->f);
    dt_qvae_free(v->q);
}

/* The untiled decode of latent rows y0.., columns x0.. (h x w latent pixels): one tile on its own. */
static float *decode_region(vae *v, const float *lat, int y0, int x0, int h, int w) {
    float *sub = malloc(sizeof(float) * v->C * h * w), *out = malloc(sizeof(float) * 3 * h * w * S * S);
    crop(lat, v->C, LH, LW, y0, x0, h, w, sub);
    set_tiling(v, 0, 0);
    int rc = decode(v, sub, h, w, out);
    free(sub);
    if (rc) { free(out); return NULL; }
    return out;
}

/* Tiled decode checks of one VAE on the CPU; returns the tiled image [3, LH·S, LW·S] (malloc'd) or NULL. */
static float *check_decoder(vae *v, const float *lat) {
    char name[128];
    const int H = LH * S, W = LW * S, T = TILE, Tl = T / S, st = Tl - Tl / 4, B = T / 4, keep = T - B;
    const size_t n = (size_t)3 * H * W;
    float *full = malloc(sizeof(float) * n), *tiled = malloc(sizeof(float) * n), *tmp = malloc(sizeof(float) * n);
    snprintf(name, sizeof name, "%s_untiled", v->tag);
    set_tiling(v, 0, 0);
    double t0 = dt_now();
    int rc = decode(v, lat, LH, LW, full);
    double t_full = dt_now() - t0;
    T_CHECK(name, rc == 0 && !last_tiled(v), "rc %d tiled %d: %s", rc, last_tiled(v), dt_last_error());
    snprintf(name, sizeof name, "%s_tiled", v->tag);
    set_tiling(v, 1, T);
    t0 = dt_now();
    rc = decode(v, lat, LH, LW, tiled);
    double t_tiled = dt_now() - t0;
    T_CHECK(name, rc == 0 && last_tiled(v), "rc %d tiled %d: %s", rc, last_tiled(v), dt_last_error());
    printf("INFO %s decode %dx%d latents -> %dx%d: untiled %.1f ms, tiled (%d px tiles, 4 x 3) %.1f ms\n", v->tag, LW, LH,
           W, H, t_full * 1e3, T, t_tiled * 1e3);

    /* the first tile's kept block [0, keep)² is its own decode, untouched */
    float *d00 = decode_region(v, lat, 0, 0, Tl, Tl), *d10 = decode_region(v, lat, st, 0, Tl, Tl),
          *d01 = decode_region(v, lat, 0, st, Tl, Tl);
    snprintf(name, sizeof name, "%s_first_tile_exact", v->tag);
    if (!d00 || !d10 || !d01) {
        T_FAIL(name, "decoding a tile alone failed: %s", dt_last_error());
    } else {
        double m = 0;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < keep; y++)
                for (int x = 0; x < keep; x++) {
                    double d = fabs((double)tiled[((size_t)c * H + y) * W + x] - d00[((size_t)c * T + y) * T + x]);
                    if (!(d <= m)) m = d;
                }
        T_CHECK(name, m == 0, "max |diff| %.3g in the first tile's kept block", m);
        /* rows keep..keep+B under it, columns 0..keep: blend_v of tile (0,0)'s last B rows and tile (1,0)'s first */
        double mv = 0, mh = 0;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < B; y++)
                for (int x = 0; x < keep; x++) {
                    double r = (double)y / B;
                    double want = d00[((size_t)c * T + T - B + y) * T + x] * (1 - r) + d10[((size_t)c * T + y) * T + x] * r;
                    double d = fabs(tiled[((size_t)c * H + keep + y) * W + x] - want);
                    if (!(d <= mv)) mv = d;
                }
        /* columns keep..keep+B beside it, rows 0..keep: blend_h of tile (0,0)'s last B columns and tile (0,1)'s */
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < keep; y++)
                for (int x = 0; x < B; x++) {
                    double r = (double)x / B;
                    double want = d00[((size_t)c * T + y) * T + T - B + x] * (1 - r) + d01[((size_t)c * T + y) * T + x] * r;
                    double d = fabs(tiled[((size_t)c * H + y) * W + keep + x] - want);
                    if (!(d <= mh)) mh = d;
                }
        snprintf(name, sizeof name, "%s_blend_v", v->tag);
        T_CHECK(name, mv <= TOL_BLEND, "max |diff| %.3g from diffusers' blend_v of the tiles' own decodes", mv);
        snprintf(name, sizeof name, "%s_blend_h", v->tag);
        T_CHECK(name, mh <= TOL_BLEND, "max |diff| %.3g from diffusers' blend_h of the tiles' own decodes", mh);
    }
    free(d00);
    free(d10);
    free(d01);

    /* tiled vs untiled: stated and bounded */
    double rel = dt_rel_l2(tiled, full, n), mx = max_abs_diff(tiled, full, n);
    uint8_t *u8a = malloc(n), *u8b = malloc(n);
    dt_vae_postprocess(tiled, H, W, NULL, u8a);
    dt_vae_postprocess(full, H, W, NULL, u8b);
    size_t within = 0;
    for (size_t i = 0; i < n; i++) within += abs((int)u8a[i] - (int)u8b[i]) <= 8;
    printf("INFO %s tiled vs untiled: rel L2 %.4f, max |diff| %.3f (range [-1, 1]), 8-bit pixels within +-8: %.1f%%\n",
           v->tag, rel, mx, 100.0 * within / n);
    snprintf(name, sizeof name, "%s_tiled_vs_untiled", v->tag);
    T_CHECK(name, rel <= TOL_TILED_VS_UNTILED, "rel L2 %.4f > %.2f", rel, TOL_TILED_VS_UNTILED);

    /* the 8-bit decode: the tiled float image's bytes */
    snprintf(name, sizeof name, "%s_tiled_rgb8", v->tag);
    set_tiling(v, 1, T);
    rc = decode8(v, lat, LH, LW, u8b);
    T_CHECK(name, rc == 0 && last_tiled(v) && !memcmp(u8a, u8b, n), "rc %d, the 8-bit tiled decode differs", rc);

    /* no larger than one tile: the untiled decode exactly */
    snprintf(name, sizeof name, "%s_one_tile_untiled", v->tag);
    set_tiling(v, 1, T);
    float *sub = malloc(sizeof(float) * v->C * Tl * Tl);
    crop(lat, v->C, LH, LW, 0, 0, Tl, Tl, sub);
    rc = decode(v, sub, Tl, Tl, tmp);
    int was_tiled = last_tiled(v);
    d00 = decode_region(v, lat, 0, 0, Tl, Tl);
    T_CHECK(name, rc == 0 && !was_tiled && d00 && !memcmp(tmp, d00, sizeof(float) * 3 * T * T),
            "rc %d tiled %d: a %dx%d latent with %d px tiles is not the untiled decode", rc, was_tiled, Tl, Tl, T);
    free(d00);
    free(sub);

    /* tile sizes that cannot work: not a multiple of 4 x 4 */
    snprintf(name, sizeof name, "%s_bad_tile", v->tag);
    rc = set_tiling(v, 1, 24);
    T_CHECK(name, rc != 0 && strstr(dt_last_error(), "multiple of 16"), "tile 24 accepted (%s)", dt_last_error());
    free(full);
    free(tmp);
    free(u8a);
    free(u8b);
    set_tiling(v, 0, 0);
    return tiled;
}

/* The FLUX.2 encoder tiled vs untiled, on an image in [-1, 1] (img [3, LH·S, LW·S]). */
static void check_encoder(dt_vae *v, const float *img) {
    const int H = LH * S, W = LW * S, L = dt_vae_get_config(v)->latent_channels, Tl = TILE / S, keep = Tl - Tl / 4;
    const size_t n = (size_t)L * LH * LW;
    float *full = malloc(sizeof(float) * n), *tiled = malloc(sizeof(float) * n);
    float *sub = malloc(sizeof(float) * 3 * TILE * TILE), *first = malloc(sizeof(float) * L * Tl * Tl);
    dt_vae_set_tiling(v, 0, 0);
    int rc = dt_vae_encode(v, img, H, W, full);
    dt_vae_set_tiling(v, 1, TILE);
    int rc2 = dt_vae_encode(v, img, H, W, tiled);
    T_CHECK("flux2_encode_tiled", rc == 0 && rc2 == 0 && dt_vae_last_tiled(v), "rc %d %d: %s", rc, rc2, dt_last_error());
    crop(img, 3, H, W, 0, 0, TILE, TILE, sub);
    dt_vae_set_tiling(v, 0, 0);
    rc = dt_vae_encode(v, sub, TILE, TILE, first);
    double m = rc ? 1e9 : 0;
    for (int c = 0; c < L && !rc; c++)
        for (int y = 0; y < keep; y++)
            for (int x = 0; x < keep; x++) {
                double d = fabs((double)tiled[((size_t)c * LH + y) * LW + x] - first[((size_t)c * Tl + y) * Tl + x]);
                if (!(d <= m)) m = d;
            }
    T_CHECK("flux2_encode_first_tile_exact", m == 0, "max |diff| %.3g in the first tile's kept block", m);
    double rel = dt_rel_l2(tiled, full, n);
    printf("INFO flux2 encode tiled vs untiled: rel L2 %.4f, max |diff| %.3f\n", rel, max_abs_diff(tiled, full, n));
    T_CHECK("flux2_encode_tiled_vs_untiled", rel <= TOL_ENC_TILED, "rel L2 %.4f > %.2f", rel, TOL_ENC_TILED);
    free(full);
    free(tiled);
    free(sub);
    free(first);
}

/* The activation bytes the planner counts (dt_vae_decode_act_bytes, dt_qvae_decode_act_bytes) against the CPU
 * backend's measured peak above the weights, untiled and tiled: a fresh backend for each measurement. */
static void check_act_estimate(const char *tag, const char *dir, const float *lat) {
    for (int tiled = 0; tiled < 2; tiled++) {
        char name[64];
        snprintf(name, sizeof name, "%s_act_bytes_%s", tag, tiled ? "tiled" : "untiled");
        dt_backend_opts opts = {0};
        dt_backend *be = dt_backend_cpu_create(&opts);
        vae v;
        if (!be || vae_open(&v, be, tag, dir)) { T_FAIL(name, "%s", dt_last_error()); if (be) be->destroy(be); continue; }
        size_t cur = 0, peak = 0;
        be->mem_stats(be, &cur, &peak);
        float *rgb = malloc(sizeof(float) * 3 * LH * S * LW * S);
        set_tiling(&v, tiled, TILE);
        int rc = decode(&v, lat, LH, LW, rgb);
        size_t cur2 = 0, peak2 = 0;
        be->mem_stats(be, &cur2, &peak2);
        const int elem = (int)dt_dtype_size(be->act_dtype), t = tiled ? TILE : 0;
        const int64_t est = v.f ? dt_vae_decode_act_bytes(dt_vae_get_config(v.f), t, LH, LW, elem)
                                : dt_qvae_decode_act_bytes(dt_qvae_get_config(v.q), t, LH, LW, elem);
        const double measured = (double)peak2 - (double)cur;
        printf("INFO %s decode %s: activations predicted %.2f MiB, measured %.2f MiB (CPU backend peak above the "
               "weights)\n", tag, tiled ? "tiled" : "untiled", est / 1048576.0, measured / 1048576.0);
        T_CHECK(name, rc == 0 && fabs(est - measured) <= TOL_ACT_BYTES * measured, "predicted %lld, measured %.0f",
                (long long)est, measured);
        free(rgb);
        vae_close(&v);
        be->destroy(be);
    }
}

/* diffusers' tiled decode (tools/vae_tiling_reference.py) of its own latent, when the file is there. */
static void check_reference(dt_backend *be) {
    const char *path = fx("vae_tiling_reference.safetensors");
    if (access(path, F_OK)) {
        T_SKIP("vae_tiling_diffusers_reference", "%s is absent (python3 tools/vae_tiling_reference.py writes it)", path);
        return;
    }
    st_file *f = st_open(path);
    if (!f) { T_FAIL("vae_tiling_diffusers_reference", "%s", dt_last_error()); return; }
    const char *tags[2] = {"flux2", "krea2"}, *dirs[2] = {"model/vae", "krea2/vae"};
    for (int k = 0; k < 2; k++) {
        char nl[64], nt[64], nu[64], name[96];
        snprintf(nl, sizeof nl, "%s.latent", tags[k]);
        snprintf(nt, sizeof nt, "%s.tiled", tags[k]);
        snprintf(nu, sizeof nu, "%s.untiled", tags[k]);
        const st_tensor *tl = st_find(f, nl), *tt = st_find(f, nt), *tu = st_find(f, nu);
        snprintf(name, sizeof name, "%s_diffusers_tiled", tags[k]);
        if (!tl || !tt || !tu || tl->ndim != 4 || tt->ndim != 4) { T_FAIL(name, "missing %s / %s / %s", nl, nt, nu); continue; }
        const int h = (int)tl->shape[2], w = (int)tl->shape[3];
        vae v;
        if (vae_open(&v, be, k ? "krea2" : "flux2", fx(dirs[k]))) { T_FAIL(name, "%s", dt_last_error()); continue; }
        float *lat = st_to_f32(tl), *want = st_to_f32(tt), *want_u = st_to_f32(tu);
        const size_t n = (size_t)3 * h * w * S * S;
        float *got = malloc(sizeof(float) * n);
        set_tiling(&v, 1, TILE);
        int rc = decode(&v, lat, h, w, got);
        if (rc || (size_t)tt->numel != n) T_FAIL(name, "rc %d, %lld values for %zu", rc, (long long)tt->numel, n);
        else t_check_rel_l2(name, got, want, n, TOL_REFERENCE);
        /* diffusers' own seams: its tiled vs untiled, beside ours */
        printf("INFO %s diffusers tiled vs untiled: rel L2 %.4f\n", tags[k], dt_rel_l2(want, want_u, n));
        /* FLUX.2: diffusers' tiled encode of its tiled image (the posterior mean) */
        const st_tensor *ti = st_find(f, "flux2.enc_image"), *te = st_find(f, "flux2.enc_tiled");
        if (v.f && ti && te && (size_t)ti->numel == n && te->numel == tl->numel) {
            float *img = st_to_f32(ti), *want_e = st_to_f32(te), *got_e = malloc(sizeof(float) * (size_t)te->numel);
            rc = dt_vae_encode(v.f, img, h * S, w * S, got_e);
            if (rc || !dt_vae_last_tiled(v.f)) T_FAIL("flux2_diffusers_tiled_encode", "rc %d: %s", rc, dt_last_error());
            else t_check_rel_l2("flux2_diffusers_tiled_encode", got_e, want_e, (size_t)te->numel, TOL_REFERENCE);
            free(img);
            free(want_e);
            free(got_e);
        } else if (v.f) {
            T_FAIL("flux2_diffusers_tiled_encode", "flux2.enc_image / flux2.enc_tiled missing or misshapen");
        }
        free(lat);
        free(want);
        free(want_u);
        free(got);
        vae_close(&v);
    }
    st_close(f);
}

/* The typed option through the whole pipeline: a tiled image close to the untiled one; a bad tile refused at load. */
static void check_pipeline(dt_backend *be) {
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = fx("model");
    dt_gen_params p;
    dt_gen_params_default(&p);
    p.prompt = "a lighthouse";
    p.width = 96;
    p.height = 128;
    p.seed = 3;
    p.max_seq_len = 32;   /* (a short text: the decode, not the forward, is the largest phase of the memory plan) */
    uint8_t *a = NULL, *b = NULL;
    int w = 0, h = 0, w2 = 0, h2 = 0;
    int rc = dt_generate(be, &lo, &p, &a, &w, &h, NULL, NULL, NULL);
    lo.vae_tiling = 1;
    lo.vae_tile = 32;
    int rc2 = dt_generate(be, &lo, &p, &b, &w2, &h2, NULL, NULL, NULL);
    if (rc || rc2 || w != w2 || h != h2) {
        T_FAIL("pipeline_vae_tiling", "rc %d %d (%s), %dx%d vs %dx%d", rc, rc2, dt_last_error(), w, h, w2, h2);
    } else {
        const size_t n = (size_t)3 * w * h;
        size_t same = 0;
        double sum = 0;
        for (size_t i = 0; i < n; i++) {
            same += a[i] == b[i];
            sum += abs((int)a[i] - (int)b[i]);
        }
        printf("INFO pipeline 96x128, 32 px tiles: mean |diff| %.2f levels, %.1f%% of the bytes equal\n", sum / n,
               100.0 * same / n);
        /* tiled it is (bytes differ), and the same picture (a mean difference of a few levels out of 255) */
        T_CHECK("pipeline_vae_tiling", same < n && sum / n <= TOL_PIPELINE_MEAN_LEVELS,
                "%zu of %zu bytes equal, mean |diff| %.2f", same, n, sum / n);
    }
    /* --max-vram: a budget that only the tiled decode fits makes the same image as asking for tiles; one below the
     * smallest workable is refused before loading, naming it */
    dt_place_sizes ps;
    dt_place_plan pl;
    if (dt_place_sizes_for(lo.model, 96, 128, 32, (int)dt_dtype_size(be->act_dtype), 32, 0, 1, &ps)) {
        T_FAIL("pipeline_max_vram_tiles", "%s", dt_last_error());
    } else {
        dt_place_plan_make(0, &ps, &pl);
        const int64_t untiled_peak = pl.peak;
        dt_place_plan_make(1, &ps, &pl);   /* (fails: gives the smallest) */
        uint8_t *c = NULL;
        int w3 = 0, h3 = 0;
        lo.vae_tiling = 0;
        lo.vae_tile = 32;
        lo.max_vram = pl.min_budget;
        rc = dt_generate(be, &lo, &p, &c, &w3, &h3, NULL, NULL, NULL);
        T_CHECK("pipeline_max_vram_tiles", rc == 0 && pl.min_budget < untiled_peak && b && w3 == w2 && h3 == h2 &&
                                               !memcmp(b, c, (size_t)3 * w2 * h2),
                "rc %d (%s), budget %lld (untiled %lld): not the tiled image", rc, dt_last_error(),
                (long long)pl.min_budget, (long long)untiled_peak);
        free(c);
        c = NULL;
        lo.max_vram = pl.min_budget - 1;
        double t0 = dt_now();
        rc = dt_generate(be, &lo, &p, &c, &w3, &h3, NULL, NULL, NULL);
        T_CHECK("pipeline_max_vram_too_small", rc != 0 && !c && strstr(dt_last_error(), "below the smallest workable") &&
                                                   dt_now() - t0 < 1.0,
                "rc %d in %.2f s: %s", rc, dt_now() - t0, dt_last_error());
        free(c);
        lo.max_vram = 0;
    }
    free(a);
    free(b);
    const char *roots[2] = {"model", "krea2"};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "pipeline_bad_tile_%s", roots[k]);
        dt_pipeline_opts_default(&lo);
        lo.model = fx(roots[k]);
        lo.vae_tiling = 1;
        lo.vae_tile = 40;
        double t0 = dt_now();
        dt_pipeline *pl = dt_pipeline_load(be, &lo);
        T_CHECK(name, !pl && strstr(dt_last_error(), "VAE tile size 40") && dt_now() - t0 < 1.0,
                "loaded or wrong error: %s", dt_last_error());
        dt_pipeline_free(pl);
    }
}

int main(void) {
    dt_backend_opts opts = {0};
    dt_backend *cpu = dt_backend_cpu_create(&opts);
    if (!cpu) { T_FAIL("cpu_backend", "%s", dt_last_error()); return T_DONE(); }
    const char *tags[2] = {"flux2", "krea2"}, *dirs[2] = {"model/vae", "krea2/vae"};
    float *tiled_cpu[2] = {NULL, NULL}, *lat[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        vae v;
        if (vae_open(&v, cpu, tags[k], fx(dirs[k]))) { T_FAIL(tags[k], "load: %s", dt_last_error()); continue; }
        lat[k] = malloc(sizeof(float) * v.C * LH * LW);
        dt_randn(11 + k, 0, 0, lat[k], (size_t)v.C * LH * LW);
        tiled_cpu[k] = check_decoder(&v, lat[k]);
        if (v.f && tiled_cpu[k]) check_encoder(v.f, tiled_cpu[k]);
        vae_close(&v);
        check_act_estimate(tags[k], fx(dirs[k]), lat[k]);
    }
    check_reference(cpu);
    check_pipeline(cpu);

    if (dt_backend_cuda_available()) {
        dt_backend *cuda = dt_backend_cuda_create(&opts);
        if (!cuda) T_FAIL("vae_tiling_cuda_backend", "%s", dt_last_error());
        for (int k = 0; cuda && k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s_tiled_cuda_vs_cpu", tags[k]);
            vae v;
            if (!lat[k] || vae_open(&v, cuda, tags[k], fx(dirs[k]))) { T_FAIL(name, "%s", dt_last_error()); continue; }
            const size_t n = (size_t)3 * LH * S * LW * S;
            float *got = malloc(sizeof(float) * n);
            set_tiling(&v, 1, TILE);
            if (decode(&v, lat[k], LH, LW, got) || !last_tiled(&v)) T_FAIL(name, "%s", dt_last_error());
            else t_check_rel_l2(name, got, tiled_cpu[k], n, TOL_CUDA);
            free(got);
            vae_close(&v);
        }
        if (cuda) cuda->destroy(cuda);
    } else if (t_require_gpu_env()) {
        T_FAIL("vae_tiling_cuda", "DITRUN_REQUIRE_GPU=1 but no usable CUDA GPU");
    } else {
        T_SKIP("vae_tiling_cuda", "no usable CUDA GPU (CPU-only build or no device)");
    }
    for (int k = 0; k < 2; k++) {
        free(tiled_cpu[k]);
        free(lat[k]);
    }
    cpu->destroy(cpu);
    return T_DONE();
}
