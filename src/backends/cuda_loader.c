/* cuda_loader.c — the core side of the CUDA backend plugin (backends/cuda_plugin.h): finds libditrun_cuda.so,
 * dlopen()s it the first time a CUDA backend is asked for, checks its ABI tag and forwards the CUDA entry points
 * (backend, device count, live options, cuDNN facts, the NCCL communicator) to it. In a build without CUDA (no nvcc)
 * the same entry points say so. Nothing here touches the CUDA libraries, so a process that never asks for a CUDA
 * backend never maps them. */
#include "backends/cuda_plugin.h"

#include <stdio.h>
#include <string.h>

#ifdef DT_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

#include "dt_abi.h"

static const dt_cuda_plugin *g_plugin;
static char g_why[1536];        /* why the plugin is not loaded (empty when it is) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Tries one candidate path. Returns 1 when the plugin is loaded, 0 when the file is absent, -1 when it exists
 * but cannot be used (g_why says why; the search stops there: a broken plugin is not silently skipped). */
static int try_load(const char *path, int by_name) {
    if (!by_name && access(path, F_OK) != 0) return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (by_name && e && strstr(e, DT_CUDA_PLUGIN_FILE ": cannot open shared object file")) return 0;
        snprintf(g_why, sizeof g_why, "cannot load the CUDA backend plugin %.500s: %.900s", path,
                 e ? e : "dlopen failed");
        return -1;
    }
    const char *abi = (const char *)dlsym(h, "dt_cuda_plugin_abi");
    const dt_cuda_plugin *p = (const dt_cuda_plugin *)dlsym(h, "dt_cuda_plugin_entry");
    if (!abi || !p) {
        snprintf(g_why, sizeof g_why, "%.600s is not a ditrun CUDA backend plugin (no dt_cuda_plugin_entry)", path);
        dlclose(h);
        return -1;
    }
    if (strcmp(abi, DT_ABI_TAG)) {
        snprintf(g_why, sizeof g_why, "the CUDA backend plugin %.600s was built from other sources than this program "
                 "(ABI %.40s, this program %s): rebuild both (make)", path, abi, DT_ABI_TAG);
        dlclose(h);
        return -1;
    }
    g_plugin = p;   /* never unloaded: the CUDA runtime does not support being unmapped */
    g_why[0] = 0;
    dt_log(2, "ditrun: CUDA backend plugin %s\n", path);
    return 1;
}

static void load_once(void) {
    char exe[PATH_MAX], cand[3][PATH_MAX + 64];
    int ncand = 0;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(cand[ncand++], sizeof cand[0], "%s/" DT_CUDA_PLUGIN_FILE, exe);           /* build/, devpack */
            snprintf(cand[ncand++], sizeof cand[0], "%s/../lib/ditrun/" DT_CUDA_PLUGIN_FILE, exe);  /* installed */
            snprintf(cand[ncand++], sizeof cand[0], "%s/../" DT_CUDA_PLUGIN_FILE, exe);        /* build/tests/ */
        }
    }
    for (int i = 0; i < ncand; i++) {
        int r = try_load(cand[i], 0);
        if (r) return;
    }
    if (try_load(DT_CUDA_PLUGIN_FILE, 1)) return;   /* LD_LIBRARY_PATH, the ld.so cache: programs linking libditrun.a */
    snprintf(g_why, sizeof g_why, "the CUDA backend plugin " DT_CUDA_PLUGIN_FILE " was not found (looked beside %.500s, in "
             "%.500s/../lib/ditrun and on the library path); `make` builds it when nvcc is found; use --backend cpu",
             n > 0 ? exe : "the program", n > 0 ? exe : ".");
}

/* The plugin, or NULL with g_why set. */
static const dt_cuda_plugin *plugin(void) {
    pthread_once(&g_once, load_once);
    return g_plugin;
}

/* 1 when the machine has an NVIDIA driver's device node (Linux: /dev/nvidiactl, /dev/nvidia0; WSL 2: /dev/dxg) or
 * its /proc entry. Without one the CUDA runtime finds no device, so `auto` need not load the plugin and the CUDA
 * libraries (~0.2-0.6 s and 200 MB) to learn that. */
static int nvidia_driver_present(void) {
    static const char *const nodes[] = {"/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/proc/driver/nvidia/version"};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
        if (access(nodes[i], F_OK) == 0) return 1;
    return 0;
}

int dt_backend_cuda_available(void) {
    if (!g_plugin && !nvidia_driver_present()) {
        dt_log(2, "ditrun: no CUDA backend: no NVIDIA driver device on this machine\n");
        return 0;
    }
    const dt_cuda_plugin *p = plugin();
    if (!p) {
        dt_log(2, "ditrun: no CUDA backend: %s\n", g_why);
        return 0;
    }
    return p->available();
}

dt_backend *dt_backend_cuda_create(const dt_backend_opts *opts) {
    const dt_cuda_plugin *p = plugin();
    if (!p) {
        dt_set_error("cuda: %s", g_why);
        return NULL;
    }
    return p->create(opts);
}

int dt_backend_cuda_cudnn_info(dt_backend *be, long long *calls) {
    if (calls) *calls = 0;
    /* a CUDA backend exists only through a loaded plugin; never load it here */
    if (!g_plugin || !be || !be->name || strcmp(be->name, "cuda")) return 0;
    return g_plugin->cudnn_info(be, calls);
}

int dt_backend_cuda_mem_budget(dt_backend *be, int64_t *budget, int64_t *held) {
    if (!g_plugin || !be || !be->name || strcmp(be->name, "cuda")) return -1;
    return g_plugin->mem_budget(be, budget, held);
}

dt_cuda_opts *dt_backend_cuda_opts(dt_backend *be) {
    if (!g_plugin || !be || !be->name || strcmp(be->name, "cuda")) return NULL;
    return g_plugin->opts(be);
}

int dt_backend_cuda_device_count(void) {
    const dt_cuda_plugin *p = plugin();
    return p ? p->device_count() : 0;
}

int dt_backend_cuda_device_info(int device, char *name, size_t name_size, int *cc_major, int *cc_minor) {
    const dt_cuda_plugin *p = plugin();
    if (!p) {
        dt_set_error("cuda: %s", g_why);
        return -1;
    }
    return p->device_info(device, name, name_size, cc_major, cc_minor);
}

dt_comm *dt_comm_nccl_create(dt_backend *const *ranks, int n) {
    const dt_cuda_plugin *p = plugin();
    if (!p) {
        dt_set_error("cuda: %s", g_why);
        return NULL;
    }
    return p->comm_create(ranks, n);
}

#else /* built without CUDA */

int dt_backend_cuda_device_count(void) { return 0; }

int dt_backend_cuda_device_info(int device, char *name, size_t name_size, int *cc_major, int *cc_minor) {
    (void)device; (void)name; (void)name_size; (void)cc_major; (void)cc_minor;
    dt_set_error("this ditrun was built without CUDA (nvcc not found at build time): no CUDA devices");
    return -1;
}

dt_comm *dt_comm_nccl_create(dt_backend *const *ranks, int n) {
    (void)ranks;
    (void)n;
    dt_set_error("this ditrun was built without CUDA (nvcc not found at build time): no NCCL communicator");
    return NULL;
}


int dt_backend_cuda_available(void) { return 0; }

dt_backend *dt_backend_cuda_create(const dt_backend_opts *opts) {
    (void)opts;
    dt_set_error("this ditrun was built without CUDA (nvcc not found at build time); use --backend cpu");
    return NULL;
}

int dt_backend_cuda_cudnn_info(dt_backend *be, long long *calls) {
    (void)be;
    if (calls) *calls = 0;
    return 0;
}

dt_cuda_opts *dt_backend_cuda_opts(dt_backend *be) {
    (void)be;
    return NULL;
}

int dt_backend_cuda_mem_budget(dt_backend *be, int64_t *budget, int64_t *held) {
    (void)be; (void)budget; (void)held;
    return -1;
}

#endif
