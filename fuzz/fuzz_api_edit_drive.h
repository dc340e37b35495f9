/* fuzz_api_edit_drive.h — what the edit-request fuzzer does with one input, shared by fuzz/fuzz_api_edit.c and the
 * corpus replay in tests/test_fuzz_corpus.c: the bytes as the parts of a POST /v1/images/edits form, handed to
 * dt_api_form_add in pieces as libmicrohttpd's post processor hands them over, then dt_api_parse_edit (text fields,
 * uploads decoded from memory, the engine's image checks, the limits; serve/api_edit.c). The multipart syntax itself
 * is libmicrohttpd's; this drives everything ditrun does with what it yields.
 *
 * Input format: parts separated by the line "\n--\n"; a part's first line is its name, optionally ";filename";
 * the rest is its data. Byte 0 (when the input has one) picks the piece size (1 + b % 61, or whole parts at 0).
 * A refusal must be a 400 with a message and a valid JSON error object; an accepted request must hold at least one
 * decoded image, a mask of the init image's size when inpainting, fields within the limits, and pass the engine's
 * own request checks. Returns 1 accepted, 0 refused, -1 when an invariant broke (the fuzzer traps on -1). */
#ifndef DT_FUZZ_API_EDIT_DRIVE_H
#define DT_FUZZ_API_EDIT_DRIVE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_api_drive.h"
#include "io/json.h"
#include "serve/api.h"

/* Feed one part (name line + data) to the form in pieces of `piece` bytes (0: whole). 0 or -1 (refused). */
static inline int fuzz_edit_part(dt_api_form *f, const uint8_t *p, size_t n, size_t piece, dt_api_error *e) {
    const uint8_t *nl = memchr(p, '\n', n);
    size_t hl = nl ? (size_t)(nl - p) : n;
    char head[128];
    size_t k = hl < sizeof head - 1 ? hl : sizeof head - 1;
    memcpy(head, p, k);
    head[k] = 0;
    char *semi = strchr(head, ';');
    const char *filename = NULL;
    if (semi) {
        *semi = 0;
        filename = semi + 1;
    }
    const uint8_t *d = nl ? nl + 1 : p + n;
    size_t dn = (size_t)(p + n - d), off = 0;
    if (dn == 0) return dt_api_form_add(f, head, filename, "", 0, 0, e);
    while (off < dn) {
        size_t m = piece && dn - off > piece ? piece : dn - off;
        if (dt_api_form_add(f, head, filename, (const char *)d + off, off, m, e)) return -1;
        off += m;
    }
    return 0;
}

static inline int fuzz_api_edit_one(const uint8_t *data, size_t size) {
    dt_api_limits lim;
    fuzz_api_limits(&lim);
    lim.info.editing = 1;
    size_t piece = size ? (data[0] ? 1 + data[0] % 61 : 0) : 0;
    const uint8_t *p = size ? data + 1 : data, *end = data + size;
    dt_api_form f;
    dt_api_form_init(&f);
    dt_api_error e;
    dt_strbuf b;
    sb_init(&b);
    int rc = 0;
    while (p < end && rc == 0) {
        const uint8_t *sep = NULL;
        for (const uint8_t *q = p; q + 4 <= end && !sep; q++)
            if (!memcmp(q, "\n--\n", 4)) sep = q;
        const uint8_t *pe = sep ? sep : end;
        if (pe > p) rc = fuzz_edit_part(&f, p, (size_t)(pe - p), piece, &e);
        p = sep ? sep + 4 : end;
    }
    dt_api_request r;
    if (rc == 0) rc = dt_api_parse_edit(&f, &lim, 42, &r, &e);
    dt_api_form_free(&f);
    if (rc) {
        dt_api_error_json(&b, &e);
        int ok = e.status == 400 && e.message[0] && fuzz_api_valid_json(&b);
        sb_free(&b);
        return ok ? 0 : -1;
    }
    int ok = r.edit && r.prompt && r.prompt[0] && r.n >= 1 && r.n <= DT_API_MAX_N && (r.n_refs >= 1 || r.inpaint) &&
             r.n_refs <= DT_GEN_MAX_REFS && r.steps >= 0 && r.steps <= lim.max_steps &&
             (!r.inpaint || (r.init.px && r.mask.px && r.mask.w == r.init.w && r.mask.h == r.init.h)) &&
             (r.inpaint || (r.strength == 0)) && (r.strength == 0 || (r.strength > 0 && r.strength <= 1)) &&
             (r.width == 0 || (int64_t)r.width * r.height <= lim.max_pixels);
    for (int i = 0; ok && i < r.n_refs; i++)
        ok = r.refs[i].px && r.refs[i].w >= 64 && r.refs[i].h >= 64 && r.ref_names[i];
    for (int i = 0; ok && i < r.n; i++) {
        dt_gen_params g = dt_api_image_job(&r, i);   /* resolved once: resolving again changes nothing */
        const dt_gen_params g0 = g;
        ok = dt_gen_params_resolve(&lim.info, &g) == 0 && g.seed == r.seed + (uint64_t)i && g.steps == g0.steps &&
             g.guidance == g0.guidance && g.width == g0.width && g.height == g0.height;
    }
    dt_api_request_free(&r);
    sb_free(&b);
    return ok ? 1 : -1;
}

#endif
