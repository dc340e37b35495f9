/* fuzz_tokenizer.c — libFuzzer target: the fuzzer's bytes become a tokenizer.json (written to a private
 * temp folder), which is loaded; when it loads, a fixed multilingual text is encoded raw and through
 * the chat template with padding. Seed corpus: tests/fixtures/model/tokenizer/tokenizer.json. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "fuzz_tmp.h"
#include "text/tokenizer.h"

static const char TEXT[] =
    "Hello world  don't I'LL 1234 caf\xC3\xA9 e\xCC\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\xA6\x8A\t\r\n\n end "
    "<|im_start|>user\nhi<|im_end|>\n<think></think>   ";

static char path[600];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) {
        snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_tmpdir("tokenizer"));
    }
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);

    dt_tokenizer *t = dt_tokenizer_load(path);
    if (!t) return 0;
    int32_t *ids = NULL;
    int n = 0;
    if (dt_tokenize(t, TEXT, &ids, &n) == 0) {
        int32_t pad_ids[48], mask[48];
        dt_tokenizer_pad(t, ids, n, 48, pad_ids, mask);
    }
    free(ids);
    int32_t cids[40], cmask[40];
    dt_tokenize_chat(t, "a red fox \xC3\xA9\xCC\x81 's", 40, cids, cmask);
    (void)dt_tokenizer_token_id(t, "<|endoftext|>");
    dt_tokenizer_free(t);
    return 0;
}
