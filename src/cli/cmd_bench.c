/* cmd_bench.c — `ditrun bench`: parse the options, run the bench (src/bench), print the markdown
 * report on stdout (progress on stderr) and write the JSON lines file when asked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "cli.h"
#include "cli_model.h"
#include "pipeline/family.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditrun bench [--preset NAME | --model DIR] [options]\n\n"
            "Measures one DiT denoise step from the inside: whole forward, a ledger of where the time goes\n"
            "(cumulative-prefix op timing in a single block, block-count scaling, shares that add up to 100%%),\n"
            "utilization next to ceilings measured in the same run (in bursts and, on a GPU, under sustained load),\n"
            "the floor those ceilings give, and interleaved A/B arms. On a GPU it also reports the SM clock and power\n"
            "after each timed forward (a sustained forward on an H200 runs at its power cap). Synthetic weights\n"
            "at any geometry (cached in $TMPDIR/ditrun-bench-cache) or a real checkpoint. Markdown on stdout.\n\n"
            "model:\n"
            "  --preset NAME        klein-4b (default), klein-9b, tiny, krea2 (Krea 2, 12.9 B), krea2-tiny,\n"
            "                       z-image-turbo (Z-Image, 6 B), z-image-tiny\n"
            "  --model DIR          a real FLUX.2, Krea 2 or Z-Image transformer folder / pipeline root instead of synthetic weights\n"
            "                       (Krea 2: whole forward with/without the text mask, one-block ledger, GEMM/attention\n"
            "                       utilization, arms native GQA vs repeated KV and key-padding bias vs compacted keys)\n"
            "  --hidden N --heads N --double N --single N --mlp-ratio R   geometry overrides\n"
            "  --kv-heads N         kv heads of the GQA arm (default heads/4; krea2: the model's kv heads)\n"
            "                       krea2: --heads N (D = N x 128), --single N = transformer blocks, --mlp-ratio R\n"
            "  --format F           f32, bf16, q4 (default), q8 (synthetic weights)\n"
            "  --group-size N       quantization group, 32/64/128 (default 64; 32 when 64 does not divide)\n"
            "  --fresh              rewrite the cached synthetic checkpoint; --cache-dir DIR to place it\n"
            "workload:\n"
            "  --image-size PX      image side (tokens = (PX/16)^2; default 1024, CPU 64)\n"
            "  --text-tokens N      text tokens (default 512, CPU 16)\n"
            "  --reps N --warmup N  timed repetitions (median) and excluded warm-up runs (CUDA 20/3, CPU 2/0)\n"
            "  --arm-tokens LIST    token counts of the quantized-path arm (default 256,1024,4096,16384; CPU 32)\n"
            "  --only LIST          sections: ledger,util,arms (default all; the whole forward always runs)\n"
            "  --arms LIST          arms to run: qpath,rope,attention,graph,prefetch,threads,fp8,f8fuse\n"
            "                       (default all)\n"
            "  --l2-mb MB           cache size rotations must exceed twice (default 60 on CUDA, the LLC on CPU)\n"
            "  --peak-tflops T      nominal peak for the utilization table (default: H200 bf16 989 on CUDA)\n"
            "  --seed S             random seed\n"
            "output:\n"
            "  --json FILE          every number as JSON lines\n"
            "backend:\n"
            "  --backend cpu|cuda|auto  --threads N  --qpath auto|mixed|fused|transient|cached  --rope-bf16  -q  -v\n"
            "  --kernels auto|portable  CUDA: portable takes the paths of a non-Hopper card on any card\n"
            "  --no-prefetch            CUDA: no transient-weight prefetch (the models' hints ignored; A/B timings)\n"
            "  --max-vram SIZE          CUDA: the device memory pool's budget (K, M, G suffixes: 12G); an allocation\n"
            "                           past it fails naming the budget, the use and the request\n"
            "  --precision bf16|fp8 the DiT blocks' Linears in bf16 (default) or e4m3 (whole forward, ledger; the fp8\n"
            "                       arm compares the two GEMMs at the model's main shapes in either case)\n"
            "  --attn-precision bf16|fp8  the DiT blocks' attention in bf16 (default) or e4m3 (whole forward, ledger;\n"
            "                       the attn-fp8 arm compares the two at the model's attention shape in either case)\n");
}

static int parse_fmt(const char *v, int *out) {
    if (!v) return cli_error("--format needs a value (f32, bf16, q4, q8)");
    if (!strcmp(v, "f32")) *out = BENCH_FMT_F32;
    else if (!strcmp(v, "bf16")) *out = BENCH_FMT_BF16;
    else if (!strcmp(v, "q4")) *out = BENCH_FMT_Q4;
    else if (!strcmp(v, "q8")) *out = BENCH_FMT_Q8;
    else return cli_error("--format: unknown format '%s' (f32, bf16, q4, q8)", v);
    return 0;
}

static int parse_list(const char *opt, const char *v, int *out, int max, int *n) {
    if (!v) return cli_error("%s needs a comma-separated list", opt);
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long x;
        if (*n >= max) return cli_error("%s: at most %d values", opt, max);
        if (cli_parse_int(opt, tok, 1, 1 << 20, &x)) return 1;
        out[(*n)++] = (int)x;
    }
    if (!*n) return cli_error("%s: empty list", opt);
    return 0;
}

static int parse_sections(const char *v, unsigned *out) {
    if (!v) return cli_error("--only needs a list (ledger, util, arms)");
    *out = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "ledger")) *out |= BENCH_LEDGER;
        else if (!strcmp(tok, "util")) *out |= BENCH_UTIL;
        else if (!strcmp(tok, "arms")) *out |= BENCH_ARMS;
        else return cli_error("--only: unknown section '%s' (ledger, util, arms)", tok);
    }
    return 0;
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    bench_opts_default(&o);
    cli_model_opts mo;
    cli_model_opts_default(&mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        double d;
        int rc = cli_model_opt(&mo, argc, argv, &i);
        if (rc < 0) return 1;
        if (rc > 0 && mo.guidance_batch_set)
            return cli_error("--guidance-batch: bench times one unguided forward (a guided step: ditrun forward --guided)");
        if (rc > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--preset")) { if (!v) return cli_error("--preset needs a value"); o.preset = v; i++; }
        else if (!strcmp(a, "--model")) { if (!v) return cli_error("--model needs a folder"); o.model_dir = v; i++; }
        else if (!strcmp(a, "--hidden")) { if (cli_parse_int(a, v, 8, 65536, &x)) return 1; o.hidden = (int)x; i++; }
        else if (!strcmp(a, "--heads")) { if (cli_parse_int(a, v, 1, 1024, &x)) return 1; o.heads = (int)x; i++; }
        else if (!strcmp(a, "--kv-heads")) { if (cli_parse_int(a, v, 1, 1024, &x)) return 1; o.kv_heads = (int)x; i++; }
        else if (!strcmp(a, "--double")) { if (cli_parse_int(a, v, 1, 1024, &x)) return 1; o.n_double = (int)x; i++; }
        else if (!strcmp(a, "--single")) { if (cli_parse_int(a, v, 1, 1024, &x)) return 1; o.n_single = (int)x; i++; }
        else if (!strcmp(a, "--mlp-ratio")) {
            if (cli_parse_float(a, v, &d)) return 1;
            if (!(d > 0 && d < 64)) return cli_error("--mlp-ratio must be in (0, 64)");
            o.mlp_ratio = d; i++;
        }
        else if (!strcmp(a, "--format")) { if (parse_fmt(v, &o.format)) return 1; i++; }
        else if (!strcmp(a, "--group-size")) {
            if (cli_parse_int(a, v, 32, 128, &x)) return 1;
            if (x != 32 && x != 64 && x != 128) return cli_error("--group-size must be 32, 64 or 128");
            o.group = (int)x; i++;
        }
        else if (!strcmp(a, "--image-size")) { if (cli_parse_int(a, v, 16, 16384, &x)) return 1; o.image_size = (int)x; i++; }
        else if (!strcmp(a, "--text-tokens")) { if (cli_parse_int(a, v, 0, 65536, &x)) return 1; o.text_tokens = (int)x; i++; }
        else if (!strcmp(a, "--reps")) { if (cli_parse_int(a, v, 1, 100000, &x)) return 1; o.reps = (int)x; i++; }
        else if (!strcmp(a, "--warmup")) { if (cli_parse_int(a, v, 0, 100000, &x)) return 1; o.warmup = (int)x; i++; }
        else if (!strcmp(a, "--arm-tokens")) { if (parse_list(a, v, o.arm_tokens, 8, &o.n_arm_tokens)) return 1; i++; }
        else if (!strcmp(a, "--only")) { if (parse_sections(v, &o.sections)) return 1; i++; }
        else if (!strcmp(a, "--arms")) {
            static const char *const known[] = {"qpath", "rope", "attention", "graph", "prefetch", "threads", "fp8", "f8fuse"};
            const char *names = "qpath, rope, attention, graph, prefetch, threads, fp8, f8fuse";
            if (!v) return cli_error("--arms needs a list (%s)", names);
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                size_t k = 0;
                while (k < sizeof known / sizeof known[0] && strcmp(tok, known[k])) k++;
                if (k == sizeof known / sizeof known[0]) return cli_error("--arms: unknown arm '%s' (%s)", tok, names);
            }
            o.arms = v;
            i++;
        }
        else if (!strcmp(a, "--l2-mb")) {
            if (cli_parse_float(a, v, &d)) return 1;
            if (!(d > 0)) return cli_error("--l2-mb must be positive");
            o.l2_mb = d; i++;
        }
        else if (!strcmp(a, "--peak-tflops")) {
            if (cli_parse_float(a, v, &d)) return 1;
            if (!(d > 0)) return cli_error("--peak-tflops must be positive");
            o.peak_tflops = d; i++;
        }
        else if (!strcmp(a, "--seed")) { if (cli_parse_int(a, v, 0, 1L << 30, &x)) return 1; o.seed = (uint64_t)x; i++; }
        else if (!strcmp(a, "--json")) { if (!v) return cli_error("--json needs a file"); o.json_path = v; i++; }
        else if (!strcmp(a, "--cache-dir")) { if (!v) return cli_error("--cache-dir needs a folder"); o.cache_dir = v; i++; }
        else if (!strcmp(a, "--fresh")) o.fresh = 1;
        else return cli_error("bench: unknown option '%s' (see ditrun bench --help)", a);
    }
    o.backend = mo.backend;
    o.be = mo.be;
    o.precision = mo.precision;
    o.attn_precision = mo.attn_precision;
    if (o.model_dir && cli_check_input(o.model_dir, 0)) return 1;   /* a FIFO, a loop, a missing path: the real reason */
    if (o.json_path && cli_check_output(o.json_path, o.model_dir, NULL)) return 1;   /* before the bench runs */
    const dt_family *fam = o.model_dir ? dt_family_for_model(o.model_dir) : o.preset ? dt_family_for_preset(o.preset) : NULL;
    if (fam && cli_check_fp8(fam, &mo)) return 1;
    bench_report *r = calloc(1, sizeof *r);
    if (!r) return cli_error("out of memory");
    if (bench_run(&o, r)) {
        free(r);
        return cli_error("%s", dt_last_error());
    }
    bench_report_markdown(r, stdout);
    fflush(stdout);
    if (o.json_path) {
        if (bench_report_json(r, o.json_path)) {
            free(r);
            return cli_error("%s", dt_last_error());
        }
        fprintf(stderr, "bench: wrote %s\n", o.json_path);
    }
    free(r);
    return 0;
}
