/* bench_arms_attn.c — attention arms on random Q/K/V at the model's heads (interleaved A/B through run_arm):
 *   gqa          native grouped-query attention vs K and V repeated to every query head (strided copies +
 *                attention with as many kv heads as query heads), and optionally the attention alone on
 *                pre-repeated K/V; with the model's key mask where it has one (both families);
 *   key padding  the text key-padding mask as a [1, Lk] additive bias vs compacted keys (the padded rows dropped
 *                by copies, no mask) vs no mask at all (Krea 2).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

#define MAX_SEG 8

typedef struct {
    dt_backend *be;
    bench_timer tm;
    int hq, hkv, hd;
    float scale;
    dt_mat q, k, v, o, bias;       /* [L, hq*hd], [L, hkv*hd] x2, [L, hq*hd], [1, L] F32 or null data */
    dt_mat kr, vr;                 /* gqa: K/V repeated to [L, hq*hd] */
    dt_mat kc, vc;                 /* key padding: the valid key rows, compacted */
    int64_t seg0[MAX_SEG], segn[MAX_SEG], Lv;   /* valid key row ranges (prompt, suffix, image) and their count */
    int nseg;
    void (*run)(void *c, int v);   /* variant v of the arm (its output in o) */
} attn_arm_ctx;

static void ctx_init(attn_arm_ctx *c, bench_ctx *x, int64_t L, int hq, int hkv, int hd, dt_mat bias) {
    dt_backend *be = x->be;
    memset(c, 0, sizeof *c);
    c->be = be;
    c->hq = hq; c->hkv = hkv; c->hd = hd;
    c->scale = 1.0f / sqrtf((float)hd);
    c->bias = bias;
    bench_timer_init(&c->tm, be);
    bench_attn_inputs(be, L, hq, hkv, hd, 61, &c->q, &c->k, &c->v, &c->o);
}

static void ctx_free(attn_arm_ctx *c) {
    dt_backend *be = c->be;
    bench_sync_or_die(be);
    dt_mat *m[] = {&c->q, &c->k, &c->v, &c->o, &c->kr, &c->vr, &c->kc, &c->vc};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (m[i]->data) be->free(be, m[i]);
    bench_timer_free(&c->tm);
}

static void attend(attn_arm_ctx *c, dt_mat k, dt_mat v, int hkv, dt_mat bias) {
    c->be->attention(c->be, c->o, c->q, k, v, c->hq, hkv, c->hd, c->scale, bias, 0);
}

/* run_arm's timing and output of variant v: one call between two events; o downloaded. */
static double arm_time(void *p, int v) {
    attn_arm_ctx *c = p;
    bench_timer_start(&c->tm);
    c->run(c, v);
    return bench_timer_stop(&c->tm);
}

static void arm_output(void *p, int v, float *out) {
    attn_arm_ctx *c = p;
    c->run(c, v);
    c->be->download(c->be, out, c->o);
}

/* ------------------------------------------------------------------ gqa */

/* K/V [L, hkv*hd] -> [L, hq*hd], query head h reading kv head h / g: viewing the repeated matrix as
 * [L*hkv, g*hd] rows, group member r of every kv head is one strided column block: g copies. */
static void repeat_kv(attn_arm_ctx *c, dt_mat rep, dt_mat src) {
    int g = c->hq / c->hkv;
    int64_t L = src.rows;
    dt_mat rv = dt_mat_reshape(rep, L * c->hkv, (int64_t)g * c->hd);
    dt_mat sv = dt_mat_reshape(src, L * c->hkv, c->hd);
    for (int r = 0; r < g; r++) c->be->copy(c->be, dt_mat_cols(rv, (int64_t)r * c->hd, c->hd), sv);
}

/* 0 native GQA, 1 repeated KV (copies + attention with hq kv heads), 2 attention on pre-repeated KV */
static void gqa_run(void *p, int v) {
    attn_arm_ctx *c = p;
    if (v == 0) {
        attend(c, c->k, c->v, c->hkv, c->bias);
        return;
    }
    if (v == 1) {
        repeat_kv(c, c->kr, c->k);
        repeat_kv(c, c->vr, c->v);
    }
    attend(c, c->kr, c->vr, c->hq, c->bias);
}

void bench_arm_gqa(bench_ctx *x, int64_t L, int hq, int hkv, int hd, dt_mat bias, int nv, const char *how) {
    attn_arm_ctx c;
    ctx_init(&c, x, L, hq, hkv, hd, bias);
    c.kr = dt_alloc_or_die(x->be, L, (int64_t)hq * hd, x->be->act_dtype);
    c.vr = dt_alloc_or_die(x->be, L, (int64_t)hq * hd, x->be->act_dtype);
    repeat_kv(&c, c.kr, c.k);   /* the pre-repeated variant's inputs */
    repeat_kv(&c, c.vr, c.v);
    arm_spec a = {0};
    a.arm = "gqa";
    snprintf(a.what, sizeof a.what, "attention L=%lld, %d q / %d kv heads x %d%s", (long long)L, hq, hkv, hd,
             bias.data ? ", key-padding mask" : "");
    a.names[0] = "native GQA";
    a.names[1] = "repeated KV";
    a.names[2] = "pre-repeated KV";
    a.nv = nv < 3 ? 2 : 3;
    c.run = gqa_run;
    a.time = arm_time;
    a.output = arm_output;
    a.out_n = (size_t)L * hq * hd;
    a.tol = x->is_cpu ? 1e-5 : 2e-2;   /* the same attention: bf16 outputs, other accumulation orders on CUDA */
    snprintf(a.note, sizeof a.note, "isolated; repeated = %d strided copies of K and V%s%s%s + attention with %d kv heads%s",
             hq / hkv, how && *how ? " (" : "", how && *how ? how : "", how && *how ? ")" : "", hq,
             a.nv == 3 ? "; pre-repeated = the attention alone" : "");
    run_arm(x, &a, &c);
    ctx_free(&c);
}

/* ------------------------------------------------------------------ key padding */

/* 0 key-padding bias, 1 compacted keys (padded rows dropped by copies, no bias), 2 no mask */
static void keypad_run(void *p, int v) {
    attn_arm_ctx *c = p;
    if (v == 0) {
        attend(c, c->k, c->v, c->hkv, c->bias);
    } else if (v == 1) {
        int64_t at = 0;
        for (int i = 0; i < c->nseg; i++) {
            c->be->copy(c->be, dt_mat_rows(c->kc, at, c->segn[i]), dt_mat_rows(c->k, c->seg0[i], c->segn[i]));
            c->be->copy(c->be, dt_mat_rows(c->vc, at, c->segn[i]), dt_mat_rows(c->v, c->seg0[i], c->segn[i]));
            at += c->segn[i];
        }
        attend(c, dt_mat_rows(c->kc, 0, c->Lv), dt_mat_rows(c->vc, 0, c->Lv), c->hkv, dt_mat_null());
    } else {
        attend(c, c->k, c->v, c->hkv, dt_mat_null());
    }
}

void bench_arm_key_padding(bench_ctx *x, int hq, int hkv, int hd, dt_mat bias, const uint8_t *mask) {
    int64_t T = x->t, L = (int64_t)x->n + x->t;
    attn_arm_ctx c;
    ctx_init(&c, x, L, hq, hkv, hd, bias);
    /* key rows that the mask keeps: the valid text runs ([0, prompt), the suffix), then the image */
    int simple = 1;   /* every valid text run fits the segment table: compaction keeps exactly the unmasked keys */
    for (int64_t j = 0; j < T;) {
        if (!mask[j]) { j++; continue; }
        int64_t e = j;
        while (e < T && mask[e]) e++;
        if (c.nseg < MAX_SEG - 1) { c.seg0[c.nseg] = j; c.segn[c.nseg++] = e - j; }
        else simple = 0;
        j = e;
    }
    c.seg0[c.nseg] = T;
    c.segn[c.nseg++] = x->n;
    for (int i = 0; i < c.nseg; i++) c.Lv += c.segn[i];
    c.kc = dt_alloc_or_die(x->be, L, (int64_t)hkv * hd, x->be->act_dtype);
    c.vc = dt_alloc_or_die(x->be, L, (int64_t)hkv * hd, x->be->act_dtype);
    arm_spec a = {0};
    a.arm = "mask";
    snprintf(a.what, sizeof a.what, "attention L=%lld (%lld valid keys), %d q / %d kv heads x %d", (long long)L,
             (long long)c.Lv, hq, hkv, hd);
    a.names[0] = "key-padding bias";
    a.names[1] = "compacted keys";
    a.names[2] = "no mask";
    a.nv = 3;
    c.run = keypad_run;
    a.time = arm_time;
    a.output = arm_output;
    a.out_n = (size_t)L * hq * hd;
    a.tol = x->is_cpu ? 1e-5 : 2e-2;
    a.differ = (simple ? 0u : 2u) | (c.Lv == L ? 0u : 4u);   /* no mask attends to the padding */
    snprintf(a.note, sizeof a.note, "isolated; bias = [1, Lk] additive 0/-inf; compacted = %d row copies of K and V "
             "dropping the padded keys, then no mask", 2 * c.nseg);
    run_arm(x, &a, &c);
    bench_note(x->r, "mask arm: attention takes a [1, Lk] key bias only (no dense additive [Lq, Lk] mask op), so the "
               "dense-mask path of SDPA cannot be timed; the arm compares the bias with compacted keys and with no mask");
    ctx_free(&c);
}
