/* edit_prep.h — image inputs of FLUX.2-klein editing prepared exactly as the reference pipelines do
 * (diffusers' FLUX.2-klein pipelines, plain and inpainting, with their Flux2ImageProcessor), from decoded
 * images (image.h) to the float arrays the VAE encoder takes.
 *
 * `multiple` below is the pipelines' 2 x vae_scale_factor (16 for the released VAE: dt_vae_config's
 * scale_factor is vae_scale_factor); sizes are floored to it.
 *
 * Reference images (dt_prep_reference), in the reference's order:
 *   1. both sides >= DT_REF_MIN_SIDE and max(w/h, h/w) <= DT_REF_MAX_ASPECT, else an error naming the
 *      file and the limit (the pipeline checks every reference before processing any);
 *   2. more than DT_REF_MAX_AREA pixels (exactly 1024² is not more): resized with Lanczos to
 *      int(w·s) x int(h·s), s = sqrt(1024² / (w·h)) in double (dt_prep_area_size), in the image's own
 *      mode (image_resample.h);
 *   3. w, h floored to `multiple` and the image center-cropped to that (left = (w − fw)/2, top likewise,
 *      integer division); no resize;
 *   4. converted to RGB (alpha dropped) and normalized: v = 2·(u/255) − 1 in float32.
 * Output size (dt_prep_output_size): a side the user did not give comes from the first reference's
 * processed size.
 *
 * Inpainting with two or more references: dt_prep_reference_in_batch (one batch at the first one's size).
 *
 * Inpainting (dt_prep_init_image, dt_prep_mask): the init image sets the output size (the pipeline
 * ignores height/width): step 2 as above (Lanczos to the area), then w, h floored to `multiple`, and
 * the image *stretched* (Lanczos, not cropped) to that size, RGB, [-1, 1]. The mask must have the init
 * image's original size (else an error); it is stretched with Lanczos from its own size straight to the
 * output size in its own mode, converted to L, divided by 255 and binarized (>= 0.5 -> 1: white = repaint),
 * then brought to the packed latent grid (h/multiple x w/multiple) by bilinear interpolation with
 * align_corners=False (torch's F.interpolate, float32) — values in [0, 1], one per noise token.
 */
#ifndef DT_EDIT_PREP_H
#define DT_EDIT_PREP_H

#include "image/image.h"

#define DT_REF_MIN_SIDE 64
#define DT_REF_MAX_ASPECT 8
#define DT_REF_MAX_AREA (1024 * 1024)

/* An image ready for the VAE encoder. */
typedef struct {
    int w, h;       /* multiples of `multiple` */
    float *rgb;     /* [3, h, w] in [-1, 1], channel-major (the VAE's [C, H·W]); malloc'd */
} dt_prep_image;

void dt_prep_image_free(dt_prep_image *p);

/* The area rule: (w, h) with more than DT_REF_MAX_AREA pixels -> (int(w·s), int(h·s)); else unchanged. */
void dt_prep_area_size(int w, int h, int *rw, int *rh);

/* Step 1 as decoding limits (image.h), so that a file breaking them is refused from its header: both sides at least
 * DT_REF_MIN_SIDE, the aspect ratio at most DT_REF_MAX_ASPECT, and max_pixels (0: the decoder's default). */
dt_image_limits dt_prep_reference_limits(int64_t max_pixels);

/* Step 1 alone (`name` is used in the message). 0 ok, -1 error. */
int dt_prep_check_reference(const dt_image *im, const char *name);
/* Steps 1-4 for one reference. 0 ok, -1 error (dt_last_error names the file). */
int dt_prep_reference(const dt_image *im, const char *name, int multiple, dt_prep_image *out);

/* Inpainting with two or more references (the reference pipeline prepares them as one batch): no area rule, every
 * reference center-cropped to fw x fh — the first reference's size floored to `multiple` — with PIL's crop box
 * (left = floor((w − fw) / 2), top likewise; black where the box leaves a smaller image), RGB, [-1, 1]. Step 1's
 * checks still apply. 0 ok, -1 error. */
int dt_prep_reference_in_batch(const dt_image *im, const char *name, int fw, int fh, dt_prep_image *out);

/* Output size with references: *height / *width that are 0 on entry take refs[0]'s processed size
 * (nothing changes when n_refs is 0). */
void dt_prep_output_size(const dt_prep_image *refs, int n_refs, int *height, int *width);

/* Inpainting init image: out gets the output size and the image in [-1, 1]. 0 ok, -1 error (an image
 * smaller than `multiple` on a side after the area rule). */
int dt_prep_init_image(const dt_image *init, const char *name, int multiple, dt_prep_image *out);

/* Inpainting mask. init_w x init_h: the init image's original size (the mask must match it); out_w x
 * out_h: the prepared init image's size. *mask01 = [out_h, out_w] binarized mask (may be NULL: not
 * returned), *mask_latent = [(out_h/multiple), (out_w/multiple)] (the packed noise tokens' order).
 * Both malloc'd. 0 ok, -1 error. */
int dt_prep_mask(const dt_image *mask, const char *name, int init_w, int init_h, int out_w, int out_h, int multiple,
                 float **mask01, float **mask_latent);

/* rgb [h, w, 3] u8 -> out [3, h, w] float32 in [-1, 1] (the image processor's u/255 then 2x − 1). */
void dt_prep_normalize(const uint8_t *rgb, int w, int h, float *out);

/* Bilinear resize with align_corners=False as torch computes it in float32: in [ih, iw] -> out [oh, ow]. */
void dt_prep_bilinear(const float *in, int iw, int ih, float *out, int ow, int oh);

#endif
