/* image_meta.c — the PNG text chunks of a generated image (image_meta.h). */
#include "pipeline/image_meta.h"

#include <stdio.h>

#include "core/common.h"

static void add(dt_image_meta *m, const char *key, const char *value) {
    if (m->n < DT_IMAGE_META_MAX) m->text[m->n++] = (dt_png_text){key, value};
}

void dt_image_meta_fill(dt_image_meta *m, const dt_gen_params *g, int steps, int w, int h, const char *model) {
    m->n = 0;
    snprintf(m->seed, sizeof m->seed, "%llu", (unsigned long long)g->seed);
    snprintf(m->steps, sizeof m->steps, "%d", steps);
    snprintf(m->size, sizeof m->size, "%dx%d", w, h);
    snprintf(m->software, sizeof m->software, "ditrun %s", DITRUN_VERSION);
    add(m, "prompt", g->prompt ? g->prompt : "");
    add(m, "seed", m->seed);
    add(m, "steps", m->steps);
    add(m, "size", m->size);
    add(m, "model", model ? model : "");
    add(m, "Software", m->software);
    if (g->negative_prompt && g->negative_prompt[0]) add(m, "negative_prompt", g->negative_prompt);
    if (g->guidance >= 0) {
        snprintf(m->guidance, sizeof m->guidance, "%g", (double)g->guidance);
        add(m, "guidance", m->guidance);
    }
    if (g->n_refs > 0) {
        snprintf(m->refs, sizeof m->refs, "%d", g->n_refs);
        add(m, "reference_images", m->refs);
    }
    if (g->cache.kind != DT_CACHE_OFF) {   /* step caching changes the image: said where it was on */
        dt_cache_format(&g->cache, m->cache, sizeof m->cache);
        add(m, "cache", m->cache);
    }
    if (g->init_image) {
        snprintf(m->strength, sizeof m->strength, "%g", g->strength > 0 ? g->strength : DT_GEN_DEFAULT_STRENGTH);
        add(m, "strength", m->strength);
    }
}
