/* tokenizer.h — byte-level BPE tokenizer read from a Hugging Face tokenizer.json (Qwen2/Qwen3 family),
 * plus the Qwen3 chat template used by the FLUX.2-klein text encoder.
 *
 * Pipeline (what tokenizers.Tokenizer.encode does for these files):
 *   added tokens matched in the raw text (leftmost-longest) -> normalizer (NFC/NFD/NFKC/NFKD via utf8proc)
 *   -> pre-tokenizer (Split with the Qwen2 regex, implemented as a hand-written matcher, then ByteLevel)
 *   -> BPE merges by rank (priority queue per pre-token) -> ids -> post-processor (ByteLevel or a
 *   TemplateProcessing that adds special tokens).
 * Anything a file declares that this code does not implement is refused at load time with an error
 * that names the file (dt_last_error()).
 */
#ifndef DT_TOKENIZER_H
#define DT_TOKENIZER_H

#include <stdint.h>

typedef struct dt_tokenizer dt_tokenizer;

/* Load from a folder holding tokenizer.json (and optionally tokenizer_config.json, which supplies
 * pad_token / padding_side / truncation_side), or from the tokenizer.json file itself (a
 * tokenizer_config.json beside it is read too). NULL on error (dt_last_error()). */
dt_tokenizer *dt_tokenizer_load(const char *dir_or_file);
void dt_tokenizer_free(dt_tokenizer *tok);

/* Raw encode (no chat template): added tokens are matched, and the post-processor's special tokens
 * (none for Qwen) are added, like tokenizer(text)["input_ids"]. *ids is malloc'd (caller frees; may be
 * NULL when *n == 0). Returns 0, or -1 on error (text that is not valid UTF-8). */
int dt_tokenize(const dt_tokenizer *tok, const char *text, int32_t **ids, int *n);

/* Qwen3 chat template, one user turn, thinking disabled:
 *   "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
 * tokenized (special tokens matched), truncated to max_len (right side unless tokenizer_config.json
 * says truncation_side "left"), then padded with the pad token to exactly max_len (right unless
 * padding_side is "left"). ids and mask hold max_len entries; mask is 1 for real tokens, 0 for pads.
 * Returns the number of real tokens (>= 0), or -1 on error. */
int dt_tokenize_chat(const dt_tokenizer *tok, const char *prompt, int max_len, int32_t *ids, int32_t *mask);

/* Truncate/pad already-encoded ids to exactly max_len the same way dt_tokenize_chat does.
 * Returns the number of real tokens kept, or -1 on error (no pad token known, max_len < 1). */
int dt_tokenizer_pad(const dt_tokenizer *tok, const int32_t *in, int n, int max_len, int32_t *ids, int32_t *mask);

/* Id of a token string (added tokens first, then the BPE vocabulary), or -1 if unknown. */
int dt_tokenizer_token_id(const dt_tokenizer *tok, const char *token);

/* Pad token id used by dt_tokenize_chat / dt_tokenizer_pad, or -1 when none is known. */
int dt_tokenizer_pad_id(const dt_tokenizer *tok);

/* Number of ids (max id + 1 over the vocabulary and added tokens). */
int dt_tokenizer_vocab_size(const dt_tokenizer *tok);

#endif
