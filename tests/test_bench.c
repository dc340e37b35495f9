/* test_bench.c — the bench suites as tests (DITRUN_BENCH=1; skipped otherwise, fast).
 *
 * Runs `ditrun bench` at the tiny geometry on the CPU (and on CUDA when a GPU is usable) through the
 * library API and asserts the report is complete and sane: every ledger row present, the shares sum to
 * 100 % with the remainder, the replica matches flux2_forward, the utilization rows carry timings, the
 * A/B arms' outputs agree within their tolerances, and the JSON lines parse with every record there; the same for
 * the Krea 2 family (krea2-tiny, and the fixture through --model). Then the CLI: a short run prints the markdown
 * tables, and bad options fail with one line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_internal.h"
#include "io/json.h"
#include "models/vae_qwenimage.h"
#include "test.h"

/* Shares are computed so that categories + remainder = total exactly; only rounding remains. */
#define SHARE_SUM_TOL 1e-6
/* Timing noise on a loaded 2-core machine: the unexplained remainder may be large at the tiny geometry,
 * but a remainder beyond this means the ledger misses a part of the forward. */
#define REMAINDER_MAX_PCT 75.0
/* The replica issues the same ops as flux2_forward: on the CPU (f32) the outputs are identical. */
#define REPLICA_TOL_CPU 1e-5
#define REPLICA_TOL_GPU 2e-2

static void check_report(const char *tag, const bench_report *r, int reps, int is_cpu) {
    char nm[160];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    T_CHECK(NAME("%s: whole forward timed", tag), r->flux2.fwd_dev.n == reps && r->flux2.fwd_dev.med > 0 && r->flux2.fwd_model.n == reps &&
            r->flux2.fwd_model.med > 0 && r->flux2.fwd_model_warm_ms > 0, "replica n=%d med=%g, model n=%d med=%g", r->flux2.fwd_dev.n,
            r->flux2.fwd_dev.med, r->flux2.fwd_model.n, r->flux2.fwd_model.med);
    double tol = (is_cpu ? REPLICA_TOL_CPU : REPLICA_TOL_GPU) * (r->flux2.fwd_absmax > 1 ? r->flux2.fwd_absmax : 1);
    T_CHECK(NAME("%s: replica output = flux2_forward output", tag), r->flux2.fwd_maxdiff <= tol && r->flux2.fwd_absmax > 0,
            "max |diff| %g (tol %g, max |out| %g)", r->flux2.fwd_maxdiff, tol, r->flux2.fwd_absmax);

    /* ledger rows */
    int ok = r->n_ops == FLUX2_SB_COUNT;
    double sum = 0;
    for (int k = 0; ok && k < r->n_ops; k++) {
        if (!r->ops[k].name || r->ops[k].prefix.n != reps || !(r->ops[k].prefix.med > 0) || r->ops[k].direct.n != reps ||
            !(r->ops[k].direct.med >= 0))
            ok = 0;
        sum += r->ops[k].ms;
    }
    T_CHECK(NAME("%s: ledger has every op of the single block", tag), ok, "n_ops %d", r->n_ops);
    T_CHECK(NAME("%s: ledger ops add up to the block", tag), fabs(sum - r->block_ledger_ms) <= 1e-9 * (1 + sum),
            "sum %g vs block %g", sum, r->block_ledger_ms);
    double lsum = 0;
    int neg = 0;
    for (int k = 0; k < r->n_ops; k++) { lsum += r->ops[k].ledger_ms; if (r->ops[k].ledger_ms < 0) neg++; }
    T_CHECK(NAME("%s: shares' per-op basis adds up to the block, none negative", tag),
            fabs(lsum - r->block_ledger_ms) <= 1e-6 * (1 + lsum) && !neg && r->shares_basis[0],
            "sum %g vs block %g, %d negative (%s)", lsum, r->block_ledger_ms, neg, r->shares_basis);
    T_CHECK(NAME("%s: GEMM and attention work counted", tag), r->ops[1].gflop > 0 && r->ops[4].gflop > 0 && r->ops[6].gflop > 0,
            "gflop %g %g %g", r->ops[1].gflop, r->ops[4].gflop, r->ops[6].gflop);
    int full = 0, empty = 0;
    for (int i = 0; i < r->flux2.n_scale; i++) {
        if (r->flux2.scale[i].nd == r->flux2.c.num_layers && r->flux2.scale[i].ns == r->flux2.c.num_single_layers) full = 1;
        if (r->flux2.scale[i].nd == 0 && r->flux2.scale[i].ns == 0 && r->flux2.scale[i].t.med > 0) empty = 1;
    }
    T_CHECK(NAME("%s: block-count scaling points", tag), r->flux2.n_scale >= 3 && full && empty, "n_scale %d full %d empty %d",
            r->flux2.n_scale, full, empty);

    /* shares */
    const char *need[] = {"GEMM", "attention", "elementwise", "double blocks", "embedders", "unexplained remainder"};
    int have = 0;
    for (size_t j = 0; j < sizeof need / sizeof need[0]; j++)
        for (int i = 0; i < r->n_shares; i++)
            if (r->shares[i].level == 0 && strstr(r->shares[i].name, need[j])) { have++; break; }
    T_CHECK(NAME("%s: every share row present", tag), have == (int)(sizeof need / sizeof need[0]), "%d of %d rows",
            have, (int)(sizeof need / sizeof need[0]));
    double all = 0, attributed = 0;
    for (int i = 0; i < r->n_shares; i++) {
        if (r->shares[i].level) continue;
        all += r->shares[i].share;
        if (!strstr(r->shares[i].name, "remainder")) attributed += r->shares[i].share;
    }
    T_CHECK(NAME("%s: shares sum to 100%%", tag), fabs(all - 100.0) <= SHARE_SUM_TOL, "sum %.9g%%", all);
    T_CHECK(NAME("%s: attributed shares = 100%% - remainder", tag), fabs(attributed + r->remainder_share - 100.0) <= SHARE_SUM_TOL,
            "attributed %.6g%% + remainder %.6g%%", attributed, r->remainder_share);
    T_CHECK(NAME("%s: remainder is sane", tag), fabs(r->remainder_share) <= REMAINDER_MAX_PCT, "remainder %.1f%% (%.3f of %.3f ms)",
            r->remainder_share, r->remainder_ms, r->total_ms);

    /* utilization */
    ok = r->n_gemm >= 8;
    for (int i = 0; ok && i < r->n_gemm; i++) {
        const bench_gemm *g = &r->gemm[i];
        if (g->gflop <= 0 || g->ceil.n != reps || !(g->ceil.med > 0) || g->iso.n != reps || !(g->iso.med > 0) || g->ceil_bufs < 1)
            ok = 0;
    }
    T_CHECK(NAME("%s: utilization: every GEMM shape timed isolated and at the ceiling", tag), ok, "n_gemm %d", r->n_gemm);
    T_CHECK(NAME("%s: utilization: in-model GEMMs from the ledger", tag), r->gemm[0].inmodel_ms == r->ops[1].ledger_ms && r->gemm[1].inmodel_ms == r->ops[6].ledger_ms,
            "in-model %g", r->gemm[0].inmodel_ms);
    T_CHECK(NAME("%s: utilization: attention and copy bandwidth", tag), r->attn_iso.n == reps && r->attn_iso.med > 0 && r->copy_gbs > 0,
            "attention n=%d, copy %g GB/s", r->attn_iso.n, r->copy_gbs);

    /* arms */
    const char *arms[] = {"qpath", "rope", "mask", "gqa", "graph", "prefetch", "threads"};
    for (size_t j = 0; j < sizeof arms / sizeof arms[0]; j++) {
        int found = 0, bad = 0, skipped = 0;
        for (int i = 0; i < r->n_arms; i++) {
            const bench_arm *a = &r->arms[i];
            if (strcmp(a->arm, arms[j])) continue;
            found++;
            if (a->skipped) { skipped++; continue; }
            double t = a->tol * (a->ref_absmax > 0 ? a->ref_absmax : 1);
            if (a->sa.n != reps || a->sb.n != reps || !(a->ratio > 0) || !(a->maxdiff <= t) || !(a->ref_absmax > 0)) {
                bad++;
                printf("  arm %s %s: n %d/%d ratio %g maxdiff %g tol %g absmax %g\n", a->arm, a->what, a->sa.n, a->sb.n,
                       a->ratio, a->maxdiff, t, a->ref_absmax);
            }
        }
        int must_run = !(is_cpu && (!strcmp(arms[j], "graph") || !strcmp(arms[j], "prefetch"))) &&
                       !(!is_cpu && !strcmp(arms[j], "threads"));
        T_CHECK(NAME("%s: arm %s present, timed, outputs agree", tag, arms[j]), found && !bad && (!must_run || skipped < found),
                "found %d, bad %d, skipped %d", found, bad, skipped);
    }
#undef NAME
}

static void check_json(const char *tag, const char *path, const bench_report *r) {
    FILE *f = fopen(path, "r");
    char nm[160];
    snprintf(nm, sizeof nm, "%s: JSON lines written", tag);
    if (!f) { T_FAIL(nm, "cannot open %s", path); return; }
    T_PASS(nm);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lines = 0, bad = 0, n_setup = 0, n_fwd = 0, n_op = 0, n_share = 0, n_gemm = 0, n_arm = 0, n_scale = 0;
    double share_sum = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        lines++;
        json *j = json_parse(line, (size_t)len, path);
        if (!j || j->type != JSON_OBJECT || !json_get_str(j, "type")) { bad++; json_free(j); continue; }
        const char *t = json_get_str(j, "type");
        if (!strcmp(t, "setup")) n_setup++;
        else if (!strcmp(t, "forward")) n_fwd++;
        else if (!strcmp(t, "ledger_op")) { n_op++; if (json_get_num(j, "prefix_median_ms", -1) <= 0) bad++; }
        else if (!strcmp(t, "share")) { n_share++; if (json_get_int(j, "level", 1) == 0) share_sum += json_get_num(j, "share_pct", 0); }
        else if (!strcmp(t, "gemm")) { n_gemm++; if (json_get_num(j, "ceiling_tflops", -1) <= 0) bad++; }
        else if (!strcmp(t, "arm")) n_arm++;
        else if (!strcmp(t, "scale")) n_scale++;
        json_free(j);
    }
    free(line);
    fclose(f);
    snprintf(nm, sizeof nm, "%s: every JSON line parses and every record is there", tag);
    T_CHECK(nm, !bad && n_setup == 1 && n_fwd == 2 && n_op == r->n_ops && n_share == r->n_shares && n_gemm == r->n_gemm &&
            n_arm == r->n_arms && n_scale == r->flux2.n_scale && fabs(share_sum - 100) < 1e-3,
            "%d lines, %d bad, setup %d forward %d ops %d shares %d (sum %.4f) gemm %d arms %d scale %d", lines, bad, n_setup,
            n_fwd, n_op, n_share, share_sum, n_gemm, n_arm, n_scale);
}

static void run_suite(const char *backend, int is_cpu) {
    bench_opts o;
    bench_opts_default(&o);
    o.preset = "tiny";
    o.backend = backend;
    o.image_size = 64;     /* 16 image tokens */
    o.text_tokens = 8;
    o.reps = 3;
    o.warmup = 1;
    o.l2_mb = 0.5;         /* small rotations: the test checks completeness, not speed */
    o.arm_tokens[0] = 16;
    o.arm_tokens[1] = 32;
    o.n_arm_tokens = 2;
    char json_path[256];
    snprintf(json_path, sizeof json_path, "%s/ditrun-test-bench-%d-%s.jsonl", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), backend);
    o.json_path = json_path;
    bench_report *r = calloc(1, sizeof *r);
    char nm[64];
    snprintf(nm, sizeof nm, "%s: bench runs (tiny)", backend);
    int lvl = dt_log_level;
    dt_log_level = 0;
    int rc = bench_run(&o, r);
    dt_log_level = lvl;
    if (rc) { T_FAIL(nm, "%s", dt_last_error()); free(r); return; }
    T_PASS(nm);
    check_report(backend, r, o.reps, is_cpu);
    snprintf(nm, sizeof nm, "%s: JSON lines written", backend);
    if (bench_report_json(r, json_path)) T_FAIL(nm, "%s", dt_last_error());
    else check_json(backend, json_path, r);
    unlink(json_path);
    /* the markdown has every section */
    char *buf = NULL;
    size_t blen = 0;
    FILE *m = open_memstream(&buf, &blen);
    bench_report_markdown(r, m);
    fclose(m);
    const char *sec[] = {"## Whole forward", "## Ledger: one single block", "## Ledger: block-count scaling",
                         "## Ledger: shares", "## Utilization", "## A/B arms", "unexplained remainder", "**total**",
                         "**Floor from this run's ceilings**"};
    int missing = -1;
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++)
        if (!strstr(buf, sec[i])) { missing = (int)i; break; }
    snprintf(nm, sizeof nm, "%s: markdown has every section", backend);
    T_CHECK(nm, missing < 0, "missing '%s'", missing >= 0 ? sec[missing] : "");
    if (!is_cpu) {   /* a GPU run also measures the ceilings under sustained load and prints both floors */
        int n_sus = 0;
        for (int i = 0; i < r->n_gemm; i++) n_sus += r->gemm[i].ceil_sus.n > 0 && r->gemm[i].ceil_sus.med > 0;
        snprintf(nm, sizeof nm, "%s: sustained ceilings and both floors", backend);
        T_CHECK(nm, n_sus == r->n_gemm && r->attn_sus.n > 0 && r->attn_sus.med > 0 && strstr(buf, "; sustained "),
                "%d of %d GEMM shapes with a sustained ceiling, attention %d samples", n_sus, r->n_gemm, r->attn_sus.n);
    }
    free(buf);
    free(r);
}

static void run_cli(void) {
    const char *b = getenv("BUILD");
    char exe[512], cmd[1400];
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    if (access(exe, X_OK)) { T_SKIP("cli: bench", "%s not built", exe); return; }
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny --backend cpu --image-size 32 --text-tokens 4 --reps 2 --warmup 0 "
             "--only ledger --l2-mb 0.5 -q 2>&1", exe);
    FILE *p = popen(cmd, "r");
    char *out = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&out, &n);
    char line[4096];
    while (p && fgets(line, sizeof line, p)) fputs(line, m);
    int st = p ? pclose(p) : -1;
    fclose(m);
    T_CHECK("cli: bench --only ledger prints the ledger tables", st == 0 && strstr(out, "## Ledger: shares") &&
            !strstr(out, "## A/B arms"), "status %d, output:\n%s", st, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s bench --preset krea2 --format f32 --backend cpu 2>&1", exe);   /* krea2: bf16/q4/q8 only */
    p = popen(cmd, "r");
    int lines = 0, named = 0;
    while (p && fgets(line, sizeof line, p)) { lines++; if (strstr(line, "ditrun: error:") && strstr(line, "krea2")) named = 1; }
    st = p ? pclose(p) : -1;
    T_CHECK("cli: bench --preset krea2 --format f32 fails with one line", st != 0 && named && lines == 1, "status %d, %d lines", st, lines);
    snprintf(cmd, sizeof cmd, "%s bench --format q5 2>&1", exe);
    p = popen(cmd, "r");
    named = 0;
    while (p && fgets(line, sizeof line, p)) if (strstr(line, "ditrun: error:") && strstr(line, "q5")) named = 1;
    st = p ? pclose(p) : -1;
    T_CHECK("cli: bench --format q5 fails naming the value", st != 0 && named, "status %d", st);
}

/* bench_time_interleaved: every variant runs once per round, in a rotating order (each variant takes each position
 * equally often: the arms' guard against the order bias measured under the power cap), and sample r of variant v
 * is what its run in timed round r returned. The fake timer returns 1000 * round + 10 * position + variant. */
typedef struct { int calls, nv; } order_rec;
static double order_time(void *p, int v) {
    order_rec *o = p;
    int round = o->calls / o->nv, pos = o->calls % o->nv;
    o->calls++;
    return 1000.0 * round + 10.0 * pos + v;
}
static void test_interleaved_order(void) {
    for (int nv = 2; nv <= 3; nv++) {
        order_rec o = {0, nv};
        const int reps = 6, warmup = 2;
        double *s = bench_time_interleaved(nv, reps, warmup, order_time, &o);
        int ok = o.calls == nv * (reps + warmup), pos[3][3] = {{0}};
        for (int v = 0; v < nv; v++)
            for (int r = 0; r < reps; r++) {
                int x = (int)s[v * reps + r], round = x / 1000, p = (x % 1000) / 10, vv = x % 10;
                ok &= vv == v && round == r + warmup && p < nv;
                if (p < nv) pos[v][p]++;
            }
        for (int v = 0; v < nv; v++)
            for (int p = 0; p < nv; p++) ok &= pos[v][p] == reps / nv;
        char nm[96];
        snprintf(nm, sizeof nm, "bench_time_interleaved: %d variants rotate, samples in place", nv);
        T_CHECK(nm, ok, "calls %d (want %d)", o.calls, nv * (reps + warmup));
        free(s);
    }
}

/* --attn-precision fp8 on the CPU (its emulation), tiny geometry, ledger only: the replica's blocks attend in fp8
 * as flux2_load's do (it once ran bf16 attention and differed from flux2_forward), and the report says so. */
/* bench_run on the tiny preset on the CPU (64 px, 8 text tokens, one repetition) with the given sections and DiT
 * precisions, quietly; 0 or -1 (dt_last_error). */
static int run_tiny_cpu(bench_report *r, unsigned sections, int warmup, dt_precision lin, dt_precision attn) {
    bench_opts o;
    bench_opts_default(&o);
    o.preset = "tiny";
    o.backend = "cpu";
    o.image_size = 64;
    o.text_tokens = 8;
    o.reps = 1;
    o.warmup = warmup;
    o.l2_mb = 0.5;
    o.sections = sections;
    o.precision = lin;
    o.attn_precision = attn;
    int lvl = dt_log_level;
    dt_log_level = 0;
    int rc = bench_run(&o, r);
    dt_log_level = lvl;
    return rc;
}

static void test_attn_fp8_replica(void) {
    bench_report *r = calloc(1, sizeof *r);
    int rc = run_tiny_cpu(r, BENCH_LEDGER, 1, DT_PREC_BF16, DT_PREC_FP8);
    if (rc) T_FAIL("bench --attn-precision fp8 (cpu, tiny)", "%s", dt_last_error());
    else T_CHECK("bench --attn-precision fp8: replica output = flux2_forward output, precision reported",
                 r->flux2.fwd_maxdiff == 0 && r->flux2.fwd_absmax > 0 && strstr(r->precision, "attention fp8"),
                 "max |diff| %g (max |out| %g), precision '%s'", r->flux2.fwd_maxdiff, r->flux2.fwd_absmax, r->precision);
    free(r);
}

/* --precision fp8 --attn-precision fp8, utilization only (CPU emulation, tiny geometry): the blocks' GEMM shapes take
 * the fp8 Linear as their ceiling, the embedders the bf16 GEMM, and the floor's attention is the fp8 one, so the
 * floor compares the forward with what its own precision can reach (it once used the bf16 ceilings: "-22%"). */
static void test_fp8_ceilings(void) {
    bench_report *r = calloc(1, sizeof *r);
    int rc = run_tiny_cpu(r, BENCH_UTIL, 0, DT_PREC_FP8, DT_PREC_FP8);
    if (rc) {
        T_FAIL("bench --precision fp8 ceilings (cpu, tiny)", "%s", dt_last_error());
    } else {
        int blocks = 0, blocks8 = 0, others8 = 0;
        for (int i = 0; i < r->n_gemm; i++) {
            int blk = !strncmp(r->gemm[i].name, "single", 6) || !strncmp(r->gemm[i].name, "double", 6);
            blocks += blk;
            blocks8 += blk && r->gemm[i].ceil_fp8;
            others8 += !blk && r->gemm[i].ceil_fp8;
        }
        T_CHECK("bench --precision fp8: blocks' GEMM ceilings are fp8 Linears, embedders' bf16, attention fp8",
                blocks > 0 && blocks8 == blocks && others8 == 0 && r->attn_fp8 && r->attn_iso.n > 0,
                "%d of %d block shapes fp8, %d other shapes fp8, attention fp8 %d", blocks8, blocks, others8, r->attn_fp8);
    }
    free(r);
}

/* The Krea 2 family through the same bench_run (krea2-tiny, synthetic bf16 weights in a private cache folder): the
 * whole forward with and without the text mask, the block functions checked against krea2_forward's traced blocks,
 * the 13-op transformer-block ledger adding up, scaling, shares = 100 %, utilization of the 5 GEMM shapes and the
 * masked GQA attention, the gqa and key-padding arms agreeing, JSON lines and markdown sections. */
static void run_krea2_suite(const char *backend, int is_cpu) {
    char nm[160], cache[512], jp[600];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    const char *tmp = getenv("TMPDIR");
    snprintf(cache, sizeof cache, "%s/ditrun-test-bench-k2-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    snprintf(jp, sizeof jp, "%s.jsonl", cache);
    bench_opts o;
    bench_opts_default(&o);
    o.preset = "krea2-tiny";
    o.backend = backend;
    o.format = BENCH_FMT_BF16;
    o.image_size = 64;
    o.text_tokens = 12;
    o.reps = 3;
    o.warmup = 1;
    o.l2_mb = 0.5;
    o.cache_dir = cache;
    bench_report *r = calloc(1, sizeof *r);
    int lvl = dt_log_level;
    dt_log_level = 0;
    int rc = bench_run(&o, r);
    dt_log_level = lvl;
    if (rc) { T_FAIL(NAME("%s krea2: bench runs (krea2-tiny)", backend), "%s", dt_last_error()); free(r); return; }
    T_CHECK(NAME("%s krea2: bench runs (krea2-tiny) as the Krea 2 family", backend), r->family == &bench_krea2_family,
            "family %s", r->family ? r->family->name : "none");
    const bench_krea2_part *p = &r->krea2;
    T_CHECK(NAME("%s krea2: whole forward with and without mask timed, finite", backend), p->fwd_mask.n == 3 &&
            p->fwd_nomask.n == 3 && p->fwd_mask.med > 0 && p->out_finite && p->mask_effect > 0 && p->n_valid < r->n_txt &&
            p->blocks_dev.n == 3, "n %d/%d finite %d mask effect %g", p->fwd_mask.n, p->fwd_nomask.n, p->out_finite,
            p->mask_effect);
    double rtol = (is_cpu ? REPLICA_TOL_CPU : REPLICA_TOL_GPU) * (p->replica_absmax > 1 ? p->replica_absmax : 1);
    T_CHECK(NAME("%s krea2: the bench's blocks = krea2_forward's blocks", backend), p->replica_checked &&
            p->replica_maxdiff <= rtol && p->replica_absmax > 0, "max |diff| %g (max %g)", p->replica_maxdiff, p->replica_absmax);
    int ok = r->n_ops == KREA2_OP_COUNT;
    double sum = 0, lsum = 0;
    for (int k = 0; ok && k < r->n_ops; k++) {
        if (!r->ops[k].name || r->ops[k].prefix.n != 3 || !(r->ops[k].prefix.med > 0) || r->ops[k].direct.n != 3 || r->ops[k].ledger_ms < 0)
            ok = 0;
        sum += r->ops[k].ms;
        lsum += r->ops[k].ledger_ms;
    }
    T_CHECK(NAME("%s krea2: ledger has the 13 ops of a block, adding up", backend), ok &&
            fabs(sum - r->block_ledger_ms) <= 1e-9 * (1 + sum) && fabs(lsum - r->block_ledger_ms) <= 1e-6 * (1 + lsum),
            "n_ops %d, sum %g / %g vs %g", r->n_ops, sum, lsum, r->block_ledger_ms);
    T_CHECK(NAME("%s krea2: GEMM and attention work counted", backend), r->ops[KREA2_OP_QKVG].gflop > 0 &&
            r->ops[KREA2_OP_ATTN].gflop > 0 && r->ops[KREA2_OP_MLPIN].gflop > 0 && r->ops[KREA2_OP_DOWN].gflop > 0, "gflop missing");
    double all = 0;
    for (int i = 0; i < r->n_shares; i++) if (!r->shares[i].level) all += r->shares[i].share;
    T_CHECK(NAME("%s krea2: shares sum to 100%%", backend), r->n_shares >= 6 && fabs(all - 100.0) <= SHARE_SUM_TOL,
            "sum %.9g%% (%d rows)", all, r->n_shares);
    T_CHECK(NAME("%s krea2: block-count scaling", backend), p->scale.n >= 2 && p->scale.blocks[p->scale.n - 1] == p->c.num_layers,
            "n_scale %d", p->scale.n);
    ok = r->n_gemm == 5 && r->attn_iso.n == 3 && r->attn_calls == p->c.num_layers && r->copy_gbs > 0;
    for (int i = 0; ok && i < r->n_gemm; i++) ok = r->gemm[i].iso.n == 3 && r->gemm[i].ceil.n == 3 && r->gemm[i].inmodel_ms > 0;
    /* the q/k/v/gate op's time split over its two shapes (2 GEMMs each per block) adds back up to the op */
    double qkvg = 2 * (r->gemm[0].inmodel_ms + r->gemm[1].inmodel_ms);
    T_CHECK(NAME("%s krea2: utilization of every GEMM shape, attention, copy", backend), ok &&
            fabs(qkvg - r->ops[KREA2_OP_QKVG].ledger_ms) <= 1e-9 * (1 + qkvg), "n_gemm %d, q/k/v/gate %g vs %g", r->n_gemm,
            qkvg, r->ops[KREA2_OP_QKVG].ledger_ms);
    int gqa = 0, mask = 0, bad = 0;
    for (int i = 0; i < r->n_arms; i++) {
        const bench_arm *a = &r->arms[i];
        if (a->skipped) { bad++; continue; }
        if (!strcmp(a->arm, "gqa")) gqa++;
        if (!strcmp(a->arm, "mask")) mask++;
        if (a->sa.n != 3 || a->sb.n != 3 || !(a->ratio > 0) || (!isinf(a->tol) && !(a->maxdiff <= a->tol * (a->ref_absmax > 0 ? a->ref_absmax : 1))))
            bad++;
    }
    T_CHECK(NAME("%s krea2: text encode and VAE decode timed on the synthetic text encoder and VAE", backend),
            p->parts && p->te_enc.n == 3 && p->te_enc.med > 0 && p->vae_dec.n == 3 && p->vae_dec.med > 0 &&
            p->te_tokens == 34 + 12 && p->lat_h == 2 * (64 / 16) && p->gflop_te > 0 && p->gflop_vae > 0,
            "parts %d (%s), n %d/%d, rows %d, latent %d", p->parts, p->parts_note, p->te_enc.n, p->vae_dec.n, p->te_tokens,
            p->lat_h);
    T_CHECK(NAME("%s krea2: arms gqa (native/repeated/pre-repeated) and mask (bias/compacted/none) agree", backend),
            gqa == 2 && mask == 2 && !bad, "gqa %d mask %d bad %d", gqa, mask, bad);
    rc = bench_report_json(r, jp);
    FILE *f = rc ? NULL : fopen(jp, "r");
    int lines = 0, badl = 0, ops = 0, fwd = 0, parts = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while (f && (len = getline(&line, &cap, f)) > 0) {
        lines++;
        json *j = json_parse(line, (size_t)len, jp);
        const char *t = j ? json_get_str(j, "type") : NULL;
        if (!t) badl++;
        else if (!strcmp(t, "ledger_op")) ops++;
        else if (!strcmp(t, "forward")) fwd++;
        else if (!strcmp(t, "image_part")) parts++;
        json_free(j);
    }
    free(line);
    if (f) fclose(f);
    T_CHECK(NAME("%s krea2: JSON lines parse", backend), f && !badl && ops == KREA2_OP_COUNT && fwd == 3 && parts == 2 &&
            lines > 20, "lines %d bad %d ops %d forward %d image parts %d", lines, badl, ops, fwd, parts);
    unlink(jp);
    char *buf = NULL;
    size_t blen = 0;
    FILE *mf = open_memstream(&buf, &blen);
    bench_report_markdown(r, mf);
    fclose(mf);
    const char *sec[] = {"## Whole forward", "## Ledger: one transformer block", "## Ledger: block-count scaling",
                         "## Ledger: shares", "## Utilization", "## A/B arms", "**total**", "(Krea 2)",
                         "## The rest of the image", "| text encode: Qwen3-VL", "| VAE decode: Qwen-Image"};
    int missing = -1;
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++) if (!strstr(buf, sec[i])) { missing = (int)i; break; }
    T_CHECK(NAME("%s krea2: markdown has every section", backend), missing < 0, "missing '%s'", missing >= 0 ? sec[missing] : "");
    free(buf);
    /* the cached checkpoint */
    const char *src = strchr(r->source, '(');
    char dir[600] = "";
    if (src) snprintf(dir, sizeof dir, "%.*s", (int)strlen(src + 1) - 1, src + 1);
    if (dir[0]) bench_remove_checkpoint(dir);
    if (r->krea2.parts_src[0]) bench_remove_checkpoint(r->krea2.parts_src);   /* the text encoder and VAE */
    rmdir(cache);
    free(r);
#undef NAME
}

/* --model picks the family from config.json: the Krea 2 fixture pipeline (ledger only, one repetition) runs as Krea 2
 * and its block functions reproduce krea2_forward's blocks. */
static void test_krea2_model_dir(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/krea2", t_fixtures());
    bench_opts o;
    bench_opts_default(&o);
    o.model_dir = dir;
    o.backend = "cpu";
    o.image_size = 32;
    o.text_tokens = 6;
    o.reps = 1;
    o.warmup = 0;
    o.l2_mb = 0.5;
    o.sections = BENCH_LEDGER;
    bench_report *r = calloc(1, sizeof *r);
    int lvl = dt_log_level;
    dt_log_level = 0;
    int rc = bench_run(&o, r);
    dt_log_level = lvl;
    if (rc) T_FAIL("bench --model (Krea 2 fixture)", "%s", dt_last_error());
    else
        T_CHECK("bench --model (Krea 2 fixture): the Krea 2 family, blocks = krea2_forward's, ledger of 13 ops",
                r->family == &bench_krea2_family && !strcmp(r->preset, "checkpoint") && r->krea2.replica_checked &&
                r->krea2.replica_maxdiff <= REPLICA_TOL_CPU * (r->krea2.replica_absmax > 1 ? r->krea2.replica_absmax : 1) &&
                r->n_ops == KREA2_OP_COUNT && r->ops[0].prefix.n == 1,
                "family %s, preset %s, checked %d, max |diff| %g, ops %d", r->family ? r->family->name : "none", r->preset,
                r->krea2.replica_checked, r->krea2.replica_maxdiff, r->n_ops);
    /* the fixture is a pipeline folder: its text encoder (taps 1, 2, 4 of model_index.json) and VAE timed too */
    const bench_krea2_part *p = &r->krea2;
    if (!rc)
        T_CHECK("bench --model (Krea 2 fixture): text encode and VAE decode timed from the pipeline folder",
                p->parts && p->te_enc.n == 1 && p->te_enc.med > 0 && p->vae_dec.n == 1 && p->vae_dec.med > 0 &&
                p->te_layers == 4 && p->te_tokens == 34 + 6 && p->gflop_te > 0 && p->gflop_vae > 0 &&
                p->lat_h == 2 * (32 / 16) && p->vae_scale == 4,
                "parts %d (%s), n %d/%d, layers %d, rows %d, latent %dx%d scale %d", p->parts, p->parts_note, p->te_enc.n,
                p->vae_dec.n, p->te_layers, p->te_tokens, p->lat_w, p->lat_h, p->vae_scale);
    free(r);
}

/* The VAE decode's work as the bench counts it, for the released Qwen-Image VAE (base 96, z 16, dim_mult 1 2 4 4, 2
 * res blocks) at a 128x128 latent (a 1024^2 image): 4710.245 GFLOP, counted layer by layer independently (every conv
 * as cout x cin x k^2 x pixels at its resolution, the mid-block attention's two hw x hw x 384 products). */
#define QVAE_GFLOP_1024 4710.24533504
#define QVAE_GFLOP_TOL 1e-9   /* relative: the same sums in double */
static void test_qvae_gflop(void) {
    static dt_qvae_config c;   /* (static: 2 KB of latent statistics) */
    c.base_dim = 96;
    c.z_dim = 16;
    c.n_mult = 4;
    const int mult[4] = {1, 2, 4, 4};
    memcpy(c.dim_mult, mult, sizeof mult);
    c.num_res_blocks = 2;
    c.scale_factor = 8;
    double g = dt_qvae_decode_gflop(&c, 128, 128);
    T_CHECK("bench: Qwen-Image VAE decode work at 1024^2 = the layer-by-layer count",
            fabs(g - QVAE_GFLOP_1024) <= QVAE_GFLOP_TOL * QVAE_GFLOP_1024, "%.6f GFLOP vs %.6f", g, QVAE_GFLOP_1024);
}

int main(void) {
    test_interleaved_order();
    test_attn_fp8_replica();
    test_fp8_ceilings();
    test_krea2_model_dir();
    test_qvae_gflop();
    const char *e = getenv("DITRUN_BENCH");
    if (!e || strcmp(e, "1")) {
        T_SKIP("bench suites", "set DITRUN_BENCH=1 to run them (tiny geometry, about a minute on CPU)");
        return T_DONE();
    }
    run_suite("cpu", 1);
    run_krea2_suite("cpu", 1);
    if (dt_backend_cuda_available()) {
        run_suite("cuda", 0);
        run_krea2_suite("cuda", 0);
    } else if (t_require_gpu_env()) {
        T_FAIL("cuda: bench suites", "DITRUN_REQUIRE_GPU=1 but no usable GPU");
    } else {
        T_SKIP("cuda: bench suites", "no usable CUDA GPU");
    }
    run_cli();
    return T_DONE();
}
