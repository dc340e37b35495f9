/* test_startup.c — the CUDA libraries are loaded only when a CUDA backend is asked for (backends/cuda_plugin.h):
 * this program's own mappings before and after a CPU backend, the libraries `ditrun --version`, `info` and
 * `tokenize` load (the dynamic linker's LD_DEBUG=files report), the plugin loaded by `dt_backend_cuda_available`
 * in a CUDA build, and a ditrun copied away from its plugin: `--backend auto` runs on the CPU without an error,
 * `--backend cuda` says which file is missing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/backend.h"
#include "test.h"

static char tmpdir[256];

/* 1 when a mapping of this process has `needle` in its path. */
static int mapped(const char *needle) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[1024];
    int hit = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) hit = 1;
    fclose(f);
    return hit;
}

static int any_cuda_mapped(void) {
    return mapped("libcudart") || mapped("libcublas") || mapped("libditrun_cuda");
}

/* Runs a shell command; its stdout+stderr into *out (malloc'd). Returns the exit status. */
static int run(const char *cmd, char **out) {
    char full[4096], path[400];
    snprintf(path, sizeof path, "%s/out.txt", tmpdir);
    snprintf(full, sizeof full, "%s > %s 2>&1", cmd, path);
    int st = system(full);
    FILE *f = fopen(path, "rb");
    size_t cap = 1 << 20, n = 0;
    *out = dt_malloc(cap + 1);
    if (f) { n = fread(*out, 1, cap, f); fclose(f); }
    (*out)[n] = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Which CUDA objects a ditrun command loads, from the dynamic linker's own report. */
static void cli_loads_no_cuda(const char *exe, const char *name, const char *args) {
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "LD_DEBUG=files %s %s", exe, args);
    int rc = run(cmd, &out);
    int saw_linker = strstr(out, "file=") != NULL;
    int cuda = strstr(out, "file=libcudart") || strstr(out, "file=libcublas") || strstr(out, "libditrun_cuda");
    if (!saw_linker) T_SKIP(name, "the dynamic linker printed no LD_DEBUG report");
    else T_CHECK(name, rc == 0 && !cuda, "exit %d, CUDA objects loaded: %.2000s", rc, out);
    free(out);
}

int main(void) {
    const char *b = getenv("BUILD");
    char exe[512];
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    if (t_tmpdir(tmpdir, sizeof tmpdir, "startup")) { T_FAIL("startup", "mkdtemp failed"); return T_DONE(); }
    const char *fx = t_fixtures();

    T_CHECK("no CUDA library mapped at start", any_cuda_mapped() == 0, "maps name a CUDA library before any backend");
    dt_backend_opts o = {0};
    o.threads = 1;
    o.rope_fp32 = 1;
    dt_backend *cpu = dt_backend_create("cpu", &o);
    T_CHECK("no CUDA library mapped with a CPU backend", cpu && any_cuda_mapped() == 0,
            "%s", cpu ? "a CUDA library is mapped" : dt_last_error());
    if (cpu) cpu->destroy(cpu);

    if (access(exe, X_OK)) {
        T_SKIP("ditrun start-up", "%s not built", exe);
    } else {
        char cmd[1536], *out;
        snprintf(cmd, sizeof cmd, "ldd %s", exe);
        int rc = run(cmd, &out);
        if (rc != 0) T_SKIP("ditrun does not link the CUDA libraries", "ldd failed: %.200s", out);
        else T_CHECK("ditrun does not link the CUDA libraries", !strstr(out, "libcudart") && !strstr(out, "libcublas"),
                     "ldd: %s", out);
        free(out);
        cli_loads_no_cuda(exe, "ditrun --version loads no CUDA object", "--version");
        snprintf(cmd, sizeof cmd, "info %s/model", fx);
        cli_loads_no_cuda(exe, "ditrun info loads no CUDA object", cmd);
        snprintf(cmd, sizeof cmd, "tokenize --tokenizer %s/model/tokenizer 'a red fox'", fx);
        cli_loads_no_cuda(exe, "ditrun tokenize loads no CUDA object", cmd);

        /* a copy of ditrun without the plugin beside it */
        char lone[400];
        snprintf(lone, sizeof lone, "%s/bin/ditrun", tmpdir);
        snprintf(cmd, sizeof cmd, "mkdir -p %s/bin && cp %s %s", tmpdir, exe, lone);
        if (system(cmd) != 0) T_FAIL("ditrun without its plugin", "cannot copy %s", exe);
        else {
            snprintf(cmd, sizeof cmd, "env -u LD_LIBRARY_PATH %s forward --model %s/model --inputs %s/transformer_io.safetensors "
                     "--output %s/out.safetensors --backend cuda", lone, fx, fx, tmpdir);
            rc = run(cmd, &out);
#ifdef DT_HAVE_CUDA
            T_CHECK("--backend cuda without the plugin names the missing file", rc == 1 && strstr(out, "libditrun_cuda.so") &&
                    strstr(out, "not found") && strstr(out, "--backend cpu"), "exit %d: %s", rc, out);
#else
            T_CHECK("--backend cuda in a build without CUDA says so", rc == 1 && strstr(out, "without CUDA"), "exit %d: %s", rc, out);
#endif
            free(out);
            snprintf(cmd, sizeof cmd, "env -u LD_LIBRARY_PATH %s forward --model %s/model --inputs %s/transformer_io.safetensors "
                     "--output %s/out.safetensors --backend auto", lone, fx, fx, tmpdir);
            rc = run(cmd, &out);
            T_CHECK("--backend auto without the plugin runs on the CPU", rc == 0 && strstr(out, "on cpu") && !strstr(out, "error"),
                    "exit %d: %s", rc, out);
            free(out);
        }
    }

#ifdef DT_HAVE_CUDA
    int driver = !access("/dev/nvidiactl", F_OK) || !access("/dev/nvidia0", F_OK) || !access("/dev/dxg", F_OK) ||
                 !access("/proc/driver/nvidia/version", F_OK);
    int avail = dt_backend_cuda_available();
    if (!driver)   /* `auto` on a machine without an NVIDIA driver: answered without loading anything */
        T_CHECK("no NVIDIA driver: dt_backend_cuda_available is 0 without loading the plugin",
                avail == 0 && mapped("libditrun_cuda.so") == 0, "available %d, plugin mapped %d", avail,
                mapped("libditrun_cuda.so"));
    /* creating a CUDA backend loads the plugin (every symbol it needs resolved: RTLD_NOW) */
    dt_backend *cu = avail ? NULL : dt_backend_cuda_create(&o);
    T_CHECK("a CUDA backend asked for loads the CUDA plugin", mapped("libditrun_cuda.so") == 1 && mapped("libcudart") == 1,
            "plugin not mapped: %s", dt_last_error());
    if (!avail)
        T_CHECK("without a GPU the CUDA backend says so (not the plugin)", !cu && !strstr(dt_last_error(), "plugin"),
                "%s", cu ? "created" : dt_last_error());
    if (cu) cu->destroy(cu);
#else
    T_SKIP("a CUDA backend asked for loads the CUDA plugin", "built without CUDA");
#endif
    t_rmtree(tmpdir);
    return T_DONE();
}
