/* fuzz_gguf.c — libFuzzer target: validate arbitrary bytes as a GGUF file (gguf_open_memory runs the same
 * checks as gguf_open), then touch everything the reader accepted: every metadata value, every tensor looked
 * up by name, its bytes dequantized (block types through dt_ggml_dequant, the rest converted to f32), and
 * check that the views lie inside the image and do not overlap. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "quant/ggml_quants.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = gguf_open_memory(data, size, "fuzz.gguf");
    if (!f) {
        if (!strstr(dt_last_error(), "fuzz.gguf")) __builtin_trap();   /* errors name the file */
        return 0;
    }
    for (size_t i = 0; i < gguf_meta_count(f); i++)
        if (!gguf_meta(f, gguf_meta_key(f, i))) __builtin_trap();
    size_t total = 0;
    for (size_t i = 0; i < gguf_count(f); i++) {
        const st_tensor *t = gguf_at(f, i);
        if (gguf_find(f, t->name) != t) __builtin_trap();
        if (t->nbytes != dt_dtype_bytes(t->dtype, t->numel)) __builtin_trap();
        if (!gguf_type_name(gguf_tensor_type(f, i))) __builtin_trap();
        total += t->nbytes;
        if (t->numel > (1 << 20)) continue;
        float *v;
        if (dt_dtype_is_block(t->dtype)) {
            v = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
            if (dt_ggml_dequant(t->dtype, t->data, t->numel, v)) __builtin_trap();   /* rows are whole blocks */
        } else {
            v = st_to_f32(t);
        }
        volatile float s = 0;
        for (int64_t k = 0; k < t->numel; k++) s += v[k];
        free(v);
    }
    if (total > size) __builtin_trap();   /* non-overlapping views cannot hold more bytes than the file */
    gguf_close(f);
    return 0;
}
