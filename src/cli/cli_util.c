/* cli_util.c — option parsing helpers shared by the subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ditrun: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
    if (!s) { cli_error("option %s needs a value", opt); return -1; }
    char *end; errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) { cli_error("option %s: '%s' is not an integer", opt, s); return -1; }
    if (v < lo || v > hi) { cli_error("option %s: %ld is out of range [%ld, %ld]", opt, v, lo, hi); return -1; }
    *out = v;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double *out) {
    if (!s) { cli_error("option %s needs a value", opt); return -1; }
    char *end; errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v) { cli_error("option %s: '%s' is not a number", opt, s); return -1; }
    *out = v;
    return 0;
}

void cli_power_begin(cli_power *p, dt_backend *be, long max) {
    memset(p, 0, sizeof *p);
    dt_power_sample s;
    if (!be->power_sample || max < 1 || be->power_sample(be, &s) != 0) return;
    p->be = be;
    p->max = max;
    p->mhz = dt_malloc(sizeof(double) * (size_t)max);
    p->watts = dt_malloc(sizeof(double) * (size_t)max);
}

void cli_power_sample(cli_power *p) {
    dt_power_sample s;
    if (!p->be || p->n >= p->max || p->be->power_sample(p->be, &s) != 0) return;
    p->mhz[p->n] = s.sm_mhz;
    p->watts[p->n] = s.power_w;
    p->sm_max = s.sm_max_mhz;
    p->limit = s.limit_w;
    p->capped += (s.reasons & 0x4) != 0;
    p->n++;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void cli_power_report(cli_power *p, const char *what) {
    if (p->be && p->n > 0) {
        qsort(p->mhz, (size_t)p->n, sizeof(double), cmp_dbl);
        qsort(p->watts, (size_t)p->n, sizeof(double), cmp_dbl);
        dt_log(1, "ditrun: gpu after each of the %s: SM clock median %.0f MHz (%.0f-%.0f, max %d), power median %.0f W "
                  "of %.0f W cap; power-capped in %ld of %ld samples\n",
               what, p->mhz[p->n / 2], p->mhz[0], p->mhz[p->n - 1], p->sm_max, p->watts[p->n / 2], p->limit, p->capped,
               p->n);
    }
    free(p->mhz);
    free(p->watts);
    memset(p, 0, sizeof *p);
}
