/* klein_edit.c — a FLUX.2-klein request's reference images and inpainting inputs prepared, encoded and packed
 * (klein_edit.h). */
#include "pipeline/klein_edit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/edit_prep.h"
#include "pipeline/ref_tokens.h"

void klein_edit_free(klein_edit *e) {
    for (int i = 0; i < e->n_imgs; i++) dt_prep_image_free(&e->imgs[i]);
    free(e->imgs);
    free(e->ref_tok);
    free(e->ref_ids);
    free(e->init_tok);
    free(e->mask_tok);
    memset(e, 0, sizeof *e);
}

void klein_ref_cache_clear(klein_ref_cache *c) {
    for (int i = 0; i < c->n; i++) dt_prep_image_free(&c->imgs[i]);
    free(c->imgs);
    free(c->tok);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

int klein_ref_cache_matches(const klein_ref_cache *c, const klein_edit *e) {
    if (!c->tok || c->n != e->n_imgs || e->mask_tok) return 0;
    for (int i = 0; i < c->n; i++) {
        const dt_prep_image *a = &c->imgs[i], *b = &e->imgs[i];
        if (a->w != b->w || a->h != b->h || memcmp(a->rgb, b->rgb, sizeof(float) * 3 * (size_t)a->w * a->h)) return 0;
    }
    return 1;
}

void klein_ref_cache_set_images(klein_ref_cache *c, const klein_edit *e) {
    klein_ref_cache_clear(c);
    c->imgs = dt_calloc((size_t)e->n_imgs, sizeof *c->imgs);
    c->n = e->n_imgs;
    for (int i = 0; i < c->n; i++) {
        const size_t bytes = sizeof(float) * 3 * (size_t)e->imgs[i].w * e->imgs[i].h;
        c->imgs[i].w = e->imgs[i].w;
        c->imgs[i].h = e->imgs[i].h;
        c->imgs[i].rgb = dt_malloc(bytes);
        memcpy(c->imgs[i].rgb, e->imgs[i].rgb, bytes);
    }
}

void klein_ref_cache_set_tokens(klein_ref_cache *c, const klein_edit *e, int C) {
    c->r = e->r;
    c->tok = dt_malloc(sizeof(float) * (size_t)e->r * C);
    c->ids = dt_malloc(sizeof(float) * (size_t)e->r * 4);
    memcpy(c->tok, e->ref_tok, sizeof(float) * (size_t)e->r * C);
    memcpy(c->ids, e->ref_ids, sizeof(float) * (size_t)e->r * 4);
}

int klein_edit_prepare(const dt_gen_params *g, int multiple, klein_edit *e) {
    char nm[48];
    /* the images in token order: inpainting's init image first (T = 10), then the references */
    e->imgs = dt_calloc((size_t)g->n_refs + 1, sizeof *e->imgs);
    e->n_imgs = 0;
    /* every reference checked before any is prepared (the reference checks them all first) */
    for (int i = 0; i < g->n_refs; i++) {
        snprintf(nm, sizeof nm, "reference image %d", i + 1);
        if (dt_prep_check_reference(&g->refs[i], g->ref_names && g->ref_names[i] ? g->ref_names[i] : nm)) goto fail;
    }
    if (g->init_image) {
        const char *iname = g->init_name ? g->init_name : "init image", *mname = g->mask_name ? g->mask_name : "mask";
        if (dt_prep_init_image(g->init_image, iname, multiple, &e->imgs[0])) goto fail;
        e->n_imgs = 1;
        const int w = e->imgs[0].w, h = e->imgs[0].h;
        if ((e->W && e->W != w) || (e->H && e->H != h))
            dt_log(1, "ditrun: note: inpainting keeps the init image's size %dx%d (the requested %dx%d is ignored)\n", w,
                   h, e->W, e->H);
        e->W = w;
        e->H = h;
        if (dt_prep_mask(g->mask, mname, g->init_image->w, g->init_image->h, w, h, multiple, NULL, &e->mask_tok))
            goto fail;
    }
    /* inpainting with several references: one batch at the first one's floored size, as the reference prepares its
     * image_reference list (one reference: on its own, as in plain editing) */
    const int batch = g->init_image && g->n_refs >= 2;
    const int bw = batch ? g->refs[0].w / multiple * multiple : 0, bh = batch ? g->refs[0].h / multiple * multiple : 0;
    for (int i = 0; i < g->n_refs; i++) {
        snprintf(nm, sizeof nm, "reference image %d", i + 1);
        const char *rn = g->ref_names && g->ref_names[i] ? g->ref_names[i] : nm;
        if (batch ? dt_prep_reference_in_batch(&g->refs[i], rn, bw, bh, &e->imgs[e->n_imgs])
                  : dt_prep_reference(&g->refs[i], rn, multiple, &e->imgs[e->n_imgs]))
            goto fail;
        e->n_imgs++;
    }
    if (!g->init_image) dt_prep_output_size(e->imgs, e->n_imgs, &e->H, &e->W);
    return 0;
fail:
    klein_edit_free(e);
    return -1;
}

int klein_edit_encode(dt_vae *vae, int C, klein_edit *e) {
    dt_ref_tokens rt = {0};
    if (dt_ref_tokens_encode(vae, e->imgs, e->n_imgs, &rt)) return -1;
    if (rt.channels != C) {
        dt_set_error("generate: the VAE gives %d latent channels per token, the transformer takes %d", rt.channels, C);
        dt_ref_tokens_free(&rt);
        return -1;
    }
    e->r = rt.n_tokens;
    e->ref_tok = rt.tokens;
    e->ref_ids = rt.ids;
    rt.tokens = rt.ids = NULL;
    if (e->mask_tok) {   /* inpainting: the init latents are image 0's tokens (also the first reference) */
        const size_t ni = (size_t)rt.grid_h[0] * rt.grid_w[0] * C;
        e->init_tok = dt_malloc(sizeof(float) * ni);
        memcpy(e->init_tok, e->ref_tok, sizeof(float) * ni);
    }
    dt_ref_tokens_free(&rt);
    for (int i = 0; i < e->n_imgs; i++) dt_prep_image_free(&e->imgs[i]);
    return 0;
}
