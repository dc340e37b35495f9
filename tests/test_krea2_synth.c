/* test_krea2_synth.c — synthetic Krea 2 checkpoints, inputs and the Krea 2 bench
 * (DITRUN_BENCH=1 or DITRUN_SLOW=1; skipped otherwise).
 *
 * krea2-tiny: the preset equals the fixture's config; krea2_synth_write produces exactly the fixture's
 * tensor names and shapes; bf16 and q4 checkpoints load and run a finite forward on the CPU (with and
 * without the text mask); the CLI path `ditrun synth --preset krea2-tiny` (+ --inputs) and `ditrun
 * forward --repeat` works; `ditrun bench --preset krea2-tiny` through the library API gives a complete,
 * sane report (replica = model, 13 ledger ops summing to the block, shares = 100 %, arms agree) and
 * JSON lines. DITRUN_SLOW=1 adds the real geometry: the q4 checkpoint (~7.2 GB in $TMPDIR) loads on the
 * CPU (every tensor krea2_load asks for is there with its shape), then is deleted.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_krea2.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/krea2.h"
#include "test.h"

/* Shares are computed so that the parts + remainder = total exactly; only rounding remains. */
#define SHARE_SUM_TOL 1e-6
/* The replica issues the model's ops in the same order: on the CPU (f32) the streams are identical. */
#define REPLICA_TOL_CPU 1e-5

static char tmpdir[512];

static void rm_tree(const char *dir) {
    const char *names[] = {"config.json", "model.safetensors", ".bench-complete", "in.safetensors", "out.safetensors"};
    char p[2048];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static int run_cli(const char *args) {
    const char *b = getenv("BUILD");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/ditrun %s > %s/cli.out 2> %s/cli.err", b && *b ? b : "build", args, tmpdir, tmpdir);
    int st = system(cmd);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static int all_finite(const float *v, size_t n, double *absmax) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) return 0;
        if (fabs(v[i]) > m) m = fabs(v[i]);
    }
    *absmax = m;
    return 1;
}

static void test_presets(void) {
    krea2_config a, b;
    char p[600];
    snprintf(p, sizeof p, "%s/krea2/transformer/config.json", t_fixtures());
    json *cfg = json_parse_file(p);
    int ok = cfg && krea2_config_parse(cfg, p, &a) == 0 && krea2_preset("krea2-tiny", &b) == 0;
    json_free(cfg);
    T_CHECK("krea2-tiny preset = fixture config", ok && !memcmp(&a, &b, sizeof a), "%s", ok ? "fields differ" : dt_last_error());
    ok = krea2_preset("krea2", &b) == 0 && b.hidden == 6144 && b.heads == 48 && b.kv_heads == 12 && b.head_dim == 128 &&
         b.intermediate == 16384 && b.num_layers == 28 && b.in_channels == 64 && b.text_dim == 2560 && b.text_layers == 12 &&
         b.text_heads == 20 && b.text_kv_heads == 20 && b.text_intermediate == 6912 && b.n_layerwise == 2 && b.n_refiner == 2 &&
         b.t_embed == 256 && b.n_axes == 3 && b.axes[0] == 32 && b.axes[1] == 48 && b.axes[2] == 48 && b.rope_theta == 1000.0f;
    T_CHECK("krea2 preset = Krea2Transformer2DModel defaults", ok, "geometry differs");
    T_CHECK("unknown Krea 2 preset rejected", krea2_preset("krea3", &b) != 0 && strstr(dt_last_error(), "krea2-tiny"), "%s",
            dt_last_error());
}

/* Names and shapes of the written tiny checkpoint vs the fixture's. */
static void test_tensor_list(const char *dir) {
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/krea2/transformer/diffusion_pytorch_model.safetensors", t_fixtures());
    snprintf(q, sizeof q, "%s/model.safetensors", dir);
    st_file *fx = st_open(p), *sy = st_open(q);
    if (!fx || !sy) { T_FAIL("krea2-tiny tensors = fixture tensors", "%s", dt_last_error()); st_close(fx); st_close(sy); return; }
    int bad = 0;
    for (size_t i = 0; i < st_count(fx); i++) {
        const st_tensor *a = st_at(fx, i), *b = st_find(sy, a->name);
        if (!b || b->ndim != a->ndim || b->dtype != a->dtype || memcmp(a->shape, b->shape, sizeof(int64_t) * a->ndim)) {
            if (bad++ < 3) printf("  %s: %s\n", a->name, b ? "shape/dtype differs" : "missing");
        }
    }
    T_CHECK("krea2-tiny tensors = fixture tensors (names, shapes, bf16)", !bad && st_count(fx) == st_count(sy),
            "%d differ; %zu vs %zu tensors", bad, st_count(fx), st_count(sy));
    st_close(fx);
    st_close(sy);
}

static void test_forward(const char *dir, const char *tag) {
    char nm[160];
    dt_backend_opts bo = {0};
    dt_backend *be = dt_backend_cpu_create(&bo);
    krea2_model *m = krea2_load(be, dir);
    snprintf(nm, sizeof nm, "krea2-tiny %s: loads on the CPU", tag);
    if (!m) { T_FAIL(nm, "%s", dt_last_error()); be->destroy(be); return; }
    T_PASS(nm);
    const krea2_config *c = krea2_get_config(m);
    int gh = 6, gw = 5, t = 12, n = gh * gw;
    float *img = dt_malloc(sizeof(float) * n * c->in_channels), *txt = dt_malloc(sizeof(float) * t * c->text_layers * c->text_dim);
    float *pos = dt_malloc(sizeof(float) * (n + t) * c->n_axes), *out = dt_malloc(sizeof(float) * n * c->out_channels);
    float *out2 = dt_malloc(sizeof(float) * n * c->out_channels);
    uint8_t mask[12];
    krea2_synth_inputs(c, gh, gw, t, 3, img, txt, pos, mask);
    int valid = 0, padded = 0;
    for (int i = 0; i < t; i++) { valid += mask[i]; padded += i > 0 && !mask[i] && mask[i - 1]; }
    snprintf(nm, sizeof nm, "krea2-tiny %s: inputs have the pipeline layout", tag);
    T_CHECK(nm, mask[0] && mask[t - 1] && valid < t && padded == 1 && pos[(t + gw + 2) * 3 + 1] == 1 && pos[(t + gw + 2) * 3 + 2] == 2 &&
            pos[0] == 0 && pos[(t - 1) * 3 + 2] == 0, "mask/positions wrong (valid %d)", valid);
    double am = 0, am2 = 0;
    int rc = krea2_forward(m, img, n, txt, t, 0.6f, pos, mask, out, NULL, NULL);
    int rc2 = krea2_forward(m, img, n, txt, t, 0.6f, pos, NULL, out2, NULL, NULL);
    snprintf(nm, sizeof nm, "krea2-tiny %s: forward finite with and without the mask", tag);
    T_CHECK(nm, !rc && !rc2 && all_finite(out, (size_t)n * c->out_channels, &am) && all_finite(out2, (size_t)n * c->out_channels, &am2) &&
            am > 1e-3 && am < 1e3 && am2 > 1e-3, "rc %d/%d, max |out| %g / %g (%s)", rc, rc2, am, am2, rc ? dt_last_error() : "");
    free(img); free(txt); free(pos); free(out); free(out2);
    krea2_free(m);
    be->destroy(be);
}

static void test_cli(void) {
    char dir[700], in[700], out[700], args[2400];
    snprintf(dir, sizeof dir, "%s/cli", tmpdir);
    snprintf(in, sizeof in, "%s/cli/in.safetensors", tmpdir);
    snprintf(out, sizeof out, "%s/cli/out.safetensors", tmpdir);
    snprintf(args, sizeof args, "synth --preset krea2-tiny --bits 4 --output %s", dir);
    int rc = run_cli(args);
    snprintf(args, sizeof args, "synth --preset krea2-tiny --inputs %s --image-size 96 --text-tokens 10", in);
    int rc2 = run_cli(args);
    T_CHECK("cli: ditrun synth --preset krea2-tiny (checkpoint, inputs)", rc == 0 && rc2 == 0, "exit %d / %d", rc, rc2);
    st_file *f = st_open(in);
    const st_tensor *th = f ? st_find(f, "in.hidden_states") : NULL, *te = f ? st_find(f, "in.encoder_hidden_states") : NULL;
    const st_tensor *tp = f ? st_find(f, "in.position_ids") : NULL, *tm = f ? st_find(f, "in.encoder_attention_mask") : NULL;
    T_CHECK("cli: Krea 2 inputs have their shapes", th && te && tp && tm && th->shape[1] == 36 && th->shape[2] == 16 &&
            te->ndim == 4 && te->shape[1] == 10 && te->shape[2] == 3 && te->shape[3] == 64 && tp->shape[0] == 46 &&
            tp->shape[1] == 3 && tm->dtype == DT_U8 && tm->numel == 10, "bad input file");
    st_close(f);
    snprintf(args, sizeof args, "forward --model %s --inputs %s --backend cpu --repeat 2", dir, in);
    rc = run_cli(args);
    snprintf(args, sizeof args, "forward --model %s --inputs %s --output %s --backend cpu -q", dir, in, out);
    rc2 = run_cli(args);
    f = st_open(out);
    const st_tensor *to = f ? st_find(f, "out.sample") : NULL;
    double am = 0;
    int ok = to && to->dtype == DT_F32 && to->shape[1] == 36 && to->shape[2] == 16;
    if (ok) {
        float *v = st_to_f32(to);
        ok = all_finite(v, (size_t)to->numel, &am) && am > 0;
        free(v);
    }
    T_CHECK("cli: ditrun forward --repeat on the synthetic Krea 2 checkpoint", rc == 0 && rc2 == 0 && ok,
            "exit %d / %d, output ok %d", rc, rc2, ok);
    st_close(f);
    rm_tree(dir);
}

static void test_bench(void) {
    bench_opts o;
    bench_opts_default(&o);
    o.preset = "krea2-tiny";
    o.backend = "cpu";
    o.image_size = 64;
    o.text_tokens = 12;
    o.reps = 3;
    o.warmup = 1;
    o.l2_mb = 0.5;
    char cache[700], jp[700];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    snprintf(jp, sizeof jp, "%s/bench.jsonl", tmpdir);
    o.cache_dir = cache;
    bench_k2_report *r = calloc(1, sizeof *r);
    int lvl = dt_log_level;
    dt_log_level = 0;
    int rc = bench_krea2_run(&o, r);
    dt_log_level = lvl;
    if (rc) { T_FAIL("bench krea2-tiny runs", "%s", dt_last_error()); free(r); return; }
    T_PASS("bench krea2-tiny runs");
    T_CHECK("bench: whole forward with and without mask timed, finite", r->fwd_mask.n == 3 && r->fwd_nomask.n == 3 &&
            r->fwd_mask.med > 0 && r->out_finite && r->mask_effect > 0 && r->n_valid < r->n_txt && r->blocks_dev.n == 3,
            "n %d/%d finite %d mask effect %g", r->fwd_mask.n, r->fwd_nomask.n, r->out_finite, r->mask_effect);
    T_CHECK("bench: replica blocks = krea2_forward blocks", r->replica_checked && r->replica_maxdiff <= REPLICA_TOL_CPU *
            (r->replica_absmax > 1 ? r->replica_absmax : 1) && r->replica_absmax > 0, "max |diff| %g (max %g)",
            r->replica_maxdiff, r->replica_absmax);
    int ok = r->n_ops == K2B_N_OPS;
    double sum = 0, lsum = 0;
    for (int k = 0; ok && k < r->n_ops; k++) {
        if (!r->ops[k].name || r->ops[k].prefix.n != 3 || !(r->ops[k].prefix.med > 0) || r->ops[k].direct.n != 3 || r->ops[k].ledger_ms < 0)
            ok = 0;
        sum += r->ops[k].ms;
        lsum += r->ops[k].ledger_ms;
    }
    T_CHECK("bench: ledger has the 13 ops of a block, adding up", ok && fabs(sum - r->block_ledger_ms) <= 1e-9 * (1 + sum) &&
            fabs(lsum - r->block_ledger_ms) <= 1e-6 * (1 + lsum), "n_ops %d, sum %g / %g vs %g", r->n_ops, sum, lsum, r->block_ledger_ms);
    T_CHECK("bench: GEMM and attention work counted", r->ops[1].gflop > 0 && r->ops[4].gflop > 0 && r->ops[9].gflop > 0 &&
            r->ops[11].gflop > 0, "gflop missing");
    double all = 0;
    for (int i = 0; i < r->n_shares; i++) if (!r->shares[i].level) all += r->shares[i].share;
    T_CHECK("bench: shares sum to 100%", r->n_shares >= 6 && fabs(all - 100.0) <= SHARE_SUM_TOL, "sum %.9g%% (%d rows)", all, r->n_shares);
    T_CHECK("bench: block-count scaling", r->n_scale >= 2 && r->scale_n[r->n_scale - 1] == r->c.num_layers, "n_scale %d", r->n_scale);
    ok = r->n_gemm == 5 && r->attn_iso.n == 3 && r->copy_gbs > 0;
    for (int i = 0; ok && i < r->n_gemm; i++) ok = r->gemm[i].iso.n == 3 && r->gemm[i].ceil.n == 3 && r->gemm[i].inmodel_ms > 0;
    T_CHECK("bench: utilization of every GEMM shape, attention, copy", ok, "n_gemm %d", r->n_gemm);
    int gqa = 0, mask = 0, bad = 0;
    for (int i = 0; i < r->n_arms; i++) {
        const bench_arm *a = &r->arms[i];
        if (a->skipped) { bad++; continue; }
        if (!strcmp(a->arm, "gqa")) gqa++;
        if (!strcmp(a->arm, "mask")) mask++;
        if (a->sa.n != 3 || a->sb.n != 3 || !(a->ratio > 0) || (!isinf(a->tol) && !(a->maxdiff <= a->tol * (a->ref_absmax > 0 ? a->ref_absmax : 1))))
            bad++;
    }
    T_CHECK("bench: arms gqa (native/repeated/pre-repeated) and mask (bias/compacted/none) agree", gqa == 2 && mask == 2 && !bad,
            "gqa %d mask %d bad %d", gqa, mask, bad);
    rc = bench_krea2_json(r, jp);
    FILE *f = rc ? NULL : fopen(jp, "r");
    int lines = 0, badl = 0, ops = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while (f && (len = getline(&line, &cap, f)) > 0) {
        lines++;
        json *j = json_parse(line, (size_t)len, jp);
        if (!j || !json_get_str(j, "type")) badl++;
        else if (!strcmp(json_get_str(j, "type"), "ledger_op")) ops++;
        json_free(j);
    }
    free(line);
    if (f) fclose(f);
    T_CHECK("bench: JSON lines parse", f && !badl && ops == K2B_N_OPS && lines > 20, "lines %d bad %d ops %d", lines, badl, ops);
    char *buf = NULL;
    size_t blen = 0;
    FILE *mf = open_memstream(&buf, &blen);
    bench_krea2_markdown(r, mf);
    fclose(mf);
    const char *sec[] = {"## Whole forward", "## Ledger: one transformer block", "## Ledger: block-count scaling",
                         "## Ledger: shares", "## Utilization", "## A/B arms", "**total**"};
    int missing = -1;
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++) if (!strstr(buf, sec[i])) { missing = (int)i; break; }
    T_CHECK("bench: markdown has every section", missing < 0, "missing '%s'", missing >= 0 ? sec[missing] : "");
    free(buf);
    unlink(jp);
    /* the cached checkpoint */
    char key[900];
    snprintf(key, sizeof key, "%s", r->source + strlen("synthetic ("));
    if (strlen(key)) key[strlen(key) - 1] = 0;
    rm_tree(key);
    rmdir(cache);
    free(r);
}

static void test_real_geometry(void) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/real", tmpdir);
    krea2_config c;
    krea2_preset("krea2", &c);
    double t0 = dt_now();
    if (krea2_synth_write(&c, dir, 4, 64, 1)) { T_FAIL("krea2 q4 real geometry: written", "%s", dt_last_error()); rm_tree(dir); return; }
    printf("  wrote the q4 real-geometry checkpoint in %.1f s\n", dt_now() - t0);
    dt_backend_opts bo = {0};
    dt_backend *be = dt_backend_cpu_create(&bo);
    krea2_model *m = krea2_load(be, dir);
    size_t bytes = 0;
    char fmt[96] = "";
    if (m) krea2_weight_info(m, &bytes, fmt, sizeof fmt);
    T_CHECK("krea2 q4 real geometry: krea2_load finds every tensor with its shape", m && bytes > 6.5e9 && bytes < 8e9 &&
            strstr(fmt, "q4 g64"), "%s (%.2f GB, %s)", m ? "size" : dt_last_error(), bytes / 1e9, fmt);
    krea2_free(m);
    be->destroy(be);
    rm_tree(dir);
}

int main(void) {
    const char *bench = getenv("DITRUN_BENCH"), *slow = getenv("DITRUN_SLOW");
    int on_b = bench && *bench == '1', on_s = slow && *slow == '1';
    if (!on_b && !on_s) {
        T_SKIP("krea2 synthetic checkpoints and bench", "set DITRUN_BENCH=1 or DITRUN_SLOW=1 (tiny geometry, ~30 s on CPU)");
        return T_DONE();
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ditrun-test-krea2-synth-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    mkdir(tmpdir, 0755);
    test_presets();
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tiny-bf16", tmpdir);
    krea2_config c;
    krea2_preset("krea2-tiny", &c);
    if (krea2_synth_write(&c, dir, 0, 64, 1)) T_FAIL("krea2-tiny bf16 written", "%s", dt_last_error());
    else {
        test_tensor_list(dir);
        test_forward(dir, "bf16");
    }
    rm_tree(dir);
    snprintf(dir, sizeof dir, "%s/tiny-q4", tmpdir);
    if (krea2_synth_write(&c, dir, 4, 32, 2)) T_FAIL("krea2-tiny q4 written", "%s", dt_last_error());
    else test_forward(dir, "q4 g32");
    rm_tree(dir);
    test_cli();
    test_bench();
    if (on_s) test_real_geometry();
    else T_SKIP("krea2 q4 real geometry loads", "set DITRUN_SLOW=1 (writes ~7.2 GB to $TMPDIR, ~30 s)");
    char p[700];
    snprintf(p, sizeof p, "%s/cli.out", tmpdir); unlink(p);
    snprintf(p, sizeof p, "%s/cli.err", tmpdir); unlink(p);
    rmdir(tmpdir);
    return T_DONE();
}
