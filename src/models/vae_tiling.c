/* vae_tiling.c — diffusers' enable_tiling for the VAEs (vae_tiling.h): tile geometry, the blend over the overlap
 * (blend_v, then blend_h, in place on the new tile, from the finished neighbours) and the crop, on the host. */
#include "models/vae_tiling.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int vae_tiling_check(const char *what, int tile, int scale) {
    const int unit = 4 * scale;
    if (tile < unit || tile % unit || tile > 65536) {
        dt_set_error("%s: VAE tile size %d is not a positive multiple of %d (4 x the VAE's scale factor %d; e.g. %d, "
                     "%d, %d)", what, tile, unit, scale, 8 * unit, 16 * unit, 32 * unit);
        return -1;
    }
    return 0;
}

/* diffusers (overlap factor 0.25): tile_latent_min_size = tile / scale, overlap_size = int(latent · 0.75),
 * blend_extent = int(tile · 0.25), row_limit = tile - blend_extent; with a latent tile that is a multiple of 4
 * every product is whole and row_limit = overlap_size · scale (the kept rows of a tile end where the next starts). */
vae_tile_geom vae_tile_geom_decode(int cin, int cout, int scale, int tile) {
    const int lt = tile / scale;
    return (vae_tile_geom){cin, cout, scale, 1, lt, lt - lt / 4, tile / 4, tile - tile / 4};
}

/* diffusers _tiled_encode: overlap_size = int(tile · 0.75) pixels, blend_extent = int(latent · 0.25),
 * row_limit = latent - blend_extent. */
vae_tile_geom vae_tile_geom_encode(int cin, int cout, int scale, int tile) {
    const int lt = tile / scale;
    return (vae_tile_geom){cin, cout, 1, scale, tile, tile - tile / 4, lt / 4, lt - lt / 4};
}

int vae_tiles_needed(const vae_tile_geom *g, int H, int W) { return H > g->tile || W > g->tile; }

int vae_tile_count(const vae_tile_geom *g, int n) { return (n + g->stride - 1) / g->stride; }

/* b[y] = a[y] · (1 - y/e) + b[y] · (y/e) for y < e: the weights rounded to f32 from the double quotient, then two
 * f32 products and their sum, as torch's tensor-by-Python-float arithmetic (ISO C: no fused multiply-add). */
static inline float blend1(float a, float b, int y, int e) {
    const double r = (double)y / e;
    const float wa = (float)(1.0 - r), wb = (float)r;
    const float pa = a * wa, pb = b * wb;
    return pa + pb;
}

int vae_tiled_run(const vae_tile_geom *g, const float *in, int H, int W, float *out, vae_tile_fn fn, void *ctx) {
    const int Ho = (int)((int64_t)H * g->num / g->den), Wo = (int)((int64_t)W * g->num / g->den);
    const int to = (int)((int64_t)g->tile * g->num / g->den), B = g->blend;
    const int nr = vae_tile_count(g, H), nc = vae_tile_count(g, W);
    float *tin = dt_malloc(sizeof(float) * (size_t)g->cin * g->tile * g->tile);     /* [cin, th, tw] */
    float *tout = dt_malloc(sizeof(float) * (size_t)g->cout * to * to);             /* [cout, tho, two] */
    float *right = dt_malloc(sizeof(float) * (size_t)g->cout * to * B);   /* [cout, tho, B]: the left tile's */
    float *bottom = dt_malloc(sizeof(float) * (size_t)nc * g->cout * B * to);   /* per column [cout, B, two] */
    int rc = 0;
    for (int r = 0; r < nr && !rc; r++) {
        const int i0 = r * g->stride, th = H - i0 < g->tile ? H - i0 : g->tile;
        const int tho = (int)((int64_t)th * g->num / g->den);
        for (int c = 0; c < nc; c++) {
            const int j0 = c * g->stride, tw = W - j0 < g->tile ? W - j0 : g->tile;
            const int two = (int)((int64_t)tw * g->num / g->den);
            for (int ch = 0; ch < g->cin; ch++)
                for (int y = 0; y < th; y++)
                    memcpy(tin + ((size_t)ch * th + y) * tw, in + ((size_t)ch * H + i0 + y) * W + j0, sizeof(float) * tw);
            if ((rc = fn(ctx, tin, th, tw, tout))) break;
            float *bot = bottom + (size_t)c * g->cout * B * to;   /* [cout, B, two] of the finished tile above */
            /* blend_v with the tile above: its last e rows (a tile above is never shorter than B) */
            if (r > 0) {
                const int e = tho < B ? tho : B;
                for (int ch = 0; ch < g->cout; ch++)
                    for (int y = 0; y < e; y++) {
                        const float *a = bot + ((size_t)ch * B + B - e + y) * two;
                        float *b = tout + ((size_t)ch * tho + y) * two;
                        for (int x = 0; x < two; x++) b[x] = blend1(a[x], b[x], y, e);
                    }
            }
            /* blend_h with the tile on the left: its last e columns */
            if (c > 0) {
                const int e = two < B ? two : B;
                for (int ch = 0; ch < g->cout; ch++)
                    for (int y = 0; y < tho; y++) {
                        const float *a = right + ((size_t)ch * tho + y) * B + B - e;
                        float *b = tout + ((size_t)ch * tho + y) * two;
                        for (int x = 0; x < e; x++) b[x] = blend1(a[x], b[x], x, e);
                    }
            }
            /* the finished tile's strips for its neighbours below and on the right */
            if (r + 1 < nr)
                for (int ch = 0; ch < g->cout; ch++)
                    memcpy(bot + (size_t)ch * B * two, tout + ((size_t)ch * tho + tho - B) * two, sizeof(float) * B * two);
            if (c + 1 < nc)
                for (int ch = 0; ch < g->cout; ch++)
                    for (int y = 0; y < tho; y++)
                        memcpy(right + ((size_t)ch * tho + y) * B, tout + ((size_t)ch * tho + y) * two + two - B,
                               sizeof(float) * B);
            /* the crop: the first keep rows and columns, at the sum of the earlier tiles' crops (keep each) */
            const int oy = r * g->keep, ox = c * g->keep;
            int kh = tho < g->keep ? tho : g->keep, kw = two < g->keep ? two : g->keep;
            if (oy + kh > Ho) kh = Ho - oy;
            if (ox + kw > Wo) kw = Wo - ox;
            for (int ch = 0; ch < g->cout; ch++)
                for (int y = 0; y < kh; y++)
                    memcpy(out + ((size_t)ch * Ho + oy + y) * Wo + ox, tout + ((size_t)ch * tho + y) * two,
                           sizeof(float) * kw);
        }
    }
    free(tin);
    free(tout);
    free(right);
    free(bottom);
    return rc;
}

typedef struct {
    dt_backend *be;
    const vae_decoder *d;
} decode_ctx;

static int decode_tile(void *ctx, const float *lat, int h, int w, float *rgb) {
    const decode_ctx *c = ctx;
    return vae_decoder_run(c->be, c->d, lat, h, w, rgb, NULL);
}

int vae_decoder_run_tiled(dt_backend *be, const vae_decoder *d, const dt_vae_tiling *t, int scale, const float *latent,
                          int H, int W, float *rgb, uint8_t *rgb8, int *tiled) {
    const vae_tile_geom g = vae_tile_geom_decode(d->latent, d->out_channels, scale, t->tile);
    const int tile_it = t->enabled && vae_tiles_needed(&g, H, W);
    if (tiled) *tiled = tile_it;
    if (!tile_it) return vae_decoder_run(be, d, latent, H, W, rgb, rgb8);
    const size_t hw = (size_t)H * scale * (size_t)W * scale;
    float *img = rgb ? rgb : dt_malloc(sizeof(float) * d->out_channels * hw);
    dt_log(2, "vae: decoding %dx%d latents in %d x %d tiles of %d px (stride %d px, blend %d px)\n", W, H,
           vae_tile_count(&g, H), vae_tile_count(&g, W), t->tile, g.stride * scale, g.blend);
    decode_ctx c = {be, d};
    int rc = vae_tiled_run(&g, latent, H, W, img, decode_tile, &c);
    if (!rc && rgb8) dt_image_planes_u8(img, hw, rgb8, NULL);   /* the bytes dt_image_rgb8 makes */
    if (img != rgb) free(img);
    return rc;
}

int64_t vae_decoder_act_bytes(const vae_decoder *d, int H, int W, int elem, int attn_per_token) {
    /* the largest activation over every stage, as vae_decoder_run sizes its buffers */
    const int64_t hw0 = (int64_t)H * W;
    int64_t hw = hw0, cap = (int64_t)(d->latent > d->top ? d->latent : d->top) * hw;
    for (int b = 0; b < d->n_up; b++) {
        const vae_up_block *u = &d->up[b];
        const int64_t cm = u->cin > u->cout ? u->cin : u->cout;
        if (cm * hw > cap) cap = cm * hw;
        if (u->up_cout > 0) {   /* (up_conv may be NULL in a description) */
            hw *= 4;
            if ((int64_t)u->cout * hw > cap) cap = (int64_t)u->cout * hw;
        }
    }
    if ((int64_t)d->out_channels * hw > cap) cap = (int64_t)d->out_channels * hw;
    return (3 * cap + (int64_t)attn_per_token * d->top * hw0) * elem;
}

int64_t vae_decoder_tiled_act_bytes(const vae_decoder *d, const dt_vae_tiling *t, int scale, int H, int W, int elem,
                                    int attn_per_token) {
    const vae_tile_geom g = vae_tile_geom_decode(d->latent, d->out_channels, scale, t->tile);
    if (!vae_tiles_needed(&g, H, W)) return vae_decoder_act_bytes(d, H, W, elem, attn_per_token);
    return vae_decoder_act_bytes(d, H < g.tile ? H : g.tile, W < g.tile ? W : g.tile, elem, attn_per_token);
}
