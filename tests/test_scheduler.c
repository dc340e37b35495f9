/* test_scheduler.c — scheduler (sigmas/timesteps vs the fixture and the empirical mu's values at 1024²/512²),
 * Philox noise (known answers, determinism, moments), packing/ids, patchify and the pipeline's
 * latent post-processing (unpack + BN de-normalization + unpatchify) against the fixture. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "io/weights.h"
#include "pipeline/latents.h"
#include "pipeline/scheduler.h"
#include "test.h"

/* The fixture's sigmas come from the same float32 formula: allow 1e-6 absolute (a few ulp). */
#define TOL_SIGMA 1e-6
/* The spec's printed 1024²/512² numbers are themselves off by up to 7e-8 from a float64 evaluation
 * and 1.2e-7 (2 ulp) from the float32 evaluation that matches the diffusers fixture bit for bit;
 * 2.5e-7 accepts that while still pinning the formula (a wrong mu moves sigma by > 1e-4). */
#define TOL_SPEC_SIGMA 2.5e-7
#define TOL_SPEC_T 2.5e-4
/* f32 latent post-processing reproduced op for op: only the BN multiply-add may round differently. */
#define TOL_LATENT 1e-6

static char path_buf[1024];
static const char *fx(const char *rel) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", t_fixtures(), rel);
    return path_buf;
}

static float *load_f32(st_file *f, const char *name, int64_t numel) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->numel != numel) return NULL;
    return st_to_f32(t);
}

static void test_config(dt_sched_config *cfg) {
    int rc = dt_sched_config_load(fx("model/scheduler"), cfg);
    T_CHECK("sched_config_load", rc == 0, "%s", dt_last_error());
    T_CHECK("sched_config_fields",
            cfg->use_dynamic_shifting == 1 && cfg->time_shift_type == DT_TIME_SHIFT_EXPONENTIAL && cfg->shift == 3.0 &&
                cfg->base_image_seq_len == 256 && cfg->max_image_seq_len == 4096 && cfg->num_train_timesteps == 1000 &&
                cfg->shift_terminal == 0.0,
            "dyn %d type %d shift %g seq %lld/%lld ntt %d", cfg->use_dynamic_shifting, (int)cfg->time_shift_type,
            cfg->shift, (long long)cfg->base_image_seq_len, (long long)cfg->max_image_seq_len,
            cfg->num_train_timesteps);
    dt_sched_config c2;
    T_CHECK("sched_config_root", dt_sched_config_load(fx("model"), &c2) == 0, "%s", dt_last_error());
    T_CHECK("sched_config_missing", dt_sched_config_load(fx("transformer-q4"), &c2) != 0, "missing file accepted");
    const char *bad = "{\"_class_name\":\"FlowMatchEulerDiscreteScheduler\",\"time_shift_type\":\"cosine\"}";
    json *j = json_parse(bad, strlen(bad), "bad");
    T_CHECK("sched_config_bad_shift_type", j && dt_sched_config_parse(j, "bad", &c2) != 0, "accepted");
    json_free(j);
    const char *karras = "{\"use_karras_sigmas\":true}";
    j = json_parse(karras, strlen(karras), "karras");
    T_CHECK("sched_config_karras_rejected", j && dt_sched_config_parse(j, "karras", &c2) != 0, "accepted");
    json_free(j);
}

static int close_abs(const float *a, const double *b, int n, double tol, int *worst) {
    int ok = 1;
    double wd = -1;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > wd) { wd = d; *worst = i; }
        if (!(d <= tol)) ok = 0;
    }
    return ok;
}

static void test_schedule(const dt_sched_config *cfg, st_file *io) {
    /* fixture: 64x64 image -> 8x8 packed grid = 64 tokens, 4 steps */
    float sig[5], ts[4];
    int rc = dt_schedule_make(cfg, 4, 64, sig, ts);
    float *rs = load_f32(io, "mid.sigmas", 5), *rt = load_f32(io, "mid.timesteps", 4);
    if (rc || !rs || !rt) {
        T_FAIL("schedule_fixture", "rc %d, fixture tensors %s", rc, rs && rt ? "ok" : "missing");
    } else {
        double d_s = 0, d_t = 0;
        for (int i = 0; i < 5; i++) d_s = fmax(d_s, fabs((double)sig[i] - rs[i]));
        for (int i = 0; i < 4; i++) d_t = fmax(d_t, fabs((double)ts[i] - rt[i]) / 1000.0);
        if (d_s <= TOL_SIGMA && d_t <= TOL_SIGMA)
            printf("PASS schedule_fixture (max |dsigma| %.3g, max |dt|/1000 %.3g)\n", d_s, d_t), t_passed++;
        else
            T_FAIL("schedule_fixture", "max |dsigma| %.3g, |dt|/1000 %.3g; got sigma %.8f %.8f %.8f %.8f", d_s, d_t,
                   sig[0], sig[1], sig[2], sig[3]);
        int exact = !memcmp(sig, rs, sizeof sig) && !memcmp(ts, rt, sizeof ts);
        T_CHECK("schedule_fixture_bitexact", exact, "not bit-identical (within tolerance above)");
    }
    free(rs);
    free(rt);

    /* FLUX.2's empirical mu (diffusers pipeline_flux2.py compute_empirical_mu) at 1024² (N = 4096) and
     * 512² (N = 1024), 4 steps */
    double mu = dt_compute_empirical_mu(4096, 4);
    T_CHECK("empirical_mu_1024", fabs(mu - 2.2911799) < 1e-7, "mu %.9f", mu);
    T_CHECK("empirical_mu_large", fabs(dt_compute_empirical_mu(8192, 4) - (0.00016927 * 8192 + 0.45666666)) < 1e-12,
            "N > 4300 branch");
    const double s1024[5] = {1.0, 0.96738392, 0.90814394, 0.76719999, 0.0};
    const double t1024[4] = {1000, 967.3839, 908.1439, 767.2000};
    const double s512[4] = {1, 0.95808536, 0.88398182, 0.71749651};
    int w = 0;
    rc = dt_schedule_make(cfg, 4, 4096, sig, ts);
    T_CHECK("schedule_1024_sigmas", rc == 0 && close_abs(sig, s1024, 5, TOL_SPEC_SIGMA, &w), "sigma[%d] %.8f vs %.8f", w,
            sig[w], s1024[w]);
    float tsd[4];
    for (int i = 0; i < 4; i++) tsd[i] = ts[i] / 1000.0f;
    double t1024n[4];
    for (int i = 0; i < 4; i++) t1024n[i] = t1024[i] / 1000.0;
    T_CHECK("schedule_1024_timesteps", close_abs(tsd, t1024n, 4, TOL_SPEC_T / 1000.0, &w), "t[%d] %.4f vs %.4f",
            w, ts[w], t1024[w]);
    rc = dt_schedule_make(cfg, 4, 1024, sig, ts);
    T_CHECK("schedule_512_sigmas", rc == 0 && close_abs(sig, s512, 4, TOL_SPEC_SIGMA, &w), "sigma[%d] %.8f vs %.8f", w,
            sig[w], s512[w]);

    /* other step counts: monotone, starts at 1, ends at 0 */
    float s50[51], t50[50];
    rc = dt_schedule_make(cfg, 50, 4096, s50, t50);
    int mono = rc == 0 && s50[0] == 1.0f && s50[50] == 0.0f;
    for (int i = 1; i <= 50 && mono; i++) mono = s50[i] < s50[i - 1];
    T_CHECK("schedule_50_monotone", mono, "not monotone / bad ends");
    float s1[2], t1[1];
    rc = dt_schedule_make(cfg, 1, 4096, s1, t1);
    T_CHECK("schedule_1_step", rc == 0 && s1[0] == 1.0f && s1[1] == 0.0f && t1[0] == 1000.0f, "sigma %g %g", s1[0],
            s1[1]);
    T_CHECK("schedule_bad_args", dt_schedule_make(cfg, 0, 4096, s1, t1) != 0 && dt_schedule_make(cfg, 4, 0, s50, t50) != 0,
            "accepted");

    /* non-dynamic form: sigma = 3s / (1 + 2s) */
    dt_sched_config fixed = *cfg;
    fixed.use_dynamic_shifting = 0;
    rc = dt_schedule_make(&fixed, 4, 4096, sig, ts);
    double ref[5];
    for (int i = 0; i < 4; i++) {
        double s = 1.0 + (0.25 - 1.0) * i / 3.0;
        ref[i] = 3 * s / (1 + 2 * s);
    }
    ref[4] = 0;
    T_CHECK("schedule_fixed_shift", rc == 0 && close_abs(sig, ref, 5, 1e-7, &w), "sigma[%d] %.8f vs %.8f", w, sig[w],
            ref[w]);
    /* linear time shift: mu / (mu + 1/s - 1) */
    dt_sched_config lin = *cfg;
    lin.time_shift_type = DT_TIME_SHIFT_LINEAR;
    rc = dt_schedule_make(&lin, 4, 4096, sig, ts);
    for (int i = 0; i < 4; i++) {
        double s = 1.0 + (0.25 - 1.0) * i / 3.0;
        ref[i] = mu / (mu + 1 / s - 1);
    }
    T_CHECK("schedule_linear_shift", rc == 0 && close_abs(sig, ref, 5, 1e-6, &w), "sigma[%d] %.8f vs %.8f", w, sig[w],
            ref[w]);

    /* Euler steps */
    float x[3] = {1, 2, 3}, v[3] = {0.5f, -1, 2};
    dt_euler_step(x, v, 3, 1.0f, 0.75f);
    T_CHECK("euler_step", x[0] == 1 - 0.125f && x[1] == 2.25f && x[2] == 2.5f, "%g %g %g", x[0], x[1], x[2]);
}

static void test_rng(void) {
    /* Random123 known-answer vectors for Philox-4x32-10 */
    const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        dt_philox4x32_10(kat[i], kat[i] + 4, out);
        ok &= !memcmp(out, kat[i] + 6, sizeof out);
    }
    T_CHECK("philox_known_answers", ok, "mismatch");

    const size_t N = 1000000;
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    dt_randn(42, 0, 0, a, N);
    dt_randn(42, 0, 0, b, N);
    T_CHECK("randn_deterministic", !memcmp(a, b, N * sizeof(float)), "two draws differ");
    dt_randn(42, 0, 7, b, 1001);
    T_CHECK("randn_offset", !memcmp(a + 7, b, 1001 * sizeof(float)), "offset draw is not a slice of the sequence");
    /* the large draw runs on several threads: it must equal the sequence drawn in small single-thread pieces */
    int pieces_equal = 1;
    for (size_t o = 0; o < N && pieces_equal; o += 9973) {
        size_t cnt = N - o < 9973 ? N - o : 9973;
        dt_randn(42, 0, o, b, cnt);
        pieces_equal = !memcmp(a + o, b, cnt * sizeof(float));
    }
    T_CHECK("randn_threads_equal_pieces", pieces_equal, "a threaded draw differs from the same range drawn piecewise");
    dt_randn(43, 0, 0, b, 1000);
    int same = 0;
    for (int i = 0; i < 1000; i++) same += a[i] == b[i];
    T_CHECK("randn_seed_changes", same < 5, "%d of 1000 equal for another seed", same);
    dt_randn(42, 1, 0, b, 1000);
    same = 0;
    for (int i = 0; i < 1000; i++) same += a[i] == b[i];
    T_CHECK("randn_stream_changes", same < 5, "%d of 1000 equal for another stream", same);
    double s = 0, s2 = 0, s3 = 0, s4 = 0;
    int finite = 1;
    for (size_t i = 0; i < N; i++) {
        double x = a[i];
        finite &= isfinite(a[i]);
        s += x; s2 += x * x; s3 += x * x * x; s4 += x * x * x * x;
    }
    double mean = s / N, var = s2 / N - mean * mean, sd = sqrt(var);
    double skew = s3 / N, kurt = s4 / N;
    /* 1e6 samples: std error of the mean 1e-3, of the std ~7e-4; 5 sigma bounds */
    T_CHECK("randn_moments", finite && fabs(mean) < 5e-3 && fabs(sd - 1) < 4e-3 && fabs(skew) < 0.02 &&
                                 fabs(kurt - 3) < 0.05,
            "mean %.5f std %.5f skew %.4f kurt %.4f", mean, sd, skew, kurt);
    printf("INFO randn(42): mean %.5f std %.5f first %.7f %.7f %.7f %.7f\n", mean, sd, a[0], a[1], a[2], a[3]);
    /* golden bits (cross-checked against an independent Python implementation of the documented
     * algorithm): pins the sequence so every machine/backend draws the same noise for a seed */
    const uint32_t g42[8] = {0xbf785e5c, 0x3e46ace8, 0xbf9e28d2, 0x3ff6433b, 0xbd95e030, 0x3e0e7a0f, 0xbf8da733,
                             0x3ea742fd};
    const uint32_t gbig[4] = {0xbf60dc30, 0xbdb42712, 0x3e585c7c, 0xbf0ec9a0};
    float gb[4];
    dt_randn(12345678901234ull, 3, 1000003, gb, 4);
    T_CHECK("randn_golden", !memcmp(a, g42, sizeof g42) && !memcmp(gb, gbig, sizeof gbig),
            "sequence changed: first %.9g, offset draw %.9g", a[0], gb[0]);
    float *n1 = malloc(128 * 4 * 4 * sizeof(float));
    dt_latents_noise(7, 128, 4, 4, n1);
    dt_randn(7, 0, 0, b, 128 * 16);
    T_CHECK("latents_noise", !memcmp(n1, b, 128 * 16 * sizeof(float)), "noise differs from stream 0");
    free(n1);
    free(a);
    free(b);
}

static void test_pack(void) {
    const int C = 6, h = 3, w = 5;
    float x[C * h * w], tok[C * h * w], back[C * h * w];
    for (int i = 0; i < C * h * w; i++) x[i] = (float)i * 0.5f - 7;
    dt_latents_pack(x, C, h, w, tok);
    /* token (r, c), channel ch = x[ch, r, c] */
    int ok = tok[(2 * w + 3) * C + 4] == x[4 * h * w + 2 * w + 3];
    dt_latents_unpack(tok, C, h, w, back);
    T_CHECK("pack_unpack_roundtrip", ok && !memcmp(x, back, sizeof x), "mismatch");
    float ids[h * w * 4], tids[3 * 4];
    dt_latents_img_ids(h, w, 0.0f, ids);
    dt_latents_txt_ids(3, tids);
    int idok = ids[(1 * w + 4) * 4 + 0] == 0 && ids[(1 * w + 4) * 4 + 1] == 1 && ids[(1 * w + 4) * 4 + 2] == 4 &&
               ids[(1 * w + 4) * 4 + 3] == 0 && tids[2 * 4 + 3] == 2 && tids[2 * 4 + 0] == 0 && tids[2 * 4 + 1] == 0;
    T_CHECK("position_ids", idok, "bad ids");
    /* patchify convention: packed channel 4c + 2dy + dx <-> latent (c, 2r+dy, 2col+dx) */
    const int c = 2;
    float lat[c * 2 * h * 2 * w], pk[4 * c * h * w], lat2[c * 2 * h * 2 * w];
    for (int i = 0; i < c * 4 * h * w; i++) lat[i] = (float)i;
    dt_latents_patchify(lat, c, h, w, pk);
    int pok = pk[(4 * 1 + 2 * 1 + 0) * h * w + 2 * w + 3] == lat[1 * 4 * h * w + (2 * 2 + 1) * (2 * w) + (2 * 3 + 0)];
    dt_latents_unpatchify(pk, c, h, w, lat2);
    T_CHECK("patchify_roundtrip", pok && !memcmp(lat, lat2, sizeof lat), "mismatch");
    float m[2] = {0.5f, -1}, v[2] = {4, 0.25f}, z[4] = {1, 2, 3, 4}, z0[4];
    memcpy(z0, z, sizeof z);
    dt_latents_bn_denorm(z, 2, 2, m, v, 0.0f);
    int bok = z[0] == 2.5f && z[1] == 4.5f && z[2] == 0.5f && z[3] == 1.0f;
    dt_latents_bn_norm(z, 2, 2, m, v, 0.0f);
    T_CHECK("bn_denorm_norm", bok && !memcmp(z, z0, sizeof z), "%g %g %g %g", z[0], z[1], z[2], z[3]);
}

/* out.latents_unpacked from mid.step3.latents_packed: unpack -> BN de-normalize -> unpatchify. */
static void test_fixture_latents(st_file *io) {
    const int C = 32, h = 8, w = 8, c = 8;
    float *packed = load_f32(io, "mid.step3.latents_packed", 64 * 32);
    float *ref = load_f32(io, "out.latents_unpacked", 8 * 16 * 16);
    dt_weights *vw = dt_weights_open(fx("model/vae"));
    if (!packed || !ref || !vw) {
        T_FAIL("fixture_latents", "missing fixture data: %s", vw ? "tensors" : dt_last_error());
        free(packed); free(ref);
        if (vw) dt_weights_close(vw);
        return;
    }
    float mean[32], var[32];
    double eps = json_get_num(dt_weights_config(vw), "batch_norm_eps", -1);
    int rc = dt_weights_read_f32(vw, "bn.running_mean", mean, 32) | dt_weights_read_f32(vw, "bn.running_var", var, 32);
    float *grid = malloc(C * h * w * sizeof(float)), *out = malloc(c * 16 * 16 * sizeof(float));
    dt_latents_unpack(packed, C, h, w, grid);
    dt_latents_bn_denorm(grid, C, h * w, mean, var, (float)eps);
    dt_latents_unpatchify(grid, c, h, w, out);
    T_CHECK("fixture_bn_eps", rc == 0 && eps == 1e-4, "eps %g rc %d", eps, rc);
    t_check_rel_l2("fixture_latents_unpacked", out, ref, (size_t)c * 16 * 16, TOL_LATENT);
    free(grid); free(out); free(packed); free(ref);
    dt_weights_close(vw);
}

/* The calculate_shift form's size bound: e^mu finite in float32 at the bound, not one token above it (mu grows by
 * (max_shift - base_shift) / (max_len - base_len) per token, ~1.7e-4, far more than float32's relative spacing),
 * and no bound for a fixed or linear shift. */
static void test_shift_bound(void) {
    dt_sched_config c;
    dt_sched_config_default(&c);
    c.base_shift = 0.5;
    c.max_shift = 1.15;
    c.base_image_seq_len = 256;
    c.max_image_seq_len = 4096;
    int64_t k = dt_calculate_shift_max_tokens(&c);
    float at = (float)exp(dt_calculate_shift(&c, k)), above = (float)exp(dt_calculate_shift(&c, k + 1));
    T_CHECK("calculate_shift bound: finite at it, infinite one token above", k > 4096 && isfinite(at) && !isfinite(above),
            "bound %lld: e^mu %g there, %g above", (long long)k, at, above);
    float sig[3], ts[2];
    T_CHECK("calculate_shift bound: the schedule is made at it",
            dt_schedule_make_mu(&c, 2, dt_calculate_shift(&c, k), sig, ts) == 0 && isfinite(sig[0]) && isfinite(sig[1]),
            "%s", dt_last_error());
    dt_sched_config lin = c, fixed = c, flat = c;
    lin.time_shift_type = DT_TIME_SHIFT_LINEAR;
    fixed.use_dynamic_shifting = 0;
    flat.max_shift = flat.base_shift;
    T_CHECK("calculate_shift bound: none for a linear, fixed or flat shift",
            !dt_calculate_shift_max_tokens(&lin) && !dt_calculate_shift_max_tokens(&fixed) &&
                !dt_calculate_shift_max_tokens(&flat), "a bound was given");
}

int main(void) {
    dt_sched_config cfg;
    test_config(&cfg);
    st_file *io = st_open(fx("pipeline_io.safetensors"));
    if (!io) {
        T_FAIL("fixture_open", "%s", dt_last_error());
        return T_DONE();
    }
    test_schedule(&cfg, io);
    test_shift_bound();
    test_rng();
    test_pack();
    test_fixture_latents(io);
    st_close(io);
    return T_DONE();
}
