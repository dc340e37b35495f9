/* api.c — generation requests parsed and checked, answers and errors as JSON (api.h). Every check names the
 * parameter it is about; nothing here touches files, sockets or the models. */
#include "serve/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

static void error_vset(dt_api_error *e, int status, const char *type, const char *param, const char *fmt, va_list ap) {
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
}

void dt_api_error_set(dt_api_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, status, type, param, fmt, ap);
    va_end(ap);
}

int dt_api_invalid(dt_api_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, "invalid_request_error", param, fmt, ap);
    va_end(ap);
    return -1;
}

void dt_api_error_json(dt_strbuf *out, const dt_api_error *e) {
    sb_puts(out, "{\"error\": {\"message\": ");
    sb_json_cstr(out, e->message);
    sb_puts(out, ", \"type\": ");
    sb_json_cstr(out, e->type ? e->type : "server_error");
    sb_puts(out, ", \"param\": ");
    sb_json_cstr(out, e->param[0] ? e->param : NULL);
    sb_puts(out, ", \"code\": null}}\n");
}

static const char *type_name(const json *j) {
    switch (j->type) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "a boolean";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    default: return "an object";
    }
}

/* An integer field in [lo, hi]: 0 ok (or absent: *out untouched, *given 0), -1 error set. */
static int get_int(const json *root, const char *key, int64_t lo, int64_t hi, int64_t *out, int *given,
                   dt_api_error *e) {
    const json *j = json_get(root, key);
    if (given) *given = 0;
    if (!j || j->type == JSON_NULL) return 0;
    if (j->type != JSON_NUMBER) return dt_api_invalid(e, key, "'%s' must be an integer, not %s", key, type_name(j));
    /* 20, 2e1 and 20.0 are the same integer; 1e300 and 99999999999999999999 are integers out of range */
    int64_t v;
    if (j->is_integer) v = j->integer;
    else if (!isfinite(j->number) || j->number != floor(j->number))
        return dt_api_invalid(e, key, "'%s' must be an integer, not a fraction (%g)", key, j->number);
    else if (fabs(j->number) < 0x1p53) v = (int64_t)j->number;   /* exact */
    else return dt_api_invalid(e, key, "'%s' is %g; it must be between %lld and %lld", key, j->number, (long long)lo,
                               (long long)hi);
    if (v < lo || v > hi)
        return dt_api_invalid(e, key, "'%s' is %lld; it must be between %lld and %lld", key, (long long)v, (long long)lo,
                              (long long)hi);
    *out = v;
    if (given) *given = 1;
    return 0;
}

/* A string field: 0 (*out NULL when absent), -1 error set. Strings with NUL characters are refused. */
static int get_str(const json *root, const char *key, const char **out, dt_api_error *e) {
    const json *j = json_get(root, key);
    *out = NULL;
    if (!j || j->type == JSON_NULL) return 0;
    if (j->type != JSON_STRING) return dt_api_invalid(e, key, "'%s' must be a string, not %s", key, type_name(j));
    if (strlen(j->str) != j->len) return dt_api_invalid(e, key, "'%s' contains a NUL character", key);
    *out = j->str;
    return 0;
}

/* "WxH" with decimal integers; 0 and the numbers, -1 when it is not that shape. */
static int parse_size(const char *s, int64_t *w, int64_t *h) {
    int64_t v[2] = {0, 0};
    const char *p = s;
    for (int k = 0; k < 2; k++) {
        if (*p < '0' || *p > '9') return -1;
        int digits = 0;
        while (*p >= '0' && *p <= '9') {
            if (++digits > 9) return -1;
            v[k] = v[k] * 10 + (*p++ - '0');
        }
        if (k == 0 && *p++ != 'x') return -1;
    }
    if (*p) return -1;
    *w = v[0];
    *h = v[1];
    return 0;
}

/* A requested size against the server's and the model's limits. 0 or -1 and *e set. */
static int check_size(const dt_api_limits *lim, int64_t w, int64_t h, dt_api_error *e) {
    const int mult = lim->info.size_multiple > 0 ? lim->info.size_multiple : 1;
    if (w * h > lim->max_pixels)
        return dt_api_invalid(e, "size", "'size' %lldx%lld is %lld pixels, over this server's limit of %lld",
                              (long long)w, (long long)h, (long long)(w * h), (long long)lim->max_pixels);
    if (w % mult || h % mult)
        return dt_api_invalid(e, "size", "'size' %lldx%lld: width and height must be multiples of %d", (long long)w,
                              (long long)h, mult);
    if (w > lim->info.max_side || h > lim->info.max_side)
        return dt_api_invalid(e, "size", "'size' %lldx%lld: this model allows at most %d pixels a side", (long long)w,
                              (long long)h, lim->info.max_side);
    return 0;
}

/* Fields a request may carry. OpenAI's own fields that do not change a generation here are accepted and ignored.
 * Edits also take these (the images come as file parts, not fields). */
static const char *const known_fields[] = {"prompt", "n", "size", "response_format", "seed", "steps", "guidance",
                                           "negative_prompt", "stream", "cache", "model", "user", "quality", "style",
                                           "output_format", "output_compression", "moderation", "background",
                                           "cfg_normalization", "cfg_truncation", NULL};
static const char *const edit_fields[] = {"strength", "input_fidelity", NULL};

static int known(const char *key, int edit) {
    for (int k = 0; known_fields[k]; k++)
        if (!strcmp(key, known_fields[k])) return 1;
    for (int k = 0; edit && edit_fields[k]; k++)
        if (!strcmp(key, edit_fields[k])) return 1;
    return 0;
}

/* r->gen's pointers to r's own images (set again when the request moves). */
static void gen_point(dt_api_request *r) {
    dt_gen_params *g = &r->gen;
    g->refs = NULL;
    g->ref_names = NULL;
    g->n_refs = 0;
    g->init_image = g->mask = NULL;
    g->init_name = g->mask_name = NULL;
    if (!r->edit) return;
    g->refs = r->refs;
    g->ref_names = (const char *const *)r->ref_names;
    g->n_refs = r->n_refs;
    if (r->inpaint || r->img2img) {
        g->init_image = &r->init;
        g->init_name = r->init_name;
    }
    if (r->inpaint) {
        g->mask = &r->mask;
        g->mask_name = r->mask_name;
    }
}

int dt_api_check_fields(const json *root, const dt_api_limits *lim, uint64_t seed_if_absent, int edit,
                        dt_api_request *r, dt_api_error *e) {
    if (root->type != JSON_OBJECT)
        return dt_api_invalid(e, NULL, "the request body must be a JSON object, not %s", type_name(root));
    for (size_t i = 0; i < root->len; i++) {
        int ok = known(root->keys[i], edit);
        if (!ok) {
            char shown[40];
            snprintf(shown, sizeof shown, "%s", root->keys[i]);
            return dt_api_invalid(e, shown, "unknown parameter '%s'", shown);
        }
        for (size_t k = 0; k < i; k++)
            if (!strcmp(root->keys[i], root->keys[k]))
                return dt_api_invalid(e, root->keys[i], "'%s' is given twice", root->keys[i]);
    }
    const char *s;
    /* prompt */
    if (get_str(root, "prompt", &s, e)) return -1;
    if (!s) return dt_api_invalid(e, "prompt", "'prompt' is required");
    if (!s[0]) return dt_api_invalid(e, "prompt", "'prompt' is empty");
    r->prompt = dt_strdup(s);
    if (get_str(root, "negative_prompt", &s, e)) return -1;
    r->negative_prompt = dt_strdup(s ? s : "");
    /* model: only the one this server has (a name, never a path) */
    if (get_str(root, "model", &s, e)) return -1;
    if (s && strcmp(s, lim->model_id ? lim->model_id : ""))
        return dt_api_invalid(e, "model", "model '%.60s' is not served here (this server has '%s')", s, lim->model_id);
    /* response_format: b64_json only (no file is ever stored on the server to link to) */
    if (get_str(root, "response_format", &s, e)) return -1;
    if (s && strcmp(s, "b64_json"))
        return dt_api_invalid(e, "response_format",
                              "response_format '%.40s' is not supported (only b64_json: images are not "
                              "stored on the server)",
                              s);
    /* output_format, output_compression (image/image_out.h says what the number means for each format) */
    if (get_str(root, "output_format", &s, e)) return -1;
    r->output_format = DT_OUT_PNG;
    if (s && (strcmp(s, "png") && strcmp(s, "jpeg") && strcmp(s, "webp")))
        return dt_api_invalid(e, "output_format", "output_format '%.40s' is not supported (png, jpeg or webp)", s);
    if (s) dt_out_format_parse(s, &r->output_format);
    int64_t v = -1;
    if (get_int(root, "output_compression", 0, 100, &v, NULL, e)) return -1;
    r->output_compression = (int)v;
    for (const char *const *f =
             (const char *const[]){"user", "quality", "style", "moderation", "background", "input_fidelity", NULL};
         *f; f++)
        if (get_str(root, *f, &s, e)) return -1;
    /* n */
    v = 1;
    if (get_int(root, "n", 1, DT_API_MAX_N, &v, NULL, e)) return -1;
    r->n = (int)v;
    /* size (edits: "auto" by default, the first image's prepared size: width = height = 0 here) */
    if (get_str(root, "size", &s, e)) return -1;
    int64_t w = edit ? 0 : 1024, h = edit ? 0 : 1024;
    if (s && !strcmp(s, "auto") && edit) {
        w = h = 0;
    } else if (s && strcmp(s, "auto")) {
        if (parse_size(s, &w, &h))
            return dt_api_invalid(e, "size", "'size' must look like 1024x768 (WIDTHxHEIGHT), not '%.40s'", s);
        if (w <= 0 || h <= 0)
            return dt_api_invalid(e, "size", "'size' %lldx%lld: width and height must be positive", (long long)w,
                                  (long long)h);
    }
    if ((w || h) && check_size(lim, w, h, e)) return -1;
    r->width = (int)w;
    r->height = (int)h;
    /* steps, seed, guidance */
    int given = 0;
    v = 0;
    if (get_int(root, "steps", 1, lim->max_steps, &v, &given, e)) return -1;
    r->steps = (int)v;
    if (!given && lim->info.default_steps > lim->max_steps)
        return dt_api_invalid(e, "steps",
                              "this model's default of %d steps is over this server's limit of %d: give 'steps'",
                              lim->info.default_steps, lim->max_steps);
    v = 0;
    if (get_int(root, "seed", 0, INT64_MAX, &v, &r->seed_given, e)) return -1;
    r->seed = r->seed_given ? (uint64_t)v : seed_if_absent;
    const json *g = json_get(root, "guidance");
    r->guidance = -1;
    if (g && g->type != JSON_NULL) {
        if (g->type != JSON_NUMBER)
            return dt_api_invalid(e, "guidance", "'guidance' must be a number, not %s", type_name(g));
        if (!(g->number >= 0 && g->number <= 100))
            return dt_api_invalid(e, "guidance", "'guidance' is %g; it must be between 0 and 100", g->number);
        r->guidance = (float)g->number;
        r->guidance_given = 1;
    }
    if (edit) {
        const json *sj = json_get(root, "strength");
        if (sj && sj->type != JSON_NULL) {
            if (sj->type != JSON_NUMBER)
                return dt_api_invalid(e, "strength", "'strength' must be a number, not %s", type_name(sj));
            if (!(sj->number > 0 && sj->number <= 1))
                return dt_api_invalid(e, "strength", "'strength' is %g; it must be in (0, 1]", sj->number);
            if (!r->inpaint && !r->img2img)
                return dt_api_invalid(e, "strength", "'strength' applies to inpainting (send a 'mask')");
            r->strength = sj->number;
        }
    }
    /* Z-Image's guidance shaping (the engine refuses them, naming the family, for the others) */
    static const char *const cfg_keys[2] = {"cfg_normalization", "cfg_truncation"};
    float cfg_vals[2] = {0, 1};
    int cfg_set[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const json *cv = json_get(root, cfg_keys[k]);
        if (!cv || cv->type == JSON_NULL) continue;
        if (cv->type != JSON_NUMBER)
            return dt_api_invalid(e, cfg_keys[k], "'%s' must be a number, not %s", cfg_keys[k], type_name(cv));
        if (!(cv->number >= 0 && cv->number <= 100))
            return dt_api_invalid(e, cfg_keys[k], "'%s' is %g; it must be between 0 and 100", cfg_keys[k], cv->number);
        cfg_vals[k] = (float)cv->number;
        cfg_set[k] = 1;
    }
    r->cache = lim->cache;
    const json *cj = json_get(root, "cache");
    if (cj && cj->type != JSON_NULL) {
        if (cj->type != JSON_STRING)
            return dt_api_invalid(e, "cache", "'cache' must be a string like \"first-block=0.08\", not %s", type_name(cj));
        if (dt_cache_parse(cj->str, &r->cache)) return dt_api_invalid(e, "cache", "'cache': %s", dt_last_error());
    }
    const json *st = json_get(root, "stream");
    if (st && st->type != JSON_NULL) {
        if (st->type != JSON_BOOL)
            return dt_api_invalid(e, "stream", "'stream' must be true or false, not %s", type_name(st));
        r->stream = st->boolean;
    }
    /* the job, resolved once by the engine's own rules (the model's defaults and limits, as a last word) */
    dt_gen_params *job = &r->gen;
    dt_gen_params_default(job);
    gen_point(r);
    job->prompt = r->prompt;
    job->negative_prompt = r->negative_prompt;
    job->width = r->width;
    job->height = r->height;
    job->steps = r->steps;
    job->seed = r->seed;
    job->guidance = r->guidance;
    job->cache = r->cache;
    job->max_seq_len = lim->max_seq_len;
    if (r->inpaint || r->img2img) job->strength = r->strength;
    job->cfg_normalization_set = cfg_set[0];
    job->cfg_normalization = cfg_vals[0];
    job->cfg_truncation_set = cfg_set[1];
    job->cfg_truncation = cfg_vals[1];
    if (dt_gen_params_resolve(&lim->info, job)) {
        const char *f = strstr(dt_last_error(), "cfg_normalization") ? "cfg_normalization"
                        : strstr(dt_last_error(), "cfg_truncation") ? "cfg_truncation" : NULL;
        return dt_api_invalid(e, f, "%s", dt_last_error());
    }
    return 0;
}

int dt_api_parse_generation(const char *body, size_t len, const dt_api_limits *lim, uint64_t seed_if_absent,
                            dt_api_request *r, dt_api_error *e) {
    memset(r, 0, sizeof *r);
    if (len == 0) return dt_api_invalid(e, NULL, "the request has no body (a JSON object with at least 'prompt')");
    json *root = json_parse(body, len, "request body");
    if (!root) return dt_api_invalid(e, NULL, "%s", dt_last_error());
    int rc = dt_api_check_fields(root, lim, seed_if_absent, 0, r, e);
    json_free(root);
    if (rc) dt_api_request_free(r);
    return rc;
}

void dt_api_request_free(dt_api_request *r) {
    free(r->prompt);
    free(r->negative_prompt);
    for (int i = 0; i < r->n_refs; i++) {
        dt_image_free(&r->refs[i]);
        free(r->ref_names[i]);
    }
    dt_image_free(&r->init);
    dt_image_free(&r->mask);
    free(r->init_name);
    free(r->mask_name);
    memset(r, 0, sizeof *r);
}

void dt_api_request_move(dt_api_request *dst, dt_api_request *src) {
    *dst = *src;
    memset(src, 0, sizeof *src);
    gen_point(dst);
}

dt_gen_params dt_api_image_job(const dt_api_request *r, int i) {
    dt_gen_params g = r->gen;
    g.seed = r->gen.seed + (uint64_t)i;
    return g;
}

void dt_api_images_json(dt_strbuf *out, long long created, dt_out_format format, int n, uint8_t *const *img,
                        const size_t *img_len, const uint64_t *seeds) {
    sb_printf(out, "{\"created\": %lld, \"output_format\": \"%s\", \"data\": [", created, dt_out_format_name(format));
    for (int i = 0; i < n; i++) {
        sb_puts(out, i ? ", {\"b64_json\": \"" : "{\"b64_json\": \"");
        sb_base64(out, img[i], img_len[i]);
        sb_printf(out, "\", \"seed\": %llu}", (unsigned long long)seeds[i]);
    }
    sb_puts(out, "]}\n");
}
