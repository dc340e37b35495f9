/* test_placement.c — the device-memory placement planner (pipeline/placement.h) on the CPU: which parts stay
 * resident, whether the VAE is tiled, the predicted phase peaks, and the one-line error naming the smallest workable
 * budget, for a one-shot run and a resident pipeline at sizes whose phases are worked out by hand below; the sizes
 * of the bundled pipelines (dt_place_sizes_for) and `ditrun info --size --max-vram`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "io/weights.h"
#include "models/vae_flux2.h"
#include "models/vae_qwenimage.h"
#include "pipeline/placement.h"
#include "test.h"

/* $BUILD/ditrun (build/ditrun without BUILD), as make test runs it */
static const char *exe_dir(void) {
    const char *b = getenv("BUILD");
    return b && *b ? b : "build";
}

#define GiB (1LL << 30)
#define G10(x) ((int64_t)((x) * GiB / 10))   /* x tenths of a GiB: exact sums in the checks */

/* A text encoder of 8 GiB, a 2 GiB transformer, a 0.2 GiB VAE; activations: encode 0.5, a forward 1.0, the untiled
 * decode 8.0 (a large image), one tile 1.5. */
static dt_place_sizes sizes(int resident) {
    dt_place_sizes s = {G10(80), G10(20), G10(2), G10(5), G10(10), G10(80), G10(15), resident};
    return s;
}

static void expect(const char *name, int64_t budget, const dt_place_sizes *s, int ok, int rel, int tiled, int64_t peak) {
    dt_place_plan p;
    int rc = dt_place_plan_make(budget, s, &p);
    T_CHECK(name, (rc == 0) == ok && p.release_text_encoder == rel && p.vae_tiling == tiled && p.peak == peak,
            "rc %d release %d tiled %d peak %lld (want ok %d release %d tiled %d peak %lld)", rc, p.release_text_encoder,
            p.vae_tiling, (long long)p.peak, ok, rel, tiled, (long long)peak);
}

int main(void) {
    /* one image: the encoder is released (it runs alone: 8.5); untiled the decode is 2.2 + 8 = 10.2, tiled 3.7 */
    dt_place_sizes one = sizes(0);
    expect("oneshot_unbounded", 0, &one, 1, 1, 0, G10(102));
    expect("oneshot_roomy", 12 * GiB, &one, 1, 1, 0, G10(102));
    expect("oneshot_tiles_when_needed", 9 * GiB, &one, 1, 1, 1, G10(85));
    expect("oneshot_exact_fit", G10(85), &one, 1, 1, 1, G10(85));
    expect("oneshot_too_small", 8 * GiB, &one, 0, 1, 1, G10(85));
    dt_place_plan p;
    dt_place_plan_make(8 * GiB, &one, &p);
    T_CHECK("oneshot_error_names_smallest", strstr(dt_last_error(), "8.00 GiB is below the smallest workable 8.50 GiB") &&
                strstr(dt_last_error(), "text encoder released, VAE tiled"),
            "%s", dt_last_error());
    T_CHECK("oneshot_phases", p.phase_peak[DT_PHASE_ENCODE] == G10(85) && p.phase_peak[DT_PHASE_DENOISE] == G10(32) &&
                                  p.phase_peak[DT_PHASE_DECODE] == G10(37) && p.min_budget == G10(85),
            "phases %lld %lld %lld min %lld", (long long)p.phase_peak[0], (long long)p.phase_peak[1],
            (long long)p.phase_peak[2], (long long)p.min_budget);

    /* resident: all kept = 10.7 / 11.2 / 18.2; tiled 11.7; encoder released: encode still 10.7 (the transformer is
     * loaded), denoise 3.2, decode 10.2 untiled, 3.7 tiled */
    dt_place_sizes res = sizes(1);
    expect("resident_unbounded", 0, &res, 1, 0, 0, G10(182));
    expect("resident_roomy", 20 * GiB, &res, 1, 0, 0, G10(182));
    expect("resident_tiles_first", 12 * GiB, &res, 1, 0, 1, G10(117));
    expect("resident_then_releases", 11 * GiB, &res, 1, 1, 0, G10(107));
    expect("resident_too_small", 10 * GiB, &res, 0, 1, 0, G10(107));
    T_CHECK("resident_error", strstr(dt_last_error(), "smallest workable 10.70 GiB"), "%s", dt_last_error());

    /* an image of one tile: tiling is never chosen (it would change nothing) */
    dt_place_sizes small = sizes(1);
    small.vae_tile_act = 0;
    small.vae_act = G10(5);
    expect("one_tile_never_tiles", G10(112), &small, 1, 0, 0, G10(112));
    expect("one_tile_releases_instead", G10(111), &small, 1, 1, 0, G10(107));

    /* a transformer that does not fit with its forward: no plan (block streaming is not a placement) */
    dt_place_sizes big = sizes(0);
    big.transformer = 30 * GiB;
    expect("transformer_too_big", 24 * GiB, &big, 0, 1, 1, 30 * GiB + G10(2) + G10(15));

    char line[256];
    dt_place_plan_make(9 * GiB, &one, &p);
    dt_place_plan_describe(&p, line, sizeof line);
    T_CHECK("describe", !strcmp(line, "text encoder released, VAE tiled; predicted peak 8.50 GiB (encode 8.50 GiB, "
                                      "denoise 3.20 GiB, decode 3.70 GiB); smallest workable 8.50 GiB"),
            "'%s'", line);
    char b[32];
    T_CHECK("bytes_mib", !strcmp(dt_place_bytes(300LL << 20, b, sizeof b), "300.0 MiB"), "'%s'", b);

    /* the bundled pipelines' sizes: weights = the files' bytes (f32 at 2 bytes for bf16 activations), the VAE decode
     * exactly its config's count (untiled; tiled with 64 px tiles at 256x192), one tile's only when it tiles */
    char root[600], dir[700];
    const char *roots[2] = {"model", "krea2"};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "sizes_%s", roots[k]);
        snprintf(root, sizeof root, "%s/%s", t_fixtures(), roots[k]);
        dt_place_sizes ps;
        if (dt_place_sizes_for(root, 256, 192, 64, 2, 64, 1, &ps)) { T_FAIL(name, "%s", dt_last_error()); continue; }
        snprintf(dir, sizeof dir, "%s/transformer", root);
        dt_weights *w = dt_weights_open(dir);
        int64_t tb = 0;
        for (size_t i = 0; w && i < dt_weights_count(w); i++) {
            const st_tensor *t = dt_weights_at(w, i);
            tb += t->dtype == DT_F32 ? (int64_t)t->nbytes / 2 : (int64_t)t->nbytes;
        }
        dt_weights_close(w);
        snprintf(dir, sizeof dir, "%s/vae", root);
        int64_t va, vt;
        if (k == 0) {
            dt_vae_config c;
            dt_vae_read_config(dir, &c);
            va = dt_vae_decode_act_bytes(&c, 0, 192 / 4, 256 / 4, 2);
            vt = dt_vae_decode_act_bytes(&c, 64, 192 / 4, 256 / 4, 2);
        } else {
            static dt_qvae_config c;
            dt_qvae_read_config(dir, &c);
            va = dt_qvae_decode_act_bytes(&c, 0, 192 / 4, 256 / 4, 2);
            vt = dt_qvae_decode_act_bytes(&c, 64, 192 / 4, 256 / 4, 2);
        }
        T_CHECK(name, ps.transformer == tb && ps.text_encoder > 0 && ps.vae > 0 && ps.vae_act == va && ps.vae_tile_act == vt &&
                          vt < va && ps.dit_act > 0 && ps.te_act > 0 && ps.resident == 1,
                "transformer %lld (files %lld), vae act %lld (%lld), tile %lld (%lld)", (long long)ps.transformer,
                (long long)tb, (long long)ps.vae_act, (long long)va, (long long)ps.vae_tile_act, (long long)vt);
        snprintf(name, sizeof name, "sizes_%s_one_tile", roots[k]);
        T_CHECK(name, dt_place_sizes_for(root, 64, 64, 64, 2, 64, 0, &ps) == 0 && ps.vae_tile_act == 0,
                "a 64x64 image with 64 px tiles has a tile size %lld", (long long)ps.vae_tile_act);
    }
    snprintf(root, sizeof root, "%s/edit", t_fixtures());
    T_CHECK("sizes_not_a_pipeline", dt_place_sizes_for(root, 64, 64, 64, 2, 0, 0, &one) != 0, "sized a folder of images");

    /* ditrun info: the plan lines, and exit 1 with the smallest workable budget under a budget too small */
    char tmp[300], cmd[1200];
    if (t_tmpdir(tmp, sizeof tmp, "placement")) { T_FAIL("info_plan", "no temporary folder"); return T_DONE(); }
    snprintf(cmd, sizeof cmd, "%s/ditrun info %s/model --size 512x512 > %s/out.txt 2> %s/err.txt", exe_dir(), t_fixtures(), tmp, tmp);
    int st = system(cmd);
    snprintf(dir, sizeof dir, "%s/out.txt", tmp);
    char *out = t_slurp(dir, NULL);
    T_CHECK("info_plan", WIFEXITED(st) && WEXITSTATUS(st) == 0 && out && strstr(out, "memory at 512x512") &&
                             strstr(out, "plan (generate, budget none): text encoder released, VAE untiled") &&
                             strstr(out, "plan (serve, budget none): text encoder resident"),
            "status %d, output: %s", st, out ? out : "(none)");
    free(out);
    snprintf(cmd, sizeof cmd, "%s/ditrun info %s/model --size 512x512 --max-vram 1M > %s/out.txt 2> %s/err.txt",
             exe_dir(), t_fixtures(), tmp, tmp);
    st = system(cmd);
    snprintf(dir, sizeof dir, "%s/err.txt", tmp);
    char *err = t_slurp(dir, NULL);
    T_CHECK("info_budget_too_small", WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, "--max-vram 1.0 MiB") &&
                                         !strchr(strchr(err, '\n') + 1, '\n'),
            "status %d, stderr: %s", st, err ? err : "(none)");
    free(err);
    snprintf(dir, sizeof dir, "%s/out.txt", tmp);
    out = t_slurp(dir, NULL);
    T_CHECK("info_budget_names_smallest", out && strstr(out, "is below the smallest workable"), "output: %s",
            out ? out : "(none)");
    free(out);
    /* generate --max-vram: a malformed size, and a budget nothing fits (refused before loading, one line) */
    const char *cases[2][3] = {{"12x", "is not a size like 12G", "generate_max_vram_malformed"},
                               {"1K", "below the smallest workable", "generate_max_vram_too_small"}};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s/ditrun generate --model %s/model -p x -o %s/x.png --backend cpu -q --max-vram %s "
                 "> /dev/null 2> %s/err.txt", exe_dir(), t_fixtures(), tmp, cases[k][0], tmp);
        st = system(cmd);
        snprintf(dir, sizeof dir, "%s/err.txt", tmp);
        err = t_slurp(dir, NULL);
        snprintf(dir, sizeof dir, "%s/x.png", tmp);
        T_CHECK(cases[k][2], WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, cases[k][1]) &&
                                 access(dir, F_OK) != 0,
                "status %d, stderr: %s", st, err ? err : "(none)");
        free(err);
    }
    t_rmtree(tmp);
    return T_DONE();
}
