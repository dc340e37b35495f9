/* test_edit_engine.c — image editing through the engine (dt_pipeline_load / dt_pipeline_generate on the tiny fixture
 * pipeline), checked by properties that hold for any model, size or image rather than against stored outputs (the
 * fixture comparisons are test_edit.c's):
 *   - three references (grayscale, RGBA, RGB) of sizes the fixtures do not have: the output takes the first one's
 *     prepared size; each image's tokens are those it gets alone, with T = 10, 20, 30 and its own grid; a grayscale
 *     image encodes as its RGB replica and an RGBA one as its RGB part (alpha dropped, not composited);
 *   - inpainting at strengths other than the fixture's: the steps that run are the reference's
 *     steps - int(steps - steps * strength) (float64), and after the last step the kept region (mask 0 on the packed
 *     grid) holds the init image's latents exactly;
 *   - sequence parallelism: an edit, a KV edit and an inpainting with the DiT split over 2 CPU thread ranks equal
 *     the unsplit ones;
 *   - memory: the second and third image of the same geometry leave the backend holding no more than after the
 *     first (current and peak bytes; on CUDA the peak is what was taken from the device), appended and KV-cached.
 * Every size is read from the image files and the VAE's config. CPU always; CUDA too when a GPU is usable. */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/edit_prep.h"
#include "image/image.h"
#include "io/json.h"
#include "model_dirs.h"
#include "pipeline/engine.h"
#include "image/png.h"
#include "test.h"

/* Tokens of the same image encoded alone and together with others: the same convolutions on the same pixels. */
#define TOKENS_TOL 1e-6
/* An edit with the DiT split over CPU thread ranks vs unsplit: the same ops, the attention's rows regrouped (the
 * bound of the sequence-parallel generation tests). */
#define SP_EDIT_TOL 1e-5

static char tmp[512], root[600];

/* ---- files ---- */

static int write_gray_png(const char *path, const uint8_t *l, int w, int h) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(p);
    if (setjmp(png_jmpbuf(p))) { png_destroy_write_struct(&p, &info); fclose(f); return -1; }
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(p, info);
    for (int y = 0; y < h; y++) png_write_row(p, (png_const_bytep)(l + (size_t)y * w));
    png_write_end(p, NULL);
    png_destroy_write_struct(&p, &info);
    return fclose(f);
}

static int write_rgb_png(const char *path, const uint8_t *rgb, int w, int h) {
    uint8_t *png = NULL;
    size_t n = 0;
    if (dt_png_encode(rgb, w, h, NULL, 0, &png, &n)) return -1;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(png, 1, n, f) == n;
    if (f) fclose(f);
    free(png);
    return ok ? 0 : -1;
}

/* 2 x the VAE's scale factor (2^(blocks - 1)), from the fixture's vae/config.json. */
static int vae_multiple(void) {
    char p[700];
    snprintf(p, sizeof p, "%s/vae/config.json", root);
    json *j = json_parse_file(p);
    const json *b = j ? json_get(j, "block_out_channels") : NULL;
    int m = b && b->len > 0 ? 2 << (b->len - 1) : 0;
    json_free(j);
    return m;
}

/* ---- one request, observed ---- */

typedef struct {
    float *ref_tok, *ref_ids;   /* copies of ref_latents_packed [R, C] and ref_ids [R, 4] */
    int64_t r, c;
    float *last;                /* the last step's latents [N, C] */
    int64_t n_last;
    int steps_seen;
} obs;

static void observe(void *ud, const char *name, const float *d, int ndim, const int64_t *shape) {
    obs *o = ud;
    if (!strcmp(name, "ref_latents_packed") && ndim == 3) {
        o->r = shape[1];
        o->c = shape[2];
        o->ref_tok = realloc(o->ref_tok, sizeof(float) * (size_t)(o->r * o->c));
        memcpy(o->ref_tok, d, sizeof(float) * (size_t)(o->r * o->c));
    } else if (!strcmp(name, "ref_ids") && ndim == 3) {
        o->ref_ids = realloc(o->ref_ids, sizeof(float) * (size_t)(shape[1] * 4));
        memcpy(o->ref_ids, d, sizeof(float) * (size_t)(shape[1] * 4));
    } else if (!strncmp(name, "step", 4) && strstr(name, ".latents_packed") && ndim == 3) {
        o->n_last = shape[1] * shape[2];
        o->last = realloc(o->last, sizeof(float) * (size_t)o->n_last);
        memcpy(o->last, d, sizeof(float) * (size_t)o->n_last);
        o->steps_seen++;
    }
}

static void obs_free(obs *o) {
    free(o->ref_tok);
    free(o->ref_ids);
    free(o->last);
    memset(o, 0, sizeof *o);
}

/* Edit with the given reference files (and optionally an init image + mask at strength). 0 or -1. */
static int run(dt_pipeline *pl, const char *const *refs, int n_refs, const char *init, const char *mask,
               double strength, int steps, uint64_t seed, obs *o, int *w, int *h) {
    dt_image im[8], ini = {0}, mk = {0};
    memset(im, 0, sizeof im);
    int rc = -1;
    for (int i = 0; i < n_refs; i++)
        if (dt_image_read_file(refs[i], &im[i])) goto out;
    if (init && (dt_image_read_file(init, &ini) || dt_image_read_file(mask, &mk))) goto out;
    dt_gen_params g;
    dt_gen_params_default(&g);
    g.prompt = "a snow leopard";
    g.steps = steps;
    g.seed = seed;
    g.max_seq_len = 16;
    g.refs = im;
    g.n_refs = n_refs;
    if (init) {
        g.init_image = &ini;
        g.mask = &mk;
        g.strength = strength;
    }
    uint8_t *rgb = NULL;
    rc = dt_pipeline_generate(pl, &g, &rgb, w, h, NULL, o ? observe : NULL, o);
    free(rgb);
out:
    if (rc) printf("# edit: %s\n", dt_last_error());
    for (int i = 0; i < n_refs; i++) dt_image_free(&im[i]);
    dt_image_free(&ini);
    dt_image_free(&mk);
    return rc;
}

/* ---- three references ---- */

static void three_references(dt_pipeline *pl, const char *tag) {
    char gray[700], gray_rgb[700], rgba[700], rgba_rgb[700], rgb[700], nm[200];
    snprintf(gray, sizeof gray, "%s/gray.png", tmp);
    snprintf(gray_rgb, sizeof gray_rgb, "%s/gray-as-rgb.png", tmp);
    snprintf(rgba, sizeof rgba, "%s/edit/ref1.png", t_fixtures());
    snprintf(rgba_rgb, sizeof rgba_rgb, "%s/ref1-rgb.png", tmp);
    snprintf(rgb, sizeof rgb, "%s/edit/ref0.png", t_fixtures());
    /* a grayscale image of a size no fixture has (taller than wide), and its RGB replica; ref1 without its alpha */
    const int gw = 88, gh = 140;
    uint8_t *l = malloc((size_t)gw * gh), *l3 = malloc((size_t)gw * gh * 3);
    for (int y = 0; y < gh; y++)
        for (int x = 0; x < gw; x++) l[y * gw + x] = (uint8_t)((x * 5 + y * 3 + ((x * y) % 17) * 7) & 255);
    for (int i = 0; i < gw * gh; i++) l3[3 * i] = l3[3 * i + 1] = l3[3 * i + 2] = l[i];
    dt_image a = {0};
    int files = write_gray_png(gray, l, gw, gh) == 0 && write_rgb_png(gray_rgb, l3, gw, gh) == 0 &&
                dt_image_read_file(rgba, &a) == 0 && a.channels == 4;
    uint8_t *a_rgb = files ? dt_image_to_rgb(&a) : NULL;
    files = files && write_rgb_png(rgba_rgb, a_rgb, a.w, a.h) == 0;
    free(a_rgb);
    dt_image_free(&a);
    free(l);
    free(l3);
    snprintf(nm, sizeof nm, "%s: test images written (gray %dx%d, ref1 RGBA)", tag, gw, gh);
    T_CHECK(nm, files, "cannot write into %s", tmp);
    if (!files) return;

    const int mult = vae_multiple();
    const char *all[3] = {gray, rgba, rgb};
    obs o3 = {0}, one[3], rep[2];
    memset(one, 0, sizeof one);
    memset(rep, 0, sizeof rep);
    int w = 0, h = 0, w1, h1;
    int ok = run(pl, all, 3, NULL, NULL, 0, 1, 1, &o3, &w, &h) == 0;
    for (int k = 0; ok && k < 3; k++) ok = run(pl, &all[k], 1, NULL, NULL, 0, 1, 1, &one[k], &w1, &h1) == 0;
    const char *reps[2] = {gray_rgb, rgba_rgb};
    for (int k = 0; ok && k < 2; k++) ok = run(pl, &reps[k], 1, NULL, NULL, 0, 1, 1, &rep[k], &w1, &h1) == 0;
    snprintf(nm, sizeof nm, "%s: three references (gray, RGBA, RGB) edit", tag);
    T_CHECK(nm, ok && mult > 0, "failed (multiple %d)", mult);
    if (!ok || mult <= 0) goto out;
    /* the output size: the first reference's, floored to the multiple (under the 1024^2 area rule: no resize) */
    snprintf(nm, sizeof nm, "%s: the output takes the first reference's prepared size %dx%d", tag, gw / mult * mult,
             gh / mult * mult);
    T_CHECK(nm, w == gw / mult * mult && h == gh / mult * mult, "%dx%d", w, h);
    /* each image's tokens: those it gets alone, in order; ids (10 + 10k, row, col, 0) over its own grid */
    int64_t at = 0;
    int ids_ok = 1, sizes_ok = 1;
    for (int k = 0; k < 3; k++) {
        dt_image im = {0};
        dt_image_read_file(all[k], &im);
        int aw, ah;
        dt_prep_area_size(im.w, im.h, &aw, &ah);
        const int gy = ah / mult, gx = aw / mult;
        dt_image_free(&im);
        sizes_ok &= one[k].r == (int64_t)gy * gx && one[k].c == o3.c;
        if (!sizes_ok || at + one[k].r > o3.r) break;
        snprintf(nm, sizeof nm, "%s: reference %d's tokens among three = alone", tag, k + 1);
        t_check_rel_l2(nm, o3.ref_tok + at * o3.c, one[k].ref_tok, (size_t)(one[k].r * o3.c), TOKENS_TOL);
        for (int y = 0; y < gy; y++)
            for (int x = 0; x < gx; x++) {
                const float *id = o3.ref_ids + (at + (int64_t)y * gx + x) * 4;
                ids_ok &= id[0] == (float)(10 + 10 * k) && id[1] == (float)y && id[2] == (float)x && id[3] == 0.0f;
            }
        at += one[k].r;
    }
    snprintf(nm, sizeof nm, "%s: token counts are each image's grid, all three in order", tag);
    T_CHECK(nm, sizes_ok && at == o3.r, "%lld of %lld tokens accounted for", (long long)at, (long long)o3.r);
    snprintf(nm, sizeof nm, "%s: ids (10 + 10k, row, col, 0) over each image's grid", tag);
    T_CHECK(nm, ids_ok && sizes_ok, "an id differs");
    snprintf(nm, sizeof nm, "%s: a grayscale reference encodes as its RGB replica", tag);
    T_CHECK(nm, rep[0].r == one[0].r && !memcmp(rep[0].ref_tok, one[0].ref_tok, sizeof(float) * (size_t)(one[0].r * o3.c)),
            "tokens differ");
    snprintf(nm, sizeof nm, "%s: an RGBA reference encodes as its RGB part (alpha dropped)", tag);
    T_CHECK(nm, rep[1].r == one[1].r && !memcmp(rep[1].ref_tok, one[1].ref_tok, sizeof(float) * (size_t)(one[1].r * o3.c)),
            "tokens differ");
out:
    obs_free(&o3);
    for (int k = 0; k < 3; k++) obs_free(&one[k]);
    for (int k = 0; k < 2; k++) obs_free(&rep[k]);
}

/* ---- inpainting strengths ---- */

static void strengths(dt_pipeline *pl, const char *tag) {
    char init[700], mask[700], nm[200];
    snprintf(init, sizeof init, "%s/edit/ref9.png", t_fixtures());
    snprintf(mask, sizeof mask, "%s/edit/mask.png", t_fixtures());
    const int mult = vae_multiple(), steps = 10;
    const double ss[] = {0.3, 0.7, 1.0};
    dt_image ini = {0}, mk = {0};
    float *m_lat = NULL;
    int ok = mult > 0 && dt_image_read_file(init, &ini) == 0 && dt_image_read_file(mask, &mk) == 0;
    int ow = 0, oh = 0;
    if (ok) {
        int aw, ah;
        dt_prep_area_size(ini.w, ini.h, &aw, &ah);
        ow = aw / mult * mult;
        oh = ah / mult * mult;
        ok = dt_prep_mask(&mk, mask, ini.w, ini.h, ow, oh, mult, NULL, &m_lat) == 0;
    }
    snprintf(nm, sizeof nm, "%s: inpainting inputs read", tag);
    T_CHECK(nm, ok, "%s", dt_last_error());
    for (size_t k = 0; ok && k < sizeof ss / sizeof ss[0]; k++) {
        obs o = {0};
        int w = 0, h = 0;
        int rc = run(pl, NULL, 0, init, mask, ss[k], steps, 11, &o, &w, &h);
        /* the reference: init = min(steps * strength, steps), t_start = int(max(steps - init, 0)) in float64 */
        double in = steps * ss[k] < steps ? steps * ss[k] : steps;
        int want = steps - (int)(steps - in > 0 ? steps - in : 0);
        snprintf(nm, sizeof nm, "%s: strength %g of %d steps runs %d, at the init image's size %dx%d", tag, ss[k], steps,
                 want, ow, oh);
        T_CHECK(nm, rc == 0 && o.steps_seen == want && w == ow && h == oh, "rc %d, %d steps, %dx%d", rc, o.steps_seen, w, h);
        /* kept tokens (mask 0) hold the init latents (the first tokens of ref_latents_packed) after the last step */
        const int64_t n_tok = (int64_t)(oh / mult) * (ow / mult);
        int kept = 0, exact = 1, repaint_differs = 0;
        for (int64_t t = 0; rc == 0 && o.last && o.ref_tok && o.r >= n_tok && t < n_tok; t++) {
            int same = !memcmp(o.last + t * o.c, o.ref_tok + t * o.c, sizeof(float) * (size_t)o.c);
            if (m_lat[t] == 0.0f) {
                kept++;
                exact &= same;
            } else if (m_lat[t] == 1.0f) {
                repaint_differs += !same;
            }
        }
        snprintf(nm, sizeof nm, "%s: strength %g: the %d kept tokens equal the init latents, repainted ones differ",
                 tag, ss[k], kept);
        T_CHECK(nm, rc == 0 && kept > 0 && exact && repaint_differs > 0, "kept %d exact %d, %d repainted differ", kept,
                exact, repaint_differs);
        obs_free(&o);
    }
    free(m_lat);
    dt_image_free(&ini);
    dt_image_free(&mk);
}

/* Inpainting with two references of different sizes: one batch at the first one's floored size (the reference's
 * image_reference list), so both get the same grid: ids T = 20 and 30 over the first reference's rows and columns,
 * after the init image's T = 10 tokens; the second reference's tokens are those of its own crop box. */
static void inpaint_two_references(dt_pipeline *pl, const char *tag) {
    char init[700], mask[700], r0[700], r1[700], nm[200];
    snprintf(init, sizeof init, "%s/edit/ref9.png", t_fixtures());
    snprintf(mask, sizeof mask, "%s/edit/mask.png", t_fixtures());
    snprintf(r0, sizeof r0, "%s/edit/ref0.png", t_fixtures());
    snprintf(r1, sizeof r1, "%s/edit/ref1.png", t_fixtures());
    const int mult = vae_multiple();
    dt_image i9 = {0}, a = {0}, b = {0};
    int ok = mult > 0 && !dt_image_read_file(init, &i9) && !dt_image_read_file(r0, &a) && !dt_image_read_file(r1, &b);
    snprintf(nm, sizeof nm, "%s: inpainting with two references: inputs read", tag);
    T_CHECK(nm, ok, "%s", dt_last_error());
    if (!ok) goto out;
    {
        int aw, ah;
        dt_prep_area_size(i9.w, i9.h, &aw, &ah);
        const int64_t n_init = (int64_t)(ah / mult) * (aw / mult);
        const int gw = a.w / mult, gh = a.h / mult;   /* the batch grid: the first reference's, no area rule */
        const char *refs[2] = {r0, r1};
        obs o = {0};
        int w, h;
        int rc = run(pl, refs, 2, init, mask, 1.0, 2, 5, &o, &w, &h);
        int ids_ok = rc == 0 && o.ref_ids && o.r == n_init + 2 * (int64_t)gw * gh;
        for (int k = 0; ids_ok && k < 2; k++)
            for (int64_t t = 0; ids_ok && t < (int64_t)gw * gh; t++) {
                const float *id = o.ref_ids + 4 * (n_init + k * (int64_t)gw * gh + t);
                ids_ok = id[0] == 20.0f + 10.0f * k && id[1] == (float)(t / gw) && id[2] == (float)(t % gw) && id[3] == 0;
            }
        snprintf(nm, sizeof nm, "%s: inpainting with references %dx%d and %dx%d: both on the first one's %dx%d grid", tag,
                 a.w, a.h, b.w, b.h, gw, gh);
        T_CHECK(nm, ids_ok, "rc %d, %lld reference tokens (init %lld + 2 x %d)", rc, (long long)o.r, (long long)n_init,
                gw * gh);
        obs_free(&o);
    }
out:
    dt_image_free(&i9);
    dt_image_free(&a);
    dt_image_free(&b);
}

/* ---- memory ---- */

static void steady_memory(dt_pipeline *pl, dt_backend *be, const char *tag) {
    char ref[700], nm[200];
    snprintf(ref, sizeof ref, "%s/edit/ref0.png", t_fixtures());
    const char *refs[1] = {ref};
    int w, h;
    size_t cur1 = 0, peak1 = 0, cur3 = 0, peak3 = 0;
    int ok = run(pl, refs, 1, NULL, NULL, 0, 2, 1, NULL, &w, &h) == 0;
    if (ok && be->mem_stats) be->mem_stats(be, &cur1, &peak1);
    for (int i = 2; ok && i <= 3; i++) ok = run(pl, refs, 1, NULL, NULL, 0, 2, (uint64_t)i, NULL, &w, &h) == 0;
    if (ok && be->mem_stats) be->mem_stats(be, &cur3, &peak3);
    snprintf(nm, sizeof nm, "%s: images 2 and 3 of one reference geometry hold no more memory than image 1 (%zu / peak %zu "
             "bytes)", tag, cur1, peak1);
    T_CHECK(nm, ok && be->mem_stats && cur3 == cur1 && peak3 == peak1, "after image 1 %zu / %zu, after image 3 %zu / %zu",
            cur1, peak1, cur3, peak3);
}

/* One edit with a prompt and a seed: its pixels (malloc'd) and timings. 0 or -1. */
static int run_px(dt_pipeline *pl, const char *ref, const char *prompt, uint64_t seed, uint8_t **rgb, int *w, int *h,
                  dt_gen_timings *tm) {
    dt_image im = {0};
    if (ref && dt_image_read_file(ref, &im)) return -1;
    dt_gen_params g;
    dt_gen_params_default(&g);
    g.prompt = prompt;
    g.steps = 2;
    g.seed = seed;
    g.max_seq_len = 16;
    g.refs = ref ? &im : NULL;
    g.n_refs = ref ? 1 : 0;
    if (!ref) g.width = g.height = 64;
    int rc = dt_pipeline_generate(pl, &g, rgb, w, h, tm, NULL, NULL);
    if (rc) printf("# edit: %s\n", dt_last_error());
    dt_image_free(&im);
    return rc;
}

/* The previous request's references reused: the same image again (another prompt and seed, also after a
 * text-to-image request in between) skips the VAE encoder (and, KV, the reference-only pass) and gives the pixels a
 * fresh pipeline gives; another image is encoded. */
static void reused_references(dt_backend *be, const char *model, const char *tag) {
    char ref[700], other[700], nm[200];
    snprintf(ref, sizeof ref, "%s/edit/ref0.png", t_fixtures());
    snprintf(other, sizeof other, "%s/edit/edit1.png", t_fixtures());
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = model;
    dt_pipeline *pl = dt_pipeline_load(be, &lo), *fresh = dt_pipeline_load(be, &lo);
    uint8_t *a = NULL, *b = NULL, *t2i = NULL, *c = NULL, *d = NULL, *want_b = NULL, *want_d = NULL;
    int w, h, wb = 0, hb = 0, wd = 0, hd = 0;
    dt_gen_timings ta, tb, tt, tc, td, tf;
    int ok = pl && fresh && run_px(pl, ref, "a snow leopard", 5, &a, &w, &h, &ta) == 0 &&
             run_px(pl, ref, "a red fox", 6, &b, &wb, &hb, &tb) == 0 &&
             run_px(pl, NULL, "a cat", 1, &t2i, &w, &h, &tt) == 0 &&
             run_px(pl, ref, "a red fox", 6, &c, &w, &h, &tc) == 0 &&
             run_px(pl, other, "a red fox", 6, &d, &wd, &hd, &td) == 0 &&
             run_px(fresh, ref, "a red fox", 6, &want_b, &w, &h, &tf) == 0;
    snprintf(nm, sizeof nm, "%s: five requests on one pipeline", tag);
    T_CHECK(nm, ok, "%s", dt_last_error());
    if (ok) {
        const size_t nb = (size_t)wb * hb * 3;
        snprintf(nm, sizeof nm, "%s: the same reference again is not encoded again (another prompt and seed)", tag);
        T_CHECK(nm, ta.refs_cached == 0 && tb.refs_cached == 1 && tf.refs_cached == 0, "cached %d %d (fresh %d)",
                ta.refs_cached, tb.refs_cached, tf.refs_cached);
        snprintf(nm, sizeof nm, "%s: reused references give a fresh pipeline's pixels", tag);
        T_CHECK(nm, !memcmp(b, want_b, nb), "pixels differ");
        snprintf(nm, sizeof nm, "%s: after a text-to-image request, the same reference: reused, same pixels", tag);
        T_CHECK(nm, tc.refs_cached == 1 && !memcmp(c, want_b, nb), "cached %d", tc.refs_cached);
        snprintf(nm, sizeof nm, "%s: another reference image is encoded, and gives a fresh pipeline's pixels", tag);
        int ok_d = td.refs_cached == 0 && run_px(fresh, other, "a red fox", 6, &want_d, &w, &h, &tf) == 0 &&
                   !memcmp(d, want_d, (size_t)wd * hd * 3);
        T_CHECK(nm, ok_d, "cached %d", td.refs_cached);
    }
    free(a); free(b); free(t2i); free(c); free(d); free(want_b); free(want_d);
    dt_pipeline_free(pl);
    dt_pipeline_free(fresh);
}

/* ---- split over ranks ---- */

static void split_equals_unsplit(dt_backend *be, const char *model, const char *what, int inpaint) {
    char ref[700], init[700], mask[700], nm[200];
    snprintf(ref, sizeof ref, "%s/edit/ref0.png", t_fixtures());
    snprintf(init, sizeof init, "%s/edit/ref9.png", t_fixtures());
    snprintf(mask, sizeof mask, "%s/edit/mask.png", t_fixtures());
    const char *refs[1] = {ref};
    obs o[2];
    memset(o, 0, sizeof o);
    int rc[2] = {-1, -1}, w, h;
    for (int k = 0; k < 2; k++) {
        dt_pipeline_opts lo;
        dt_pipeline_opts_default(&lo);
        lo.model = model;
        lo.sequence_parallel = k ? 2 : 0;
        dt_pipeline *pl = dt_pipeline_load(be, &lo);
        if (pl) rc[k] = run(pl, inpaint ? NULL : refs, inpaint ? 0 : 1, inpaint ? init : NULL, mask, 0.75, 3, 4, &o[k],
                            &w, &h);
        else printf("# %s\n", dt_last_error());
        dt_pipeline_free(pl);
    }
    snprintf(nm, sizeof nm, "%s %s split over 2 thread ranks = unsplit (final latents)", be->name, what);
    if (rc[0] == 0 && rc[1] == 0 && o[0].n_last == o[1].n_last && o[0].last && o[1].last)
        t_check_rel_l2(nm, o[1].last, o[0].last, (size_t)o[0].n_last, SP_EDIT_TOL);
    else
        T_FAIL(nm, "rc %d / %d, %lld / %lld values", rc[0], rc[1], (long long)o[0].n_last, (long long)o[1].n_last);
    obs_free(&o[0]);
    obs_free(&o[1]);
}

static void on_backend(dt_backend *be, const char *kv_root) {
    char tag[64];
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = root;
    dt_pipeline *pl = dt_pipeline_load(be, &lo);
    snprintf(tag, sizeof tag, "%s edit", be->name);
    T_CHECK(tag, pl != NULL, "load: %s", dt_last_error());
    if (!pl) return;
    three_references(pl, tag);
    strengths(pl, tag);
    inpaint_two_references(pl, tag);
    steady_memory(pl, be, tag);
    dt_pipeline_free(pl);
    reused_references(be, root, tag);
    lo.model = kv_root;
    pl = dt_pipeline_load(be, &lo);
    snprintf(tag, sizeof tag, "%s KV edit", be->name);
    T_CHECK(tag, pl != NULL, "load: %s", dt_last_error());
    if (!pl) return;
    steady_memory(pl, be, tag);
    dt_pipeline_free(pl);
    reused_references(be, kv_root, tag);
}

int main(void) {
    dt_log_level = 0;
    snprintf(root, sizeof root, "%s/model", t_fixtures());
    if (t_tmpdir(tmp, sizeof tmp, "edit-engine")) { T_FAIL("tmpdir", "cannot create one"); return T_DONE(); }
    char kv_root[700];
    snprintf(kv_root, sizeof kv_root, "%s/kv", tmp);
    if (make_kv_root(kv_root, root)) T_FAIL("KV pipeline root", "cannot create %s", kv_root);
    dt_backend *cpu = dt_backend_cpu_create(&(dt_backend_opts){0});
    on_backend(cpu, kv_root);
    split_equals_unsplit(cpu, root, "edit", 0);
    split_equals_unsplit(cpu, kv_root, "KV edit", 0);
    split_equals_unsplit(cpu, root, "inpainting", 1);
    cpu->destroy(cpu);
    if (dt_backend_cuda_available()) {
        dt_backend_opts o = {0};
        o.rope_fp32 = 1;
        dt_backend *cuda = dt_backend_cuda_create(&o);
        if (!cuda) T_FAIL("cuda backend", "%s", dt_last_error());
        else {
            on_backend(cuda, kv_root);
            cuda->destroy(cuda);
        }
    } else if (t_require_gpu_env()) {
        T_FAIL("cuda edit engine", "DITRUN_REQUIRE_GPU=1 but no CUDA GPU is usable");
    } else {
        T_SKIP("cuda edit engine", "no CUDA GPU available on this machine");
    }
    t_rmtree(tmp);
    return T_DONE();
}
