/* cuda_paths.c — which path each op family of the CUDA backend takes, as pure functions of the card's compute
 * capability and the kernel mode (--kernels auto|portable): the one place that decides whether the sm_90a
 * kernels may run. Plain C with no CUDA: the backend asks it at creation, `ditrun info --devices` and -v print
 * it, and the CPU test suite checks it (tests/test_cuda_paths.c). */
#include "backend_cuda.h"

#include <string.h>

int dt_cuda_hopper_paths(int cc_major, int cc_minor, dt_cuda_kernels kernels) {
    /* the sm_90a image (wgmma, TMA, setmaxnreg) runs on compute 9.0 only: not on 10.x / 12.x */
    return cc_major == 9 && cc_minor == 0 && kernels != DT_CUDA_KERNELS_PORTABLE;
}

int dt_cuda_fp8_supported(int cc_major, int cc_minor) {
    return cc_major > 8 || (cc_major == 8 && cc_minor >= 9);
}

dt_cuda_path dt_cuda_ops_path(dt_cuda_ops ops, int cc_major, int cc_minor, dt_cuda_kernels kernels) {
    const int hopper = dt_cuda_hopper_paths(cc_major, cc_minor, kernels);
    switch (ops) {
    case DT_CUDA_OPS_ATTENTION:
    case DT_CUDA_OPS_QLINEAR:
        return hopper ? DT_CUDA_PATH_SM90A : DT_CUDA_PATH_PORTABLE;
    case DT_CUDA_OPS_FP8:
        return dt_cuda_fp8_supported(cc_major, cc_minor) ? DT_CUDA_PATH_CUBLASLT : DT_CUDA_PATH_NONE;
    case DT_CUDA_OPS_ELEMENTWISE:
    case DT_CUDA_OPS_IMAGE:
    case DT_CUDA_OPS_GGML:
    default:
        return DT_CUDA_PATH_PORTABLE;
    }
}

const char *dt_cuda_ops_name(dt_cuda_ops ops) {
    static const char *const names[DT_CUDA_OPS_COUNT] = {"attention", "quantized linear", "fp8 linear",
                                                         "elementwise", "image", "ggml"};
    return ops >= 0 && ops < DT_CUDA_OPS_COUNT ? names[ops] : "?";
}

const char *dt_cuda_path_text(dt_cuda_ops ops, dt_cuda_path path) {
    switch (ops) {
    case DT_CUDA_OPS_ATTENTION:
        return path == DT_CUDA_PATH_SM90A
                   ? "sm90a: cuDNN's fused SDPA where it loads and measured faster, else our wgmma flash kernel"
                   : "portable: cuDNN's fused SDPA where it loads and measured faster, else our mma.sync flash kernel";
    case DT_CUDA_OPS_QLINEAR:
        return path == DT_CUDA_PATH_SM90A
                   ? "sm90a: --qpath mixed runs our wgmma + TMA mixed-input GEMM; others dequantize for cuBLASLt / qmm"
                   : "portable: dequantized for cuBLASLt, our qmm at <= 64 rows (--qpath mixed takes auto)";
    case DT_CUDA_OPS_FP8:
        return path == DT_CUDA_PATH_CUBLASLT
                   ? "cublaslt: e4m3 GEMMs (fp8 attention: cuDNN's fp8 SDPA where it has an engine)"
                   : "none: --precision fp8 needs compute capability 8.9 or newer (fp8 files run widened to bf16)";
    default:
        return "portable: our kernels, the same on every card";
    }
}

const char *dt_cuda_kernels_name(dt_cuda_kernels k) { return k == DT_CUDA_KERNELS_PORTABLE ? "portable" : "auto"; }

int dt_cuda_kernels_from_name(const char *name, dt_cuda_kernels *out) {
    if (name && !strcmp(name, "auto")) { *out = DT_CUDA_KERNELS_AUTO; return 0; }
    if (name && !strcmp(name, "portable")) { *out = DT_CUDA_KERNELS_PORTABLE; return 0; }
    dt_set_error("unknown kernel mode '%s' (auto, portable)", name ? name : "");
    return -1;
}
