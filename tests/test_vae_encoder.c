/* test_vae_encoder.c — reference images to the transformer's reference tokens: the editing fixtures' images
 * prepared (image/edit_prep.h), VAE-encoded (posterior mode), patchified, batch-norm normalized and packed
 * (pipeline/ref_tokens.h), against diffusers' mid.ref_latents_packed / mid.ref_ids of edit1 (one reference)
 * and edit2 (two, one of them RGBA). Also: the MLX weight layout gives the same tokens, a VAE without encoder
 * weights still loads and decodes (the encoder is optional) and refuses to encode with a clear error, bad
 * sizes are refused, and the CUDA encoder against the CPU (skipped without a GPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "image/edit_prep.h"
#include "image/image.h"
#include "io/safetensors.h"
#include "models/vae_flux2.h"
#include "pipeline/ref_tokens.h"
#include "test.h"
#include "vae_copy.h"

/* float32 vs the float32 reference: same math, summation order differs (im2col sgemm vs torch's conv,
 * double-accumulated GroupNorm): ~1e-6 expected; the contract is 1e-4. */
#define TOL_CPU 1e-4
/* CUDA runs activations (and the uploaded image) in bf16 through ~15 layers: ~3e-3 expected. */
#define TOL_CUDA 1e-2

static char path_buf[1024];
static const char *fx(const char *rel) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", t_fixtures(), rel);
    return path_buf;
}

/* Prepared references of a case: edit1 = ref0; edit2 = ref0, ref1. */
static int prepare(dt_vae *v, int n, dt_prep_image *out) {
    const char *files[2] = {"edit/ref0.png", "edit/ref1.png"};
    for (int k = 0; k < n; k++) {
        char p[1024];
        snprintf(p, sizeof p, "%s", fx(files[k]));
        dt_image im;
        if (dt_image_read_file(p, &im)) return -1;
        int rc = dt_prep_reference(&im, p, dt_ref_multiple(v), &out[k]);
        dt_image_free(&im);
        if (rc) return -1;
    }
    return 0;
}

/* Encode case `tag` (n references) on backend be and compare with the fixture; *tokens_out gets a copy of the
 * tokens (may be NULL). Returns 0 when it ran. */
static int run_case(const char *tag, dt_backend *be, const char *vae_dir, int n, const char *io_file, double tol,
                    float **tokens_out) {
    char name[160];
    dt_vae *v = dt_vae_load(be, vae_dir);
    snprintf(name, sizeof name, "%s: load", tag);
    if (!v) { T_FAIL(name, "%s", dt_last_error()); return -1; }
    dt_prep_image imgs[2] = {{0}};
    dt_ref_tokens r = {0};
    int rc = -1;
    snprintf(name, sizeof name, "%s: prepare + encode", tag);
    double t0 = dt_now();
    if (prepare(v, n, imgs) || dt_ref_tokens_encode(v, imgs, n, &r)) {
        T_FAIL(name, "%s", dt_last_error());
        goto done;
    }
    printf("INFO %s: %d image(s) -> %d tokens x %d in %.1f ms\n", tag, n, r.n_tokens, r.channels, (dt_now() - t0) * 1e3);
    st_file *io = st_open(fx(io_file));
    const st_tensor *tp = io ? st_find(io, "mid.ref_latents_packed") : NULL, *ti = io ? st_find(io, "mid.ref_ids") : NULL;
    if (!tp || !ti) {
        T_FAIL(name, "fixture %s: %s", io_file, io ? "mid.ref_* missing" : dt_last_error());
        if (io) st_close(io);
        goto done;
    }
    snprintf(name, sizeof name, "%s: token count and width", tag);
    T_CHECK(name, tp->numel == (int64_t)r.n_tokens * r.channels && ti->numel == (int64_t)r.n_tokens * 4,
            "%d x %d tokens, reference %lld values", r.n_tokens, r.channels, (long long)tp->numel);
    if (tp->numel == (int64_t)r.n_tokens * r.channels && ti->numel == (int64_t)r.n_tokens * 4) {
        float *ref = st_to_f32(tp), *ids = st_to_f32(ti);
        snprintf(name, sizeof name, "%s: mid.ref_latents_packed", tag);
        t_check_rel_l2(name, r.tokens, ref, (size_t)tp->numel, tol);
        int bad = 0;
        for (int64_t i = 0; i < ti->numel; i++) bad += ids[i] != r.ids[i];
        snprintf(name, sizeof name, "%s: mid.ref_ids (T = 10 + 10k, row, col, 0)", tag);
        T_CHECK(name, bad == 0, "%d of %lld values differ", bad, (long long)ti->numel);
        if (tokens_out) {
            *tokens_out = malloc((size_t)tp->numel * sizeof(float));
            memcpy(*tokens_out, r.tokens, (size_t)tp->numel * sizeof(float));
        }
        free(ref);
        free(ids);
        rc = 0;
    }
    st_close(io);
done:
    dt_ref_tokens_free(&r);
    for (int k = 0; k < 2; k++) dt_prep_image_free(&imgs[k]);
    dt_vae_free(v);
    return rc;
}

int main(void) {
    dt_backend_opts opts = {0};
    dt_backend *cpu = dt_backend_cpu_create(&opts);
    if (!cpu) { T_FAIL("cpu_backend", "%s", dt_last_error()); return T_DONE(); }
    float *cpu1 = NULL, *cpu2 = NULL;
    run_case("edit1 cpu", cpu, fx("model/vae"), 1, "edit/edit1_io.safetensors", TOL_CPU, &cpu1);
    run_case("edit2 cpu", cpu, fx("model"), 2, "edit/edit2_io.safetensors", TOL_CPU, &cpu2);

    /* the MLX layout encodes to the same tokens */
    char t1[] = "/tmp/ditrun_venc_mlx_XXXXXX";
    char *dir = mkdtemp(t1);
    float *mlx2 = NULL;
    if (!dir || vae_copy_write(dir, VAE_COPY_MLX)) {
        T_FAIL("edit2 mlx layout", "could not write the copy: %s", dt_last_error());
    } else {
        run_case("edit2 mlx layout", cpu, dir, 2, "edit/edit2_io.safetensors", TOL_CPU, &mlx2);
        T_CHECK("edit2 mlx layout == pytorch layout", mlx2 && cpu2 && !memcmp(mlx2, cpu2, 180 * 32 * sizeof(float)),
                "tokens differ between layouts");
        t_rmtree(dir);
    }
    free(mlx2);

    /* a VAE without encoder weights: loads and decodes (text-to-image), encoding fails with a clear error */
    char t2[] = "/tmp/ditrun_venc_dec_XXXXXX";
    dir = mkdtemp(t2);
    if (!dir || vae_copy_write(dir, VAE_COPY_DECODER_ONLY)) {
        T_FAIL("decoder-only vae", "could not write the copy: %s", dt_last_error());
    } else {
        dt_vae *v = dt_vae_load(cpu, dir);
        float lat[8 * 4 * 4], rgb[3 * 16 * 16], img[3 * 64 * 64];
        for (int i = 0; i < 8 * 16; i++) lat[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
        T_CHECK("decoder-only vae: loads and decodes", v && dt_vae_decode(v, lat, 4, 4, rgb) == 0, "%s", dt_last_error());
        for (int i = 0; i < 3 * 64 * 64; i++) img[i] = 0.25f;
        int rc = v ? dt_vae_encode(v, img, 64, 64, lat) : 0;
        T_CHECK("decoder-only vae: encode refused naming the missing tensor",
                v && rc != 0 && strstr(dt_last_error(), "encoder.conv_in.weight"), "rc %d: %s", rc, dt_last_error());
        dt_vae_free(v);
        t_rmtree(dir);
    }

    /* sizes that are not multiples of the downsampling factor */
    {
        dt_vae *v = dt_vae_load(cpu, fx("model/vae"));
        float *img = calloc(3 * 66 * 64, sizeof(float)), lat[8 * 17 * 16];
        T_CHECK("encode: 66x64 refused (not a multiple of 4)", v && dt_vae_encode(v, img, 64, 66, lat) != 0 &&
                                                                    strstr(dt_last_error(), "multiple of 4"),
                "%s", dt_last_error());
        T_CHECK("encode: 64x64 accepted", v && dt_vae_encode(v, img, 64, 64, lat) == 0, "%s", dt_last_error());
        dt_prep_image bad = {.w = 60, .h = 64, .rgb = img};
        dt_ref_tokens r;
        T_CHECK("reference tokens: 60x64 refused (not a multiple of 8)",
                v && dt_ref_tokens_encode(v, &bad, 1, &r) != 0 && strstr(dt_last_error(), "multiple of 8"), "%s",
                dt_last_error());
        free(img);
        dt_vae_free(v);
    }
    cpu->destroy(cpu);

    /* CUDA encoder vs the CPU's tokens */
    if (dt_backend_cuda_available()) {
        dt_backend *cuda = dt_backend_cuda_create(&opts);
        if (!cuda) {
            T_FAIL("encoder cuda backend", "%s", dt_last_error());
        } else {
            float *g1 = NULL, *g2 = NULL;
            run_case("edit1 cuda", cuda, fx("model/vae"), 1, "edit/edit1_io.safetensors", TOL_CUDA, &g1);
            run_case("edit2 cuda", cuda, fx("model/vae"), 2, "edit/edit2_io.safetensors", TOL_CUDA, &g2);
            if (g1 && cpu1) t_check_rel_l2("edit1 cuda vs cpu tokens", g1, cpu1, 108 * 32, TOL_CUDA);
            if (g2 && cpu2) t_check_rel_l2("edit2 cuda vs cpu tokens", g2, cpu2, 180 * 32, TOL_CUDA);
            free(g1);
            free(g2);
            cuda->destroy(cuda);
        }
    } else if (t_require_gpu_env()) {
        T_FAIL("encoder cuda", "DITRUN_REQUIRE_GPU=1 but no usable CUDA GPU");
    } else {
        T_SKIP("encoder cuda", "no usable CUDA GPU (CPU-only build or no device)");
    }
    free(cpu1);
    free(cpu2);
    return T_DONE();
}
