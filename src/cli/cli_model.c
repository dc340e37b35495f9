/* cli_model.c — shared model options of the CLI commands. */
#include "cli_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "pipeline/family.h"

void cli_model_opts_default(cli_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->be.rope_fp32 = 1;
    o->guidance_batch = 1;   /* faster at every size measured (PERF.md day 4: 512²-2048², Krea 2 and klein-4B) */
}

int cli_model_opt(cli_model_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long x;
    if (!strcmp(a, "--backend")) {
        if (!v) { cli_error("--backend needs a value (cpu, cuda, auto)"); return -1; }
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) { cli_error("--backend: unknown backend '%s' (cpu, cuda, auto)", v); return -1; }
        o->backend = v; (*i)++; return 1;
    }
    if (!strcmp(a, "--threads")) {
        if (cli_parse_int(a, v, 1, 4096, &x)) return -1;
        o->be.threads = (int)x; (*i)++; return 1;
    }
    if (!strcmp(a, "--qpath")) {
        if (!v) { cli_error("--qpath needs a value (auto, mixed, fused, transient, cached)"); return -1; }
        if (!strcmp(v, "auto")) o->be.qpath = DT_QPATH_AUTO;
        else if (!strcmp(v, "fused")) o->be.qpath = DT_QPATH_FUSED;
        else if (!strcmp(v, "transient")) o->be.qpath = DT_QPATH_TRANSIENT;
        else if (!strcmp(v, "cached")) o->be.qpath = DT_QPATH_CACHED;
        else if (!strcmp(v, "mixed")) o->be.qpath = DT_QPATH_MIXED;
        else { cli_error("--qpath: unknown path '%s' (auto, mixed, fused, transient, cached)", v); return -1; }
        (*i)++; return 1;
    }
    if (!strcmp(a, "--precision") || !strcmp(a, "--attn-precision")) {
        if (!v) { cli_error("%s needs a value (bf16, fp8)", a); return -1; }
        dt_precision *dst = !strcmp(a, "--attn-precision") ? &o->attn_precision : &o->precision;
        if (dt_precision_from_name(v, dst)) {
            cli_error("%s: unknown precision '%s' (bf16, fp8)", a, v);
            return -1;
        }
        (*i)++; return 1;
    }
    if (!strcmp(a, "--rope-bf16")) { o->be.rope_fp32 = 0; return 1; }
    if (!strcmp(a, "--cuda-graph")) { o->cuda_graph = 1; return 1; }
    if (!strcmp(a, "--guidance-batch")) {
        if (!v || (strcmp(v, "on") && strcmp(v, "off"))) {
            cli_error("--guidance-batch needs on or off%s%s%s", v ? " (got '" : "", v ? v : "", v ? "')" : "");
            return -1;
        }
        o->guidance_batch = !strcmp(v, "on");
        o->guidance_batch_set = 1;
        (*i)++; return 1;
    }
    if (!strcmp(a, "--kernels")) {
        dt_cuda_kernels k;
        if (!v) { cli_error("--kernels needs a value (auto, portable)"); return -1; }
        if (dt_cuda_kernels_from_name(v, &k)) { cli_error("--kernels: %s", dt_last_error()); return -1; }
        /* the environment's CUDA options with this mode; the struct outlives every backend the command creates */
        if (!o->be.cuda && dt_cuda_opts_from_env(&o->cuda)) { cli_error("%s", dt_last_error()); return -1; }
        o->cuda.kernels = k;
        o->be.cuda = &o->cuda;
        (*i)++; return 1;
    }
    if (!strcmp(a, "--max-vram")) {
        int64_t b = cli_parse_bytes(a, v);
        if (b < 0) return -1;
        if (!o->be.cuda && dt_cuda_opts_from_env(&o->cuda)) { cli_error("%s", dt_last_error()); return -1; }
        o->cuda.max_vram = o->max_vram = b;
        o->be.cuda = &o->cuda;
        (*i)++; return 1;
    }
    if (!strcmp(a, "--no-prefetch")) {   /* (A/B timings of the models' prefetch hints) */
        if (!o->be.cuda && dt_cuda_opts_from_env(&o->cuda)) { cli_error("%s", dt_last_error()); return -1; }
        o->cuda.no_prefetch = 1;
        o->be.cuda = &o->cuda;
        return 1;
    }
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { dt_log_level = 0; return 1; }
    if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { dt_log_level = 2; o->be.verbose = 1; return 1; }
    return 0;
}

int cli_lora_opt(cli_lora_opts *l, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--lora-side")) { l->side = 1; return 1; }
    if (strcmp(a, "--lora")) return 0;
    if (!v) { cli_error("--lora needs a value (FILE[:SCALE])"); return -1; }
    if (l->n == CLI_MAX_LORAS) { cli_error("--lora: at most %d adapters", CLI_MAX_LORAS); return -1; }
    if (dt_lora_spec_parse(v, &l->loras[l->n])) { cli_error("%s", dt_last_error()); return -1; }
    if (cli_check_input(l->loras[l->n].path, 1)) return -1;   /* missing, a folder, a FIFO: said before any work */
    l->n++;
    (*i)++;
    return 1;
}

int cli_vae_opt(cli_vae_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--vae-tiling")) { o->tiling = 1; return 1; }
    if (strcmp(a, "--vae-tile-size")) return 0;
    long l;
    if (cli_parse_int(a, v, 1, 65536, &l)) return -1;
    o->tile = (int)l;
    (*i)++;
    return 1;
}

dt_backend *cli_model_backend(const cli_model_opts *o) {
    dt_backend *be = dt_backend_create(o->backend, &o->be);
    if (!be) cli_error("%s", dt_last_error());
    return be;
}

int cli_check_fp8(const dt_family *fam, const cli_model_opts *o) {
    if (fam->fp8 || (o->precision != DT_PREC_FP8 && o->attn_precision != DT_PREC_FP8)) return 0;
    return cli_error("%s fp8: FLUX.2 models only (%s has no fp8 mode yet)",
                     o->precision == DT_PREC_FP8 ? "--precision" : "--attn-precision", fam->title);
}

const char *cli_bundled_model(void) {
    static char path[4200];
    const char *env = getenv("DITRUN_DEFAULT_MODEL");
    if (env && *env) return env;
    /* next to the executable: build/ditrun -> tests/fixtures/model of the source tree; an installed
     * PREFIX/bin/ditrun -> PREFIX/share/ditrun/model (make install); else relative to the current directory */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            const char *rel[] = {"../tests/fixtures/model", "../share/ditrun/model"};
            for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
                snprintf(path, sizeof path, "%s/%s", exe, rel[i]);
                struct stat st;
                if (stat(path, &st) == 0) return path;
            }
        }
    }
    return "tests/fixtures/model";
}

const char *cli_qpath_name(int qpath) {
    switch (qpath) {
    case DT_QPATH_MIXED: return "mixed";
    case DT_QPATH_FUSED: return "fused";
    case DT_QPATH_TRANSIENT: return "transient";
    case DT_QPATH_CACHED: return "cached";
    default: return "auto";
    }
}

const char *cli_fp8_what(const cli_model_opts *o) {
    const int lin = o->precision == DT_PREC_FP8, att = o->attn_precision == DT_PREC_FP8;
    return lin && att ? "Linears + attention" : lin ? "Linears" : att ? "attention" : "none";
}

void cli_sp_note(const dt_backend *be, int ranks) {
    if (ranks > 1 && !strcmp(be->name, "cpu"))
        dt_log(1, "ditrun: note: --sequence-parallel %d on the cpu backend: %d thread ranks taking turns on the cores "
                  "(the split schedule for tests; not faster)\n", ranks, ranks);
}
