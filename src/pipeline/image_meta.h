/* image_meta.h — the text chunks stored in a generated image's PNG (prompt, seed, steps, size, model, Software,
 * and the negative prompt and guidance when the request set them; for edits the number of reference images and the
 * inpainting strength; the step cache when one was on). One list for every writer (`ditrun generate`,
 * the server), so the same settings give byte-identical files. */
#ifndef DT_IMAGE_META_H
#define DT_IMAGE_META_H

#include "pipeline/generate.h"
#include "image/png.h"

#define DT_IMAGE_META_MAX 11

typedef struct {
    dt_png_text text[DT_IMAGE_META_MAX];
    int n;
    char seed[24], steps[16], size[32], guidance[32], strength[32], refs[16], software[48], cache[72];   /* the formatted values text[] points at */
} dt_image_meta;

/* Fill m for request g (as given: guidance < 0 and an empty negative prompt are left out), the steps run and the
 * image's size; model = the model root as the user named it. m's entries point into m, g and model. */
void dt_image_meta_fill(dt_image_meta *m, const dt_gen_params *g, int steps, int w, int h, const char *model);

#endif
