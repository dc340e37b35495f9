/* vae_flux2_encoder.c — AutoencoderKLFlux2 encoder on backend ops (diffusers Encoder + quant_conv):
 *   conv_in 3×3 (3 -> block_out[0])
 *   → down blocks: layers_per_block resnets (the first changes block_out[i-1] -> block_out[i]), then, except
 *     after the last block, Downsample2D = zero pad bottom/right by one + 3×3 conv with stride 2 (conv2d_strided)
 *   → mid block (resnet, single-head attention, resnet) at block_out[-1]
 *   → GroupNorm + SiLU → conv_out 3×3 (-> 2·latent_channels) → quant_conv 1×1
 *   → posterior mode = the mean = the first latent_channels channels (only those rows of quant_conv are kept).
 * GroupNorms use eps 1e-6, like the decoder. Loaded on demand (dt_vae_load_encoder / first dt_vae_encode),
 * from the weights the dt_vae keeps open. Activations are images [C, H·W] in three rotating buffers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/json.h"
#include "models/vae_flux2_internal.h"

typedef struct {
    int cin, cout, n_res;
    vae_resnet *res;
    dt_conv *down;           /* stride-2 conv; NULL for the last block */
} down_block;

struct vae_encoder {
    int n_blocks;
    int block_out[DT_VAE_MAX_BLOCKS];
    dt_conv *conv_in, *conv_out, *quant;   /* quant: quant_conv's first latent_channels output channels, or NULL */
    down_block down[DT_VAE_MAX_BLOCKS];
    vae_resnet mid_res[2];
    attn mid_attn;
    vae_norm norm_out;
};

/* The encoder's geometry from config.json (the decoder's parse covered the shared keys). */
static int parse_encoder_config(dt_vae *v, vae_encoder *e) {
    const json *j = dt_weights_config(v->w);
    const char *what = dt_weights_path(v->w);
    const dt_vae_config *c = &v->cfg;
    const json *boc = j ? json_get(j, "block_out_channels") : NULL;
    if (!boc || boc->type != JSON_ARRAY || boc->len < 1 || boc->len > DT_VAE_MAX_BLOCKS) {
        dt_set_error("%s: the VAE encoder needs block_out_channels (an array of 1..%d integers) in config.json", what,
                     DT_VAE_MAX_BLOCKS);
        return -1;
    }
    e->n_blocks = (int)boc->len;
    for (int i = 0; i < e->n_blocks; i++) {
        const json *x = json_at(boc, (size_t)i);
        if (!x || x->type != JSON_NUMBER || !x->is_integer || x->integer < 1 || x->integer > 65536 ||
            x->integer % c->norm_groups) {
            dt_set_error("%s: block_out_channels[%d] is not a positive multiple of norm_num_groups %d", what, i,
                         c->norm_groups);
            return -1;
        }
        e->block_out[i] = (int)x->integer;
    }
    const json *dbt = json_get(j, "down_block_types");
    if (dbt) {
        if (dbt->type != JSON_ARRAY || (int)dbt->len != e->n_blocks) {
            dt_set_error("%s: down_block_types must list %d blocks", what, e->n_blocks);
            return -1;
        }
        for (size_t i = 0; i < dbt->len; i++) {
            const json *x = json_at(dbt, i);
            if (!x || x->type != JSON_STRING || strcmp(x->str, "DownEncoderBlock2D") != 0) {
                dt_set_error("%s: down_block_types[%zu] is not DownEncoderBlock2D (unsupported)", what, i);
                return -1;
            }
        }
    }
    if (json_get_int(j, "in_channels", 3) != 3) {
        dt_set_error("%s: in_channels %lld (3 expected)", what, (long long)json_get_int(j, "in_channels", 3));
        return -1;
    }
    if ((1 << (e->n_blocks - 1)) != c->scale_factor) {
        dt_set_error("%s: the encoder downsamples by %d but the decoder upsamples by %d", what, 1 << (e->n_blocks - 1),
                     c->scale_factor);
        return -1;
    }
    return 0;
}

static void vae_encoder_free(dt_vae *v) {
    vae_encoder *e = v->enc;
    if (!e) return;
    dt_backend *be = v->be;
    dt_conv *cs[3] = {e->conv_in, e->conv_out, e->quant};
    for (int i = 0; i < 3; i++)
        if (cs[i]) be->conv_destroy(be, cs[i]);
    for (int b = 0; b < DT_VAE_MAX_BLOCKS; b++) {
        if (e->down[b].res) {
            for (int i = 0; i < e->down[b].n_res; i++) vae_resnet_free(be, &e->down[b].res[i]);
            free(e->down[b].res);
        }
        if (e->down[b].down) be->conv_destroy(be, e->down[b].down);
    }
    for (int i = 0; i < 2; i++) vae_resnet_free(be, &e->mid_res[i]);
    vae_free_attn(be, &e->mid_attn);
    vae_norm_free(be, &e->norm_out);
    free(e);
    v->enc = NULL;
}

int dt_vae_load_encoder(dt_vae *v) {
    if (v->enc) return 0;
    if (!v->be->conv2d_strided) {
        dt_set_error("%s backend: no conv2d_strided op (needed by the VAE encoder)", v->be->name);
        return -1;
    }
    const dt_vae_config *c = &v->cfg;
    vae_encoder *e = dt_calloc(1, sizeof *e);
    v->enc = e;   /* freed by vae_encoder_free on failure, by dt_vae_free after */
    v->enc_free = vae_encoder_free;
    char buf[256];
    if (parse_encoder_config(v, e)) goto fail;
    const int top = e->block_out[e->n_blocks - 1], L = c->latent_channels;
    if (!(e->conv_in = vae_load_conv(v, "encoder.conv_in", e->block_out[0], 3, 3, e->block_out[0]))) goto fail;
    int prev = e->block_out[0];
    for (int b = 0; b < e->n_blocks; b++) {
        down_block *d = &e->down[b];
        d->cin = prev;
        d->cout = e->block_out[b];
        d->n_res = c->layers_per_block;
        d->res = dt_calloc((size_t)(d->n_res > 0 ? d->n_res : 1), sizeof *d->res);
        snprintf(buf, sizeof buf, "encoder.down_blocks.%d", b);
        if (vae_resnets_load(&v->ld, buf, d->n_res, d->cin, d->cout, d->res)) goto fail;
        if (d->n_res == 0 && d->cin != d->cout) {
            dt_set_error("%s: layers_per_block 0 cannot change %d to %d channels", dt_weights_path(v->w), d->cin, d->cout);
            goto fail;
        }
        if (b < e->n_blocks - 1) {
            snprintf(buf, sizeof buf, "encoder.down_blocks.%d.downsamplers.0.conv", b);
            if (!(d->down = vae_load_conv(v, buf, d->cout, d->cout, 3, d->cout))) goto fail;
        }
        prev = d->cout;
    }
    if (vae_resnets_load(&v->ld, "encoder.mid_block", 2, top, top, e->mid_res)) goto fail;
    if (c->mid_attention && vae_load_attn(v, "encoder.mid_block", top, &e->mid_attn)) goto fail;
    if (vae_load_gnorm(v, "encoder.conv_norm_out", top, &e->norm_out)) goto fail;
    if (!(e->conv_out = vae_load_conv(v, "encoder.conv_out", 2 * L, top, 3, 2 * L))) goto fail;
    if (json_get_bool(dt_weights_config(v->w), "use_quant_conv", 1) &&
        !(e->quant = vae_load_conv(v, "quant_conv", 2 * L, 2 * L, 1, L)))
        goto fail;
    return 0;
fail:
    vae_encoder_free(v);
    return -1;
}

/* The encoder on the whole of rgb [3, H, W] (H, W checked) -> latent [L, H/s, W/s]; a vae_tile_fn. */
static int encode_whole(void *ctx, const float *rgb, int H, int W, float *latent) {
    dt_vae *v = ctx;
    const vae_encoder *e = v->enc;
    dt_backend *be = v->be;
    const dt_vae_config *c = &v->cfg;
    const int L = c->latent_channels, top = e->block_out[e->n_blocks - 1];
    /* largest activation (elements) over every stage */
    int64_t hw = (int64_t)H * W, cap = 3 * hw;
    for (int b = 0; b < e->n_blocks; b++) {
        const int64_t cm = e->down[b].cin > e->down[b].cout ? e->down[b].cin : e->down[b].cout;
        if (cm * hw > cap) cap = cm * hw;
        if (e->down[b].down) hw /= 4;
    }
    if ((int64_t)top * hw > cap) cap = (int64_t)top * hw;
    if ((int64_t)2 * L * hw > cap) cap = (int64_t)2 * L * hw;

    vae_act3 a = {.x = 0, .t = 1, .y = 2};
    for (int i = 0; i < 3; i++) a.buf[i] = dt_alloc_or_die(be, 1, cap, be->act_dtype);
    int h = H, w = W;
    hw = (int64_t)h * w;

    /* image -> conv_in */
    dt_mat X = vae_view(&a, a.t, 3, hw);
    be->upload(be, X, rgb);
    be->conv2d(be, vae_view(&a, a.x, e->block_out[0], hw), X, e->conv_in, h, w);

    /* down blocks */
    for (int b = 0; b < e->n_blocks; b++) {
        const down_block *d = &e->down[b];
        for (int i = 0; i < d->n_res; i++) vae_run_resnet(be, c->norm_groups, &d->res[i], &a, h, w);
        if (d->down) {
            const int ho = (h + 1 - 3) / 2 + 1, wo = (w + 1 - 3) / 2 + 1;
            be->conv2d_strided(be, vae_view(&a, a.y, d->cout, (int64_t)ho * wo), vae_view(&a, a.x, d->cout, (int64_t)h * w),
                               d->down, h, w, 2, 0, 0, 1, 1);
            h = ho;
            w = wo;
            vae_swap_xy(&a);
        }
    }
    hw = (int64_t)h * w;

    /* mid block */
    const vae_attention mid_attn = {vae_run_attention, c->mid_attention ? &e->mid_attn : NULL};
    vae_run_mid_block(be, c->norm_groups, e->mid_res, &mid_attn, &a, top, h, w);

    /* GroupNorm + SiLU -> conv_out [2L] -> quant_conv's mean half [L] */
    dt_mat T = vae_view(&a, a.t, top, hw);
    be->group_norm(be, T, vae_view(&a, a.x, top, hw), c->norm_groups, e->norm_out.gamma, e->norm_out.beta, VAE_GN_EPS,
                   1);
    dt_mat Y = vae_view(&a, a.y, 2 * L, hw);
    be->conv2d(be, Y, T, e->conv_out, h, w);
    dt_mat M;
    if (e->quant) {
        M = vae_view(&a, a.t, L, hw);
        be->conv2d(be, M, Y, e->quant, h, w);
    } else {
        M = dt_mat_rows(Y, 0, L);
    }
    be->download(be, latent, M);
    int rc = be->sync(be);
    for (int i = 0; i < 3; i++) be->free(be, &a.buf[i]);
    return rc;
}

int dt_vae_encode(dt_vae *v, const float *rgb, int H, int W, float *latent) {
    if (!v->enc && dt_vae_load_encoder(v)) return -1;
    const dt_vae_config *c = &v->cfg;
    const int f = c->scale_factor;
    if (H < f || W < f || H % f || W % f || H > 65536 || W > 65536) {
        dt_set_error("vae encode: image size %dx%d is not a positive multiple of %d", W, H, f);
        return -1;
    }
    /* diffusers' _tiled_encode when tiling is on and the image is larger than a tile: the tiles' latents blended
     * (the posterior mean of each tile: blending the mean half of quant_conv's output is blending its rows) */
    const vae_tile_geom g = vae_tile_geom_encode(3, c->latent_channels, f, v->tiling.tile);
    v->last_tiled = v->tiling.enabled && vae_tiles_needed(&g, H, W);
    if (v->last_tiled)
        dt_log(2, "vae: encoding %dx%d pixels in %d x %d tiles of %d px (stride %d px)\n", W, H, vae_tile_count(&g, H),
               vae_tile_count(&g, W), g.tile, g.stride);
    return v->last_tiled ? vae_tiled_run(&g, rgb, H, W, latent, encode_whole, v) : encode_whole(v, rgb, H, W, latent);
}
