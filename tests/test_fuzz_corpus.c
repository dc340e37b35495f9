/* test_fuzz_corpus.c — the fuzzers' kept inputs as regression tests in the normal build (and under
 * `make test-asan`): every file of fuzz/corpus/NAME and fuzz/regressions/NAME goes through the code its
 * fuzzer drives (JSON parser, safetensors reader, config parsers + loaders, tokenizer.json loader,
 * FLUX.2 layouts + load + forward + quantize + convert, image decoders + editing preprocessing, GGUF reader +
 * block dequantization, LoRA adapters on the tiny model, the server's generation and edit requests). Each input must load
 * or fail with an error message; a crash, leak or sanitizer report fails the program. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/backend.h"
#include "io/gguf.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "models/flux2.h"
#include "models/flux2_layouts.h"
#include "models/krea2.h"
#include "pipeline/scheduler.h"
#include "text/tokenizer.h"
#include "quant/ggml_quants.h"
#include "export/quantize_file.h"
#include "test.h"
#include "../fuzz/fuzz_api_drive.h"
#include "../fuzz/fuzz_api_edit_drive.h"
#include "../fuzz/fuzz_image_drive.h"

static char tmpdir[256];
static dt_backend *be;

static int write_all(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = n && fwrite(d, 1, n, f) != n ? -1 : 0;
    return fclose(f) ? -1 : rc;
}

/* Each returns 1 when the input was accepted, 0 when it was rejected with an error message, -1 when
 * rejected without one. */
static int one_json(const unsigned char *d, size_t n) {
    json *j = json_parse((const char *)d, n, "corpus.json");
    if (!j) return *dt_last_error() ? 0 : -1;
    json_free(j);
    return 1;
}

static int one_safetensors(const unsigned char *d, size_t n) {
    st_file *f = st_open_memory(d, n, "corpus.safetensors");
    if (!f) return strstr(dt_last_error(), "corpus.safetensors") ? 0 : -1;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (t->numel <= (1 << 20)) free(st_to_f32(t));
    }
    st_close(f);
    return 1;
}

static int one_config(const unsigned char *d, size_t n) {
    json *j = json_parse((const char *)d, n, "config.json");
    if (!j) return 0;
    flux2_config fc;
    krea2_config kc;
    dt_sched_config sc;
    (void)flux2_config_parse(j, "config.json", &fc);
    (void)krea2_config_parse(j, "config.json", &kc);
    dt_sched_config_default(&sc);
    if (dt_sched_config_parse(j, "config.json", &sc) == 0) {
        float sig[5], ts[4];
        (void)dt_schedule_make(&sc, 4, 1024, sig, ts);
    }
    json_free(j);
    return 1;
}

/* model_config inputs: first byte = component, rest = config.json; the FLUX.2 one is loaded on the
 * fixture's weights (the fuzzer also loads Krea 2, Qwen3 and the VAE; the parsers cover them here). */
static int one_model_config(const unsigned char *d, size_t n) {
    if (!n) return 1;
    int r = one_config(d + 1, n - 1);
    if (d[0] % 5 == 0) {
        char dir[400], p[500], src[512], abs_src[4096];
        snprintf(dir, sizeof dir, "%s/mc", tmpdir);
        mkdir(dir, 0755);
        snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
        snprintf(src, sizeof src, "%s/model/transformer/diffusion_pytorch_model.safetensors", t_fixtures());
        if (access(p, F_OK) != 0 && realpath(src, abs_src)) (void)!symlink(abs_src, p);
        snprintf(p, sizeof p, "%s/config.json", dir);
        write_all(p, d + 1, n - 1);
        flux2_model *m = flux2_load(be, dir);
        if (!m && !*dt_last_error()) return -1;
        flux2_free(m);
    }
    return r;
}

static int one_tokenizer(const unsigned char *d, size_t n) {
    char p[400];
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    if (write_all(p, d, n)) return -1;
    dt_tokenizer *t = dt_tokenizer_load(p);
    if (!t) return *dt_last_error() ? 0 : -1;
    int32_t *ids = NULL;
    int cnt = 0;
    if (dt_tokenize(t, "Hello world, don't caf\xC3\xA9 <|im_end|>", &ids, &cnt) == 0) free(ids);
    dt_tokenizer_free(t);
    return 1;
}

static int one_image(const unsigned char *d, size_t n) { return fuzz_image_one(d, n); }
static int one_api(const unsigned char *d, size_t n) { return fuzz_api_one(d, n); }
static int one_api_edit(const unsigned char *d, size_t n) { return fuzz_api_edit_one(d, n); }

/* an adapter on the tiny fixture: load (merge, or side products for an odd first byte) + a 2-token forward */
static int one_lora(const unsigned char *d, size_t n) {
    char p[400], model[400];
    snprintf(p, sizeof p, "%s/adapter.safetensors", tmpdir);
    snprintf(model, sizeof model, "%s/model", t_fixtures());
    if (write_all(p, d, n)) return -1;
    dt_lora_spec spec;
    if (dt_lora_spec_parse(p, &spec)) return -1;
    flux2_load_opts o = {.loras = &spec, .n_loras = 1, .lora_side = n && (d[0] & 1)};
    flux2_model *m = flux2_load_ex(be, model, &o);
    if (!m) return strstr(dt_last_error(), "adapter.safetensors") ? 0 : -1;
    const flux2_config *c = flux2_get_config(m);
    float *img = calloc((size_t)2 * c->in_channels, sizeof(float)), *txt = calloc((size_t)c->joint_dim, sizeof(float));
    float *iid = calloc((size_t)2 * c->n_axes, sizeof(float)), *tid = calloc((size_t)c->n_axes, sizeof(float));
    float *out = calloc((size_t)2 * c->out_channels, sizeof(float));
    int r = flux2_forward(m, img, 2, txt, 1, 0.5f, iid, tid, out, NULL, NULL) == 0 ? 1 : -1;
    free(img); free(txt); free(iid); free(tid); free(out);
    flux2_free(m);
    return r;
}

static int one_layout(const unsigned char *d, size_t n) {
    char p[400], q[400], c[400];
    snprintf(p, sizeof p, "%s/layout.safetensors", tmpdir);
    snprintf(q, sizeof q, "%s/layout-q4.safetensors", tmpdir);
    snprintf(c, sizeof c, "%s/layout-conv.safetensors", tmpdir);
    if (write_all(p, d, n)) return -1;
    dt_weights *w = dt_weights_open(p);
    if (!w) return strstr(dt_last_error(), p) ? 0 : -1;
    (void)flux2_layout_install(w);
    dt_weights_close(w);
    int r = 0;
    flux2_model *m = flux2_load(be, p);
    if (m) {
        r = 1;
        const flux2_config *cf = flux2_get_config(m);
        float *img = dt_calloc((size_t)2 * cf->in_channels, sizeof(float)), *txt = dt_calloc((size_t)cf->joint_dim, sizeof(float));
        float *ids = dt_calloc((size_t)3 * cf->n_axes, sizeof(float)), *out = dt_calloc((size_t)2 * cf->out_channels, sizeof(float));
        (void)flux2_forward(m, img, 2, txt, 1, 0.5f, ids, ids + 2 * cf->n_axes, out, NULL, NULL);
        free(img); free(txt); free(ids); free(out);
        flux2_free(m);
        int nw, ns;
        (void)flux2_convert_to_diffusers(p, c, &nw, &ns);
    } else if (!*dt_last_error()) return -1;
    dt_quant_opts o;
    dt_quant_opts_default(&o);
    o.bits = 4; o.group = 32; o.threads = 1; o.report = 0; o.write_config = 0;
    dt_quant_stats st;
    (void)dt_quantize_checkpoint(p, q, &o, &st);
    unlink(q);
    unlink(c);
    return r;
}

static int one_gguf(const unsigned char *d, size_t n) {
    gguf_file *f = gguf_open_memory(d, n, "corpus.gguf");
    if (!f) return strstr(dt_last_error(), "corpus.gguf") ? 0 : -1;
    int ok = 1;
    for (size_t i = 0; i < gguf_count(f) && ok; i++) {
        const st_tensor *t = gguf_at(f, i);
        if (t->numel > (1 << 20)) continue;
        float *v = dt_malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
        if (dt_dtype_is_block(t->dtype)) ok = dt_ggml_dequant(t->dtype, t->data, t->numel, v) == 0;
        else { free(v); v = st_to_f32(t); }
        free(v);
    }
    gguf_close(f);
    return ok ? 1 : -1;
}

static void replay(const char *name, int (*fn)(const unsigned char *, size_t)) {
    const char *kinds[2] = {"corpus", "regressions"};
    for (int k = 0; k < 2; k++) {
        char dir[300];
        snprintf(dir, sizeof dir, "fuzz/%s/%s", kinds[k], name);
        DIR *dp = opendir(dir);
        if (!dp) continue;
        int files = 0, accepted = 0, silent = 0;
        char first_silent[600] = "";
        struct dirent *e;
        while ((e = readdir(dp))) {
            if (e->d_name[0] == '.') continue;
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            size_t n = 0;
            unsigned char *d = (unsigned char *)t_slurp(p, &n);
            if (!d) continue;
            dt_clear_error();
            int r = fn(d, n);
            free(d);
            files++;
            accepted += r == 1;
            if (r < 0 && !silent++) snprintf(first_silent, sizeof first_silent, "%s", p);
        }
        closedir(dp);
        char tname[200];
        snprintf(tname, sizeof tname, "fuzz %s/%s replays (%d files, %d accepted)", kinds[k], name, files, accepted);
        T_CHECK(tname, files > 0 && silent == 0, "%d inputs rejected without an error message, e.g. %s", silent, first_silent);
    }
}

int main(void) {
    if (access("fuzz/corpus", F_OK) != 0) { T_SKIP("fuzz corpus", "run from the repository root (fuzz/corpus not found)"); return T_DONE(); }
    snprintf(tmpdir, sizeof tmpdir, "%s/ditrun-fuzz-corpus-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) { T_FAIL("tmpdir", "mkdtemp failed"); return T_DONE(); }
    dt_log_level = 0;
    be = dt_backend_cpu_create(&(dt_backend_opts){.threads = 1});
    replay("json", one_json);
    replay("safetensors", one_safetensors);
    replay("gguf", one_gguf);
    replay("lora", one_lora);
    replay("config", one_config);
    replay("model_config", one_model_config);
    replay("tokenizer", one_tokenizer);
    replay("layout", one_layout);
    replay("image", one_image);
    replay("api", one_api);
    replay("api_edit", one_api_edit);
    be->destroy(be);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("# could not remove %s\n", tmpdir);
    return T_DONE();
}
