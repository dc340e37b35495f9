/* cuda_plugin.cu — the entry of libditrun_cuda.so (backends/cuda_plugin.h): its ABI tag and the table of the
 * CUDA backend's C entry points that backends/cuda_loader.c looks up after dlopen(). */
#include "backends/cuda_plugin.h"
#include "dt_abi.h"

extern "C" {
extern const char dt_cuda_plugin_abi[];
const char dt_cuda_plugin_abi[] = DT_ABI_TAG;

extern const dt_cuda_plugin dt_cuda_plugin_entry;
const dt_cuda_plugin dt_cuda_plugin_entry = {
    dt_backend_cuda_available,
    dt_backend_cuda_create,
    dt_backend_cuda_cudnn_info,
    dt_backend_cuda_opts,
    dt_backend_cuda_device_count,
    dt_comm_nccl_create,
    dt_backend_cuda_device_info,
    dt_backend_cuda_mem_budget,
};
}
