/* backend_ext.h — a backend's optional extensions: tools for the bench, the tests and dev/ studies that models never
 * call (timing events, the GPU's clock and power, the fp8 Linear's internals), kept out of the op interface
 * (backend.h) and looked up by name through its get_ext slot, as ggml's get_proc_address. Each extension is a table of
 * functions called with the backend that returned it; a backend without one returns NULL. */
#ifndef DT_BACKEND_EXT_H
#define DT_BACKEND_EXT_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The GPU's clock and power state at one moment (power_sample). */
typedef struct {
    int sm_mhz, sm_max_mhz;          /* current and maximum SM clock */
    double power_w, limit_w;         /* board power draw and the enforced power limit */
    unsigned long long reasons;      /* clock throttle reasons (NVML bits: 0x4 software power cap, 0x20/0x40
                                      * thermal, 0x8 hardware slowdown, 0x1 idle) */
    int temp_c;
} dt_power_sample;

/* "profiling" (CPU: wall-clock events; CUDA: CUDA events and NVML). */
#define DT_EXT_PROFILING "profiling"
typedef struct {
    /* Timing: an event records the position in the queue; elapsed_ms waits for both. */
    void *(*event_create)(dt_backend *be);
    void (*event_record)(dt_backend *be, void *ev);
    float (*event_elapsed_ms)(dt_backend *be, void *start, void *end);
    void (*event_destroy)(dt_backend *be, void *ev);
    /* event_record without joining side work into the queue first (CUDA: the prefetch stream), so that per-op
     * timings (backend_trace.h, level 3) keep the overlap of a real run; NULL: event_record does that already. */
    void (*event_mark)(dt_backend *be, void *ev);
    /* The device's clock and power now (CUDA: NVML); -1 when unavailable; NULL where the backend has no sensor.
     * Timings mean little without it: a sustained forward on an H200 runs at its power cap, ~20% under the clock
     * of a short burst. */
    int (*power_sample)(dt_backend *be, dt_power_sample *p);
} dt_ext_profiling;

/* "fp8-internals" (CUDA): the fp8 Linear's parts for the bench and its tests. */
#define DT_EXT_FP8_INTERNALS "fp8-internals"
typedef struct {
    /* The activation quantization pass alone on x [M, K] (what an fp8 linear does before its GEMM). */
    void (*quant)(dt_backend *be, dt_mat x);
    /* How the GEMM applies the scales ("outer-vector (cuBLASLt)", ...). */
    const char *(*scale_mode)(dt_backend *be);
    /* The A/B arm of the fused fp8 inputs for every fp8 Linear at once (as each Linear's dt_linear_src.fp8_unfused,
     * which this overrides while on): 1 = the Linears quantize their input in a pass of their own and gated
     * residuals run as linear + gated_add; 0 = each Linear as created. For the bench's f8fuse arm and timings. */
    void (*force_unfused)(dt_backend *be, int on);
} dt_ext_fp8_internals;

/* The extension `name` of be, or NULL (no get_ext, or none by that name). */
static inline const void *dt_backend_ext(dt_backend *be, const char *name) {
    return be && be->get_ext ? be->get_ext(be, name) : NULL;
}
static inline const dt_ext_profiling *dt_backend_profiling(dt_backend *be) {
    return (const dt_ext_profiling *)dt_backend_ext(be, DT_EXT_PROFILING);
}
static inline const dt_ext_fp8_internals *dt_backend_fp8_internals(dt_backend *be) {
    return (const dt_ext_fp8_internals *)dt_backend_ext(be, DT_EXT_FP8_INTERNALS);
}

/* The clock and power state across repeated timed runs: dt_power_begin (max samples; a backend without
 * power_sample gives an empty summary), dt_power_add after each run, dt_power_end for the summary (frees). */
typedef struct {
    int n, capped, sm_max_mhz;       /* samples, how many were power-capped, the maximum SM clock */
    double sm_mhz_med, sm_mhz_min, sm_mhz_max, power_w_med, limit_w;
} dt_power_summary;
typedef struct {
    dt_backend *be;
    int (*sample)(dt_backend *be, dt_power_sample *p);   /* the backend's power_sample */
    int n, max;
    double *mhz, *watts;
    dt_power_summary s;
} dt_power_acc;
void dt_power_begin(dt_power_acc *a, dt_backend *be, int max);
void dt_power_add(dt_power_acc *a);
dt_power_summary dt_power_end(dt_power_acc *a);

#ifdef __cplusplus
}
#endif
#endif
