/* zimage_fixture.h — the Z-Image reference fixtures (tests/fixtures/zimage, made by tools/zimage_reference.py) as the
 * Z-Image test programs (test_zimage.c, test_zimage_cli.c) read them: their folder, a file's path in it, whether they
 * are present, and the noise file (`--noise`) of an img2img / inpaint case from the draws the reference recorded.
 * Header-only (static functions). */
#ifndef DT_TESTS_ZIMAGE_FIXTURE_H
#define DT_TESTS_ZIMAGE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "test.h"

static char g_dir[400];   /* tests/fixtures/zimage (room in the callers' path buffers) */

/* The path of the fixture file REL into buf. */
static const char *fx(const char *rel, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", g_dir, rel);
    return buf;
}

/* Sets g_dir: 1 when its cases.json is there, else 0 (the caller skips the fixture checks). */
static int zimage_fixtures_present(void) {
    snprintf(g_dir, sizeof g_dir, "%s/zimage", t_fixtures());
    struct stat st;
    char p[600];
    return stat(fx("cases.json", p, sizeof p), &st) == 0;
}

/* The noise file OUT of cases.json's edit case KEY whose tensors are in FILE: in.initial_latents = the pipeline's
 * draw, in.posterior_noise = the VAE posterior's first draw (the case's draws_in_order names them). 0 or -1. */
static int zimage_edit_noise(const char *key, const char *file, const char *out) {
    char p[600];
    json *cases = json_parse_file(fx("cases.json", p, sizeof p));
    const json *d = cases ? json_get(json_get(cases, key), "draws_in_order") : NULL;
    const char *noise = NULL, *post = NULL;
    for (size_t i = 0; d && i < d->len; i++) {
        const json *e = json_at(d, i);
        const char *by = json_get_str(e, "drawn_by"), *t = json_get_str(e, "tensor");
        if (by && t && !strcmp(by, "pipeline") && !noise) noise = t;
        if (by && t && !strcmp(by, "vae_posterior") && !post) post = t;
    }
    st_file *io = st_open(fx(file, p, sizeof p));
    const st_tensor *tn = io && noise ? st_find(io, noise) : NULL, *tp = io && post ? st_find(io, post) : NULL;
    int rc = -1;
    if (tn && tp) {
        st_writer *w = st_writer_new();
        float *a = st_to_f32(tn), *b = st_to_f32(tp);
        st_writer_add_f32(w, "in.initial_latents", tn->ndim, tn->shape, a);
        st_writer_add_f32(w, "in.posterior_noise", tp->ndim, tp->shape, b);
        rc = st_writer_save(w, out);
        st_writer_free(w);
        free(a);
        free(b);
    }
    if (io) st_close(io);
    json_free(cases);
    return rc;
}

#endif
