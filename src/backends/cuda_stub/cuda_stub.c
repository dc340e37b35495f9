/* cuda_stub.c — linked instead of the CUDA backend when ditrun is built without nvcc. */
#include "backends/backend.h"

int dt_backend_cuda_available(void) { return 0; }

dt_backend *dt_backend_cuda_create(const dt_backend_opts *opts) {
    (void)opts;
    dt_set_error("this ditrun was built without CUDA (nvcc not found at build time); use --backend cpu");
    return NULL;
}

int dt_backend_cuda_cudnn_info(dt_backend *be, long long *calls) {
    (void)be;
    if (calls) *calls = 0;
    return 0;
}
