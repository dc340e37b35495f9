/* api.h — the HTTP API's requests and answers as pure functions (no sockets, no threads): an OpenAI Images API
 * generation request (JSON) parsed and checked into a request the workers run, the JSON of answers and errors.
 * The libFuzzer target fuzz/fuzz_api.c drives dt_api_parse_generation. */
#ifndef DT_SERVE_API_H
#define DT_SERVE_API_H

#include <stddef.h>
#include <stdint.h>

#include "pipeline/engine.h"
#include "serve/strbuf.h"

#define DT_API_MAX_N 8              /* images per request */
#define DT_API_BODY_LIMIT (1u << 20)            /* generations: 1 MiB of JSON */
#define DT_API_EDIT_BODY_LIMIT (32u << 20)      /* edits: 32 MiB of multipart form data (images) */

/* What the server allows, and what the loaded model is. */
typedef struct {
    const char *model_id;           /* the name /v1/models lists; a request's "model" must be this one */
    dt_pipeline_info info;          /* size multiple, largest side, default steps */
    int64_t max_pixels;             /* width * height at most */
    int max_steps;
    int max_seq_len;                /* text tokens of every request (0 = the engine's default, 512) */
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
/* {"error": {"message": ..., "type": ..., "param": ..., "code": null}} */
void dt_api_error_json(dt_strbuf *out, const dt_api_error *e);

/* Parse and check a POST /v1/images/generations body. seed_if_absent is used when the request names none.
 * 0 and *r filled (free with dt_api_request_free), or -1 and *e says what is wrong (status 400). */
int dt_api_parse_generation(const char *body, size_t len, const dt_api_limits *lim, uint64_t seed_if_absent,
                            dt_api_request *r, dt_api_error *e);
void dt_api_request_free(dt_api_request *r);

/* The engine request of image i (0..n-1) of r: pointers into r, which must outlive it. */
void dt_api_gen_params(const dt_api_request *r, const dt_api_limits *lim, int i, dt_gen_params *g);

/* {"created": T, "data": [{"b64_json": ..., "seed": ...}, ...]} for n PNGs. */
void dt_api_images_json(dt_strbuf *out, long long created, int n, uint8_t *const *png, const size_t *png_len,
                        const uint64_t *seeds);

#endif
