/* request.c — an image request's defaults and ranges against a pipeline's description (engine.h), without
 * running it: the engine resolves every request through it, and a server checks requests before queueing. */
#include <math.h>

#include "pipeline/engine.h"

/* The editing inputs together: what goes with what, the strength and the number of references. */
static int check_edit(const dt_pipeline_info *in, dt_gen_params *g) {
    if (!in->editing) {
        dt_set_error("generate: this pipeline (%s) takes no reference images or inpainting inputs", in->class_name);
        return -1;
    }
    if (g->n_refs < 0 || g->n_refs > DT_GEN_MAX_REFS || (g->n_refs && !g->refs)) {
        dt_set_error("generate: %d reference images (at most %d)", g->n_refs, DT_GEN_MAX_REFS);
        return -1;
    }
    if (g->mask && !g->init_image) { dt_set_error("generate: a mask (--mask) needs the image to inpaint (--init-image)"); return -1; }
    if (g->init_image && !g->mask && !in->img2img) {
        dt_set_error("generate: inpainting (--init-image) needs a mask (--mask; white = repaint, black = keep)");
        return -1;
    }
    if (g->strength != 0 && !g->init_image) {
        dt_set_error("generate: --strength %g applies to inpainting (--init-image with --mask)", g->strength);
        return -1;
    }
    if (g->init_image && g->strength == 0) g->strength = DT_GEN_DEFAULT_STRENGTH;
    if (g->init_image && !(g->strength > 0 && g->strength <= 1)) {
        dt_set_error("generate: --strength %g is out of range (0, 1]", g->strength);
        return -1;
    }
    return 0;
}

int dt_gen_params_resolve(const dt_pipeline_info *in, dt_gen_params *g) {
    if (!g->prompt) { dt_set_error("generate: a prompt is required"); return -1; }
    if (!g->negative_prompt) g->negative_prompt = "";
    if (g->steps == 0) g->steps = in->default_steps;
    if (g->steps < 1 || g->steps > 1000) { dt_set_error("generate: steps %d out of range 1..1000", g->steps); return -1; }
    if (g->guidance < 0) g->guidance = in->default_guidance;
    if (!(g->guidance <= 100.0f)) { dt_set_error("generate: guidance %g out of range 0..100", g->guidance); return -1; }
    if (g->max_seq_len == 0) g->max_seq_len = 512;
    if (g->max_seq_len < 1 || g->max_seq_len > 32768) {
        dt_set_error("generate: max sequence length %d out of range 1..32768", g->max_seq_len);
        return -1;
    }
    if ((g->cfg_normalization_set || g->cfg_truncation_set) && !in->cfg_shaping) {
        dt_set_error("generate: %s is a Z-Image guidance option; the %s family (%s) has none",
                     g->cfg_normalization_set ? "cfg_normalization" : "cfg_truncation", in->family, in->class_name);
        return -1;
    }
    if (!g->cfg_normalization_set) g->cfg_normalization = 0.0f;
    if (!g->cfg_truncation_set) g->cfg_truncation = 1.0f;
    if (!(g->cfg_normalization >= 0.0f && g->cfg_normalization <= 100.0f)) {
        dt_set_error("generate: cfg_normalization %g out of range 0..100 (0: off)", g->cfg_normalization);
        return -1;
    }
    if (!(g->cfg_truncation >= 0.0f && g->cfg_truncation <= 100.0f)) {
        dt_set_error("generate: cfg_truncation %g out of range 0..100 (above 1: never truncated)", g->cfg_truncation);
        return -1;
    }
    const int edit = g->n_refs != 0 || g->init_image || g->mask;
    if (edit && check_edit(in, g)) return -1;
    if (!edit && g->width == 0) g->width = 1024;
    if (!edit && g->height == 0) g->height = 1024;
    const int mult = in->size_multiple > 0 ? in->size_multiple : 1;
    if (in->size_round_up && g->width > 0 && g->height > 0 && g->width <= 65536 && g->height <= 65536) {
        g->width = (g->width + mult - 1) / mult * mult;   /* as the reference (Krea 2): any size from 1 pixel */
        g->height = (g->height + mult - 1) / mult * mult;
    }
    if ((g->width && g->width < mult) || (g->height && g->height < mult)) {
        dt_set_error("generate: image size %dx%d is smaller than %d pixels (this model's size multiple)", g->width,
                     g->height, mult);
        return -1;
    }
    if (g->width > in->max_side || g->height > in->max_side) {
        dt_set_error("generate: image size %dx%d is over %d pixels a side (this model's limit)", g->width, g->height,
                     in->max_side);
        return -1;
    }
    g->width = g->width / mult * mult;
    g->height = g->height / mult * mult;
    const int64_t tokens = (int64_t)(g->width / mult) * (g->height / mult);
    if (in->max_image_tokens > 0 && tokens > in->max_image_tokens) {
        const int side = (int)sqrt((double)in->max_image_tokens) * mult;
        dt_set_error("generate: image size %dx%d is %lld image tokens, more than this model's schedule holds (%lld: its "
                     "time shift e^mu overflows float32 above that; a square image up to %dx%d)", g->width, g->height,
                     (long long)tokens, (long long)in->max_image_tokens, side, side);
        return -1;
    }
    return 0;
}
