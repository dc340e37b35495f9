/* vae_decoder.c — the decoder walk, resnets, channel norms and activation buffers shared by the FLUX.2 and
 * Qwen-Image VAE decoders (vae_decoder.h). */
#include "models/vae_decoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

/* ---------------- loading ---------------- */

dt_conv *vae_conv_create(dt_backend *be, dt_weights *w, const char *name, float *wt, int cout, int cin, int k, int rows) {
    char buf[256];
    float *bias = dt_malloc((size_t)cout * sizeof(float));
    snprintf(buf, sizeof buf, "%s.bias", name);
    if (dt_weights_read_f32(w, buf, bias, cout)) { free(wt); free(bias); return NULL; }
    dt_clear_error();
    if (rows < 1 || rows > cout) rows = cout;
    dt_conv *c = be->conv_create(be, wt, bias, rows, cin, k, k / 2);   /* rows are the leading [rows, cin·k·k] */
    free(wt);
    free(bias);
    if (!c && !strcmp(dt_last_error(), "unknown error"))
        dt_set_error("%s: backend could not create conv '%s'", dt_weights_path(w), name);
    return c;
}

void vae_shape_str(const st_tensor *t, char *dst, size_t n) {
    if (n) dst[0] = 0;
    for (int i = 0; i < t->ndim && i < ST_MAX_DIMS; i++) {
        size_t l = strlen(dst);
        snprintf(dst + l, n - l, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    }
}

/* One resnet PREFIX: norm1 [cin], conv1 3×3 cin -> cout, norm2 [cout], conv2 3×3, conv_shortcut 1×1 when cin != cout. */
static int load_resnet(const vae_loader *ld, const char *prefix, int cin, int cout, vae_resnet *r) {
    char buf[320];   /* prefix (< 256, from vae_resnets_load) + the longest suffix */
    r->cin = cin;
    r->cout = cout;
    snprintf(buf, sizeof buf, "%s.norm1", prefix);
    if (ld->norm(ld->ctx, buf, cin, &r->n1)) return -1;
    snprintf(buf, sizeof buf, "%s.conv1", prefix);
    if (!(r->conv1 = ld->conv(ld->ctx, buf, cout, cin, 3))) return -1;
    snprintf(buf, sizeof buf, "%s.norm2", prefix);
    if (ld->norm(ld->ctx, buf, cout, &r->n2)) return -1;
    snprintf(buf, sizeof buf, "%s.conv2", prefix);
    if (!(r->conv2 = ld->conv(ld->ctx, buf, cout, cout, 3))) return -1;
    if (cin != cout) {
        snprintf(buf, sizeof buf, "%s.conv_shortcut", prefix);
        if (!(r->shortcut = ld->conv(ld->ctx, buf, cout, cin, 1))) return -1;
    }
    return 0;
}

int vae_resnets_load(const vae_loader *ld, const char *prefix, int n, int cin, int cout, vae_resnet *res) {
    char buf[256];
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "%s.resnets.%d", prefix, i);
        if (load_resnet(ld, buf, i == 0 ? cin : cout, cout, &res[i])) return -1;
    }
    return 0;
}

int vae_up_block_load(const vae_loader *ld, int b, int cin, int cout, int n_res, vae_up_block *u) {
    char prefix[64];
    u->cin = cin;
    u->cout = cout;
    u->n_res = n_res;
    u->res = dt_calloc((size_t)n_res, sizeof *u->res);
    snprintf(prefix, sizeof prefix, "decoder.up_blocks.%d", b);
    return vae_resnets_load(ld, prefix, n_res, cin, cout, u->res);
}

void vae_norm_free(dt_backend *be, vae_norm *n) {
    if (n->gamma.data) be->free(be, &n->gamma);
    if (n->beta.data) be->free(be, &n->beta);
}

void vae_resnet_free(dt_backend *be, vae_resnet *r) {
    vae_norm_free(be, &r->n1);
    vae_norm_free(be, &r->n2);
    if (r->conv1) be->conv_destroy(be, r->conv1);
    if (r->conv2) be->conv_destroy(be, r->conv2);
    if (r->shortcut) be->conv_destroy(be, r->shortcut);
}

void vae_decoder_free(dt_backend *be, vae_decoder *d) {
    dt_conv *cs[3] = {d->post_quant, d->conv_in, d->conv_out};
    for (int i = 0; i < 3; i++)
        if (cs[i]) be->conv_destroy(be, cs[i]);
    for (int i = 0; i < 2; i++) vae_resnet_free(be, &d->mid_res[i]);
    for (int b = 0; b < VAE_MAX_UP_BLOCKS; b++) {
        if (d->up[b].res) {
            for (int i = 0; i < d->up[b].n_res; i++) vae_resnet_free(be, &d->up[b].res[i]);
            free(d->up[b].res);
        }
        if (d->up[b].up_conv) be->conv_destroy(be, d->up[b].up_conv);
    }
    vae_norm_free(be, &d->norm_out);
}

/* ---------------- running ---------------- */

dt_mat vae_view(const vae_act3 *a, int idx, int64_t rows, int64_t cols) {
    return dt_mat_reshape(a->buf[idx], rows, cols);
}

void vae_swap_xy(vae_act3 *a) { int s = a->x; a->x = a->y; a->y = s; }

void vae_run_norm(dt_backend *be, int groups, dt_mat out, dt_mat in, const vae_norm *n, int silu) {
    if (groups) be->group_norm(be, out, in, groups, n->gamma, n->beta, VAE_GN_EPS, silu);
    else be->channel_rmsnorm(be, out, in, n->gamma, silu);
}

void vae_run_resnet(dt_backend *be, int groups, const vae_resnet *r, vae_act3 *a, int h, int w) {
    const int64_t hw = (int64_t)h * w;
    dt_mat X = vae_view(a, a->x, r->cin, hw), T = vae_view(a, a->t, r->cin, hw), Y = vae_view(a, a->y, r->cout, hw);
    vae_run_norm(be, groups, T, X, &r->n1, 1);
    be->conv2d(be, Y, T, r->conv1, h, w);
    T = vae_view(a, a->t, r->cout, hw);
    vae_run_norm(be, groups, T, Y, &r->n2, 1);
    be->conv2d(be, Y, T, r->conv2, h, w);
    if (r->shortcut) {
        be->conv2d(be, T, X, r->shortcut, h, w);
        be->gated_add(be, Y, dt_mat_null(), T);
    } else {
        be->gated_add(be, Y, dt_mat_null(), X);
    }
    vae_swap_xy(a);
}

void vae_run_mid_block(dt_backend *be, int groups, const vae_resnet res[2], const vae_attention *at, vae_act3 *a, int C,
                       int h, int w) {
    vae_run_resnet(be, groups, &res[0], a, h, w);
    if (at->weights) at->run(at->weights, be, groups, a, C, (int64_t)h * w);
    vae_run_resnet(be, groups, &res[1], a, h, w);
}

int vae_decoder_run(dt_backend *be, const vae_decoder *d, const float *latent, int H, int W, float *rgb,
                    uint8_t *rgb8) {
    /* largest activation (elements) over every stage */
    int64_t hw = (int64_t)H * W, cap = (int64_t)d->latent * hw;
    if ((int64_t)d->top * hw > cap) cap = (int64_t)d->top * hw;
    for (int b = 0; b < d->n_up; b++) {
        const vae_up_block *u = &d->up[b];
        int64_t cm = u->cin > u->cout ? u->cin : u->cout;
        if (cm * hw > cap) cap = cm * hw;
        if (u->up_conv) {
            hw *= 4;
            if ((int64_t)u->cout * hw > cap) cap = (int64_t)u->cout * hw;
        }
    }
    if ((int64_t)d->out_channels * hw > cap) cap = (int64_t)d->out_channels * hw;

    vae_act3 a = {.x = 0, .t = 1, .y = 2};
    for (int i = 0; i < 3; i++) a.buf[i] = dt_alloc_or_die(be, 1, cap, be->act_dtype);
    int h = H, w = W;
    hw = (int64_t)h * w;

    /* latent -> post_quant_conv -> conv_in */
    dt_mat L = vae_view(&a, a.t, d->latent, hw);
    be->upload(be, L, latent);
    if (d->post_quant) {
        be->conv2d(be, vae_view(&a, a.y, d->latent, hw), L, d->post_quant, h, w);
        L = vae_view(&a, a.y, d->latent, hw);
    }
    be->conv2d(be, vae_view(&a, a.x, d->top, hw), L, d->conv_in, h, w);

    vae_run_mid_block(be, d->groups, d->mid_res, &d->mid_attn, &a, d->top, h, w);

    /* up blocks */
    for (int b = 0; b < d->n_up; b++) {
        const vae_up_block *u = &d->up[b];
        for (int i = 0; i < u->n_res; i++) vae_run_resnet(be, d->groups, &u->res[i], &a, h, w);
        if (u->up_conv) {
            dt_mat T = vae_view(&a, a.t, u->cout, 4 * (int64_t)h * w);
            be->upsample2x(be, T, vae_view(&a, a.x, u->cout, (int64_t)h * w), h, w);
            h *= 2;
            w *= 2;
            be->conv2d(be, vae_view(&a, a.y, u->up_cout, (int64_t)h * w), T, u->up_conv, h, w);
            vae_swap_xy(&a);
        }
    }
    hw = (int64_t)h * w;

    /* norm + SiLU -> conv_out */
    const int last = d->up[d->n_up - 1].cout;
    dt_mat T = vae_view(&a, a.t, last, hw);
    vae_run_norm(be, d->groups, T, vae_view(&a, a.x, last, hw), &d->norm_out, 1);
    dt_mat Y = vae_view(&a, a.y, d->out_channels, hw);
    be->conv2d(be, Y, T, d->conv_out, h, w);
    if (rgb8) dt_image_rgb8(be, rgb8, Y);   /* 8-bit pixels converted where the image is (a quarter of the bytes) */
    else be->download(be, rgb, Y);
    int rc = be->sync(be);
    for (int i = 0; i < 3; i++) be->free(be, &a.buf[i]);
    return rc;
}
