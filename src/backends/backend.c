/* backend.c — backend selection by name and small helpers shared by all backends. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_backend *dt_backend_create(const char *name, const dt_backend_opts *opts) {
    if (!name || !strcmp(name, "auto")) {
        if (dt_backend_cuda_available()) return dt_backend_cuda_create(opts);
        return dt_backend_cpu_create(opts);
    }
    if (!strcmp(name, "cpu")) return dt_backend_cpu_create(opts);
    if (!strcmp(name, "cuda")) return dt_backend_cuda_create(opts);
    dt_set_error("unknown backend '%s' (expected cpu, cuda or auto)", name);
    return NULL;
}

dt_mat dt_alloc_or_die(dt_backend *be, int64_t rows, int64_t cols, dt_dtype dtype) {
    dt_mat m;
    if (be->alloc(be, &m, rows, cols, dtype) != 0) {
        fprintf(stderr, "ditrun: error: %s\n", dt_last_error());
        exit(1);
    }
    return m;
}

dt_mat dt_param_upload(dt_backend *be, const float *src, int64_t n) {
    dt_mat m = dt_alloc_or_die(be, 1, n, DT_F32);
    be->upload(be, m, src);
    return m;
}

