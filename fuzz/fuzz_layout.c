/* fuzz_layout.c — libFuzzer target: the fuzzer's bytes are a FLUX.2 transformer .safetensors file (BFL,
 * mflux or diffusers keys; dense or MLX-quantized; no config.json). Exercised: layout detection, the
 * derived tensors (qkv row views, swapped final-modulation halves) read end to end, geometry inference,
 * flux2_load and a 2-token forward when it loads, and the streaming writers of `ditrun convert` and
 * `ditrun quantize`. Every failure must be a clean error naming the file. Seeds: fuzz/corpus/layout
 * (fuzz/make_layout_seeds.py). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "io/weights.h"
#include "models/flux2.h"
#include "models/flux2_layouts.h"
#include "fuzz_tmp.h"
#include "export/quantize_file.h"

static char dir[512], path[600], conv[600], quant[600], conv_cfg[600];
static dt_backend *be;

static void init(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    snprintf(dir, sizeof dir, "%s", fuzz_tmpdir("layout"));
    snprintf(conv_cfg, sizeof conv_cfg, "%s/config.json", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(conv, sizeof conv, "%s/converted.safetensors", dir);
    snprintf(quant, sizeof quant, "%s/q4.safetensors", dir);
    dt_log_level = 0;
    be = dt_backend_cpu_create(&(dt_backend_opts){.threads = 1});
    if (!be) abort();
}

static void run_forward(flux2_model *m) {
    const flux2_config *c = flux2_get_config(m);
    const int n = 2, t = 1;
    float *img = calloc((size_t)n * c->in_channels, sizeof(float)), *txt = calloc((size_t)t * c->joint_dim, sizeof(float));
    float *iid = calloc((size_t)n * c->n_axes, sizeof(float)), *tid = calloc((size_t)t * c->n_axes, sizeof(float));
    float *out = calloc((size_t)n * c->out_channels, sizeof(float));
    for (int i = 0; i < n * c->in_channels; i++) img[i] = (float)(i % 7) * 0.25f - 0.5f;
    for (int i = 0; i < t * c->joint_dim; i++) txt[i] = (float)(i % 5) * 0.1f;
    iid[c->n_axes + 1] = 1.0f;
    (void)flux2_forward(m, img, n, txt, t, 0.5f, iid, tid, out, NULL, NULL);
    free(img); free(txt); free(iid); free(tid); free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!be) init();
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);

    dt_weights *w = dt_weights_open(path);
    if (!w) {
        if (!strstr(dt_last_error(), dir)) __builtin_trap();   /* errors name the file */
        return 0;
    }
    flux2_layout l = flux2_layout_detect(w);
    if (flux2_layout_install(w) == 0 || l != FLUX2_LAYOUT_UNKNOWN) {
        volatile unsigned sum = 0;
        for (size_t i = 0; i < dt_weights_derived_count(w); i++) {
            const st_tensor *t = dt_weights_derived_at(w, i);
            if (dt_weights_find(w, t->name) != t) __builtin_trap();
            for (size_t b = 0; b < t->nbytes; b++) sum += ((const unsigned char *)t->data)[b];
        }
    }
    dt_weights_close(w);
    dt_clear_error();

    flux2_model *m = flux2_load(be, path);
    if (m) {
        run_forward(m);
        flux2_free(m);
        int nw, ns;
        (void)flux2_convert_to_diffusers(path, conv, &nw, &ns);
    }
    dt_quant_opts o;
    dt_quant_opts_default(&o);
    o.bits = 4; o.group = 32; o.threads = 1; o.report = 0; o.write_config = 0;
    dt_quant_stats st;
    (void)dt_quantize_checkpoint(path, quant, &o, &st);
    unlink(conv);
    unlink(conv_cfg);   /* convert writes config.json beside its output; the next input may be another model */
    unlink(quant);
    return 0;
}
