/* lora.c — reading LoRA adapter files into low-rank updates of a model's modules (key layouts: lora.h), and
 * the host-side math to merge them into dense weights or stack them into one side product. */
#define _POSIX_C_SOURCE 200809L
#include "lora.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "io/weights.h"

int dt_lora_spec_parse(const char *arg, dt_lora_spec *spec) {
    memset(spec, 0, sizeof *spec);
    spec->scale = 1.0f;
    if (!arg || !*arg) { dt_set_error("--lora: empty adapter path"); return -1; }
    size_t n = strlen(arg);
    const char *colon = strrchr(arg, ':');
    if (colon && colon[1]) {
        char *end;
        errno = 0;
        double v = strtod(colon + 1, &end);
        if (!*end && errno == 0) {           /* FILE:NUMBER */
            if (!isfinite(v)) { dt_set_error("--lora %s: the scale must be a finite number", arg); return -1; }
            spec->scale = (float)v;
            n = (size_t)(colon - arg);
        }
    }
    if (!n) { dt_set_error("--lora %s: empty adapter path", arg); return -1; }
    if (n >= sizeof spec->path) { dt_set_error("--lora: adapter path too long"); return -1; }
    memcpy(spec->path, arg, n);
    spec->path[n] = 0;
    return 0;
}

/* ------------------------------------------------------------------ string -> index map */

typedef struct { char **keys; int *vals; size_t n, cap; } smap;   /* open addressing; cap a power of two */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

static int smap_get(const smap *m, const char *k) {
    if (!m->cap) return -1;
    for (size_t h = (size_t)hash_str(k) & (m->cap - 1);; h = (h + 1) & (m->cap - 1)) {
        if (!m->keys[h]) return -1;
        if (!strcmp(m->keys[h], k)) return m->vals[h];
    }
}

/* Inserts (or overwrites) k -> v. */
static void smap_put(smap *m, const char *k, int v) {
    if (2 * (m->n + 1) > m->cap) {
        smap o = *m;
        m->cap = o.cap ? 2 * o.cap : 64;
        m->keys = dt_calloc(m->cap, sizeof *m->keys);
        m->vals = dt_calloc(m->cap, sizeof *m->vals);
        m->n = 0;
        for (size_t i = 0; i < o.cap; i++)
            if (o.keys[i]) {
                size_t h = (size_t)hash_str(o.keys[i]) & (m->cap - 1);
                while (m->keys[h]) h = (h + 1) & (m->cap - 1);
                m->keys[h] = o.keys[i];
                m->vals[h] = o.vals[i];
                m->n++;
            }
        free(o.keys);
        free(o.vals);
    }
    size_t h = (size_t)hash_str(k) & (m->cap - 1);
    while (m->keys[h] && strcmp(m->keys[h], k)) h = (h + 1) & (m->cap - 1);
    if (!m->keys[h]) { m->keys[h] = dt_strdup(k); m->n++; }
    m->vals[h] = v;
}

static void smap_free(smap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static void underscored(const char *name, char *out, size_t cap) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) out[i] = name[i] == '.' ? '_' : name[i];
    out[i] = 0;
}

/* ------------------------------------------------------------------ catalogue */

typedef struct {
    char *name;
    int64_t out, in;
    int npieces;
    dt_lora_piece *pieces;   /* targets owned */
} cat_entry;

struct dt_lora_catalogue {
    cat_entry *e;
    int n;
    smap dotted, under;      /* name -> entry; underscore spelling -> entry (-2: two entries share it) */
};

dt_lora_catalogue *dt_lora_catalogue_new(void) { return dt_calloc(1, sizeof(dt_lora_catalogue)); }

void dt_lora_catalogue_free(dt_lora_catalogue *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        for (int k = 0; k < c->e[i].npieces; k++) free((char *)c->e[i].pieces[k].target);
        free(c->e[i].pieces);
        free(c->e[i].name);
    }
    free(c->e);
    smap_free(&c->dotted);
    smap_free(&c->under);
    free(c);
}

void dt_lora_catalogue_add(dt_lora_catalogue *c, const char *name, int64_t out, int64_t in, int npieces,
                           const dt_lora_piece *pieces) {
    if (smap_get(&c->dotted, name) >= 0) return;
    c->e = dt_realloc(c->e, sizeof *c->e * (size_t)(c->n + 1));
    cat_entry *e = &c->e[c->n];
    e->name = dt_strdup(name);
    e->out = out;
    e->in = in;
    e->npieces = npieces;
    e->pieces = dt_calloc((size_t)npieces, sizeof *e->pieces);
    for (int k = 0; k < npieces; k++) {
        e->pieces[k] = pieces[k];
        e->pieces[k].target = dt_strdup(pieces[k].target);
    }
    smap_put(&c->dotted, name, c->n);
    char u[512];
    underscored(name, u, sizeof u);
    int prev = smap_get(&c->under, u);
    smap_put(&c->under, u, prev >= 0 || prev == -2 ? -2 : c->n);
    c->n++;
}

void dt_lora_catalogue_add_module(dt_lora_catalogue *c, const char *name, int64_t out, int64_t in) {
    dt_lora_piece p = {name, 0, 0, out};
    dt_lora_catalogue_add(c, name, out, in, 1, &p);
}

dt_lora_catalogue *dt_lora_catalogue_from_weights(const dt_weights *w) {
    dt_lora_catalogue *c = dt_lora_catalogue_new();
    for (size_t i = 0; i < dt_weights_count(w); i++) {
        const st_tensor *t = dt_weights_at(w, i);
        size_t len = strlen(t->name);
        if (t->ndim != 2 || len < 8 || strcmp(t->name + len - 7, ".weight") || len - 7 >= 512) continue;
        char base[512];
        snprintf(base, sizeof base, "%.*s", (int)(len - 7), t->name);
        dt_linear_src s;
        if (dt_weights_linear(w, base, -1, -1, 0, &s) == 0) dt_lora_catalogue_add_module(c, base, s.out, s.in);
        else dt_clear_error();
    }
    return c;
}

/* ------------------------------------------------------------------ loaded set */

typedef struct {
    dt_lora_update *u;
    int n;
    int used;
} target_list;

struct dt_lora_set {
    smap tmap;               /* target module -> index into t */
    target_list *t;
    char **tnames;
    int nt;
    float **bufs;            /* f32 copies of A and B */
    int nbufs;
    char **files;
    int nfiles, modules;
};

static float *own(dt_lora_set *s, size_t n) {
    float *p = dt_malloc(sizeof(float) * (n ? n : 1));
    s->bufs = dt_realloc(s->bufs, sizeof *s->bufs * (size_t)(s->nbufs + 1));
    s->bufs[s->nbufs++] = p;
    return p;
}

static void add_update(dt_lora_set *s, const char *target, const dt_lora_update *u) {
    int i = smap_get(&s->tmap, target);
    if (i < 0) {
        i = s->nt++;
        s->t = dt_realloc(s->t, sizeof *s->t * (size_t)s->nt);
        s->tnames = dt_realloc(s->tnames, sizeof *s->tnames * (size_t)s->nt);
        memset(&s->t[i], 0, sizeof s->t[i]);
        s->tnames[i] = dt_strdup(target);
        smap_put(&s->tmap, target, i);
    }
    target_list *l = &s->t[i];
    l->u = dt_realloc(l->u, sizeof *l->u * (size_t)(l->n + 1));
    l->u[l->n++] = *u;
}

void dt_lora_free(dt_lora_set *s) {
    if (!s) return;
    for (int i = 0; i < s->nt; i++) { free(s->t[i].u); free(s->tnames[i]); }
    for (int i = 0; i < s->nbufs; i++) free(s->bufs[i]);
    for (int i = 0; i < s->nfiles; i++) free(s->files[i]);
    free(s->t); free(s->tnames); free(s->bufs); free(s->files);
    smap_free(&s->tmap);
    free(s);
}

const dt_lora_update *dt_lora_updates(dt_lora_set *s, const char *target, int *n) {
    *n = 0;
    int i = s ? smap_get(&s->tmap, target) : -1;
    if (i < 0) return NULL;
    s->t[i].used = 1;
    *n = s->t[i].n;
    return s->t[i].u;
}

int dt_lora_check_used(const dt_lora_set *s) {
    for (int i = 0; s && i < s->nt; i++)
        if (!s->t[i].used) {
            dt_set_error("%s: adapter updates module '%s', which this model does not load", s->t[i].u[0].file, s->tnames[i]);
            return -1;
        }
    return 0;
}

void dt_lora_summary(const dt_lora_set *s, int *files, int *modules, int *targets) {
    if (files) *files = s ? s->nfiles : 0;
    if (modules) *modules = s ? s->modules : 0;
    if (targets) *targets = s ? s->nt : 0;
}

/* ------------------------------------------------------------------ reading one file */

enum { K_A, K_B, K_ALPHA, K_UNSUPPORTED, K_UNKNOWN };

/* Splits an adapter tensor name into its module key and kind; *under = 1 for kohya's underscore spelling. */
static int classify(const char *name, char *module, size_t cap, int *under) {
    static const char *const prefixes[] = {"base_model.model.", "model.diffusion_model.", "diffusion_model.", "transformer.",
                                           "unet."};
    static const char *const kohya[] = {"lora_unet_", "lora_transformer_", "lycoris_"};
    static const struct { const char *suffix; int kind; } sfx[] = {
        {".lora_A.weight", K_A}, {".lora_A.default.weight", K_A}, {".lora_down.weight", K_A},
        {".lora_B.weight", K_B}, {".lora_B.default.weight", K_B}, {".lora_up.weight", K_B}, {".alpha", K_ALPHA},
        {".dora_scale", K_UNSUPPORTED}, {".lora_magnitude_vector", K_UNSUPPORTED},
        {".lora_magnitude_vector.default", K_UNSUPPORTED}, {".lora_mid.weight", K_UNSUPPORTED},
        {".lora_B.bias", K_UNSUPPORTED}, {".diff", K_UNSUPPORTED}, {".diff_b", K_UNSUPPORTED},
        {".hada_w1_a", K_UNSUPPORTED}, {".lokr_w1", K_UNSUPPORTED}, {".lokr_w2", K_UNSUPPORTED},
        {".w_norm", K_UNSUPPORTED}, {".b_norm", K_UNSUPPORTED},
    };
    const char *n = name;
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
            size_t l = strlen(prefixes[i]);
            if (!strncmp(n, prefixes[i], l)) { n += l; again = 1; }
        }
    }
    *under = 0;
    for (size_t i = 0; i < sizeof kohya / sizeof kohya[0]; i++) {
        size_t l = strlen(kohya[i]);
        if (!strncmp(n, kohya[i], l)) { n += l; *under = 1; break; }
    }
    size_t len = strlen(n);
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        size_t l = strlen(sfx[i].suffix);
        if (len > l && !strcmp(n + len - l, sfx[i].suffix) && len - l < cap) {
            memcpy(module, n, len - l);
            module[len - l] = 0;
            return sfx[i].kind;
        }
    }
    if (strstr(n, ".hada_") || strstr(n, ".lokr_")) return K_UNSUPPORTED;
    snprintf(module, cap, "%s", n);
    return K_UNKNOWN;
}

typedef struct {
    char key[512];
    int under;
    const st_tensor *a, *b, *alpha;
} mod_group;

/* alpha from the diffusers/PEFT metadata: alpha_pattern[module] or lora_alpha; < 0 when absent */
static double meta_alpha(const json *meta, const char *module) {
    if (!meta) return -1;
    static const char *const pre[] = {"", "transformer."};
    for (int p = 0; p < 2; p++) {
        char k[64];
        snprintf(k, sizeof k, "%salpha_pattern", pre[p]);
        const json *pat = json_get(meta, k);
        if (pat && pat->type == JSON_OBJECT)
            for (size_t i = 0; i < pat->len; i++) {
                char m[512];
                int under;
                (void)classify(pat->keys[i], m, sizeof m, &under);
                if (!strcmp(m, module) && pat->items[i]->type == JSON_NUMBER) return pat->items[i]->number;
            }
    }
    for (int p = 0; p < 2; p++) {
        char k[64];
        snprintf(k, sizeof k, "%slora_alpha", pre[p]);
        double a = json_get_num(meta, k, -1);
        if (a > 0) return a;
    }
    return -1;
}

static int load_file(dt_lora_set *s, const dt_lora_spec *spec, const dt_lora_catalogue *cat) {
    st_file *f = st_open(spec->path);
    if (!f) return -1;
    const char *P = spec->path;
    int rc = -1;
    json *meta = NULL;
    const char *ms = st_metadata(f, "lora_adapter_metadata");
    if (ms) {
        meta = json_parse(ms, strlen(ms), "lora_adapter_metadata");
        if (!meta) { dt_set_error("%s: metadata lora_adapter_metadata is not valid JSON", P); goto out; }
    }
    size_t n = st_count(f);
    mod_group *g = dt_calloc(n ? n : 1, sizeof *g);
    int ng = 0;
    smap gmap = {0};
    char unmatched[1024] = "";
    int nunmatched = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(f, i);
        char key[512];
        int under, kind = classify(t->name, key, sizeof key, &under);
        if (kind == K_UNSUPPORTED) {
            dt_set_error("%s: tensor '%s' is not a plain LoRA (DoRA, LoHa, LoKr, mid or full-difference tensors are not "
                         "supported)", P, t->name);
            goto out_g;
        }
        int gi = kind == K_UNKNOWN ? -1 : smap_get(&gmap, key);
        if (kind != K_UNKNOWN && gi < 0) {
            gi = ng++;
            snprintf(g[gi].key, sizeof g[gi].key, "%s", key);
            g[gi].under = under;
            smap_put(&gmap, key, gi);
        }
        if (kind == K_UNKNOWN) {
            if (nunmatched++ < 6) {
                size_t l = strlen(unmatched);
                snprintf(unmatched + l, sizeof unmatched - l, "%s'%s'", l ? ", " : "", t->name);
            }
            continue;
        }
        const st_tensor **slot = kind == K_A ? &g[gi].a : kind == K_B ? &g[gi].b : &g[gi].alpha;
        if (*slot) {
            dt_set_error("%s: module '%s' has two %s tensors ('%s' and '%s')", P, key,
                         kind == K_A ? "lora_A/lora_down" : kind == K_B ? "lora_B/lora_up" : "alpha", (*slot)->name, t->name);
            goto out_g;
        }
        *slot = t;
    }
    /* match every module against the catalogue */
    int *entry = dt_calloc((size_t)(ng ? ng : 1), sizeof *entry);
    for (int i = 0; i < ng; i++) {
        int e = -1;
        if (!g[i].under) e = smap_get(&cat->dotted, g[i].key);
        if (e < 0) {
            char u[512];
            underscored(g[i].key, u, sizeof u);
            e = smap_get(&cat->under, u);
            if (e == -2) {
                dt_set_error("%s: module '%s' is ambiguous in this model (several modules have that underscore spelling)",
                             P, g[i].key);
                free(entry);
                goto out_g;
            }
        }
        entry[i] = e;
        if (e < 0) {
            const st_tensor *t = g[i].a ? g[i].a : g[i].b ? g[i].b : g[i].alpha;
            if (nunmatched++ < 6) {
                size_t l = strlen(unmatched);
                snprintf(unmatched + l, sizeof unmatched - l, "%s'%s'", l ? ", " : "", t->name);
            }
        }
    }
    if (nunmatched) {
        dt_set_error("%s: %d adapter tensor%s match no module of the model: %s%s", P, nunmatched, nunmatched > 1 ? "s" : "",
                     unmatched, nunmatched > 6 ? ", ..." : "");
        free(entry);
        goto out_g;
    }
    for (int i = 0; i < ng; i++) {
        const cat_entry *e = &cat->e[entry[i]];
        const st_tensor *A = g[i].a, *B = g[i].b;
        if (!A || !B) {
            dt_set_error("%s: module '%s' has %s but no %s", P, g[i].key, A ? "lora_A/lora_down" : "lora_B/lora_up",
                         A ? "lora_B/lora_up" : "lora_A/lora_down");
            free(entry);
            goto out_g;
        }
        if (A->ndim != 2 || B->ndim != 2) {
            dt_set_error("%s: module '%s': lora tensors must be 2-D (A has %d dimensions, B %d)", P, g[i].key, A->ndim, B->ndim);
            free(entry);
            goto out_g;
        }
        int64_t r = A->shape[0];
        if (B->shape[1] != r || r <= 0) {
            dt_set_error("%s: module '%s': rank mismatch: A '%s' is [%lld, %lld], B '%s' is [%lld, %lld]", P, g[i].key,
                         A->name, (long long)A->shape[0], (long long)A->shape[1], B->name, (long long)B->shape[0],
                         (long long)B->shape[1]);
            free(entry);
            goto out_g;
        }
        if (A->shape[1] != e->in || B->shape[0] != e->out) {
            dt_set_error("%s: module '%s': shape mismatch: the adapter is [%lld, %lld] (B rows, A columns), the model's "
                         "'%s' is [%lld, %lld]", P, g[i].key, (long long)B->shape[0], (long long)A->shape[1], e->name,
                         (long long)e->out, (long long)e->in);
            free(entry);
            goto out_g;
        }
        double alpha = (double)r;
        if (g[i].alpha) {
            float *av = g[i].alpha->numel == 1 ? st_to_f32(g[i].alpha) : NULL;
            if (!av || !(isfinite(av[0]))) {
                free(av);
                dt_set_error("%s: module '%s': alpha '%s' must be one finite number", P, g[i].key, g[i].alpha->name);
                free(entry);
                goto out_g;
            }
            alpha = av[0];
            free(av);
        } else {
            double ma = meta_alpha(meta, g[i].key);
            if (ma > 0) alpha = ma;
        }
        float *a = own(s, (size_t)(r * e->in)), *b = own(s, (size_t)(e->out * r));
        if (dt_convert_to_f32(a, A->data, A->dtype, (size_t)(r * e->in)) ||
            dt_convert_to_f32(b, B->data, B->dtype, (size_t)(e->out * r))) {
            dt_set_error("%s: module '%s': lora tensors must be floating point (A %s, B %s)", P, g[i].key,
                         dt_dtype_name(A->dtype), dt_dtype_name(B->dtype));
            free(entry);
            goto out_g;
        }
        int a_id = s->modules + 1;   /* one per adapter module: its pieces share A */
        for (int k = 0; k < e->npieces; k++) {
            const dt_lora_piece *pc = &e->pieces[k];
            dt_lora_update u = {pc->row0, pc->rows, r, e->in, (float)(spec->scale * alpha / (double)r), a,
                                b + pc->b_row0 * r, a_id, s->files[s->nfiles - 1]};
            add_update(s, pc->target, &u);
        }
        s->modules++;
    }
    free(entry);
    rc = 0;
out_g:
    free(g);
    smap_free(&gmap);
out:
    json_free(meta);
    st_close(f);
    return rc;
}

dt_lora_set *dt_lora_load(const dt_lora_spec *specs, int n, const dt_lora_catalogue *cat) {
    dt_lora_set *s = dt_calloc(1, sizeof *s);
    for (int i = 0; i < n; i++) {
        s->files = dt_realloc(s->files, sizeof *s->files * (size_t)(s->nfiles + 1));
        s->files[s->nfiles++] = dt_strdup(specs[i].path);
        if (load_file(s, &specs[i], cat)) { dt_lora_free(s); return NULL; }
    }
    return s;
}

/* ------------------------------------------------------------------ applying */

void dt_lora_merge(const dt_lora_placed *p, int n, int64_t r0, int64_t nrows, int64_t in, float *w) {
    for (int i = 0; i < n; i++) {
        const dt_lora_update *u = p[i].u;
        int64_t lo = p[i].offset + u->row0, hi = lo + u->rows;
        if (lo < r0) lo = r0;
        if (hi > r0 + nrows) hi = r0 + nrows;
        if (hi <= lo || u->in != in) continue;
        /* w[lo-r0 .. hi-r0) += scale · B[lo - (offset + row0) ..] · A */
        const float *B = u->B + (lo - p[i].offset - u->row0) * u->rank;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(hi - lo), (int)in, (int)u->rank, u->scale, B,
                    (int)u->rank, u->A, (int)in, 1.0f, w + (lo - r0) * in, (int)in);
    }
}

int64_t dt_lora_side(const dt_lora_placed *p, int n, int64_t r0, int64_t nrows, int64_t in, float **Aout, float **Bout) {
    *Aout = *Bout = NULL;
    /* distinct A's among the updates that touch [r0, r0 + nrows) */
    int64_t R = 0;
    int *col = dt_calloc((size_t)(n ? n : 1), sizeof *col);   /* column offset of update i's A */
    for (int i = 0; i < n; i++) {
        const dt_lora_update *u = p[i].u;
        int64_t lo = p[i].offset + u->row0, hi = lo + u->rows;
        col[i] = -1;
        if (hi <= r0 || lo >= r0 + nrows || u->in != in) continue;
        for (int j = 0; j < i; j++)
            if (col[j] >= 0 && p[j].u->a_id == u->a_id) { col[i] = col[j]; break; }
        if (col[i] < 0) { col[i] = (int)R; R += u->rank; }
    }
    if (!R) { free(col); return 0; }
    float *A = dt_calloc((size_t)(R * in), sizeof *A), *B = dt_calloc((size_t)(nrows * R), sizeof *B);
    for (int i = 0; i < n; i++) {
        if (col[i] < 0) continue;
        const dt_lora_update *u = p[i].u;
        memcpy(A + (int64_t)col[i] * in, u->A, sizeof(float) * (size_t)(u->rank * in));
        int64_t base = p[i].offset + u->row0;
        for (int64_t r = 0; r < u->rows; r++) {
            int64_t row = base + r - r0;
            if (row < 0 || row >= nrows) continue;
            for (int64_t k = 0; k < u->rank; k++) B[row * R + col[i] + k] += u->scale * u->B[r * u->rank + k];
        }
    }
    free(col);
    *Aout = A;
    *Bout = B;
    return R;
}
