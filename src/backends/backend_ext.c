/* backend_ext.c — helpers over the backends' optional extensions (backend_ext.h): the clock and power summary of
 * repeated timed runs. */
#include "backend_ext.h"

#include <stdlib.h>
#include <string.h>

void dt_power_begin(dt_power_acc *a, dt_backend *be, int max) {
    memset(a, 0, sizeof *a);
    dt_power_sample ps;
    const dt_ext_profiling *pf = dt_backend_profiling(be);
    if (!pf || !pf->power_sample || max < 1 || pf->power_sample(be, &ps) != 0) return;
    a->be = be;
    a->sample = pf->power_sample;
    a->max = max;
    a->mhz = dt_malloc(sizeof(double) * (size_t)max);
    a->watts = dt_malloc(sizeof(double) * (size_t)max);
}

void dt_power_add(dt_power_acc *a) {
    dt_power_sample ps;
    if (!a->be || a->n >= a->max || a->sample(a->be, &ps) != 0) return;
    a->mhz[a->n] = ps.sm_mhz;
    a->watts[a->n++] = ps.power_w;
    a->s.capped += (ps.reasons & 0x4) != 0;
    a->s.sm_max_mhz = ps.sm_max_mhz;
    a->s.limit_w = ps.limit_w;
}

static int cmp_dbl(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Sorts v[0..n) (n >= 1) and returns its median (the mean of the middle two for even n). */
static double sort_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

dt_power_summary dt_power_end(dt_power_acc *a) {
    dt_power_summary s = a->s;
    s.n = a->n;
    if (a->n) {
        s.sm_mhz_med = sort_median(a->mhz, a->n);
        s.sm_mhz_min = a->mhz[0];
        s.sm_mhz_max = a->mhz[a->n - 1];
        s.power_w_med = sort_median(a->watts, a->n);
    }
    free(a->mhz);
    free(a->watts);
    memset(a, 0, sizeof *a);
    return s;
}
