/* lora_backend.h — LoRA side products on any backend: a thin backend that runs another backend's ops and adds
 * low-rank terms to chosen Linears, so quantized weights (MLX q4/q8, fp8, GGUF) take an adapter without a
 * dequantized copy:
 *     y = x · Wᵀ (+ bias) + (x · Aᵀ) · Bᵀ        A [R, in], B [out, R] (the adapters' scales folded into B)
 * The wrapper shares the inner backend's impl, options and memory and forwards its ops, Linear ops replaced: every
 * Linear created through it is a wrapper object around the inner backend's Linear. The model loads and runs
 * through the wrapper exactly as through any backend (linear, linear_gated_add, norm_linear, rmsnorm_mod_linears,
 * act_linear_gated, linear_prefetch, linear_on_host); a Linear with a side product runs its fused norm/activation paths as their composed ops.
 * The side product costs two small GEMMs and (where the backend has no fused gated add) one [M, out] pass. */
#ifndef DT_LORA_BACKEND_H
#define DT_LORA_BACKEND_H

#include "backends/backend.h"

/* A wrapper around inner (which must outlive it). Its destroy() frees the wrapper only. NULL on error. */
dt_backend *dt_lora_backend_wrap(dt_backend *inner);
int dt_lora_backend_is_wrapper(const dt_backend *be);
/* Add the side product (x·Aᵀ)·Bᵀ to w, a Linear created through the wrapper `be`: A [R, in], B [out, R] f32 host
 * (copied). 0 or -1 (dt_last_error). */
int dt_lora_backend_attach(dt_backend *be, dt_linear *w, const float *A, const float *B, int64_t R);

#endif
