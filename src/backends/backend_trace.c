/* backend_trace.c — the trace wrapper of any backend (backend_trace.h). Every wrapper is generated from the slot list
 * that declares struct dt_backend (DT_BACKEND_SLOTS): it times the inner call (host clock, a sync after it, or the
 * profiling extension's events in the queue) and describes it by its arguments' names and shapes. */
#include "backend_trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ext.h"

/* one index per slot: TR_SLOT_linear, ... */
#define TR_ENUM_V(name, params, args) TR_SLOT_##name,
#define TR_ENUM_R(type, name, params, args) TR_SLOT_##name,
enum { DT_BACKEND_SLOTS(TR_ENUM_V, TR_ENUM_R) TR_NSLOTS };
#define TR_NAME_V(name, params, args) #name,
#define TR_NAME_R(type, name, params, args) #name,
static const char *const tr_slot_names[TR_NSLOTS] = {DT_BACKEND_SLOTS(TR_NAME_V, TR_NAME_R)};

typedef struct {
    int n;
    double total, maxv;   /* ms */
} tr_stat;
typedef struct {
    char *key;            /* "op args" */
    tr_stat s;
} tr_keyed;
typedef struct {
    int key;              /* index into dev */
    void *a, *b;          /* events before and after the call */
} tr_pending;

typedef struct {
    dt_backend pub;       /* the wrapper handed out (first member: container of `be`) */
    dt_backend *inner;
    int level;
    double thr_ms;
    const dt_ext_profiling *pf;   /* level 3: the inner backend's events */
    int capturing;        /* between capture_begin and capture_end (no events, no syncs) */
    tr_stat stat[TR_NSLOTS];      /* levels 1-2: per slot */
    tr_keyed *dev;        /* level 3: per op and arguments */
    int ndev, capdev;
    tr_pending *pend;     /* level 3: recorded, not yet resolved */
    int npend, cappend;
    void **spare;         /* level 3: events to reuse */
    int nspare, capspare;
} tr_be;

static tr_be *tr_of(dt_backend *be) { return (tr_be *)be; }

/* ---- describing a call by its arguments: "y[4096,3072] x[4096,3072]", "h=64 w=64", ... ---- */
typedef struct {
    char *p;
    size_t left;
} tr_desc;
static void tr_put(tr_desc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tr_put(tr_desc *d, const char *fmt, ...) {
    if (d->left < 2) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(d->p, d->left, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    size_t u = (size_t)k < d->left ? (size_t)k : d->left - 1;
    d->p += u;
    d->left -= u;
}
static void tr_d_mat(tr_desc *d, const char *nm, dt_mat m) {
    if (m.data) tr_put(d, " %s[%lld,%lld]", nm, (long long)m.rows, (long long)m.cols);
}
static void tr_d_int(tr_desc *d, const char *nm, int v) { tr_put(d, " %s=%d", nm, v); }
static void tr_d_i64(tr_desc *d, const char *nm, int64_t v) { tr_put(d, " %s=%lld", nm, (long long)v); }
static void tr_d_str(tr_desc *d, const char *nm, const char *s) { tr_put(d, " %s=%s", nm, s ? s : "-"); }
static void tr_d_src(tr_desc *d, const char *nm, const dt_linear_src *s) {
    (void)nm;
    if (s) tr_put(d, " %s [%lld,%lld] bits %d", s->name ? s->name : "?", (long long)s->out, (long long)s->in, s->bits);
}
static void tr_d_skip(tr_desc *d, const char *nm, ...) { (void)d; (void)nm; }   /* pointers, floats, enums */
#define TR_ARG(d, a) \
    _Generic((a), dt_mat: tr_d_mat, int: tr_d_int, int64_t: tr_d_i64, const char *: tr_d_str, \
             const dt_linear_src *: tr_d_src, default: tr_d_skip)(d, #a, a);
/* TR_EACH(d, a, b, ...): TR_ARG on each of up to 12 arguments */
#define TR_ID(...) __VA_ARGS__
#define TR_CAT(a, b) TR_CAT_(a, b)
#define TR_CAT_(a, b) a##b
#define TR_N(...) TR_N_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define TR_N_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, n, ...) n
#define TR_EACH(d, ...) TR_CAT(TR_EACH_, TR_N(__VA_ARGS__))(d, __VA_ARGS__)
#define TR_EACH_1(d, a) TR_ARG(d, a)
#define TR_EACH_2(d, a, ...) TR_ARG(d, a) TR_EACH_1(d, __VA_ARGS__)
#define TR_EACH_3(d, a, ...) TR_ARG(d, a) TR_EACH_2(d, __VA_ARGS__)
#define TR_EACH_4(d, a, ...) TR_ARG(d, a) TR_EACH_3(d, __VA_ARGS__)
#define TR_EACH_5(d, a, ...) TR_ARG(d, a) TR_EACH_4(d, __VA_ARGS__)
#define TR_EACH_6(d, a, ...) TR_ARG(d, a) TR_EACH_5(d, __VA_ARGS__)
#define TR_EACH_7(d, a, ...) TR_ARG(d, a) TR_EACH_6(d, __VA_ARGS__)
#define TR_EACH_8(d, a, ...) TR_ARG(d, a) TR_EACH_7(d, __VA_ARGS__)
#define TR_EACH_9(d, a, ...) TR_ARG(d, a) TR_EACH_8(d, __VA_ARGS__)
#define TR_EACH_10(d, a, ...) TR_ARG(d, a) TR_EACH_9(d, __VA_ARGS__)
#define TR_EACH_11(d, a, ...) TR_ARG(d, a) TR_EACH_10(d, __VA_ARGS__)
#define TR_EACH_12(d, a, ...) TR_ARG(d, a) TR_EACH_11(d, __VA_ARGS__)

/* ---- level 3: events ---- */
static void *tr_event(tr_be *t) {
    if (t->nspare) return t->spare[--t->nspare];
    return t->pf->event_create(t->inner);
}
static void tr_spare(tr_be *t, void *ev) {
    if (t->nspare == t->capspare) {
        t->capspare = t->capspare ? 2 * t->capspare : 64;
        t->spare = dt_realloc(t->spare, sizeof *t->spare * (size_t)t->capspare);
    }
    t->spare[t->nspare++] = ev;
}
static int tr_key(tr_be *t, const char *key) {
    for (int i = 0; i < t->ndev; i++)
        if (!strcmp(t->dev[i].key, key)) return i;
    if (t->ndev == t->capdev) {
        t->capdev = t->capdev ? 2 * t->capdev : 64;
        t->dev = dt_realloc(t->dev, sizeof *t->dev * (size_t)t->capdev);
    }
    t->dev[t->ndev] = (tr_keyed){dt_strdup(key), {0, 0, 0}};
    return t->ndev++;
}
static void tr_add(tr_stat *s, double ms) {
    s->n++;
    s->total += ms;
    if (ms > s->maxv) s->maxv = ms;
}
/* the recorded pairs into per-key device times (waits for them) */
static void tr_resolve(tr_be *t) {
    for (int i = 0; i < t->npend; i++) {
        tr_pending *p = &t->pend[i];
        tr_add(&t->dev[p->key].s, t->pf->event_elapsed_ms(t->inner, p->a, p->b));
        tr_spare(t, p->a);
        tr_spare(t, p->b);
    }
    t->npend = 0;
}

/* ---- around each call ---- */
static int tr_timed_on_device(const tr_be *t, int slot) {
    return t->level == 3 && !t->capturing && slot != TR_SLOT_destroy && slot != TR_SLOT_capture_begin &&
           slot != TR_SLOT_capture_end && slot != TR_SLOT_stream_switch;   /* (events on two queues: no span) */
}
static void tr_report(tr_be *t);
/* before the inner call: its start (the host clock; level 3: an event, returned in *ev) */
static double tr_begin(tr_be *t, int slot, void **ev) {
    *ev = NULL;
    if (slot == TR_SLOT_destroy) tr_report(t);   /* (the events belong to the inner backend) */
    else if (tr_timed_on_device(t, slot)) {
        *ev = tr_event(t);
        (t->pf->event_mark ? t->pf->event_mark : t->pf->event_record)(t->inner, *ev);
    }
    return dt_now();
}
/* after the inner call: its time, described by desc */
static void tr_end(tr_be *t, int slot, double t0, void *ev, const char *desc) {
    const char *op = tr_slot_names[slot];
    if (slot == TR_SLOT_capture_begin) t->capturing = 1;
    if (slot == TR_SLOT_capture_end) t->capturing = 0;
    if (ev) {
        if (t->npend == t->cappend) {
            t->cappend = t->cappend ? 2 * t->cappend : 256;
            t->pend = dt_realloc(t->pend, sizeof *t->pend * (size_t)t->cappend);
        }
        char key[320];
        snprintf(key, sizeof key, "%s%s", op, desc);
        tr_pending *p = &t->pend[t->npend++];
        p->key = tr_key(t, key);
        p->a = ev;
        p->b = tr_event(t);
        (t->pf->event_mark ? t->pf->event_mark : t->pf->event_record)(t->inner, p->b);
        if (slot == TR_SLOT_sync || t->npend > 4096) tr_resolve(t);
    }
    if (t->level == 2 && !t->capturing && slot != TR_SLOT_destroy && slot != TR_SLOT_sync) t->inner->sync(t->inner);
    double ms = (dt_now() - t0) * 1e3;
    tr_add(&t->stat[slot], ms);
    if (t->level <= 2 && ms >= t->thr_ms)
        fprintf(stderr, "ditrun: %s trace: %-16s %9.3f ms %s (call %d)\n", t->pub.name, op, ms, desc, t->stat[slot].n);
    if (slot == TR_SLOT_destroy) {
        for (int i = 0; i < t->ndev; i++) free(t->dev[i].key);
        free(t->dev);
        free(t->pend);
        free(t->spare);
        free(t);
    }
}

/* ---- the wrappers, one per slot: the call goes to the inner backend (`be` becomes it) ---- */
#define TR_DESCRIBE(args) \
    char desc[256] = ""; \
    tr_desc d = {desc, sizeof desc}; \
    TR_EACH(&d, TR_ID args)
#define TR_WRAP_V(name, params, args) \
    static void tr_##name params { \
        tr_be *t = tr_of(be); \
        void *ev; \
        t->inner->opts = t->pub.opts;   /* (callers switch options such as qpath on the backend they hold) */ \
        be = t->inner; \
        double t0 = tr_begin(t, TR_SLOT_##name, &ev); \
        be->name args; \
        TR_DESCRIBE(args) \
        tr_end(t, TR_SLOT_##name, t0, ev, desc); \
    }
#define TR_WRAP_R(type, name, params, args) \
    static type tr_##name params { \
        tr_be *t = tr_of(be); \
        void *ev; \
        t->inner->opts = t->pub.opts;   /* (callers switch options such as qpath on the backend they hold) */ \
        be = t->inner; \
        double t0 = tr_begin(t, TR_SLOT_##name, &ev); \
        type r = be->name args; \
        TR_DESCRIBE(args) \
        tr_end(t, TR_SLOT_##name, t0, ev, desc); \
        return r; \
    }
DT_BACKEND_SLOTS(TR_WRAP_V, TR_WRAP_R)

static int tr_cmp_total(const void *x, const void *y) {
    double a = ((const tr_keyed *)x)->s.total, b = ((const tr_keyed *)y)->s.total;
    return a < b ? 1 : a > b ? -1 : 0;
}

static void tr_report(tr_be *t) {
    const char *nm = t->pub.name;
    if (t->level == 3 && t->pf) {
        tr_resolve(t);
        double all = 0;
        for (int i = 0; i < t->ndev; i++) all += t->dev[i].s.total;
        qsort(t->dev, (size_t)t->ndev, sizeof *t->dev, tr_cmp_total);
        fprintf(stderr, "ditrun: %s trace (device ms per op and shape, events in the running queue): %.2f ms in all\n",
                nm, all);
        for (int i = 0; i < t->ndev; i++) {
            const tr_stat *s = &t->dev[i].s;
            fprintf(stderr, "ditrun: %s trace   %9.3f ms %5.1f%%  n=%-5d mean %8.4f  %s\n", nm, s->total,
                    all > 0 ? 100.0 * s->total / all : 0.0, s->n, s->total / s->n, t->dev[i].key);
        }
        for (int i = 0; i < t->nspare; i++) t->pf->event_destroy(t->inner, t->spare[i]);
        t->nspare = 0;
        return;
    }
    fprintf(stderr, "ditrun: %s trace summary (%s ms per op; level %d):\n", nm, t->level >= 2 ? "host+device" : "host",
            t->level);
    for (int i = 0; i < TR_NSLOTS; i++)
        if (t->stat[i].n)
            fprintf(stderr, "ditrun: %s trace   %-16s n=%-6d total %9.2f ms  max %8.3f ms\n", nm, tr_slot_names[i],
                    t->stat[i].n, t->stat[i].total, t->stat[i].maxv);
}

dt_backend *dt_backend_trace(dt_backend *inner, int level, double thr_ms) {
    if (!inner) return NULL;
    tr_be *t = dt_calloc(1, sizeof *t);
    t->inner = inner;
    t->level = level < 1 ? 1 : level > 3 ? 3 : level;
    t->thr_ms = thr_ms;
    if (t->level == 3) {
        t->pf = dt_backend_profiling(inner);
        if (!t->pf || !t->pf->event_create) {
            dt_log(0, "ditrun: %s trace: level 3 needs the backend's timing events; tracing at level 2\n", inner->name);
            t->level = 2;
            t->pf = NULL;
        }
    }
    t->pub.name = inner->name;
    t->pub.act_dtype = inner->act_dtype;
    t->pub.opts = inner->opts;
    t->pub.impl = inner->impl;
    t->pub.attention_fp8_off = inner->attention_fp8_off;
#define TR_SET_V(name, params, args) t->pub.name = inner->name ? tr_##name : NULL;
#define TR_SET_R(type, name, params, args) TR_SET_V(name, params, args)
    DT_BACKEND_SLOTS(TR_SET_V, TR_SET_R)
    return &t->pub;
}

int dt_backend_trace_calls(dt_backend *be, const char *slot, double *ms) {
    if (!be || be->destroy != tr_destroy) return -1;
    tr_be *t = tr_of(be);
    for (int i = 0; i < TR_NSLOTS; i++) {
        if (strcmp(tr_slot_names[i], slot)) continue;
        int n = t->stat[i].n;
        double sum = t->stat[i].total;
        if (t->level == 3) {   /* device time: the keys of this op */
            tr_resolve(t);
            size_t len = strlen(slot);
            sum = 0;
            for (int k = 0; k < t->ndev; k++)
                if (!strncmp(t->dev[k].key, slot, len) && (t->dev[k].key[len] == ' ' || !t->dev[k].key[len]))
                    sum += t->dev[k].s.total;
        }
        if (ms) *ms = sum;
        return n;
    }
    return -1;
}
