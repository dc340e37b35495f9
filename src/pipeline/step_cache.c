/* step_cache.c — parsing of the --cache choice and the TaylorSeer extrapolation (step_cache.h). */
#include "step_cache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

#define CACHE_CHOICES "off, first-block=T (T >= 0, e.g. 0.08) or taylorseer=N[:ORDER] (N >= 1, ORDER 1..4)"

static int bad(const char *spec, const char *why, dt_cache_opts *o) {
    memset(o, 0, sizeof *o);
    dt_set_error("cache: \"%s\" %s; expected %s", spec, why, CACHE_CHOICES);
    return -1;
}

/* a whole decimal integer in [lo, hi] from s up to end */
static int parse_int(const char *s, const char *end, int lo, int hi, int *out) {
    if (s == end || end - s > 9) return -1;
    long v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int dt_cache_parse(const char *spec, dt_cache_opts *o) {
    memset(o, 0, sizeof *o);
    if (!spec || !*spec || !strcmp(spec, "off") || !strcmp(spec, "none")) return 0;
    if (strlen(spec) > DT_CACHE_SPEC_MAX) return bad("(too long)", "is not a cache setting", o);
    const char *eq = strchr(spec, '=');
    if (!eq) return bad(spec, "is not a cache setting", o);
    const size_t kl = (size_t)(eq - spec);
    const char *val = eq + 1;
    if (kl == 11 && !strncmp(spec, "first-block", kl)) {
        char *end;
        errno = 0;
        double t = strtod(val, &end);
        if (end == val || *end || errno || !isfinite(t)) return bad(spec, "has no number after first-block=", o);
        if (t < 0.0) return bad(spec, "has a negative threshold", o);
        o->kind = DT_CACHE_FIRST_BLOCK;
        o->threshold = (float)t;
        return 0;
    }
    if (kl == 10 && !strncmp(spec, "taylorseer", kl)) {
        const char *colon = strchr(val, ':');
        const char *nend = colon ? colon : val + strlen(val);
        int n, order = 1;
        if (parse_int(val, nend, 1, 1000000, &n)) return bad(spec, "needs an interval N >= 1 after taylorseer=", o);
        if (colon && parse_int(colon + 1, colon + 1 + strlen(colon + 1), 1, DT_TAYLORSEER_MAX_ORDER, &order))
            return bad(spec, "has an ORDER outside 1..4", o);
        o->kind = DT_CACHE_TAYLORSEER;
        o->interval = n;
        o->order = order;
        return 0;
    }
    return bad(spec, "names no cache (first-block or taylorseer)", o);
}

void dt_cache_format(const dt_cache_opts *o, char *buf, size_t len) {
    if (o->kind == DT_CACHE_FIRST_BLOCK) snprintf(buf, len, "first-block=%g", (double)o->threshold);
    else if (o->kind == DT_CACHE_TAYLORSEER) snprintf(buf, len, "taylorseer=%d:%d", o->interval, o->order);
    else snprintf(buf, len, "off");
}

void dt_step_cache_init(dt_step_cache *c, const dt_cache_opts *o, int steps, size_t n) {
    memset(c, 0, sizeof *c);
    c->o = *o;
    c->steps = steps;
    c->n = n;
    c->decisions = dt_calloc((size_t)(steps > 0 ? steps : 1) * 2, sizeof(float));
    for (int b = 0; b < 2; b++) {
        c->ts[b].last = -1;
        c->fbc[b].threshold = o->threshold;
    }
}

void dt_step_cache_free(dt_step_cache *c) {
    for (int b = 0; b < 2; b++) {
        dt_fbc_free(&c->fbc[b]);
        for (int k = 0; k <= DT_TAYLORSEER_MAX_ORDER; k++) free(c->ts[b].f[k]);
    }
    free(c->decisions);
    memset(c, 0, sizeof *c);
}

dt_fbc_branch *dt_step_cache_fbc(dt_step_cache *c, int branch, int k) {
    if (c->o.kind != DT_CACHE_FIRST_BLOCK) return NULL;
    dt_fbc_branch *f = &c->fbc[branch];
    f->force = k == 0 || k == c->steps - 1;
    return f;
}

/* diffusers' rule, step k counted per branch from 0: computed in the warm-up (k < W) and when
 * (k - W - 1) mod N == 0 (Python's modulo: the step right after the warm-up is predicted unless N = 1);
 * ours also computes the last step (diffusers' disable_cache_after_step = steps - 1). */
int dt_taylorseer_computes(const dt_step_cache *c, int k) {
    if (c->o.kind != DT_CACHE_TAYLORSEER) return 1;
    const int w = DT_TAYLORSEER_WARMUP, n = c->o.interval;
    if (k < w || k >= c->steps - 1) return 1;
    return ((k - w - 1) % n + n) % n == 0;
}

void dt_taylorseer_update(dt_step_cache *c, int branch, int k, const float *v) {
    if (c->o.kind != DT_CACHE_TAYLORSEER) return;
    dt_taylor_branch *s = &c->ts[branch];
    const int prev = s->nf;
    const int nf = 1 + (prev < c->o.order ? prev : c->o.order);
    for (int j = 0; j < nf; j++)
        if (!s->f[j]) s->f[j] = dt_malloc(sizeof(float) * c->n);
    /* factor j+1 = (new factor j − previous factor j) / steps since the last computed pass */
    const float d = s->last >= 0 ? (float)(k - s->last) : 1.0f;
    for (size_t i = 0; i < c->n; i++) {
        float a = v[i];
        for (int j = 0; j < nf; j++) {
            float next = j + 1 < nf ? (a - s->f[j][i]) / d : 0.0f;
            s->f[j][i] = a;
            a = next;
        }
    }
    s->nf = nf;
    s->last = k;
}

void dt_taylorseer_predict(const dt_step_cache *c, int branch, int k, float *v) {
    const dt_taylor_branch *s = &c->ts[branch];
    const double off = (double)(k - s->last);
    float coeff[DT_TAYLORSEER_MAX_ORDER + 1];
    double fact = 1.0;
    for (int j = 0; j < s->nf; j++) {   /* offset^j / j! */
        if (j > 0) fact *= j;
        coeff[j] = (float)(pow(off, j) / fact);
    }
    for (size_t i = 0; i < c->n; i++) {
        float o = 0.0f;
        for (int j = 0; j < s->nf; j++) o = o + s->f[j][i] * coeff[j];
        v[i] = o;
    }
}
