/* safetensors.c — validating mmap reader (zero-copy tensor views), in-memory writer and streaming
 * writer for the safetensors format: 8-byte little-endian header length, JSON header, data section.
 * Every reader error is one line that starts with the file's path. */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/infile.h"
#include "../core/outfile.h"
#include "json.h"

#define ST_MAX_HEADER (100u * 1024u * 1024u) /* same limit as the reference implementation */

struct st_file {
    char *path;
    unsigned char *base;   /* whole file image */
    size_t size;
    int mapped;            /* 1: munmap base; 0: free base */
    size_t count;
    st_tensor *tensors;
    char **names;
    size_t *slots;         /* hash table of tensor index + 1 (0 = empty) */
    size_t nslots;
    size_t nmeta;
    char **meta_keys, **meta_vals;
    void **copies;         /* aligned copies of tensors whose bytes are misaligned in the file */
    size_t ncopies;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

/* The safetensors dtypes (element types, F8_E4M3 / F8_E5M2 included); GGUF's block types are not among them. */
static int dtype_from_name(const char *s, dt_dtype *out) {
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        if (!dt_dtype_is_block((dt_dtype)t) && strcmp(s, dt_dtype_name((dt_dtype)t)) == 0) { *out = (dt_dtype)t; return 0; }
    return -1;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

void st_close(st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->count; i++) free(f->names[i]);
    for (size_t i = 0; i < f->nmeta; i++) { free(f->meta_keys[i]); free(f->meta_vals[i]); }
    for (size_t i = 0; i < f->ncopies; i++) free(f->copies[i]);
    free(f->names); free(f->tensors); free(f->slots);
    free(f->meta_keys); free(f->meta_vals); free(f->copies);
    if (f->base) {
        if (f->mapped) munmap(f->base, f->size);
        else free(f->base);
    }
    free(f->path);
    free(f);
}

/* Inserts tensor i into the hash table; returns -1 if the name is already present. */
static int index_insert(st_file *f, size_t i) {
    size_t mask = f->nslots - 1, h = (size_t)hash_str(f->names[i]) & mask;
    while (f->slots[h]) {
        if (strcmp(f->names[f->slots[h] - 1], f->names[i]) == 0) return -1;
        h = (h + 1) & mask;
    }
    f->slots[h] = i + 1;
    return 0;
}

typedef struct { uint64_t begin, end; size_t idx; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int get_u64(const json *v, uint64_t *out) {
    if (!v || v->type != JSON_NUMBER || !v->is_integer || v->integer < 0) return -1;
    *out = (uint64_t)v->integer;
    return 0;
}

/* Validates the image in f->base/f->size and fills the tensor table. */
static int st_parse(st_file *f) {
    const char *P = f->path;
    if (f->size == 0) { dt_set_error("%s: empty file (not a safetensors file)", P); return -1; }
    if (f->size < 8) {
        dt_set_error("%s: file too short (%zu bytes) to hold the 8-byte header length", P, f->size);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen > f->size - 8) {
        dt_set_error("%s: header length %" PRIu64 " exceeds the file size (%zu bytes); truncated or not a safetensors file",
                     P, hlen, f->size);
        return -1;
    }
    if (hlen > ST_MAX_HEADER) {
        dt_set_error("%s: header length %" PRIu64 " is larger than the 100 MB limit", P, hlen);
        return -1;
    }
    size_t wl = strlen(P) + 32;
    char *what = dt_malloc(wl);
    snprintf(what, wl, "%s: header", P); /* byte positions count from the start of the JSON header */
    json *h = json_parse((const char *)f->base + 8, (size_t)hlen, what);
    free(what);
    if (!h) return -1; /* message already names the file */
    int rc = -1;
    span *spans = NULL;
    if (h->type != JSON_OBJECT) { dt_set_error("%s: header is not a JSON object", P); goto out; }

    const unsigned char *data = f->base + 8 + hlen;
    uint64_t data_len = f->size - 8 - hlen;
    f->tensors = dt_calloc(h->len ? h->len : 1, sizeof *f->tensors);
    f->names = dt_calloc(h->len ? h->len : 1, sizeof *f->names);
    f->nslots = 16;
    while (f->nslots < 2 * h->len) f->nslots *= 2;
    f->slots = dt_calloc(f->nslots, sizeof *f->slots);
    spans = dt_calloc(h->len ? h->len : 1, sizeof *spans);
    size_t nspans = 0;
    int seen_meta = 0;

    for (size_t k = 0; k < h->len; k++) {
        const char *name = h->keys[k];
        const json *v = h->items[k];
        if (strcmp(name, "__metadata__") == 0) {
            if (seen_meta) { dt_set_error("%s: duplicate __metadata__ entry", P); goto out; }
            seen_meta = 1;
            if (v->type != JSON_OBJECT) { dt_set_error("%s: __metadata__ is not a JSON object", P); goto out; }
            f->meta_keys = dt_calloc(v->len ? v->len : 1, sizeof(char *));
            f->meta_vals = dt_calloc(v->len ? v->len : 1, sizeof(char *));
            for (size_t m = 0; m < v->len; m++) {
                if (v->items[m]->type != JSON_STRING) {
                    dt_set_error("%s: __metadata__ value for '%s' is not a string", P, v->keys[m]);
                    goto out;
                }
                f->meta_keys[f->nmeta] = dt_strdup(v->keys[m]);
                f->meta_vals[f->nmeta] = dt_strdup(v->items[m]->str);
                f->nmeta++;
            }
            continue;
        }
        size_t i = f->count;
        st_tensor *t = &f->tensors[i];
        f->names[i] = dt_strdup(name);
        f->count++;
        t->name = f->names[i];
        t->file = f->path;
        if (index_insert(f, i)) { dt_set_error("%s: duplicate tensor name '%s' in header", P, name); goto out; }
        if (v->type != JSON_OBJECT) { dt_set_error("%s: tensor '%s': header entry is not a JSON object", P, name); goto out; }
        const char *dts = json_get_str(v, "dtype");
        if (!dts) { dt_set_error("%s: tensor '%s': missing or non-string dtype", P, name); goto out; }
        if (dtype_from_name(dts, &t->dtype)) { dt_set_error("%s: tensor '%s': unknown dtype '%s'", P, name, dts); goto out; }
        const json *shp = json_get(v, "shape");
        if (!shp || shp->type != JSON_ARRAY) { dt_set_error("%s: tensor '%s': missing shape array", P, name); goto out; }
        if (shp->len > ST_MAX_DIMS) {
            dt_set_error("%s: tensor '%s': shape has %zu dimensions (at most %d supported)", P, name, shp->len, ST_MAX_DIMS);
            goto out;
        }
        t->ndim = (int)shp->len;
        size_t esize = dt_dtype_size(t->dtype);
        uint64_t numel = 1, limit = (uint64_t)INT64_MAX / esize;
        for (int d = 0; d < t->ndim; d++) {
            const json *e = shp->items[d];
            if (e->type != JSON_NUMBER || !e->is_integer) {
                dt_set_error("%s: tensor '%s': shape entries must be integers", P, name);
                goto out;
            }
            if (e->integer < 0) {
                dt_set_error("%s: tensor '%s': negative dimension %" PRId64 " in shape", P, name, e->integer);
                goto out;
            }
            t->shape[d] = e->integer;
        }
        for (int d = 0; d < t->ndim; d++) {
            uint64_t dim = (uint64_t)t->shape[d];
            if (dim && numel > limit / dim) {
                char sb[256]; fmt_shape(sb, sizeof sb, t->ndim, t->shape);
                dt_set_error("%s: tensor '%s': shape %s overflows (element count too large)", P, name, sb);
                goto out;
            }
            numel *= dim;
        }
        t->numel = (int64_t)numel;
        t->nbytes = (size_t)(numel * esize);
        const json *off = json_get(v, "data_offsets");
        uint64_t b, e;
        if (!off || off->type != JSON_ARRAY || off->len != 2 || get_u64(off->items[0], &b) || get_u64(off->items[1], &e)) {
            dt_set_error("%s: tensor '%s': data_offsets must be [begin, end] with non-negative integers", P, name);
            goto out;
        }
        if (b > e) {
            dt_set_error("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] have begin > end", P, name, b, e);
            goto out;
        }
        if (e > data_len) {
            dt_set_error("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] exceed the data section (%" PRIu64 " bytes)",
                         P, name, b, e, data_len);
            goto out;
        }
        if (e - b != numel * esize) {
            char sb[256]; fmt_shape(sb, sizeof sb, t->ndim, t->shape);
            dt_set_error("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                         " bytes but shape %s of %s needs %" PRIu64 " bytes (size mismatch)",
                         P, name, b, e, e - b, sb, dts, numel * esize);
            goto out;
        }
        t->data = data + b;
        if (e > b) { spans[nspans].begin = b; spans[nspans].end = e; spans[nspans].idx = i; nspans++; }
    }
    /* overlap check */
    if (nspans > 1) qsort(spans, nspans, sizeof *spans, span_cmp);
    for (size_t s = 1; s < nspans; s++) {
        if (spans[s].begin < spans[s - 1].end) {
            dt_set_error("%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64 "] overlap",
                         P, f->names[spans[s - 1].idx], spans[s - 1].begin, spans[s - 1].end,
                         f->names[spans[s].idx], spans[s].begin, spans[s].end);
            goto out;
        }
    }
    /* element alignment: copy misaligned tensors so every view can be read with plain typed loads
     * (MLX's writer does not pad the header, so its files usually need this) */
    for (size_t i = 0; i < f->count; i++) {
        st_tensor *t = &f->tensors[i];
        size_t es = dt_dtype_size(t->dtype);
        if (t->nbytes && ((uintptr_t)t->data % es) != 0) {
            void *c = dt_malloc(t->nbytes);
            memcpy(c, t->data, t->nbytes);
            f->copies = dt_realloc(f->copies, (f->ncopies + 1) * sizeof *f->copies);
            f->copies[f->ncopies++] = c;
            t->data = c;
        }
    }
    if (f->ncopies)
        dt_log(2, "%s: %zu tensors are not aligned to their element size in the file; using aligned copies\n", P, f->ncopies);
    rc = 0;
out:
    free(spans);
    json_free(h);
    return rc;
}

st_file *st_open(const char *path) {
    int fd = dt_open_input(path);   /* a regular file (a FIFO or device is refused without waiting) */
    if (fd < 0) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) { dt_set_error("%s: cannot stat: %s", path, strerror(errno)); close(fd); return NULL; }
    st_file *f = dt_calloc(1, sizeof *f);
    f->path = dt_strdup(path);
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            dt_set_error("%s: cannot map: %s", path, strerror(errno));
            close(fd); st_close(f); return NULL;
        }
        f->base = m;
        f->mapped = 1;
    }
    close(fd);
    if (st_parse(f)) { st_close(f); return NULL; }
    return f;
}

st_file *st_open_memory(const void *data, size_t len, const char *name) {
    st_file *f = dt_calloc(1, sizeof *f);
    f->path = dt_strdup(name ? name : "<memory>");
    f->size = len;
    if (len) { f->base = dt_malloc(len); memcpy(f->base, data, len); }
    if (st_parse(f)) { st_close(f); return NULL; }
    return f;
}

int st_release_pages(const st_file *f, const st_tensor *t) {
    if (!f || !t || !f->mapped || !t->nbytes) return 0;
    const char *b = (const char *)f->base, *p = (const char *)t->data;
    if (p < b || p + t->nbytes > b + f->size) return 0;   /* an aligned copy, or another file's tensor */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + t->nbytes + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)b + f->size + page - 1) & ~(page - 1);
    if (hi > end) hi = end;
    /* read-only private file mapping never written: dropping the pages only unmaps them; a later read
     * faults them back in from the page cache */
    return madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0 ? 1 : 0;
}

const char *st_path(const st_file *f) { return f->path; }
size_t st_count(const st_file *f) { return f->count; }
const st_tensor *st_at(const st_file *f, size_t i) { return i < f->count ? &f->tensors[i] : NULL; }

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f || !name || !f->nslots) return NULL;
    size_t mask = f->nslots - 1, h = (size_t)hash_str(name) & mask;
    while (f->slots[h]) {
        size_t i = f->slots[h] - 1;
        if (strcmp(f->names[i], name) == 0) return &f->tensors[i];
        h = (h + 1) & mask;
    }
    return NULL;
}

const char *st_metadata(const st_file *f, const char *key) {
    for (size_t i = 0; f && i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

float *st_to_f32(const st_tensor *t) {
    size_t n = (size_t)t->numel;
    float *out = dt_malloc(n * sizeof(float));
    if (dt_convert_to_f32(out, t->data, t->dtype, n) == 0) return out;
    const unsigned char *p = t->data;
    for (size_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case DT_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (float)v; break; }
        case DT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (float)v; break; }
        case DT_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); out[i] = (float)v; break; }
        case DT_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); out[i] = (float)v; break; }
        case DT_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); out[i] = (float)v; break; }
        case DT_U8: out[i] = (float)p[i]; break;
        case DT_BOOL: out[i] = p[i] ? 1.0f : 0.0f; break;
        case DT_I8: out[i] = (float)(int8_t)p[i]; break;
        default: out[i] = 0; break;
        }
    }
    return out;
}

/* ================================ writers ================================ */

typedef struct { char *b; size_t n, cap; } strbuf;
static void sb_add(strbuf *s, const char *d, size_t n) {
    s->b = dt_grow(s->b, &s->cap, s->n + n + 1, 256);
    memcpy(s->b + s->n, d, n);
    s->n += n;
    s->b[s->n] = 0;
}
static void sb_str(strbuf *s, const char *d) { sb_add(s, d, strlen(d)); }
static void sb_json_string(strbuf *s, const char *str) {
    sb_add(s, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
        char e[8];
        if (*p == '"') sb_add(s, "\\\"", 2);
        else if (*p == '\\') sb_add(s, "\\\\", 2);
        else if (*p < 0x20) { snprintf(e, sizeof e, "\\u%04x", *p); sb_add(s, e, 6); }
        else sb_add(s, (const char *)p, 1);
    }
    sb_add(s, "\"", 1);
}

typedef struct {
    char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
    void *data;  /* writer only */
} w_entry;

typedef struct {
    w_entry *e;
    size_t n, cap;
    char **mk, **mv;
    size_t nm;
    char err[512];
} w_table;

static void tab_error(w_table *t, const char *msg, const char *name) {
    if (!t->err[0]) snprintf(t->err, sizeof t->err, "tensor '%s': %s", name ? name : "?", msg);
}

/* Adds an entry after validating; returns it, or NULL (error recorded) */
static w_entry *tab_add(w_table *t, const char *name, dt_dtype dtype, int ndim, const int64_t *shape) {
    if (!name || !*name) { tab_error(t, "empty tensor name", ""); return NULL; }
    if (strcmp(name, "__metadata__") == 0) { tab_error(t, "reserved tensor name", name); return NULL; }
    if ((unsigned)dtype >= DT_DTYPE_COUNT) { tab_error(t, "invalid dtype", name); return NULL; }
    if (ndim < 0 || ndim > ST_MAX_DIMS) { tab_error(t, "invalid number of dimensions", name); return NULL; }
    uint64_t numel = 1, es = dt_dtype_size(dtype), limit = (uint64_t)INT64_MAX / es;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) { tab_error(t, "negative dimension", name); return NULL; }
        if (shape[d] && numel > limit / (uint64_t)shape[d]) { tab_error(t, "shape overflows", name); return NULL; }
        numel *= (uint64_t)shape[d];
    }
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->e[i].name, name) == 0) { tab_error(t, "duplicate tensor name", name); return NULL; }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16;
        t->e = dt_realloc(t->e, t->cap * sizeof *t->e);
    }
    w_entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    e->name = dt_strdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->nbytes = numel * es;
    return e;
}

static void tab_meta(w_table *t, const char *key, const char *value) {
    if (!key || !value) return;
    for (size_t i = 0; i < t->nm; i++)
        if (strcmp(t->mk[i], key) == 0) { free(t->mv[i]); t->mv[i] = dt_strdup(value); return; }
    t->mk = dt_realloc(t->mk, (t->nm + 1) * sizeof *t->mk);
    t->mv = dt_realloc(t->mv, (t->nm + 1) * sizeof *t->mv);
    t->mk[t->nm] = dt_strdup(key);
    t->mv[t->nm] = dt_strdup(value);
    t->nm++;
}

static void tab_free(w_table *t) {
    for (size_t i = 0; i < t->n; i++) { free(t->e[i].name); free(t->e[i].data); }
    for (size_t i = 0; i < t->nm; i++) { free(t->mk[i]); free(t->mv[i]); }
    free(t->e); free(t->mk); free(t->mv);
}

/* Builds "8-byte length + header padded with spaces to a multiple of 8"; returns total data bytes. */
static uint64_t tab_header(const w_table *t, strbuf *out) {
    strbuf h = {0};
    sb_str(&h, "{");
    int first = 1;
    if (t->nm) {
        sb_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < t->nm; i++) {
            if (i) sb_str(&h, ",");
            sb_json_string(&h, t->mk[i]);
            sb_str(&h, ":");
            sb_json_string(&h, t->mv[i]);
        }
        sb_str(&h, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < t->n; i++) {
        const w_entry *e = &t->e[i];
        char buf[64];
        if (!first) sb_str(&h, ",");
        first = 0;
        sb_json_string(&h, e->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, dt_dtype_name(e->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            snprintf(buf, sizeof buf, d ? ",%" PRId64 : "%" PRId64, e->shape[d]);
            sb_str(&h, buf);
        }
        snprintf(buf, sizeof buf, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + e->nbytes);
        sb_str(&h, buf);
        off += e->nbytes;
    }
    sb_str(&h, "}");
    while (h.n % 8) sb_str(&h, " ");
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    sb_add(out, (const char *)len8, 8);
    sb_add(out, h.b, h.n);
    free(h.b);
    return off;
}

struct st_writer { w_table t; };

st_writer *st_writer_new(void) { return dt_calloc(1, sizeof(st_writer)); }

void st_writer_add(st_writer *w, const char *name, dt_dtype dtype, int ndim, const int64_t *shape, const void *data) {
    w_entry *e = tab_add(&w->t, name, dtype, ndim, shape);
    if (!e) return;
    e->data = dt_malloc((size_t)e->nbytes);
    if (e->nbytes) memcpy(e->data, data, (size_t)e->nbytes);
}

void st_writer_add_f32(st_writer *w, const char *name, int ndim, const int64_t *shape, const float *data) {
    st_writer_add(w, name, DT_F32, ndim, shape, data);
}

void st_writer_set_metadata(st_writer *w, const char *key, const char *value) { tab_meta(&w->t, key, value); }

int st_writer_save(st_writer *w, const char *path) {
    if (w->t.err[0]) { dt_set_error("%s: cannot write: %s", path, w->t.err); return -1; }
    dt_outfile *of = dt_outfile_open(path);   /* a temporary renamed over the target when complete */
    if (!of) return -1;
    FILE *fp = dt_outfile_fp(of);
    strbuf hdr = {0};
    tab_header(&w->t, &hdr);
    int ok = fwrite(hdr.b, 1, hdr.n, fp) == hdr.n;
    free(hdr.b);
    for (size_t i = 0; ok && i < w->t.n; i++)
        if (w->t.e[i].nbytes) ok = fwrite(w->t.e[i].data, 1, (size_t)w->t.e[i].nbytes, fp) == w->t.e[i].nbytes;
    if (!ok) {
        dt_set_error("%s: write failed: %s", path, strerror(errno));
        dt_outfile_abort(of);
        return -1;
    }
    return dt_outfile_commit(of);
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    tab_free(&w->t);
    free(w);
}

/* ---- streaming writer ---- */
struct st_stream {
    w_table t;
    char *path;
    dt_outfile *of;   /* a temporary renamed over the target by st_stream_close */
    FILE *fp;
    char *buf;        /* fp's buffer (ST_STREAM_BUF bytes), freed after the file is closed */
    int begun, failed;
    uint64_t total, written;
};
#define ST_STREAM_BUF ((size_t)4 << 20)

static void stream_fail(st_stream *s, const char *fmt, const char *arg) {
    if (s->failed) return;
    s->failed = 1;
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    dt_set_error("%s: %s", s->path, msg);
}

st_stream *st_stream_open(const char *path) {
    st_stream *s = dt_calloc(1, sizeof *s);
    s->of = dt_outfile_open(path);
    if (!s->of) { free(s); return NULL; }
    s->path = dt_strdup(path);
    s->fp = dt_outfile_fp(s->of);
    /* a 4 MiB buffer: writers stream row by row (a 4-bit row of a 3072-wide Linear is 1.5 KB), and stdio's default
     * 4 KB one made a synthetic Krea 2 transformer 1.6 million write calls */
    s->buf = malloc(ST_STREAM_BUF);
    if (s->buf) setvbuf(s->fp, s->buf, _IOFBF, ST_STREAM_BUF);
    return s;
}

void st_stream_declare(st_stream *s, const char *name, dt_dtype dtype, int ndim, const int64_t *shape) {
    if (s->begun) { tab_error(&s->t, "declared after data began", name); return; }
    tab_add(&s->t, name, dtype, ndim, shape);
}

void st_stream_set_metadata(st_stream *s, const char *key, const char *value) { tab_meta(&s->t, key, value); }

int st_stream_begin_data(st_stream *s) {
    if (s->failed) return -1;
    if (s->begun) { stream_fail(s, "%s", "st_stream_begin_data called twice"); return -1; }
    if (s->t.err[0]) { stream_fail(s, "cannot write: %s", s->t.err); return -1; }
    s->begun = 1;
    strbuf hdr = {0};
    s->total = tab_header(&s->t, &hdr);
    int ok = fwrite(hdr.b, 1, hdr.n, s->fp) == hdr.n;
    free(hdr.b);
    if (!ok) { stream_fail(s, "write failed: %s", strerror(errno)); return -1; }
    return 0;
}

int st_stream_write(st_stream *s, const void *data, size_t nbytes) {
    if (s->failed) return -1;
    if (!s->begun) { stream_fail(s, "%s", "st_stream_write before st_stream_begin_data"); return -1; }
    if (nbytes > s->total - s->written) { stream_fail(s, "%s", "more tensor bytes written than declared"); return -1; }
    if (nbytes && fwrite(data, 1, nbytes, s->fp) != nbytes) { stream_fail(s, "write failed: %s", strerror(errno)); return -1; }
    s->written += nbytes;
    return 0;
}

int st_stream_close(st_stream *s) {
    if (!s) return -1;
    if (!s->failed && !s->begun) st_stream_begin_data(s);
    if (!s->failed && s->written != s->total) {
        char msg[128];
        snprintf(msg, sizeof msg, "%" PRIu64 " of %" PRIu64 " declared bytes", s->written, s->total);
        stream_fail(s, "incomplete tensor data: only %s were written", msg);
    }
    int rc = -1;
    if (s->failed) dt_outfile_abort(s->of);
    else rc = dt_outfile_commit(s->of);
    tab_free(&s->t);
    free(s->path); free(s->buf); free(s);
    return rc;
}

void st_stream_abort(st_stream *s) {
    if (!s) return;
    dt_outfile_abort(s->of);
    tab_free(&s->t);
    free(s->path); free(s->buf); free(s);
}
