/* zimage_prompt.c — the Z-Image prompt: chat text, tokens and the hidden_states[-2] features of the real tokens
 * (zimage_prompt.h). */
#include "zimage_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int zimage_tokenize(const dt_tokenizer *tok, const char *prompt, int max_len, int32_t *ids, int32_t *mask) {
    if (!prompt) prompt = "";
    const size_t n = strlen(DT_ZIMAGE_CHAT_PREFIX) + strlen(prompt) + strlen(DT_ZIMAGE_CHAT_SUFFIX) + 1;
    char *text = dt_malloc(n);
    snprintf(text, n, "%s%s%s", DT_ZIMAGE_CHAT_PREFIX, prompt, DT_ZIMAGE_CHAT_SUFFIX);
    int32_t *raw = NULL;
    int nraw = 0;
    int rc = dt_tokenize(tok, text, &raw, &nraw);
    free(text);
    if (rc == 0) rc = dt_tokenizer_pad(tok, raw, nraw, max_len, ids, mask);
    free(raw);
    return rc;
}

int zimage_encode_prompt(dt_qwen3 *te, const dt_tokenizer *tok, const char *prompt, int max_len, float **feats,
                            int *n) {
    *feats = NULL;
    *n = 0;
    if (max_len < 1) { dt_set_error("zimage prompt: max_sequence_length must be at least 1"); return -1; }
    const dt_qwen3_config *c = dt_qwen3_get_config(te);
    const int tap = zimage_prompt_tap(c->num_layers);
    if (tap < 0 || tap > dt_qwen3_loaded_layers(te)) {
        dt_set_error("zimage prompt: the text encoder holds %d of %d layers; the features need %d",
                     dt_qwen3_loaded_layers(te), c->num_layers, tap);
        return -1;
    }
    int32_t *ids = dt_malloc(sizeof(int32_t) * (size_t)max_len), *mask = dt_malloc(sizeof(int32_t) * (size_t)max_len);
    float *all = NULL;
    int real = zimage_tokenize(tok, prompt, max_len, ids, mask), rc = -1;
    if (real == 0) dt_set_error("zimage prompt: no real token within max_sequence_length %d", max_len);
    if (real > 0) {
        const int64_t D = c->hidden;
        /* Right padding (the real tokens first): causal attention never lets a real token see the padding and the
         * positions count from 0 either way, so the encoder runs on the real tokens alone (NOTES.md, Z-Image). */
        int T = max_len, first = 1;
        for (int t = 0; t < real; t++) first &= mask[t] != 0;
        if (first) T = real;
        all = dt_malloc(sizeof(float) * (size_t)T * (size_t)D);
        if (dt_qwen3_encode(te, ids, mask, T, &tap, 1, all) == 0) {
            float *f = dt_malloc(sizeof(float) * (size_t)real * (size_t)D);
            int k = 0;
            for (int t = 0; t < T && k < real; t++)
                if (mask[t]) memcpy(f + (size_t)k++ * D, all + (size_t)t * D, sizeof(float) * (size_t)D);
            *feats = f;
            *n = k;
            rc = 0;
        }
    }
    free(all);
    free(ids);
    free(mask);
    return rc;
}
