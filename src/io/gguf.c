/* gguf.c — GGUF reader (validating, mmap'd, zero-copy views) and streaming writer; format: gguf.h.
 * Every read goes through a bounds-checked cursor, so a truncated or inconsistent file gets one error line
 * naming the file, the field and its byte position. */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include "../core/infile.h"
#include "../core/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGN 32u
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 4096           /* ggml itself caps names at 64 (ComfyUI-GGUF's patched tools at 127) */
#define GGUF_MAX_KEY 65535
#define GGUF_MAX_DEPTH 4             /* nested arrays */

/* ------------------------------------------------------------------ type ids */

static const struct { const char *name; int dtype; } ggml_types[] = {
    [0] = {"F32", DT_F32},     [1] = {"F16", DT_F16},     [2] = {"Q4_0", DT_Q4_0},  [3] = {"Q4_1", DT_Q4_1},
    [4] = {NULL, -1},          [5] = {NULL, -1},          [6] = {"Q5_0", DT_Q5_0},  [7] = {"Q5_1", DT_Q5_1},
    [8] = {"Q8_0", DT_Q8_0},   [9] = {"Q8_1", -1},        [10] = {"Q2_K", -1},      [11] = {"Q3_K", -1},
    [12] = {"Q4_K", DT_Q4_K},  [13] = {"Q5_K", DT_Q5_K},  [14] = {"Q6_K", DT_Q6_K}, [15] = {"Q8_K", -1},
    [16] = {"IQ2_XXS", -1},    [17] = {"IQ2_XS", -1},     [18] = {"IQ3_XXS", -1},   [19] = {"IQ1_S", -1},
    [20] = {"IQ4_NL", -1},     [21] = {"IQ3_S", -1},      [22] = {"IQ2_S", -1},     [23] = {"IQ4_XS", -1},
    [24] = {"I8", DT_I8},      [25] = {"I16", DT_I16},    [26] = {"I32", DT_I32},   [27] = {"I64", DT_I64},
    [28] = {"F64", DT_F64},    [29] = {"IQ1_M", -1},      [30] = {"BF16", DT_BF16}, [31] = {"Q4_0_4_4", -1},
    [32] = {"Q4_0_4_8", -1},   [33] = {"Q4_0_8_8", -1},   [34] = {"TQ1_0", -1},     [35] = {"TQ2_0", -1},
    [36] = {"IQ4_NL_4_4", -1}, [37] = {"IQ4_NL_4_8", -1}, [38] = {"IQ4_NL_8_8", -1}, [39] = {"MXFP4", -1},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *gguf_type_name(uint32_t id) { return id < N_GGML_TYPES ? ggml_types[id].name : NULL; }

int gguf_type_of(dt_dtype t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].dtype == (int)t) return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ reader */

enum { V_U8, V_I8, V_U16, V_I16, V_U32, V_I32, V_F32, V_BOOL, V_STR, V_ARR, V_U64, V_I64, V_F64, V_NTYPES };
static const char *const vtype_names[V_NTYPES] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
                                                  "array", "u64", "i64", "f64"};
static const size_t vtype_size[V_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};   /* minimum bytes */

typedef struct {
    char *key;
    uint32_t type;
    char *text;              /* the value as a string (gguf_meta) */
    int32_t *ints;           /* integer arrays (orig_shape): values, n_ints of them */
    size_t n_ints;
} gguf_kv;

struct gguf_file {
    char *path;
    unsigned char *base;
    size_t size;
    int mapped;
    uint32_t version, alignment;
    gguf_kv *kv;
    size_t nkv;
    st_tensor *tensors;
    uint32_t *types;
    char **names;
    size_t count;
    size_t *slots, nslots;
    void **copies;           /* aligned copies of tensors whose bytes are misaligned (alignment < element size) */
    size_t ncopies;
};

typedef struct {
    const gguf_file *f;
    size_t pos;
} cursor;

static int need(cursor *c, size_t n, const char *what) {
    if (n > c->f->size - c->pos) {
        dt_set_error("%s: truncated at byte %zu: %s needs %zu bytes, %zu left", c->f->path, c->pos, what, n,
                     c->f->size - c->pos);
        return -1;
    }
    return 0;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (need(c, 4, what)) return -1;
    *v = (uint32_t)le(c->f->base + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what) {
    if (need(c, 8, what)) return -1;
    *v = le(c->f->base + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A GGUF string into a malloc'd NUL-terminated copy (embedded NULs rejected). */
static char *rd_str(cursor *c, uint64_t max, const char *what) {
    uint64_t n;
    size_t at = c->pos;
    if (rd_u64(c, &n, what)) return NULL;
    if (n > max) {
        dt_set_error("%s: %s at byte %zu is %" PRIu64 " bytes long (at most %" PRIu64 ")", c->f->path, what, at, n, max);
        return NULL;
    }
    if (need(c, (size_t)n, what)) return NULL;
    if (memchr(c->f->base + c->pos, 0, (size_t)n)) {
        dt_set_error("%s: %s at byte %zu contains a NUL byte", c->f->path, what, at);
        return NULL;
    }
    char *s = dt_malloc((size_t)n + 1);
    memcpy(s, c->f->base + c->pos, (size_t)n);
    s[n] = 0;
    c->pos += (size_t)n;
    return s;
}

/* Reads one scalar of type t; *num gets integers/bools/floats as double, *inum as int64 where exact. */
static int rd_scalar(cursor *c, uint32_t t, double *num, int64_t *inum, const char *key) {
    size_t n = vtype_size[t];
    if (need(c, n, key)) return -1;
    uint64_t raw = le(c->f->base + c->pos, (int)n);
    c->pos += n;
    switch (t) {
    case V_U8: case V_U16: case V_U32: *inum = (int64_t)raw; *num = (double)raw; break;
    case V_U64: *inum = raw > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)raw; *num = (double)raw; break;
    case V_I8: *inum = (int8_t)raw; *num = (double)*inum; break;
    case V_I16: *inum = (int16_t)raw; *num = (double)*inum; break;
    case V_I32: *inum = (int32_t)raw; *num = (double)*inum; break;
    case V_I64: memcpy(inum, &raw, 8); *num = (double)*inum; break;
    case V_F32: { uint32_t u = (uint32_t)raw; float f; memcpy(&f, &u, 4); *num = f; *inum = 0; break; }
    case V_F64: memcpy(num, &raw, 8); *inum = 0; break;
    case V_BOOL:
        if (raw > 1) {
            dt_set_error("%s: metadata '%s': bool value %" PRIu64 " at byte %zu (must be 0 or 1)", c->f->path, key, raw,
                         c->pos - 1);
            return -1;
        }
        *inum = (int64_t)raw; *num = (double)raw; break;
    default: return -1;
    }
    return 0;
}

/* Skips (validates) an array body of `count` values of type t; integer values of a top-level array are kept
 * when ints != NULL. */
static int rd_array(cursor *c, uint32_t t, uint64_t count, int depth, const char *key, int32_t **ints, size_t *n_ints) {
    if (t >= V_NTYPES) {
        dt_set_error("%s: metadata '%s': array element type %u is unknown (0..12)", c->f->path, key, t);
        return -1;
    }
    if (count > (c->f->size - c->pos) / vtype_size[t]) {
        dt_set_error("%s: metadata '%s': array of %" PRIu64 " %s values does not fit in the %zu bytes left", c->f->path, key,
                     count, vtype_names[t], c->f->size - c->pos);
        return -1;
    }
    int keep = ints && (t == V_I32 || t == V_U32 || t == V_I64 || t == V_U64 || t == V_I16 || t == V_U16 || t == V_I8 || t == V_U8);
    if (keep) { *ints = dt_malloc(sizeof(int32_t) * (size_t)(count ? count : 1)); *n_ints = (size_t)count; }
    for (uint64_t i = 0; i < count; i++) {
        if (t == V_STR) {
            char *s = rd_str(c, UINT64_MAX, "metadata string");
            if (!s) return -1;
            free(s);
        } else if (t == V_ARR) {
            uint32_t et;
            uint64_t n;
            if (depth >= GGUF_MAX_DEPTH) {
                dt_set_error("%s: metadata '%s': arrays nested deeper than %d levels", c->f->path, key, GGUF_MAX_DEPTH);
                return -1;
            }
            if (rd_u32(c, &et, key) || rd_u64(c, &n, key) || rd_array(c, et, n, depth + 1, key, NULL, NULL)) return -1;
        } else {
            double d;
            int64_t v;
            if (rd_scalar(c, t, &d, &v, key)) return -1;
            if (keep) (*ints)[i] = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
        }
    }
    return 0;
}

static int rd_kv(cursor *c, gguf_kv *kv) {
    size_t at = c->pos;
    kv->key = rd_str(c, GGUF_MAX_KEY, "metadata key");
    if (!kv->key) return -1;
    if (rd_u32(c, &kv->type, kv->key)) return -1;
    if (kv->type >= V_NTYPES) {
        dt_set_error("%s: metadata '%s' (byte %zu): value type %u is unknown (0..12)", c->f->path, kv->key, at, kv->type);
        return -1;
    }
    char buf[64];
    if (kv->type == V_STR) {
        kv->text = rd_str(c, UINT64_MAX, kv->key);
        return kv->text ? 0 : -1;
    }
    if (kv->type == V_ARR) {
        uint32_t et;
        uint64_t n;
        if (rd_u32(c, &et, kv->key) || rd_u64(c, &n, kv->key)) return -1;
        int keep = !strncmp(kv->key, "comfy.gguf.orig_shape.", 22);   /* the only integer arrays ditrun reads */
        if (rd_array(c, et, n, 1, kv->key, keep ? &kv->ints : NULL, &kv->n_ints)) return -1;
        snprintf(buf, sizeof buf, "[%" PRIu64 " x %s]", n, vtype_names[et]);
        kv->text = dt_strdup(buf);
        return 0;
    }
    double d;
    int64_t v;
    if (rd_scalar(c, kv->type, &d, &v, kv->key)) return -1;
    if (kv->type == V_F32 || kv->type == V_F64) snprintf(buf, sizeof buf, "%.9g", d);
    else if (kv->type == V_BOOL) snprintf(buf, sizeof buf, "%s", v ? "true" : "false");
    else if (kv->type == V_U64) snprintf(buf, sizeof buf, "%.0f", d);
    else snprintf(buf, sizeof buf, "%" PRId64, v);
    kv->text = dt_strdup(buf);
    return 0;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

static const gguf_kv *find_kv(const gguf_file *f, const char *key) {
    for (size_t i = 0; f && i < f->nkv; i++)
        if (!strcmp(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

typedef struct { uint64_t begin, end; size_t idx; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* ComfyUI-GGUF's stored-as shape: "comfy.gguf.orig_shape.NAME" = i32 array. 0 = none, 1 = applied, -1 error. */
static int apply_orig_shape(gguf_file *f, st_tensor *t) {
    char key[GGUF_MAX_NAME + 32];
    snprintf(key, sizeof key, "comfy.gguf.orig_shape.%s", t->name);
    const gguf_kv *kv = find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != V_ARR || !kv->ints || kv->n_ints < 1 || kv->n_ints > ST_MAX_DIMS) {
        dt_set_error("%s: metadata '%s' must be an array of 1..%d integers", f->path, key, ST_MAX_DIMS);
        return -1;
    }
    int64_t numel = 1;
    for (size_t d = 0; d < kv->n_ints; d++) {
        if (kv->ints[d] < 0 || (kv->ints[d] && numel > INT64_MAX / kv->ints[d])) {
            dt_set_error("%s: metadata '%s' has an invalid dimension", f->path, key);
            return -1;
        }
        numel *= kv->ints[d];
    }
    int64_t last = kv->ints[kv->n_ints - 1];
    if (numel != t->numel || (dt_dtype_is_block(t->dtype) && last % dt_dtype_block_elems(t->dtype))) {
        dt_set_error("%s: tensor '%s': original shape in '%s' does not fit its %" PRId64 " %s values (rows must be whole blocks)",
                     f->path, t->name, key, t->numel, dt_dtype_name(t->dtype));
        return -1;
    }
    t->ndim = (int)kv->n_ints;
    for (int d = 0; d < t->ndim; d++) t->shape[d] = kv->ints[d];
    return 1;
}

static int parse(gguf_file *f) {
    const char *P = f->path;
    cursor c = {f, 0};
    if (f->size < 4 || memcmp(f->base, "GGUF", 4)) {
        dt_set_error("%s: not a GGUF file (the first 4 bytes are not \"GGUF\")", P);
        return -1;
    }
    c.pos = 4;
    uint64_t ntensors, nkv;
    if (rd_u32(&c, &f->version, "version")) return -1;
    if (f->version == 1) {
        dt_set_error("%s: GGUF version 1 (32-bit counts, 2023) is not supported; convert it to version 3", P);
        return -1;
    }
    if (f->version != 2 && f->version != 3) {
        dt_set_error("%s: GGUF version %u is unknown (2 and 3 are supported; a big-endian file reads as a huge version)",
                     P, f->version);
        return -1;
    }
    if (rd_u64(&c, &ntensors, "tensor count") || rd_u64(&c, &nkv, "metadata count")) return -1;
    /* every tensor info takes >= 28 bytes (name length, n_dims, one dim, type, offset), every pair >= 13 */
    if (ntensors > (f->size - c.pos) / 28) {
        dt_set_error("%s: tensor count %" PRIu64 " is impossible for a file of %zu bytes", P, ntensors, f->size);
        return -1;
    }
    if (nkv > (f->size - c.pos) / 13) {
        dt_set_error("%s: metadata count %" PRIu64 " is impossible for a file of %zu bytes", P, nkv, f->size);
        return -1;
    }
    f->kv = dt_calloc((size_t)nkv + 1, sizeof *f->kv);
    for (uint64_t i = 0; i < nkv; i++) {
        f->nkv++;
        if (rd_kv(&c, &f->kv[i])) return -1;
        for (uint64_t j = 0; j < i; j++)
            if (!strcmp(f->kv[j].key, f->kv[i].key)) {
                dt_set_error("%s: metadata key '%s' appears twice", P, f->kv[i].key);
                return -1;
            }
    }
    f->alignment = GGUF_DEFAULT_ALIGN;
    const gguf_kv *al = find_kv(f, "general.alignment");
    if (al) {
        char *end;
        unsigned long v = strtoul(al->text, &end, 10);
        if (al->type != V_U32 || *end || v == 0 || v > (1ul << 20) || (v & (v - 1))) {
            dt_set_error("%s: general.alignment must be a u32 power of two up to 1 MiB (got %s of type %s)", P, al->text,
                         vtype_names[al->type]);
            return -1;
        }
        f->alignment = (uint32_t)v;
    }

    f->tensors = dt_calloc((size_t)ntensors + 1, sizeof *f->tensors);
    f->types = dt_calloc((size_t)ntensors + 1, sizeof *f->types);
    f->names = dt_calloc((size_t)ntensors + 1, sizeof *f->names);
    uint64_t *offs = dt_calloc((size_t)ntensors + 1, sizeof *offs);
    int rc = -1;
    for (uint64_t i = 0; i < ntensors; i++) {
        size_t at = c.pos;
        char *name = rd_str(&c, GGUF_MAX_NAME, "tensor name");
        if (!name) goto out;
        f->names[i] = name;
        f->count++;
        st_tensor *t = &f->tensors[i];
        t->name = name;
        t->file = f->path;
        uint32_t nd, type;
        if (rd_u32(&c, &nd, name)) goto out;
        if (nd < 1 || nd > GGUF_MAX_DIMS) {
            dt_set_error("%s: tensor '%s' (byte %zu) has %u dimensions (1..%d)", P, name, at, nd, GGUF_MAX_DIMS);
            goto out;
        }
        uint64_t ne[GGUF_MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++)
            if (rd_u64(&c, &ne[d], name)) goto out;
        if (rd_u32(&c, &type, name) || rd_u64(&c, &offs[i], name)) goto out;
        const char *tn = gguf_type_name(type);
        if (!tn) {
            dt_set_error("%s: tensor '%s' has unknown ggml type %u", P, name, type);
            goto out;
        }
        if (ggml_types[type].dtype < 0) {
            dt_set_error("%s: tensor '%s' has type %s, which ditrun does not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                         "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", P, name, tn);
            goto out;
        }
        f->types[i] = type;
        t->dtype = (dt_dtype)ggml_types[type].dtype;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            if (ne[d] > (uint64_t)INT64_MAX || (ne[d] && numel > ((uint64_t)INT64_MAX / 8) / ne[d])) {
                dt_set_error("%s: tensor '%s': dimensions overflow (element count too large)", P, name);
                goto out;
            }
            numel *= ne[d];
        }
        const int qk = dt_dtype_block_elems(t->dtype);
        if (ne[0] % (uint64_t)qk) {
            dt_set_error("%s: tensor '%s': rows of %" PRIu64 " values are not a whole number of %s blocks (%d values)", P,
                         name, ne[0], tn, qk);
            goto out;
        }
        t->ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++) t->shape[d] = (int64_t)ne[nd - 1 - d];
        t->numel = (int64_t)numel;
        t->nbytes = dt_dtype_bytes(t->dtype, t->numel);
        if (offs[i] % f->alignment) {
            dt_set_error("%s: tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %u", P, name, offs[i],
                         f->alignment);
            goto out;
        }
    }
    /* data section */
    uint64_t data0 = ((uint64_t)c.pos + f->alignment - 1) / f->alignment * f->alignment;
    uint64_t data_len = data0 <= f->size ? f->size - data0 : 0;
    span *spans = dt_calloc((size_t)ntensors + 1, sizeof *spans);
    size_t nspans = 0;
    f->nslots = 16;
    while (f->nslots < 2 * f->count) f->nslots *= 2;
    f->slots = dt_calloc(f->nslots, sizeof *f->slots);
    for (size_t i = 0; i < f->count; i++) {
        st_tensor *t = &f->tensors[i];
        if (offs[i] > data_len || t->nbytes > data_len - offs[i]) {
            dt_set_error("%s: tensor '%s': data [%" PRIu64 ", +%zu) is outside the data section (%" PRIu64
                         " bytes from byte %" PRIu64 "); truncated file?", P, t->name, offs[i], t->nbytes, data_len, data0);
            free(spans);
            goto out;
        }
        t->data = f->base + data0 + offs[i];
        if (t->nbytes) { spans[nspans].begin = offs[i]; spans[nspans].end = offs[i] + t->nbytes; spans[nspans].idx = i; nspans++; }
        size_t mask = f->nslots - 1, h = (size_t)hash_str(t->name) & mask;
        while (f->slots[h]) {
            if (!strcmp(f->names[f->slots[h] - 1], t->name)) {
                dt_set_error("%s: tensor name '%s' appears twice", P, t->name);
                free(spans);
                goto out;
            }
            h = (h + 1) & mask;
        }
        f->slots[h] = i + 1;
        if (apply_orig_shape(f, t) < 0) { free(spans); goto out; }
    }
    if (nspans > 1) qsort(spans, nspans, sizeof *spans, span_cmp);
    for (size_t s = 1; s < nspans; s++)
        if (spans[s].begin < spans[s - 1].end) {
            dt_set_error("%s: tensors '%s' and '%s' overlap in the data section", P, f->names[spans[s - 1].idx],
                         f->names[spans[s].idx]);
            free(spans);
            goto out;
        }
    free(spans);
    /* alignments below the element size (1, 2) leave f32/f16 data misaligned: copy those */
    for (size_t i = 0; i < f->count; i++) {
        st_tensor *t = &f->tensors[i];
        size_t es = dt_dtype_is_block(t->dtype) ? 1 : dt_dtype_size(t->dtype);   /* blocks are read bytewise */
        if (t->nbytes && (uintptr_t)t->data % es) {
            void *cp = dt_malloc(t->nbytes);
            memcpy(cp, t->data, t->nbytes);
            f->copies = dt_realloc(f->copies, (f->ncopies + 1) * sizeof *f->copies);
            f->copies[f->ncopies++] = cp;
            t->data = cp;
        }
    }
    rc = 0;
out:
    free(offs);
    return rc;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->nkv; i++) { free(f->kv[i].key); free(f->kv[i].text); free(f->kv[i].ints); }
    for (size_t i = 0; i < f->count; i++) free(f->names[i]);
    for (size_t i = 0; i < f->ncopies; i++) free(f->copies[i]);
    free(f->kv); free(f->tensors); free(f->types); free(f->names); free(f->slots); free(f->copies);
    if (f->base) {
        if (f->mapped) munmap(f->base, f->size);
        else free(f->base);
    }
    free(f->path);
    free(f);
}

gguf_file *gguf_open(const char *path) {
    int fd = dt_open_input(path);   /* a regular file (a FIFO or device is refused without waiting) */
    if (fd < 0) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        dt_set_error("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    gguf_file *f = dt_calloc(1, sizeof *f);
    f->path = dt_strdup(path);
    f->size = (size_t)sb.st_size;
    if (f->size) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            dt_set_error("%s: cannot map: %s", path, strerror(errno));
            close(fd);
            gguf_close(f);
            return NULL;
        }
        f->base = m;
        f->mapped = 1;
    }
    close(fd);
    if (parse(f)) { gguf_close(f); return NULL; }
    return f;
}

gguf_file *gguf_open_memory(const void *data, size_t len, const char *name) {
    gguf_file *f = dt_calloc(1, sizeof *f);
    f->path = dt_strdup(name ? name : "<memory>");
    f->size = len;
    if (len) { f->base = dt_malloc(len); memcpy(f->base, data, len); }
    if (parse(f)) { gguf_close(f); return NULL; }
    return f;
}

const char *gguf_path(const gguf_file *f) { return f->path; }
uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint32_t gguf_alignment(const gguf_file *f) { return f->alignment; }
size_t gguf_count(const gguf_file *f) { return f->count; }
const st_tensor *gguf_at(const gguf_file *f, size_t i) { return i < f->count ? &f->tensors[i] : NULL; }
uint32_t gguf_tensor_type(const gguf_file *f, size_t i) { return i < f->count ? f->types[i] : 0; }

const st_tensor *gguf_find(const gguf_file *f, const char *name) {
    if (!f || !name || !f->nslots) return NULL;
    size_t mask = f->nslots - 1, h = (size_t)hash_str(name) & mask;
    while (f->slots[h]) {
        size_t i = f->slots[h] - 1;
        if (!strcmp(f->names[i], name)) return &f->tensors[i];
        h = (h + 1) & mask;
    }
    return NULL;
}

const char *gguf_meta(const gguf_file *f, const char *key) {
    const gguf_kv *kv = find_kv(f, key);
    return kv ? kv->text : NULL;
}
size_t gguf_meta_count(const gguf_file *f) { return f->nkv; }
const char *gguf_meta_key(const gguf_file *f, size_t i) { return i < f->nkv ? f->kv[i].key : NULL; }

/* ------------------------------------------------------------------ writer */

typedef struct {
    char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} ws_tensor;

typedef struct {
    char *key;
    uint32_t type;
    char *str;
    uint32_t u32;
    int32_t *arr;
    int narr;
} ws_kv;

struct gguf_stream {
    char *path;
    dt_outfile *of;        /* a temporary renamed over the target by gguf_stream_close (core/outfile.h) */
    FILE *fp;
    ws_kv *kv;
    int nkv;
    ws_tensor *t;
    int nt;
    int cur;               /* tensor being written */
    uint64_t written;      /* bytes of t[cur] written */
    uint64_t pos;          /* bytes written to the data section */
    int began, failed;
    char err[512];
};

static void ws_fail(gguf_stream *s, const char *fmt, const char *a) {
    if (!s->failed) snprintf(s->err, sizeof s->err, fmt, a ? a : "");
    s->failed = 1;
}

gguf_stream *gguf_stream_open(const char *path) {
    dt_outfile *of = dt_outfile_open(path);
    if (!of) return NULL;
    gguf_stream *s = dt_calloc(1, sizeof *s);
    s->path = dt_strdup(path);
    s->of = of;
    s->fp = dt_outfile_fp(of);
    return s;
}

static ws_kv *ws_add_kv(gguf_stream *s, const char *key, uint32_t type) {
    if (s->began) { ws_fail(s, "metadata '%s' added after the data began", key); return NULL; }
    s->kv = dt_realloc(s->kv, sizeof *s->kv * (size_t)(s->nkv + 1));
    ws_kv *k = &s->kv[s->nkv++];
    memset(k, 0, sizeof *k);
    k->key = dt_strdup(key);
    k->type = type;
    return k;
}

void gguf_stream_meta_str(gguf_stream *s, const char *key, const char *value) {
    ws_kv *k = ws_add_kv(s, key, V_STR);
    if (k) k->str = dt_strdup(value);
}

void gguf_stream_meta_u32(gguf_stream *s, const char *key, uint32_t value) {
    ws_kv *k = ws_add_kv(s, key, V_U32);
    if (k) k->u32 = value;
}

void gguf_stream_meta_i32_array(gguf_stream *s, const char *key, int n, const int32_t *values) {
    ws_kv *k = ws_add_kv(s, key, V_ARR);
    if (!k) return;
    k->narr = n;
    k->arr = dt_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    memcpy(k->arr, values, sizeof(int32_t) * (size_t)n);
}

void gguf_stream_declare(gguf_stream *s, const char *name, dt_dtype dtype, int ndim, const int64_t *shape) {
    if (s->began) { ws_fail(s, "tensor '%s' declared after the data began", name); return; }
    if (gguf_type_of(dtype) < 0) { ws_fail(s, "tensor '%s': dtype has no GGUF type", name); return; }
    if (ndim < 1 || ndim > GGUF_MAX_DIMS) { ws_fail(s, "tensor '%s': 1..4 dimensions", name); return; }
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) { ws_fail(s, "tensor '%s': negative dimension", name); return; }
        numel *= shape[d];
    }
    if (shape[ndim - 1] % dt_dtype_block_elems(dtype)) { ws_fail(s, "tensor '%s': rows are not whole blocks", name); return; }
    s->t = dt_realloc(s->t, sizeof *s->t * (size_t)(s->nt + 1));
    ws_tensor *t = &s->t[s->nt++];
    memset(t, 0, sizeof *t);
    t->name = dt_strdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->nbytes = dt_dtype_bytes(dtype, numel);
}

static void put(gguf_stream *s, const void *p, size_t n) {
    if (!s->failed && n && fwrite(p, 1, n, s->fp) != n) ws_fail(s, "write failed: %s", strerror(errno));
}
static void put_u32(gguf_stream *s, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(s, b, 4);
}
static void put_u64(gguf_stream *s, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    put(s, b, 8);
}
static void put_str(gguf_stream *s, const char *str) {
    size_t n = strlen(str);
    put_u64(s, n);
    put(s, str, n);
}
static void put_pad(gguf_stream *s, uint64_t n) {
    static const unsigned char zeros[64];
    while (n) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        put(s, zeros, k);
        n -= k;
    }
}

int gguf_stream_begin_data(gguf_stream *s) {
    if (s->began) return 0;
    s->began = 1;
    const uint32_t A = GGUF_DEFAULT_ALIGN;
    uint64_t off = 0;
    for (int i = 0; i < s->nt; i++) {
        s->t[i].offset = off;
        off += (s->t[i].nbytes + A - 1) / A * A;
    }
    put(s, "GGUF", 4);
    put_u32(s, 3);
    put_u64(s, (uint64_t)s->nt);
    put_u64(s, (uint64_t)s->nkv);
    for (int i = 0; i < s->nkv; i++) {
        const ws_kv *k = &s->kv[i];
        put_str(s, k->key);
        put_u32(s, k->type);
        if (k->type == V_STR) put_str(s, k->str);
        else if (k->type == V_U32) put_u32(s, k->u32);
        else {
            put_u32(s, V_I32);
            put_u64(s, (uint64_t)k->narr);
            for (int j = 0; j < k->narr; j++) put_u32(s, (uint32_t)k->arr[j]);
        }
    }
    for (int i = 0; i < s->nt; i++) {
        const ws_tensor *t = &s->t[i];
        put_str(s, t->name);
        put_u32(s, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0; d--) put_u64(s, (uint64_t)t->shape[d]);
        put_u32(s, (uint32_t)gguf_type_of(t->dtype));
        put_u64(s, t->offset);
    }
    long at = ftell(s->fp);
    if (at < 0) ws_fail(s, "cannot tell the position: %s", strerror(errno));
    else put_pad(s, (A - (uint64_t)at % A) % A);
    s->cur = 0;
    s->written = 0;
    if (s->failed) { dt_set_error("%s: %s", s->path, s->err); return -1; }
    return 0;
}

int gguf_stream_write(gguf_stream *s, const void *data, size_t nbytes) {
    if (!s->began && gguf_stream_begin_data(s)) return -1;
    const unsigned char *p = data;
    while (nbytes && !s->failed) {
        /* skip tensors of zero bytes */
        while (s->cur < s->nt && s->written == s->t[s->cur].nbytes) {
            const ws_tensor *t = &s->t[s->cur];
            put_pad(s, (t->nbytes + GGUF_DEFAULT_ALIGN - 1) / GGUF_DEFAULT_ALIGN * GGUF_DEFAULT_ALIGN - t->nbytes);
            s->cur++;
            s->written = 0;
        }
        if (s->cur >= s->nt) { ws_fail(s, "more bytes written than declared%s", ""); break; }
        uint64_t room = s->t[s->cur].nbytes - s->written;
        size_t k = nbytes < room ? nbytes : (size_t)room;
        put(s, p, k);
        p += k;
        nbytes -= k;
        s->written += k;
    }
    if (s->failed) { dt_set_error("%s: %s", s->path, s->err); return -1; }
    return 0;
}

static void ws_free(gguf_stream *s) {
    for (int i = 0; i < s->nkv; i++) { free(s->kv[i].key); free(s->kv[i].str); free(s->kv[i].arr); }
    for (int i = 0; i < s->nt; i++) free(s->t[i].name);
    free(s->kv); free(s->t); free(s->path); free(s);
}

void gguf_stream_abort(gguf_stream *s) {
    if (!s) return;
    dt_outfile_abort(s->of);
    ws_free(s);
}

int gguf_stream_close(gguf_stream *s) {
    if (!s->began) gguf_stream_begin_data(s);
    /* pad out the remaining zero-byte tensors / the last tensor */
    while (!s->failed && s->cur < s->nt && s->written == s->t[s->cur].nbytes) {
        const ws_tensor *t = &s->t[s->cur];
        put_pad(s, (t->nbytes + GGUF_DEFAULT_ALIGN - 1) / GGUF_DEFAULT_ALIGN * GGUF_DEFAULT_ALIGN - t->nbytes);
        s->cur++;
        s->written = 0;
    }
    if (!s->failed && s->cur < s->nt) ws_fail(s, "tensor '%s' was declared but not fully written", s->t[s->cur].name);
    int rc;
    if (s->failed) {
        dt_outfile_abort(s->of);
        dt_set_error("%s: %s", s->path, s->err);
        rc = -1;
    } else {
        rc = dt_outfile_commit(s->of);   /* flush, fsync, rename (its own error) */
    }
    ws_free(s);
    return rc;
}
