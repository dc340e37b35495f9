/* test_robust_cli.c — the ditrun command with hostile paths and sizes: an output that is one of the inputs is
 * refused and the input kept (forward, generate and its editing images, quantize, convert and convert --format); an
 * output path that cannot be written fails before any work (one error line, nothing loaded); a full filesystem keeps
 * the old output and a read-only one is refused; FIFO inputs are refused at once (info, forward, tokenize, generate,
 * quantize, convert, bench, serve, --lora, editing images); SIGINT in the middle of quantize, convert (diffusers
 * names and GGUF q4_K) and synth (a checkpoint and a whole pipeline) leaves no temporary and no half folder (and
 * keeps an existing output); symbolic-link loops, over-long names, infinite timesteps, sizes past the schedule,
 * huge images and absurd configs get one clear line naming the problem, never a crash or an undefined-behaviour
 * report (make test-asan); info describes every component and exits 1 on an invalid config or a missing one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "models/flux2.h"
#include "pipeline/scheduler.h"
#include "test.h"
#include "synth/synth_dit.h"

static char exe[512], tmp[512];

/* Runs `ditrun ARGS` through the shell; stdout into the file outf, stderr into err. Returns the exit status
 * (128+signal when killed). */
static int run_to(const char *args, const char *outf, char *err, size_t errlen) {
    char cmd[8192], errf[700];
    snprintf(errf, sizeof errf, "%s/stderr.txt", tmp);
    snprintf(cmd, sizeof cmd, "timeout 60 %s %s >%s 2>%s", exe, args, outf, errf);
    int st = system(cmd);
    FILE *f = fopen(errf, "r");
    size_t n = f ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = 0;
    if (f) fclose(f);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static int run(const char *args, char *err, size_t errlen) { return run_to(args, "/dev/null", err, errlen); }

/* Exit 1 with exactly one line, "ditrun: error: ...", holding both needles (NULL: any). */
static void expect_error(const char *name, const char *args, const char *n1, const char *n2) {
    char err[16384];
    int rc = run(args, err, sizeof err);
    int lines = 0;
    for (char *p = err; *p; p++) lines += *p == '\n';
    if (rc != 1) T_FAIL(name, "exit status %d (want 1); stderr: %s", rc, err);
    else if (strncmp(err, "ditrun: error: ", 15) || lines != 1) T_FAIL(name, "want one error line, got: %s", err);
    else if ((n1 && !strstr(err, n1)) || (n2 && !strstr(err, n2)))
        T_FAIL(name, "message lacks '%s' / '%s': %s", n1 ? n1 : "", n2 ? n2 : "", err);
    else T_PASS(name);
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

/* 1 when path still holds exactly `want` (n bytes). */
static int same_bytes(const char *path, const char *want, size_t n) {
    size_t m = 0;
    char *b = t_slurp(path, &m);
    int ok = b && m == n && !memcmp(b, want, n);
    free(b);
    return ok;
}

/* Hidden entries of dir (temporaries are ".NAME.PID-N.tmp"), their first name in first. */
static int hidden_entries(const char *dir, char *first, size_t flen) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    first[0] = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            if (!n) snprintf(first, flen, "%s", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------ outputs that are inputs */

static void outputs_equal_inputs(const char *fx) {
    char model[700], inputs[700], w[800], args[4096];
    snprintf(model, sizeof model, "%s/model", tmp);
    sh("cp -r %s/model %s", fx, tmp);
    snprintf(inputs, sizeof inputs, "%s/io.safetensors", tmp);
    sh("cp %s/transformer_io.safetensors %s", fx, inputs);
    snprintf(w, sizeof w, "%s/transformer/diffusion_pytorch_model.safetensors", model);
    size_t n_in = 0, n_w = 0;
    char *in0 = t_slurp(inputs, &n_in), *w0 = t_slurp(w, &n_w);

    snprintf(args, sizeof args, "forward --model %s --inputs %s --output %s --backend cpu", model, inputs, inputs);
    expect_error("forward --output = --inputs: refused", args, "is the input", NULL);
    snprintf(args, sizeof args, "forward --model %s --inputs %s --output %s --backend cpu", model, inputs, w);
    expect_error("forward --output = a weights file of --model: refused", args, "a file of the input", NULL);
    snprintf(args, sizeof args, "generate --model %s -p fox -o %s --backend cpu --height 64 --width 64", model, w);
    expect_error("generate -o = a weights file of --model: refused", args, "a file of the input", NULL);
    snprintf(args, sizeof args, "generate --model %s -p fox -o %s/out.png --save-latents %s --backend cpu", model, tmp, w);
    expect_error("generate --save-latents = a weights file of --model: refused", args, "a file of the input", NULL);
    snprintf(args, sizeof args, "quantize --input %s --output %s -q", w, w);
    expect_error("quantize --output = --input: refused", args, "is the input", NULL);
    char img[700];
    snprintf(img, sizeof img, "%s/ref.png", tmp);
    sh("cp %s/pipeline_image.png %s", fx, img);
    size_t n_img = 0;
    char *img0 = t_slurp(img, &n_img);
    snprintf(args, sizeof args, "generate --model %s -p fox -o %s --image %s --backend cpu", model, img, img);
    expect_error("generate -o = --image: refused", args, "is the input", NULL);
    snprintf(args, sizeof args, "generate --model %s -p fox -o %s/e.png --init-image %s --mask %s --save-latents %s "
             "--backend cpu", model, tmp, img, img, img);
    expect_error("generate --save-latents = --init-image: refused", args, "is the input", NULL);
    T_CHECK("the reference image is untouched", img0 && same_bytes(img, img0, n_img), "it changed");
    free(img0);
    snprintf(args, sizeof args, "convert --input %s --output %s -q", w, w);
    expect_error("convert --output = --input: refused", args, "is the input", NULL);
    T_CHECK("the inputs are untouched", in0 && w0 && same_bytes(inputs, in0, n_in) && same_bytes(w, w0, n_w), "an input changed");
    free(in0);
    free(w0);

    /* a config.json of another model beside the output is neither overwritten nor used */
    char od[700], cfg[760], out[760];
    snprintf(od, sizeof od, "%s/other", tmp);
    mkdir(od, 0755);
    snprintf(cfg, sizeof cfg, "%s/config.json", od);
    const char *other = "{\"_class_name\": \"AutoencoderKLFlux2\", \"latent_channels\": 32}\n";
    FILE *f = fopen(cfg, "w");
    fputs(other, f);
    fclose(f);
    snprintf(out, sizeof out, "%s/q4.safetensors", od);
    snprintf(args, sizeof args, "quantize --input %s/transformer --output %s -q", model, out);
    expect_error("quantize beside another model's config.json: refused", args, "config.json", "another model");
    snprintf(out, sizeof out, "%s/conv.safetensors", od);
    snprintf(args, sizeof args, "convert --input %s/transformer --output %s -q", model, out);
    expect_error("convert beside another model's config.json: refused", args, "config.json", "another model");
    struct stat sb;
    snprintf(out, sizeof out, "%s/q4.safetensors", od);
    T_CHECK("that config.json kept, nothing written", same_bytes(cfg, other, strlen(other)) && stat(out, &sb) != 0,
            "config changed or an output appeared");
    /* the same model's config beside the output (a second run) is replaced */
    snprintf(out, sizeof out, "%s/q4/model.safetensors", tmp);
    snprintf(args, sizeof args, "quantize --input %s/transformer --output %s -q", model, out);
    char err[8192];
    int rc1 = run(args, err, sizeof err);
    snprintf(args, sizeof args, "quantize --input %s/transformer --output %s --bits 8 -q", model, out);
    int rc2 = run(args, err, sizeof err);
    snprintf(cfg, sizeof cfg, "%s/q4/config.json", tmp);
    size_t n = 0;
    char *c = t_slurp(cfg, &n);
    T_CHECK("quantize again into the same folder updates its own config.json", rc1 == 0 && rc2 == 0 && c &&
                strstr(c, "\"bits\": 8"), "exit %d/%d: %s", rc1, rc2, err);
    free(c);
}

/* ------------------------------------------------------------------ outputs checked before the work */

static void outputs_checked_first(const char *fx) {
    char args[4096];
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s/no/such/dir/x.png --backend cpu", fx, tmp);
    expect_error("generate -o into a missing folder: fails before loading", args, "does not exist", "x.png");
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s/x.png --save-latents %s/none/l.safetensors --backend cpu",
             fx, tmp, tmp);
    expect_error("generate --save-latents into a missing folder: fails before loading", args, "does not exist", NULL);
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s --backend cpu", fx, tmp);
    expect_error("generate -o a folder: fails before loading", args, "a folder", NULL);
    /* an image format not written here: refused by name, never PNG bytes in out.gif */
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s/out.GIF --backend cpu", fx, tmp);
    expect_error("generate -o out.GIF: fails before loading, naming the formats written", args, ".GIF", ".webp");
    struct stat gst;
    char gif[4200];
    snprintf(gif, sizeof gif, "%s/out.GIF", tmp);
    T_CHECK("generate -o out.GIF: nothing written", stat(gif, &gst) != 0, "%s exists", gif);
    snprintf(args, sizeof args, "forward --model %s/model --inputs %s/transformer_io.safetensors --output %s/none/o.st "
             "--backend cpu", fx, fx, tmp);
    expect_error("forward --output into a missing folder: fails before loading", args, "does not exist", NULL);
    snprintf(args, sizeof args, "bench --preset tiny --backend cpu --json %s/none/b.jsonl", tmp);
    expect_error("bench --json into a missing folder: fails before the bench", args, "does not exist", NULL);
    snprintf(args, sizeof args, "synth --preset tiny --inputs %s/none/in.safetensors", tmp);
    expect_error("synth --inputs into a missing folder: fails first", args, "does not exist", NULL);
    snprintf(args, sizeof args, "synth --preset tiny --output %s/a --inputs %s/b.safetensors", tmp, tmp);
    expect_error("synth --output with --inputs: refused (one job at a time)", args, "--output", "--inputs");
    snprintf(args, sizeof args, "synth --preset tiny --output %s", fx);
    expect_error("synth into a non-empty folder: refused", args, "not empty", NULL);
}

/* ------------------------------------------------------------------ FIFO inputs */

/* tpl with {FX}, {TMP} and {IN} replaced by fx, tmp and in. */
static void subst(char *out, size_t n, const char *tpl, const char *fx, const char *in) {
    size_t o = 0;
    while (*tpl && o + 1 < n) {
        const char *rep = NULL;
        size_t skip = 0;
        if (!strncmp(tpl, "{FX}", 4)) { rep = fx; skip = 4; }
        else if (!strncmp(tpl, "{TMP}", 5)) { rep = tmp; skip = 5; }
        else if (!strncmp(tpl, "{IN}", 4)) { rep = in; skip = 4; }
        if (rep) { o += (size_t)snprintf(out + o, n - o, "%s", rep); tpl += skip; }
        else out[o++] = *tpl++;
        if (o >= n) o = n - 1;
    }
    out[o] = 0;
}

static void fifo_inputs(const char *fx) {
    char fifo[700], args[4096];
    snprintf(fifo, sizeof fifo, "%s/in.fifo", tmp);
    if (mkfifo(fifo, 0644)) { T_FAIL("fifo", "mkfifo: %s", strerror(errno)); return; }
    static const struct { const char *name, *tpl; } cases[] = {
        {"info FIFO: refused at once", "info {IN}"},
        {"forward --inputs FIFO: refused at once", "forward --model {FX}/model --inputs {IN} --backend cpu"},
        {"forward --model FIFO: refused at once", "forward --model {IN} --inputs {FX}/transformer_io.safetensors --backend cpu"},
        {"forward --lora FIFO: refused at once",
         "forward --model {FX}/model --inputs {FX}/transformer_io.safetensors --lora {IN} --backend cpu"},
        {"tokenize --tokenizer FIFO: refused at once", "tokenize --tokenizer {IN} hello"},
        {"generate --noise FIFO: refused at once", "generate --model {FX}/model -p fox -o {TMP}/x.png --noise {IN} --backend cpu"},
        {"generate --model FIFO: refused at once", "generate --model {IN} -p fox -o {TMP}/x.png --backend cpu"},
        {"generate --lora FIFO: refused at once", "generate --model {FX}/model -p fox -o {TMP}/x.png --lora {IN}:0.5 --backend cpu"},
        {"generate --image FIFO: refused at once", "generate --model {FX}/model -p fox -o {TMP}/x.png --image {IN} --backend cpu"},
        {"generate --init-image FIFO: refused at once",
         "generate --model {FX}/model -p fox -o {TMP}/x.png --init-image {IN} --mask {FX}/pipeline_image.png --backend cpu"},
        {"generate --mask FIFO: refused at once",
         "generate --model {FX}/model -p fox -o {TMP}/x.png --init-image {FX}/pipeline_image.png --mask {IN} --backend cpu"},
        {"quantize --input FIFO: refused at once", "quantize --input {IN} --output {TMP}/q.safetensors -q"},
        {"convert --input FIFO: refused at once", "convert --input {IN} --output {TMP}/c.gguf --format gguf-q8_0 -q"},
        {"bench --model FIFO: refused at once", "bench --model {IN} --backend cpu"},
        {"serve --model FIFO: refused before listening", "serve --model {IN} --port 0"},
        {"serve --api-key-file FIFO: refused before listening", "serve --model {FX}/model --api-key-file {IN} --port 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* a hang would be ended by run()'s `timeout 60` (exit 124), a failure here */
        subst(args, sizeof args, cases[i].tpl, fx, fifo);
        expect_error(cases[i].name, args, "FIFO", NULL);
    }
    /* a missing adapter or model is said before anything loads (no "backend" or "encoding" line first) */
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s/x.png --lora %s/none.safetensors --backend cpu", fx,
             tmp, tmp);
    expect_error("generate --lora missing: said before any work", args, "none.safetensors", "no such file");
    snprintf(args, sizeof args, "serve --model %s/none --port 0", tmp);
    expect_error("serve --model missing: said before listening", args, "none", "no such file");
    unlink(fifo);
}

/* ------------------------------------------------------------------ the newer formats: GGUF, fp8 */

static void format_outputs(const char *fx) {
    char args[4096], g[700], w[800], model[700], err[8192];
    snprintf(model, sizeof model, "%s/fmt-model", tmp);
    sh("cp -r %s/model %s", fx, model);
    snprintf(w, sizeof w, "%s/transformer/diffusion_pytorch_model.safetensors", model);
    snprintf(g, sizeof g, "%s/fmt.gguf", tmp);
    snprintf(args, sizeof args, "convert --input %s --output %s --format gguf-q4_k -q", w, g);
    int rc = run(args, err, sizeof err);
    T_CHECK("convert --format gguf-q4_k: written", rc == 0, "exit %d: %s", rc, err);
    size_t n_w = 0, n_g = 0;
    char *w0 = t_slurp(w, &n_w), *g0 = t_slurp(g, &n_g);
    snprintf(args, sizeof args, "convert --input %s --output %s --format gguf-q8_0 -q", g, g);
    expect_error("convert --format gguf over its own GGUF input: refused", args, "is the input", NULL);
    snprintf(args, sizeof args, "convert --input %s --output %s --format fp8 -q", w, w);
    expect_error("convert --format fp8 over its own input: refused", args, "is the input", NULL);
    snprintf(args, sizeof args, "convert --input %s --output %s --format gguf-q4_0 -q", model, w);
    expect_error("convert --format gguf onto a file of the input folder: refused", args, "a file of the input", NULL);
    snprintf(args, sizeof args, "convert --input %s --output %s/none/x.gguf --format gguf-q4_0 -q", w, tmp);
    expect_error("convert --format gguf into a missing folder: fails first", args, "does not exist", NULL);
    T_CHECK("the inputs of the refused conversions are untouched", w0 && g0 && same_bytes(w, w0, n_w) && same_bytes(g, g0, n_g),
            "an input changed");
    free(w0);
    free(g0);

    /* a truncated GGUF given as the model: one line naming the file and the truncation */
    char tr[700];
    snprintf(tr, sizeof tr, "%s/trunc.gguf", tmp);
    if (truncate(g, n_g / 2) == 0 && rename(g, tr) == 0) {
        snprintf(args, sizeof args, "forward --model %s --inputs %s/transformer_io.safetensors --backend cpu", tr, fx);
        expect_error("forward --model a truncated GGUF: says so", args, "trunc.gguf", "truncated");
        snprintf(args, sizeof args, "info %s", tr);
        expect_error("info on a truncated GGUF: says so", args, "trunc.gguf", "truncated");
    } else T_FAIL("truncated GGUF", "truncate: %s", strerror(errno));
    unlink(tr);
    t_rmtree(model);

    /* the size multiple is the VAE's factor x patch (the tiny model's VAE upsamples 4x: 8, not 16) */
    char png[700];
    snprintf(png, sizeof png, "%s/small.png", tmp);
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s --height 40 --width 56 --backend cpu -q", fx, png);
    rc = run(args, err, sizeof err);
    size_t n = 0;
    unsigned char *b = (unsigned char *)t_slurp(png, &n);
    int pw = b && n > 24 ? (b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19]) : -1;
    int ph = b && n > 24 ? (b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23]) : -1;
    T_CHECK("generate 56x40 with a 4x VAE: a 56x40 image (multiples of 8, not 16)", rc == 0 && pw == 56 && ph == 40,
            "exit %d, %dx%d: %s", rc, pw, ph, err);
    free(b);
    unlink(png);
}

/* ------------------------------------------------------------------ interrupted writers */

/* Starts `ditrun ARGV...` with stdout/stderr to files; returns its pid. */
static pid_t spawn(char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        char p[700];
        snprintf(p, sizeof p, "%s/spawn.log", tmp);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        /* a background run (make test &) inherits SIGINT ignored, which execv keeps: give ditrun an interactive
         * run's dispositions, or the SIGINT cases below would send a signal that does nothing */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execv(exe, argv);
        _exit(127);
    }
    return pid;
}

/* Waits (up to 60 s) until `dir` holds a temporary (a hidden entry), then sends SIGINT. Returns the wait status
 * or -1 when the process ended before a temporary was seen. */
static int interrupt_when_writing(pid_t pid, const char *dir, double extra_s) {
    char first[300];
    for (int i = 0; i < 60000; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return -1;
        if (hidden_entries(dir, first, sizeof first) > 0) {
            struct timespec ts = {0, (long)(extra_s * 1e9)};
            nanosleep(&ts, NULL);
            kill(pid, SIGINT);
            waitpid(pid, &st, 0);
            return st;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void interrupted_writers(void) {
    /* a FLUX.2 checkpoint of ~100 MB (D = 1024, one block of each kind): quantize and convert take long enough to be
     * interrupted in the middle */
    char big[700], out[700], outf[900], first[300];
    snprintf(big, sizeof big, "%s/big", tmp);
    flux2_config c;
    flux2_preset("tiny", &c);
    c.heads = 8;
    c.hidden = c.heads * c.head_dim;
    c.mlp_hidden = 3 * c.hidden;
    c.num_layers = c.num_single_layers = 1;
    c.in_channels = c.out_channels = 128;
    c.joint_dim = 1024;
    if (flux2_synth_write(&c, big, 0, 64, 3)) { T_FAIL("interrupted writers", "synth: %s", dt_last_error()); return; }
    snprintf(out, sizeof out, "%s/iout", tmp);
    mkdir(out, 0755);
    snprintf(outf, sizeof outf, "%s/model.safetensors", out);
    FILE *f = fopen(outf, "w");
    fputs("OLD OUTPUT", f);
    fclose(f);

    char *qargv[] = {exe, "quantize", "--input", big, "--output", outf, "--no-config", "--threads", "1", "-q", NULL};
    int st = interrupt_when_writing(spawn(qargv), out, 0.05);
    int left = hidden_entries(out, first, sizeof first);
    if (st == -1) T_SKIP("SIGINT during quantize", "it finished before a temporary was seen");
    else T_CHECK("SIGINT during quantize: no temporary, the old output kept, dies of SIGINT",
                 WIFSIGNALED(st) && WTERMSIG(st) == SIGINT && left == 0 && same_bytes(outf, "OLD OUTPUT", 10),
                 "status %d, %d temporaries (%s)", st, left, first);

    char *cargv[] = {exe, "convert", "--input", big, "--output", outf, "-q", NULL};
    st = interrupt_when_writing(spawn(cargv), out, 0.0);
    left = hidden_entries(out, first, sizeof first);
    if (st == -1) T_SKIP("SIGINT during convert", "it finished before a temporary was seen");
    else T_CHECK("SIGINT during convert: no temporary, the old output kept, dies of SIGINT",
                 WIFSIGNALED(st) && WTERMSIG(st) == SIGINT && left == 0 && same_bytes(outf, "OLD OUTPUT", 10),
                 "status %d, %d temporaries (%s)", st, left, first);

    char goutf[900];
    snprintf(goutf, sizeof goutf, "%s/model.gguf", out);
    f = fopen(goutf, "w");
    fputs("OLD OUTPUT", f);
    fclose(f);
    char *gargv[] = {exe, "convert", "--input", big, "--output", goutf, "--format", "gguf-q4_k", "-q", NULL};
    st = interrupt_when_writing(spawn(gargv), out, 0.0);
    left = hidden_entries(out, first, sizeof first);
    if (st == -1) T_SKIP("SIGINT during convert --format gguf-q4_k", "it finished before a temporary was seen");
    else T_CHECK("SIGINT during convert --format gguf-q4_k: no temporary, the old output kept, dies of SIGINT",
                 WIFSIGNALED(st) && WTERMSIG(st) == SIGINT && left == 0 && same_bytes(goutf, "OLD OUTPUT", 10),
                 "status %d, %d temporaries (%s)", st, left, first);

    /* synth of a klein-4B geometry (7.8 GB if it ran to the end): interrupted early, nothing remains */
    char sdir[800];
    snprintf(sdir, sizeof sdir, "%s/synth-k4", out);
    char *sargv[] = {exe, "synth", "--preset", "klein-4b", "--output", sdir, NULL};
    st = interrupt_when_writing(spawn(sargv), out, 0.3);
    left = hidden_entries(out, first, sizeof first);
    struct stat sb;
    if (st == -1) T_FAIL("SIGINT during synth", "it ended before its temporary folder was seen");
    else T_CHECK("SIGINT during synth: no temporary folder, no half folder, dies of SIGINT",
                 WIFSIGNALED(st) && WTERMSIG(st) == SIGINT && left == 0 && stat(sdir, &sb) != 0,
                 "status %d, %d temporaries (%s), folder %s", st, left, first, stat(sdir, &sb) ? "absent" : "PRESENT");

    /* the same for a whole pipeline (transformer, text encoder, VAE, tokenizer, scheduler) */
    snprintf(sdir, sizeof sdir, "%s/synth-pipe", out);
    char *pargv[] = {exe, "synth", "--preset", "klein-4b", "--pipeline", "--bits", "4", "--output", sdir, NULL};
    st = interrupt_when_writing(spawn(pargv), out, 0.3);
    left = hidden_entries(out, first, sizeof first);
    if (st == -1) T_FAIL("SIGINT during synth --pipeline", "it ended before its temporary folder was seen");
    else T_CHECK("SIGINT during synth --pipeline: no temporary folder, no half folder, dies of SIGINT",
                 WIFSIGNALED(st) && WTERMSIG(st) == SIGINT && left == 0 && stat(sdir, &sb) != 0,
                 "status %d, %d temporaries (%s), folder %s", st, left, first, stat(sdir, &sb) ? "absent" : "PRESENT");

    /* a synth that fails (here: the bundled tokenizer it copies is missing) leaves no folder either */
    char args[4096], err[8192];
    snprintf(sdir, sizeof sdir, "%s/synth-fail", out);
    snprintf(args, sizeof args, "synth --preset tiny --pipeline --output %s", sdir);
    char nomodel[700];
    snprintf(nomodel, sizeof nomodel, "%s/no-such-model", tmp);
    setenv("DITRUN_DEFAULT_MODEL", nomodel, 1);   /* where synth --pipeline copies the tokenizer from */
    int rc = run(args, err, sizeof err);
    unsetenv("DITRUN_DEFAULT_MODEL");
    left = hidden_entries(out, first, sizeof first);
    T_CHECK("a failed synth leaves no folder", rc == 1 && stat(sdir, &sb) != 0 && left == 0, "exit %d, folder %s, %d temporaries: %s",
            rc, stat(sdir, &sb) ? "absent" : "PRESENT", left, err);
    snprintf(sdir, sizeof sdir, "%s/synth-ok", out);
    snprintf(args, sizeof args, "synth --preset tiny --output %s", sdir);
    rc = run(args, err, sizeof err);
    snprintf(outf, sizeof outf, "%s/model.safetensors", sdir);
    T_CHECK("synth into a new folder: complete", rc == 0 && stat(outf, &sb) == 0 && hidden_entries(out, first, sizeof first) == 0,
            "exit %d: %s", rc, err);
}

/* ------------------------------------------------------------------ sizes, configs, messages */

/* In the JSON file at path, the value of "key" (a number or an array) becomes `value`. */
static void set_json_value(const char *path, const char *key, const char *value) {
    size_t n = 0;
    char *s = t_slurp(path, &n), pat[200];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *k = s ? strstr(s, pat) : NULL;
    if (!k) { free(s); printf("# %s: no key %s\n", path, key); return; }
    char *v = k + strlen(pat);
    while (*v == ' ') v++;
    char *e = v;
    if (*e == '[') { while (*e && *e != ']') e++; if (*e) e++; }
    else while (*e && *e != ',' && *e != '\n' && *e != '}') e++;
    FILE *f = fopen(path, "wb");
    fwrite(s, 1, (size_t)(v - s), f);
    fputs(value, f);
    fputs(e, f);
    fclose(f);
    free(s);
}

/* A copy of the fixture pipeline fx/src (in tmp/name) with one config key of `file` replaced (key NULL: none). */
static void patched_copy(const char *fx, const char *src, const char *name, const char *file, const char *key,
                         const char *value, char *dir, size_t dlen) {
    snprintf(dir, dlen, "%s/%s", tmp, name);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp -r %s/%s %s", fx, src, dir);
    if (system(cmd) || !key) return;
    snprintf(cmd, sizeof cmd, "%s/%s", dir, file);
    set_json_value(cmd, key, value);
}

/* A copy of the bundled model (in tmp/name) with one config key of `file` replaced. */
static void patched_model(const char *fx, const char *name, const char *file, const char *key, const char *value,
                          char *dir, size_t dlen) {
    snprintf(dir, dlen, "%s/%s", tmp, name);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp -r %s/model %s", fx, dir);
    if (system(cmd)) return;
    snprintf(cmd, sizeof cmd, "%s/%s", dir, file);
    set_json_value(cmd, key, value);
}

static void sizes_and_messages(const char *fx) {
    char args[4096], dir[700], p[2400];
    /* timestep = inf */
    {
        snprintf(p, sizeof p, "%s/transformer_io.safetensors", fx);
        st_file *io = st_open(p);
        st_writer *w = st_writer_new();
        for (size_t i = 0; io && i < st_count(io); i++) {
            const st_tensor *t = st_at(io, i);
            if (strncmp(t->name, "in.", 3)) continue;
            if (!strcmp(t->name, "in.timestep")) {
                float inf = 1.0f / 0.0f;
                st_writer_add_f32(w, t->name, t->ndim, t->shape, &inf);
            } else st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
        }
        snprintf(p, sizeof p, "%s/inf.safetensors", tmp);
        st_writer_save(w, p);
        st_writer_free(w);
        st_close(io);
        snprintf(args, sizeof args, "forward --model %s/model --inputs %s --backend cpu", fx, p);
        expect_error("forward with timestep = inf: refused", args, "in.timestep", "finite");
    }
    /* initial noise holding a NaN (the tiny model at 64x64: [1, 32, 8, 8]) */
    {
        static float noise[32 * 8 * 8];
        for (int i = 0; i < 32 * 8 * 8; i++) noise[i] = (float)((i * 7919) % 200 - 100) / 50.0f;
        noise[77] = 0.0f / 0.0f;
        int64_t shape[4] = {1, 32, 8, 8};
        st_writer *w = st_writer_new();
        st_writer_add_f32(w, "in.initial_latents", 4, shape, noise);
        snprintf(p, sizeof p, "%s/nan-noise.safetensors", tmp);
        st_writer_save(w, p);
        st_writer_free(w);
        snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s/n.png --noise %s --height 64 --width 64 "
                 "--backend cpu -q", fx, tmp, p);
        expect_error("generate --noise holding a NaN: refused naming the value", args, "value 77", "finite");
    }
    snprintf(args, sizeof args, "generate --model %s/model -p fox -o %s/big.png --height 16384 --width 16384 --backend cpu -q",
             fx, tmp);
    expect_error("generate 16384x16384: the limit in the error", args, "16384", "8192");
    /* past the schedule's bound: refused when the request is resolved, before the prompt is encoded (no -q: the
     * "encoding" line would show it), the limit in the error; for FLUX.2's empirical shift and Krea 2's line */
    static const struct { const char *model, *limit; } big[] = {{"model", "521451"}, {"krea2", "image tokens"}};
    for (int i = 0; i < 2; i++) {
        char err[8192], name[200];
        snprintf(args, sizeof args, "generate --model %s/%s -p fox -o %s/big.png --height 8192 --width 8192 --backend cpu",
                 fx, big[i].model, tmp);
        int rc = run(args, err, sizeof err);
        snprintf(name, sizeof name, "generate 8192x8192 on the %s fixture: over the schedule, refused before any work",
                 big[i].model);
        T_CHECK(name, rc == 1 && strstr(err, "more than this model's schedule holds") && strstr(err, big[i].limit) &&
                          !strstr(err, "encoding"), "exit %d: %s", rc, err);
    }
    /* the schedule's own bound */
    dt_sched_config sc;
    dt_sched_config_default(&sc);
    float sig[5], ts[4];
    int64_t mx = dt_schedule_max_image_tokens();
    int r1 = dt_schedule_make(&sc, 4, 1 << 20, sig, ts);
    char msg[64];
    snprintf(msg, sizeof msg, "%lld", (long long)mx);
    T_CHECK("schedule over its range: the limit in the error", r1 == -1 && strstr(dt_last_error(), msg), "rc %d: %s", r1,
            dt_last_error());
    int r2 = dt_schedule_make(&sc, 4, mx, sig, ts);
    int finite = r2 == 0;
    for (int i = 0; i < 5 && finite; i++) finite = isfinite(sig[i]) && sig[i] >= 0 && sig[i] <= 1;
    T_CHECK("schedule at its largest size: finite sigmas in [0, 1]", finite, "rc %d", r2);

    /* absurd configs: one line, no overflow */
    patched_model(fx, "wide", "transformer/config.json", "num_attention_heads", "1048576", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/transformer/config.json", dir);
    set_json_value(p, "attention_head_dim", "4096");
    snprintf(args, sizeof args, "forward --model %s --inputs %s/transformer_io.safetensors --backend cpu", dir, fx);
    expect_error("heads x head_dim = 2^32: refused with the limit", args, "4294967296", "65536");
    patched_model(fx, "deep", "text_encoder/config.json", "num_hidden_layers", "1073741824", dir, sizeof dir);
    snprintf(args, sizeof args, "generate --model %s -p fox -o %s/deep.png --backend cpu -q --height 64 --width 64", dir, tmp);
    expect_error("text encoder with 2^30 layers: one error line, no overflow", args, NULL, NULL);
    patched_model(fx, "vaepatch", "vae/config.json", "patch_size", "0", dir, sizeof dir);
    snprintf(args, sizeof args, "generate --model %s -p fox -o %s/v.png --backend cpu -q --height 64 --width 64", dir, tmp);
    expect_error("VAE patch_size 0: out of range (not 'square')", args, "patch_size 0", "out of range");
    snprintf(args, sizeof args, "generate -p fox -o %s/t.png --text-encoder-layers 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", tmp);
    expect_error("too many taps: says how many", args, "more than 16", NULL);

    /* paths: loops and over-long names say so */
    char l1[700], l2[700];
    snprintf(l1, sizeof l1, "%s/loop1", tmp);
    snprintf(l2, sizeof l2, "%s/loop2", tmp);
    if (symlink("loop2", l1) || symlink("loop1", l2)) printf("# symlink failed\n");
    snprintf(args, sizeof args, "info %s", l1);
    expect_error("info on a symbolic-link loop: says so", args, "Too many levels of symbolic links", NULL);
    snprintf(args, sizeof args, "forward --model %s/model --inputs %s --backend cpu", fx, l1);
    expect_error("forward --inputs on a symbolic-link loop: says so", args, "Too many levels of symbolic links", NULL);
    char longp[1200];
    snprintf(longp, sizeof longp, "%s/", tmp);
    size_t n = strlen(longp);
    memset(longp + n, 'a', 300);
    longp[n + 300] = 0;
    snprintf(args, sizeof args, "info %s", longp);
    expect_error("info on an over-long name: says so", args, "File name too long", NULL);

    /* an index naming "." as a shard */
    snprintf(dir, sizeof dir, "%s/dotshard", tmp);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"weight_map\": {\"x_embedder.weight\": \".\"}}", f);
    fclose(f);
    snprintf(args, sizeof args, "info %s", dir);
    expect_error("index with shard '.': not a regular file", args, "'.'", "not a regular file");
}

/* ------------------------------------------------------------------ info: described and checked */

/* `ditrun info DIR` on a copy of a fixture pipeline broken by `how` (a shell command run in the copy, or a config
 * key set): exit 1 with one line holding both needles, and stdout still describing the component `still` (NULL: no
 * check). */
static void info_refuses(const char *name, const char *src, const char *how, const char *file, const char *key,
                         const char *value, const char *n1, const char *n2, const char *still) {
    static int k;
    char dir[700], sub[32], cmd[2000], args[1600], outf[700], err[8192];
    snprintf(sub, sizeof sub, "info%d", k++);
    patched_copy(t_fixtures(), src, sub, file, key, value, dir, sizeof dir);
    if (how) {
        snprintf(cmd, sizeof cmd, "cd %s && %s", dir, how);
        if (system(cmd)) printf("# %s failed\n", cmd);
    }
    snprintf(args, sizeof args, "info %s", dir);
    snprintf(outf, sizeof outf, "%s/info.txt", tmp);
    int rc = run_to(args, outf, err, sizeof err);
    size_t n = 0;
    char *out = t_slurp(outf, &n), want[64];
    snprintf(want, sizeof want, "%s: ", still ? still : "");
    int lines = 0;
    for (char *p = err; *p; p++) lines += *p == '\n';
    if (rc != 1 || lines != 1 || strncmp(err, "ditrun: error: ", 15)) T_FAIL(name, "exit %d (want 1 and one line): %s", rc, err);
    else if (!strstr(err, n1) || (n2 && !strstr(err, n2))) T_FAIL(name, "message lacks '%s' / '%s': %s", n1, n2 ? n2 : "", err);
    else if (still && (!out || !strstr(out, want))) T_FAIL(name, "'%s' not described: %s", still, out ? out : "(no output)");
    else T_PASS(name);
    free(out);
    unlink(outf);
    t_rmtree(dir);
}

static void info_checks(const char *fx) {
    char args[1600], outf[700], err[8192];
    snprintf(outf, sizeof outf, "%s/info.txt", tmp);
    /* whole pipelines: every component's geometry from the parsers the pipeline loads them with */
    static const struct { const char *src, *want[5]; } ok[] = {
        {"model", {"D=256 (2 heads x 128)", "geometry     D=32 (4 heads x 16, 2 kv), 4 layers", "latent 8 x patch 2",
                   "4x upsampling", "scheduler: dynamic shifting"}},
        {"krea2", {"Krea2Transformer2DModel", "geometry     D=64 (4 heads x 16, 2 kv), 4 layers", "base 16, z 4, dim_mult (1,2,2)",
                   "4x upsampling", "scheduler: dynamic shifting"}},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        snprintf(args, sizeof args, "info %s/%s", fx, ok[i].src);
        int rc = run_to(args, outf, err, sizeof err);
        size_t n = 0;
        char *out = t_slurp(outf, &n), name[200];
        const char *missing = NULL;
        for (int w = 0; w < 5 && !missing; w++)
            if (!out || !strstr(out, ok[i].want[w])) missing = ok[i].want[w];
        snprintf(name, sizeof name, "info %s pipeline: exit 0, every component described", ok[i].src);
        T_CHECK(name, rc == 0 && !err[0] && !missing, "exit %d, lacks '%s': %s%s", rc, missing ? missing : "", err,
                out ? out : "");
        free(out);
    }
    snprintf(args, sizeof args, "info %s/model/text_encoder/model.safetensors", fx);
    int rc = run_to(args, outf, err, sizeof err);
    T_CHECK("info on a lone text-encoder file (no config.json): exit 0", rc == 0 && !err[0], "exit %d: %s", rc, err);
    unlink(outf);

    info_refuses("info: invalid transformer config: exit 1 naming it", "model", NULL, "transformer/config.json", "num_layers",
                 "-3", "num_layers", "transformer: invalid config", "vae");
    info_refuses("info: invalid text-encoder config: exit 1 naming it", "model", NULL, "text_encoder/config.json",
                 "num_hidden_layers", "-2", "num_hidden_layers", "text_encoder/config.json", "vae");
    info_refuses("info: invalid VAE config: exit 1 naming it", "model", NULL, "vae/config.json", "latent_channels", "0",
                 "latent_channels", "vae", "text_encoder");
    info_refuses("info: invalid Qwen-Image VAE config: exit 1 naming it", "krea2", NULL, "vae/config.json", "z_dim", "0",
                 "z_dim", "vae", "transformer");
    info_refuses("info: invalid scheduler config: exit 1 naming it", "model", NULL, "scheduler/scheduler_config.json",
                 "time_shift_type", "\"cubic\"", "time_shift_type", "scheduler_config.json", "vae");
    info_refuses("info: a pipeline missing a listed component: exit 1 naming it", "model", "rm -r vae", NULL, NULL, NULL,
                 "'vae'", "folder", "text_encoder");
    info_refuses("info: a component without weights: exit 1 naming it", "model", "rm vae/*.safetensors", NULL, NULL, NULL,
                 "vae", "no .safetensors", "text_encoder");
    info_refuses("info: no tokenizer.json: exit 1", "model", "rm tokenizer/tokenizer.json", NULL, NULL, NULL, "tokenizer.json",
                 NULL, "vae");
    info_refuses("info: Krea 2 without its scheduler: exit 1", "krea2",
                 "rm -r scheduler && sed -i '/\"scheduler\"/,/]/d' model_index.json", NULL, NULL, NULL, "scheduler_config.json",
                 NULL, "vae");
    info_refuses("info: component folders without model_index.json: exit 1 saying so", "model", "rm model_index.json", NULL,
                 NULL, NULL, "model_index.json", NULL, NULL);
}

/* ------------------------------------------------------------------ full and read-only filesystems */

/* In a private mount namespace (unshare -rm: nothing is mounted outside it), a tmpfs of `size` at tmp/fs holding
 * `target` = "OLD", made read-only when ro; `ditrun ARGS` ({FS} = that folder) must fail with one line holding
 * `want`, leave "OLD" in the target and nothing else in the folder. Returns 0, or 77 when namespaces are not
 * permitted here (the caller skips). */
static int fs_case(const char *name, const char *size, int ro, const char *target, const char *args_tpl, const char *want) {
    char fs[700], args[2048], script[8192], outf[700], errf[700];
    snprintf(fs, sizeof fs, "%s/fs", tmp);
    mkdir(fs, 0755);
    snprintf(outf, sizeof outf, "%s/fs.out", tmp);
    snprintf(errf, sizeof errf, "%s/fs.err", tmp);
    subst(args, sizeof args, args_tpl, t_fixtures(), fs);
    snprintf(script, sizeof script,
             "timeout 120 unshare -rm sh -c 'mount -t tmpfs -o size=%s none %s 2>/dev/null || exit 77; printf OLD > %s/%s; "
             "%s%s%s%s %s 2>%s; echo \"$?|$(cat %s/%s)|$(ls -A %s | tr \"\\n\" \" \")\" > %s' 2>/dev/null",
             size, fs, fs, target, ro ? "mount -o remount,ro " : "", ro ? fs : "", ro ? "; " : "", exe, args, errf, fs, target,
             fs, outf);
    int st = system(script);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) { rmdir(fs); return 77; }
    size_t n = 0, m = 0;
    char *out = t_slurp(outf, &n), *err = t_slurp(errf, &m), want_out[400];
    snprintf(want_out, sizeof want_out, "1|OLD|%s \n", target);
    int lines = 0;
    for (char *q = err; q && *q; q++) lines += *q == '\n';
    T_CHECK(name, out && err && !strcmp(out, want_out) && lines == 1 && strstr(err, want),
            "got '%s' (want '%s'), stderr: %s", out ? out : "(none)", want_out, err ? err : "(none)");
    free(out);
    free(err);
    unlink(outf);
    unlink(errf);
    rmdir(fs);
    return 0;
}

static void full_and_readonly(void) {
    static const struct { const char *name, *size; int ro; const char *target, *args, *want; } cases[] = {
        {"generate on a full filesystem: 'No space left', the old PNG kept, no temporary", "8k", 0, "x.png",
         "generate --model {FX}/model -p fox -o {IN}/x.png --height 64 --width 64 --backend cpu -q", "No space left"},
        {"quantize on a full filesystem: the old file kept, no temporary", "64k", 0, "q.safetensors",
         "quantize --input {FX}/model/transformer --output {IN}/q.safetensors --no-config -q", "No space left"},
        {"convert --format gguf on a full filesystem: the old file kept, no temporary", "64k", 0, "g.gguf",
         "convert --input {FX}/model/transformer --output {IN}/g.gguf --format gguf-q8_0 -q", "No space left"},
        {"forward on a full filesystem: the old output kept, no temporary", "8k", 0, "o.safetensors",
         "forward --model {FX}/model --inputs {FX}/transformer_io.safetensors --output {IN}/o.safetensors --backend cpu -q",
         "No space left"},
        {"generate onto a read-only filesystem: refused before any work, the old PNG kept", "64k", 1, "x.png",
         "generate --model {FX}/model -p fox -o {IN}/x.png --height 64 --width 64 --backend cpu -q", "Read-only file system"},
        {"quantize onto a read-only filesystem: refused, the old file kept", "64k", 1, "q.safetensors",
         "quantize --input {FX}/model/transformer --output {IN}/q.safetensors --no-config -q", "Read-only file system"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (fs_case(cases[i].name, cases[i].size, cases[i].ro, cases[i].target, cases[i].args, cases[i].want) == 77) {
            T_SKIP("full and read-only filesystems", "unshare -rm (a private mount namespace) is not permitted here");
            return;
        }
}

int main(void) {
    const char *b = getenv("BUILD");
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    if (access(exe, X_OK)) { T_SKIP("robust cli", "%s not built", exe); return T_DONE(); }
    if (t_tmpdir(tmp, sizeof tmp, "robust-cli")) { T_FAIL("tmpdir", "cannot create"); return T_DONE(); }
    const char *fx = t_fixtures();
    dt_log_level = 0;
    outputs_equal_inputs(fx);
    outputs_checked_first(fx);
    fifo_inputs(fx);
    format_outputs(fx);
    sizes_and_messages(fx);
    info_checks(fx);
    full_and_readonly();
    interrupted_writers();
    t_rmtree(tmp);
    return T_DONE();
}
