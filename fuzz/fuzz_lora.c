/* fuzz_lora.c — libFuzzer target: the fuzzer's bytes are a LoRA adapter .safetensors file, loaded onto the bundled
 * tiny FLUX.2 model (tests/fixtures/model; run from the repository root) through flux2_load_ex: key layouts
 * (PEFT/diffusers, kohya, BFL names), alpha tensors and metadata, shape and rank checks, then the merge into dense
 * weights or (when the first byte is odd) side products through the LoRA backend wrapper, and a 2-token forward.
 * Every failure must be a clean error naming the adapter file. Seeds: fuzz/corpus/lora (fuzz/make_lora_seeds.py). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "models/flux2.h"
#include "fuzz_tmp.h"

static char path[600];
static dt_backend *be;

static void init(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    snprintf(path, sizeof path, "%s/adapter.safetensors", fuzz_tmpdir("lora"));
    dt_log_level = 0;
    be = dt_backend_cpu_create(&(dt_backend_opts){.threads = 1});
    if (!be) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!be) init();
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    dt_lora_spec spec;
    if (dt_lora_spec_parse(path, &spec)) abort();
    flux2_load_opts o = {&spec, 1, size && (data[0] & 1)};
    flux2_model *m = flux2_load_ex(be, "tests/fixtures/model", &o);
    if (!m) {
        if (!strstr(dt_last_error(), "adapter.safetensors")) __builtin_trap();   /* errors name the adapter */
        return 0;
    }
    const flux2_config *c = flux2_get_config(m);
    const int n = 2, t = 1;
    float *img = calloc((size_t)n * c->in_channels, sizeof(float)), *txt = calloc((size_t)t * c->joint_dim, sizeof(float));
    float *iid = calloc((size_t)n * c->n_axes, sizeof(float)), *tid = calloc((size_t)t * c->n_axes, sizeof(float));
    float *out = calloc((size_t)n * c->out_channels, sizeof(float));
    iid[c->n_axes + 1] = 1.0f;
    (void)flux2_forward(m, img, n, txt, t, 0.5f, iid, tid, out, NULL, NULL);
    free(img); free(txt); free(iid); free(tid); free(out);
    flux2_free(m);
    return 0;
}
