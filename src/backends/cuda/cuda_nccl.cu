/* cuda_nccl.cu — the "nccl" communicator (backends/comm.h) between CUDA backends of one process, one GPU per rank.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2"), never linked: builds and single-GPU runs never need it, and a
 * missing library is an error naming it when a communicator is asked for. One NCCL communicator per rank, made by
 * ncclCommInitAll over the ranks' devices; each rank's thread then uses only its own. An exchange is one group of
 * point-to-point operations (ncclSend / ncclRecv, NCCL >= 2.7) on the rank backend's current queue, so it is
 * asynchronous and ordered with the rank's other ops; messages are moved as bytes. Point-to-point rather than
 * ncclAlltoAll: the blocks differ in size when the tokens or the heads do not divide by the rank count. No
 * collective that could use NVLink SHARP / multicast is called.
 *
 * NCCL failures inside an exchange are fatal (one line naming the call and NCCL's reason, exit 1), as device errors
 * inside ops are: the peers would wait forever on their side of the transfer. */
#include <dlfcn.h>
#include <string.h>

#include <mutex>

#include "backends/comm.h"
#include "cuda_common.cuh"

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
#define DTC_HAVE_NCCL_H 1
#endif
#endif

#ifndef DTC_HAVE_NCCL_H
extern "C" dt_comm *dt_comm_nccl_create(dt_backend *const *ranks, int n) {
    (void)ranks; (void)n;
    dt_set_error("sequence parallelism on CUDA needs NCCL, and this ditrun was built without its header (nccl.h): "
                 "rebuild with a CUDA toolkit or NCCL development files that have it");
    return nullptr;
}
#else

/* ------------------------------------------------------------------ the library, loaded once per process */
static struct {
    std::once_flag once;
    void *dl;
    int version;         /* ncclGetVersion's code, 0 = not loaded */
    char why[768];       /* why not */
    decltype(&ncclGetVersion) GetVersion;
    decltype(&ncclGetErrorString) GetErrorString;
    decltype(&ncclCommInitAll) CommInitAll;
    decltype(&ncclCommDestroy) CommDestroy;
    decltype(&ncclGroupStart) GroupStart;
    decltype(&ncclGroupEnd) GroupEnd;
    decltype(&ncclSend) Send;
    decltype(&ncclRecv) Recv;
    decltype(&ncclGetLastError) GetLastError;   /* optional (NCCL >= 2.13) */
} g_nccl;

static const char *const k_nccl_lib = "libnccl.so.2";
static const char *const k_nccl_hint =
    "install NCCL 2.7 or newer (Debian/Ubuntu: libnccl2 from NVIDIA's repository; pip: nvidia-nccl-cu13, whose "
    "lib/ folder holds it) and put its folder on LD_LIBRARY_PATH";

static void nccl_load(void) {
    g_nccl.dl = dlopen(k_nccl_lib, RTLD_NOW | RTLD_LOCAL);
    if (!g_nccl.dl) {
        const char *e = dlerror();
        snprintf(g_nccl.why, sizeof g_nccl.why, "%s cannot be loaded (%s)", k_nccl_lib, e ? e : "dlopen failed");
        return;
    }
    int ok = 1;
#define NCCL_SYM(field, name)                                                                   \
    do {                                                                                        \
        *(void **)&g_nccl.field = dlsym(g_nccl.dl, name);                                       \
        if (!g_nccl.field && ok) {                                                              \
            snprintf(g_nccl.why, sizeof g_nccl.why, "%s has no %s (too old)", k_nccl_lib, name); \
            ok = 0;                                                                             \
        }                                                                                       \
    } while (0)
    NCCL_SYM(GetVersion, "ncclGetVersion");
    NCCL_SYM(GetErrorString, "ncclGetErrorString");
    NCCL_SYM(CommInitAll, "ncclCommInitAll");
    NCCL_SYM(CommDestroy, "ncclCommDestroy");
    NCCL_SYM(GroupStart, "ncclGroupStart");
    NCCL_SYM(GroupEnd, "ncclGroupEnd");
    NCCL_SYM(Send, "ncclSend");
    NCCL_SYM(Recv, "ncclRecv");
#undef NCCL_SYM
    *(void **)&g_nccl.GetLastError = dlsym(g_nccl.dl, "ncclGetLastError");
    int v = 0;
    if (ok && (g_nccl.GetVersion(&v) != ncclSuccess || v < 2700)) {   /* codes: 2.7.x = 2700+, 2.9 on = 20900+ */
        snprintf(g_nccl.why, sizeof g_nccl.why, "%s is version code %d; need NCCL 2.7 or newer", k_nccl_lib, v);
        ok = 0;
    }
    if (!ok) {
        dlclose(g_nccl.dl);
        g_nccl.dl = nullptr;
        return;
    }
    g_nccl.version = v;
    dt_log(2, "ditrun: nccl: loaded %s, version code %d\n", k_nccl_lib, v);
}

static const char *nccl_reason(ncclResult_t r, ncclComm_t comm) {
    const char *last = g_nccl.GetLastError ? g_nccl.GetLastError(comm) : nullptr;
    return last && *last ? last : g_nccl.GetErrorString(r);
}

/* ------------------------------------------------------------------ the communicator */
struct nccl_comm {
    int n;
    dt_backend *ranks[DT_COMM_MAX_RANKS];
    ncclComm_t comms[DT_COMM_MAX_RANKS];
};

static void nc_enter(dt_comm *c, int rank) { (void)c; (void)rank; }
static void nc_leave(dt_comm *c, int rank) { (void)c; (void)rank; }

#define NCCL_CK(call, comm)                                                                       \
    do {                                                                                          \
        ncclResult_t r_ = (call);                                                                 \
        if (r_ != ncclSuccess) {                                                                  \
            fprintf(stderr, "ditrun: error: nccl: %s failed: %s (%s:%d)\n", #call, nccl_reason(r_, comm), \
                    __FILE__, __LINE__);                                                          \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static int nc_exchange(dt_comm *c, int rank, const dt_comm_msg *send, int ns, const dt_comm_msg *recv, int nr) {
    nccl_comm *k = (nccl_comm *)c->impl;
    DTC_REQUIRE(rank >= 0 && rank < k->n, "nccl exchange: rank %d of %d", rank, k->n);
    dtc_state *st = dtc(k->ranks[rank]);
    ncclComm_t comm = k->comms[rank];
    cudaStream_t s = st->q.stream;
    for (int pass = 0; pass < 2; pass++) {   /* check every message before anything is queued */
        const dt_comm_msg *m = pass ? recv : send;
        for (int i = 0; i < (pass ? nr : ns); i++)
            DTC_REQUIRE(m[i].peer >= 0 && m[i].peer < k->n && (m[i].m.rows <= 0 || dt_comm_msg_contiguous(&m[i].m)),
                        "nccl exchange: rank %d %s message %d (peer %d) is not a contiguous matrix to a rank of %d",
                        rank, pass ? "receive" : "send", i, m[i].peer, k->n);
    }
    NCCL_CK(g_nccl.GroupStart(), comm);
    for (int i = 0; i < ns; i++) {
        const dt_mat *m = &send[i].m;
        if (m->rows <= 0) continue;
        NCCL_CK(g_nccl.Send(m->data, (size_t)dt_comm_msg_elems(m) * dt_dtype_size(m->dtype), ncclUint8, send[i].peer,
                            comm, s), comm);
    }
    for (int i = 0; i < nr; i++) {
        const dt_mat *m = &recv[i].m;
        if (m->rows <= 0) continue;
        NCCL_CK(g_nccl.Recv(m->data, (size_t)dt_comm_msg_elems(m) * dt_dtype_size(m->dtype), ncclUint8, recv[i].peer,
                            comm, s), comm);
    }
    NCCL_CK(g_nccl.GroupEnd(), comm);
    return 0;
}

static void nc_destroy(dt_comm *c) {
    nccl_comm *k = (nccl_comm *)c->impl;
    int cur = 0;
    cudaGetDevice(&cur);
    for (int r = 0; r < k->n; r++)
        if (k->comms[r]) g_nccl.CommDestroy(k->comms[r]);
    cudaSetDevice(cur);
    cudaGetLastError();
    free(k);
    free(c);
}

extern "C" dt_comm *dt_comm_nccl_create(dt_backend *const *ranks, int n) {
    std::call_once(g_nccl.once, nccl_load);
    if (!g_nccl.dl) {
        dt_set_error("sequence parallelism on CUDA needs NCCL: %s; %s", g_nccl.why, k_nccl_hint);
        return nullptr;
    }
    if (n < 1 || n > DT_COMM_MAX_RANKS) {
        dt_set_error("nccl: %d ranks (1 to %d)", n, DT_COMM_MAX_RANKS);
        return nullptr;
    }
    nccl_comm *k = (nccl_comm *)dt_calloc(1, sizeof *k);
    k->n = n;
    int devs[DT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        k->ranks[r] = ranks[r];
        devs[r] = dtc(ranks[r])->device;
    }
    int cur = 0;
    cudaGetDevice(&cur);
    ncclResult_t res = g_nccl.CommInitAll(k->comms, n, devs);
    cudaSetDevice(cur);   /* ncclCommInitAll visits every device: the calling thread keeps its own */
    if (res != ncclSuccess) {
        dt_set_error("nccl: ncclCommInitAll over %d GPUs failed: %s", n, g_nccl.GetErrorString(res));
        free(k);
        return nullptr;
    }
    dt_comm *c = (dt_comm *)dt_calloc(1, sizeof *c);
    c->name = "nccl";
    c->size = n;
    c->impl = k;
    c->enter = nc_enter;
    c->leave = nc_leave;
    c->exchange = nc_exchange;
    c->destroy = nc_destroy;
    dt_log(2, "ditrun: nccl: communicator over %d GPUs (NCCL version code %d)\n", n, g_nccl.version);
    return c;
}
#endif
