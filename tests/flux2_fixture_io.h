/* flux2_fixture_io.h — shared by test_layouts.c and test_quantize.c: run the FLUX.2 transformer on the
 * inputs of tests/fixtures/transformer_io.safetensors and compare out.sample with a reference file.
 * Header-only (static functions) so that it adds nothing to the other test programs. */
#ifndef DT_FLUX2_FIXTURE_IO_H
#define DT_FLUX2_FIXTURE_IO_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "io/safetensors.h"
#include "models/flux2.h"
#include "test.h"

/* f32 forward vs a float32 reference computed on the same (bf16 or dequantized) weights. */
#define FIXTURE_FORWARD_TOL 1e-4

typedef struct {
    float *img, *txt, *img_ids, *txt_ids, ts;
    int n, t;
} fx_inputs;

static int fx_load_inputs(fx_inputs *fi) {
    char p[512];
    snprintf(p, sizeof p, "%s/transformer_io.safetensors", t_fixtures());
    st_file *io = st_open(p);
    if (!io) return -1;
    const st_tensor *h = st_find(io, "in.hidden_states"), *e = st_find(io, "in.encoder_hidden_states");
    fi->n = (int)h->shape[1];
    fi->t = (int)e->shape[1];
    fi->img = st_to_f32(h);
    fi->txt = st_to_f32(e);
    fi->img_ids = st_to_f32(st_find(io, "in.img_ids"));
    fi->txt_ids = st_to_f32(st_find(io, "in.txt_ids"));
    float *ts = st_to_f32(st_find(io, "in.timestep"));
    fi->ts = ts[0];
    free(ts);
    st_close(io);
    return 0;
}

static void fx_free_inputs(fx_inputs *fi) {
    free(fi->img); free(fi->txt); free(fi->img_ids); free(fi->txt_ids);
}

/* Reference out.sample of FILE (malloc'd f32) or NULL. */
static float *fx_reference(const char *file, size_t *n) {
    st_file *f = st_open(file);
    if (!f) return NULL;
    const st_tensor *t = st_find(f, "out.sample");
    float *r = t ? st_to_f32(t) : NULL;
    if (t) *n = (size_t)t->numel;
    st_close(f);
    return r;
}

/* Load MODEL (any layout), run the fixture forward on the CPU, compare with out.sample of EXPECTED.
 * Returns the relative L2 error (or -1 when load/forward failed; a FAIL line is printed either way). */
static double fx_forward_check(const char *name, const char *model, const char *expected, double tol) {
    fx_inputs fi;
    if (fx_load_inputs(&fi)) { T_FAIL(name, "inputs: %s", dt_last_error()); return -1; }
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){.rope_fp32 = 1});
    double err = -1;
    flux2_model *m = flux2_load(be, model);
    if (!m) { T_FAIL(name, "load %s: %s", model, dt_last_error()); goto out; }
    const flux2_config *c = flux2_get_config(m);
    size_t nout = (size_t)fi.n * c->out_channels, nref = 0;
    float *got = dt_malloc(sizeof(float) * nout), *ref = fx_reference(expected, &nref);
    if (!ref || nref != nout) T_FAIL(name, "reference %s: %s", expected, ref ? "size differs" : dt_last_error());
    else if (flux2_forward(m, fi.img, fi.n, fi.txt, fi.t, fi.ts, fi.img_ids, fi.txt_ids, got, NULL, NULL))
        T_FAIL(name, "forward: %s", dt_last_error());
    else {
        err = dt_rel_l2(got, ref, nout);
        t_check_rel_l2(name, got, ref, nout, tol);
    }
    free(got);
    free(ref);
    flux2_free(m);
out:
    be->destroy(be);
    fx_free_inputs(&fi);
    return err;
}

#endif
