/* test_cuda_paths.c — which path each CUDA op family takes (backends/cuda_paths.c), without a GPU: every card
 * class users have (Ampere 8.0 / 8.6, Ada 8.9, Hopper 9.0, Blackwell 10.0 / 12.0) x kernel mode (auto, portable);
 * the DITRUN_CUDA_KERNELS variable (backend_env.c) and the --kernels option of `ditrun info --devices` and of the
 * model commands (bad values: one clear error line). Runs $BUILD/ditrun (default build/ditrun) for the CLI cases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backends/backend_cuda.h"
#include "test.h"

enum { S = DT_CUDA_PATH_SM90A, P = DT_CUDA_PATH_PORTABLE, L = DT_CUDA_PATH_CUBLASLT, N = DT_CUDA_PATH_NONE };

/* One card class and mode, and the path expected for each family in dt_cuda_ops order
 * (attention, quantized linear, fp8 linear, elementwise, image, ggml). */
typedef struct {
    const char *card;
    int major, minor;
    dt_cuda_kernels mode;
    int hopper;
    int path[DT_CUDA_OPS_COUNT];
} path_case;

static const path_case cases[] = {
    {"A100 (8.0) auto", 8, 0, DT_CUDA_KERNELS_AUTO, 0, {P, P, N, P, P, P}},
    {"RTX 3090 (8.6) auto", 8, 6, DT_CUDA_KERNELS_AUTO, 0, {P, P, N, P, P, P}},
    {"RTX 4090 (8.9) auto", 8, 9, DT_CUDA_KERNELS_AUTO, 0, {P, P, L, P, P, P}},
    {"H100 (9.0) auto", 9, 0, DT_CUDA_KERNELS_AUTO, 1, {S, S, L, P, P, P}},
    {"H100 (9.0) portable", 9, 0, DT_CUDA_KERNELS_PORTABLE, 0, {P, P, L, P, P, P}},
    {"B200 (10.0) auto", 10, 0, DT_CUDA_KERNELS_AUTO, 0, {P, P, L, P, P, P}},
    {"RTX 5090 (12.0) auto", 12, 0, DT_CUDA_KERNELS_AUTO, 0, {P, P, L, P, P, P}},
    {"RTX 3090 (8.6) portable", 8, 6, DT_CUDA_KERNELS_PORTABLE, 0, {P, P, N, P, P, P}},
    {"GH200-like 9.1 auto", 9, 1, DT_CUDA_KERNELS_AUTO, 0, {P, P, L, P, P, P}},   /* sm_90a SASS: 9.0 only */
};

static void test_table(void) {
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const path_case *k = &cases[c];
        char name[160];
        snprintf(name, sizeof name, "paths %s: sm_90a kernels allowed", k->card);
        int h = dt_cuda_hopper_paths(k->major, k->minor, k->mode);
        T_CHECK(name, h == k->hopper, "dt_cuda_hopper_paths = %d, want %d", h, k->hopper);
        for (int f = 0; f < DT_CUDA_OPS_COUNT; f++) {
            snprintf(name, sizeof name, "paths %s: %s", k->card, dt_cuda_ops_name((dt_cuda_ops)f));
            dt_cuda_path p = dt_cuda_ops_path((dt_cuda_ops)f, k->major, k->minor, k->mode);
            T_CHECK(name, (int)p == k->path[f], "path %d (%s), want %d", (int)p, dt_cuda_path_text((dt_cuda_ops)f, p),
                    k->path[f]);
        }
    }
    /* the words say which kind of path it is (what -v and info --devices print) */
    T_CHECK("paths text sm90a", !strncmp(dt_cuda_path_text(DT_CUDA_OPS_ATTENTION, DT_CUDA_PATH_SM90A), "sm90a", 5),
            "%s", dt_cuda_path_text(DT_CUDA_OPS_ATTENTION, DT_CUDA_PATH_SM90A));
    T_CHECK("paths text portable", strstr(dt_cuda_path_text(DT_CUDA_OPS_ATTENTION, DT_CUDA_PATH_PORTABLE), "mma.sync") != NULL,
            "%s", dt_cuda_path_text(DT_CUDA_OPS_ATTENTION, DT_CUDA_PATH_PORTABLE));
    T_CHECK("paths text fp8 none", strstr(dt_cuda_path_text(DT_CUDA_OPS_FP8, DT_CUDA_PATH_NONE), "8.9") != NULL, "%s",
            dt_cuda_path_text(DT_CUDA_OPS_FP8, DT_CUDA_PATH_NONE));
}

static void test_names_and_env(void) {
    dt_cuda_kernels k = DT_CUDA_KERNELS_AUTO;
    T_CHECK("kernels name portable", dt_cuda_kernels_from_name("portable", &k) == 0 && k == DT_CUDA_KERNELS_PORTABLE &&
            !strcmp(dt_cuda_kernels_name(k), "portable"), "k=%d", (int)k);
    T_CHECK("kernels name auto", dt_cuda_kernels_from_name("auto", &k) == 0 && k == DT_CUDA_KERNELS_AUTO, "k=%d", (int)k);
    T_CHECK("kernels name bad", dt_cuda_kernels_from_name("hopper", &k) == -1 && strstr(dt_last_error(), "hopper"),
            "%s", dt_last_error());

    dt_cuda_opts o;
    unsetenv("DITRUN_CUDA_KERNELS");
    T_CHECK("env kernels unset: auto", dt_cuda_opts_from_env(&o) == 0 && o.kernels == DT_CUDA_KERNELS_AUTO, "%d",
            (int)o.kernels);
    setenv("DITRUN_CUDA_KERNELS", "portable", 1);
    T_CHECK("env kernels portable", dt_cuda_opts_from_env(&o) == 0 && o.kernels == DT_CUDA_KERNELS_PORTABLE, "%d",
            (int)o.kernels);
    setenv("DITRUN_CUDA_KERNELS", "fast", 1);
    int rc = dt_cuda_opts_from_env(&o);
    T_CHECK("env kernels bad value", rc == -1 && strstr(dt_last_error(), "DITRUN_CUDA_KERNELS=fast") &&
            o.kernels == DT_CUDA_KERNELS_AUTO, "rc %d kernels %d: %s", rc, (int)o.kernels, dt_last_error());
    unsetenv("DITRUN_CUDA_KERNELS");
}

/* Runs ditrun ARGS with stdout and stderr into *out; returns the exit status. */
static int run(const char *exe, const char *args, char *out, size_t n) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    if (!p) { out[0] = 0; return -1; }
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_cli(void) {
    const char *b = getenv("BUILD");
    char exe[512], out[8192];
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    if (access(exe, X_OK)) { T_SKIP("cli kernels", "%s not built", exe); return; }
    int rc = run(exe, "info --devices --kernels portable", out, sizeof out);
    /* with a GPU: one table per device; without: the "no usable CUDA GPU" line. Either way the mode is said. */
    T_CHECK("info --devices --kernels portable", rc == 0 && strstr(out, "kernels      portable") &&
            (strstr(out, "no usable CUDA GPU") || (strstr(out, "attention") && !strstr(out, "sm90a"))),
            "rc %d: %s", rc, out);
    rc = run(exe, "info --devices --kernels hopper", out, sizeof out);
    T_CHECK("info --kernels bad value", rc == 1 && strstr(out, "ditrun: error:") && strstr(out, "'hopper'"),
            "rc %d: %s", rc, out);
    rc = run(exe, "info --kernels portable tests/fixtures/model", out, sizeof out);
    T_CHECK("info --kernels without --devices", rc == 1 && strstr(out, "goes with --devices"), "rc %d: %s", rc, out);
    rc = run(exe, "forward --kernels fast --backend cpu", out, sizeof out);
    T_CHECK("forward --kernels bad value", rc == 1 && strstr(out, "--kernels") && strstr(out, "(auto, portable)"),
            "rc %d: %s", rc, out);
    rc = run(exe, "generate --kernels", out, sizeof out);
    T_CHECK("generate --kernels without value", rc == 1 && strstr(out, "--kernels needs a value"), "rc %d: %s", rc, out);
}

int main(void) {
    test_table();
    test_names_and_env();
    test_cli();
    return T_DONE();
}
