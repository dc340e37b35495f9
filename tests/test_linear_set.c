/* test_linear_set.c — dt_linear_set_load_stacked: n Linears with one input stacked along the output.
 *
 * The stacked Linear applied to x must equal the parts applied one by one, concatenated: for parts of one
 * format (packed 4-bit rows stay packed) and for mixed formats (bf16 + 4-bit + f32 with a bias: stacked as
 * f32 dense), on the CPU backend; and a missing part is an error naming the tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "models/linear_set.h"
#include "quant/mlx_affine.h"
#include "test.h"

/* the same products in another summation order (dense f32 GEMM vs tiles of dequantized rows) */
#define STACK_TOL 1e-6

#define IN 256
#define OUT 64
#define GROUP 64
#define ROWS 5

static uint64_t rng = 0x1234567u;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}

/* NAME as a 4-bit g64 Linear (packed + bf16 scales/biases) */
static void add_q4(st_writer *w, const char *name) {
    uint32_t *packed = malloc(sizeof(uint32_t) * OUT * IN / 8);
    uint16_t *sc = malloc(2 * OUT * IN / GROUP), *bi = malloc(2 * OUT * IN / GROUP);
    float row[IN];
    for (int r = 0; r < OUT; r++) {
        for (int c = 0; c < IN; c++) row[c] = frand() * 0.1f;
        mlx_quant_row(row, IN, 4, GROUP, MLX_RULE_MINMAX, packed + r * IN / 8, sc + r * IN / GROUP, bi + r * IN / GROUP);
    }
    char nm[64];
    int64_t sp[2] = {OUT, IN / 8}, ss[2] = {OUT, IN / GROUP};
    snprintf(nm, sizeof nm, "%s.weight", name); st_writer_add(w, nm, DT_U32, 2, sp, packed);
    snprintf(nm, sizeof nm, "%s.scales", name); st_writer_add(w, nm, DT_BF16, 2, ss, sc);
    snprintf(nm, sizeof nm, "%s.biases", name); st_writer_add(w, nm, DT_BF16, 2, ss, bi);
    free(packed); free(sc); free(bi);
}
static void add_dense(st_writer *w, const char *name, dt_dtype t, int with_bias) {
    int64_t sh[2] = {OUT, IN};
    float *f = malloc(sizeof(float) * OUT * IN);
    for (int i = 0; i < OUT * IN; i++) f[i] = frand() * 0.1f;
    char nm[64];
    snprintf(nm, sizeof nm, "%s.weight", name);
    if (t == DT_F32) {
        st_writer_add_f32(w, nm, 2, sh, f);
    } else {
        uint16_t *b = malloc(2 * OUT * IN);
        for (int i = 0; i < OUT * IN; i++) b[i] = dt_f32_to_bf16(f[i]);
        st_writer_add(w, nm, DT_BF16, 2, sh, b);
        free(b);
    }
    if (with_bias) {
        float bias[OUT];
        int64_t bs[1] = {OUT};
        for (int i = 0; i < OUT; i++) bias[i] = frand();
        snprintf(nm, sizeof nm, "%s.bias", name);
        st_writer_add_f32(w, nm, 1, bs, bias);
    }
    free(f);
}

/* stacked(x) vs [part0(x) | part1(x) | part2(x)] */
static void check(dt_backend *be, dt_weights *wt, const char *const *names, const char *tag) {
    dt_linear_set set = {0};
    set.be = be;
    char nm[160];
    dt_linear *st = dt_linear_set_load_stacked(&set, wt, names, 3, OUT, IN, NULL);
    dt_linear *parts[3];
    int ok = st != NULL;
    for (int i = 0; i < 3 && ok; i++) ok = (parts[i] = dt_linear_set_load(&set, wt, names[i], OUT, IN, -1)) != NULL;
    snprintf(nm, sizeof nm, "stacked %s: loads", tag);
    T_CHECK(nm, ok, "%s", dt_last_error());
    if (!ok) { dt_linear_set_free(&set); return; }
    float xh[ROWS * IN];
    for (int i = 0; i < ROWS * IN; i++) xh[i] = frand();
    dt_mat x = dt_alloc_or_die(be, ROWS, IN, be->act_dtype), y = dt_alloc_or_die(be, ROWS, 3 * OUT, be->act_dtype);
    dt_mat yp = dt_alloc_or_die(be, ROWS, OUT, be->act_dtype);
    be->upload(be, x, xh);
    be->linear(be, y, x, st);
    float *got = malloc(sizeof(float) * ROWS * 3 * OUT), *ref = malloc(sizeof(float) * ROWS * 3 * OUT);
    float part[ROWS * OUT];
    be->download(be, got, y);
    for (int i = 0; i < 3; i++) {
        be->linear(be, yp, x, parts[i]);
        be->download(be, part, yp);
        for (int r = 0; r < ROWS; r++) memcpy(ref + r * 3 * OUT + i * OUT, part + r * OUT, sizeof(float) * OUT);
    }
    snprintf(nm, sizeof nm, "stacked %s: equals the parts concatenated", tag);
    t_check_rel_l2(nm, got, ref, (size_t)ROWS * 3 * OUT, STACK_TOL);
    free(got); free(ref);
    be->free(be, &x); be->free(be, &y); be->free(be, &yp);
    dt_linear_set_free(&set);
}

int main(void) {
    char dir[] = "/tmp/ditrun-linset-XXXXXX";
    if (!mkdtemp(dir)) { T_FAIL("temp dir", "mkdtemp failed"); return T_DONE(); }
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer *w = st_writer_new();
    add_q4(w, "q.a"); add_q4(w, "q.b"); add_q4(w, "q.c");
    add_dense(w, "m.a", DT_BF16, 0); add_q4(w, "m.b"); add_dense(w, "m.c", DT_F32, 1);
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    if (rc) { T_FAIL("write model", "%s", dt_last_error()); return T_DONE(); }
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){0});
    dt_weights *wt = dt_weights_open(path);
    if (!be || !wt) { T_FAIL("open", "%s", dt_last_error()); return T_DONE(); }
    const char *same[3] = {"q.a", "q.b", "q.c"}, *mixed[3] = {"m.a", "m.b", "m.c"};
    check(be, wt, same, "q4 x3 (packed rows)");
    check(be, wt, mixed, "bf16 + q4 + f32 with bias (f32 dense)");
    {
        dt_linear_set set = {0};
        set.be = be;
        const char *missing[3] = {"q.a", "q.nope", "q.c"};
        dt_linear *l = dt_linear_set_load_stacked(&set, wt, missing, 3, OUT, IN, NULL);
        T_CHECK("stacked with a missing part: error names the tensor", !l && strstr(dt_last_error(), "q.nope"),
                "got %p, error '%s'", (void *)l, dt_last_error());
        dt_linear_set_free(&set);
    }
    dt_weights_close(wt);
    be->destroy(be);
    unlink(path);
    rmdir(dir);
    return T_DONE();
}
