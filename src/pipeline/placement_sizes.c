/* placement_sizes.c — the placement planner's inputs for a pipeline folder (placement.h, dt_place_sizes_for): weight
 * bytes from the safetensors headers, the VAE decode's activations from its config, the transformer's and text
 * encoder's activations estimated from their widths (the family's part through the registry: dt_family.place_sizes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/weights.h"
#include "models/qwen3.h"
#include "pipeline/family.h"
#include "pipeline/placement.h"

/* Device bytes of a component's weights (f32 tensors kept at elem bytes); *quantized: any packed 4/8-bit Linear. */
static int weight_bytes(const char *dir, int elem, int64_t *bytes, int *quantized, dt_weights **keep) {
    dt_weights *w = dt_weights_open(dir);
    if (!w) return -1;
    int64_t b = 0;
    int q = 0;
    for (size_t i = 0, n = dt_weights_count(w); i < n; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        b += t->dtype == DT_F32 ? (int64_t)t->nbytes / 4 * elem : (int64_t)t->nbytes;
        q |= t->dtype == DT_U32 || dt_dtype_is_block(t->dtype);
    }
    *bytes = b;
    if (quantized) *quantized = q;
    if (keep) *keep = w;
    else dt_weights_close(w);
    return 0;
}

int dt_place_sizes_for(const char *root, int W, int H, int T, int elem, int tile, int resident, dt_place_sizes *s) {
    memset(s, 0, sizeof *s);
    s->resident = resident;
    char *te = dt_path_join(root, "text_encoder"), *tr = dt_path_join(root, "transformer"), *va = dt_path_join(root, "vae");
    dt_weights *tw = NULL;
    int rc = -1, quantized = 0;
    if (weight_bytes(te, elem, &s->text_encoder, NULL, NULL) || weight_bytes(tr, elem, &s->transformer, &quantized, &tw) ||
        weight_bytes(va, elem, &s->vae, NULL, NULL))
        goto out;
    /* the family's part: the transformer's widths and the VAE decode's activations */
    const dt_family *fam = dt_family_for_model(root);
    if (!fam) goto out;
    if (!fam->place_sizes) { dt_set_error("%s: no memory plan for %s pipelines", root, fam->title); goto out; }
    dt_family_place fp;
    if (fam->place_sizes(dt_weights_config(tw), tr, va, W, H, tile, elem, &fp)) goto out;
    const int D = fp.hidden, F = fp.mlp, hd = fp.head_dim, scale = fp.scale;
    s->vae_act = fp.vae_act;
    s->vae_tile_act = fp.vae_tile_act;
    dt_qwen3_config q;
    if (dt_qwen3_read_config(te, &q)) goto out;
    s->te_act = (int64_t)T * (6LL * q.hidden + 3LL * q.intermediate) * elem;
    /* 16 pixels per image token (both VAEs 8x, then 2x2 patches) */
    const int64_t N = (int64_t)(H / (2 * scale)) * (W / (2 * scale)), L = N + T;
    s->dit_act = L * (7LL * D + 3LL * F) * elem + L * hd * 8 + (quantized ? (3LL * D + 2LL * F) * D * 2 : 0);
    rc = 0;
out:
    if (tw) dt_weights_close(tw);
    free(te);
    free(tr);
    free(va);
    return rc;
}
