/* zimage_prompt.h — the Z-Image prompt features (diffusers ZImagePipeline._encode_prompt): the Qwen3 chat template of
 * one user turn with thinking left on, so without the empty <think> block klein's template has:
 *   text = "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n"
 * tokenized (special tokens matched), truncated / padded to max_len with the pad token (the tokenizer's sides), the
 * Qwen3 encoder run with the padding mask, hidden_states[-2] taken (the output of decoder layer L − 1, before the
 * final norm), and only the real tokens' rows kept: the transformer gets a caption of variable length.
 */
#ifndef DT_ZIMAGE_PROMPT_H
#define DT_ZIMAGE_PROMPT_H

#include <stdint.h>

#include "models/qwen3.h"
#include "text/tokenizer.h"

#define DT_ZIMAGE_CHAT_PREFIX "<|im_start|>user\n"
#define DT_ZIMAGE_CHAT_SUFFIX "<|im_end|>\n<|im_start|>assistant\n"

/* The hidden-state index the features come from for an encoder of num_layers layers (hidden_states[-2]). */
static inline int zimage_prompt_tap(int num_layers) { return num_layers - 1; }

/* ids and mask [max_len] of a prompt in the layout above. Returns the number of real tokens, or -1 (dt_last_error:
 * bad UTF-8, max_len < 1, no pad token). */
int zimage_tokenize(const dt_tokenizer *tok, const char *prompt, int max_len, int32_t *ids, int32_t *mask);

/* Prompt features: *feats malloc'd [*n, D] f32 (D = the encoder's hidden size), the real tokens' rows in order.
 * te must hold layers 1..L − 1 (dt_qwen3_load with max_layer L − 1, or all). 0 or -1 (dt_last_error; a prompt
 * leaving no real token is an error). */
int zimage_encode_prompt(dt_qwen3 *te, const dt_tokenizer *tok, const char *prompt, int max_len, float **feats,
                            int *n);

#endif
