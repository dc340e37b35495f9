/* cuda_queues.cu — the CUDA backend's execution entries: the switch between its two queues (stream_switch),
 * CUDA-graph capture and replay, and its extensions (get_ext: profiling's timing events and power_sample, the fp8
 * Linear's internals). */
#include <string.h>

#include <utility>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ the profiling extension: events, power */
static void *dtc_event_create(dt_backend *be) {
    (void)be;
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    return (void *)e;
}
static void dtc_event_record(dt_backend *be, void *ev) {
    dtc_prefetch_join(dtc(be));   /* a timed region includes the prefetches issued in it */
    CK(cudaEventRecord((cudaEvent_t)ev, dtc(be)->q.stream));
}
static void dtc_event_mark(dt_backend *be, void *ev) { CK(cudaEventRecord((cudaEvent_t)ev, dtc(be)->q.stream)); }
static float dtc_event_elapsed_ms(dt_backend *be, void *start, void *end) {
    (void)be;
    float ms = 0;
    CK(cudaEventSynchronize((cudaEvent_t)end));
    CK(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return ms;
}
static int dtc_be_power_sample(dt_backend *be, dt_power_sample *p) { return dtc_power_sample(dtc(be), p); }
static void dtc_event_destroy(dt_backend *be, void *ev) {
    (void)be;
    if (ev) CK(cudaEventDestroy((cudaEvent_t)ev));
}

int dtc_capture_begin(dt_backend *be) {
    dtc_state *st = dtc(be);
    if (st->capturing) {
        dt_set_error("cuda: capture_begin: a capture is already in progress");
        return -1;
    }
    /* prefetches issued before the capture are joined and forgotten (their events are outside it) */
    dtc_prefetch_join(st);
    dtc_prefetch_forget(st);
    cudaError_t e = cudaStreamBeginCapture(st->q.stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaStreamBeginCapture failed: %s", cudaGetErrorString(e));
        return -1;
    }
    st->capturing = 1;
    return 0;
}

/* Two queues: the current one (stream, GEMM workspace, per-queue scratch) is st->q; a switch swaps it with st->alt,
 * after making the new queue wait for the old one if asked. The side queue is created at the first switch (never
 * during a capture: then switches are ignored and work stays serial). */
void dtc_stream_switch(dt_backend *be, int q, int wait) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(q == 0 || q == 1, "stream_switch: queue %d (0 or 1)", q);
    if (st->o.serial) return;
    if (!st->alt.stream) {
        if (st->capturing || q == 0) return;
        CK(cudaStreamCreateWithPriority(&st->alt.stream, cudaStreamNonBlocking, st->queue_prio));
        if (!(st->alt.lt_ws = dtc_pool_alloc_fresh(st, st->lt_ws_size))) {   /* (the budget counts it) */
            fprintf(stderr, "ditrun: cuda: the side queue's GEMM workspace: %s\n", dt_last_error());
            exit(1);
        }
        CK(cudaEventCreateWithFlags(&st->ev_switch, cudaEventDisableTiming));
    }
    if (q == st->cur_queue) {   /* staying: wait for the other queue if asked */
        if (wait) {
            CK(cudaEventRecord(st->ev_switch, st->alt.stream));
            CK(cudaStreamWaitEvent(st->q.stream, st->ev_switch, 0));
        }
        return;
    }
    if (wait) {
        CK(cudaEventRecord(st->ev_switch, st->q.stream));
        CK(cudaStreamWaitEvent(st->alt.stream, st->ev_switch, 0));
    }
    std::swap(st->q, st->alt);
    st->cur_queue = q;
}

void *dtc_capture_end(dt_backend *be) {
    dtc_state *st = dtc(be);
    if (!st->capturing) {
        dt_set_error("cuda: capture_end without capture_begin");
        return nullptr;
    }
    /* the graph must join every stream it forked; slots filled inside it are not reusable outside */
    dtc_prefetch_join(st);
    dtc_prefetch_forget(st);
    st->capturing = 0;
    st->graphs_made++;
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(st->q.stream, &g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaStreamEndCapture failed: %s", cudaGetErrorString(e));
        return nullptr;
    }
    cudaGraphExec_t ex = nullptr;
    /* the kernels keep the priorities of the streams they were captured from (the prefetch stream's is the
     * lowest); measured against running every node at the launch stream's priority and against ignoring the
     * hints while capturing: 57.75 vs 57.97 vs 58.27 ms (PERF.md, stop 13) */
    e = cudaGraphInstantiate(&ex, g, cudaGraphInstantiateFlagUseNodePriority);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaGraphInstantiate failed: %s", cudaGetErrorString(e));
        return nullptr;
    }
    return (void *)ex;
}

int dtc_graph_launch(dt_backend *be, void *graph) {
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, dtc(be)->q.stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaGraphLaunch failed: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

void dtc_graph_destroy(dt_backend *be, void *graph) {
    (void)be;
    if (graph) CK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

/* ------------------------------------------------------------------ get_ext */
static const char *dtc_be_fp8_scale_mode(dt_backend *be) { return dtc_fp8_scale_mode(dtc(be)); }
static void dtc_fp8_force_unfused(dt_backend *be, int on) { dtc(be)->fp8_force_unfused = on != 0; }

static const dt_ext_profiling dtc_profiling = {dtc_event_create, dtc_event_record, dtc_event_elapsed_ms,
                                               dtc_event_destroy, dtc_event_mark, dtc_be_power_sample};
static const dt_ext_fp8_internals dtc_fp8_internals = {dtc_fp8_quant, dtc_be_fp8_scale_mode, dtc_fp8_force_unfused};

const void *dtc_get_ext(dt_backend *be, const char *name) {
    (void)be;
    if (!strcmp(name, DT_EXT_PROFILING)) return &dtc_profiling;
    if (!strcmp(name, DT_EXT_FP8_INTERNALS)) return &dtc_fp8_internals;
    return nullptr;
}
