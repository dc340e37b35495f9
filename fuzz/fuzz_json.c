/* fuzz_json.c — libFuzzer target: json_parse on arbitrary bytes, then walk the whole tree and use the
 * lookup helpers on every object, so that any accepted document is fully readable. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/json.h"

static size_t walk(const json *j) {
    size_t n = 1;
    switch (j->type) {
    case JSON_STRING:
        n += j->len;
        if (j->str[j->len] != 0) __builtin_trap();  /* always NUL-terminated */
        break;
    case JSON_ARRAY:
        for (size_t i = 0; i < j->len; i++) {
            if (json_at(j, i) != j->items[i]) __builtin_trap();
            n += walk(j->items[i]);
        }
        if (json_at(j, j->len)) __builtin_trap();
        break;
    case JSON_OBJECT:
        for (size_t i = 0; i < j->len; i++) {
            const json *v = json_get(j, j->keys[i]);
            if (!v) __builtin_trap();
            (void)json_get_str(j, j->keys[i]);
            (void)json_get_num(j, j->keys[i], 0);
            (void)json_get_int(j, j->keys[i], 0);
            (void)json_get_bool(j, j->keys[i], 0);
            n += strlen(j->keys[i]) + walk(j->items[i]);
        }
        break;
    default:
        break;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json *j = json_parse((const char *)data, size, "fuzz.json");
    if (j) {
        volatile size_t n = walk(j);
        (void)n;
        json_free(j);
    }
    return 0;
}
