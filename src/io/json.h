/* json.h — a small, strict JSON parser (RFC 8259) producing an immutable tree.
 * Used for safetensors headers, config.json, model_index.json, tokenizer.json, index files.
 * Strings are decoded to UTF-8 (\uXXXX escapes and surrogate pairs included).
 * Depth is limited (JSON_MAX_DEPTH) so hostile input cannot exhaust the stack.
 */
#ifndef DT_JSON_H
#define DT_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 256

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json json;
struct json {
    json_type type;
    int boolean;          /* JSON_BOOL */
    double number;        /* JSON_NUMBER (also exact for integers up to 2^53) */
    int is_integer;       /* number had no fraction/exponent and fits int64 */
    int64_t integer;      /* exact value when is_integer */
    char *str;            /* JSON_STRING: NUL-terminated UTF-8 (may contain embedded NUL; see len) */
    size_t len;           /* JSON_STRING byte length; JSON_ARRAY/OBJECT element count */
    json **items;         /* JSON_ARRAY elements / JSON_OBJECT values, in file order */
    char **keys;          /* JSON_OBJECT keys, parallel to items */
};

/* Parse `len` bytes. On error returns NULL and sets dt_set_error("<what>: JSON error at byte N: ...")
 * where <what> names the source (file name) for the message. */
json *json_parse(const char *text, size_t len, const char *what);
/* Parse a whole file. Errors name the file. */
json *json_parse_file(const char *path);
void json_free(json *j);

/* Lookups (NULL / default when absent or of the wrong type). Duplicate keys: first wins. */
const json *json_get(const json *obj, const char *key);
const json *json_at(const json *arr, size_t i);
const char *json_get_str(const json *obj, const char *key);          /* NULL if not a string */
double json_get_num(const json *obj, const char *key, double dflt);  /* dflt if absent or not a number */
int64_t json_get_int(const json *obj, const char *key, int64_t dflt);/* dflt if absent or not an integer */
int json_get_bool(const json *obj, const char *key, int dflt);

#endif
