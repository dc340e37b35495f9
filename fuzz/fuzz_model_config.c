/* fuzz_model_config.c — libFuzzer target: config loading the way the model loaders do it. The first byte
 * picks a component (FLUX.2 transformer, Krea 2 transformer, Qwen3 text encoder, FLUX.2 VAE, scheduler, Z-Image
 * transformer, AutoencoderKL), the rest is its config.json: parsed by every config parser (flux2_config_parse,
 * krea2_config_parse, zimage_config_parse, dt_sched_config_parse), then written into a folder that holds the tiny fixture's real weights
 * (symlinked from tests/fixtures, run from the repository root) and loaded with the real loader, so that
 * hostile geometry meets real tensors. Every failure must be a clean error. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/backend.h"
#include "fuzz_tmp.h"
#include "io/json.h"
#include "models/flux2.h"
#include "models/krea2.h"
#include "models/qwen3.h"
#include "models/vae_kl.h"
#include "models/vae_flux2.h"
#include "models/zimage.h"
#include "pipeline/scheduler.h"

enum { C_FLUX2, C_KREA2, C_QWEN3, C_VAE, C_SCHED, C_ZIMAGE, C_VAEKL, C_COUNT };
static const char *fixture_file[C_COUNT] = {
    "model/transformer/diffusion_pytorch_model.safetensors", "krea2/transformer/diffusion_pytorch_model.safetensors",
    "model/text_encoder/model.safetensors", "model/vae/diffusion_pytorch_model.safetensors", NULL,
    "zimage/model/transformer/diffusion_pytorch_model.safetensors", "zimage/model/vae/diffusion_pytorch_model.safetensors"};
static char dirs[C_COUNT][600], cfg_path[C_COUNT][640];
static int have_weights[C_COUNT];
static dt_backend *be;

static void init(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    dt_log_level = 0;
    const char *root = fuzz_tmpdir("model-config");
    const char *fx = getenv("DITRUN_FIXTURES");
    if (!fx || !*fx) fx = "tests/fixtures";
    for (int c = 0; c < C_COUNT; c++) {
        snprintf(dirs[c], sizeof dirs[c], "%s/c%d", root, c);
        if (mkdir(dirs[c], 0755)) abort();
        snprintf(cfg_path[c], sizeof cfg_path[c], "%s/%s", dirs[c], c == C_SCHED ? "scheduler_config.json" : "config.json");
        if (!fixture_file[c]) continue;
        char src[PATH_MAX], abs_src[PATH_MAX], dst[256];
        snprintf(src, sizeof src, "%s/%s", fx, fixture_file[c]);
        const char *base = strrchr(fixture_file[c], '/') + 1;
        snprintf(dst, sizeof dst, "%s/%s", dirs[c], base);
        if (realpath(src, abs_src) && symlink(abs_src, dst) == 0) have_weights[c] = 1;
    }
    be = dt_backend_cpu_create(&(dt_backend_opts){.threads = 1});
    if (!be) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!be) init();
    if (size < 1) return 0;
    int c = data[0] % C_COUNT;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    /* every parser on the document */
    json *j = json_parse(text, len, "config.json");
    if (j) {
        flux2_config fc;
        krea2_config kc;
        zimage_config zc;
        dt_sched_config sc;
        (void)flux2_config_parse(j, "config.json", &fc);
        (void)krea2_config_parse(j, "config.json", &kc);
        (void)zimage_config_parse(j, "config.json", &zc);
        dt_sched_config_default(&sc);
        if (dt_sched_config_parse(j, "config.json", &sc) == 0) {
            float sig[9], ts[8];
            (void)dt_schedule_make(&sc, 8, 4096, sig, ts);
            (void)dt_schedule_make(&sc, 1, 1, sig, ts);
        }
        json_free(j);
    }

    /* the loader of the chosen component on real weights */
    FILE *f = fopen(cfg_path[c], "wb");
    if (!f) abort();
    if (len && fwrite(text, 1, len, f) != len) abort();
    fclose(f);
    switch (c) {
    case C_FLUX2: if (have_weights[c]) flux2_free(flux2_load(be, dirs[c])); break;
    case C_KREA2: if (have_weights[c]) krea2_free(krea2_load(be, dirs[c])); break;
    case C_QWEN3: if (have_weights[c]) dt_qwen3_free(dt_qwen3_load(be, dirs[c], 0)); break;
    case C_VAE:
        if (have_weights[c]) {
            dt_vae *v = dt_vae_load(be, dirs[c]);
            if (v) (void)dt_vae_load_encoder(v);   /* the encoder's own keys (block_out_channels, down_block_types) */
            dt_vae_free(v);
        }
        break;
    case C_ZIMAGE: if (have_weights[c]) zimage_free(zimage_load(be, dirs[c])); break;
    case C_VAEKL: if (have_weights[c]) dt_vae_free(dt_vae_kl_load(be, dirs[c])); break;
    case C_SCHED: {
        dt_sched_config sc;
        if (dt_sched_config_load(cfg_path[c], &sc) == 0) {
            float sig[5], ts[4];
            (void)dt_schedule_make(&sc, 4, 1024, sig, ts);
        }
        break;
    }
    }
    dt_clear_error();
    return 0;
}
