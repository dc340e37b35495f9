/* fuzz_safetensors.c — libFuzzer target: validate arbitrary bytes as a safetensors file (st_open_memory
 * runs the same checks as st_open), then touch every tensor the reader accepted: lookup by name, read
 * every byte through st_to_f32, and check that views lie inside the image and do not overlap. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f = st_open_memory(data, size, "fuzz.safetensors");
    if (!f) {
        if (!strstr(dt_last_error(), "fuzz.safetensors")) __builtin_trap(); /* errors name the file */
        return 0;
    }
    (void)st_metadata(f, "format");
    size_t total = 0;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (st_find(f, t->name) != t) __builtin_trap();
        if (t->nbytes != (size_t)t->numel * dt_dtype_size(t->dtype)) __builtin_trap();
        total += t->nbytes;
        if (t->numel <= (1 << 20)) {
            float *v = st_to_f32(t);
            volatile float s = 0;
            for (int64_t k = 0; k < t->numel; k++) s += v[k];
            free(v);
        }
    }
    if (total > size) __builtin_trap(); /* non-overlapping views cannot hold more bytes than the file */
    st_close(f);
    return 0;
}
