/* backend_trace.h — op tracing as a wrapper over any backend (as models/lora_backend.c wraps one): every function
 * slot of struct dt_backend (backend.h's DT_BACKEND_SLOTS, the same list that declares them) is replaced by a wrapper
 * that times the inner backend's call, so a new op cannot go untraced. The CUDA backend wraps itself with it when its
 * trace option is on (DITRUN_CUDA_TRACE, docs/environment.md).
 *   level 1: each call's host time (launch work: lazy kernel loading, cuBLASLt heuristics, cudaMalloc, ...);
 *   level 2: each call followed by a sync (not while a graph is captured), so the time is host + device;
 *   level 3: device time of each call in the running queue (the profiling extension's events before and after it,
 *            no synchronization, so caches and overlap are as in a real run; not while a graph is captured), summed
 *            per op and argument shapes and printed at destroy, largest total first.
 * Levels 1-2 print calls of at least thr_ms as they happen and a per-op summary at destroy. */
#ifndef DT_BACKEND_TRACE_H
#define DT_BACKEND_TRACE_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The traced backend: takes `inner` over (destroying the wrapper prints the summary and destroys inner). The wrapper
 * shares inner's name, options and impl (functions that read a backend's impl work on either); options written on the
 * wrapper (qpath, rope_fp32, ...) reach inner at its next call. level 1-3 (level 3 without the profiling extension's
 * events: level 2). */
dt_backend *dt_backend_trace(dt_backend *inner, int level, double thr_ms);
/* Calls of slot `slot` ("linear", ...) through a traced backend so far, and their summed time in ms (level 3: device
 * time of the calls resolved so far); -1 when be is not traced or has no such slot. */
int dt_backend_trace_calls(dt_backend *be, const char *slot, double *ms);

#ifdef __cplusplus
}
#endif
#endif
