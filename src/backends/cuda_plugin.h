/* cuda_plugin.h — the CUDA backend as a plugin: libditrun_cuda.so holds the CUDA code (the .cu files of src/backends/cuda/,
 * linked with cuBLASLt, cuBLAS and the CUDA runtime) and is dlopen()ed only when a CUDA backend is asked for
 * (dt_backend_cuda_available / dt_backend_cuda_create in cuda_loader.c), so commands that never touch the GPU
 * (info, tokenize, --version, --backend cpu) do not load the CUDA libraries at all.
 *
 * The plugin calls the core (dt_set_error, dt_log, dtype helpers, ...) through the executable's exported
 * symbols: programs are linked with the whole libditrun.a and export the core's names (the Makefile's
 * PLUGIN_HOST_LDFLAGS). It is looked up beside the executable, in ../lib/ditrun/ (installed layout), one folder
 * up (the test programs in build/tests/) and then by the dynamic linker's search path. The two sides must come
 * from the same sources: the plugin exports the ABI tag it was built with (a checksum of the headers, generated
 * into $(BUILD)/gen/dt_abi.h) and the loader refuses a plugin whose tag differs. */
#ifndef DT_CUDA_PLUGIN_H
#define DT_CUDA_PLUGIN_H

#include "backends/backend_cuda.h"
#include "backends/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CUDA_PLUGIN_FILE "libditrun_cuda.so"

/* What the plugin exports under the name "dt_cuda_plugin_entry" (checked after "dt_cuda_plugin_abi"). */
typedef struct {
    int (*available)(void);
    dt_backend *(*create)(const dt_backend_opts *opts);
    int (*cudnn_info)(dt_backend *be, long long *calls);
    dt_cuda_opts *(*opts)(dt_backend *be);
    int (*device_count)(void);
    dt_comm *(*comm_create)(dt_backend *const *ranks, int n);   /* the NCCL communicator (backends/comm.h) */
    int (*device_info)(int device, char *name, size_t name_size, int *cc_major, int *cc_minor);
    int (*mem_budget)(dt_backend *be, int64_t *budget, int64_t *held);
} dt_cuda_plugin;

#ifdef __cplusplus
}
#endif
#endif
