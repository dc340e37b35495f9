/* placement_sizes.c — the placement planner's inputs for a pipeline folder (placement.h, dt_place_sizes_for): weight
 * bytes from the safetensors headers, the VAE decode's activations from its config, the transformer's and text
 * encoder's activations estimated from their widths (the family's part through the registry: dt_family.place_sizes),
 * the CUDA backend's grow-only buffers (dequantized weights, the decode's scratch) from the same widths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/json.h"
#include "io/weights.h"
#include "models/qwen3.h"
#include "pipeline/family.h"
#include "pipeline/placement.h"

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Device bytes of a component's weights (f32 tensors kept at elem bytes; MLX scales and biases as the f32 pairs the
 * CUDA backend keeps); *packed: those of the MLX 4/8-bit Linears' packed weights, scales and biases (what host weights
 * keep off the device); *quantized: any packed 4/8-bit Linear (GGUF blocks too). */
static int weight_bytes(const char *dir, int elem, int64_t *bytes, int64_t *packed, int *quantized, dt_weights **keep) {
    dt_weights *w = dt_weights_open(dir);
    if (!w) return -1;
    int64_t b = 0, pk = 0;
    int q = 0;
    for (size_t i = 0, n = dt_weights_count(w); i < n; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        const int mlx_sb = t->dtype != DT_U32 && (ends_with(t->name, ".scales") || ends_with(t->name, ".biases"));
        const int64_t d = mlx_sb ? t->numel * 4 : t->dtype == DT_F32 ? (int64_t)t->nbytes / 4 * elem : (int64_t)t->nbytes;
        b += d;
        if (mlx_sb || t->dtype == DT_U32) pk += d;
        q |= t->dtype == DT_U32 || dt_dtype_is_block(t->dtype);
    }
    *bytes = b;
    if (packed) *packed = pk;
    if (quantized) *quantized = q;
    if (keep) *keep = w;
    else dt_weights_close(w);
    return 0;
}

/* The CUDA backend's grow-only scratch of an H x W decode (cuda_image.cu conv2d, cuda_attention.cu's generic path:
 * the VAE's head is wider than the flash kernels take): im2col columns of the widest 3x3 convolution at full size,
 * at most 2^27 bf16, and with mid-block attention over the (H/f)·(W/f) latent tokens its f32 scores and bf16
 * probabilities in chunks of at most 2^26 scores; each buffer grows by 1/8 past what is asked. */
static int64_t vae_scratch(int cmax, int attention, int H, int W, int f) {
    int64_t col = 9LL * cmax * H * W;
    if (col > (1LL << 27)) col = 1LL << 27;
    int64_t b = col * 2 + col * 2 / 8;
    if (attention) {
        const int64_t n = (int64_t)(H / f) * (W / f), ld = (n + 7) / 8 * 8;
        int64_t qc = (1LL << 26) / ld;
        if (qc < 16) qc = 16;
        if (qc > n) qc = n;
        const int64_t a = qc * ld * 6 + 256;
        b += a + a / 8;
    }
    return b;
}

int dt_place_sizes_for(const char *root, int W, int H, int T, int elem, int tile, int resident, int guidance_batch,
                       dt_place_sizes *s) {
    memset(s, 0, sizeof *s);
    s->resident = resident;
    char *te = dt_path_join(root, "text_encoder"), *tr = dt_path_join(root, "transformer"), *va = dt_path_join(root, "vae");
    dt_weights *tw = NULL;
    int rc = -1, quantized = 0, te_quantized = 0;
    if (weight_bytes(te, elem, &s->text_encoder, &s->te_packed, &te_quantized, NULL) ||
        weight_bytes(tr, elem, &s->transformer, &s->transformer_packed, &quantized, &tw) ||
        weight_bytes(va, elem, &s->vae, NULL, NULL, NULL))
        goto out;
    /* the family's part: the transformer's widths and the VAE decode's activations (the tile's, then without a tile
     * asked for the half tile's: a multiple of 4 x the scale, as tiles must be) */
    const dt_family *fam = dt_family_for_model(root);
    if (!fam) goto out;
    if (!fam->place_sizes) { dt_set_error("%s: no memory plan for %s pipelines", root, fam->title); goto out; }
    dt_family_place fp, half;
    memset(&fp, 0, sizeof fp);
    if (fam->place_sizes(dt_weights_config(tw), tr, va, W, H, tile, elem, &fp)) goto out;
    const int D = fp.hidden, F = fp.mlp, hd = fp.head_dim, scale = fp.scale, step = 4 * scale;
    s->vae_act = fp.vae_act;
    s->vae_tile_act = fp.vae_tile_act;
    s->vae_tile_px = fp.vae_tile_px;
    const int half_px = tile ? 0 : fp.vae_tile_px / 2 / step * step;
    if (half_px >= step && (H > half_px || W > half_px)) {
        memset(&half, 0, sizeof half);
        if (fam->place_sizes(dt_weights_config(tw), tr, va, W, H, half_px, elem, &half)) goto out;
        s->vae_small_tile_act = half.vae_tile_act;
        s->vae_small_tile_px = half_px;
    }
    const int px[3] = {0, s->vae_tile_act ? s->vae_tile_px : 0, s->vae_small_tile_act ? half_px : 0};
    for (int k = 0; k < 3; k++)
        if (!k || px[k])
            s->vae_scratch[k] = vae_scratch(fp.vae_cmax, fp.vae_attention, k && px[k] < H ? px[k] : H,
                                            k && px[k] < W ? px[k] : W, scale);
    dt_qwen3_config q;
    if (dt_qwen3_read_config(te, &q)) goto out;
    s->te_act = (int64_t)T * (6LL * q.hidden + 3LL * q.intermediate) * elem;
    if (te_quantized) s->te_qbuf = 3 * (2LL * q.intermediate) * q.hidden * 2;
    /* 16 pixels per image token (both VAEs 8x, then 2x2 patches) */
    const int64_t N = (int64_t)(H / (2 * scale)) * (W / (2 * scale)), L = N + T;
    /* the guidance batch: both sequences' rows in every buffer, for a pipeline whose default runs guidance (not
     * distilled: a distilled one is planned for its default, one pass per step) */
    char *idx_path = dt_path_join(root, "model_index.json");
    json *idx = json_parse_file(idx_path);
    const int distilled = idx && json_get_bool(idx, "is_distilled", 0);
    json_free(idx);
    free(idx_path);
    dt_clear_error();   /* (a folder without model_index.json: no guidance known, planned as guided) */
    s->dit_batch = guidance_batch && fam->guidance_batch && !distilled ? 2 : 1;
    s->dit_act = s->dit_batch * (L * (7LL * D + 3LL * F) * elem + L * hd * 8);
    /* three of the largest Linear (the single blocks' fused projection); a side queue one more of its largest, the
     * MLP's 2F x D */
    if (quantized) s->dit_qbuf = 3 * (3LL * D + 2LL * F) * D * 2 + (fp.side_queue ? 2LL * F * D * 2 : 0);
    s->workspace = DT_PLACE_WORKSPACE + DT_PLACE_POOL_SLACK;
    s->host_ok = 1;   /* (the CUDA backend's default paths; the caller knows better) */
    rc = 0;
out:
    if (tw) dt_weights_close(tw);
    free(te);
    free(tr);
    free(va);
    return rc;
}

void dt_family_place_vae(const dt_vae_config *v, int W, int H, int tile, int elem, dt_family_place *o) {
    o->scale = v->scale_factor;
    const int lh = H / o->scale, lw = W / o->scale, t = tile ? tile : v->sample_size;
    o->vae_act = dt_vae_decode_act_bytes(v, 0, lh, lw, elem);
    o->vae_tile_act = lh > t / o->scale || lw > t / o->scale ? dt_vae_decode_act_bytes(v, t, lh, lw, elem) : 0;
    o->vae_tile_px = t;
    o->vae_cmax = 0;
    for (int i = 0; i < v->n_blocks; i++) o->vae_cmax = v->block_out[i] > o->vae_cmax ? v->block_out[i] : o->vae_cmax;
    o->vae_attention = v->mid_attention;
}
