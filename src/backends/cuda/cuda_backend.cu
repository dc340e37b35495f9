/* cuda_backend.cu — the CUDA backend's C edge: dt_backend_cuda_available / dt_backend_cuda_create (device checks,
 * options, streams, cuBLASLt, the vtable, kernel preloading), destroy, and dt_backend_cuda_opts. Ops are queued on
 * the current queue's stream (st->q: the main queue, or the side queue after stream_switch); the transient
 * prefetch (cuda_prefetch.cu) runs on a third, low-priority stream joined back before syncs, downloads and
 * capture ends. The pieces: cuda_pool.cu (memory), cuda_transfer.cu (copies), cuda_queues.cu (queues, graphs,
 * the extensions); with the trace option on, the backend is handed out inside the generic trace wrapper
 * (backends/backend_trace.c). */
#include "backends/backend_trace.h"
#include "cuda_common.cuh"

/* ------------------------------------------------------------------ errors */
void dtc_fatal(const char *call, const char *file, int line, const char *msg) {
    fprintf(stderr, "ditrun: cuda: %s failed at %s:%d: %s\n", call, file, line, msg ? msg : "unknown error");
    fflush(stderr);
    exit(1);
}

/* ------------------------------------------------------------------ kernel preloading */
void dtc_preload_kernels(dtc_state *st) {
    dtc_preload_attention(st);
    dtc_preload_elementwise(st);
    dtc_preload_image(st);
    dtc_preload_linear(st);
    dtc_preload_qmm(st);
    dtc_preload_fp8(st);
    dtc_preload_qgemm(st);
}

/* ------------------------------------------------------------------ create / destroy */

static void be_destroy(dt_backend *be) {
    if (!be) return;
    dtc_state *st = dtc(be);
    if (st) {
        if (st->cur_queue) dtc_stream_switch(be, 0, 1);
        cudaStreamSynchronize(st->q.stream);
        if (st->alt.stream) cudaStreamSynchronize(st->alt.stream);
        if (st->pf_stream) cudaStreamSynchronize(st->pf_stream);
        int n_malloc = 0;
        double t_malloc = 0;
        if (st->o.trace > 0 && dtc_pool_malloc_stats(st, &n_malloc, &t_malloc))   /* (the op trace: backend_trace.c) */
            fprintf(stderr, "ditrun: cuda trace   cudaMalloc: %d calls, %.2f ms\n", n_malloc, t_malloc * 1e3);
        dtc_gemm_cache_free(st);
        dtc_cudnn_destroy(st);
        dtc_fp8_cache_free(st);
        dtc_queue_release(st, &st->q);
        dtc_queue_release(st, &st->alt);
        dtc_scratch_release(st, &st->s_attn);
        dtc_scratch_release(st, &st->s_conv);
        dtc_scratch_release(st, &st->s_misc);
        dtc_scratch_release(st, &st->s_vt);
        dtc_scratch_release(st, &st->s_mask);
        dtc_scratch_release(st, &st->pf_stage);
        for (int i = 0; i < 2; i++) {
            dtc_scratch_release(st, &st->pf[i].buf);
            if (st->pf[i].ready) cudaEventDestroy(st->pf[i].ready);
        }
        if (st->pf_pos) cudaEventDestroy(st->pf_pos);
        if (st->pf_last) cudaEventDestroy(st->pf_last);
        if (st->pf_stream) cudaStreamDestroy(st->pf_stream);
        dtc_pinned_release(&st->pin_up);
        dtc_pinned_release(&st->pin_down);
        if (st->ev_switch) cudaEventDestroy(st->ev_switch);
        if (st->lt) cublasLtDestroy(st->lt);
        dtc_pool_destroy(st);
        if (st->q.stream) cudaStreamDestroy(st->q.stream);
        if (st->alt.stream) cudaStreamDestroy(st->alt.stream);
        delete st;
    }
    free(be);
}

extern "C" int dt_backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int dt_backend_cuda_available(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        cudaGetLastError();
        cached = 0;
        return 0;
    }
    int ok = 0;
    for (int d = 0; d < n; d++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess && major >= 8) ok = 1;
    }
    cudaGetLastError();
    cached = ok;
    return ok;
}

extern "C" int dt_backend_cuda_device_info(int device, char *name, size_t name_size, int *cc_major, int *cc_minor) {
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: device %d: %s", device, cudaGetErrorString(e));
        return -1;
    }
    if (name && name_size) snprintf(name, name_size, "%s", prop.name);
    *cc_major = prop.major;
    *cc_minor = prop.minor;
    return 0;
}

#define CREATE_CK(call)                                                                         \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            cudaGetLastError();                                                                 \
            dt_set_error("cuda: %s failed: %s", #call, cudaGetErrorString(e_));                 \
            be_destroy(be);                                                                     \
            return NULL;                                                                        \
        }                                                                                       \
    } while (0)

extern "C" dt_backend *dt_backend_cuda_create(const dt_backend_opts *opts) {
    int n = 0;
    cudaError_t e0 = cudaGetDeviceCount(&n);
    if (e0 != cudaSuccess || n <= 0) {
        cudaGetLastError();
        dt_set_error("cuda: no CUDA GPU available (%s); use --backend cpu",
                     e0 != cudaSuccess ? cudaGetErrorString(e0) : "no devices");
        return NULL;
    }
    dt_backend_opts o;
    if (opts) o = *opts;
    else {
        memset(&o, 0, sizeof o);
        o.rope_fp32 = 1;
    }
    if (o.device < 0 || o.device >= n) {
        dt_set_error("cuda: device %d does not exist (%d device(s) found)", o.device, n);
        return NULL;
    }
    dt_cuda_opts co;
    if (o.cuda) co = *o.cuda;
    else if (dt_cuda_opts_from_env(&co)) return NULL;
    dt_backend *be = (dt_backend *)calloc(1, sizeof(dt_backend));
    if (!be) { dt_set_error("cuda: out of host memory"); return NULL; }
    dtc_state *st = new dtc_state();
    memset(st, 0, sizeof *st);
    st->o = co;
    be->impl = st;
    st->device = o.device;
    st->verbose = o.verbose;
    CREATE_CK(cudaSetDevice(o.device));
    cudaDeviceProp prop;
    CREATE_CK(cudaGetDeviceProperties(&prop, o.device));
    if (prop.major < 8) {
        dt_set_error("cuda: device %d (%s) has compute capability %d.%d; ditrun needs 8.0 or newer", o.device,
                     prop.name, prop.major, prop.minor);
        be_destroy(be);
        return NULL;
    }
    st->sm_count = prop.multiProcessorCount;
    st->cc_major = prop.major;
    st->cc_minor = prop.minor;
    st->hopper = dt_cuda_hopper_paths(prop.major, prop.minor, st->o.kernels);
    st->smem_optin = prop.sharedMemPerBlockOptin;
    dtc_pool_create(st);
    /* the transient prefetch (default) runs on a lowest-priority stream, the queues at the highest; with
     * o.no_prefetch every dequantization runs on its queue */
    int prio_least = 0, prio_greatest = 0;
    CREATE_CK(cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest));
    st->queue_prio = !st->o.no_prefetch ? prio_greatest : prio_least;
    CREATE_CK(cudaStreamCreateWithPriority(&st->q.stream, cudaStreamNonBlocking, st->queue_prio));
    if (!st->o.no_prefetch) {
        CREATE_CK(cudaStreamCreateWithPriority(&st->pf_stream, cudaStreamNonBlocking, prio_least));
        CREATE_CK(cudaEventCreateWithFlags(&st->pf_pos, cudaEventDisableTiming));
        CREATE_CK(cudaEventCreateWithFlags(&st->pf_last, cudaEventDisableTiming));
        for (int i = 0; i < 2; i++) CREATE_CK(cudaEventCreateWithFlags(&st->pf[i].ready, cudaEventDisableTiming));
    }
    {
        cublasStatus_t s = cublasLtCreate(&st->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            dt_set_error("cuda: cublasLtCreate failed: %s", cublasGetStatusString(s));
            be_destroy(be);
            return NULL;
        }
    }
    st->lt_ws_size = (size_t)64 << 20;
    dtc_gemm_tune_init(st, prop.name);
    if (!(st->q.lt_ws = dtc_pool_alloc_fresh(st, st->lt_ws_size))) {   /* (the budget counts it) */
        be_destroy(be);
        return NULL;
    }
    if (o.verbose) {
        fprintf(stderr, "ditrun: cuda: device %d: %s, cc %d.%d, %d SMs, %.1f GiB, kernels %s\n", o.device, prop.name,
                prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
                dt_cuda_kernels_name(st->o.kernels));
        for (int f = 0; f < DT_CUDA_OPS_COUNT; f++)
            fprintf(stderr, "ditrun: cuda:   %-16s %s\n", dt_cuda_ops_name((dt_cuda_ops)f),
                    dt_cuda_path_text((dt_cuda_ops)f, dt_cuda_ops_path((dt_cuda_ops)f, prop.major, prop.minor, st->o.kernels)));
    }

    be->name = "cuda";
    be->act_dtype = DT_BF16;
    be->opts = o;
    be->destroy = be_destroy;
    be->alloc = dtc_mat_alloc;
    be->free = dtc_mat_free;
    be->upload = dtc_upload;
    be->download = dtc_download;
    be->image_rgb8 = dtc_image_rgb8;
    be->sync = dtc_sync;
    be->mem_stats = dtc_mem_stats;
    be->linear_create = dtc_linear_create;
    be->linear_destroy = dtc_linear_destroy;
    be->linear_path = dtc_linear_path;
    be->conv_create = dtc_conv_create;
    be->conv_destroy = dtc_conv_destroy;
    be->linear = dtc_linear;
    be->linear_gated_add = dtc_linear_gated_add;
    be->norm_linear = dtc_norm_linear;
    be->rmsnorm_mod_linears = dtc_rmsnorm_mod_linears;
    be->act_linear_gated = dtc_act_linear_gated;
    if (!st->o.no_prefetch) be->linear_prefetch = dtc_linear_prefetch;
    be->linear_on_host = dtc_linear_on_host;
    be->layernorm_mod = dtc_layernorm_mod;
    be->rmsnorm = dtc_rmsnorm;
    be->rmsnorm_mod = dtc_rmsnorm_mod;
    be->head_norm_rope = dtc_head_norm_rope;
    be->attention = dtc_attention;
    /* fp8 attention is cuDNN's fp8 SDPA, which 9.14 computes intermittently wrong on the H200 and 9.19 right
     * (NOTES.md): on with cuDNN >= 9.19 (o.cudnn_lib picks the library), else off with the reason;
     * o.fp8_attn_unsafe turns it on anyway (measurements). Probing loads cuDNN now instead of at the first
     * attention (every model's forward uses it). */
    {
        const int ver = dtc_cudnn_version(st);
        if (st->o.fp8_attn_unsafe || ver >= 91900) {
            be->attention_fp8 = dtc_attention_fp8;
        } else {
            if (ver)
                snprintf(st->f8a_off, sizeof st->f8a_off, "it runs on cuDNN's fp8 SDPA, and the loaded cuDNN %d.%d is "
                         "one that gave intermittently wrong outputs (9.14 on the H200: about 1 call in 10; 9.19 is "
                         "right; NOTES.md): set DITRUN_CUDNN_LIB to a cuDNN >= 9.19", ver / 10000, ver / 100 % 100);
            else
                snprintf(st->f8a_off, sizeof st->f8a_off, "it runs on cuDNN's fp8 SDPA and cuDNN is not loadable");
            be->attention_fp8_off = st->f8a_off;
        }
    }
    be->act_mul = dtc_act_mul;
    be->gated_add = dtc_gated_add;
    be->mul = dtc_mul;
    be->axpby = dtc_axpby;
    be->flow_step = dtc_flow_step;
    be->copy = dtc_copy;
    be->transpose = dtc_transpose;
    be->abs_diff_sums = dtc_abs_diff_sums;
    be->conv2d = dtc_conv2d;
    be->conv2d_strided = dtc_conv2d_strided;
    be->group_norm = dtc_group_norm;
    be->upsample2x = dtc_upsample2x;
    be->channel_rmsnorm = dtc_channel_rmsnorm;
    be->capture_begin = dtc_capture_begin;
    be->capture_end = dtc_capture_end;
    be->graph_launch = dtc_graph_launch;
    be->graph_destroy = dtc_graph_destroy;
    be->get_ext = dtc_get_ext;
    be->stream_switch = dtc_stream_switch;
    {
        /* Load every kernel of the backend now (lazy module loading would otherwise load each one at its first
         * launch, inside the first forward / encode / decode) and raise their shared-memory limits. */
        double t0 = dt_now();
        if (st->hopper) dtc_preload_kernels(st);
        st->t_preload = dt_now() - t0;
        if (o.verbose) fprintf(stderr, "ditrun: cuda: kernels preloaded in %.1f ms\n", st->t_preload * 1e3);
    }
    if (o.qpath == DT_QPATH_MIXED && !dtc_qgemm_eligible(st, 128, 64, 4, 64))
        fprintf(stderr, "ditrun: cuda: --qpath mixed needs an sm_90 GPU with TMA and --kernels auto (this one is "
                        "compute %d.%d, kernels %s): quantized Linears take the auto path\n", st->cc_major, st->cc_minor,
                dt_cuda_kernels_name(st->o.kernels));
    be->opts.cuda = &st->o;
    if (st->o.trace > 0) {   /* every op through the trace wrapper; the pool prints slow cudaMallocs */
        st->trace_malloc_ms = st->o.trace_ms > 0 ? st->o.trace_ms : 1e-9;
        be = dt_backend_trace(be, st->o.trace, st->o.trace_ms);
    }
    return be;
}

extern "C" dt_cuda_opts *dt_backend_cuda_opts(dt_backend *be) {
    if (!be || !be->name || strcmp(be->name, "cuda")) return nullptr;
    return &dtc(be)->o;
}
