/* placement_sizes.c — the placement planner's inputs for a pipeline folder (placement.h, dt_place_sizes_for): weight
 * bytes from the safetensors headers, the VAE decode's activations from its config, the transformer's and text
 * encoder's activations estimated from their widths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/weights.h"
#include "models/flux2.h"
#include "models/krea2.h"
#include "models/qwen3.h"
#include "models/vae_flux2.h"
#include "models/vae_qwenimage.h"
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

int dt_place_sizes_for(const char *root, int W, int H, int T, int elem, int tile, int resident, dt_place_sizes *s) {
    memset(s, 0, sizeof *s);
    s->resident = resident;
    char *te = dt_path_join(root, "text_encoder"), *tr = dt_path_join(root, "transformer"), *va = dt_path_join(root, "vae");
    dt_weights *tw = NULL;
    int rc = -1, quantized = 0, te_quantized = 0;
    if (weight_bytes(te, elem, &s->text_encoder, &s->te_packed, &te_quantized, NULL) ||
        weight_bytes(tr, elem, &s->transformer, &s->transformer_packed, &quantized, &tw) ||
        weight_bytes(va, elem, &s->vae, NULL, NULL, NULL))
        goto out;
    /* the transformer's widths: FLUX.2 or Krea 2 by its config */
    const json *cfg = dt_weights_config(tw);
    const char *cls = cfg ? json_get_str(cfg, "_class_name") : NULL;
    int D, F, hd;
    const int krea2 = cls && !strcmp(cls, "Krea2Transformer2DModel");
    if (krea2) {
        krea2_config c;
        if (krea2_config_parse(cfg, tr, &c)) goto out;
        D = c.hidden, F = c.intermediate, hd = c.head_dim;
    } else {
        flux2_config c;
        if (flux2_config_parse(cfg, tr, &c)) goto out;
        D = c.hidden, F = c.mlp_hidden, hd = c.head_dim;
    }
    dt_qwen3_config q;
    if (dt_qwen3_read_config(te, &q)) goto out;
    s->te_act = (int64_t)T * (6LL * q.hidden + 3LL * q.intermediate) * elem;
    if (te_quantized) s->te_qbuf = 3 * (2LL * q.intermediate) * q.hidden * 2;
    /* the VAE: FLUX.2 (8x, 2x2 patches) or Qwen-Image (8x, 2x2 packing): 16 pixels per image token */
    dt_vae_config fv;
    static dt_qvae_config qv;   /* (static: 2 KB of latent statistics) */
    int scale;
    if (!krea2) {   /* Krea 2 pipelines decode with the Qwen-Image VAE */
        if (dt_vae_read_config(va, &fv)) goto out;
        scale = fv.scale_factor;
        s->vae_tile_px = tile ? tile : fv.sample_size;
    } else {
        if (dt_qvae_read_config(va, &qv)) goto out;
        scale = qv.scale_factor;
        s->vae_tile_px = tile ? tile : DT_QVAE_DEFAULT_TILE;
    }
    /* the tile, and without one asked for the half tile (a multiple of 4 x the scale, as tiles must be) */
    const int lh = H / scale, lw = W / scale, step = 4 * scale;
    const int half = tile ? 0 : s->vae_tile_px / 2 / step * step;
    s->vae_small_tile_px = half >= step ? half : 0;
    int cmax = 0;   /* the VAE's widest stage */
    for (int i = 0; i < (krea2 ? qv.n_mult : fv.n_blocks); i++) {
        const int c = krea2 ? qv.base_dim * qv.dim_mult[i] : fv.block_out[i];
        if (c > cmax) cmax = c;
    }
    const int attention = krea2 || fv.mid_attention;
    for (int k = 0; k < 3; k++) {
        const int t = k == 0 ? 0 : k == 1 ? s->vae_tile_px : s->vae_small_tile_px;
        if (k && (!t || (lh <= t / scale && lw <= t / scale))) continue;   /* one tile: tiling changes nothing */
        const int64_t b = krea2 ? dt_qvae_decode_act_bytes(&qv, t, lh, lw, elem) : dt_vae_decode_act_bytes(&fv, t, lh, lw, elem);
        *(k == 0 ? &s->vae_act : k == 1 ? &s->vae_tile_act : &s->vae_small_tile_act) = b;
        s->vae_scratch[k] = vae_scratch(cmax, attention, k ? (H < t ? H : t) : H, k ? (W < t ? W : t) : W, scale);
    }
    const int64_t N = (int64_t)(H / (2 * scale)) * (W / (2 * scale)), L = N + T;
    s->dit_act = L * (7LL * D + 3LL * F) * elem + L * hd * 8;
    /* three of the largest (the single blocks' fused projection); FLUX.2's side queue (the double blocks' text
     * stream) one more of its largest, the MLP's 2F x D */
    if (quantized) s->dit_qbuf = 3 * (3LL * D + 2LL * F) * D * 2 + (krea2 ? 0 : 2LL * F * D * 2);
    s->workspace = DT_PLACE_WORKSPACE;
    s->host_ok = 1;   /* (the CUDA backend's default paths; the caller knows better) */
    rc = 0;
out:
    if (tw) dt_weights_close(tw);
    free(te);
    free(tr);
    free(va);
    return rc;
}
