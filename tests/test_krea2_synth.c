/* test_krea2_synth.c — synthetic Krea 2 checkpoints and inputs (DITRUN_BENCH=1 or DITRUN_SLOW=1; skipped
 * otherwise; the Krea 2 bench itself is tested in test_bench.c).
 *
 * krea2-tiny: the preset equals the fixture's config; krea2_synth_write produces exactly the fixture's
 * tensor names and shapes; bf16 and q4 checkpoints load and run a finite forward on the CPU (with and
 * without the text mask); the CLI path `ditrun synth --preset krea2-tiny` (+ --inputs) and `ditrun
 * forward --repeat` works. DITRUN_SLOW=1 adds the real geometry: the q4 checkpoint (~7.2 GB in $TMPDIR) loads on the
 * CPU (every tensor krea2_load asks for is there with its shape), then is deleted.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/krea2.h"
#include "test.h"
#include "synth/synth_dit.h"

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
        T_SKIP("krea2 synthetic checkpoints", "set DITRUN_BENCH=1 or DITRUN_SLOW=1 (tiny geometry, ~30 s on CPU)");
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
    if (on_s) test_real_geometry();
    else T_SKIP("krea2 q4 real geometry loads", "set DITRUN_SLOW=1 (writes ~7.2 GB to $TMPDIR, ~30 s)");
    char p[700];
    snprintf(p, sizeof p, "%s/cli.out", tmpdir); unlink(p);
    snprintf(p, sizeof p, "%s/cli.err", tmpdir); unlink(p);
    rmdir(tmpdir);
    return T_DONE();
}
