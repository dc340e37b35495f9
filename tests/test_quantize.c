/* test_quantize.c — `ditrun quantize` (src/export/quantize_file.c) on the fixture transformer:
 * the min/max rule reproduces the fixture's q4/q8 files (packed values, scales, biases) and their forward
 * outputs; the MLX rule's whole-model weight error is reported next to the min/max rule's; --keep and
 * widths that the group does not divide stay dense; config.json and metadata; the CLI end to end.
 * DITRUN_SLOW=1 adds a synthetic klein-4B bf16 checkpoint (7.8 GB) quantized to q4 g64 with the peak
 * resident memory, the output size and the count of U32 tensors checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flux2_fixture_io.h"
#include "io/weights.h"
#include "export/quantize_file.h"
#include "synth/synth_dit.h"

/* The fixture files were produced by the min/max rule in float32 (numpy/torch); another order of
 * operations can flip a value lying exactly on a rounding boundary: allow 0.1% of weights to differ. */
#define MIN_MATCH_FRACTION 0.999
/* klein-4B geometry q4 g64 from a 7.8 GB bf16 input: the bound on peak resident memory. */
#define SLOW_RSS_LIMIT_GB 2.0

static char tmpdir[256];
static const char *exe_path(void) {
    static char exe[512];
    const char *b = getenv("BUILD");
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    return exe;
}

/* Count, over every U32 weight of REF, the packed values (and scales, biases) equal in GOT. */
static void compare_packed(const char *tag, const char *got_file, const char *ref_file, int bits) {
    st_file *g = st_open(got_file), *r = st_open(ref_file);
    char name[400];
    if (!g || !r) { snprintf(name, sizeof name, "%s packed values", tag); T_FAIL(name, "%s", dt_last_error()); st_close(g); st_close(r); return; }
    uint64_t vals = 0, same = 0, sb = 0, sb_same = 0;
    int tensors = 0, missing = 0;
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    for (size_t i = 0; i < st_count(r); i++) {
        const st_tensor *rt = st_at(r, i), *gt = st_find(g, rt->name);
        if (!gt || gt->dtype != rt->dtype || gt->numel != rt->numel) { missing++; continue; }
        if (rt->dtype == DT_U32) {
            tensors++;
            const uint32_t *a = gt->data, *b = rt->data;
            for (int64_t k = 0; k < rt->numel; k++)
                for (int e = 0; e < per; e++) {
                    vals++;
                    same += ((a[k] >> (e * bits)) & mask) == ((b[k] >> (e * bits)) & mask);
                }
        } else if (strstr(rt->name, ".scales") || strstr(rt->name, ".biases")) {
            const uint16_t *a = gt->data, *b = rt->data;
            for (int64_t k = 0; k < rt->numel; k++) { sb++; sb_same += a[k] == b[k]; }
        }
    }
    double f = vals ? (double)same / vals : 0, fs = sb ? (double)sb_same / sb : 0;
    printf("INFO %s: %d U32 tensors, %llu of %llu packed values equal (%.4f%%), scales+biases %.4f%% equal\n", tag, tensors,
           (unsigned long long)same, (unsigned long long)vals, 100 * f, 100 * fs);
    snprintf(name, sizeof name, "%s all fixture tensors present", tag);
    T_CHECK(name, missing == 0 && tensors > 0, "%d tensors of %s missing or of another dtype/shape", missing, ref_file);
    snprintf(name, sizeof name, "%s packed values match the fixture (>= %.1f%%)", tag, 100 * MIN_MATCH_FRACTION);
    T_CHECK(name, f >= MIN_MATCH_FRACTION, "only %.4f%% equal", 100 * f);
    snprintf(name, sizeof name, "%s scales and biases match the fixture (>= %.1f%%)", tag, 100 * MIN_MATCH_FRACTION);
    T_CHECK(name, fs >= MIN_MATCH_FRACTION, "only %.4f%% equal", 100 * fs);
    st_close(g);
    st_close(r);
}

static int quantize(const char *out_dir, int bits, int group, mlx_rule rule, const char *keep, dt_quant_stats *st) {
    char in[512], out[600];
    snprintf(in, sizeof in, "%s/model/transformer", t_fixtures());
    mkdir(out_dir, 0755);
    snprintf(out, sizeof out, "%s/model.safetensors", out_dir);
    dt_quant_opts o;
    dt_quant_opts_default(&o);
    o.bits = bits; o.group = group; o.rule = rule; o.report = 0; o.threads = 2;
    if (keep) { o.keep[0] = keep; o.n_keep = 1; }
    return dt_quantize_checkpoint(in, out, &o, st);
}

static void fixture_rule(int bits, double *minmax_err) {
    char dir[400], name[200], got[512], ref[512], exp[512];
    snprintf(dir, sizeof dir, "%s/q%d-minmax", tmpdir, bits);
    dt_quant_stats st;
    snprintf(name, sizeof name, "quantize minmax q%d g32", bits);
    if (quantize(dir, bits, 32, MLX_RULE_MINMAX, NULL, &st)) { T_FAIL(name, "%s", dt_last_error()); return; }
    T_CHECK(name, st.n_quantized == 25 && st.n_copied == 8 && st.n_kept == 0 && st.wrote_config,
            "%d quantized, %d copied, %d kept, config %d (want 25, 8, 0, 1)", st.n_quantized, st.n_copied, st.n_kept, st.wrote_config);
    *minmax_err = st.rel_err;
    snprintf(got, sizeof got, "%s/model.safetensors", dir);
    snprintf(ref, sizeof ref, "%s/transformer-q%d/model.safetensors", t_fixtures(), bits);
    snprintf(name, sizeof name, "quantize minmax q%d g32", bits);
    compare_packed(name, got, ref, bits);
    snprintf(exp, sizeof exp, "%s/transformer-q%d/expected_out.safetensors", t_fixtures(), bits);
    snprintf(name, sizeof name, "quantize minmax q%d g32 forward vs fixture expected_out", bits);
    fx_forward_check(name, dir, exp, FIXTURE_FORWARD_TOL);
    /* file-level format: metadata and config.json */
    st_file *f = st_open(got);
    const char *q = f ? st_metadata(f, "quantization") : NULL, *fmt = f ? st_metadata(f, "format") : NULL;
    char want[96];
    snprintf(want, sizeof want, "{\"group_size\": 32, \"bits\": %d, \"mode\": \"affine\"}", bits);
    snprintf(name, sizeof name, "quantize q%d metadata", bits);
    T_CHECK(name, q && fmt && !strcmp(q, want) && !strcmp(fmt, "mlx"), "quantization=%s format=%s", q ? q : "(none)", fmt ? fmt : "(none)");
    st_close(f);
    dt_weights *w = dt_weights_open(dir);
    const json *cfg = w ? dt_weights_config(w) : NULL, *qc = json_get(cfg, "quantization");
    snprintf(name, sizeof name, "quantize q%d config.json beside the output", bits);
    T_CHECK(name, qc && json_get_int(qc, "bits", 0) == bits && json_get_int(qc, "group_size", 0) == 32 &&
                      json_get_int(cfg, "num_single_layers", 0) == 2,
            "config.json missing or without quantization {bits %d, group_size 32}", bits);
    dt_weights_close(w);
}

static void mlx_rule_vs_minmax(double minmax_err) {
    char dir[400], io[512];
    dt_quant_stats st;
    snprintf(dir, sizeof dir, "%s/q4-mlx", tmpdir);
    if (quantize(dir, 4, 32, MLX_RULE_MLX, NULL, &st)) { T_FAIL("quantize mlx rule q4 g32", "%s", dt_last_error()); return; }
    printf("INFO whole-model weight rel error q4 g32: mlx rule %.5e, minmax rule %.5e (worst tensor %.5e %s)\n", st.rel_err,
           minmax_err, st.worst_rel, st.worst_name);
    /* both rules spend 16 levels on [min, max]; the MLX rule's exact edge costs at most a little */
    T_CHECK("quantize mlx rule error close to minmax", st.rel_err > 0 && st.rel_err < 1.25 * minmax_err,
            "mlx %.4g vs minmax %.4g", st.rel_err, minmax_err);
    /* the MLX-rule file runs; its output is near the bf16 model's (4-bit weights: a few percent) */
    snprintf(io, sizeof io, "%s/transformer_io.safetensors", t_fixtures());
    double e = fx_forward_check("quantize mlx rule q4 forward near the bf16 output (0.25)", dir, io, 0.25);
    printf("INFO q4 g32 mlx-rule forward vs bf16 reference: rel L2 %.4g\n", e);
}

static void keep_and_groups(void) {
    char dir[400], io[512], p[512];
    dt_quant_stats st;
    snprintf(io, sizeof io, "%s/transformer_io.safetensors", t_fixtures());
    /* --keep: glob and substring patterns */
    snprintf(dir, sizeof dir, "%s/q4-keep", tmpdir);
    if (quantize(dir, 4, 32, MLX_RULE_MINMAX, "*_embedder.weight", &st)) { T_FAIL("quantize --keep", "%s", dt_last_error()); return; }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_file *f = st_open(p);
    const st_tensor *x = f ? st_find(f, "x_embedder.weight") : NULL, *c = f ? st_find(f, "context_embedder.weight") : NULL,
                    *q = f ? st_find(f, "proj_out.weight") : NULL;
    T_CHECK("quantize --keep '*_embedder.weight' keeps both embedders dense", x && c && q && x->dtype == DT_BF16 &&
                c->dtype == DT_BF16 && q->dtype == DT_U32 && !st_find(f, "x_embedder.scales") && st.n_kept == 2,
            "x_embedder %s, context_embedder %s, proj_out %s, kept %d", x ? dt_dtype_name(x->dtype) : "-",
            c ? dt_dtype_name(c->dtype) : "-", q ? dt_dtype_name(q->dtype) : "-", st.n_kept);
    st_close(f);
    fx_forward_check("quantize --keep mixed dense+q4 forward near bf16 (0.25)", dir, io, 0.25);
    T_CHECK("keep pattern: substring", dt_quant_keep_match("proj_out", "proj_out.weight") && !dt_quant_keep_match("proj_in", "proj_out.weight"), "substring match");
    T_CHECK("keep pattern: glob", dt_quant_keep_match("single_*.to_out.*", "single_transformer_blocks.1.attn.to_out.weight") &&
                                      !dt_quant_keep_match("single_*.to_q*", "single_transformer_blocks.1.attn.to_out.weight"), "glob match");
    /* group 128: x_embedder (32 inputs) and context_embedder (96) stay dense; q8 g128 for the rest */
    snprintf(dir, sizeof dir, "%s/q8-g128", tmpdir);
    if (quantize(dir, 8, 128, MLX_RULE_MLX, NULL, &st)) { T_FAIL("quantize q8 g128", "%s", dt_last_error()); return; }
    T_CHECK("quantize q8 g128: embedders with 32 and 96 inputs stay dense", st.n_quantized == 23 && st.n_kept == 2, "%d quantized, %d kept",
            st.n_quantized, st.n_kept);
    printf("INFO q8 g128 mlx rule whole-model weight rel error %.5e\n", st.rel_err);
    fx_forward_check("quantize q8 g128 forward near bf16 (0.02)", dir, io, 0.02);
}

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void cli(void) {
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd, "%s quantize --input %s/model --output %s/cli/q4.safetensors --bits 4 --group-size 32 --rule minmax -q 2>&1",
             exe_path(), t_fixtures(), tmpdir);
    char d[400];
    snprintf(d, sizeof d, "%s/cli", tmpdir);
    mkdir(d, 0755);
    int rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("cli quantize (pipeline root -> transformer/)", rc == 0 && strstr(out, "quantized 25 Linears") && strstr(out, "whole-model weight rel error"),
            "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s info %s/cli/q4.safetensors 2>&1", exe_path(), tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("cli info on the quantized file", rc == 0 && strstr(out, "25 Linears, MLX affine 4-bit, group 32") && strstr(out, "D=256"),
            "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s forward --model %s/cli/q4.safetensors --inputs %s/transformer_io.safetensors --output %s/cli/out.safetensors -q --backend cpu 2>&1",
             exe_path(), tmpdir, t_fixtures(), tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    if (rc) T_FAIL("cli forward on the quantized single file", "exit %d: %s", rc, out);
    else {
        char got[512], exp[512];
        size_t n1 = 0, n2 = 0;
        snprintf(got, sizeof got, "%s/cli/out.safetensors", tmpdir);
        snprintf(exp, sizeof exp, "%s/transformer-q4/expected_out.safetensors", t_fixtures());
        float *a = fx_reference(got, &n1), *b = fx_reference(exp, &n2);
        if (a && b && n1 == n2) t_check_rel_l2("cli forward on the quantized single file", a, b, n1, FIXTURE_FORWARD_TOL);
        else T_FAIL("cli forward on the quantized single file", "outputs unreadable");
        free(a); free(b);
    }
    /* errors: one line, exit 1 */
    snprintf(cmd, sizeof cmd, "%s quantize --input %s/model --output %s/cli/x.safetensors --bits 3 2>&1", exe_path(), t_fixtures(), tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("cli quantize --bits 3 is an error", rc == 1 && strstr(out, "ditrun: error:") && strstr(out, "--bits"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s quantize --input /nonexistent/ditrun-q --output %s/cli/x.safetensors 2>&1", exe_path(), tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("cli quantize missing input is an error", rc == 1 && strstr(out, "/nonexistent/ditrun-q"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s quantize --input %s/model --output %s/cli/x.bin 2>&1", exe_path(), t_fixtures(), tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("cli quantize output must be .safetensors", rc == 1 && strstr(out, ".safetensors"), "exit %d: %s", rc, out);
}

/* DITRUN_SLOW=1: klein-4B bf16 (7.8 GB) -> q4 g64 through the CLI, peak RSS of that process. */
static void slow_klein4b(void) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[512], out[600], cmd[1400];
    snprintf(dir, sizeof dir, "%s/ditrun-q-klein4b-bf16-%d", tmp, (int)getpid());
    snprintf(out, sizeof out, "%s/klein4b-q4g64.safetensors", dir);
    flux2_config c;
    flux2_preset("klein-4b", &c);
    double t0 = dt_now();
    if (flux2_synth_write(&c, dir, 0, 64, 11)) { T_FAIL("slow klein-4B quantize", "synth: %s", dt_last_error()); return; }
    printf("# wrote the bf16 klein-4B checkpoint in %.1f s\n", dt_now() - t0);
    fflush(stdout);
    t0 = dt_now();
    pid_t pid = fork();
    if (pid == 0) {
        execl(exe_path(), "ditrun", "quantize", "--input", dir, "--output", out, "--bits", "4", "--group-size", "64", "-q", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    double secs = dt_now() - t0, rss_gb = ru.ru_maxrss / 1024.0 / 1024.0;
    struct stat sb;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && stat(out, &sb) == 0;
    if (!ok) T_FAIL("slow klein-4B quantize", "ditrun quantize exited with status %d", status);
    else {
        st_file *f = st_open(out);
        int u32 = 0;
        for (size_t i = 0; f && i < st_count(f); i++) u32 += st_at(f, i)->dtype == DT_U32;
        st_close(f);
        printf("INFO klein-4B bf16 -> q4 g64: %.2f GB file, %d U32 tensors, peak RSS %.2f GB, %.1f s\n", sb.st_size / 1e9, u32,
               rss_gb, secs);
        T_CHECK("slow klein-4B q4 g64 peak RSS < 2 GB", rss_gb < SLOW_RSS_LIMIT_GB, "peak RSS %.2f GB", rss_gb);
        T_CHECK("slow klein-4B q4 g64 holds 109 U32 weights", u32 == 109, "%d U32 tensors", u32);
        T_CHECK("slow klein-4B q4 g64 file about 2.2 GB", sb.st_size > 2.1e9 && sb.st_size < 2.3e9, "%.3f GB", sb.st_size / 1e9);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/ditrun-quantize-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) { T_FAIL("tmpdir", "mkdtemp failed"); return T_DONE(); }
    double e4 = 0, e8 = 0;
    fixture_rule(4, &e4);
    fixture_rule(8, &e8);
    printf("INFO whole-model weight rel error minmax: q4 g32 %.5e, q8 g32 %.5e\n", e4, e8);
    mlx_rule_vs_minmax(e4);
    keep_and_groups();
    cli();
    const char *slow = getenv("DITRUN_SLOW");
    if (slow && *slow == '1') slow_klein4b();
    else T_SKIP("slow klein-4B quantize", "set DITRUN_SLOW=1 (writes 7.8 + 2.2 GB to $TMPDIR, a few minutes)");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("# could not remove %s\n", tmpdir);
    return T_DONE();
}
