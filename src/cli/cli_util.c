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

void cli_power_report(const dt_power_summary *s, const char *what) {
    if (s->n < 1) return;
    dt_log(1, "ditrun: gpu after each of the %s: SM clock median %.0f MHz (%.0f-%.0f, max %d), power median %.0f W "
              "of %.0f W cap; power-capped in %d of %d samples\n",
           what, s->sm_mhz_med, s->sm_mhz_min, s->sm_mhz_max, s->sm_max_mhz, s->power_w_med, s->limit_w, s->capped, s->n);
}
