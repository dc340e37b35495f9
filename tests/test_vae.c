/* test_vae.c — the FLUX.2 VAE decoder against the diffusers fixture: CPU backend (float32), the
 * MLX weight layout (converted copy of the fixture VAE), the full latent post-processing path
 * from the last packed latents to the PNG pixels, and the CUDA backend when a GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "io/safetensors.h"
#include "models/vae_flux2.h"
#include "pipeline/latents.h"
#include "test.h"
#include "vae_copy.h"

/* float32 vs the float32 reference: same math, only summation order differs (im2col sgemm vs
 * torch's conv kernels, double-accumulated GroupNorm) -> ~1e-6 expected; 1e-4 leaves headroom. */
#define TOL_CPU 1e-4
/* u8 pixels: rounding of values that sit on a .5 boundary may flip by one level. */
#define U8_MAX_DIFF 1
#define U8_MIN_FRACTION 0.999
/* CUDA runs activations in bf16 (8-bit mantissa) through ~20 layers: ~1e-2 relative error. */
#define TOL_CUDA 2e-2

static char path_buf[1024];
static const char *fx(const char *rel) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", t_fixtures(), rel);
    return path_buf;
}

typedef struct {
    float *latent;      /* [8, 16, 16] */
    float *img_ref;     /* [64, 64, 3] in [0, 1] */
    uint8_t *u8_ref;    /* [64, 64, 3] */
    float *packed;      /* [64, 32] */
} fixture;

/* Decode the fixture latent and compare (float image and u8 pixels). Returns rel L2 or -1. */
static double decode_and_compare(const char *tag, dt_backend *be, const char *vae_path, const fixture *f,
                                 double tol, float *rgb_out) {
    char name[128];
    dt_vae *v = dt_vae_load(be, vae_path);
    snprintf(name, sizeof name, "%s_load", tag);
    if (!v) { T_FAIL(name, "%s", dt_last_error()); return -1; }
    T_PASS(name);
    const dt_vae_config *c = dt_vae_get_config(v);
    snprintf(name, sizeof name, "%s_config", tag);
    T_CHECK(name, c->latent_channels == 8 && c->n_blocks == 3 && c->scale_factor == 4 && c->norm_groups == 8 &&
                      c->layers_per_block == 1 && c->mid_attention && c->post_quant_conv && c->bn_eps == 1e-4f,
            "lat %d blocks %d scale %d groups %d", c->latent_channels, c->n_blocks, c->scale_factor, c->norm_groups);
    const int S = 64;
    float *rgb = malloc(3 * S * S * sizeof(float)), *img = malloc(S * S * 3 * sizeof(float));
    uint8_t *u8 = malloc(S * S * 3);
    double t0 = dt_now();
    int rc = dt_vae_decode(v, f->latent, 16, 16, rgb);
    double ms = (dt_now() - t0) * 1e3;
    double err = -1;
    snprintf(name, sizeof name, "%s_decode", tag);
    if (rc) {
        T_FAIL(name, "%s", dt_last_error());
    } else {
        printf("INFO %s decode 16x16 -> 64x64 in %.1f ms\n", tag, ms);
        dt_vae_postprocess(rgb, S, S, img, u8);
        uint8_t *u8b = malloc(S * S * 3);
        snprintf(name, sizeof name, "%s_decode_rgb8", tag);
        if (dt_vae_decode_rgb8(v, f->latent, 16, 16, u8b)) T_FAIL(name, "%s", dt_last_error());
        else T_CHECK(name, !memcmp(u8, u8b, (size_t)S * S * 3),   /* the same decoded values, one formula */
                     "the 8-bit decode differs from decode + dt_vae_postprocess");
        free(u8b);
        snprintf(name, sizeof name, "%s_image_float", tag);
        err = dt_rel_l2(img, f->img_ref, (size_t)S * S * 3);
        t_check_rel_l2(name, img, f->img_ref, (size_t)S * S * 3, tol);
        size_t close = 0, n = (size_t)S * S * 3;
        int maxd = 0;
        for (size_t i = 0; i < n; i++) {
            int d = abs((int)u8[i] - (int)f->u8_ref[i]);
            if (d > maxd) maxd = d;
            close += d <= U8_MAX_DIFF;
        }
        snprintf(name, sizeof name, "%s_image_u8", tag);
        double frac = (double)close / (double)n;
        size_t exact = 0;
        for (size_t i = 0; i < n; i++) exact += u8[i] == f->u8_ref[i];
        printf("INFO %s u8: %.3f%% exact, %.3f%% within +-1, max diff %d\n", tag, 100.0 * exact / n, 100 * frac, maxd);
        if (tol <= TOL_CPU)
            T_CHECK(name, frac >= U8_MIN_FRACTION, "%.4f%% of pixels within +-%d (max diff %d)", 100 * frac,
                    U8_MAX_DIFF, maxd);
        if (rgb_out) memcpy(rgb_out, rgb, 3 * S * S * sizeof(float));
    }
    free(rgb); free(img); free(u8);
    dt_vae_free(v);
    return err;
}

int main(void) {
    st_file *io = st_open(fx("pipeline_io.safetensors"));
    if (!io) { T_FAIL("fixture_open", "%s", dt_last_error()); return T_DONE(); }
    fixture f = {0};
    const st_tensor *tl = st_find(io, "out.latents_unpacked"), *ti = st_find(io, "out.image_float"),
                    *tu = st_find(io, "out.image_u8"), *tp = st_find(io, "mid.step3.latents_packed");
    if (!tl || !ti || !tu || !tp || tl->numel != 8 * 16 * 16 || ti->numel != 64 * 64 * 3 || tu->numel != 64 * 64 * 3 ||
        tu->dtype != DT_U8) {
        T_FAIL("fixture_tensors", "missing or misshapen out.* tensors");
        st_close(io);
        return T_DONE();
    }
    f.latent = st_to_f32(tl);
    f.img_ref = st_to_f32(ti);
    f.u8_ref = (uint8_t *)tu->data;
    f.packed = st_to_f32(tp);

    dt_backend_opts opts = {0};
    dt_backend *cpu = dt_backend_cpu_create(&opts);
    if (!cpu) { T_FAIL("cpu_backend", "%s", dt_last_error()); return T_DONE(); }
    float *rgb_cpu = malloc(3 * 64 * 64 * sizeof(float));
    double e = decode_and_compare("vae_cpu", cpu, fx("model/vae"), &f, TOL_CPU, rgb_cpu);
    (void)e;

    /* pipeline root instead of the vae folder */
    dt_vae *v = dt_vae_load(cpu, fx("model"));
    T_CHECK("vae_load_pipeline_root", v != NULL, "%s", dt_last_error());
    /* full post-processing chain: packed latents -> unpack -> BN -> unpatchify -> decode -> u8 */
    if (v) {
        const float *mean, *var;
        int nbn;
        float eps;
        dt_vae_bn_stats(v, &mean, &var, &nbn, &eps);
        float grid[32 * 64], lat[8 * 256];
        dt_latents_unpack(f.packed, 32, 8, 8, grid);
        dt_latents_bn_denorm(grid, 32, 64, mean, var, eps);
        dt_latents_unpatchify(grid, 8, 8, 8, lat);
        float *rgb = malloc(3 * 64 * 64 * sizeof(float));
        uint8_t *u8 = malloc(64 * 64 * 3);
        int rc = dt_vae_decode(v, lat, 16, 16, rgb);
        dt_vae_postprocess(rgb, 64, 64, NULL, u8);
        size_t close = 0;
        for (size_t i = 0; i < 64 * 64 * 3; i++) close += abs((int)u8[i] - (int)f.u8_ref[i]) <= U8_MAX_DIFF;
        T_CHECK("vae_chain_from_packed", nbn == 32 && rc == 0 && close >= (size_t)(U8_MIN_FRACTION * 64 * 64 * 3),
                "bn %d rc %d, %zu of %d pixels within +-1", nbn, rc, close, 64 * 64 * 3);
        free(rgb);
        free(u8);
        dt_vae_free(v);
    }
    /* non-square latent: runs, right size, finite */
    {
        dt_vae *v2 = dt_vae_load(cpu, fx("model/vae"));
        const int H = 6, W = 10;
        float *lat = malloc(8 * H * W * sizeof(float)), *rgb = malloc(3 * 16 * H * W * sizeof(float) + 4);
        dt_randn(5, 0, 0, lat, 8 * H * W);
        rgb[3 * 16 * H * W] = 12345.0f;   /* guard element after the output */
        int rc = v2 ? dt_vae_decode(v2, lat, H, W, rgb) : -1;
        int finite = 1;
        for (int i = 0; i < 3 * 16 * H * W; i++) finite &= isfinite(rgb[i]);
        T_CHECK("vae_non_square", rc == 0 && finite && rgb[3 * 16 * H * W] == 12345.0f, "rc %d finite %d", rc, finite);
        T_CHECK("vae_bad_size", v2 && dt_vae_decode(v2, lat, 0, W, rgb) != 0, "accepted a 0-row latent");
        free(lat);
        free(rgb);
        dt_vae_free(v2);
    }
    /* error paths: bad folder */
    T_CHECK("vae_load_missing", dt_vae_load(cpu, fx("krea2")) == NULL, "loaded a folder without a VAE");

    /* MLX layout copy decodes to the same numbers */
    char tmpl[] = "/tmp/ditrun_vae_mlx_XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir || vae_copy_write(dir, VAE_COPY_MLX)) {
        T_FAIL("vae_mlx_copy", "could not write the MLX-layout copy: %s", dt_last_error());
    } else {
        float *rgb_mlx = malloc(3 * 64 * 64 * sizeof(float));
        decode_and_compare("vae_mlx", cpu, dir, &f, TOL_CPU, rgb_mlx);
        T_CHECK("vae_mlx_same_as_pytorch", !memcmp(rgb_mlx, rgb_cpu, 3 * 64 * 64 * sizeof(float)),
                "rel L2 %.3g between layouts", dt_rel_l2(rgb_mlx, rgb_cpu, 3 * 64 * 64));
        free(rgb_mlx);
        if (!getenv("KEEP_MLX")) t_rmtree(dir); else printf("kept %s\n", dir);
    }
    cpu->destroy(cpu);

    if (dt_backend_cuda_available()) {
        dt_backend *cuda = dt_backend_cuda_create(&opts);
        if (!cuda) {
            T_FAIL("vae_cuda_backend", "%s", dt_last_error());
        } else {
            decode_and_compare("vae_cuda", cuda, fx("model/vae"), &f, TOL_CUDA, NULL);
            cuda->destroy(cuda);
        }
    } else if (t_require_gpu_env()) {
        T_FAIL("vae_cuda", "DITRUN_REQUIRE_GPU=1 but no usable CUDA GPU");
    } else {
        T_SKIP("vae_cuda", "no usable CUDA GPU (CPU-only build or no device)");
    }
    free(rgb_cpu);
    free(f.latent);
    free(f.img_ref);
    free(f.packed);
    st_close(io);
    return T_DONE();
}
