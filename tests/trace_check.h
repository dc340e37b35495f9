/* trace_check.h — checking a model forward's intermediates against a fixture's "mid.*" reference tensors, shared
 * by tests/test_flux2.c and tests/test_krea2.c (header-only: the PASS/FAIL counters of test.h are per program). */
#ifndef DT_TEST_TRACE_CHECK_H
#define DT_TEST_TRACE_CHECK_H

#include "backends/backend.h"
#include "io/safetensors.h"
#include "test.h"

/* t_check_rel_l2 plus the worst element printed on success too (as a comment line). */
static inline int check_l2(const char *name, const float *got, const float *ref, size_t n, double tol) {
    size_t worst = 0;
    double wd = -1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d > wd) { wd = d; worst = i; }
    }
    if (n) printf("# %s: worst element [%zu] got %.7g ref %.7g (|diff| %.3g)\n", name, worst, got[worst], ref[worst], wd);
    return t_check_rel_l2(name, got, ref, n, tol);
}

typedef struct {
    dt_backend *be;
    st_file *ref;        /* the fixture holding mid.<name> tensors */
    double tol;          /* relative L2 tolerance of every intermediate */
    const char *prefix;  /* test-name prefix */
    int checked;         /* intermediates compared so far */
    int require_all;     /* 1: a trace point missing from the fixture fails; 0: it is skipped */
} trace_ctx;

/* The forward's trace callback: downloads intermediate m and compares it with mid.<name>. */
static inline void check_mid(void *ud, const char *name, dt_mat m) {
    trace_ctx *tc = ud;
    char ref_name[128], test_name[200];
    snprintf(ref_name, sizeof ref_name, "mid.%s", name);
    snprintf(test_name, sizeof test_name, "%s mid.%s", tc->prefix, name);
    const st_tensor *r = st_find(tc->ref, ref_name);
    if (!r) {
        if (tc->require_all) T_FAIL(test_name, "no %s in the fixture", ref_name);
        return;
    }
    float *got = dt_malloc(sizeof(float) * (size_t)(m.rows * m.cols));
    tc->be->download(tc->be, got, m);
    float *ref = st_to_f32(r);
    if (r->numel != m.rows * m.cols)
        T_FAIL(test_name, "size %lld vs reference %lld", (long long)(m.rows * m.cols), (long long)r->numel);
    else check_l2(test_name, got, ref, (size_t)r->numel, tc->tol);
    tc->checked++;
    free(got);
    free(ref);
}

#endif
