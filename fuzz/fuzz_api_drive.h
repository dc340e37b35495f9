/* fuzz_api_drive.h — what the server-request fuzzer does with one input, shared by fuzz/fuzz_api.c and the corpus
 * replay in tests/test_fuzz_corpus.c: the bytes as the body of POST /v1/images/generations, parsed and checked
 * against fixed limits (serve/api.h). A refusal must be a 400 whose error object is valid JSON; an accepted request
 * must be within every limit, pass the engine's own checks for each of its images, and give an answer that is valid
 * JSON. Returns 1 accepted, 0 refused, -1 when an invariant broke (the fuzzer traps on -1). */
#ifndef DT_FUZZ_API_DRIVE_H
#define DT_FUZZ_API_DRIVE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "serve/api.h"

static inline int fuzz_api_valid_json(dt_strbuf *b) {
    json *j = json_parse(b->data, b->len, "answer");
    json_free(j);
    return j != NULL;
}

/* The fixed limits both request fuzzers check against: a klein-4B-like distilled model (the edit fuzzer turns
 * editing on). */
static inline void fuzz_api_limits(dt_api_limits *lim) {
    memset(lim, 0, sizeof *lim);
    lim->model_id = "FLUX.2-klein-4B";
    lim->info.family = "flux2-klein";
    lim->info.default_steps = 4;
    lim->info.default_guidance = 1.0f;
    lim->info.distilled = 1;
    lim->info.size_multiple = 16;
    lim->info.max_side = 4096;
    lim->max_pixels = 2048 * 2048;
    lim->max_steps = 50;
}

static inline int fuzz_api_one(const uint8_t *data, size_t size) {
    dt_api_limits lim;
    fuzz_api_limits(&lim);
    dt_api_request r;
    dt_api_error e;
    dt_strbuf b;
    sb_init(&b);
    int rc = dt_api_parse_generation((const char *)data, size, &lim, 42, &r, &e);
    if (rc) {
        dt_api_error_json(&b, &e);
        int ok = e.status == 400 && e.message[0] && fuzz_api_valid_json(&b);
        sb_free(&b);
        return ok ? 0 : -1;
    }
    int ok = r.prompt && r.prompt[0] && r.negative_prompt && r.n >= 1 && r.n <= DT_API_MAX_N && r.width > 0 &&
             r.height > 0 && (int64_t)r.width * r.height <= lim.max_pixels && r.width % 16 == 0 && r.height % 16 == 0 &&
             r.steps >= 0 && r.steps <= lim.max_steps && (r.guidance_given ? r.guidance >= 0 && r.guidance <= 100 : 1);
    for (int i = 0; ok && i < r.n; i++) {
        dt_gen_params g = dt_api_image_job(&r, i);   /* resolved once: resolving again changes nothing */
        const dt_gen_params g0 = g;
        ok = dt_gen_params_resolve(&lim.info, &g) == 0 && g.seed == r.seed + (uint64_t)i && g.steps == g0.steps &&
             g.guidance == g0.guidance && g.width == g0.width && g.height == g0.height &&
             g.width == r.width && g.height == r.height;
    }
    if (ok) {   /* an answer carrying the prompt's bytes as its "image" is valid JSON */
        uint8_t *png[1] = {(uint8_t *)r.prompt};
        size_t len = strlen(r.prompt);
        uint64_t seed = r.seed;
        dt_api_images_json(&b, 0, DT_OUT_PNG, 1, png, &len, &seed);
        ok = fuzz_api_valid_json(&b);
        sb_reset(&b);
        dt_api_error_set(&e, 500, "server_error", NULL, "generation failed: %s", r.prompt);   /* user text in a message */
        dt_api_error_json(&b, &e);
        ok = ok && fuzz_api_valid_json(&b);
    }
    dt_api_request_free(&r);
    sb_free(&b);
    return ok ? 1 : -1;
}

#endif
