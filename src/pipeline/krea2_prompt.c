/* krea2_prompt.c — the Krea 2 prompt block (krea2_prompt.h): template tokenization with padding in
 * the middle, positions that count only real tokens, the Qwen3-VL taps, the system prefix dropped. */
#include "pipeline/krea2_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int krea2_tokenize(const dt_tokenizer *tok, const char *prompt, int max_seq_len, int32_t **ids_out,
                      int32_t **mask_out, int32_t **pos_out, int *n_out) {
    *ids_out = *mask_out = *pos_out = NULL;
    *n_out = 0;
    if (!tok || !prompt) { dt_set_error("krea2 prompt: a tokenizer and a prompt are required"); return -1; }
    if (max_seq_len < 1 || max_seq_len > (1 << 20)) {
        dt_set_error("krea2 prompt: max_sequence_length must be in 1..%d (got %d)", 1 << 20, max_seq_len);
        return -1;
    }
    const int L = max_seq_len + DT_KREA2_PROMPT_DROP - DT_KREA2_PROMPT_SUFFIX_TOKENS;
    static const char prefix[] = DT_KREA2_PROMPT_PREFIX;
    size_t pl = strlen(prompt);
    char *text = dt_malloc(sizeof prefix + pl);
    memcpy(text, prefix, sizeof prefix - 1);
    memcpy(text + sizeof prefix - 1, prompt, pl + 1);
    int32_t *raw = NULL, *suf = NULL;
    int n_raw = 0, n_suf = 0, rc = -1;
    if (dt_tokenize(tok, text, &raw, &n_raw) || dt_tokenize(tok, DT_KREA2_PROMPT_SUFFIX, &suf, &n_suf)) goto out;
    const int n = L + n_suf;
    int32_t *ids = dt_malloc(sizeof(int32_t) * (size_t)n), *mask = dt_malloc(sizeof(int32_t) * (size_t)n);
    if (dt_tokenizer_pad(tok, raw, n_raw, L, ids, mask) < 0) { free(ids); free(mask); goto out; }
    for (int i = 0; i < n_suf; i++) {
        ids[L + i] = suf[i];
        mask[L + i] = 1;
    }
    int32_t *pos = dt_malloc(sizeof(int32_t) * (size_t)n);
    int32_t count = 0;
    for (int i = 0; i < n; i++) {
        count += mask[i] != 0;
        pos[i] = count > 0 ? count - 1 : 0;
    }
    *ids_out = ids;
    *mask_out = mask;
    *pos_out = pos;
    *n_out = n;
    rc = 0;
out:
    free(text);
    free(raw);
    free(suf);
    return rc;
}

int krea2_encode_prompt(dt_qwen3 *te, const dt_tokenizer *tok, const char *prompt, int max_seq_len,
                           const int *taps, int n_taps, float **emb_out, uint8_t **mask_out, int *T_out) {
    *emb_out = NULL;
    *mask_out = NULL;
    *T_out = 0;
    int32_t *ids, *mask, *pos;
    int n;
    if (krea2_tokenize(tok, prompt, max_seq_len, &ids, &mask, &pos, &n)) return -1;
    int rc = -1;
    const int D = dt_qwen3_get_config(te)->hidden, T = n - DT_KREA2_PROMPT_DROP;
    if (T < 1) {
        dt_set_error("krea2 prompt: %d tokens do not reach past the %d dropped prefix tokens", n, DT_KREA2_PROMPT_DROP);
        goto out;
    }
    const size_t row = (size_t)n_taps * D;
    /* The encoder runs on the real tokens only: a padded token is never attended to (a masked key under causal
     * attention) and takes no position, so each real token's hidden states are those of the padded run. The
     * padded rows of the features are zero: nothing reads them (krea2_forward drops the padding). */
    int32_t *rid = dt_malloc(sizeof(int32_t) * (size_t)n), *rpos = dt_malloc(sizeof(int32_t) * (size_t)n);
    int32_t *rmask = dt_malloc(sizeof(int32_t) * (size_t)n);
    int nr = 0;
    for (int i = 0; i < n; i++)
        if (mask[i]) {
            rid[nr] = ids[i];
            rpos[nr] = pos[i];
            rmask[nr++] = 1;
        }
    float *real = dt_malloc(sizeof(float) * (size_t)nr * row);
    int erc = dt_qwen3_encode_at(te, rid, rmask, rpos, nr, taps, n_taps, real);
    free(rid); free(rpos); free(rmask);
    if (erc) { free(real); goto out; }
    float *all = dt_calloc((size_t)T * row, sizeof(float));
    for (int i = 0, r = 0; i < n; i++) {
        if (!mask[i]) continue;
        if (i >= DT_KREA2_PROMPT_DROP)
            memcpy(all + (size_t)(i - DT_KREA2_PROMPT_DROP) * row, real + (size_t)r * row, sizeof(float) * row);
        r++;
    }
    free(real);
    uint8_t *m = dt_malloc((size_t)T);
    for (int t = 0; t < T; t++) m[t] = mask[DT_KREA2_PROMPT_DROP + t] != 0;
    *emb_out = all;
    *mask_out = m;
    *T_out = T;
    rc = 0;
out:
    free(ids);
    free(mask);
    free(pos);
    return rc;
}
