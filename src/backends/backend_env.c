/* backend_env.c — the one place where the backends' environment variables become typed options
 * (docs/environment.md lists them). Backends themselves never read the environment: a CUDA backend created
 * without explicit options takes dt_cuda_opts_from_env's, once, at creation. */
#include "backend_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void dt_cuda_opts_default(dt_cuda_opts *o) {
    memset(o, 0, sizeof *o);
    o->gemm_tune = 1;
    o->trace_ms = 0.5;
}

/* The default file of tuned GEMM choices: $XDG_CACHE_HOME/ditrun/gemm-algos.txt, else
 * ~/.cache/ditrun/gemm-algos.txt, its folder created; "" (in memory only) when neither is usable. */
static void default_gemm_cache(char *out, size_t size) {
    char dir[400];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    out[0] = 0;
    if (xdg && xdg[0]) snprintf(dir, sizeof dir, "%s", xdg);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.cache", home);
    else return;
    mkdir(dir, 0755);
    size_t n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/ditrun");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return;   /* not writable: in memory only */
    snprintf(out, size, "%s/gemm-algos.txt", dir);
}

/* A set variable whose value is the given flag ("1") or its absence ("0"); -1 with an error otherwise. */
static int flag_var(const char *name, const char *v, int *dst) {
    if (!strcmp(v, "0") || !strcmp(v, "1")) {
        *dst = v[0] == '1';
        return 0;
    }
    dt_set_error("environment variable %s=%s: expected 0 or 1 (docs/environment.md)", name, v);
    return -1;
}

int dt_cuda_opts_from_env(dt_cuda_opts *o) {
    dt_cuda_opts_default(o);
    int rc = 0;
    const char *v;
    if ((v = getenv("DITRUN_CUDNN_LIB")) && *v) snprintf(o->cudnn_lib, sizeof o->cudnn_lib, "%s", v);
    if ((v = getenv("DITRUN_CUDNN_DEBUG")) && *v && flag_var("DITRUN_CUDNN_DEBUG", v, &o->cudnn_debug)) rc = -1;
    if ((v = getenv("DITRUN_GEMM_TUNE")) && *v && flag_var("DITRUN_GEMM_TUNE", v, &o->gemm_tune)) {
        o->gemm_tune = 1;
        rc = -1;
    }
    if ((v = getenv("DITRUN_GEMM_CACHE"))) {
        if (strcmp(v, "none")) snprintf(o->gemm_cache, sizeof o->gemm_cache, "%s", v);
    } else {
        default_gemm_cache(o->gemm_cache, sizeof o->gemm_cache);
    }
    if ((v = getenv("DITRUN_CUDA_TRACE")) && *v) {
        if ((v[0] >= '0' && v[0] <= '3') && !v[1]) {
            o->trace = v[0] - '0';
        } else {
            dt_set_error("environment variable DITRUN_CUDA_TRACE=%s: expected 0, 1, 2 or 3 (docs/environment.md)", v);
            rc = -1;
        }
    }
    if ((v = getenv("DITRUN_CUDA_TRACE_MS")) && *v) {
        char *end;
        double ms = strtod(v, &end);
        if (*end || ms < 0) {
            dt_set_error("environment variable DITRUN_CUDA_TRACE_MS=%s: expected a number of milliseconds >= 0", v);
            rc = -1;
        } else {
            o->trace_ms = ms;
        }
    }
    if ((v = getenv("DITRUN_CUDA_KERNELS")) && *v && dt_cuda_kernels_from_name(v, &o->kernels)) {
        dt_set_error("environment variable DITRUN_CUDA_KERNELS=%s: expected auto or portable (docs/environment.md)", v);
        rc = -1;
    }
    return rc;
}
