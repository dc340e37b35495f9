/* cli_util.c — option parsing helpers shared by the subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "core/infile.h"
#include "core/outfile.h"

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

int cli_check_output(const char *out, const char *in1, const char *in2) {
    const char *inputs[2] = {in1, in2};
    if (dt_output_check(out) || dt_output_not_input(out, inputs, 2)) return cli_error("%s", dt_last_error());
    return 0;
}

int cli_check_input(const char *path, int want_file) {
    int kind = dt_input_kind(path);
    if (kind < 0) return cli_error("%s", dt_last_error());
    if (want_file && kind == 1) return cli_error("%s: is a folder, not a regular file", path);
    return 0;
}

void cli_power_report(const dt_power_summary *s, const char *what) {
    if (s->n < 1) return;
    dt_log(1, "ditrun: gpu after each of the %s: SM clock median %.0f MHz (%.0f-%.0f, max %d), power median %.0f W "
              "of %.0f W cap; power-capped in %d of %d samples\n",
           what, s->sm_mhz_med, s->sm_mhz_min, s->sm_mhz_max, s->sm_max_mhz, s->power_w_med, s->limit_w, s->capped, s->n);
}

int64_t cli_parse_bytes(const char *opt, const char *v) {
    char *end = NULL;
    double x = v ? strtod(v, &end) : -1;
    int sh = 0;
    if (v && end != v && x > 0) {
        switch (*end) {
        case 'K': case 'k': sh = 10; end++; break;
        case 'M': case 'm': sh = 20; end++; break;
        case 'G': case 'g': sh = 30; end++; break;
        case 'T': case 't': sh = 40; end++; break;
        default: break;
        }
        if (sh && *end == 'i') end++;
        if (*end == 'B' || (!sh && *end == 'b')) end++;
        if (!*end && x * (double)(1LL << sh) <= 9e18 && x * (double)(1LL << sh) >= 1) return (int64_t)(x * (double)(1LL << sh));
    }
    cli_error("%s: '%s' is not a size like 12G or 8000M", opt, v ? v : "");
    return -1;
}
