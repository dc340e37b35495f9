/* strbuf.h — a growable text buffer for building HTTP bodies: formatted text, JSON strings with escaping,
 * base64. Allocation failures exit (core/common.h's checked allocation). */
#ifndef DT_STRBUF_H
#define DT_STRBUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

typedef struct {
    char *data;     /* NUL-terminated when len > 0 or after any append */
    size_t len, cap;
} dt_strbuf;

void sb_init(dt_strbuf *b);
void sb_free(dt_strbuf *b);
void sb_reset(dt_strbuf *b);                                  /* len = 0, memory kept */
void sb_putn(dt_strbuf *b, const char *s, size_t n);
void sb_puts(dt_strbuf *b, const char *s);
void sb_printf(dt_strbuf *b, const char *fmt, ...) DT_PRINTF(2, 3);
/* s (n bytes) as a quoted JSON string: ", \, control characters escaped, valid UTF-8 copied as it is, each byte
 * that is not valid UTF-8 written as U+FFFD (so the output is always valid JSON) */
void sb_json_str(dt_strbuf *b, const char *s, size_t n);
void sb_json_cstr(dt_strbuf *b, const char *s);               /* NULL writes null */
void sb_base64(dt_strbuf *b, const uint8_t *data, size_t n);  /* RFC 4648, with padding */
/* Hand the bytes over (malloc'd, NUL-terminated); b is empty afterwards. */
char *sb_take(dt_strbuf *b, size_t *len);

#endif
