/* cmd_forward.c — `ditrun forward`: one transformer forward on inputs read from a safetensors file.
 * The model family is found from config.json through the family registry (pipeline/family.h); the forward runs
 * through the DiT interface (models/dit.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "cli.h"
#include "cli_model.h"
#include "io/safetensors.h"
#include "models/flux2_sp.h"   /* FLUX2_SP_MAX_RANKS */
#include "pipeline/family.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditrun forward --model DIR --inputs IN.safetensors [--output OUT.safetensors] [options]\n\n"
            "Runs one transformer forward (the DiT step) and writes out.sample as F32.\n"
            "DIR: a transformer folder (config.json + safetensors, bf16/f16/f32 or MLX 4/8-bit quantized),\n"
            "     or a pipeline root holding transformer/. The family comes from config.json (_class_name).\n"
            "     FLUX.2 also: one .safetensors file, BFL or mflux key layouts; without config.json the\n"
            "     geometry is inferred from the tensor shapes.\n\n"
            "inputs (FLUX.2): in.hidden_states [1,N,C], in.encoder_hidden_states [1,T,J], in.timestep [1],\n"
            "                 in.img_ids [1,N,4], in.txt_ids [1,T,4] (I64 or F32); optional reference\n"
            "                 image tokens in.ref_hidden_states [1,R,C] + in.ref_ids [1,R,4] (appended after the\n"
            "                 image tokens, or KV-cached with --kv-refs)\n"
            "inputs (Krea 2): in.hidden_states, in.encoder_hidden_states [1,T,layers,dim], in.timestep,\n"
            "                 in.position_ids [T+N,3], in.encoder_attention_mask [1,T] (optional)\n\n"
            "options:\n"
            "  --model DIR          model folder (required)\n"
            "  --inputs FILE        input tensors (required)\n"
            "  --output FILE        where to write out.sample (without it nothing is written: timing runs)\n"
            "  --lora FILE[:SCALE]  a LoRA adapter (repeatable, up to 8; SCALE default 1): PEFT/diffusers,\n"
            "                       kohya/ai-toolkit or BFL-named safetensors; merged into dense weights, a low-rank\n"
            "                       side product on quantized ones (q4/q8, fp8, GGUF)\n"
            "  --lora-side          adapters as side products on dense weights too (instead of merging)\n"
            "  --backend NAME       cpu, cuda or auto (default auto: cuda when a GPU is present)\n"
            "  --threads N          CPU threads (default: all cores)\n"
            "  --qpath P            quantized Linear path on CUDA: auto, mixed, fused, transient, cached (default auto)\n"
            "  --precision P        bf16 (default) or fp8: the DiT blocks' Linears with e4m3 weights (one scale per\n"
            "                       output channel) and e4m3 activations (one scale per token); opt-in\n"
            "  --attn-precision P   bf16 (default) or fp8 (CUDA with cuDNN >= 9.19, or CPU emulation): the blocks'\n"
            "                       attention with e4m3 Q/K/V/P (one scale per tensor); opt-in\n"
            "  --compare-bf16       with --precision fp8 and/or --attn-precision fp8 (FLUX.2, Krea 2): also run the bf16\n"
            "                       path on the same inputs and report the relative L2 error of out.sample (and\n"
            "                       both timings)\n"
            "  --compare-qpath P    (FLUX.2) also run with quantized-Linear path P (e.g. --qpath mixed\n"
            "                       --compare-qpath transient) and report the relative L2 error between the two\n"
            "  --kv-refs            FLUX.2: the reference tokens KV-cached (Flux2KleinKVPipeline: a reference-only pass\n"
            "                       at timestep 0 in the first forward, later forwards reuse its K/V); the first\n"
            "                       forward's time is reported on its own\n"
            "  --no-mask            Krea 2: ignore in.encoder_attention_mask\n"
            "  --guided             each timed forward is a guided step: the inputs' text as the prompt and\n"
            "                       in.negative_encoder_hidden_states (Krea 2 also in.negative_encoder_attention_mask;\n"
            "                       the prompt's own when absent) as the negative prompt, both in one forward\n"
            "                       (--guidance-batch on, the default, where the model can: Krea 2, FLUX.2 base)\n"
            "                       or two (--guidance-batch off); writes out.sample and out.sample_uncond\n"
            "  --trace              also write intermediates (mid.*) to the output file\n"
            "  --repeat N           run the forward N times and report the median time (default 1); on a GPU\n"
            "                       also its SM clock and power after each run (a sustained run may sit at the\n"
            "                       power cap, below the clock a single run sees)\n"
            "  --cuda-graph         CUDA: capture the forward's device work once and replay it (FLUX.2, Krea 2)\n"
            "  --kernels auto|portable  CUDA: portable takes the paths of a non-Hopper card on any card\n"
            "  --max-vram SIZE          CUDA: the device memory pool's budget (K, M, G suffixes: 12G); an allocation\n"
            "                           past it fails naming the budget, the use and the request\n"
            "  --no-prefetch            CUDA: no transient-weight prefetch: each 4/8-bit Linear dequantized right before\n"
            "                           its GEMM, the model's prefetch hints ignored (A/B timings)\n"
            "  --sequence-parallel N  FLUX.2: the forward split over N GPUs (NCCL; on the CPU backend N thread ranks),\n"
            "                       docs/sequence-parallel.md\n"
            "  --compare-unsplit    with --sequence-parallel: also run the unsplit forward (one GPU) and report the\n"
            "                       relative L2 difference of out.sample and both timings (the speed-up)\n"
            "  -q, --quiet          no progress output\n"
            "  -h, --help           this help\n");
}

typedef struct {
    st_writer *w;
    dt_backend *be;
    const char *prefix;
} trace_ctx;

static void trace_cb(void *ud, const char *name, dt_mat m) {
    trace_ctx *tc = ud;
    float *buf = dt_malloc(sizeof(float) * (size_t)(m.rows * m.cols));
    tc->be->download(tc->be, buf, m);
    char nm[128];
    snprintf(nm, sizeof nm, "mid.%s", name);
    int64_t shape[3] = {1, m.rows, m.cols};
    st_writer_add_f32(tc->w, nm, 3, shape, buf);
    free(buf);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_forward(int argc, char **argv) {
    const char *model = NULL, *inputs = NULL, *output = NULL;
    cli_model_opts mo;
    cli_model_opts_default(&mo);
    static cli_lora_opts lor;   /* (static: 32 KB of adapter paths) */
    int trace = 0, no_mask = 0, compare = 0, cmp_qpath = -1, kv_refs = 0;   /* cmp_qpath: --compare-qpath, -1 = none */
    int cmp_unsplit = 0, guided = 0;
    long repeat = 1, ranks = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_model_opt(&mo, argc, argv, &i);
        if (!r) r = cli_lora_opt(&lor, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { if (!v) return cli_error("--model needs a value"); model = v; i++; }
        else if (!strcmp(a, "--inputs")) { if (!v) return cli_error("--inputs needs a value"); inputs = v; i++; }
        else if (!strcmp(a, "--output")) { if (!v) return cli_error("--output needs a value"); output = v; i++; }
        else if (!strcmp(a, "--trace")) trace = 1;
        else if (!strcmp(a, "--no-mask")) no_mask = 1;
        else if (!strcmp(a, "--guided")) guided = 1;
        else if (!strcmp(a, "--kv-refs")) kv_refs = 1;
        else if (!strcmp(a, "--compare-bf16")) compare = 1;
        else if (!strcmp(a, "--compare-qpath")) {
            if (!v) return cli_error("--compare-qpath needs a value (auto, mixed, fused, transient, cached)");
            if (!strcmp(v, "auto")) cmp_qpath = DT_QPATH_AUTO;
            else if (!strcmp(v, "mixed")) cmp_qpath = DT_QPATH_MIXED;
            else if (!strcmp(v, "fused")) cmp_qpath = DT_QPATH_FUSED;
            else if (!strcmp(v, "transient")) cmp_qpath = DT_QPATH_TRANSIENT;
            else if (!strcmp(v, "cached")) cmp_qpath = DT_QPATH_CACHED;
            else return cli_error("--compare-qpath: unknown path '%s' (auto, mixed, fused, transient, cached)", v);
            i++;
        }
        else if (!strcmp(a, "--repeat")) { if (cli_parse_int(a, v, 1, 100000, &repeat)) return 1; i++; }
        else if (!strcmp(a, "--sequence-parallel")) { if (cli_parse_int(a, v, 1, FLUX2_SP_MAX_RANKS, &ranks)) return 1; i++; }
        else if (!strcmp(a, "--compare-unsplit")) cmp_unsplit = 1;
        else return cli_error("forward: unknown option '%s' (see ditrun forward --help)", a);
    }
    if (!model || !inputs)
        return cli_error("forward: --model and --inputs are required (see ditrun forward --help)");
    if (mo.guidance_batch_set && !guided) return cli_error("--guidance-batch: a guided step's option (with --guided)");

    const int any_fp8 = mo.precision == DT_PREC_FP8 || mo.attn_precision == DT_PREC_FP8;
    if (compare && !any_fp8) return cli_error("--compare-bf16 needs --precision fp8 or --attn-precision fp8");
    if (compare && cmp_qpath >= 0) return cli_error("--compare-bf16 and --compare-qpath: one comparison at a time");
    if (cli_check_input(inputs, 1) || cli_check_input(model, 0)) return 1;   /* before loading anything */
    if (output && cli_check_output(output, model, inputs)) return 1;
    const dt_family *fam = dt_family_for_model(model);
    if (!fam) return cli_error("%s", dt_last_error());
    if (ranks > 1 && !fam->sequence_parallel) return cli_error("--sequence-parallel: %s models have no split forward", fam->title);
    if (cmp_unsplit && ranks < 2) return cli_error("--compare-unsplit needs --sequence-parallel N with N >= 2");
    if (ranks > 1 && (trace || compare || cmp_qpath >= 0))
        return cli_error("--sequence-parallel: %s is not available with a split forward",
                         trace ? "--trace" : compare ? "--compare-bf16" : "--compare-qpath");
    if (guided && (trace || compare || cmp_qpath >= 0 || cmp_unsplit || kv_refs))
        return cli_error("--guided: one guided step's timing; not with --trace, --compare-*, or --kv-refs");
    if (cli_check_fp8(fam, &mo)) return 1;
    st_file *in = st_open(inputs);
    if (!in) return cli_error("%s", dt_last_error());
    dt_backend *be = cli_model_backend(&mo);
    if (!be) { st_close(in); return 1; }

    int rc = 1;
    float *out = NULL, *uout = NULL, *neg = NULL;   /* --guided: the negative prompt's velocity and features */
    uint8_t *nmask = NULL;
    dt_dit_inputs fi = {0};
    dt_dit *dit = NULL;     /* split over ranks with --sequence-parallel N > 1 */
    st_writer *w = st_writer_new();
    double t0 = dt_now();
    double *times = NULL;

    if (dt_dit_read_common(in, &fi)) goto done;   /* (the model's own inputs are checked once it is loaded) */
    cli_sp_note(be, (int)ranks);
    dt_dit_load_opts lo = {lor.loras, lor.n, lor.side, (int)ranks, NULL, 0, mo.cuda_graph, mo.precision,
                           mo.attn_precision, 0};
    if (!(dit = fam->dit_load(be, model, &lo))) goto done;
    if (fam->read_inputs(in, dit, kv_refs, no_mask, &fi)) goto done;
    const int64_t n = fi.step.n_img, tt = fi.step.n_txt, no = n * fi.out_channels;
    {
        size_t wb = 0;
        char fmt[96];
        dt_dit_weight_info(dit, &wb, fmt, sizeof fmt);
        dt_log(1, "ditrun: loaded %s, %s, %.1f MB) in %.2f s on %s\n", fi.geometry, fmt, wb / 1e6, dt_now() - t0, be->name);
    }
    out = dt_malloc(sizeof(float) * (size_t)no);
    fi.step.out = out;
    trace_ctx tc = {w, be, "mid"};
    times = dt_malloc(sizeof(double) * repeat);
    /* the text features stay on the device across repeats, as in the denoising loop; each timed forward still uploads
     * the latents, timestep and ids and downloads the output */
    if (tt > 0 && dt_dit_text_resident(dit, 0, fi.step.txt, (int)tt)) goto done;
    fi.step.text = tt > 0 ? 0 : -1;
    dt_dit_step ns = fi.step;   /* --guided: the negative prompt's step */
    int pair = 0;
    if (guided) {
        const st_tensor *tn = st_find(in, "in.negative_encoder_hidden_states");
        const st_tensor *mn = no_mask ? NULL : st_find(in, "in.negative_encoder_attention_mask");
        if (tn && (tn->numel != fi.t_txt->numel || tn->ndim != fi.t_txt->ndim)) {
            dt_set_error("%s: in.negative_encoder_hidden_states must have in.encoder_hidden_states' shape", inputs);
            goto done;
        }
        if (mn && (mn->numel != tt || !fi.step.mask)) {
            dt_set_error("%s: in.negative_encoder_attention_mask must have %lld entries (Krea 2, beside "
                         "in.encoder_attention_mask)", inputs, (long long)tt);
            goto done;
        }
        if (tn) neg = st_to_f32(tn);
        if (mn) {
            float *mf = st_to_f32(mn);
            nmask = dt_malloc((size_t)tt);
            for (int64_t i = 0; i < tt; i++) nmask[i] = mf[i] != 0;
            free(mf);
            ns.mask = nmask;
        }
        ns.txt = neg ? neg : fi.step.txt;
        if (tt > 0 && dt_dit_text_resident(dit, 1, ns.txt, (int)tt)) goto done;
        ns.text = tt > 0 ? 1 : -1;
        uout = dt_malloc(sizeof(float) * (size_t)no);
        ns.out = uout;
        pair = mo.guidance_batch && dt_dit_can_pair(dit);
        dt_log(1, "ditrun: guided step: the prompt and the negative prompt in %s%s\n", pair ? "one forward" : "two forwards",
               mo.guidance_batch && !pair ? " (this model runs one sequence per forward)" : "");
    }
    dt_power_acc pw;
    dt_power_begin(&pw, be, repeat > 1 ? (int)repeat - 1 : 0);
    for (long it = 0; it < repeat; it++) {
        double t1 = dt_now();
        fi.step.trace = trace && it == 0 ? trace_cb : NULL;
        fi.step.trace_ud = &tc;
        if (pair ? dt_dit_forward_pair(dit, &fi.step, &ns)
                 : dt_dit_forward(dit, &fi.step) || (guided && dt_dit_forward(dit, &ns))) {
            dt_power_end(&pw);
            goto done;
        }
        times[it] = dt_now() - t1;
        if (it > 0) dt_power_add(&pw);
    }
    double first = times[0];
    qsort(times, repeat, sizeof(double), cmp_double);
    const double med = times[repeat / 2];
    char split[64] = "";
    if (ranks > 1) snprintf(split, sizeof split, " split over %ld ranks", ranks);
    dt_log(1, "ditrun: %s %lld image + %lld text tokens%s%s: %.2f ms (median of %ld; first %.2f ms, min %.2f ms)\n",
           !guided ? "forward" : pair ? "guided step (one batched forward)" : "guided step (two forwards)",
           (long long)n, (long long)tt, fi.what, split, med * 1e3, repeat, first * 1e3, times[0] * 1e3);
    if (kv_refs) dt_log(1, "ditrun: first forward, with the reference-only pass: %.2f ms\n", first * 1e3);
    { dt_power_summary ps = dt_power_end(&pw); cli_power_report(&ps, "forwards"); }
    int64_t shape[3] = {1, n, fi.out_channels};
    st_writer_add_f32(w, "out.sample", 3, shape, out);
    if (guided) st_writer_add_f32(w, "out.sample_uncond", 3, shape, uout);
    if (compare || cmp_qpath >= 0 || cmp_unsplit) {
        /* the same forward with bf16 Linears (fp8 quality), another qpath, or unsplit (sequence parallelism) */
        float *ref = dt_malloc(sizeof(float) * (size_t)no);
        const dt_qpath qp0 = be->opts.qpath;
        dt_dit_free(dit);
        dit = NULL;
        if (compare) lo.precision = lo.attn_precision = DT_PREC_BF16;
        else if (cmp_qpath >= 0) be->opts.qpath = (dt_qpath)cmp_qpath;
        lo.ranks = 1;
        dit = fam->dit_load(be, model, &lo);
        be->opts.qpath = qp0;
        dt_dit_inputs fi2 = fi;   /* the same host inputs; the references set again on the new DiT */
        if (!dit || (fi.n_refs && dt_dit_set_refs(dit, fi.ref_tok, fi.ref_ids, fi.n_refs, kv_refs)) ||
            (cmp_unsplit && tt > 0 && dt_dit_text_resident(dit, 0, fi.step.txt, (int)tt))) {   /* as the split arm had */
            free(ref);
            goto done;
        }
        fi2.step.text = -1;
        fi2.step.trace = NULL;
        fi2.step.out = ref;
        double *tb = dt_malloc(sizeof(double) * repeat);
        for (long it = 0; it < repeat; it++) {
            double t1 = dt_now();
            if (dt_dit_forward(dit, &fi2.step)) { free(tb); free(ref); goto done; }
            tb[it] = dt_now() - t1;
        }
        qsort(tb, repeat, sizeof(double), cmp_double);
        double e2 = 0, r2 = 0, worst = -1;
        int64_t wi = 0;
        for (int64_t i = 0; i < no; i++) {
            double d = (double)out[i] - ref[i];
            e2 += d * d;
            r2 += (double)ref[i] * ref[i];
            if (!(fabs(d) <= worst)) { worst = fabs(d); wi = i; }
        }
        double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
        if (cmp_unsplit) {
            printf("split (%ld ranks) vs unsplit forward: rel_l2 %.3g, worst |diff| %.4g at %lld (%.4g vs %.4g); "
                   "median %.2f ms vs %.2f ms unsplit: %.2fx\n", ranks, rel, worst, (long long)wi, out[wi], ref[wi],
                   med * 1e3, tb[repeat / 2] * 1e3, tb[repeat / 2] / med);
        } else if (compare) {
            dt_log(1, "ditrun: bf16 forward: %.2f ms (median of %ld)\n", tb[repeat / 2] * 1e3, repeat);
            printf("fp8 vs bf16 forward (%s): rel_l2 %.5f (%.2f%%), worst |diff| %.4g at %lld (fp8 %.4g, bf16 %.4g); "
                   "fp8 could be the default only under 3%%: %s (it stays opt-in)\n", cli_fp8_what(&mo),
                   rel, rel * 100, worst, (long long)wi, out[wi], ref[wi], rel < 0.03 ? "under" : "NOT under");
        } else {
            dt_log(1, "ditrun: forward with qpath %s: %.2f ms (median of %ld)\n", cli_qpath_name(cmp_qpath),
                   tb[repeat / 2] * 1e3, repeat);
            printf("qpath %s vs %s forward: rel_l2 %.5f (%.3f%%), worst |diff| %.4g at %lld (%.4g vs %.4g)\n",
                   cli_qpath_name(qp0), cli_qpath_name(cmp_qpath), rel, rel * 100, worst, (long long)wi, out[wi],
                   ref[wi]);
        }
        free(tb);
        free(ref);
    }
    if (be->mem_stats) {
        size_t cur, peak;
        be->mem_stats(be, &cur, &peak);
        dt_log(1, "ditrun: %s memory peak %.1f MB\n", be->name, peak / 1e6);
    }
    if (output) {   /* without --output: a timing run, nothing written */
        if (st_writer_save(w, output)) goto done;
        dt_log(1, "ditrun: wrote %s\n", output);
    }
    rc = 0;
done:
    if (rc) cli_error("%s", dt_last_error());
    dt_dit_free(dit);
    st_writer_free(w);
    dt_dit_inputs_free(&fi);
    free(out);
    free(uout);
    free(neg);
    free(nmask);
    free(times);
    be->destroy(be);
    st_close(in);
    return rc;
}
