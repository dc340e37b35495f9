/* cuda_cudnn.cu — attention through cuDNN's fused flash attention (SDPA forward, inference: no stats).
 *
 * cuDNN is loaded at run time (dlopen "libcudnn.so.9", or the path in the options' cudnn_lib), never linked, so
 * builds and machines without it keep working: the path then reports "unavailable" and dtc_attention uses our
 * own kernels. The operation graph is the one cudnn-frontend's composite SDPA node lowers into for cuDNN 9:
 *   S = Q·Kᵀ (matmul, fp32) → S·scale (pointwise, scale passed by value) [→ S + key_bias] [→ causal select]
 *   → softmax as max / sub / exp / sum / div (plus log(sum)+max into a virtual stats tensor)
 *   → P (virtual, bf16) → O = P·V (matmul).
 * Every intermediate is virtual, so cuDNN's fused engine never materialises S. Finalized execution plans and
 * their workspace sizes are cached per shape / stride / mask key (a key that failed is cached too); device
 * pointers go into a variant pack built per call. While a CUDA graph is being captured only cached plans run
 * (building a plan may allocate or compile), otherwise the caller falls back to our kernel.
 *
 * Options (backend_cuda.h): attn = DT_CUDA_ATTN_CUDNN forces this path (fatal if cuDNN cannot be loaded; a graph
 * cuDNN rejects still falls back, with one warning), OWN / MMA our kernels; cudnn_lib loads another
 * libcudnn.so.9 (its engine libraries must be findable); cudnn_debug prints the loading, each plan (engine,
 * workspace) and each rejection. */
#include <dlfcn.h>
#include <math.h>
#include <string.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "cuda_common.cuh"

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define DTC_HAVE_CUDNN_H 1
#endif
#endif

#ifndef DTC_HAVE_CUDNN_H
/* ------------------------------------------------------------------ toolkit without cuDNN headers */
int dtc_cudnn_attention(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, float scale,
                        const float *kbias, int causal, dt_cuda_attn pick) {
    (void)st; (void)o; (void)q; (void)k; (void)v; (void)hq; (void)hkv; (void)scale; (void)kbias; (void)causal;
    DTC_REQUIRE(pick != DT_CUDA_ATTN_CUDNN, "attention through cuDNN was asked for: this build has no cuDNN headers");
    return 1;
}
void dtc_cudnn_destroy(dtc_state *st) { (void)st; }
int dtc_cudnn_version(dtc_state *st) { (void)st; return 0; }
int dtc_cudnn_attention_fp8(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd,
                            float scale, const char **why) {
    (void)st; (void)o; (void)q; (void)k; (void)v; (void)hq; (void)hkv; (void)hd; (void)scale;
    *why = "this build has no cuDNN headers";
    return 1;
}
#else

/* ------------------------------------------------------------------ the library, loaded once per process */
static struct {
    std::once_flag once;
    void *dl;
    size_t version;  /* cudnnGetVersion(), 0 = not loaded */
    char why[768];   /* why not (room for a library path of 512 bytes) */
    decltype(&cudnnGetVersion) GetVersion;
    decltype(&cudnnCreate) Create;
    decltype(&cudnnDestroy) Destroy;
    decltype(&cudnnSetStream) SetStream;
    decltype(&cudnnGetErrorString) GetErrorString;
    decltype(&cudnnGetLastErrorString) GetLastErrorString;  /* optional */
    decltype(&cudnnBackendCreateDescriptor) CreateDesc;
    decltype(&cudnnBackendDestroyDescriptor) DestroyDesc;
    decltype(&cudnnBackendSetAttribute) SetAttr;
    decltype(&cudnnBackendGetAttribute) GetAttr;
    decltype(&cudnnBackendFinalize) Finalize;
    decltype(&cudnnBackendExecute) Execute;
} g_dnn;

/* Diagnostics of the cuDNN path: verbose level (-v), or always once a backend of the process was created with
 * the cudnn_debug option. */
static int g_dnn_debug;
#define DNN_LOG(...)                                                                  \
    do {                                                                              \
        if (g_dnn_debug) { fprintf(stderr, "ditrun: cudnn: " __VA_ARGS__); fputc('\n', stderr); } \
        else dt_log(2, "cudnn: " __VA_ARGS__);                                        \
    } while (0)

/* lib: the library to try first ("" or NULL: the system's libcudnn.so.9, which is also the fallback). */
static void dnn_load(const char *lib) {
    const char *tried = lib && *lib ? lib : "libcudnn.so.9";
    g_dnn.dl = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
    if (!g_dnn.dl && lib && *lib) {
        tried = "libcudnn.so.9";
        g_dnn.dl = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
    }
    if (!g_dnn.dl) {
        const char *e = dlerror();
        snprintf(g_dnn.why, sizeof g_dnn.why, "dlopen %s: %s", tried, e ? e : "failed");
        DNN_LOG("unavailable (%s)", g_dnn.why);
        return;
    }
    int ok = 1;
#define DNN_SYM(field, name)                                                            \
    do {                                                                                \
        *(void **)&g_dnn.field = dlsym(g_dnn.dl, name);                                 \
        if (!g_dnn.field && ok) {                                                       \
            snprintf(g_dnn.why, sizeof g_dnn.why, "%s lacks %s", tried, name);          \
            ok = 0;                                                                     \
        }                                                                               \
    } while (0)
    DNN_SYM(GetVersion, "cudnnGetVersion");
    DNN_SYM(Create, "cudnnCreate");
    DNN_SYM(Destroy, "cudnnDestroy");
    DNN_SYM(SetStream, "cudnnSetStream");
    DNN_SYM(GetErrorString, "cudnnGetErrorString");
    DNN_SYM(CreateDesc, "cudnnBackendCreateDescriptor");
    DNN_SYM(DestroyDesc, "cudnnBackendDestroyDescriptor");
    DNN_SYM(SetAttr, "cudnnBackendSetAttribute");
    DNN_SYM(GetAttr, "cudnnBackendGetAttribute");
    DNN_SYM(Finalize, "cudnnBackendFinalize");
    DNN_SYM(Execute, "cudnnBackendExecute");
#undef DNN_SYM
    *(void **)&g_dnn.GetLastErrorString = dlsym(g_dnn.dl, "cudnnGetLastErrorString");
    if (ok && g_dnn.GetVersion() < 90000) {
        snprintf(g_dnn.why, sizeof g_dnn.why, "%s is version %zu; need 9.x", tried, g_dnn.GetVersion());
        ok = 0;
    }
    if (!ok) {
        DNN_LOG("unavailable (%s)", g_dnn.why);
        dlclose(g_dnn.dl);
        g_dnn.dl = nullptr;
        return;
    }
    g_dnn.version = g_dnn.GetVersion();
    DNN_LOG("loaded %s, version %zu", tried, g_dnn.version);
}

/* ------------------------------------------------------------------ per-backend state */
struct dnn_plan {
    /* key */
    int64_t Lq, Lk, ldq, ldk, ldv, ldo, hd;
    int hq, hkv, bias, causal;
    int fp8;     /* 1: e4m3 Q/K/V/P with per-tensor scales (the fp8 graph below) */
    int otype;   /* O: 0 bf16, 1 f16, 2 e4m3 (scaled by 448/amax(v)) */
    /* value */
    cudnnBackendDescriptor_t plan;  /* nullptr: this key failed to build (not retried) */
    int64_t ws;
    std::vector<cudnnBackendDescriptor_t> *keep;  /* the graph's descriptors, alive as long as the plan */
};

struct dtc_cudnn {
    cudnnHandle_t h;
    cudaStream_t bound;   /* the stream the handle is set to (follows the backend's current queue) */
    dtc_scratch ws[2];    /* workspace per queue (stream_switch) */
    dtc_scratch f8[2];    /* fp8 attention per queue: codes of q, k, v, the f16/e4m3 output (if used), the scalars */
    int f8_otype;         /* fp8 attention's output type: -1 not yet known, 0 bf16, 1 f16, 2 e4m3 (the first that
                           * cuDNN accepts; Hopper builds only e4m3) */
    int init_failed;
    std::vector<dnn_plan> plans;
    long long calls;
    int warned;
};

static const char *dnn_err(cudnnStatus_t s) { return g_dnn.GetErrorString ? g_dnn.GetErrorString(s) : "?"; }

/* The backend's cuDNN handle, created at the first use (bound to the backend's stream); nullptr if unavailable. */
static dtc_cudnn *dnn_get(dtc_state *st) {
    if (st->o.cudnn_debug) g_dnn_debug = 1;
    std::call_once(g_dnn.once, [st] { dnn_load(st->o.cudnn_lib); });
    if (!g_dnn.version) return nullptr;
    if (!st->cudnn) {
        st->cudnn = new dtc_cudnn();
        memset(st->cudnn->ws, 0, sizeof st->cudnn->ws);
        memset(st->cudnn->f8, 0, sizeof st->cudnn->f8);
        st->cudnn->f8_otype = -1;
        st->cudnn->h = nullptr;
        st->cudnn->bound = st->q.stream;
        st->cudnn->init_failed = 0;
        st->cudnn->calls = 0;
        st->cudnn->warned = 0;
        cudnnStatus_t s = g_dnn.Create(&st->cudnn->h);
        if (s == CUDNN_STATUS_SUCCESS) s = g_dnn.SetStream(st->cudnn->h, st->q.stream);
        if (s != CUDNN_STATUS_SUCCESS) {
            DNN_LOG("cudnnCreate/cudnnSetStream failed: %s", dnn_err(s));
            st->cudnn->init_failed = 1;
        }
    }
    return st->cudnn->init_failed ? nullptr : st->cudnn;
}

int dtc_cudnn_version(dtc_state *st) { return dnn_get(st) ? (int)g_dnn.version : 0; }

void dtc_cudnn_destroy(dtc_state *st) {
    dtc_cudnn *c = st->cudnn;
    if (!c) return;
    for (auto &p : c->plans) {
        if (p.plan) g_dnn.DestroyDesc(p.plan);
        if (p.keep) {
            for (auto d : *p.keep) g_dnn.DestroyDesc(d);
            delete p.keep;
        }
    }
    if (c->h) g_dnn.Destroy(c->h);
    for (dtc_scratch *w : {&c->ws[0], &c->ws[1], &c->f8[0], &c->f8[1]}) {
        for (int i = 0; i < w->nretired; i++) dtc_pool_free(st, w->retired[i]);
        free(w->retired);
        if (w->ptr) dtc_pool_free(st, w->ptr);
    }
    delete c;
    st->cudnn = nullptr;
}

/* ------------------------------------------------------------------ graph building */
/* Collects every descriptor it creates (destroyed together); the first failing call sticks in err/what. */
struct dnn_graph {
    std::vector<cudnnBackendDescriptor_t> all;
    cudnnStatus_t err = CUDNN_STATUS_SUCCESS;
    char what[160] = "";
};

static cudnnBackendDescriptor_t g_new(dnn_graph &g, cudnnBackendDescriptorType_t t, const char *what) {
    if (g.err != CUDNN_STATUS_SUCCESS) return nullptr;
    cudnnBackendDescriptor_t d = nullptr;
    cudnnStatus_t s = g_dnn.CreateDesc(t, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        g.err = s;
        snprintf(g.what, sizeof g.what, "create %s", what);
        return nullptr;
    }
    g.all.push_back(d);
    return d;
}
static void g_set(dnn_graph &g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                  int64_t n, const void *v, const char *what) {
    if (g.err != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t s = g_dnn.SetAttr(d, a, t, n, v);
    if (s != CUDNN_STATUS_SUCCESS) {
        g.err = s;
        snprintf(g.what, sizeof g.what, "set attribute %d of %s", (int)a, what);
    }
}
static void g_fin(dnn_graph &g, cudnnBackendDescriptor_t d, const char *what) {
    if (g.err != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t s = g_dnn.Finalize(d);
    if (s != CUDNN_STATUS_SUCCESS) {
        g.err = s;
        snprintf(g.what, sizeof g.what, "finalize %s", what);
    }
}
static void g_free(dnn_graph &g) {
    for (auto d : g.all)
        if (d) g_dnn.DestroyDesc(d);
    g.all.clear();
}

/* A 4-d tensor. dims/strides in elements; virtual tensors live only inside the fused kernel; by-value tensors
 * are host scalars passed through the variant pack. */
static cudnnBackendDescriptor_t g_tensor(dnn_graph &g, int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                         const int64_t *strides, bool is_virtual, bool by_value, const char *what) {
    cudnnBackendDescriptor_t t = g_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    int64_t align = 16;
    g_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, what);
    g_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, what);
    g_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, what);
    g_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    g_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    if (is_virtual) g_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    if (by_value) g_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    g_fin(g, t, what);
    return t;
}
/* A virtual tensor shaped like another (dims, packed strides given). */
static cudnnBackendDescriptor_t g_virt(dnn_graph &g, int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                       const int64_t *strides, const char *what) {
    return g_tensor(g, uid, dt, dims, strides, true, false, what);
}

static cudnnBackendDescriptor_t g_matmul(dnn_graph &g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                         cudnnBackendDescriptor_t c, const char *what) {
    cudnnBackendDescriptor_t m = g_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    g_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct, what);
    g_fin(g, m, what);
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, what);
    g_fin(g, op, what);
    return op;
}

/* y = mode(x [, b] [, t]); axis >= 0 for GEN_INDEX. prec: the math precision (FLOAT, or BOOLEAN for compares). */
static cudnnBackendDescriptor_t g_pw(dnn_graph &g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                     cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                                     cudnnBackendDescriptor_t y, int64_t axis, const char *what) {
    cudnnBackendDescriptor_t p = g_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    g_set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    g_set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    if (axis >= 0) g_set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    g_fin(g, p, what);
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    if (b) g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
    if (t) g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    g_fin(g, op, what);
    return op;
}

static cudnnBackendDescriptor_t g_reduce(dnn_graph &g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                         cudnnBackendDescriptor_t y, const char *what) {
    cudnnBackendDescriptor_t r = g_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    g_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
    g_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct, what);
    g_fin(g, r, what);
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, what);
    g_fin(g, op, what);
    return op;
}

/* " fp8->e4m3" etc. for an fp8 key, "" for bf16 (logs). */
static const char *plan_tag(const dnn_plan *p) {
    if (!p->fp8) return "";
    return p->otype == 2 ? " fp8->e4m3" : p->otype ? " fp8->f16" : " fp8->bf16";
}

/* Tensor unique ids: the real ones go into the variant pack. fp8: the descales of Q, K, V and P, the scales of P
 * and O (device scalars) and the two amax outputs cuDNN's fp8 pattern produces. */
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_SCALE, UID_BIAS, UID_NEGINF, UID_DQ, UID_DK, UID_DV, UID_DS, UID_SS, UID_SO,
       UID_AMAX_S, UID_AMAX_O };

/* Builds and finalizes the execution plan for key p (p->plan / p->ws set on success). with_stats: also compute
 * log(sum) + max into a virtual tensor, as cudnn-frontend's composite softmax does for inference.
 * fp8 (the lowering of cudnn-frontend's fp8 SDPA): S = (Q8·K8ᵀ)·scale·descale_q·descale_k, softmax, amax_s =
 * max|P|, P8 = P·scale_s (e4m3), O = (P8·V8)·descale_s·descale_v·scale_o, amax_o = max|O before scale_o|. */
static int dnn_build(dtc_cudnn *c, dnn_plan *p, int with_stats) {
    dnn_graph g;
    const int64_t D = p->hd, hq = p->hq, hkv = p->hkv, Lq = p->Lq, Lk = p->Lk;
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT, F8 = CUDNN_DATA_FP8_E4M3;
    const cudnnDataType_t IO = p->fp8 ? F8 : BF, OT = p->otype == 2 ? F8 : p->otype ? CUDNN_DATA_HALF : BF;
    /* Q [1, hq, Lq, D]: column view of a row-major [Lq, ldq] buffer, head h at column h*D (D = 128 for bf16) */
    int64_t qd[4] = {1, hq, Lq, D}, qs[4] = {Lq * p->ldq, D, p->ldq, 1};
    /* Kᵀ [1, hkv, D, Lk]: K [Lk, ldk] read transposed (frontend maps K to Kᵀ by swapping dims/strides) */
    int64_t kd[4] = {1, hkv, D, Lk}, ks[4] = {Lk * p->ldk, D, 1, p->ldk};
    /* V [1, hkv, Lk, D] */
    int64_t vd[4] = {1, hkv, Lk, D}, vs[4] = {Lk * p->ldv, D, p->ldv, 1};
    /* O [1, hq, Lq, D] */
    int64_t od[4] = {1, hq, Lq, D}, os[4] = {Lq * p->ldo, D, p->ldo, 1};
    /* S and P [1, hq, Lq, Lk] (virtual), row statistics [1, hq, Lq, 1] (virtual) */
    int64_t sd[4] = {1, hq, Lq, Lk}, ss[4] = {hq * Lq * Lk, Lq * Lk, Lk, 1};
    int64_t rd[4] = {1, hq, Lq, 1}, rs[4] = {hq * Lq, Lq, 1, 1};
    int64_t one[4] = {1, 1, 1, 1};
    /* key bias [1, 1, 1, Lk] F32, broadcast over heads and query rows */
    int64_t bd[4] = {1, 1, 1, Lk}, bs[4] = {Lk, Lk, Lk, 1};

    cudnnBackendDescriptor_t tQ = g_tensor(g, UID_Q, IO, qd, qs, false, false, "Q");
    cudnnBackendDescriptor_t tK = g_tensor(g, UID_K, IO, kd, ks, false, false, "K");
    cudnnBackendDescriptor_t tV = g_tensor(g, UID_V, IO, vd, vs, false, false, "V");
    cudnnBackendDescriptor_t tO = g_tensor(g, UID_O, OT, od, os, false, false, "O");
    cudnnBackendDescriptor_t tScale = g_tensor(g, UID_SCALE, F, one, one, false, true, "scale");
    int64_t vu = 100;
    std::vector<cudnnBackendDescriptor_t> ops;
    cudnnBackendDescriptor_t tS = g_virt(g, vu++, F, sd, ss, "S");
    ops.push_back(g_matmul(g, tQ, tK, tS, "bmm1"));
    cudnnBackendDescriptor_t tSs = g_virt(g, vu++, F, sd, ss, "S*scale");
    ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, tS, tScale, nullptr, tSs, -1, "attn_scale"));
    cudnnBackendDescriptor_t last = tSs;
    /* fp8: device scalars [1, 1, 1, 1] */
    cudnnBackendDescriptor_t tDq = nullptr, tDk = nullptr, tDv = nullptr, tDs = nullptr, tSsc = nullptr,
                             tSo = nullptr, tAs = nullptr, tAo = nullptr;
    if (p->fp8) {
        tDq = g_tensor(g, UID_DQ, F, one, one, false, false, "descale_q");
        tDk = g_tensor(g, UID_DK, F, one, one, false, false, "descale_k");
        tDv = g_tensor(g, UID_DV, F, one, one, false, false, "descale_v");
        tDs = g_tensor(g, UID_DS, F, one, one, false, false, "descale_s");
        tSsc = g_tensor(g, UID_SS, F, one, one, false, false, "scale_s");
        tSo = g_tensor(g, UID_SO, F, one, one, false, false, "scale_o");
        tAs = g_tensor(g, UID_AMAX_S, F, one, one, false, false, "amax_s");
        tAo = g_tensor(g, UID_AMAX_O, F, one, one, false, false, "amax_o");
        cudnnBackendDescriptor_t t1 = g_virt(g, vu++, F, sd, ss, "S*descale_q");
        cudnnBackendDescriptor_t t2 = g_virt(g, vu++, F, sd, ss, "S*descale_k");
        ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, last, tDq, nullptr, t1, -1, "descale_q"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, t1, tDk, nullptr, t2, -1, "descale_k"));
        last = t2;
    }
    if (p->bias) {
        cudnnBackendDescriptor_t tB = g_tensor(g, UID_BIAS, F, bd, bs, false, false, "key_bias");
        cudnnBackendDescriptor_t tSb = g_virt(g, vu++, F, sd, ss, "S+bias");
        ops.push_back(g_pw(g, CUDNN_POINTWISE_ADD, F, last, tB, nullptr, tSb, -1, "bias_add"));
        last = tSb;
    }
    if (p->causal) {  /* top-left aligned: keep key j <= query i (row >= col), else -inf */
        cudnnBackendDescriptor_t tRow = g_virt(g, vu++, CUDNN_DATA_INT32, sd, ss, "row index");
        cudnnBackendDescriptor_t tCol = g_virt(g, vu++, CUDNN_DATA_INT32, sd, ss, "col index");
        cudnnBackendDescriptor_t tM = g_virt(g, vu++, CUDNN_DATA_BOOLEAN, sd, ss, "causal mask");
        cudnnBackendDescriptor_t tNi = g_tensor(g, UID_NEGINF, F, one, one, false, true, "-inf");
        cudnnBackendDescriptor_t tSc = g_virt(g, vu++, F, sd, ss, "S masked");
        ops.push_back(g_pw(g, CUDNN_POINTWISE_GEN_INDEX, F, last, nullptr, nullptr, tRow, 2, "gen_row_index"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_GEN_INDEX, F, last, nullptr, nullptr, tCol, 3, "gen_col_index"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, tRow, tCol, nullptr, tM, -1, "row>=col"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_BINARY_SELECT, F, last, tNi, tM, tSc, -1, "causal select"));
        last = tSc;
    }
    /* softmax */
    cudnnBackendDescriptor_t tMax = g_virt(g, vu++, F, rd, rs, "row max");
    cudnnBackendDescriptor_t tSub = g_virt(g, vu++, F, sd, ss, "S-max");
    cudnnBackendDescriptor_t tExp = g_virt(g, vu++, F, sd, ss, "exp");
    cudnnBackendDescriptor_t tSum = g_virt(g, vu++, F, rd, rs, "row sum");
    cudnnBackendDescriptor_t tP = g_virt(g, vu++, p->fp8 ? F : BF, sd, ss, "P");
    ops.push_back(g_reduce(g, CUDNN_REDUCE_TENSOR_MAX, last, tMax, "max"));
    ops.push_back(g_pw(g, CUDNN_POINTWISE_SUB, F, last, tMax, nullptr, tSub, -1, "sub"));
    ops.push_back(g_pw(g, CUDNN_POINTWISE_EXP, F, tSub, nullptr, nullptr, tExp, -1, "exp"));
    ops.push_back(g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, tExp, tSum, "sum"));
    if (with_stats) {
        cudnnBackendDescriptor_t tLog = g_virt(g, vu++, F, rd, rs, "log sum");
        cudnnBackendDescriptor_t tSt = g_virt(g, vu++, F, rd, rs, "stats");
        ops.push_back(g_pw(g, CUDNN_POINTWISE_LOG, F, tSum, nullptr, nullptr, tLog, -1, "log"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_ADD, F, tMax, tLog, nullptr, tSt, -1, "stats"));
    }
    ops.push_back(g_pw(g, CUDNN_POINTWISE_DIV, F, tExp, tSum, nullptr, tP, -1, "div"));
    if (!p->fp8) {
        ops.push_back(g_matmul(g, tP, tV, tO, "bmm2"));
    } else {
        cudnnBackendDescriptor_t tP8 = g_virt(g, vu++, F8, sd, ss, "P8");
        cudnnBackendDescriptor_t tO0 = g_virt(g, vu++, F, od, os, "P8·V8");
        cudnnBackendDescriptor_t tO1 = g_virt(g, vu++, F, od, os, "O*descale_s");
        cudnnBackendDescriptor_t tO2 = g_virt(g, vu++, F, od, os, "O*descale_v");
        ops.push_back(g_reduce(g, CUDNN_REDUCE_TENSOR_AMAX, tP, tAs, "amax_s"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, tP, tSsc, nullptr, tP8, -1, "scale_s"));
        ops.push_back(g_matmul(g, tP8, tV, tO0, "bmm2"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, tO0, tDs, nullptr, tO1, -1, "descale_s"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, tO1, tDv, nullptr, tO2, -1, "descale_v"));
        ops.push_back(g_pw(g, CUDNN_POINTWISE_MUL, F, tO2, tSo, nullptr, tO, -1, "scale_o"));
        ops.push_back(g_reduce(g, CUDNN_REDUCE_TENSOR_AMAX, tO2, tAo, "amax_o"));
    }

    cudnnBackendDescriptor_t og = g_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->h, "operation graph");
    g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data(),
          "operation graph");
    g_fin(g, og, "operation graph");

    /* engine configs from the heuristics (mode A, then the fallback list); the first that finalizes wins */
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t ws = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !plan && g.err == CUDNN_STATUS_SUCCESS; mi++) {
        dnn_graph h;  /* its own list: configs are destroyed after the plan is made */
        cudnnBackendDescriptor_t heur = g_new(h, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
        g_set(h, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "heuristics");
        g_set(h, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi], "heuristics");
        g_fin(h, heur, "heuristics");
        int64_t n = 0;
        if (h.err == CUDNN_STATUS_SUCCESS) {
            cudnnStatus_t s = g_dnn.GetAttr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr);
            if (s != CUDNN_STATUS_SUCCESS) { h.err = s; snprintf(h.what, sizeof h.what, "heuristics result count"); }
        }
        if (n > 16) n = 16;
        std::vector<cudnnBackendDescriptor_t> cfg;
        for (int64_t i = 0; i < n && h.err == CUDNN_STATUS_SUCCESS; i++)
            cfg.push_back(g_new(h, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
        int64_t got = 0;
        if (n > 0 && h.err == CUDNN_STATUS_SUCCESS) {
            cudnnStatus_t s = g_dnn.GetAttr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                            cfg.data());
            if (s != CUDNN_STATUS_SUCCESS) { h.err = s; snprintf(h.what, sizeof h.what, "heuristics results"); got = 0; }
        }
        if (h.err != CUDNN_STATUS_SUCCESS)
            DNN_LOG("heuristics mode %d: %s failed: %s", (int)modes[mi], h.what, dnn_err(h.err));
        else if (got == 0)
            DNN_LOG("heuristics mode %d: no engine for this graph", (int)modes[mi]);
        for (int64_t i = 0; i < got && !plan; i++) {
            cudnnBackendDescriptor_t cfg_i = cfg[i];
            cudnnBackendDescriptor_t pl = nullptr;
            cudnnStatus_t s = g_dnn.CreateDesc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &pl);
            if (s == CUDNN_STATUS_SUCCESS)
                s = g_dnn.SetAttr(pl, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->h);
            if (s == CUDNN_STATUS_SUCCESS)
                s = g_dnn.SetAttr(pl, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
            if (s == CUDNN_STATUS_SUCCESS) s = g_dnn.Finalize(pl);
            int64_t w = 0, cnt = 0;
            if (s == CUDNN_STATUS_SUCCESS)
                s = g_dnn.GetAttr(pl, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &w);
            if (s == CUDNN_STATUS_SUCCESS) {
                plan = pl;
                ws = w;
                /* keep the chosen config (the plan refers to it) past g_free(h) */
                for (auto &d : h.all)
                    if (d == cfg_i) { d = nullptr; g.all.push_back(cfg_i); }
                int64_t eidx = -1;
                cudnnBackendDescriptor_t eng = nullptr;
                if (g_dnn.CreateDesc(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
                    if (g_dnn.GetAttr(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
                        CUDNN_STATUS_SUCCESS)
                        g_dnn.GetAttr(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &eidx);
                    g_dnn.DestroyDesc(eng);
                }
                DNN_LOG("plan for Lq=%lld Lk=%lld %d/%d heads%s%s%s%s: engine %lld (heuristics mode %d, config %lld of "
                        "%lld), workspace %lld bytes",
                        (long long)Lq, (long long)Lk, p->hq, p->hkv, plan_tag(p), p->bias ? " bias" : "",
                        p->causal ? " causal" : "",
                        with_stats ? "" : " (no stats)", (long long)eidx, (int)modes[mi], (long long)i, (long long)got,
                        (long long)w);
            } else {
                char le[256] = "";
                if (g_dnn.GetLastErrorString) g_dnn.GetLastErrorString(le, sizeof le);
                DNN_LOG("engine config %lld (mode %d) rejected: %s %s", (long long)i, (int)modes[mi], dnn_err(s), le);
                if (pl) g_dnn.DestroyDesc(pl);
            }
        }
        g_free(h);
    }
    if (g.err != CUDNN_STATUS_SUCCESS) {
        char le[256] = "";
        if (g_dnn.GetLastErrorString) g_dnn.GetLastErrorString(le, sizeof le);
        DNN_LOG("graph for Lq=%lld Lk=%lld %d/%d heads%s%s%s: %s failed: %s %s", (long long)Lq, (long long)Lk, p->hq,
                p->hkv, plan_tag(p), p->bias ? " bias" : "", p->causal ? " causal" : "", g.what, dnn_err(g.err), le);
    }
    if (plan) {  /* cudnn-frontend keeps the graph alive with its plan: so do we */
        p->keep = new std::vector<cudnnBackendDescriptor_t>(g.all);
        g.all.clear();
    }
    g_free(g);
    p->plan = plan;
    p->ws = ws;
    return plan ? 0 : -1;
}

/* ------------------------------------------------------------------ dispatch */
/* The plan for key, built at its first use; nullptr when cuDNN rejects the key (cached as rejected, not retried)
 * or while a CUDA graph is being captured and the key is new (building may allocate or compile). */
static dnn_plan *dnn_plan_for(dtc_state *st, dtc_cudnn *c, const dnn_plan &key) {
    for (auto &e : c->plans)
        if (!memcmp(&e, &key, offsetof(dnn_plan, plan))) return e.plan ? &e : nullptr;
    if (st->capturing) return nullptr;
    c->plans.push_back(key);
    dnn_plan *p = &c->plans.back();
    if (dnn_build(c, p, 1) != 0) dnn_build(c, p, 0);
    return p->plan ? p : nullptr;
}

/* Runs plan p on the current queue with the variant pack (uids[n] -> ptrs[n]) and its workspace. Returns 1
 * (nothing queued) when the workspace would have to grow while a graph is being captured; fatal on errors. */
static int dnn_run(dtc_state *st, dtc_cudnn *c, dnn_plan *p, const int64_t *uids, void **ptrs, int n) {
    void *ws = nullptr;
    if (p->ws > 0) {
        dtc_scratch *w = &c->ws[st->cur_queue ? 1 : 0];
        if (st->capturing && (size_t)p->ws > w->size) return 1;  /* no allocation while capturing */
        ws = dtc_scratch_get(st, w, (size_t)p->ws);
        /* fp8, test option cudnn_ws_poison: the workspace filled with 0xff first (the result must not change) */
        if (p->fp8 && st->o.cudnn_ws_poison) CK(cudaMemsetAsync(ws, 0xff, (size_t)p->ws, st->q.stream));
    }
    if (c->bound != st->q.stream) {  /* the backend switched queues since the last call */
        cudnnStatus_t s = g_dnn.SetStream(c->h, st->q.stream);
        if (s != CUDNN_STATUS_SUCCESS) dtc_fatal("cudnnSetStream", __FILE__, __LINE__, dnn_err(s));
        c->bound = st->q.stream;
    }
    cudnnBackendDescriptor_t vp = nullptr;
    cudnnStatus_t s = g_dnn.CreateDesc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s == CUDNN_STATUS_SUCCESS) s = g_dnn.SetAttr(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (s == CUDNN_STATUS_SUCCESS) s = g_dnn.SetAttr(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (s == CUDNN_STATUS_SUCCESS) s = g_dnn.SetAttr(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (s == CUDNN_STATUS_SUCCESS) s = g_dnn.Finalize(vp);
    if (s != CUDNN_STATUS_SUCCESS) dtc_fatal("cuDNN variant pack", __FILE__, __LINE__, dnn_err(s));
    s = g_dnn.Execute(c->h, p->plan, vp);
    g_dnn.DestroyDesc(vp);
    if (s != CUDNN_STATUS_SUCCESS) {
        char le[256] = "";
        if (g_dnn.GetLastErrorString) g_dnn.GetLastErrorString(le, sizeof le);
        fprintf(stderr, "ditrun: cuda: cudnnBackendExecute failed (attention%s Lq=%lld Lk=%lld %d/%d heads): %s %s\n",
                p->fp8 ? " fp8" : "", (long long)p->Lq, (long long)p->Lk, p->hq, p->hkv, dnn_err(s), le);
        exit(1);
    }
    c->calls++;
    return 0;
}

/* Policy of DT_CUDA_ATTN_AUTO: cuDNN where it measured faster (PERF.md, 2026-11-30, cuDNN 9.14, H200,
 * interleaved): no mask 1.41-1.59x our wgmma kernel at 1536-16896 tokens (24-48 heads, GQA 48/12), causal
 * 1.50x at 4608 and 1.15x at 512 (32/8). With a key bias it only ties (Krea 2's padded GQA: 1.193 vs
 * 1.197 ms) and gives NaN where every key of a row is masked (we give 0): our kernel keeps those. */
int dtc_cudnn_attention(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, float scale,
                        const float *kbias, int causal, dt_cuda_attn pick) {
    const int forced = pick == DT_CUDA_ATTN_CUDNN;
    if (pick != DT_CUDA_ATTN_AUTO && !forced) return 1;     /* one of our kernels was asked for */
    if (!forced && kbias) return 1;
    dtc_cudnn *c = dnn_get(st);
    if (!c) {
        DTC_REQUIRE(!forced, "attention through cuDNN was asked for, but cuDNN is unavailable (%s)",
                    g_dnn.why[0] ? g_dnn.why : "cudnnCreate failed; DITRUN_CUDNN_DEBUG=1 says more");
        return 1;
    }
    /* preconditions beyond dtc_attention's fast path: 16-byte aligned operands (cuDNN's byte alignment) */
    if (q.dtype != DT_BF16 || o.dtype != DT_BF16 || o.ld % 8 || !dtc_aligned16(o.data) || k.rows <= 0) return 1;
    dnn_plan key;
    memset(&key, 0, sizeof key);
    key.Lq = q.rows; key.Lk = k.rows;
    key.ldq = q.ld; key.ldk = k.ld; key.ldv = v.ld; key.ldo = o.ld;
    key.hq = hq; key.hkv = hkv; key.bias = kbias != nullptr; key.causal = causal != 0; key.hd = 128;
    dnn_plan *p = dnn_plan_for(st, c, key);
    if (!p) {
        if (forced && !c->warned && !st->capturing) {
            fprintf(stderr, "ditrun: warning: attention through cuDNN was asked for, but it rejected Lq=%lld Lk=%lld %d/%d heads%s%s; "
                    "using our kernel (DITRUN_CUDNN_DEBUG=1 says why)\n", (long long)key.Lq, (long long)key.Lk, hq, hkv,
                    kbias ? " bias" : "", causal ? " causal" : "");
            c->warned = 1;
        }
        return 1;
    }
    float neg_inf = -INFINITY;
    int64_t uids[7];
    void *ptrs[7];
    int n = 0;
    uids[n] = UID_Q; ptrs[n++] = q.data;
    uids[n] = UID_K; ptrs[n++] = k.data;
    uids[n] = UID_V; ptrs[n++] = v.data;
    uids[n] = UID_O; ptrs[n++] = o.data;
    uids[n] = UID_SCALE; ptrs[n++] = &scale;
    if (kbias) { uids[n] = UID_BIAS; ptrs[n++] = (void *)kbias; }
    if (causal) { uids[n] = UID_NEGINF; ptrs[n++] = &neg_inf; }
    return dnn_run(st, c, p, uids, ptrs, n);
}

int dtc_cudnn_attention_fp8(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd,
                            float scale, const char **why) {
    *why = "";
    dtc_cudnn *c = dnn_get(st);
    if (!c) {
        *why = g_dnn.why[0] ? g_dnn.why : "cudnnCreate failed";
        return 1;
    }
    if (hd % 16 || o.dtype != DT_BF16 || k.rows <= 0) {
        *why = "it needs a head dim that is a multiple of 16, a bf16 output and at least one key";
        return 1;
    }
    const int64_t Lq = q.rows, Lk = k.rows, Dq = (int64_t)hq * hd, Dk = (int64_t)hkv * hd;
    dnn_plan key;
    memset(&key, 0, sizeof key);
    key.Lq = Lq; key.Lk = Lk; key.hd = hd; key.hq = hq; key.hkv = hkv; key.fp8 = 1;
    key.ldq = Dq; key.ldk = Dk; key.ldv = Dk;
    /* O: bf16 straight into o where cuDNN can write it (16-byte aligned rows), else f16 or e4m3 + one conversion */
    dnn_plan *p = nullptr;
    const int direct_ok = o.ld % 8 == 0 && dtc_aligned16(o.data);
    for (int ot = c->f8_otype < 0 ? 0 : c->f8_otype; ot <= 2 && !p; ot++) {
        if (ot == 0 && !direct_ok) continue;
        key.otype = ot;
        key.ldo = ot == 0 ? o.ld : Dq;
        p = dnn_plan_for(st, c, key);
        if (p && c->f8_otype < 0) c->f8_otype = ot;
    }
    if (!p) {
        *why = st->capturing ? "no plan was built for this shape before the CUDA-graph capture"
                             : "cuDNN has no fp8 SDPA engine for this shape (DITRUN_CUDNN_DEBUG=1 says why)";
        return 1;
    }
    /* scratch: codes of q, k, v, then the f16 / e4m3 output (if used), then 11 scalar slots of 16 bytes */
    auto up = [](size_t b) { return (b + 255) & ~(size_t)255; };
    const size_t bq = up((size_t)(Lq * Dq)), bk = up((size_t)(Lk * Dk)),
                 bo = key.otype ? up((size_t)(Lq * Dq) * (key.otype == 1 ? 2 : 1)) : 0;
    const size_t need = bq + 2 * bk + bo + 11 * 16;
    dtc_scratch *f8 = &c->f8[st->cur_queue ? 1 : 0];
    if (st->capturing && need > f8->size) {
        *why = "its scratch would have to grow during a CUDA-graph capture";
        return 1;
    }
    uint8_t *base = (uint8_t *)dtc_scratch_get(st, f8, need);
    uint8_t *q8 = base, *k8 = base + bq, *v8 = base + bq + bk, *o16 = base + bq + 2 * bk;
    float *sc = (float *)(base + bq + 2 * bk + bo);
    dtc_attn_fp8_quant(st, dt_mat_cols(q, 0, Dq), dt_mat_cols(k, 0, Dk), dt_mat_cols(v, 0, Dk), q8, k8, v8, sc,
                       key.otype == 2);
    int64_t uids[13];
    void *ptrs[13];
    int n = 0;
    uids[n] = UID_Q; ptrs[n++] = q8;
    uids[n] = UID_K; ptrs[n++] = k8;
    uids[n] = UID_V; ptrs[n++] = v8;
    uids[n] = UID_O; ptrs[n++] = key.otype ? (void *)o16 : o.data;
    uids[n] = UID_SCALE; ptrs[n++] = &scale;
    uids[n] = UID_DQ; ptrs[n++] = sc + 3 * 4;
    uids[n] = UID_DK; ptrs[n++] = sc + 4 * 4;
    uids[n] = UID_DV; ptrs[n++] = sc + 5 * 4;
    uids[n] = UID_DS; ptrs[n++] = sc + 6 * 4;
    uids[n] = UID_SS; ptrs[n++] = sc + 7 * 4;
    uids[n] = UID_SO; ptrs[n++] = sc + 8 * 4;
    uids[n] = UID_AMAX_S; ptrs[n++] = sc + 9 * 4;
    uids[n] = UID_AMAX_O; ptrs[n++] = sc + 10 * 4;
    if (dnn_run(st, c, p, uids, ptrs, n) != 0) {
        *why = "its workspace would have to grow during a CUDA-graph capture";
        return 1;
    }
    if (key.otype) dtc_attn_fp8_out(st, dt_mat_cols(o, 0, Dq), o16, Dq, key.otype == 2, sc + 5 * 4);
    return 0;
}

long long dtc_cudnn_calls(dtc_state *st) { return st->cudnn ? st->cudnn->calls : 0; }
#endif

#ifndef DTC_HAVE_CUDNN_H
long long dtc_cudnn_calls(dtc_state *st) { (void)st; return 0; }
#endif

/* C entry for tests and the bench: the loaded cuDNN version (0 = not loadable, or not the CUDA backend) and how
 * many attention calls cuDNN has run on this backend. */
extern "C" int dt_backend_cuda_cudnn_info(dt_backend *be, long long *calls) {
    if (calls) *calls = 0;
    if (!be || !be->name || strcmp(be->name, "cuda")) return 0;
    if (calls) *calls = dtc_cudnn_calls(dtc(be));
    return dtc_cudnn_version(dtc(be));
}
