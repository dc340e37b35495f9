/* api_edit.c — POST /v1/images/edits requests (api.h): the multipart form's parts collected as libmicrohttpd's post
 * processor hands them over, the uploads decoded from memory and checked as the engine will check them, the text
 * fields turned into typed JSON and checked by the same code as a generation request. Nothing here touches files,
 * sockets or the models. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/edit_prep.h"
#include "serve/api.h"

/* ---- the form ---- */

void dt_api_form_init(dt_api_form *f) { memset(f, 0, sizeof *f); }

void dt_api_form_free(dt_api_form *f) {
    for (int i = 0; i < f->n; i++) {
        free(f->parts[i].key);
        free(f->parts[i].filename);
        sb_free(&f->parts[i].data);
    }
    memset(f, 0, sizeof *f);
}

static int is_image_key(const char *k) { return !strcmp(k, "image[]") || !strcmp(k, "image") || !strcmp(k, "mask"); }

int dt_api_form_add(dt_api_form *f, const char *key, const char *filename, const char *data, uint64_t off,
                    size_t size, dt_api_error *e) {
    if (!key || !key[0]) return dt_api_invalid(e, NULL, "a form part has no name");
    dt_api_part *p = f->n ? &f->parts[f->n - 1] : NULL;
    /* a new part: the first piece of one (off 0), unless the last part has this name and nothing yet (a first
     * empty piece libmicrohttpd may hand over before the data) */
    int fresh = !p || strcmp(p->key, key) || (off == 0 && p->data.len > 0);
    if (fresh) {
        if (f->n == DT_API_MAX_PARTS)
            return dt_api_invalid(e, NULL, "the form has more than %d parts", DT_API_MAX_PARTS);
        p = &f->parts[f->n++];
        p->key = dt_strdup(key);
        p->filename = filename ? dt_strdup(filename) : NULL;
        sb_init(&p->data);
    }
    if (off != p->data.len) return dt_api_invalid(e, key, "form part '%.40s' arrived out of order", key);
    if (!is_image_key(key) && p->data.len + size > DT_API_MAX_FIELD)
        return dt_api_invalid(e, key, "form field '%.40s' is over %u bytes", key, DT_API_MAX_FIELD);
    if (size) sb_putn(&p->data, data, size);
    f->bytes += size;
    return 0;
}

/* ---- the fields as typed JSON ---- */

/* A whole decimal integer (optional sign, at most 18 digits). */
static int is_integer(const char *s) {
    const char *p = s + (*s == '-' || *s == '+');
    size_t n = strspn(p, "0123456789");
    return n > 0 && n <= 18 && !p[n];
}

/* A finite number as strtod reads it, the whole string. */
static int is_number(const char *s, double *v) {
    if (!*s) return 0;
    char *end = NULL;
    *v = strtod(s, &end);
    return end && !*end && isfinite(*v);
}

/* One text field into the JSON object being built: integers and numbers as numbers, stream as a boolean where the
 * text is one (anything else stays a string, and the shared checks name the type they wanted). */
static void field_json(dt_strbuf *j, const dt_api_part *p) {
    const char *k = p->key, *v = p->data.len ? p->data.data : "";
    double d;
    sb_json_cstr(j, k);
    sb_puts(j, ": ");
    const int int_key = !strcmp(k, "n") || !strcmp(k, "seed") || !strcmp(k, "steps") || !strcmp(k, "output_compression");
    if (int_key && is_integer(v)) sb_puts(j, v[0] == '+' ? v + 1 : v);
    else if (int_key && is_number(v, &d)) sb_printf(j, "%.17g", d);   /* 2.0 is 2; 2.5 is refused as a fraction */
    else if ((!strcmp(k, "guidance") || !strcmp(k, "strength") || !strcmp(k, "cfg_normalization") ||
              !strcmp(k, "cfg_truncation")) && is_number(v, &d))
        sb_printf(j, "%.17g", d);
    else if (!strcmp(k, "stream") && (!strcmp(v, "true") || !strcmp(v, "false"))) sb_puts(j, v);
    else sb_json_str(j, v, p->data.len);
}

/* ---- the images ---- */

/* An uploaded mask with transparency follows the OpenAI API (fully transparent = edit): it becomes an L mask,
 * white where alpha is 0. Any other mask is used as `--mask` takes it (white = repaint). */
static void mask_from_alpha(dt_image *m) {
    if (m->channels != 2 && m->channels != 4) return;
    const size_t n = (size_t)m->w * m->h;
    int transparent = 0;
    for (size_t i = 0; i < n && !transparent; i++) transparent = m->px[i * m->channels + m->channels - 1] < 255;
    if (!transparent) return;
    uint8_t *l = dt_malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) l[i] = m->px[i * m->channels + m->channels - 1] == 0 ? 255 : 0;
    free(m->px);
    m->px = l;
    m->channels = 1;
    m->nearest = 0;
}

/* One upload decoded within lim (its size checked from the file's header, before any pixel is decoded). */
static int decode_upload(const dt_api_part *p, const char *what, const char *param, const dt_image_limits *lim,
                         dt_image *out, char **name, dt_api_error *e) {
    char nm[200];
    if (p->filename && p->filename[0]) snprintf(nm, sizeof nm, "%s '%.120s'", what, p->filename);
    else snprintf(nm, sizeof nm, "%s", what);
    if (!p->data.len) return dt_api_invalid(e, param, "%s is empty", nm);
    if (dt_image_decode_ex((const uint8_t *)p->data.data, p->data.len, nm, lim, out))
        return dt_api_invalid(e, param, "%s", dt_last_error());
    *name = dt_strdup(nm);
    return 0;
}

/* The limits an upload's header must meet: references the engine's size and aspect checks and the server's pixel
 * limit; the image to inpaint (the first image part when a mask came), the image of an img2img edit (a model with
 * img2img, no mask) and the mask the pixel limit. */
static dt_image_limits upload_limits(const dt_api_form *f, const dt_api_part *p, int img2img) {
    int has_mask = 0;
    const dt_api_part *first_image = NULL;
    for (int i = 0; i < f->n; i++) {
        const dt_api_part *q = &f->parts[i];
        if (!strcmp(q->key, "mask")) has_mask = 1;
        else if (is_image_key(q->key) && !first_image) first_image = q;
    }
    if (strcmp(p->key, "mask") && !((has_mask || img2img) && p == first_image))
        return dt_prep_reference_limits(DT_API_MAX_IMAGE_PIXELS);
    dt_image_limits any = {.max_pixels = DT_API_MAX_IMAGE_PIXELS};
    return any;
}

int dt_api_edit_image_bytes(const dt_api_form *f, int img2img, int64_t *bytes, dt_api_error *e) {
    *bytes = 0;
    int k = 0;
    for (int i = 0; i < f->n; i++) {
        const dt_api_part *p = &f->parts[i];
        if (!is_image_key(p->key)) continue;
        const int is_mask = !strcmp(p->key, "mask");
        k += !is_mask;
        if (!p->data.len) continue;   /* an empty upload is refused by the parse */
        const dt_image_limits lim = upload_limits(f, p, img2img);
        char what[48], nm[200];   /* named as decode_images names it */
        if (is_mask) snprintf(what, sizeof what, "mask");
        else snprintf(what, sizeof what, "image %d", k);
        if (p->filename && p->filename[0]) snprintf(nm, sizeof nm, "%s '%.120s'", what, p->filename);
        else snprintf(nm, sizeof nm, "%s", what);
        dt_image h;
        if (dt_image_probe((const uint8_t *)p->data.data, p->data.len, nm, &lim, &h))
            return dt_api_invalid(e, is_mask ? "mask" : "image", "%s", dt_last_error());
        /* the decoded pixels, and for a mask with alpha its L copy */
        *bytes += (int64_t)h.w * h.h * (h.channels + (is_mask && h.channels % 2 == 0));
    }
    return 0;
}

/* Decode the uploads into r: image parts in order (the first is the init image when a mask came, or when the model
 * does img2img: its one image), the mask. */
static int decode_images(const dt_api_form *f, int img2img_model, dt_api_request *r, dt_api_error *e) {
    const dt_api_part *mask = NULL;
    int n_img = 0;
    for (int i = 0; i < f->n; i++) {
        const dt_api_part *p = &f->parts[i];
        if (!strcmp(p->key, "mask")) {
            if (mask) return dt_api_invalid(e, "mask", "'mask' is given twice");
            mask = p;
        } else if (is_image_key(p->key)) {
            n_img++;
        }
    }
    if (!n_img) return dt_api_invalid(e, "image", "an edit needs at least one image ('image[]' file parts)");
    r->inpaint = mask != NULL;
    r->img2img = !mask && img2img_model;
    if (r->img2img && n_img != 1)
        return dt_api_invalid(e, "image", "%d images: this model takes one image to edit (img2img) or one with a "
                              "'mask' (inpainting), no references", n_img);
    if (n_img - r->inpaint > DT_GEN_MAX_REFS)
        return dt_api_invalid(e, "image", "%d images: at most %d references%s", n_img, DT_GEN_MAX_REFS,
                   r->inpaint ? " besides the image to inpaint" : "");
    int k = 0;
    for (int i = 0; i < f->n; i++) {
        const dt_api_part *p = &f->parts[i];
        if (!is_image_key(p->key) || p == mask) continue;
        char what[48];
        const dt_image_limits lim = upload_limits(f, p, r->img2img);
        if ((r->inpaint || r->img2img) && k == 0) {
            if (decode_upload(p, r->inpaint ? "image 1 (the image to inpaint)" : "image 1 (the image to edit)",
                              "image", &lim, &r->init, &r->init_name, e))
                return -1;
        } else {
            snprintf(what, sizeof what, "image %d", k + 1);
            if (decode_upload(p, what, "image", &lim, &r->refs[r->n_refs], &r->ref_names[r->n_refs], e)) return -1;
            r->n_refs++;
        }
        k++;
    }
    if (mask) {
        const dt_image_limits lim = upload_limits(f, mask, 0);
        if (decode_upload(mask, "mask", "mask", &lim, &r->mask, &r->mask_name, e)) return -1;
        mask_from_alpha(&r->mask);
    }
    r->edit = 1;
    return 0;
}

/* What the engine will check before any model runs, answered here as a 400 (every reference's sides and aspect ratio
 * were checked from its header by decode_upload): the mask's size, and the output size against the server's limits. */
static int check_images(const dt_api_limits *lim, dt_api_request *r, dt_api_error *e) {
    const int mult = lim->info.size_multiple > 0 ? lim->info.size_multiple : 1;
    int w = r->width, h = r->height;
    const dt_image *first = r->inpaint || r->img2img ? &r->init : &r->refs[0];
    if (r->img2img) w = h = 0;   /* img2img keeps the init image's size (no area rule) */
    if (r->inpaint) {
        if (r->mask.w != r->init.w || r->mask.h != r->init.h)
            return dt_api_invalid(e, "mask", "the mask is %dx%d; it must have the size of the image to inpaint (%dx%d)",
                                  r->mask.w, r->mask.h, r->init.w, r->init.h);
        w = h = 0;   /* inpainting keeps the init image's size */
    }
    if (!w || !h) {
        int aw, ah;
        if (r->img2img) aw = first->w, ah = first->h;
        else dt_prep_area_size(first->w, first->h, &aw, &ah);
        if (!w) w = aw / mult * mult;
        if (!h) h = ah / mult * mult;
        if (w < mult || h < mult)
            return dt_api_invalid(e, "image", "%s gives a %dx%d image; at least %d pixels a side are needed",
                       r->inpaint || r->img2img ? r->init_name : r->ref_names[0], w, h, mult);
        if ((int64_t)w * h > lim->max_pixels)
            return dt_api_invalid(e, "image",
                                  "the output would be %dx%d = %lld pixels, over this server's limit of %lld", w, h,
                                  (long long)w * h, (long long)lim->max_pixels);
    }
    return 0;
}

int dt_api_parse_edit(const dt_api_form *f, const dt_api_limits *lim, uint64_t seed_if_absent, dt_api_request *r,
                      dt_api_error *e) {
    memset(r, 0, sizeof *r);
    if (!lim->info.editing)
        return dt_api_invalid(e, NULL, "this model (%s) does not edit images; only /v1/images/generations",
                   lim->info.family ? lim->info.family : "?");
    /* the text fields as one JSON object (a name given twice is refused by the shared checks) */
    dt_strbuf j;
    sb_init(&j);
    sb_puts(&j, "{");
    int nf = 0;
    for (int i = 0; i < f->n; i++) {
        const dt_api_part *p = &f->parts[i];
        if (is_image_key(p->key)) continue;
        if (strlen(p->key) > 40) {
            sb_free(&j);
            return dt_api_invalid(e, NULL, "unknown parameter '%.40s...'", p->key);
        }
        if (memchr(p->data.data ? p->data.data : "", 0, p->data.len)) {
            sb_free(&j);
            return dt_api_invalid(e, p->key, "'%s' contains a NUL character", p->key);
        }
        if (nf++) sb_puts(&j, ", ");
        field_json(&j, p);
    }
    sb_puts(&j, "}");
    json *root = json_parse(j.data, j.len, "edit request fields");
    sb_free(&j);
    if (!root) return dt_api_invalid(e, NULL, "%s", dt_last_error());
    int rc = decode_images(f, lim->info.img2img, r, e);
    if (rc == 0) rc = dt_api_check_fields(root, lim, seed_if_absent, 1, r, e);
    if (rc == 0) rc = check_images(lim, r, e);
    json_free(root);
    if (rc) dt_api_request_free(r);
    return rc;
}
