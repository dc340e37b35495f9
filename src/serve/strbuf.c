/* strbuf.c — growable text buffer, JSON string escaping and base64 (strbuf.h). */
#include "serve/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void sb_init(dt_strbuf *b) { b->data = NULL; b->len = b->cap = 0; }

void sb_free(dt_strbuf *b) {
    free(b->data);
    sb_init(b);
}

void sb_reset(dt_strbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

static void reserve(dt_strbuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    b->data = dt_realloc(b->data, cap);
    b->cap = cap;
}

void sb_putn(dt_strbuf *b, const char *s, size_t n) {
    reserve(b, n);
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sb_puts(dt_strbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

void sb_printf(dt_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is not one (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    if (c >= 0xF5 || len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;     /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0;    /* surrogates */
    if (c == 0xF0 && s[1] < 0x90) return 0;     /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0;    /* past U+10FFFF */
    return len;
}

void sb_json_str(dt_strbuf *b, const char *s, size_t n) {
    reserve(b, n + 2);
    sb_putn(b, "\"", 1);
    size_t run = 0;   /* bytes copied as they are, flushed before each escape */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t len = utf8_len((const unsigned char *)s + i, n - i);
            if (len) { run += len; i += len; continue; }
        } else if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f) {
            run++;
            i++;
            continue;
        }
        sb_putn(b, s + i - run, run);
        run = 0;
        char esc[8];
        switch (c) {
        case '"': sb_putn(b, "\\\"", 2); break;
        case '\\': sb_putn(b, "\\\\", 2); break;
        case '\n': sb_putn(b, "\\n", 2); break;
        case '\r': sb_putn(b, "\\r", 2); break;
        case '\t': sb_putn(b, "\\t", 2); break;
        default:
            if (c >= 0x80) sb_putn(b, "\\ufffd", 6);   /* a byte that is not valid UTF-8 */
            else {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                sb_putn(b, esc, 6);
            }
        }
        i++;
    }
    sb_putn(b, s + n - run, run);
    sb_putn(b, "\"", 1);
}

void sb_json_cstr(dt_strbuf *b, const char *s) {
    if (s) sb_json_str(b, s, strlen(s));
    else sb_puts(b, "null");
}

void sb_base64(dt_strbuf *b, const uint8_t *d, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    reserve(b, (n + 2) / 3 * 4);
    char *o = b->data + b->len;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = tab[(v >> 6) & 63];
        *o++ = tab[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0);
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    b->len = (size_t)(o - b->data);
    b->data[b->len] = 0;
}

char *sb_take(dt_strbuf *b, size_t *len) {
    if (!b->data) sb_putn(b, "", 0);
    char *s = b->data;
    if (len) *len = b->len;
    sb_init(b);
    return s;
}
