/* krea2_prompt.h — the Krea 2 prompt: the Qwen-Image chat template tokenized as a fixed-length block
 * and the stacked Qwen3-VL hidden states the Krea 2 transformer reads (diffusers Krea2Pipeline,
 * get_text_hidden_states).
 *
 * Layout (the pipeline's constants, not the model's):
 *   text   = PREFIX + prompt, tokenized, truncated / padded with the pad token to
 *            max_seq_len + 34 - 5 tokens (the tokenizer's truncation and padding sides)
 *   suffix = SUFFIX tokenized on its own (every token real), appended after the padding
 *   ids    = [text | suffix]: [system prefix | prompt | padding | suffix]
 *   mask   = 1 for real tokens, 0 for padding; positions = cumsum(mask) - 1 clamped at 0
 *            (padding does not consume a position, so the suffix sits right after the prompt)
 * The encoder runs on the real tokens only (the padding is never attended to and takes no position: their hidden
 * states are the padded run's); padded rows of the features are zero. The first 34 rows (the system prefix of the
 * real tokenizer) are dropped from features and mask. With the Qwen tokenizer the suffix is 5 tokens, so
 * T = max_seq_len.
 */
#ifndef DT_KREA2_PROMPT_H
#define DT_KREA2_PROMPT_H

#include <stdint.h>

#include "models/qwen3.h"
#include "text/tokenizer.h"

#define DT_KREA2_PROMPT_PREFIX                                                                                     \
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "        \
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
#define DT_KREA2_PROMPT_SUFFIX "<|im_end|>\n<|im_start|>assistant\n"
#define DT_KREA2_PROMPT_DROP 34          /* leading tokens dropped from the encoder output */
#define DT_KREA2_PROMPT_SUFFIX_TOKENS 5  /* what the pipeline subtracts for the suffix (its real token count) */

/* Token ids of a prompt in the layout above, before the drop: *ids, *mask, *pos malloc'd [*n] (caller frees).
 * 0 or -1 (dt_last_error: bad UTF-8, max_seq_len < 1, no pad token). */
int krea2_tokenize(const dt_tokenizer *tok, const char *prompt, int max_seq_len, int32_t **ids, int32_t **mask,
                      int32_t **pos, int *n);

/* Prompt features: *emb malloc'd [*T, n_taps, D] f32 (row t = [h_tap0[t] | h_tap1[t] | ...], D = the
 * encoder's hidden size; a padded row zero), *mask malloc'd [*T] (1 = real token), *T = tokens after the drop.
 * taps are hidden-state indices (0 = embeddings, k = after decoder layer k; the last layer's is normed).
 * 0 or -1 (dt_last_error). */
int krea2_encode_prompt(dt_qwen3 *te, const dt_tokenizer *tok, const char *prompt, int max_seq_len,
                           const int *taps, int n_taps, float **emb, uint8_t **mask, int *T);

#endif
