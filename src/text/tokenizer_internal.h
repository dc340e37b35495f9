/* tokenizer_internal.h — what the tokenizer's two files share (private to them): the hash tables (string -> id,
 * token pair -> merge), the added tokens and their matching sets, the loaded tokenizer's state, and the
 * normalization the loader applies to normalized added tokens. tokenizer_load.c fills a dt_tokenizer from
 * tokenizer.json (+ tokenizer_config.json); tokenizer.c encodes text with it. */
#ifndef DT_TOKENIZER_INTERNAL_H
#define DT_TOKENIZER_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer.h"
#include "../core/common.h"

#define MAX_NORM 8
#define DEFAULT_PAD "<|endoftext|>"

/* ---------------------------------------------------------------- hash tables */

static inline uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;              /* FNV-1a, then a final avalanche */
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ull; }
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
    return h;
}

static inline uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ull; k ^= k >> 33;
    return k;
}

static inline size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* string -> id, keys copied into one arena; linear probing, capacity >= 2x entries */
typedef struct { uint64_t hash; size_t off; uint32_t len; int32_t id; } vslot;   /* id < 0: empty */
typedef struct {
    vslot *slots; size_t cap, count;
    char *arena; size_t alen, acap;
} strmap;

static inline void strmap_init(strmap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = dt_malloc(m->cap * sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].id = -1;
    m->count = 0;
    m->arena = NULL; m->alen = m->acap = 0;
}

static inline void strmap_free(strmap *m) { free(m->slots); free(m->arena); memset(m, 0, sizeof *m); }

static inline void strmap_grow(strmap *m) {
    size_t ncap = m->cap * 2;
    vslot *ns = dt_malloc(ncap * sizeof *ns);
    for (size_t i = 0; i < ncap; i++) ns[i].id = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].id < 0) continue;
        size_t j = m->slots[i].hash & (ncap - 1);
        while (ns[j].id >= 0) j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns; m->cap = ncap;
}

static inline int32_t strmap_get(const strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint64_t h = hash_bytes(s, n);
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const vslot *v = &m->slots[j];
        if (v->id < 0) return -1;
        if (v->hash == h && v->len == n && !memcmp(m->arena + v->off, s, n)) return v->id;
    }
}

/* Insert or overwrite (the last duplicate wins, as with a JSON object read into a hash map). */
static inline void strmap_put(strmap *m, const char *s, size_t n, int32_t id) {
    if ((m->count + 1) * 2 > m->cap) strmap_grow(m);
    uint64_t h = hash_bytes(s, n);
    size_t j = h & (m->cap - 1);
    for (;; j = (j + 1) & (m->cap - 1)) {
        vslot *v = &m->slots[j];
        if (v->id < 0) break;
        if (v->hash == h && v->len == n && !memcmp(m->arena + v->off, s, n)) { v->id = id; return; }
    }
    m->arena = dt_grow(m->arena, &m->acap, m->alen + n + 1, 4096);
    memcpy(m->arena + m->alen, s, n);
    m->arena[m->alen + n] = 0;
    m->slots[j] = (vslot){h, m->alen, (uint32_t)n, id};
    m->alen += n + 1;
    m->count++;
}

/* (left id, right id) -> (rank, merged id) */
typedef struct { uint64_t key; int32_t rank; int32_t new_id; } mslot;   /* rank < 0: empty */
typedef struct { mslot *slots; size_t cap, count; } mergemap;

static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static inline void mergemap_init(mergemap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = dt_malloc(m->cap * sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].rank = -1;
    m->count = 0;
}

static inline void mergemap_put(mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t k = pair_key(a, b);
    size_t j = hash_u64(k) & (m->cap - 1);
    for (;; j = (j + 1) & (m->cap - 1)) {
        mslot *s = &m->slots[j];
        if (s->rank < 0) { *s = (mslot){k, rank, new_id}; m->count++; return; }
        if (s->key == k) { s->rank = rank; s->new_id = new_id; return; }   /* duplicate: last wins */
    }
}

static inline const mslot *mergemap_get(const mergemap *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    for (size_t j = hash_u64(k) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const mslot *s = &m->slots[j];
        if (s->rank < 0) return NULL;
        if (s->key == k) return s;
    }
}

/* ---------------------------------------------------------------- the tokenizer */

typedef struct {
    char *content; size_t len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} added_tok;

/* One matching set (raw or normalized added tokens): patterns bucketed by first byte, longest first. */
typedef struct { const char *s; size_t len; const added_tok *t; } pattern;
typedef struct {
    pattern *p; size_t n;
    size_t start[257];
    char **owned; size_t nowned;       /* normalized copies of patterns */
} matchset;

struct dt_tokenizer {
    char *path;                        /* tokenizer.json, for messages */
    strmap vocab;
    mergemap merges;
    int32_t byte_id[256];              /* vocab id of each byte's ByteLevel character, -1 if absent */
    char byte_chr[256][3];             /* UTF-8 of each byte's ByteLevel character */
    int32_t unk_id;
    int fuse_unk, ignore_merges;

    added_tok *added; size_t nadded;
    strmap added_map;                  /* content -> id for every added token */
    matchset raw_set, norm_set;

    int nnorm; utf8proc_option_t norm[MAX_NORM];

    int split;                         /* 1: Qwen2-style split regex present */
    int max_digits;                    /* 1 (Qwen2) or 3 (cl100k) */

    int32_t *pre_ids, *post_ids; int npre, npost;   /* post-processor special tokens */

    int32_t pad_id;
    int pad_left, trunc_left;
    int32_t vocab_size;
};

/* The text after the tokenizer's normalizers (NFC, lowercase, ...); malloc'd, NULL with the error set when the text
 * is not valid UTF-8 (tokenizer.c). */
char *tok_normalize(const dt_tokenizer *t, const char *s, size_t n, size_t *outn);

#endif
