/* config_file.h — writing config.json files beside outputs (`ditrun quantize`, `ditrun convert`): JSON
 * serialization of a parsed tree, and the check that a config.json already there describes the same model
 * (so a command never overwrites an unrelated model's config). */
#ifndef DT_CONFIG_FILE_H
#define DT_CONFIG_FILE_H

#include <stdio.h>

#include "json.h"

/* Writes j as JSON text (objects one key per line, indented by depth; numbers read back exactly). */
void json_write(FILE *f, const json *j, int depth);

/* Writes len bytes of s as a JSON string (quoted, escaped). */
void json_write_string(FILE *f, const char *s, size_t len);

/* 1 when two values are equal (numbers by value, objects key by key in any order). */
int json_equal(const json *a, const json *b);

/* Before writing `ours` to cfg_path: 0 when cfg_path does not exist or holds a config of the same model (every
 * key both have is equal, the quantization entries and "_name_or_path" / "_diffusers_version" aside); -1 (error
 * naming the file and the first differing key) when it is unreadable or describes another model. */
int dt_config_beside_ok(const char *cfg_path, const json *ours);

#endif
