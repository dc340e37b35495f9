/* json.c — strict RFC 8259 JSON parser: recursive descent with a depth limit, UTF-8 validation of
 * strings, \u escapes (surrogate pairs joined) decoded to UTF-8, exact int64 for integer literals.
 * Errors are reported once, as "WHAT: JSON error at byte N: problem". */
#define _POSIX_C_SOURCE 200809L
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/common.h"
#include "../core/infile.h"

typedef struct {
    const unsigned char *s;
    size_t len, pos;
    const char *what;
    int failed;
} jparser;

static void jfail(jparser *p, size_t at, const char *msg) {
    if (p->failed) return;
    p->failed = 1;
    dt_set_error("%s: JSON error at byte %zu: %s", p->what ? p->what : "json", at, msg);
}

static void skip_ws(jparser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->pos++;
        else break;
    }
}

static json *new_node(json_type t) {
    json *j = dt_calloc(1, sizeof *j);
    j->type = t;
    return j;
}

void json_free(json *j) {
    if (!j) return;
    if (j->type == JSON_ARRAY || j->type == JSON_OBJECT) {
        for (size_t i = 0; i < j->len; i++) {
            json_free(j->items[i]);
            if (j->keys) free(j->keys[i]);
        }
        free(j->items);
        free(j->keys);
    }
    free(j->str);
    free(j);
}

/* ---- growable byte buffer for strings ---- */
typedef struct { char *b; size_t n, cap; } sbuf;
static void sb_put(sbuf *sb, const void *d, size_t n) {
    sb->b = dt_grow(sb->b, &sb->cap, sb->n + n + 1, 32);
    memcpy(sb->b + sb->n, d, n);
    sb->n += n;
    sb->b[sb->n] = 0;
}
static void sb_utf8(sbuf *sb, uint32_t cp) {
    unsigned char o[4]; size_t n;
    if (cp < 0x80) { o[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        o[0] = (unsigned char)(0xF0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (unsigned char)(0x80 | (cp & 0x3F)); n = 4;
    }
    sb_put(sb, o, n);
}

static int hex4(jparser *p, uint32_t *out) {
    if (p->len - p->pos < 4) { jfail(p, p->pos, "truncated \\u escape"); return -1; }
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p->s[p->pos + i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else { jfail(p, p->pos + i, "invalid hex digit in \\u escape"); return -1; }
    }
    p->pos += 4;
    *out = v;
    return 0;
}

/* Length of a valid UTF-8 sequence starting at s[0] (n bytes available), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t need; uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { need = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; cp = c & 0x07; }
    else return 0;
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (need == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return need;
}

/* Parses a string starting at the opening quote. Returns malloc'd UTF-8 (NUL-terminated) and length. */
static char *parse_string(jparser *p, size_t *out_len) {
    size_t start = p->pos;
    p->pos++; /* opening quote */
    /* fast path: plain ASCII without escapes is copied with one exact allocation */
    size_t e = p->pos;
    while (e < p->len) {
        unsigned char c = p->s[e];
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        e++;
    }
    if (e < p->len && p->s[e] == '"') {
        size_t n = e - p->pos;
        char *out = dt_malloc(n + 1);
        memcpy(out, p->s + p->pos, n);
        out[n] = 0;
        p->pos = e + 1;
        *out_len = n;
        return out;
    }
    sbuf sb = {0};
    sb_put(&sb, "", 0);
    for (;;) {
        if (p->pos >= p->len) { jfail(p, start, "unterminated string"); break; }
        /* copy a run of plain characters at once */
        size_t run = p->pos;
        while (run < p->len) {
            unsigned char c = p->s[run];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            run++;
        }
        if (run > p->pos) { sb_put(&sb, p->s + p->pos, run - p->pos); p->pos = run; continue; }
        unsigned char c = p->s[p->pos];
        if (c == '"') { p->pos++; *out_len = sb.n; return sb.b; }
        if (c < 0x20) { jfail(p, p->pos, "control character in string (must be escaped)"); break; }
        if (c >= 0x80) {
            size_t n = utf8_seq(p->s + p->pos, p->len - p->pos);
            if (!n) { jfail(p, p->pos, "invalid UTF-8 in string"); break; }
            sb_put(&sb, p->s + p->pos, n);
            p->pos += n;
            continue;
        }
        /* backslash */
        size_t esc = p->pos;
        p->pos++;
        if (p->pos >= p->len) { jfail(p, esc, "unterminated escape"); break; }
        unsigned char e = p->s[p->pos++];
        char ch;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(p, &cp)) goto fail;
            if (cp >= 0xDC00 && cp <= 0xDFFF) { jfail(p, esc, "unpaired low surrogate in \\u escape"); goto fail; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    jfail(p, esc, "high surrogate not followed by a low surrogate");
                    goto fail;
                }
                p->pos += 2;
                uint32_t lo;
                if (hex4(p, &lo)) goto fail;
                if (lo < 0xDC00 || lo > 0xDFFF) { jfail(p, esc, "high surrogate not followed by a low surrogate"); goto fail; }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            sb_utf8(&sb, cp);
            continue;
        }
        default: jfail(p, esc, "invalid escape sequence"); goto fail;
        }
        sb_put(&sb, &ch, 1);
    }
fail:
    free(sb.b);
    return NULL;
}

static json *parse_number(jparser *p) {
    size_t start = p->pos, i = p->pos;
    const unsigned char *s = p->s;
    int neg = 0, is_int = 1;
    if (i < p->len && s[i] == '-') { neg = 1; i++; }
    if (i >= p->len || s[i] < '0' || s[i] > '9') { jfail(p, i, "invalid number"); return NULL; }
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9') { jfail(p, start, "leading zero in number"); return NULL; }
    } else {
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t int_end = i;
    if (i < p->len && s[i] == '.') {
        is_int = 0; i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') { jfail(p, i, "digit expected after decimal point"); return NULL; }
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        is_int = 0; i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') { jfail(p, i, "digit expected in exponent"); return NULL; }
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    json *j = new_node(JSON_NUMBER);
    /* strtod needs a NUL-terminated copy (input is not necessarily terminated) */
    size_t n = i - start;
    char small[64];
    char *buf = n < sizeof small ? small : dt_malloc(n + 1);
    memcpy(buf, s + start, n);
    buf[n] = 0;
    errno = 0;
    j->number = strtod(buf, NULL);  /* overflow gives +-HUGE_VAL; accepted as a value */
    if (buf != small) free(buf);
    if (is_int) {
        /* exact int64 when it fits */
        uint64_t v = 0; int ovf = 0;
        for (size_t k = start + (size_t)neg; k < int_end; k++) {
            uint64_t d = (uint64_t)(s[k] - '0');
            if (v > (UINT64_MAX - d) / 10) { ovf = 1; break; }
            v = v * 10 + d;
        }
        if (!ovf && (neg ? v <= (uint64_t)INT64_MAX + 1 : v <= (uint64_t)INT64_MAX)) {
            j->is_integer = 1;
            j->integer = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
        }
    }
    p->pos = i;
    return j;
}

static int match_lit(jparser *p, const char *lit) {
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0) return 0;
    p->pos += n;
    return 1;
}

static json *parse_value(jparser *p, int depth);

static void push_item(json *j, size_t *cap, json *v, char *key) {
    if (j->len == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        j->items = dt_realloc(j->items, *cap * sizeof *j->items);
        if (j->type == JSON_OBJECT) j->keys = dt_realloc(j->keys, *cap * sizeof *j->keys);
    }
    j->items[j->len] = v;
    if (j->type == JSON_OBJECT) j->keys[j->len] = key;
    j->len++;
}

static json *parse_container(jparser *p, int depth, int is_obj) {
    size_t start = p->pos;
    if (depth >= JSON_MAX_DEPTH) { jfail(p, start, "nesting too deep"); return NULL; }
    p->pos++;
    json *j = new_node(is_obj ? JSON_OBJECT : JSON_ARRAY);
    size_t cap = 0;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == (is_obj ? '}' : ']')) { p->pos++; return j; }
    for (;;) {
        char *key = NULL;
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len) { jfail(p, start, "unterminated object"); goto fail; }
            if (p->s[p->pos] != '"') { jfail(p, p->pos, "object key (string) expected"); goto fail; }
            size_t kl;
            key = parse_string(p, &kl);
            if (!key) goto fail;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') { free(key); jfail(p, p->pos, "':' expected after object key"); goto fail; }
            p->pos++;
        }
        json *v = parse_value(p, depth + 1);
        if (!v) { free(key); goto fail; }
        push_item(j, &cap, v, key);
        skip_ws(p);
        if (p->pos >= p->len) { jfail(p, start, is_obj ? "unterminated object" : "unterminated array"); goto fail; }
        unsigned char c = p->s[p->pos];
        if (c == ',') { p->pos++; continue; }
        if (c == (is_obj ? '}' : ']')) { p->pos++; return j; }
        jfail(p, p->pos, is_obj ? "',' or '}' expected in object" : "',' or ']' expected in array");
        goto fail;
    }
fail:
    json_free(j);
    return NULL;
}

static json *parse_value(jparser *p, int depth) {
    skip_ws(p);
    if (p->pos >= p->len) { jfail(p, p->pos, "unexpected end of input, value expected"); return NULL; }
    unsigned char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, depth, 1);
    case '[': return parse_container(p, depth, 0);
    case '"': {
        size_t n;
        char *s = parse_string(p, &n);
        if (!s) return NULL;
        json *j = new_node(JSON_STRING);
        j->str = s;
        j->len = n;
        return j;
    }
    case 't': case 'f': case 'n': {
        json *j;
        if (match_lit(p, "true")) { j = new_node(JSON_BOOL); j->boolean = 1; }
        else if (match_lit(p, "false")) { j = new_node(JSON_BOOL); j->boolean = 0; }
        else if (match_lit(p, "null")) j = new_node(JSON_NULL);
        else { jfail(p, p->pos, "invalid literal"); return NULL; }
        return j;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
        jfail(p, p->pos, "unexpected character, value expected");
        return NULL;
    }
}

json *json_parse(const char *text, size_t len, const char *what) {
    jparser p = {(const unsigned char *)text, len, 0, what, 0};
    if (!text && len) { jfail(&p, 0, "no input"); return NULL; }
    json *j = parse_value(&p, 0);
    if (!j) return NULL;
    skip_ws(&p);
    if (p.pos != p.len) {
        jfail(&p, p.pos, "unexpected data after the JSON value");
        json_free(j);
        return NULL;
    }
    return j;
}

json *json_parse_file(const char *path) {
    FILE *f = dt_fopen_input(path);   /* a regular file (a FIFO or device is refused without waiting) */
    if (!f) return NULL;
    sbuf sb = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sb_put(&sb, buf, n);
    int err = ferror(f);
    fclose(f);
    if (err) { free(sb.b); dt_set_error("%s: read error", path); return NULL; }
    json *j = json_parse(sb.b ? sb.b : "", sb.n, path);
    free(sb.b);
    return j;
}

const json *json_get(const json *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

const json *json_at(const json *arr, size_t i) {
    if (!arr || arr->type != JSON_ARRAY || i >= arr->len) return NULL;
    return arr->items[i];
}

const char *json_get_str(const json *obj, const char *key) {
    const json *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

double json_get_num(const json *obj, const char *key, double dflt) {
    const json *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->number : dflt;
}

int64_t json_get_int(const json *obj, const char *key, int64_t dflt) {
    const json *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER && v->is_integer ? v->integer : dflt;
}

int json_get_bool(const json *obj, const char *key, int dflt) {
    const json *v = json_get(obj, key);
    return v && v->type == JSON_BOOL ? v->boolean : dflt;
}
