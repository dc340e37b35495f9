/* config_file.c — JSON serialization, JSON equality and the same-model check of an existing config.json
 * (config_file.h). */
#include "config_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/common.h"

void json_write_string(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void json_write(FILE *f, const json *j, int depth) {
    switch (j->type) {
    case JSON_NULL: fputs("null", f); break;
    case JSON_BOOL: fputs(j->boolean ? "true" : "false", f); break;
    case JSON_NUMBER:
        if (j->is_integer) fprintf(f, "%lld", (long long)j->integer);
        else {   /* shortest form that reads back exactly */
            char b[40];
            snprintf(b, sizeof b, "%.15g", j->number);
            if (strtod(b, NULL) != j->number) snprintf(b, sizeof b, "%.17g", j->number);
            fputs(b, f);
        }
        break;
    case JSON_STRING: json_write_string(f, j->str, j->len); break;
    case JSON_ARRAY:
        fputc('[', f);
        for (size_t i = 0; i < j->len; i++) { if (i) fputs(", ", f); json_write(f, j->items[i], depth + 1); }
        fputc(']', f);
        break;
    case JSON_OBJECT:
        fputs("{", f);
        for (size_t i = 0; i < j->len; i++) {
            fprintf(f, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            json_write_string(f, j->keys[i], strlen(j->keys[i]));
            fputs(": ", f);
            json_write(f, j->items[i], depth + 1);
        }
        fprintf(f, "\n%*s}", 2 * depth, "");
        break;
    }
}

int json_equal(const json *a, const json *b) {
    if (!a || !b) return a == b;
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return a->boolean == b->boolean;
    case JSON_NUMBER: return a->is_integer && b->is_integer ? a->integer == b->integer : a->number == b->number;
    case JSON_STRING: return a->len == b->len && !memcmp(a->str, b->str, a->len);
    case JSON_ARRAY:
        if (a->len != b->len) return 0;
        for (size_t i = 0; i < a->len; i++)
            if (!json_equal(a->items[i], b->items[i])) return 0;
        return 1;
    case JSON_OBJECT:
        if (a->len != b->len) return 0;
        for (size_t i = 0; i < a->len; i++)
            if (!json_equal(a->items[i], json_get(b, a->keys[i]))) return 0;
        return 1;
    }
    return 0;
}

/* Keys that say how a file was produced, not which model it is. */
static int ignored_key(const char *k) {
    return !strcmp(k, "quantization") || !strcmp(k, "quantization_config") || !strcmp(k, "_name_or_path") ||
           !strcmp(k, "_diffusers_version") || !strncmp(k, "_ditrun", 7);
}

int dt_config_beside_ok(const char *cfg_path, const json *ours) {
    struct stat st;
    if (stat(cfg_path, &st) != 0) {
        if (errno == ENOENT) return 0;
        dt_set_error("%s: %s", cfg_path, strerror(errno));
        return -1;
    }
    json *old = json_parse_file(cfg_path);
    if (!old) {
        char why[600];
        snprintf(why, sizeof why, "%s", dt_last_error());
        dt_set_error("%s: exists and is not a config of this model (%s); choose another output folder", cfg_path, why);
        return -1;
    }
    int rc = 0;
    if (old->type != JSON_OBJECT || !ours || ours->type != JSON_OBJECT) {
        dt_set_error("%s: exists and is not a config of this model (not a JSON object); choose another output folder", cfg_path);
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < ours->len; i++) {
        const char *k = ours->keys[i];
        const json *mine = ours->items[i], *theirs = json_get(old, k);
        if (ignored_key(k) || !theirs || json_equal(mine, theirs)) continue;
        dt_set_error("%s: exists and describes another model (\"%s\" differs); not overwriting it: choose another output "
                     "folder or remove that file", cfg_path, k);
        rc = -1;
    }
    json_free(old);
    return rc;
}
