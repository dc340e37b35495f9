/* cuda_power.cu — the GPU's clock and power state through NVML (libnvidia-ml, loaded at run time: no link
 * dependency, and a machine without it just reports "unavailable").
 *
 * Why: on the H200 a sustained forward runs at the 700 W power cap with the SM clock ~1560 MHz instead of the
 * 1980 MHz that short isolated timings see (PERF.md, stop 12), so a timing means little without the clock it ran
 * at. The bench and `ditrun forward` sample this after their timed runs. The prototypes below are NVML's stable
 * C ABI (the toolkit here ships no nvml.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "cuda_common.cuh"

typedef int nvml_ret;          /* nvmlReturn_t: 0 = success */
typedef void *nvml_dev;        /* nvmlDevice_t */
#define NVML_CLOCK_SM 1
#define NVML_TEMPERATURE_GPU 0

static struct {
    int tried, ok;
    void *dl;
    nvml_ret (*init)(void);
    nvml_ret (*by_pci)(const char *, nvml_dev *);
    nvml_ret (*clock)(nvml_dev, int, unsigned *);
    nvml_ret (*max_clock)(nvml_dev, int, unsigned *);
    nvml_ret (*power)(nvml_dev, unsigned *);
    nvml_ret (*limit)(nvml_dev, unsigned *);
    nvml_ret (*reasons)(nvml_dev, unsigned long long *);
    nvml_ret (*temp)(nvml_dev, int, unsigned *);
} g_nvml;
static pthread_mutex_t g_nvml_lock = PTHREAD_MUTEX_INITIALIZER;

static int nvml_load(void) {
    pthread_mutex_lock(&g_nvml_lock);
    if (!g_nvml.tried) {
        g_nvml.tried = 1;
        g_nvml.dl = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (g_nvml.dl) {
            *(void **)&g_nvml.init = dlsym(g_nvml.dl, "nvmlInit_v2");
            *(void **)&g_nvml.by_pci = dlsym(g_nvml.dl, "nvmlDeviceGetHandleByPciBusId_v2");
            *(void **)&g_nvml.clock = dlsym(g_nvml.dl, "nvmlDeviceGetClockInfo");
            *(void **)&g_nvml.max_clock = dlsym(g_nvml.dl, "nvmlDeviceGetMaxClockInfo");
            *(void **)&g_nvml.power = dlsym(g_nvml.dl, "nvmlDeviceGetPowerUsage");
            *(void **)&g_nvml.limit = dlsym(g_nvml.dl, "nvmlDeviceGetEnforcedPowerLimit");
            *(void **)&g_nvml.reasons = dlsym(g_nvml.dl, "nvmlDeviceGetCurrentClocksThrottleReasons");
            *(void **)&g_nvml.temp = dlsym(g_nvml.dl, "nvmlDeviceGetTemperature");
            g_nvml.ok = g_nvml.init && g_nvml.by_pci && g_nvml.clock && g_nvml.max_clock && g_nvml.power &&
                        g_nvml.limit && g_nvml.init() == 0;
        }
    }
    pthread_mutex_unlock(&g_nvml_lock);
    return g_nvml.ok;
}

/* Fills p for the device st runs on; -1 when NVML is not there or does not know the device. */
int dtc_power_sample(dtc_state *st, dt_power_sample *p) {
    memset(p, 0, sizeof *p);
    if (!nvml_load()) return -1;
    if (!st->nvml_dev) {
        char bus[64];
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, st->device) != cudaSuccess) { cudaGetLastError(); return -1; }
        nvml_dev d = nullptr;
        if (g_nvml.by_pci(bus, &d) != 0 || !d) return -1;
        st->nvml_dev = d;
    }
    nvml_dev d = (nvml_dev)st->nvml_dev;
    unsigned v = 0;
    if (g_nvml.clock(d, NVML_CLOCK_SM, &v) != 0) return -1;
    p->sm_mhz = (int)v;
    if (g_nvml.max_clock(d, NVML_CLOCK_SM, &v) == 0) p->sm_max_mhz = (int)v;
    if (g_nvml.power(d, &v) == 0) p->power_w = v * 1e-3;
    if (g_nvml.limit(d, &v) == 0) p->limit_w = v * 1e-3;
    unsigned long long r = 0;
    if (g_nvml.reasons && g_nvml.reasons(d, &r) == 0) p->reasons = r;
    if (g_nvml.temp && g_nvml.temp(d, NVML_TEMPERATURE_GPU, &v) == 0) p->temp_c = (int)v;
    return 0;
}
