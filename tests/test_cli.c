/* test_cli.c — the ditrun command end to end: bad input gets one clear error line and exit 1
 * (never a crash), good input works. Runs $BUILD/ditrun (default build/ditrun). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "image/png.h"
#include "test.h"

static char exe[512], tmpdir[256];

/* Run ditrun ARGS; capture stderr. Returns exit status (or 128+signal). */
static int run(const char *args, char *err, size_t errlen) {
    char cmd[4096], errf[600];
    snprintf(errf, sizeof errf, "%s/stderr.txt", tmpdir);
    /* args may redirect stdout itself ("... > file"); otherwise it is discarded */
    snprintf(cmd, sizeof cmd, "%s %s %s 2>%s", exe, args, strchr(args, '>') ? "" : ">/dev/null", errf);
    int st = system(cmd);
    FILE *f = fopen(errf, "r");
    size_t n = f ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = 0;
    if (f) fclose(f);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

/* `forward` of the q4 fixture on the CPU with extra options, quiet; out gets its stdout. Returns the exit code. */
static int run_fixture_forward(const char *fx, const char *extra, char *out, size_t outlen) {
    char so[600], args[2048], err[4096];
    snprintf(so, sizeof so, "%s/forward-stdout.txt", tmpdir);
    snprintf(args, sizeof args, "forward --model %s/transformer-q4 --inputs %s/transformer_io.safetensors --backend cpu "
             "%s -q > %s", fx, fx, extra, so);
    int rc = run(args, err, sizeof err);
    FILE *f = fopen(so, "r");
    size_t n = f ? fread(out, 1, outlen - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    return rc;
}

/* Expect exit 1 and exactly one "ditrun: error:" line containing every needle. */
static void expect_error(const char *name, const char *args, const char *needle1, const char *needle2) {
    char err[8192];
    int rc = run(args, err, sizeof err);
    int lines = 0;
    for (char *p = err; *p; p++) lines += *p == '\n';
    const char *e = strstr(err, "ditrun: error:");
    if (rc != 1) T_FAIL(name, "exit status %d (want 1); stderr: %s", rc, err);
    else if (!e) T_FAIL(name, "no 'ditrun: error:' line; stderr: %s", err);
    else if (lines != 1 || e != err) T_FAIL(name, "want one error line, got %d lines: %s", lines, err);
    else if ((needle1 && !strstr(err, needle1)) || (needle2 && !strstr(err, needle2)))
        T_FAIL(name, "message lacks '%s'/'%s': %s", needle1 ? needle1 : "", needle2 ? needle2 : "", err);
    else T_PASS(name);
}

static void spit_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(data, 1, n, f); fclose(f); }
}

/* A w x h RGB PNG (a gradient) at path. */
static void write_test_png(const char *path, int w, int h) {
    uint8_t *rgb = malloc((size_t)w * h * 3), *png = NULL;
    for (int i = 0; i < w * h * 3; i++) rgb[i] = (uint8_t)(i * 7);
    size_t n = 0;
    if (dt_png_encode(rgb, w, h, NULL, 0, &png, &n) == 0) spit_file(path, (const char *)png, n);
    free(rgb);
    free(png);
}

/* Write a copy of the fixture transformer without tensor `drop` (NULL: all) into dir. */
static void write_model_copy(const char *dir, const char *drop, const char *config_text) {
    char src[512], dst[600];
    mkdir(dir, 0755);
    snprintf(src, sizeof src, "%s/model/transformer/diffusion_pytorch_model.safetensors", t_fixtures());
    st_file *f = st_open(src);
    st_writer *w = st_writer_new();
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    snprintf(dst, sizeof dst, "%s/diffusion_pytorch_model.safetensors", dir);
    st_writer_save(w, dst);
    st_writer_free(w);
    st_close(f);
    if (config_text) {
        snprintf(dst, sizeof dst, "%s/config.json", dir);
        FILE *c = fopen(dst, "w");
        fputs(config_text, c);
        fclose(c);
    }
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = dt_malloc(n + 1);
    s[fread(s, 1, n, f)] = 0;
    fclose(f);
    return s;
}

int main(void) {
    const char *b = getenv("BUILD");
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    if (access(exe, X_OK)) { T_SKIP("cli", "%s not built", exe); return T_DONE(); }
    char *abs_exe = realpath(exe, NULL);   /* some cases run from another working directory */
    if (abs_exe) { snprintf(exe, sizeof exe, "%s", abs_exe); free(abs_exe); }
    if (t_tmpdir(tmpdir, sizeof tmpdir, "cli")) { T_FAIL("cli", "mkdtemp failed"); return T_DONE(); }
    const char *fx = t_fixtures();
    char args[4096], p1[600], p2[1200], out[700];
    char *cfg = NULL;
    snprintf(p1, sizeof p1, "%s/model/transformer/config.json", fx);
    cfg = read_text(p1);
    snprintf(out, sizeof out, "%s/out.safetensors", tmpdir);

    /* ---- usage errors ---- */
    expect_error("unknown command", "frobnicate", "unknown command", "frobnicate");
    expect_error("forward unknown option", "forward --bogus", "unknown option", "--bogus");
    expect_error("forward missing required", "forward --model x", "required", NULL);
    expect_error("forward bad threads", "forward --threads 0 --model x", "--threads", "out of range");
    expect_error("--guidance-batch takes on or off", "generate -p x --guidance-batch maybe", "--guidance-batch", "maybe");
    expect_error("forward --guidance-batch without --guided", "forward --model x --inputs y --guidance-batch off",
                 "--guidance-batch", "--guided");
    expect_error("bench --guidance-batch is refused", "bench --guidance-batch on", "--guidance-batch", "forward --guided");
    expect_error("forward bad backend", "forward --backend tpu --model x", "--backend", "tpu");
    expect_error("forward bad precision", "forward --precision fp4 --model x", "--precision", "fp4");
    expect_error("generate bad precision", "generate --precision int8 -p x -o x.png", "--precision", "int8");
    expect_error("generate --output-compression 101", "generate --output-compression 101 -p x -o x.jpg",
                 "--output-compression", "out of range");
    {   /* the output's format from its extension, any case; anything else stays PNG */
        static const struct { const char *name, *magic; size_t n; } outs[] = {
            {"x.JPEG", "\xFF\xD8\xFF", 3}, {"x.webp", "RIFF", 4}, {"x.out", "\x89PNG", 4}};
        for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
            char path[700], err[4096], nm[120];
            snprintf(path, sizeof path, "%s/%s", tmpdir, outs[k].name);
            snprintf(args, sizeof args, "generate --model %s/model -p x -o %s --width 32 --height 32 --steps 1 "
                     "--backend cpu --max-sequence-length 8 -q", fx, path);
            int rc = run(args, err, sizeof err);
            size_t n = 0;
            char *b = t_slurp(path, &n);
            snprintf(nm, sizeof nm, "generate -o %s writes %s", outs[k].name,
                     k == 0 ? "a JPEG" : k == 1 ? "a WebP" : "a PNG");
            T_CHECK(nm, rc == 0 && b && n > outs[k].n && !memcmp(b, outs[k].magic, outs[k].n), "rc %d, %zu bytes: %s", rc,
                    n, err);
            free(b);
        }
    }
    expect_error("bench bad precision", "bench --precision", "--precision", "bf16, fp8");
    expect_error("compare-bf16 without fp8", "forward --compare-bf16 --model x --inputs y", "--compare-bf16", "fp8");
    expect_error("compare-qpath unknown", "forward --compare-qpath fast --model x --inputs y", "--compare-qpath", "fast");
    expect_error("bench unknown arm", "bench --arms fp9", "--arms", "fp9");
    expect_error("forward bad attn precision", "forward --attn-precision fp4 --model x", "--attn-precision", "fp4");
    expect_error("generate attn precision missing", "generate -p x -o x.png --attn-precision", "--attn-precision", "bf16, fp8");
    expect_error("generate lora missing file", "generate -p x -o /tmp/x.png --lora /nonexistent/a.safetensors:0.5",
                 "/nonexistent/a.safetensors", NULL);
    expect_error("generate lora bad scale", "generate -p x -o x.png --lora a.safetensors:inf", "--lora", "finite");
    expect_error("forward lora needs a value", "forward --model x --inputs y --lora", "--lora needs a value", NULL);
    expect_error("info missing path", "info /nonexistent/ditrun-model", "/nonexistent/ditrun-model", NULL);

    /* --compare-qpath on the CPU (which dequantizes per tile whatever the qpath): runs both forwards and reports
     * an exactly zero difference */
    {
        char buf[4096];
        int rc = run_fixture_forward(fx, "--compare-qpath transient", buf, sizeof buf);
        T_CHECK("forward --compare-qpath reports the difference (0 on the CPU)",
                rc == 0 && strstr(buf, "qpath auto vs transient forward: rel_l2 0.00000"), "rc %d, stdout: %s", rc, buf);
    }

    /* --attn-precision fp8 on the CPU (the emulation of backend.h's fp8 attention) with --compare-bf16: both
     * forwards run, the report names the fp8 part and gives a non-zero, finite error */
    {
        char buf[4096];
        int rc = run_fixture_forward(fx, "--attn-precision fp8 --compare-bf16", buf, sizeof buf);
        const char *m = strstr(buf, "fp8 vs bf16 forward (attention): rel_l2 ");
        double rel = m ? atof(m + strlen("fp8 vs bf16 forward (attention): rel_l2 ")) : -1;
        T_CHECK("forward --attn-precision fp8 --compare-bf16 reports a non-zero error", rc == 0 && rel > 0 && rel < 1,
                "rc %d, rel %g, stdout: %s", rc, rel, buf);
    }

    /* convert of a Krea 2 checkpoint: fp8 formats only (GGUF is FLUX.2's layout), a clear error naming the family */
    snprintf(args, sizeof args, "convert --input %s/krea2 --output %s/k2.gguf --format gguf-q8_0", fx, tmpdir);
    expect_error("convert Krea 2 to GGUF is refused", args, "gguf-q8_0", "Krea 2");

    /* Krea 2 (its fixture) with --precision fp8 --attn-precision fp8 --compare-bf16 on the CPU: both forwards run and
     * the report gives a non-zero, finite error (the option is honoured, not ignored) */
    {
        char so[600], buf[4096], err[4096];
        snprintf(so, sizeof so, "%s/krea2-stdout.txt", tmpdir);
        snprintf(args, sizeof args, "forward --model %s/krea2 --inputs %s/krea2_io.safetensors --backend cpu "
                 "--precision fp8 --attn-precision fp8 --compare-bf16 -q > %s", fx, fx, so);
        int rc = run(args, err, sizeof err);
        FILE *f = fopen(so, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[n] = 0;
        if (f) fclose(f);
        const char *key = "fp8 vs bf16 forward (Linears + attention): rel_l2 ";
        const char *m = strstr(buf, key);
        double rel = m ? atof(m + strlen(key)) : -1;
        T_CHECK("forward Krea 2 --precision fp8 --attn-precision fp8 --compare-bf16 reports a non-zero error",
                rc == 0 && rel > 0 && rel < 1, "rc %d, rel %g, stdout: %s, stderr: %s", rc, rel, buf, err);
    }

    /* -v: one summary line per stored format and path of the transformer's Linears (dt_linear_paths), printed once at
     * load; with --precision fp8 the blocks' Linears move to an fp8 line and the counts still add up to every Linear */
    {
        char err[8192], err8[8192];
        snprintf(args, sizeof args, "forward --model %s/transformer-q4 --inputs %s/transformer_io.safetensors --backend cpu -v",
                 fx, fx);
        int rc = run(args, err, sizeof err);
        snprintf(args, sizeof args, "forward --model %s/transformer-q4 --inputs %s/transformer_io.safetensors --backend cpu -v "
                 "--precision fp8", fx, fx);
        int rc8 = run(args, err8, sizeof err8);
        int lines = 0, lines8 = 0, n = 0, n8 = 0, fp8_lines = 0;
        for (const char *q = err; (q = strstr(q, "ditrun: cpu: transformer: ")); q++) {
            lines++;
            n += atoi(q + strlen("ditrun: cpu: transformer: "));
        }
        for (const char *q = err8; (q = strstr(q, "ditrun: cpu: transformer: ")); q++) {
            const char *eol = strchr(q, '\n');
            lines8++;
            n8 += atoi(q + strlen("ditrun: cpu: transformer: "));
            const char *f = strstr(q, "fp8 emulated");
            fp8_lines += f && (!eol || f < eol);
        }
        T_CHECK("forward -v: one line for the q4 Linears, naming format and path",
                rc == 0 && lines == 1 && n > 0 && strstr(err, " Linears q4 g32: dequantized to f32 per tile"), "rc %d: %s", rc, err);
        T_CHECK("forward -v --precision fp8: an fp8 line beside the q4 one, every Linear counted once",
                rc8 == 0 && lines8 == 2 && fp8_lines == 1 && n8 == n, "rc %d, %d lines, %d vs %d Linears: %s", rc8, lines8, n8,
                n, err8);
        snprintf(args, sizeof args, "forward --model %s/transformer-q4 --inputs %s/transformer_io.safetensors --backend cpu", fx, fx);
        rc = run(args, err, sizeof err);
        T_CHECK("forward without -v: no Linear summary", rc == 0 && !strstr(err, "Linears"), "rc %d: %s", rc, err);
    }

    /* ---- malformed model folders ---- */
    snprintf(p1, sizeof p1, "%s/noconfig", tmpdir);
    /* without config.json the geometry is inferred from the shapes (tests/test_layouts.c); with the
     * input projection missing it cannot be, and the error says so */
    write_model_copy(p1, "x_embedder.weight", NULL);
    snprintf(args, sizeof args, "forward --model %s --inputs %s/transformer_io.safetensors --output %s --backend cpu", p1, fx, out);
    expect_error("directory without config", args, "config.json", "x_embedder");

    snprintf(p1, sizeof p1, "%s/missing", tmpdir);
    write_model_copy(p1, "transformer_blocks.0.attn.to_k.weight", cfg);
    snprintf(args, sizeof args, "forward --model %s --inputs %s/transformer_io.safetensors --output %s --backend cpu", p1, fx, out);
    expect_error("missing tensor", args, "transformer_blocks.0.attn.to_k", NULL);

    /* config says 4 heads (D=512) but the weights are D=256 */
    if (cfg) {
        char *bad = dt_strdup(cfg), *h = strstr(bad, "\"num_attention_heads\": 2");
        if (h) h[strlen("\"num_attention_heads\": ")] = '4';
        snprintf(p1, sizeof p1, "%s/wrongshape", tmpdir);
        write_model_copy(p1, NULL, bad);
        snprintf(args, sizeof args, "forward --model %s --inputs %s/transformer_io.safetensors --output %s --backend cpu", p1, fx, out);
        expect_error("wrong shape for the config", args, "x_embedder", "shape");
        free(bad);
    }

    /* truncated safetensors in a model folder */
    snprintf(p1, sizeof p1, "%s/truncated", tmpdir);
    write_model_copy(p1, NULL, cfg);
    snprintf(p2, sizeof p2, "%s/diffusion_pytorch_model.safetensors", p1);
    if (truncate(p2, 4096) != 0) printf("# truncate failed\n");
    snprintf(args, sizeof args, "forward --model %s --inputs %s/transformer_io.safetensors --output %s --backend cpu", p1, fx, out);
    expect_error("truncated weights file", args, "diffusion_pytorch_model.safetensors", NULL);

    /* empty file as input */
    snprintf(p2, sizeof p2, "%s/empty.safetensors", tmpdir);
    FILE *f = fopen(p2, "w"); fclose(f);
    snprintf(args, sizeof args, "forward --model %s/model --inputs %s --output %s --backend cpu", fx, p2, out);
    expect_error("empty inputs file", args, "empty.safetensors", NULL);

    /* inputs with the wrong channel count / missing timestep */
    {
        snprintf(p2, sizeof p2, "%s/transformer_io.safetensors", fx);
        st_file *io = st_open(p2);
        st_writer *w1 = st_writer_new(), *w2 = st_writer_new();
        for (size_t i = 0; io && i < st_count(io); i++) {
            const st_tensor *t = st_at(io, i);
            if (strncmp(t->name, "in.", 3)) continue;
            if (strcmp(t->name, "in.timestep")) st_writer_add(w2, t->name, t->dtype, t->ndim, t->shape, t->data);
            if (!strcmp(t->name, "in.hidden_states")) {
                int64_t sh[3] = {1, t->shape[1] * 2, t->shape[2] / 2};
                st_writer_add(w1, t->name, t->dtype, 3, sh, t->data);
            } else st_writer_add(w1, t->name, t->dtype, t->ndim, t->shape, t->data);
        }
        snprintf(p1, sizeof p1, "%s/badch.safetensors", tmpdir);
        st_writer_save(w1, p1);
        snprintf(args, sizeof args, "forward --model %s/model --inputs %s --output %s --backend cpu", fx, p1, out);
        expect_error("inputs with wrong channels", args, "in.hidden_states", "channels");
        snprintf(p1, sizeof p1, "%s/nots.safetensors", tmpdir);
        st_writer_save(w2, p1);
        snprintf(args, sizeof args, "forward --model %s/model --inputs %s --output %s --backend cpu", fx, p1, out);
        expect_error("inputs without timestep", args, "in.timestep", NULL);
        st_writer_free(w1); st_writer_free(w2);
        st_close(io);
    }

    /* ---- good input ---- */
    snprintf(args, sizeof args, "forward --model %s/model/transformer --inputs %s/transformer_io.safetensors --output %s --backend cpu -q", fx, fx, out);
    char err[8192];
    int rc = run(args, err, sizeof err);
    if (rc) T_FAIL("forward fixture via CLI", "exit %d: %s", rc, err);
    else {
        st_file *o = st_open(out), *r = st_open(p2);
        const st_tensor *ot = o ? st_find(o, "out.sample") : NULL;
        if (!ot || ot->dtype != DT_F32) T_FAIL("forward fixture via CLI", "out.sample missing or not F32");
        else {
            float *g = st_to_f32(ot), *ref = st_to_f32(st_find(r, "out.sample"));
            /* f32 vs f32 reference: summation order only */
            t_check_rel_l2("forward fixture via CLI", g, ref, (size_t)ot->numel, 1e-4);
            free(g); free(ref);
        }
        st_close(o); st_close(r);
    }
    /* reference tokens through forward: synth inputs with a 64x64 reference, appended and KV-cached (the two
     * semantics give different velocities); --kv-refs without references and --ref-size for Krea 2 are errors */
    snprintf(args, sizeof args, "forward --model %s/model --inputs %s/transformer_io.safetensors --backend cpu --kv-refs", fx, fx);
    expect_error("forward --kv-refs without references", args, "--kv-refs", "in.ref_hidden_states");
    expect_error("synth --ref-size for Krea 2", "synth --preset krea2-tiny --inputs x.st --ref-size 64", "--ref-size", "FLUX.2");
    {
        char in_p[600], o1[600], o2[600];
        snprintf(in_p, sizeof in_p, "%s/refs_in.safetensors", tmpdir);
        snprintf(o1, sizeof o1, "%s/refs_app.safetensors", tmpdir);
        snprintf(o2, sizeof o2, "%s/refs_kv.safetensors", tmpdir);
        snprintf(args, sizeof args, "synth --preset tiny --inputs %s --image-size 128 --text-tokens 16 --ref-size 64", in_p);
        int r1 = run(args, err, sizeof err), r2 = 1, r3 = 1;
        if (!r1) {
            snprintf(args, sizeof args, "forward --model %s/model --inputs %s --output %s --backend cpu -q", fx, in_p, o1);
            r2 = run(args, err, sizeof err);
            snprintf(args, sizeof args, "forward --model %s/model --inputs %s --output %s --backend cpu -q --kv-refs --repeat 2", fx, in_p, o2);
            r3 = run(args, err, sizeof err);
        }
        st_file *a = r2 ? NULL : st_open(o1), *b = r3 ? NULL : st_open(o2);
        const st_tensor *ta = a ? st_find(a, "out.sample") : NULL, *tb = b ? st_find(b, "out.sample") : NULL;
        double d = -1;
        if (ta && tb && ta->numel == 64 * 32 && tb->numel == ta->numel) {
            float *fa = st_to_f32(ta), *fb = st_to_f32(tb);
            d = dt_rel_l2(fb, fa, (size_t)ta->numel);
            free(fa); free(fb);
        }
        T_CHECK("forward with reference tokens: appended and KV-cached", d > 1e-4, "exit %d/%d/%d, rel L2 %g: %s", r1, r2,
                r3, d, err);
        st_close(a); st_close(b);
    }
    /* editing inputs: what goes with what, the strength's range, broken images and a mask of another size, each
     * one error line naming the option or the file; the output file is not written */
    {
        char png[600], ed[1024], cmd[2048];
        snprintf(png, sizeof png, "%s/edit-out.png", tmpdir);
        snprintf(ed, sizeof ed, "generate --model %s/model -p x -o %s --backend cpu --max-sequence-length 32 -q", fx, png);
        snprintf(cmd, sizeof cmd, "%s --mask %s/edit/mask.png", ed, fx);
        expect_error("generate --mask without --init-image", cmd, "--mask", "--init-image");
        snprintf(cmd, sizeof cmd, "%s --init-image %s/edit/ref9.png", ed, fx);
        expect_error("generate --init-image without --mask", cmd, "--init-image", "--mask");
        snprintf(cmd, sizeof cmd, "%s --image %s/edit/ref0.png --strength 0.5", ed, fx);
        expect_error("generate --strength without --init-image", cmd, "--strength", "--init-image");
        snprintf(cmd, sizeof cmd, "%s --init-image %s/edit/ref9.png --mask %s/edit/mask.png --strength 0", ed, fx, fx);
        expect_error("generate --strength 0", cmd, "--strength", "(0, 1]");
        snprintf(cmd, sizeof cmd, "%s --init-image %s/edit/ref9.png --mask %s/edit/mask.png --strength 1.5", ed, fx, fx);
        expect_error("generate --strength 1.5", cmd, "--strength", "(0, 1]");
        snprintf(cmd, sizeof cmd, "%s --image tests/images/bad_truncated_rgb_png.png", ed);
        expect_error("generate --image truncated PNG", cmd, "bad_truncated_rgb_png.png", NULL);
        snprintf(cmd, sizeof cmd, "%s --image %s/edit/no-such-image.png", ed, fx);
        expect_error("generate --image missing file", cmd, "no-such-image.png", NULL);
        snprintf(cmd, sizeof cmd, "%s --init-image %s/edit/ref9.png --mask %s/edit/ref0.png", ed, fx, fx);
        expect_error("generate mask of another size than the init image", cmd, "ref0.png", NULL);
        snprintf(cmd, sizeof cmd, "%s --image tests/images/gray1.png", ed);
        expect_error("generate --image too small a reference", cmd, "gray1.png", NULL);
        snprintf(cmd, sizeof cmd, "generate --model %s/model -p x -o %s/edit/ref0.png --backend cpu -q --image %s/edit/ref0.png",
                 fx, fx, fx);
        expect_error("generate -o the same file as --image", cmd, "ref0.png", NULL);
        /* every unusable image: one line naming the file, exit 1, nothing written */
        char small[600], wide[600];
        snprintf(small, sizeof small, "%s/side63.png", tmpdir);
        snprintf(wide, sizeof wide, "%s/aspect9.png", tmpdir);
        write_test_png(small, 63, 80);
        write_test_png(wide, 9 * 64 + 8, 64);
        const struct { const char *name, *file; } bad[] = {
            {"truncated JPEG", "tests/images/bad_truncated_rgb420_jpg.jpg"},
            {"truncated progressive JPEG", "tests/images/bad_truncated_progressive_jpg.jpg"},
            {"truncated WebP", "tests/images/bad_truncated_lossy_webp.webp"},
            {"16-bit PNG", "tests/images/bad_rgb16.png"},
            {"16-bit gray PNG", "tests/images/bad_gray16.png"},
            {"CMYK JPEG", "tests/images/bad_cmyk.jpg"},
            {"animated WebP", "tests/images/bad_animated.webp"},
            {"a 63-pixel side", small},
            {"aspect ratio over 8", wide},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            char nm[160];
            snprintf(nm, sizeof nm, "generate --image %s", bad[k].name);
            snprintf(cmd, sizeof cmd, "%s --image %s", ed, bad[k].file);
            const char *base = strrchr(bad[k].file, '/');
            expect_error(nm, cmd, base ? base + 1 : bad[k].file, NULL);
        }
        snprintf(cmd, sizeof cmd, "%s --init-image tests/images/bad_cmyk.jpg --mask %s/edit/mask.png", ed, fx);
        expect_error("generate --init-image CMYK JPEG", cmd, "bad_cmyk.jpg", NULL);
        snprintf(cmd, sizeof cmd, "%s --init-image %s/edit/ref9.png --mask tests/images/bad_truncated_rgb_png.png", ed, fx);
        expect_error("generate --mask truncated PNG", cmd, "bad_truncated_rgb_png.png", NULL);
        snprintf(cmd, sizeof cmd, "%s --init-image %s/edit/ref9.png --mask %s/edit/mask.png --strength much", ed, fx, fx);
        expect_error("generate --strength not a number", cmd, "--strength", NULL);
        struct stat st;
        T_CHECK("editing errors wrote no output file", stat(png, &st) != 0, "%s exists", png);
        /* an existing output file is left as it was */
        spit_file(png, "keep me", 7);
        snprintf(cmd, sizeof cmd, "%s --image tests/images/bad_cmyk.jpg", ed);
        expect_error("generate --image CMYK JPEG over an existing output", cmd, "bad_cmyk.jpg", NULL);
        char keep[16] = "";
        FILE *kf = fopen(png, "rb");
        size_t kn = kf ? fread(keep, 1, sizeof keep - 1, kf) : 0;
        if (kf) fclose(kf);
        T_CHECK("an editing error leaves the existing output file as it was", kn == 7 && !memcmp(keep, "keep me", 7),
                "%zu bytes: '%s'", kn, keep);
        unlink(png);
    }
    /* one fixture case through the command line: edit1 (one reference, the size from it, the reference's noise)
     * -> PNG values within +-1 of the reference's image for >= 99.9% */
    {
        char png[600], cmd[2048], io[600];
        snprintf(png, sizeof png, "%s/edit1.png", tmpdir);
        snprintf(io, sizeof io, "%s/edit/edit1_io.safetensors", fx);
        snprintf(cmd, sizeof cmd, "generate --model %s/model --backend cpu -q --te-rope-bf16 --text-encoder-layers 1,2,3 "
                 "--max-sequence-length 32 --steps 4 -p 'turn the fox into a snow leopard' --image %s/edit/ref0.png "
                 "--noise %s -o %s", fx, fx, io, png);
        char err2[4096];
        int rc2 = run(cmd, err2, sizeof err2);
        uint8_t *rgb = NULL;
        int w = 0, h = 0;
        st_file *f = st_open(io);
        const st_tensor *u8 = f ? st_find(f, "out.image_u8") : NULL;
        int ok = rc2 == 0 && u8 && u8->ndim == 4 && dt_png_read(png, &rgb, &w, &h, NULL, NULL) == 0 &&
                 h == u8->shape[1] && w == u8->shape[2];
        size_t close = 0, total = ok ? (size_t)w * h * 3 : 0;
        for (size_t k = 0; k < total; k++) close += abs((int)rgb[k] - (int)((const uint8_t *)u8->data)[k]) <= 1;
        T_CHECK("generate --image (edit1 through the CLI): values within +-1 of the reference for >= 99.9%",
                ok && (double)close >= 0.999 * (double)total, "rc %d, %dx%d, %zu of %zu close: %s", rc2, w, h, close,
                total, err2);
        free(rgb);
        st_close(f);
    }
    snprintf(args, sizeof args, "info %s/model > %s/info.txt", fx, tmpdir);
    rc = run(args, err, sizeof err);
    snprintf(p1, sizeof p1, "%s/info.txt", tmpdir);
    char *info = read_text(p1);
    T_CHECK("info pipeline root", rc == 0 && info && strstr(info, "D=256") && strstr(info, "tensors") && strstr(info, "text_encoder"),
            "exit %d, output: %s", rc, info ? info : "(none)");
    free(info);
    snprintf(args, sizeof args, "info %s/transformer-q4 > %s/info.txt", fx, tmpdir);
    rc = run(args, err, sizeof err);
    info = read_text(p1);
    T_CHECK("info q4 folder", rc == 0 && info && strstr(info, "4-bit") && strstr(info, "group 32"), "exit %d, output: %s", rc, info ? info : "(none)");
    free(info);
    /* convert --format: an fp8 and a GGUF file of the fixture, described by info */
    {
        static const struct { const char *format, *file, *want1, *want2; } conv[] = {
            {"fp8", "k.safetensors", "fp8 e4m3, weight scales per tensor", "input_scale present"},
            {"gguf-q4_k", "k.gguf", "GGUF v3 (general.architecture flux)", "GGUF blocks: Q4_K x"},
            {"sdcpp-q8_0", "s.gguf", "GGUF v3", "GGUF blocks: Q8_0 x"},
        };
        for (size_t k = 0; k < sizeof conv / sizeof conv[0]; k++) {
            char nm[96];
            snprintf(args, sizeof args, "convert -q --input %s/model --output %s/%s --format %s && %s info %s/%s > %s/info.txt",
                     fx, tmpdir, conv[k].file, conv[k].format, exe, tmpdir, conv[k].file, tmpdir);
            rc = run(args, err, sizeof err);
            info = read_text(p1);
            snprintf(nm, sizeof nm, "convert --format %s + info", conv[k].format);
            T_CHECK(nm, rc == 0 && info && strstr(info, conv[k].want1) && strstr(info, conv[k].want2) && strstr(info, "D=256"),
                    "exit %d (%s), output: %s", rc, err, info ? info : "(none)");
            free(info);
        }
        expect_error("convert unknown format", "convert --input x --output y --format gguf-q3_k", "unknown --format", "gguf-q3_k");
    }
    rc = run("--help", err, sizeof err);
    T_CHECK("--help", rc == 0, "exit %d", rc);

    /* generate --count: one load, N images with seeds S.. named OUT-1.png..; image k equals a one-shot run with seed S+k-1 */
    snprintf(args, sizeof args, "generate --backend cpu -q --model %s/model -p 'a fox' --height 32 --width 48 "
             "--max-sequence-length 16 --seed 5 --count 2 -o %s/many.png > %s/many.txt", fx, tmpdir, tmpdir);
    rc = run(args, err, sizeof err);
    snprintf(p1, sizeof p1, "%s/many.txt", tmpdir);
    info = read_text(p1);
    T_CHECK("generate --count timings", rc == 0 && info && strstr(info, "image 2/2 (seed 6)") && strstr(info, "first image"),
            "exit %d: %s %s", rc, err, info ? info : "(none)");
    free(info);
    snprintf(args, sizeof args, "generate --backend cpu -q --model %s/model -p 'a fox' --height 32 --width 48 "
             "--max-sequence-length 16 --seed 6 -o %s/one.png", fx, tmpdir);
    rc = run(args, err, sizeof err);
    snprintf(p1, sizeof p1, "%s/many-2.png", tmpdir);
    snprintf(p2, sizeof p2, "%s/one.png", tmpdir);
    snprintf(args, sizeof args, "cmp -s '%s' '%s'", p1, p2);
    T_CHECK("generate --count image 2 == one-shot seed 6 (same bytes)", rc == 0 && system(args) == 0, "exit %d: %s", rc, err);
    /* the bundled model from any working directory, and from an installed layout (PREFIX/bin + PREFIX/share/ditrun/model,
     * what `make install` writes); synth --pipeline from elsewhere too, with the file names diffusers loads */
    char cwd_cmd[4096];
    snprintf(cwd_cmd, sizeof cwd_cmd, "cd / && '%s' generate --backend cpu -q -p 'a fox' --height 32 --width 32 "
             "--max-sequence-length 16 -o '%s/anywhere.png'", exe, tmpdir);
    T_CHECK("bundled model from another working directory", system(cwd_cmd) == 0, "%s", cwd_cmd);
    snprintf(cwd_cmd, sizeof cwd_cmd, "mkdir -p '%s/inst/bin' '%s/inst/share/ditrun' && cp '%s' '%s/inst/bin/' && "
             "cp -R '%s/model' '%s/inst/share/ditrun/model' && cd / && '%s/inst/bin/ditrun' generate --backend cpu -q "
             "-p 'a fox' --height 32 --width 32 --max-sequence-length 16 -o '%s/installed.png'",
             tmpdir, tmpdir, exe, tmpdir, fx, tmpdir, tmpdir, tmpdir);
    T_CHECK("bundled model of an installed layout", system(cwd_cmd) == 0, "%s", cwd_cmd);
    snprintf(cwd_cmd, sizeof cwd_cmd, "cd / && '%s' synth --preset tiny --pipeline --output '%s/sp' >/dev/null 2>&1 && "
             "test -f '%s/sp/transformer/diffusion_pytorch_model.safetensors' && test -f '%s/sp/vae/diffusion_pytorch_model.safetensors' "
             "&& test -f '%s/sp/tokenizer/chat_template.jinja' && '%s' generate --backend cpu -q --model '%s/sp' -p 'a fox' "
             "--height 32 --width 32 --max-sequence-length 16 -o '%s/sp.png'", exe, tmpdir, tmpdir, tmpdir, tmpdir, exe, tmpdir, tmpdir);
    T_CHECK("synth --pipeline from another working directory, diffusers file names, generates", system(cwd_cmd) == 0, "%s", cwd_cmd);
    /* the synthetic pipeline's VAE has an encoder: it edits (one reference, the size from it) */
    char sp_rel[600], sp_ref[PATH_MAX], sp_cmd[PATH_MAX + 2048];
    snprintf(sp_rel, sizeof sp_rel, "%s/edit/ref0.png", fx);
    if (!realpath(sp_rel, sp_ref)) snprintf(sp_ref, sizeof sp_ref, "%s", sp_rel);
    snprintf(sp_cmd, sizeof sp_cmd, "cd / && '%s' generate --backend cpu -q --model '%s/sp' -p 'a fox' "
             "--max-sequence-length 16 --image '%s' -o '%s/sp-edit.png'", exe, tmpdir, sp_ref, tmpdir);
    int sp_rc = system(sp_cmd);
    snprintf(p1, sizeof p1, "%s/sp-edit.png", tmpdir);
    uint8_t *sp_rgb = NULL;
    int sp_w = 0, sp_h = 0;
    /* the multiple is 2 x the VAE's scale factor, 2^(blocks - 1), from the config the synth wrote */
    snprintf(p2, sizeof p2, "%s/sp/vae/config.json", tmpdir);
    json *spc = json_parse_file(p2);
    const json *boc = spc ? json_get(spc, "block_out_channels") : NULL;
    int sp_mult = boc && boc->len > 0 ? 2 << (boc->len - 1) : 0;
    json_free(spc);
    T_CHECK("synth --pipeline edits: --image sets the size (the reference floored to 2 x the VAE scale factor)",
            sp_rc == 0 && sp_mult > 0 && dt_png_read(p1, &sp_rgb, &sp_w, &sp_h, NULL, NULL) == 0 &&
                sp_w == 100 / sp_mult * sp_mult && sp_h == 77 / sp_mult * sp_mult,
            "%s -> %dx%d (multiple %d)", sp_cmd, sp_w, sp_h, sp_mult);
    free(sp_rgb);
    /* a quantized synthetic pipeline with another group size: every component's config names the group size its
     * weights were written with (the text encoder's said 64 whatever was asked), and it generates */
    snprintf(cwd_cmd, sizeof cwd_cmd, "'%s' synth --preset tiny --pipeline --bits 4 --group-size 32 --output '%s/sp32' "
             ">/dev/null 2>&1 && '%s' generate --backend cpu -q --model '%s/sp32' -p 'a fox' --height 32 --width 32 "
             "--max-sequence-length 16 -o '%s/sp32.png'", exe, tmpdir, exe, tmpdir, tmpdir);
    int q_rc = system(cwd_cmd);
    int q_ok = 1;
    static const char *q_parts[] = {"text_encoder", "transformer"};
    for (int i = 0; i < 2; i++) {
        snprintf(p2, sizeof p2, "%s/sp32/%s/config.json", tmpdir, q_parts[i]);
        json *qc = json_parse_file(p2);
        const json *q = qc ? json_get(qc, "quantization") : NULL;
        if (!q || json_get_num(q, "group_size", 0) != 32) q_ok = 0;
        json_free(qc);
    }
    T_CHECK("synth --pipeline --bits 4 --group-size 32: the configs say 32, and it generates", q_rc == 0 && q_ok,
            "exit %d, configs %s", q_rc, q_ok ? "ok" : "name another group size");

    /* synth --lora in the three layouts (geometry from the bundled model): each loads, all three give the same image
     * (one update, bit-identical merged weights), different from the model's own; bad values are one error line */
    {
        static const char *const lay[3] = {"diffusers", "kohya", "bfl"};
        int ok = 1;
        for (int l = 0; l < 3 && ok; l++) {
            snprintf(args, sizeof args, "synth --model %s/model --lora %s/l-%s.safetensors --lora-layout %s --lora-rank 6 "
                     "--lora-modulation", fx, tmpdir, lay[l], lay[l]);
            ok = run(args, err, sizeof err) == 0;
            snprintf(args, sizeof args, "generate --backend cpu -q --model %s/model -p 'a fox' --height 64 --width 64 "
                     "--max-sequence-length 16 --noise %s/pipeline_io.safetensors --lora %s/l-%s.safetensors -o %s/l-%s.png",
                     fx, fx, tmpdir, lay[l], tmpdir, lay[l]);
            ok = ok && run(args, err, sizeof err) == 0;
        }
        snprintf(args, sizeof args, "generate --backend cpu -q --model %s/model -p 'a fox' --height 64 --width 64 "
                 "--max-sequence-length 16 --noise %s/pipeline_io.safetensors -o %s/l-none.png", fx, fx, tmpdir);
        ok = ok && run(args, err, sizeof err) == 0;
        snprintf(cwd_cmd, sizeof cwd_cmd, "cd '%s' && cmp -s l-diffusers.png l-kohya.png && cmp -s l-diffusers.png l-bfl.png "
                 "&& ! cmp -s l-diffusers.png l-none.png", tmpdir);
        T_CHECK("synth --lora layouts: same image from each, not the model's own", ok && system(cwd_cmd) == 0, "%s", err);
        expect_error("synth --lora-layout unknown", "synth --preset tiny --lora x.safetensors --lora-layout peft",
                     "--lora-layout", "peft");
        expect_error("synth --lora-layout without --lora", "synth --preset tiny --output x --lora-layout kohya",
                     "--lora-layout", "--lora FILE");
        snprintf(args, sizeof args, "synth --preset tiny --model %s/model --lora %s/x.safetensors", fx, tmpdir);
        expect_error("synth --lora with --preset and --model", args, "--preset", "--model");
        snprintf(args, sizeof args, "synth --model %s/krea2 --lora %s/x.safetensors", fx, tmpdir);
        expect_error("synth --lora for a Krea 2 model", args, "Krea2Transformer2DModel", "Flux2Transformer2DModel");
        snprintf(args, sizeof args, "synth --model %s/nothing-here --lora %s/x.safetensors", fx, tmpdir);
        expect_error("synth --lora --model missing", args, "nothing-here", NULL);
        expect_error("synth --lora-rank 0", "synth --preset tiny --lora x.safetensors --lora-rank 0", "--lora-rank", NULL);
    }

    expect_error("generate --count with --save-latents", "generate -p x -o /tmp/x.png --count 2 --save-latents /tmp/y.st",
                 "--count", NULL);
    free(cfg);
    t_rmtree(tmpdir);
    return T_DONE();
}
