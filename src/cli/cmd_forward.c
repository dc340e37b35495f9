/* cmd_forward.c — `ditrun forward`: one transformer forward on inputs read from a safetensors file.
 * The model family is detected from config.json's _class_name (FLUX.2-klein; Krea 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "cli.h"
#include "cli_model.h"
#include "io/safetensors.h"
#include "models/flux2.h"
#include "models/flux2_sp.h"
#include "models/krea2.h"

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
            "  --trace              also write intermediates (mid.*) to the output file\n"
            "  --repeat N           run the forward N times and report the median time (default 1); on a GPU\n"
            "                       also its SM clock and power after each run (a sustained run may sit at the\n"
            "                       power cap, below the clock a single run sees)\n"
            "  --cuda-graph         CUDA: capture the forward's device work once and replay it (FLUX.2, Krea 2)\n"
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

/* Fetch a tensor by name and convert it to f32; NULL (with an error) if absent or of a bad rank. */
static float *input_f32(const st_file *f, const char *name, int required, const st_tensor **out) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        if (required) dt_set_error("%s: missing input tensor '%s'", st_path(f), name);
        return NULL;
    }
    *out = t;
    return st_to_f32(t);
}

/* rows x cols of a [1, rows, cols] or [rows, cols] tensor */
static int shape2(const st_tensor *t, int64_t *rows, int64_t *cols) {
    if (t->ndim == 3 && t->shape[0] == 1) { *rows = t->shape[1]; *cols = t->shape[2]; return 0; }
    if (t->ndim == 2) { *rows = t->shape[0]; *cols = t->shape[1]; return 0; }
    dt_set_error("%s: tensor '%s' must be [1, rows, cols] or [rows, cols]", t->file, t->name);
    return -1;
}

/* --compare-bf16: the fp8 output's relative L2 error and worst element against the bf16 one, on stdout. */
static void fp8_report(const dt_backend_opts *o, const float *out, const float *ref, int64_t no) {
    double e2 = 0, r2 = 0, worst = -1;
    int64_t wi = 0;
    for (int64_t i = 0; i < no; i++) {
        double d = (double)out[i] - ref[i];
        e2 += d * d;
        r2 += (double)ref[i] * ref[i];
        if (!(fabs(d) <= worst)) { worst = fabs(d); wi = i; }
    }
    double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    printf("fp8 vs bf16 forward (%s): rel_l2 %.5f (%.2f%%), worst |diff| %.4g at %lld (fp8 %.4g, bf16 %.4g); "
           "fp8 could be the default only under 3%%: %s (it stays opt-in)\n", cli_fp8_what(o), rel, rel * 100, worst,
           (long long)wi, out[wi], ref[wi], rel < 0.03 ? "under" : "NOT under");
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
    int cmp_unsplit = 0;
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

    const int any_fp8 = mo.be.precision == DT_PREC_FP8 || mo.be.attn_precision == DT_PREC_FP8;
    if (compare && !any_fp8) return cli_error("--compare-bf16 needs --precision fp8 or --attn-precision fp8");
    if (compare && cmp_qpath >= 0) return cli_error("--compare-bf16 and --compare-qpath: one comparison at a time");
    if (cmp_qpath >= 0 && cli_model_family(model) != CLI_FAMILY_FLUX2)
        return cli_error("--compare-qpath: FLUX.2 models only");
    if (cli_check_input(inputs, 1) || cli_check_input(model, 0)) return 1;   /* before loading anything */
    if (output && cli_check_output(output, model, inputs)) return 1;
    int family = cli_model_family(model);
    if (family < 0) return cli_error("%s", dt_last_error());
    if (ranks > 1 && family != CLI_FAMILY_FLUX2) return cli_error("--sequence-parallel: FLUX.2 models only");
    if (cmp_unsplit && ranks < 2) return cli_error("--compare-unsplit needs --sequence-parallel N with N >= 2");
    if (ranks > 1 && (trace || compare || cmp_qpath >= 0))
        return cli_error("--sequence-parallel: %s is not available with a split forward",
                         trace ? "--trace" : compare ? "--compare-bf16" : "--compare-qpath");
    st_file *in = st_open(inputs);
    if (!in) return cli_error("%s", dt_last_error());
    dt_backend *be = cli_model_backend(&mo);
    if (!be) { st_close(in); return 1; }

    int rc = 1;
    float *img = NULL, *txt = NULL, *ts = NULL, *img_ids = NULL, *txt_ids = NULL, *out = NULL, *pos = NULL, *ref = NULL,
          *ref_ids = NULL;
    uint8_t *mask = NULL;
    flux2_model *fm = NULL;
    flux2_sp *spm = NULL;   /* --sequence-parallel N > 1: the split forward instead of fm */
    krea2_model *km = NULL;
    st_writer *w = st_writer_new();
    const st_tensor *t_img, *t_txt, *t_ts, *t_iid, *t_tid;
    int64_t n, cin, tt, cj;
    double t0 = dt_now();

    if (!(img = input_f32(in, "in.hidden_states", 1, &t_img)) || shape2(t_img, &n, &cin)) goto done;
    if (!(ts = input_f32(in, "in.timestep", 1, &t_ts))) goto done;
    if (t_ts->numel != 1) { dt_set_error("%s: in.timestep must hold one value (batch 1), has %lld", inputs, (long long)t_ts->numel); goto done; }
    if (!isfinite(ts[0])) { dt_set_error("%s: in.timestep is %g; it must be a finite number", inputs, (double)ts[0]); goto done; }
    if (!(txt = input_f32(in, "in.encoder_hidden_states", 1, &t_txt))) goto done;

    if (family == CLI_FAMILY_FLUX2) {
        if (shape2(t_txt, &tt, &cj)) goto done;
        if (!(img_ids = input_f32(in, "in.img_ids", 1, &t_iid)) || !(txt_ids = input_f32(in, "in.txt_ids", 1, &t_tid))) goto done;
        flux2_load_opts flo = {lor.loras, lor.n, lor.side};
        if (ranks > 1) {
            cli_sp_note(be, (int)ranks);
            flux2_sp_opts so = {(int)ranks, {0}, 0, flo};
            if (!(spm = flux2_sp_load(be, model, &so))) goto done;
            if (mo.cuda_graph) dt_log(1, "ditrun: note: --cuda-graph is not used with --sequence-parallel (eager)\n");
        } else {
            if (!(fm = flux2_load_ex(be, model, &flo))) goto done;
            flux2_set_graph(fm, mo.cuda_graph);
        }
        const flux2_config *c = spm ? flux2_sp_get_config(spm) : flux2_get_config(fm);
        int64_t r, cc;
        if (cin != c->in_channels) { dt_set_error("%s: in.hidden_states has %lld channels but the model expects %d", inputs, (long long)cin, c->in_channels); goto done; }
        if (cj != c->joint_dim) { dt_set_error("%s: in.encoder_hidden_states has %lld features but the model expects %d (joint_attention_dim)", inputs, (long long)cj, c->joint_dim); goto done; }
        if (shape2(t_iid, &r, &cc) || r != n || cc != c->n_axes) { dt_set_error("%s: in.img_ids must be [1, %lld, %d]", inputs, (long long)n, c->n_axes); goto done; }
        if (shape2(t_tid, &r, &cc) || r != tt || cc != c->n_axes) { dt_set_error("%s: in.txt_ids must be [1, %lld, %d]", inputs, (long long)tt, c->n_axes); goto done; }
        const st_tensor *t_ref, *t_rid;
        int64_t nref = 0;
        if ((ref = input_f32(in, "in.ref_hidden_states", 0, &t_ref))) {
            if (!(ref_ids = input_f32(in, "in.ref_ids", 1, &t_rid))) goto done;
            if (shape2(t_ref, &nref, &cc) || cc != c->in_channels || nref > (1 << 24)) { dt_set_error("%s: in.ref_hidden_states must be [1, R, %d]", inputs, c->in_channels); goto done; }
            if (shape2(t_rid, &r, &cc) || r != nref || cc != c->n_axes) { dt_set_error("%s: in.ref_ids must be [1, %lld, %d]", inputs, (long long)nref, c->n_axes); goto done; }
            if (spm ? flux2_sp_set_refs(spm, ref, ref_ids, (int)nref, kv_refs)
                    : flux2_set_refs(fm, ref, ref_ids, (int)nref, kv_refs))
                goto done;
            dt_log(1, "ditrun: %lld reference tokens, %s\n", (long long)nref, kv_refs ? "KV-cached" : "appended");
        } else if (kv_refs) {
            dt_set_error("%s: --kv-refs but no in.ref_hidden_states", inputs);
            goto done;
        }
        size_t wb = 0; char fmt[96];
        if (fm) flux2_weight_info(fm, &wb, fmt, sizeof fmt);
        else snprintf(fmt, sizeof fmt, "split over %ld ranks (%s)", ranks, flux2_sp_comm_name(spm));
        dt_log(1, "ditrun: loaded FLUX.2 transformer (D=%d, %d double + %d single blocks, %s, %.1f MB) in %.2f s on %s\n",
               c->hidden, c->num_layers, c->num_single_layers, fmt, wb / 1e6, dt_now() - t0, be->name);
        out = dt_malloc(sizeof(float) * (size_t)(n * c->out_channels));
        trace_ctx tc = {w, be, "mid"};
        double *times = dt_malloc(sizeof(double) * repeat);
        /* the text features stay on the device across repeats, as in the denoising loop; each timed forward
         * still uploads the latents, timestep and ids and downloads the output */
        if (tt > 0 && (spm ? flux2_sp_text_resident(spm, txt, (int)tt) : flux2_text_resident(fm, txt, (int)tt))) {
            free(times);
            goto done;
        }
        dt_power_acc pw;
        dt_power_begin(&pw, be, repeat > 1 ? (int)repeat - 1 : 0);
        for (long it = 0; it < repeat; it++) {
            double t1 = dt_now();
            int frc = spm ? flux2_sp_forward(spm, img, (int)n, txt, (int)tt, ts[0], img_ids, txt_ids, out)
                          : flux2_forward(fm, img, (int)n, txt, (int)tt, ts[0], img_ids, txt_ids, out,
                                          trace && it == 0 ? trace_cb : NULL, &tc);
            if (frc) { free(times); dt_power_end(&pw); goto done; }
            times[it] = dt_now() - t1;
            if (it > 0) dt_power_add(&pw);
        }
        double first = times[0];
        qsort(times, repeat, sizeof(double), cmp_double);
        const double med = times[repeat / 2];
        char split[64] = "";
        if (spm) snprintf(split, sizeof split, " split over %ld ranks", ranks);
        dt_log(1, "ditrun: forward %lld image + %lld text tokens%s%s: %.2f ms (median of %ld)\n", (long long)n,
               (long long)tt, !nref ? "" : kv_refs ? " (KV-cached references)" : " + appended references", split,
               med * 1e3, repeat);
        if (kv_refs) dt_log(1, "ditrun: first forward, with the reference-only pass: %.2f ms\n", first * 1e3);
        { dt_power_summary ps = dt_power_end(&pw); cli_power_report(&ps, "forwards"); }
        free(times);
        int64_t shape[3] = {1, n, c->out_channels};
        st_writer_add_f32(w, "out.sample", 3, shape, out);
        if (compare || cmp_qpath >= 0 || cmp_unsplit) {
            /* the same forward with bf16 Linears (fp8 quality), another qpath, or unsplit (sequence parallelism) */
            int64_t no = n * c->out_channels;
            const float *ref_tok = ref;   /* the reference tokens (the name is reused below for the other output) */
            float *ref = dt_malloc(sizeof(float) * (size_t)no);
            const dt_precision prec0 = be->opts.precision, aprec0 = be->opts.attn_precision;
            const dt_qpath qp0 = be->opts.qpath;
            flux2_free(fm);
            flux2_sp_free(spm);
            spm = NULL;
            if (compare) be->opts.precision = be->opts.attn_precision = DT_PREC_BF16;
            else be->opts.qpath = (dt_qpath)cmp_qpath;
            fm = flux2_load_ex(be, model, &(flux2_load_opts){lor.loras, lor.n, lor.side});
            be->opts.precision = prec0;
            be->opts.attn_precision = aprec0;
            be->opts.qpath = qp0;
            if (!fm) { free(ref); goto done; }
            flux2_set_graph(fm, mo.cuda_graph);
            if ((nref && flux2_set_refs(fm, ref_tok, ref_ids, (int)nref, kv_refs)) ||
                (cmp_unsplit && tt > 0 && flux2_text_resident(fm, txt, (int)tt))) {   /* as the split arm had */
                free(ref);
                goto done;
            }
            double *tb = dt_malloc(sizeof(double) * repeat);
            for (long it = 0; it < repeat; it++) {
                double t1 = dt_now();
                if (flux2_forward(fm, img, (int)n, txt, (int)tt, ts[0], img_ids, txt_ids, ref, NULL, NULL)) { free(tb); free(ref); goto done; }
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
                fp8_report(&mo.be, out, ref, no);
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
    } else {
        /* Krea 2: encoder_hidden_states [1, T, layers, dim], position_ids [T+N, axes], optional mask [1, T] */
        if (t_txt->ndim != 4 || t_txt->shape[0] != 1) { dt_set_error("%s: in.encoder_hidden_states must be [1, T, layers, dim] for Krea 2", inputs); goto done; }
        tt = t_txt->shape[1];
        const st_tensor *t_pos, *t_mask;
        if (!(pos = input_f32(in, "in.position_ids", 1, &t_pos))) goto done;
        if (!no_mask && (t_mask = st_find(in, "in.encoder_attention_mask"))) {
            if (t_mask->numel != tt) { dt_set_error("%s: in.encoder_attention_mask must have %lld entries", inputs, (long long)tt); goto done; }
            float *mf = st_to_f32(t_mask);
            mask = dt_malloc((size_t)tt);
            for (int64_t i = 0; i < tt; i++) mask[i] = mf[i] != 0;
            free(mf);
        }
        km = krea2_load_ex(be, model, &(krea2_load_opts){lor.loras, lor.n, lor.side});
        if (!km) goto done;
        krea2_set_graph(km, mo.cuda_graph);
        const krea2_config *c = krea2_get_config(km);
        if (cin != c->in_channels) { dt_set_error("%s: in.hidden_states has %lld channels but the model expects %d", inputs, (long long)cin, c->in_channels); goto done; }
        if (t_txt->shape[2] != c->text_layers || t_txt->shape[3] != c->text_dim) {
            dt_set_error("%s: in.encoder_hidden_states must be [1, T, %d, %d]", inputs, c->text_layers, c->text_dim); goto done;
        }
        if (t_pos->numel != (tt + n) * c->n_axes) { dt_set_error("%s: in.position_ids must be [%lld, %d]", inputs, (long long)(tt + n), c->n_axes); goto done; }
        size_t wb; char fmt[96];
        krea2_weight_info(km, &wb, fmt, sizeof fmt);
        dt_log(1, "ditrun: loaded Krea 2 transformer (D=%d, %d blocks, %d/%d heads, %s, %.1f MB) in %.2f s on %s\n",
               c->hidden, c->num_layers, c->heads, c->kv_heads, fmt, wb / 1e6, dt_now() - t0, be->name);
        out = dt_malloc(sizeof(float) * (size_t)(n * c->out_channels));
        trace_ctx tc = {w, be, "mid"};
        double *times = dt_malloc(sizeof(double) * repeat);
        dt_power_acc pw;
        dt_power_begin(&pw, be, repeat > 1 ? (int)repeat - 1 : 0);
        for (long it = 0; it < repeat; it++) {
            double t1 = dt_now();
            if (krea2_forward(km, img, (int)n, txt, (int)tt, ts[0], pos, mask, out, trace && it == 0 ? trace_cb : NULL,
                              &tc)) { free(times); dt_power_end(&pw); goto done; }
            times[it] = dt_now() - t1;
            if (it > 0) dt_power_add(&pw);
        }
        double first = times[0];
        qsort(times, repeat, sizeof(double), cmp_double);
        dt_log(1, "ditrun: forward %lld image + %lld text tokens%s: %.2f ms (median of %ld; first %.2f ms, min %.2f ms)\n",
               (long long)n, (long long)tt, mask ? " (text mask)" : "", times[repeat / 2] * 1e3, repeat, first * 1e3,
               times[0] * 1e3);
        { dt_power_summary ps = dt_power_end(&pw); cli_power_report(&ps, "forwards"); }
        free(times);
        int64_t shape[3] = {1, n, c->out_channels};
        st_writer_add_f32(w, "out.sample", 3, shape, out);
        if (compare) {   /* the same forward with bf16 Linears and attention: the fp8 error */
            const int64_t no = n * c->out_channels;   /* (c is the freed model's) */
            krea2_free(km);
            const dt_precision prec0 = be->opts.precision, aprec0 = be->opts.attn_precision;
            be->opts.precision = be->opts.attn_precision = DT_PREC_BF16;
            km = krea2_load_ex(be, model, &(krea2_load_opts){lor.loras, lor.n, lor.side});
            be->opts.precision = prec0;
            be->opts.attn_precision = aprec0;
            if (!km) goto done;
            krea2_set_graph(km, mo.cuda_graph);
            ref = dt_malloc(sizeof(float) * (size_t)no);
            double *tb = dt_malloc(sizeof(double) * repeat);
            for (long it = 0; it < repeat; it++) {
                double t1 = dt_now();
                if (krea2_forward(km, img, (int)n, txt, (int)tt, ts[0], pos, mask, ref, NULL, NULL)) { free(tb); goto done; }
                tb[it] = dt_now() - t1;
            }
            qsort(tb, repeat, sizeof(double), cmp_double);
            dt_log(1, "ditrun: bf16 forward: %.2f ms (median of %ld)\n", tb[repeat / 2] * 1e3, repeat);
            free(tb);
            fp8_report(&mo.be, out, ref, no);
        }
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
    if (fm) flux2_free(fm);
    flux2_sp_free(spm);
    if (km) krea2_free(km);
    st_writer_free(w);
    free(img); free(txt); free(ts); free(img_ids); free(txt_ids); free(out); free(pos); free(mask); free(ref); free(ref_ids);
    be->destroy(be);
    st_close(in);
    return rc;
}
