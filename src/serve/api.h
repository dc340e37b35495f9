/* api.h — the HTTP API's requests and answers as pure functions (no sockets, no threads): an OpenAI Images API
 * generation request (JSON) or edit request (multipart form fields, collected by api_edit.c) parsed and checked
 * into a request the workers run, the JSON of answers and errors. The libFuzzer targets fuzz/fuzz_api.c and
 * fuzz/fuzz_api_edit.c drive dt_api_parse_generation and dt_api_form_add + dt_api_parse_edit. */
#ifndef DT_SERVE_API_H
#define DT_SERVE_API_H

#include <stddef.h>
#include <stdint.h>

#include "image/image.h"
#include "io/json.h"
#include "pipeline/engine.h"
#include "image/image_out.h"
#include "serve/strbuf.h"

#define DT_API_MAX_N 8              /* images per request */
#define DT_API_BODY_LIMIT (1u << 20)            /* generations: 1 MiB of JSON */
#define DT_API_EDIT_BODY_LIMIT (32u << 20)      /* edits: 32 MiB of multipart form data (images) */
#define DT_API_MAX_PARTS 64         /* form parts of an edit request */
#define DT_API_MAX_FIELD (64u << 10)            /* bytes of one text field of an edit request */
#define DT_API_MAX_IMAGE_PIXELS ((int64_t)4096 * 4096)  /* decoded pixels of one uploaded image */

/* What the server allows, and what the loaded model is. */
typedef struct {
    const char *model_id;           /* the name /v1/models lists; a request's "model" must be this one */
    dt_pipeline_info info;          /* size multiple, largest side, default steps */
    int64_t max_pixels;             /* width * height at most */
    int max_steps;
    int max_seq_len;                /* text tokens of every request (0 = the engine's default, 512) */
    dt_cache_opts cache;            /* step caching of a request that names none (serve --cache) */
} dt_api_limits;

/* One checked generation request. */
typedef struct {
    char *prompt, *negative_prompt; /* owned; negative_prompt "" when not given */
    int n;                          /* images, 1..DT_API_MAX_N; image i uses seed + i */
    int width, height;
    int steps;                      /* 0 = the model's default */
    uint64_t seed;
    int seed_given;                 /* else seed was drawn by the server */
    float guidance;                 /* < 0 = the model's default */
    int guidance_given;
    int stream;                     /* answer as Server-Sent Events */
    dt_cache_opts cache;            /* "cache" ("first-block=0.08", "taylorseer=3", "off"), else the server's */
    dt_out_format output_format;    /* the images' format (png by default) */
    int output_compression;         /* 0..100, -1 = the default (image/image_out.h) */
    /* edits (POST /v1/images/edits): the decoded uploads, owned by the request */
    int edit;
    dt_image refs[DT_GEN_MAX_REFS]; /* reference images in order (n_refs) */
    char *ref_names[DT_GEN_MAX_REFS];   /* their upload file names (for messages) */
    int n_refs;
    int inpaint;                    /* a mask was sent: the first image is inpainted (init), the rest are references */
    dt_image init, mask;            /* mask: L, white = repaint (an uploaded mask with transparency: transparent = repaint) */
    char *init_name, *mask_name;
    double strength;                /* 0 = the engine's default */
    /* The engine's job for image 0, built from the fields above and resolved once (dt_gen_params_resolve: the
     * model's defaults filled in) when the request is checked; image i is this with seed + i. Its pointers point
     * into this request: move a request with dt_api_request_move. The fields above stay as the client sent them. */
    dt_gen_params gen;
} dt_api_request;

/* An error answer: HTTP status and the OpenAI error object {"message", "type", "param"}. */
typedef struct {
    int status;
    const char *type;               /* "invalid_request_error", "authentication_error", ... */
    char param[48];                 /* "" = null */
    char message[400];
} dt_api_error;

void dt_api_error_set(dt_api_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    DT_PRINTF(5, 6);
/* A 400 invalid_request_error about PARAM (NULL: none); returns -1, for `return dt_api_invalid(...)`. */
int dt_api_invalid(dt_api_error *e, const char *param, const char *fmt, ...) DT_PRINTF(3, 4);
/* {"error": {"message": ..., "type": ..., "param": ..., "code": null}} */
void dt_api_error_json(dt_strbuf *out, const dt_api_error *e);

/* Parse and check a POST /v1/images/generations body. seed_if_absent is used when the request names none.
 * 0 and *r filled (free with dt_api_request_free), or -1 and *e says what is wrong (status 400). */
int dt_api_parse_generation(const char *body, size_t len, const dt_api_limits *lim, uint64_t seed_if_absent,
                            dt_api_request *r, dt_api_error *e);
void dt_api_request_free(dt_api_request *r);
/* Move *src into *dst (src left empty), gen's pointers following the images. */
void dt_api_request_move(dt_api_request *dst, dt_api_request *src);

/* An edit request's multipart form as libmicrohttpd's post processor hands it over: each part in pieces. */
typedef struct {
    char *key, *filename;           /* filename NULL: a plain field */
    dt_strbuf data;
} dt_api_part;

typedef struct {
    dt_api_part parts[DT_API_MAX_PARTS];
    int n;
    size_t bytes;                   /* every part's data together */
} dt_api_form;

void dt_api_form_init(dt_api_form *f);
void dt_api_form_free(dt_api_form *f);
/* One piece of the part named key: off is the piece's offset within its part (0 starts a new part). 0, or -1 and
 * *e set (400: over DT_API_MAX_PARTS parts, a text field over DT_API_MAX_FIELD bytes, a part without a name). */
int dt_api_form_add(dt_api_form *f, const char *key, const char *filename, const char *data, uint64_t off,
                    size_t size, dt_api_error *e);

/* Parse and check a POST /v1/images/edits form (OpenAI shape): `image[]` (or `image`) files in order (at most
 * DT_GEN_MAX_REFS; each decoded from memory: PNG, JPEG or WebP), optional `mask` (then the first image is inpainted
 * and the others are references), `prompt`, `n`, `size` ("auto" or absent: the first image's prepared size),
 * `response_format`, `output_format`, `output_compression`, and the extensions `seed`, `steps`, `guidance`, `strength`, `negative_prompt`, `stream`.
 * The images are checked as the engine will (sizes, aspect ratio, the mask's size) and the output size against
 * the limits. 0 and *r filled (free with dt_api_request_free), or -1 and *e says what is wrong (status 400). */
int dt_api_parse_edit(const dt_api_form *f, const dt_api_limits *lim, uint64_t seed_if_absent, dt_api_request *r,
                      dt_api_error *e);

/* What an edit form's images will hold once decoded (bytes: width x height x channels each, a mask with alpha one
 * byte more a pixel for its L copy), from their headers alone (nothing decoded), each header checked against the limits
 * the parse applies. 0, or -1 and *e set (400: a header that the parse would refuse). */
int dt_api_edit_image_bytes(const dt_api_form *f, int64_t *bytes, dt_api_error *e);

/* The checks shared by both request kinds (api.c), on a JSON object of fields; edit: the fields of an edit request
 * (strength, size "auto" by default) with r's images already decoded. 0 or -1 and *e set. */
int dt_api_check_fields(const json *root, const dt_api_limits *lim, uint64_t seed_if_absent, int edit,
                        dt_api_request *r, dt_api_error *e);

/* The engine's job for image i (0..n-1) of r: r->gen with seed + i (pointers into r, which must outlive it). */
dt_gen_params dt_api_image_job(const dt_api_request *r, int i);

/* {"created": T, "output_format": F, "data": [{"b64_json": ..., "seed": ...}, ...]} for n images in format F. */
void dt_api_images_json(dt_strbuf *out, long long created, dt_out_format format, int n, uint8_t *const *img,
                        const size_t *img_len, const uint64_t *seeds);

#endif
