/* weights.c — a model component's tensors as found on disk: one .safetensors or .gguf file, or a folder of
 * them (diffusers single file / sharded with *.safetensors.index.json, mflux 0.safetensors, 1.safetensors...
 * with model.safetensors.index.json). Builds one name -> tensor hash table over all files, keeps
 * config.json, and resolves the Linear weight forms (dense, MLX affine, fp8, GGUF blocks). */
#define _POSIX_C_SOURCE 200809L
#include "weights.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/infile.h"
#include "../core/fp8.h"
#include "gguf.h"

struct dt_weights {
    char *path;
    st_file **files;
    size_t nfiles;
    gguf_file **gfiles;
    size_t ngfiles;
    char container[64];
    json *config;
    const st_tensor **all;   /* every tensor, file by file in header order */
    size_t count;
    size_t *slots;           /* hash table: index into all + 1 (values > count: derived[value - count - 1]) */
    size_t nslots;
    st_tensor **derived;     /* derived tensors (views of stored ones / materialised copies), owned */
    void **derived_buf;      /* parallel: the malloc'd data of a materialised copy, or NULL for a view */
    size_t nderived;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = dt_malloc(a + b + 2);
    memcpy(p, dir, a);
    size_t n = a;
    if (a && dir[a - 1] != '/') p[n++] = '/';
    memcpy(p + n, name, b + 1);
    return p;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_dir(const char *p) { struct stat sb; return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode); }
static int is_file(const char *p) { struct stat sb; return stat(p, &sb) == 0 && S_ISREG(sb.st_mode); }

/* Natural order so that 2.safetensors sorts before 10.safetensors. */
static int natural_cmp(const void *pa, const void *pb) {
    const char *a = *(const char *const *)pa, *b = *(const char *const *)pb;
    while (*a && *b) {
        if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
            const char *ea = a, *eb = b;
            while (*a == '0') a++;
            while (*b == '0') b++;
            ea = a; eb = b;
            while (*ea >= '0' && *ea <= '9') ea++;
            while (*eb >= '0' && *eb <= '9') eb++;
            if (ea - a != eb - b) return (ea - a) < (eb - b) ? -1 : 1;
            int c = strncmp(a, b, (size_t)(ea - a));
            if (c) return c;
            a = ea; b = eb;
            continue;
        }
        if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++; b++;
    }
    return *a ? 1 : *b ? -1 : 0;
}

typedef struct { char **v; size_t n, cap; } strlist;
static void sl_push(strlist *l, char *s) {
    if (l->n == l->cap) { l->cap = l->cap ? 2 * l->cap : 8; l->v = dt_realloc(l->v, l->cap * sizeof *l->v); }
    l->v[l->n++] = s;
}
static void sl_free(strlist *l) { for (size_t i = 0; i < l->n; i++) free(l->v[i]); free(l->v); }
static int sl_has(const strlist *l, const char *s) {
    for (size_t i = 0; i < l->n; i++) if (strcmp(l->v[i], s) == 0) return 1;
    return 0;
}

void dt_weights_close(dt_weights *w) {
    if (!w) return;
    for (size_t i = 0; i < w->nfiles; i++) st_close(w->files[i]);
    free(w->files);
    for (size_t i = 0; i < w->ngfiles; i++) gguf_close(w->gfiles[i]);
    free(w->gfiles);
    json_free(w->config);
    free(w->all);
    free(w->slots);
    for (size_t i = 0; i < w->nderived; i++) {
        free((void *)w->derived[i]->name);
        free(w->derived[i]);
        free(w->derived_buf[i]);
    }
    free(w->derived);
    free(w->derived_buf);
    free(w->path);
    free(w);
}

static int add_file(dt_weights *w, const char *path) {
    if (ends_with(path, ".gguf")) {
        gguf_file *g = gguf_open(path);
        if (!g) return -1;
        w->gfiles = dt_realloc(w->gfiles, (w->ngfiles + 1) * sizeof *w->gfiles);
        w->gfiles[w->ngfiles++] = g;
        return 0;
    }
    st_file *f = st_open(path);
    if (!f) return -1;
    w->files = dt_realloc(w->files, (w->nfiles + 1) * sizeof *w->files);
    w->files[w->nfiles++] = f;
    return 0;
}

/* Builds the name table over every file; duplicate names across files are an error. */
static int build_index(dt_weights *w) {
    size_t total = 0;
    for (size_t i = 0; i < w->nfiles; i++) total += st_count(w->files[i]);
    for (size_t i = 0; i < w->ngfiles; i++) total += gguf_count(w->gfiles[i]);
    w->all = dt_calloc(total ? total : 1, sizeof *w->all);
    w->nslots = 16;
    while (w->nslots < 2 * total) w->nslots *= 2;
    w->slots = dt_calloc(w->nslots, sizeof *w->slots);
    size_t mask = w->nslots - 1;
    for (size_t fi = 0; fi < w->nfiles + w->ngfiles; fi++) {
        int gg = fi >= w->nfiles;
        size_t cnt = gg ? gguf_count(w->gfiles[fi - w->nfiles]) : st_count(w->files[fi]);
        for (size_t k = 0; k < cnt; k++) {
            const st_tensor *t = gg ? gguf_at(w->gfiles[fi - w->nfiles], k) : st_at(w->files[fi], k);
            size_t h = (size_t)hash_str(t->name) & mask;
            while (w->slots[h]) {
                const st_tensor *o = w->all[w->slots[h] - 1];
                if (strcmp(o->name, t->name) == 0) {
                    dt_set_error("%s: tensor '%s' is also in %s (duplicate tensor name across files)", t->file, t->name, o->file);
                    return -1;
                }
                h = (h + 1) & mask;
            }
            w->all[w->count] = t;
            w->slots[h] = ++w->count;
        }
    }
    if (w->nfiles) snprintf(w->container, sizeof w->container, "safetensors");
    if (w->ngfiles) {
        size_t l = strlen(w->container);
        snprintf(w->container + l, sizeof w->container - l, "%sGGUF v%u", l ? " + " : "", gguf_version(w->gfiles[0]));
    }
    return 0;
}

/* Opens the shards named by an index file and checks that every listed tensor is where it says. */
static int open_with_index(dt_weights *w, const char *dir, const char *index_path) {
    json *idx = json_parse_file(index_path);
    if (!idx) return -1;
    int rc = -1;
    strlist files = {0};
    const json *map = json_get(idx, "weight_map");
    if (!map || map->type != JSON_OBJECT) { dt_set_error("%s: no \"weight_map\" object", index_path); goto out; }
    for (size_t i = 0; i < map->len; i++) {
        const json *v = map->items[i];
        if (v->type != JSON_STRING || !v->len || strchr(v->str, '/') || strcmp(v->str, "..") == 0 || strlen(v->str) != v->len) {
            dt_set_error("%s: weight_map entry for '%s' is not a plain file name", index_path, map->keys[i]);
            goto out;
        }
        if (!sl_has(&files, v->str)) sl_push(&files, dt_strdup(v->str));
    }
    if (!files.n) { dt_set_error("%s: weight_map is empty", index_path); goto out; }
    if (files.n > 1) qsort(files.v, files.n, sizeof *files.v, natural_cmp);
    for (size_t i = 0; i < files.n; i++) {
        char *p = join_path(dir, files.v[i]);
        if (!is_file(p)) {
            struct stat sb;
            if (stat(p, &sb) == 0)
                dt_set_error("%s: shard '%s' listed in weight_map is not a regular file (%s is %s)", index_path, files.v[i],
                             p, S_ISDIR(sb.st_mode) ? "a folder" : "not a file");
            else if (errno == ENOENT)
                dt_set_error("%s: shard '%s' listed in weight_map does not exist (missing file %s)", index_path, files.v[i], p);
            else dt_set_error("%s: shard '%s' listed in weight_map: %s: %s", index_path, files.v[i], p, strerror(errno));
            free(p);
            goto out;
        }
        int r = add_file(w, p);
        free(p);
        if (r) goto out;
    }
    for (size_t i = 0; i < map->len; i++) {
        const char *fname = map->items[i]->str;
        size_t fi = 0;
        while (fi < files.n && strcmp(files.v[fi], fname) != 0) fi++;
        if (!st_find(w->files[fi], map->keys[i])) {
            dt_set_error("%s: tensor '%s' listed in %s is missing from that shard (not found in %s)",
                         st_path(w->files[fi]), map->keys[i], index_path, fname);
            goto out;
        }
    }
    rc = 0;
out:
    sl_free(&files);
    json_free(idx);
    return rc;
}

/* The *.safetensors files of dir (or, when it has none, its *.gguf files) and its *.safetensors.index.json. */
static int list_safetensors(const char *dir, strlist *st, strlist *indexes) {
    DIR *d = opendir(dir);
    if (!d) { dt_set_error("%s: cannot open folder: %s", dir, strerror(errno)); return -1; }
    strlist gg = {0};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (ends_with(e->d_name, ".safetensors")) sl_push(st, dt_strdup(e->d_name));
        else if (indexes && ends_with(e->d_name, ".safetensors.index.json")) sl_push(indexes, dt_strdup(e->d_name));
        else if (ends_with(e->d_name, ".gguf")) sl_push(&gg, dt_strdup(e->d_name));
    }
    closedir(d);
    if (!st->n && gg.n) { *st = gg; gg = (strlist){0}; }
    sl_free(&gg);
    if (st->n > 1) qsort(st->v, st->n, sizeof *st->v, natural_cmp);
    if (indexes && indexes->n > 1) qsort(indexes->v, indexes->n, sizeof *indexes->v, natural_cmp);
    return 0;
}

static int open_folder(dt_weights *w, const char *dir) {
    strlist st = {0}, idx = {0};
    int rc = -1;
    if (list_safetensors(dir, &st, &idx)) goto out;
    if (idx.n) {
        const char *pick = NULL;
        if (idx.n == 1) pick = idx.v[0];
        else if (sl_has(&idx, "diffusion_pytorch_model.safetensors.index.json")) pick = "diffusion_pytorch_model.safetensors.index.json";
        else if (sl_has(&idx, "model.safetensors.index.json")) pick = "model.safetensors.index.json";
        else { dt_set_error("%s: several *.safetensors.index.json files; cannot tell which to use", dir); goto out; }
        char *ip = join_path(dir, pick);
        rc = open_with_index(w, dir, ip);
        free(ip);
        goto out;
    }
    if (!st.n) { dt_set_error("%s: no .safetensors (or .gguf) files in this folder", dir); goto out; }
    /* a single canonical file wins over stray extra files (variants such as *.fp16.safetensors,
     * test outputs); otherwise every file is a shard */
    const char *canon = sl_has(&st, "diffusion_pytorch_model.safetensors") ? "diffusion_pytorch_model.safetensors"
                      : sl_has(&st, "model.safetensors") ? "model.safetensors" : NULL;
    if (canon) {
        char *p = join_path(dir, canon);
        rc = add_file(w, p);
        free(p);
        goto out;
    }
    for (size_t i = 0; i < st.n; i++) {
        char *p = join_path(dir, st.v[i]);
        int r = add_file(w, p);
        free(p);
        if (r) goto out;
    }
    rc = 0;
out:
    sl_free(&st);
    sl_free(&idx);
    return rc;
}

dt_weights *dt_weights_open(const char *path) {
    int kind = dt_input_kind(path);   /* 0 file, 1 folder; missing, a loop, a FIFO: an error naming why */
    if (kind < 0) return NULL;
    dt_weights *w = dt_calloc(1, sizeof *w);
    w->path = dt_strdup(path);
    if (kind == 1) {
        if (open_folder(w, path)) goto fail;
        char *cp = join_path(path, "config.json");
        if (is_file(cp)) {
            w->config = json_parse_file(cp);
            if (!w->config) { free(cp); goto fail; }
        }
        free(cp);
    } else {
        if (add_file(w, path)) goto fail;
    }
    if (build_index(w)) goto fail;
    return w;
fail:
    dt_weights_close(w);
    return NULL;
}

const char *dt_weights_path(const dt_weights *w) { return w->path; }
const json *dt_weights_config(const dt_weights *w) { return w->config; }

const json *dt_weights_class_config(const dt_weights *w, const char *dir, const char *cls, const char *family,
                                    char *what, size_t what_len) {
    snprintf(what, what_len, "%s/config.json", dir);
    if (!w->config) {
        dt_set_error("%s: missing (a %s transformer folder needs its config.json)", what, family);
        return NULL;
    }
    const char *name = json_get_str(w->config, "_class_name");
    if (name && strcmp(name, cls)) {
        dt_set_error("%s: _class_name is '%s', expected %s", what, name, cls);
        return NULL;
    }
    return w->config;
}
size_t dt_weights_count(const dt_weights *w) { return w->count; }
const st_tensor *dt_weights_at(const dt_weights *w, size_t i) { return i < w->count ? w->all[i] : NULL; }

static const st_tensor *slot_tensor(const dt_weights *w, size_t v) {
    return v <= w->count ? w->all[v - 1] : w->derived[v - w->count - 1];
}

const st_tensor *dt_weights_find(const dt_weights *w, const char *name) {
    if (!w || !name) return NULL;
    size_t mask = w->nslots - 1, h = (size_t)hash_str(name) & mask;
    while (w->slots[h]) {
        const st_tensor *t = slot_tensor(w, w->slots[h]);
        if (strcmp(t->name, name) == 0) return t;
        h = (h + 1) & mask;
    }
    return NULL;
}

const char *dt_weights_metadata(const dt_weights *w, const char *key) {
    for (size_t i = 0; i < w->nfiles; i++) {
        const char *v = st_metadata(w->files[i], key);
        if (v) return v;
    }
    for (size_t i = 0; i < w->ngfiles; i++) {
        const char *v = gguf_meta(w->gfiles[i], key);
        if (v) return v;
    }
    return NULL;
}

const char *dt_weights_container(const dt_weights *w) { return w->container; }

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

const st_tensor *dt_weights_get(const dt_weights *w, const char *name, int ndim, const int64_t *shape) {
    const st_tensor *t = dt_weights_find(w, name);
    if (!t) { dt_set_error("%s: tensor '%s' not found", w->path, name); return NULL; }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[256], b[256];
        fmt_shape(a, sizeof a, t->ndim, t->shape);
        fmt_shape(b, sizeof b, ndim, shape);
        dt_set_error("%s: tensor '%s' has shape %s, expected %s (wrong shape)", t->file, name, a, b);
        return NULL;
    }
    return t;
}

static int is_float(dt_dtype t) { return t == DT_F32 || t == DT_F16 || t == DT_BF16 || t == DT_F64; }

int dt_weights_read_f32(const dt_weights *w, const char *name, float *dst, int64_t n) {
    const st_tensor *t = dt_weights_find(w, name);
    if (!t) { dt_set_error("%s: tensor '%s' not found", w->path, name); return -1; }
    if (!is_float(t->dtype)) {
        dt_set_error("%s: tensor '%s' has dtype %s, a float type was expected", t->file, name, dt_dtype_name(t->dtype));
        return -1;
    }
    if (t->numel != n) {
        dt_set_error("%s: tensor '%s' has %" PRId64 " elements, expected %" PRId64 " (wrong shape)", t->file, name, t->numel, n);
        return -1;
    }
    return dt_convert_to_f32(dst, t->data, t->dtype, (size_t)n);
}

/* Bits hint for ambiguous packed shapes: config.json quantization.bits, else safetensors metadata. */
static int bits_hint(const dt_weights *w) {
    const json *q = json_get(w->config, "quantization");
    if (!q) q = json_get(w->config, "quantization_config");
    int64_t b = json_get_int(q, "bits", 0);
    if (b) return (int)b;
    const char *m = dt_weights_metadata(w, "quantization");
    if (m) {
        json *j = json_parse(m, strlen(m), "metadata");
        if (j) { b = json_get_int(j, "bits", 0); json_free(j); }
        dt_clear_error();
        if (b) return (int)b;
    }
    m = dt_weights_metadata(w, "quantization_level");
    if (m) { char *end; long v = strtol(m, &end, 10); if (*m && !*end) return (int)v; }
    return 0;
}

static int good_group(int64_t g) { return g == 32 || g == 64 || g == 128; }

/* One value of a scale tensor (F32/BF16/F16/F64) as f32. */
static float scale_at(const st_tensor *t, int64_t i) {
    float v = 0;
    dt_convert_to_f32(&v, (const char *)t->data + (size_t)i * dt_dtype_size(t->dtype), t->dtype, 1);
    return v;
}

/* fp8 weight scales (NAME.weight_scale, ComfyUI's NAME.scale_weight) and the static input scale. */
static int fp8_scales(const dt_weights *w, const char *name, dt_linear_src *src) {
    static const char *const wkeys[] = {"weight_scale", "scale_weight"}, *const ikeys[] = {"input_scale", "scale_input"};
    char key[1024];
    for (int pass = 0; pass < 2; pass++) {
        const char *const *keys = pass ? ikeys : wkeys;
        for (int k = 0; k < 2; k++) {
            snprintf(key, sizeof key, "%s.%s", name, keys[k]);
            const st_tensor *t = dt_weights_find(w, key);
            if (!t) continue;
            int fl = t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16 || t->dtype == DT_F64;
            int per_row = !pass && t->numel == src->out && src->out > 1 && (t->ndim == 1 || (t->ndim == 2 && t->shape[1] == 1));
            if (!fl || (t->numel != 1 && !per_row) || t->ndim > 2) {
                char a[128];
                fmt_shape(a, sizeof a, t->ndim, t->shape);
                dt_set_error("%s: linear '%s': '%s' is %s %s; expected one float%s", t->file, name, key,
                             dt_dtype_name(t->dtype), a, pass ? "" : " (per tensor) or one per output channel");
                return -1;
            }
            if (pass) {
                src->input_scale = scale_at(t, 0);
            } else if (per_row) {
                if (t->dtype == DT_F64) {
                    dt_set_error("%s: linear '%s': per-channel '%s' must be F32, BF16 or F16", t->file, name, key);
                    return -1;
                }
                src->w_scales = t->data;
                src->w_scales_dtype = t->dtype;
            } else {
                src->w_scale = scale_at(t, 0);
            }
            float v = pass ? src->input_scale : per_row ? scale_at(t, 0) : src->w_scale;
            if (!(v == v) || v == INFINITY || v == -INFINITY) {
                dt_set_error("%s: linear '%s': '%s' is not finite", t->file, name, key);
                return -1;
            }
            break;
        }
    }
    return 0;
}

int dt_weights_linear(const dt_weights *w, const char *name, int64_t out, int64_t in, int want_bias,
                      dt_linear_src *src) {
    char key[1024];
    memset(src, 0, sizeof *src);
    snprintf(key, sizeof key, "%s.weight", name);
    const st_tensor *wt = dt_weights_find(w, key);
    if (!wt) { dt_set_error("%s: linear '%s': tensor '%s' not found", w->path, name, key); return -1; }
    if (wt->ndim != 2) {
        dt_set_error("%s: linear '%s': weight has %d dimensions, expected 2", wt->file, name, wt->ndim);
        return -1;
    }
    src->name = wt->name;
    src->data = wt->data;
    src->dtype = wt->dtype;
    src->w_scale = 1.0f;
    if (wt->dtype == DT_F32 || wt->dtype == DT_F16 || wt->dtype == DT_BF16 || wt->dtype == DT_F8_E4M3 ||
        wt->dtype == DT_F8_E5M2 || dt_dtype_is_block(wt->dtype)) {
        if ((out > 0 && wt->shape[0] != out) || (in > 0 && wt->shape[1] != in)) {
            char a[128], b[128]; int64_t e[2] = {out > 0 ? out : wt->shape[0], in > 0 ? in : wt->shape[1]};
            fmt_shape(a, sizeof a, 2, wt->shape); fmt_shape(b, sizeof b, 2, e);
            dt_set_error("%s: linear '%s': weight has shape %s, expected %s (wrong shape)", wt->file, name, a, b);
            return -1;
        }
        src->out = wt->shape[0];
        src->in = wt->shape[1];
        src->bits = 0;
        if (dt_linear_src_fp8(src) && fp8_scales(w, name, src)) return -1;
    } else if (wt->dtype == DT_U32) {
        char ks[1024], kb[1024];
        snprintf(ks, sizeof ks, "%s.scales", name);
        snprintf(kb, sizeof kb, "%s.biases", name);
        const st_tensor *sc = dt_weights_find(w, ks), *bi = dt_weights_find(w, kb);
        if (!sc || !bi) {
            dt_set_error("%s: linear '%s': packed U32 weight without '%s' (quantized weight needs scales and biases)",
                         wt->file, name, sc ? kb : ks);
            return -1;
        }
        if (sc->dtype != bi->dtype || (sc->dtype != DT_BF16 && sc->dtype != DT_F16 && sc->dtype != DT_F32)) {
            dt_set_error("%s: linear '%s': scales (%s) and biases (%s) must share one float dtype (BF16/F16/F32)",
                         sc->file, name, dt_dtype_name(sc->dtype), dt_dtype_name(bi->dtype));
            return -1;
        }
        if (sc->ndim != 2 || bi->ndim != 2 || sc->shape[0] != bi->shape[0] || sc->shape[1] != bi->shape[1]) {
            char a[128], b[128];
            fmt_shape(a, sizeof a, sc->ndim, sc->shape); fmt_shape(b, sizeof b, bi->ndim, bi->shape);
            dt_set_error("%s: linear '%s': scales shape %s and biases shape %s must be equal 2-D shapes", sc->file, name, a, b);
            return -1;
        }
        int64_t rows = wt->shape[0], P = wt->shape[1], G = sc->shape[1];
        if (sc->shape[0] != rows) {
            dt_set_error("%s: linear '%s': scales have %" PRId64 " rows but the packed weight has %" PRId64,
                         sc->file, name, sc->shape[0], rows);
            return -1;
        }
        if (out > 0 && rows != out) {
            dt_set_error("%s: linear '%s': packed weight has %" PRId64 " rows, expected %" PRId64 " (wrong shape)",
                         wt->file, name, rows, out);
            return -1;
        }
        if (P <= 0 || G <= 0) {
            dt_set_error("%s: linear '%s': empty packed weight or scales", wt->file, name);
            return -1;
        }
        int bits = 0;
        if (in > 0) {
            if ((P * 32) % in != 0 || ((P * 32) / in != 4 && (P * 32) / in != 8)) {
                dt_set_error("%s: linear '%s': packed weight [%" PRId64 ", %" PRId64 "] cannot hold %" PRId64
                             " inputs at 4 or 8 bits (impossible bits)", wt->file, name, rows, P, in);
                return -1;
            }
            bits = (int)((P * 32) / in);
        } else {
            /* infer: candidates 4 and 8 bits whose group size is valid */
            int ok4 = (8 * P) % G == 0 && good_group(8 * P / G), ok8 = (4 * P) % G == 0 && good_group(4 * P / G);
            if (ok4 && ok8) {
                int hint = bits_hint(w);
                if (hint == 4 || hint == 8) bits = hint;
                else bits = 8 * P / G == 64 ? 4 : 4 * P / G == 64 ? 8 : 4; /* MLX default group 64 */
            } else if (ok4) bits = 4;
            else if (ok8) bits = 8;
            else {
                dt_set_error("%s: linear '%s': packed weight [%" PRId64 ", %" PRId64 "] with scales [%" PRId64 ", %" PRId64
                             "] gives an impossible group size for 4 or 8 bits (must be 32, 64 or 128)",
                             wt->file, name, rows, P, rows, G);
                return -1;
            }
            in = P * 32 / bits;
        }
        if (in % G != 0 || !good_group(in / G)) {
            dt_set_error("%s: linear '%s': %" PRId64 " inputs with %" PRId64 " scale columns in '%s' is an impossible group size"
                         " (must be 32, 64 or 128)", sc->file, name, in, G, ks);
            return -1;
        }
        src->out = rows;
        src->in = in;
        src->bits = bits;
        src->group_size = (int)(in / G);
        src->sb_dtype = sc->dtype;
        src->scales = sc->data;
        src->biases = bi->data;
    } else {
        dt_set_error("%s: linear '%s': weight dtype %s is not a Linear weight form (float, fp8, packed U32, GGUF blocks)",
                     wt->file, name, dt_dtype_name(wt->dtype));
        return -1;
    }
    if (want_bias) {
        snprintf(key, sizeof key, "%s.bias", name);
        const st_tensor *b = dt_weights_find(w, key);
        if (!b && want_bias > 0) { dt_set_error("%s: linear '%s': bias tensor '%s' not found", w->path, name, key); return -1; }
        if (b) {
            if (b->ndim != 1 || b->shape[0] != src->out || !(b->dtype == DT_F32 || b->dtype == DT_F16 || b->dtype == DT_BF16)) {
                char a[128]; fmt_shape(a, sizeof a, b->ndim, b->shape);
                dt_set_error("%s: linear '%s': bias has shape %s dtype %s, expected [%" PRId64 "] float (wrong shape)",
                             b->file, name, a, dt_dtype_name(b->dtype), src->out);
                return -1;
            }
            src->bias = b->data;
            src->bias_dtype = b->dtype;
        }
    }
    return 0;
}

char *dt_weights_component_dir(const char *path, const char *name) {
    char *sub = join_path(path, name);
    if (is_dir(sub)) return sub;
    free(sub);
    if (is_dir(path)) {
        strlist st = {0};
        if (list_safetensors(path, &st, NULL) == 0 && st.n) { sl_free(&st); return dt_strdup(path); }
        sl_free(&st);
    } else if (is_file(path) && (ends_with(path, ".safetensors") || ends_with(path, ".gguf"))) {
        return dt_strdup(path);
    }
    dt_set_error("%s: no '%s' folder and no .safetensors or .gguf files here", path, name);
    return NULL;
}

/* ------------------------------------------------------------------ derived tensors */

/* Inserts t (owned from now on, with its optional buffer) under its name; rehashes when half full. */
static const st_tensor *add_derived(dt_weights *w, st_tensor *t, void *buf) {
    w->derived = dt_realloc(w->derived, (w->nderived + 1) * sizeof *w->derived);
    w->derived_buf = dt_realloc(w->derived_buf, (w->nderived + 1) * sizeof *w->derived_buf);
    w->derived[w->nderived] = t;
    w->derived_buf[w->nderived] = buf;
    w->nderived++;
    size_t total = w->count + w->nderived;
    if (2 * total > w->nslots) {
        size_t ns = w->nslots;
        while (ns < 2 * total) ns *= 2;
        free(w->slots);
        w->slots = dt_calloc(ns, sizeof *w->slots);
        w->nslots = ns;
        for (size_t v = 1; v <= total; v++) {
            size_t h = (size_t)hash_str(slot_tensor(w, v)->name) & (ns - 1);
            while (w->slots[h]) h = (h + 1) & (ns - 1);
            w->slots[h] = v;
        }
    } else {
        size_t mask = w->nslots - 1, h = (size_t)hash_str(t->name) & mask;
        while (w->slots[h]) h = (h + 1) & mask;
        w->slots[h] = total;
    }
    return t;
}

/* A new tensor like src (dtype, trailing dims, file) with `rows` rows and name; NULL on a bad request. */
static st_tensor *derive_header(const dt_weights *w, const char *name, const st_tensor *src, int64_t rows) {
    if (!name || !*name || !src) { dt_set_error("%s: derived tensor without a name or a source", w->path); return NULL; }
    if (dt_weights_find(w, name)) {
        dt_set_error("%s: cannot add tensor '%s' (derived from '%s'): the name already exists", w->path, name, src->name);
        return NULL;
    }
    if (src->ndim < 1) { dt_set_error("%s: tensor '%s' is a scalar; it has no rows to take", src->file, src->name); return NULL; }
    st_tensor *t = dt_calloc(1, sizeof *t);
    *t = *src;
    t->name = dt_strdup(name);
    t->shape[0] = rows;
    int64_t row_elems = 1;
    for (int d = 1; d < src->ndim; d++) row_elems *= src->shape[d];
    t->numel = rows * row_elems;
    t->nbytes = src->shape[0] ? (size_t)rows * (src->nbytes / (size_t)src->shape[0]) : 0;   /* block types too */
    return t;
}

static size_t row_bytes(const st_tensor *src) {
    return src->shape[0] ? src->nbytes / (size_t)src->shape[0] : 0;
}

const st_tensor *dt_weights_add_view(dt_weights *w, const char *name, const st_tensor *src, int64_t row0, int64_t nrows) {
    if (src && (src->ndim < 1 || row0 < 0 || nrows < 0 || row0 > src->shape[0] || nrows > src->shape[0] - row0)) {
        dt_set_error("%s: rows [%" PRId64 ", %" PRId64 ") are outside tensor '%s' (%" PRId64 " rows) for '%s'", src->file,
                     row0, row0 + nrows, src->name, src->ndim >= 1 ? src->shape[0] : 0, name ? name : "?");
        return NULL;
    }
    st_tensor *t = derive_header(w, name, src, nrows);
    if (!t) return NULL;
    t->data = (const char *)src->data + (size_t)row0 * row_bytes(src);
    return add_derived(w, t, NULL);
}

const st_tensor *dt_weights_add_alias(dt_weights *w, const char *name, const st_tensor *src) {
    if (!name || !*name || !src) { dt_set_error("%s: alias without a name or a source", w->path); return NULL; }
    if (dt_weights_find(w, name)) {
        dt_set_error("%s: cannot add tensor '%s' (alias of '%s'): the name already exists", w->path, name, src->name);
        return NULL;
    }
    st_tensor *t = dt_calloc(1, sizeof *t);
    *t = *src;
    t->name = dt_strdup(name);
    return add_derived(w, t, NULL);
}

const st_tensor *dt_weights_add_rows(dt_weights *w, const char *name, const st_tensor *src, int nranges,
                                     const int64_t *row0, const int64_t *nrows) {
    int64_t total = 0;
    for (int r = 0; src && r < nranges; r++) {
        if (src->ndim < 1 || row0[r] < 0 || nrows[r] < 0 || row0[r] > src->shape[0] || nrows[r] > src->shape[0] - row0[r]) {
            dt_set_error("%s: rows [%" PRId64 ", %" PRId64 ") are outside tensor '%s' for '%s'", src->file, row0[r],
                         row0[r] + nrows[r], src->name, name ? name : "?");
            return NULL;
        }
        total += nrows[r];
    }
    st_tensor *t = derive_header(w, name, src, total);
    if (!t) return NULL;
    size_t rb = row_bytes(src);
    char *buf = dt_malloc(t->nbytes ? t->nbytes : 1), *p = buf;
    for (int r = 0; r < nranges; r++) {
        memcpy(p, (const char *)src->data + (size_t)row0[r] * rb, (size_t)nrows[r] * rb);
        p += (size_t)nrows[r] * rb;
    }
    t->data = buf;
    return add_derived(w, t, buf);
}

size_t dt_weights_derived_count(const dt_weights *w) { return w->nderived; }
const st_tensor *dt_weights_derived_at(const dt_weights *w, size_t i) { return i < w->nderived ? w->derived[i] : NULL; }

void dt_weights_set_config(dt_weights *w, json *cfg) {
    if (w->config != cfg) json_free(w->config);
    w->config = cfg;
}

void dt_weights_release(const dt_weights *w, const st_tensor *t) {
    for (size_t i = 0; w && t && i < w->nfiles; i++)
        if (st_release_pages(w->files[i], t)) return;
}
