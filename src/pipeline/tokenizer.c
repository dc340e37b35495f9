/* tokenizer.c — byte-level BPE tokenizer from a Hugging Face tokenizer.json (Qwen2/Qwen3 family):
 * loading (vocab/merges hash tables, added tokens, normalizer, pre-tokenizer, post-processor),
 * added-token splitting, utf8proc normalization, the Qwen2 split regex as a hand-written matcher,
 * ByteLevel mapping, rank-ordered BPE merges with a binary heap, and the Qwen3 chat template. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "../core/common.h"
#include "../core/infile.h"
#include "../io/json.h"

/* The Qwen2 pre-tokenizer regex, and the cl100k variant that differs only by \p{N}{1,3}. */
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char CL100K_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#define MAX_NORM 8
#define DEFAULT_PAD "<|endoftext|>"

/* ---------------------------------------------------------------- hash tables */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;              /* FNV-1a, then a final avalanche */
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ull; }
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
    return h;
}

static uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ull; k ^= k >> 33;
    return k;
}

static size_t pow2_at_least(size_t n) {
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

static void strmap_init(strmap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = dt_malloc(m->cap * sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].id = -1;
    m->count = 0;
    m->arena = NULL; m->alen = m->acap = 0;
}

static void strmap_free(strmap *m) { free(m->slots); free(m->arena); memset(m, 0, sizeof *m); }

static void strmap_grow(strmap *m) {
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

static int32_t strmap_get(const strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint64_t h = hash_bytes(s, n);
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const vslot *v = &m->slots[j];
        if (v->id < 0) return -1;
        if (v->hash == h && v->len == n && !memcmp(m->arena + v->off, s, n)) return v->id;
    }
}

/* Insert or overwrite (the last duplicate wins, as with a JSON object read into a hash map). */
static void strmap_put(strmap *m, const char *s, size_t n, int32_t id) {
    if ((m->count + 1) * 2 > m->cap) strmap_grow(m);
    uint64_t h = hash_bytes(s, n);
    size_t j = h & (m->cap - 1);
    for (;; j = (j + 1) & (m->cap - 1)) {
        vslot *v = &m->slots[j];
        if (v->id < 0) break;
        if (v->hash == h && v->len == n && !memcmp(m->arena + v->off, s, n)) { v->id = id; return; }
    }
    if (m->alen + n + 1 > m->acap) {
        size_t c = m->acap ? m->acap : 4096;
        while (m->alen + n + 1 > c) c *= 2;
        m->arena = dt_realloc(m->arena, c);
        m->acap = c;
    }
    memcpy(m->arena + m->alen, s, n);
    m->arena[m->alen + n] = 0;
    m->slots[j] = (vslot){h, m->alen, (uint32_t)n, id};
    m->alen += n + 1;
    m->count++;
}

/* (left id, right id) -> (rank, merged id) */
typedef struct { uint64_t key; int32_t rank; int32_t new_id; } mslot;   /* rank < 0: empty */
typedef struct { mslot *slots; size_t cap, count; } mergemap;

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static void mergemap_init(mergemap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = dt_malloc(m->cap * sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].rank = -1;
    m->count = 0;
}

static void mergemap_put(mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t k = pair_key(a, b);
    size_t j = hash_u64(k) & (m->cap - 1);
    for (;; j = (j + 1) & (m->cap - 1)) {
        mslot *s = &m->slots[j];
        if (s->rank < 0) { *s = (mslot){k, rank, new_id}; m->count++; return; }
        if (s->key == k) { s->rank = rank; s->new_id = new_id; return; }   /* duplicate: last wins */
    }
}

static const mslot *mergemap_get(const mergemap *m, int32_t a, int32_t b) {
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

/* ---------------------------------------------------------------- Unicode helpers */

enum { C_L = 1, C_N = 2, C_WS = 4, C_NL = 8 };

static int is_ws(uint32_t c) {
    if ((c >= 9 && c <= 13) || c == 0x20 || c == 0x85) return 1;
    if (c < 0x80) return 0;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static uint8_t char_class(uint32_t c) {
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return C_L;
        if (c >= '0' && c <= '9') return C_N;
        if (c == '\r' || c == '\n') return C_WS | C_NL;
        if ((c >= 9 && c <= 13) || c == ' ') return C_WS;
        return 0;
    }
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: return C_L;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: return C_N;
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: return C_WS;
    default: return c == 0x85 ? C_WS : 0;
    }
}

/* \w as Rust's regex crate defines it (alphabetic, marks, decimal digits, connector punctuation). */
static int is_word(uint32_t c) {
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}

/* Decode one code point at s[0..n); returns its byte length, or -1 if the bytes are not valid UTF-8. */
static int utf8_next(const char *s, size_t n, uint32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, n > 4 ? 4 : (utf8proc_ssize_t)n, &c);
    if (k <= 0 || c < 0) return -1;
    *cp = (uint32_t)c;
    return (int)k;
}

/* Code point that ends at s[end) (assumes valid UTF-8 before end). */
static uint32_t utf8_prev(const char *s, size_t end) {
    size_t i = end;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80 && end - i < 3) i--;
    if (i > 0) i--;
    uint32_t cp = 0;
    if (utf8_next(s + i, end - i, &cp) < 0) return 0xFFFD;
    return cp;
}

/* Case-insensitive ASCII letter for the contraction alternatives (ſ folds to s). */
static uint32_t fold_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c == 0x17F) return 's';
    return c;
}

/* ---------------------------------------------------------------- per-call workspace */

typedef struct { int32_t *v; size_t n, cap; } idvec;

static void idvec_push(idvec *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = dt_realloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = id;
}

typedef struct {
    uint32_t *cp; uint8_t *cl; size_t *off; size_t ccap;       /* decoded code points of a piece */
    int32_t *sym, *prev, *next; size_t scap;                   /* BPE symbols */
    uint64_t *heap; size_t hcap, hn;                           /* (rank << 32 | position) min-heap */
    char *buf; size_t bcap;                                    /* scratch string */
} workspace;

static void ws_free(workspace *w) {
    free(w->cp); free(w->cl); free(w->off); free(w->sym); free(w->prev); free(w->next);
    free(w->heap); free(w->buf);
}

static void heap_push(workspace *w, uint64_t x) {
    if (w->hn == w->hcap) {
        w->hcap = w->hcap ? w->hcap * 2 : 64;
        w->heap = dt_realloc(w->heap, w->hcap * sizeof *w->heap);
    }
    size_t i = w->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p] <= x) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = x;
}

static uint64_t heap_pop(workspace *w) {
    uint64_t top = w->heap[0], x = w->heap[--w->hn];
    size_t i = 0, n = w->hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (x <= w->heap[c]) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = x;
    return top;
}

/* ---------------------------------------------------------------- BPE on one pre-token */

static void push_pair(const dt_tokenizer *t, workspace *w, int32_t pos) {
    int32_t q = w->next[pos];
    if (q < 0) return;
    const mslot *m = mergemap_get(&t->merges, w->sym[pos], w->sym[q]);
    if (m) heap_push(w, ((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)pos);
}

static void bpe_word(const dt_tokenizer *t, workspace *w, const unsigned char *s, size_t n, idvec *out) {
    if (n == 1) {
        int32_t id = t->byte_id[s[0]];
        if (id < 0) id = t->unk_id;
        if (id >= 0) idvec_push(out, id);
        return;
    }
    if (t->ignore_merges) {
        if (w->bcap < 2 * n + 1) { w->bcap = 2 * n + 1; w->buf = dt_realloc(w->buf, w->bcap); }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            for (const char *c = t->byte_chr[s[i]]; *c; c++) w->buf[k++] = *c;
        int32_t id = strmap_get(&t->vocab, w->buf, k);
        if (id >= 0) { idvec_push(out, id); return; }
    }
    if (w->scap < n) {
        w->scap = n;
        w->sym = dt_realloc(w->sym, n * sizeof *w->sym);
        w->prev = dt_realloc(w->prev, n * sizeof *w->prev);
        w->next = dt_realloc(w->next, n * sizeof *w->next);
    }
    /* initial symbols: one per byte (unknown bytes become unk, fused if asked, or are dropped) */
    int32_t m = 0;
    int last_unk = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (t->fuse_unk && last_unk) continue;
            id = t->unk_id;
            last_unk = 1;
        } else {
            last_unk = 0;
        }
        w->sym[m] = id; w->prev[m] = m - 1; w->next[m] = m + 1;
        m++;
    }
    if (m == 0) return;
    w->next[m - 1] = -1;
    w->hn = 0;
    for (int32_t i = 0; i + 1 < m; i++) push_pair(t, w, i);
    while (w->hn) {
        uint64_t top = heap_pop(w);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32);
        if (w->prev[pos] == -2) continue;                    /* symbol was merged away */
        int32_t q = w->next[pos];
        if (q < 0) continue;
        const mslot *mm = mergemap_get(&t->merges, w->sym[pos], w->sym[q]);
        if (!mm || mm->rank != rank) continue;               /* stale entry */
        w->sym[pos] = mm->new_id;
        w->next[pos] = w->next[q];
        if (w->next[q] >= 0) w->prev[w->next[q]] = pos;
        w->prev[q] = -2;
        if (w->prev[pos] >= 0) push_pair(t, w, w->prev[pos]);
        push_pair(t, w, pos);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) idvec_push(out, w->sym[i]);
}

/* ---------------------------------------------------------------- pre-tokenizer */

/* End (exclusive, in code points) of the regex match that starts at i: the alternatives of the
 * Qwen2 pattern tried in order, with the backtracking outcomes worked out by hand. */
static size_t split_match(const uint32_t *cp, const uint8_t *cl, size_t m, size_t i, int max_digits) {
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (cp[i] == '\'' && i + 1 < m) {
        uint32_t a = fold_lower(cp[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < m) {
            uint32_t b = fold_lower(cp[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!(cl[i] & (C_L | C_N | C_NL)) && i + 1 < m && (cl[i + 1] & C_L)) {
        size_t j = i + 2;
        while (j < m && (cl[j] & C_L)) j++;
        return j;
    }
    if (cl[i] & C_L) {
        size_t j = i + 1;
        while (j < m && (cl[j] & C_L)) j++;
        return j;
    }
    /* \p{N} (or \p{N}{1,3}) */
    if (cl[i] & C_N) {
        size_t j = i + 1;
        while (j < m && j - i < (size_t)max_digits && (cl[j] & C_N)) j++;
        return j;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    {
        size_t k = i;
        if (cp[k] == ' ' && k + 1 < m && !cl[k + 1]) k++;
        if (!cl[k]) {
            size_t j = k + 1;
            while (j < m && !cl[j]) j++;
            while (j < m && (cl[j] & C_NL)) j++;
            return j;
        }
    }
    /* whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+ */
    size_t j = i, last_nl = SIZE_MAX;
    while (j < m && (cl[j] & C_WS)) {
        if (cl[j] & C_NL) last_nl = j;
        j++;
    }
    if (last_nl != SIZE_MAX) return last_nl + 1;
    if (j == m) return j;
    if (j - i >= 2) return j - 1;
    return j > i ? j : i + 1;
}

/* Pre-tokenize one normalized piece (valid UTF-8 checked here) and BPE each pre-token. */
static int encode_pretokens(const dt_tokenizer *t, workspace *w, const char *s, size_t n, idvec *out) {
    if (n == 0) return 0;
    if (!t->split) {
        for (size_t i = 0; i < n;) {
            uint32_t c;
            int k = utf8_next(s + i, n - i, &c);
            if (k < 0) { dt_set_error("tokenizer: text is not valid UTF-8 (byte %zu)", i); return -1; }
            i += (size_t)k;
        }
        bpe_word(t, w, (const unsigned char *)s, n, out);
        return 0;
    }
    if (w->ccap < n + 1) {
        w->ccap = n + 1;
        w->cp = dt_realloc(w->cp, w->ccap * sizeof *w->cp);
        w->cl = dt_realloc(w->cl, w->ccap * sizeof *w->cl);
        w->off = dt_realloc(w->off, w->ccap * sizeof *w->off);
    }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int k = utf8_next(s + i, n - i, &c);
        if (k < 0) { dt_set_error("tokenizer: text is not valid UTF-8 (byte %zu)", i); return -1; }
        w->cp[m] = c; w->cl[m] = char_class(c); w->off[m] = i;
        m++;
        i += (size_t)k;
    }
    w->off[m] = n;
    for (size_t i = 0; i < m;) {
        size_t j = split_match(w->cp, w->cl, m, i, t->max_digits);
        bpe_word(t, w, (const unsigned char *)s + w->off[i], w->off[j] - w->off[i], out);
        i = j;
    }
    return 0;
}

/* ---------------------------------------------------------------- added tokens */

/* Leftmost-longest occurrence of a pattern at or after `from`. */
static const pattern *match_find(const matchset *ms, const char *s, size_t n, size_t from, size_t *at) {
    if (!ms->n) return NULL;
    for (size_t i = from; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        for (size_t k = ms->start[c]; k < ms->start[c + 1]; k++) {
            const pattern *p = &ms->p[k];
            if (p->len <= n - i && !memcmp(s + i, p->s, p->len)) { *at = i; return p; }
        }
    }
    return NULL;
}

typedef int (*gap_fn)(const dt_tokenizer *t, workspace *w, const char *s, size_t n, idvec *out);

/* Split s on the set's tokens (single_word / lstrip / rstrip as tokenizers' AddedVocabulary does):
 * tokens go to out, the text between them to gap(). */
static int split_added(const dt_tokenizer *t, workspace *w, const matchset *ms, const char *s, size_t n,
                       idvec *out, gap_fn gap) {
    size_t from = 0, done = 0, at;
    const pattern *p;
    while ((p = match_find(ms, s, n, from, &at))) {
        size_t st = at, en = at + p->len;
        from = en;
        if (p->t->single_word) {
            int start_ok = st == 0 || !is_word(utf8_prev(s, st));
            uint32_t c = 0;
            int stop_ok = en == n || utf8_next(s + en, n - en, &c) < 0 || !is_word(c);
            if (!start_ok || !stop_ok) continue;
        }
        if (p->t->lstrip) {
            while (st > done) {
                size_t b = st;
                while (b > done && ((unsigned char)s[b - 1] & 0xC0) == 0x80) b--;
                if (b > done) b--;
                uint32_t c;
                if (utf8_next(s + b, st - b, &c) < 0 || !is_ws(c)) break;
                st = b;
            }
        }
        if (p->t->rstrip) {
            uint32_t c;
            int k;
            while (en < n && (k = utf8_next(s + en, n - en, &c)) > 0 && is_ws(c)) en += (size_t)k;
            if (from < en) from = en;
        }
        if (done < st && gap(t, w, s + done, st - done, out) < 0) return -1;
        idvec_push(out, p->t->id);
        done = en;
    }
    if (done < n && gap(t, w, s + done, n - done, out) < 0) return -1;
    return 0;
}

static char *normalize(const dt_tokenizer *t, const char *s, size_t n, size_t *outn) {
    char *cur = dt_malloc(n + 1);
    memcpy(cur, s, n);
    cur[n] = 0;
    for (int i = 0; i < t->nnorm; i++) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)n, &dst, t->norm[i]);
        free(cur);
        if (k < 0) {
            free(dst);
            dt_set_error("tokenizer: text is not valid UTF-8 (%s)", utf8proc_errmsg(k));
            return NULL;
        }
        cur = (char *)dst;
        n = (size_t)k;
    }
    *outn = n;
    return cur;
}

static int encode_normalized_piece(const dt_tokenizer *t, workspace *w, const char *s, size_t n, idvec *out) {
    return encode_pretokens(t, w, s, n, out);
}

/* A piece of raw text between raw-matched added tokens: normalize, then split on normalized tokens. */
static int encode_raw_piece(const dt_tokenizer *t, workspace *w, const char *s, size_t n, idvec *out) {
    if (n == 0) return 0;
    if (!t->nnorm) return split_added(t, w, &t->norm_set, s, n, out, encode_normalized_piece);
    size_t nn;
    char *ns = normalize(t, s, n, &nn);
    if (!ns) return -1;
    int rc = split_added(t, w, &t->norm_set, ns, nn, out, encode_normalized_piece);
    free(ns);
    return rc;
}

static int encode_text(const dt_tokenizer *t, const char *text, idvec *out) {
    size_t n = strlen(text);
    if (n > (size_t)INT_MAX / 4) { dt_set_error("tokenizer: text too long (%zu bytes)", n); return -1; }
    workspace w;
    memset(&w, 0, sizeof w);
    int rc = split_added(t, &w, &t->raw_set, text, n, out, encode_raw_piece);
    ws_free(&w);
    return rc;
}

/* ---------------------------------------------------------------- public encode API */

int dt_tokenize(const dt_tokenizer *t, const char *text, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (!t || !text) { dt_set_error("dt_tokenize: no tokenizer or text"); return -1; }
    idvec v = {0};
    for (int i = 0; i < t->npre; i++) idvec_push(&v, t->pre_ids[i]);
    if (encode_text(t, text, &v) < 0) { free(v.v); return -1; }
    for (int i = 0; i < t->npost; i++) idvec_push(&v, t->post_ids[i]);
    *ids = v.v;
    *n = (int)v.n;
    return 0;
}

static int pad_into(const dt_tokenizer *t, const int32_t *pre, int npre, const int32_t *in, int n,
                    const int32_t *post, int npost, int max_len, int32_t *ids, int32_t *mask) {
    if (max_len < 1) { dt_set_error("tokenizer: max_length must be >= 1 (got %d)", max_len); return -1; }
    /* like tokenizers' truncation: the sequence is cut so that it fits with the special tokens */
    int room = max_len - npre - npost;
    if (room < 0) room = 0;
    int keep = n < room ? n : room;
    const int32_t *src = t->trunc_left ? in + (n - keep) : in;
    int32_t *seq = dt_malloc((size_t)(npre + keep + npost + 1) * sizeof *seq);
    int k = 0;
    for (int i = 0; i < npre; i++) seq[k++] = pre[i];
    for (int i = 0; i < keep; i++) seq[k++] = src[i];
    for (int i = 0; i < npost; i++) seq[k++] = post[i];
    if (k > max_len) {                 /* special tokens alone exceed max_len: cut them too */
        if (t->trunc_left) memmove(seq, seq + (k - max_len), (size_t)max_len * sizeof *seq);
        k = max_len;
    }
    if (k < max_len && t->pad_id < 0) {
        free(seq);
        dt_set_error("%s: padding needs a pad token, and none is known (no pad_token in tokenizer_config.json, "
                     "no " DEFAULT_PAD " added token)", t->path);
        return -1;
    }
    int pads = max_len - k, o = t->pad_left ? pads : 0;
    for (int i = 0; i < max_len; i++) { ids[i] = t->pad_id; if (mask) mask[i] = 0; }
    for (int i = 0; i < k; i++) { ids[o + i] = seq[i]; if (mask) mask[o + i] = 1; }
    free(seq);
    return k;
}

int dt_tokenizer_pad(const dt_tokenizer *t, const int32_t *in, int n, int max_len, int32_t *ids, int32_t *mask) {
    if (!t || (n > 0 && !in) || n < 0 || !ids) { dt_set_error("dt_tokenizer_pad: bad arguments"); return -1; }
    return pad_into(t, NULL, 0, in, n, NULL, 0, max_len, ids, mask);
}

int dt_tokenize_chat(const dt_tokenizer *t, const char *prompt, int max_len, int32_t *ids, int32_t *mask) {
    static const char head[] = "<|im_start|>user\n";
    static const char tail[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    if (!t || !prompt || !ids) { dt_set_error("dt_tokenize_chat: bad arguments"); return -1; }
    if (max_len < 1) { dt_set_error("tokenizer: max_length must be >= 1 (got %d)", max_len); return -1; }
    size_t pl = strlen(prompt);
    char *text = dt_malloc(sizeof head + pl + sizeof tail);
    memcpy(text, head, sizeof head - 1);
    memcpy(text + sizeof head - 1, prompt, pl);
    memcpy(text + sizeof head - 1 + pl, tail, sizeof tail);
    idvec v = {0};
    int rc = encode_text(t, text, &v);
    free(text);
    if (rc < 0) { free(v.v); return -1; }
    rc = pad_into(t, t->pre_ids, t->npre, v.v, (int)v.n, t->post_ids, t->npost, max_len, ids, mask);
    free(v.v);
    return rc;
}

int dt_tokenizer_token_id(const dt_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t id = strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : strmap_get(&t->vocab, token, n);
}

int dt_tokenizer_pad_id(const dt_tokenizer *t) { return t ? t->pad_id : -1; }
int dt_tokenizer_vocab_size(const dt_tokenizer *t) { return t ? t->vocab_size : 0; }

/* ---------------------------------------------------------------- loading */

static void matchset_free(matchset *ms) {
    free(ms->p);
    for (size_t i = 0; i < ms->nowned; i++) free(ms->owned[i]);
    free(ms->owned);
    memset(ms, 0, sizeof *ms);
}

void dt_tokenizer_free(dt_tokenizer *t) {
    if (!t) return;
    strmap_free(&t->vocab);
    strmap_free(&t->added_map);
    free(t->merges.slots);
    for (size_t i = 0; i < t->nadded; i++) free(t->added[i].content);
    free(t->added);
    matchset_free(&t->raw_set);
    matchset_free(&t->norm_set);
    free(t->pre_ids);
    free(t->post_ids);
    free(t->path);
    free(t);
}

static int cmp_pattern(const void *a, const void *b) {
    const pattern *x = a, *y = b;
    unsigned char cx = (unsigned char)x->s[0], cy = (unsigned char)y->s[0];
    if (cx != cy) return cx < cy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;   /* longest first */
    return x->t < y->t ? -1 : x->t > y->t;                    /* stable: file order */
}

static void matchset_build(matchset *ms) {
    qsort(ms->p, ms->n, sizeof *ms->p, cmp_pattern);
    size_t k = 0;
    for (int c = 0; c <= 256; c++) {
        while (k < ms->n && (unsigned char)ms->p[k].s[0] < c) k++;
        ms->start[c] = c == 256 ? ms->n : k;
    }
}

static int parse_normalizer(dt_tokenizer *t, const json *n) {
    if (!n || n->type == JSON_NULL) return 0;
    if (n->type != JSON_OBJECT) { dt_set_error("%s: \"normalizer\" is not an object", t->path); return -1; }
    const char *type = json_get_str(n, "type");
    if (!type) { dt_set_error("%s: normalizer without a \"type\"", t->path); return -1; }
    if (!strcmp(type, "Sequence")) {
        const json *list = json_get(n, "normalizers");
        if (!list || list->type != JSON_ARRAY) {
            dt_set_error("%s: Sequence normalizer without a \"normalizers\" list", t->path);
            return -1;
        }
        for (size_t i = 0; i < list->len; i++)
            if (parse_normalizer(t, list->items[i]) < 0) return -1;
        return 0;
    }
    utf8proc_option_t o;
    if (!strcmp(type, "NFC")) o = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(type, "NFD")) o = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(type, "NFKC")) o = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(type, "NFKD")) o = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else {
        dt_set_error("%s: unsupported normalizer type '%s' (supported: NFC, NFD, NFKC, NFKD, Sequence)", t->path, type);
        return -1;
    }
    if (t->nnorm == MAX_NORM) { dt_set_error("%s: too many normalizers", t->path); return -1; }
    t->norm[t->nnorm++] = o;
    return 0;
}

/* Pre-tokenizer: [Split(Qwen2 regex, Isolated)] then ByteLevel(add_prefix_space=false, use_regex=false). */
static int parse_pretok_one(dt_tokenizer *t, const json *p, int *seen_bytelevel) {
    if (!p || p->type != JSON_OBJECT) { dt_set_error("%s: pre-tokenizer entry is not an object", t->path); return -1; }
    const char *type = json_get_str(p, "type");
    if (!type) { dt_set_error("%s: pre-tokenizer without a \"type\"", t->path); return -1; }
    if (*seen_bytelevel) {
        dt_set_error("%s: pre-tokenizer '%s' after ByteLevel is not supported", t->path, type);
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        const json *list = json_get(p, "pretokenizers");
        if (!list || list->type != JSON_ARRAY) {
            dt_set_error("%s: Sequence pre-tokenizer without a \"pretokenizers\" list", t->path);
            return -1;
        }
        for (size_t i = 0; i < list->len; i++)
            if (parse_pretok_one(t, list->items[i], seen_bytelevel) < 0) return -1;
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const json *pat = json_get(p, "pattern");
        const char *re = pat ? json_get_str(pat, "Regex") : NULL;
        const char *beh = json_get_str(p, "behavior");
        if (t->split) { dt_set_error("%s: more than one Split pre-tokenizer is not supported", t->path); return -1; }
        if (!re) { dt_set_error("%s: Split pre-tokenizer without a \"pattern\": {\"Regex\": ...}", t->path); return -1; }
        if (!strcmp(re, QWEN2_REGEX)) t->max_digits = 1;
        else if (!strcmp(re, CL100K_REGEX)) t->max_digits = 3;
        else {
            dt_set_error("%s: unsupported Split regex (only the Qwen2 pattern is implemented): %.120s", t->path, re);
            return -1;
        }
        if (!beh || strcmp(beh, "Isolated")) {
            dt_set_error("%s: Split pre-tokenizer behavior '%s' is not supported (only Isolated)", t->path,
                         beh ? beh : "(none)");
            return -1;
        }
        if (json_get_bool(p, "invert", 0)) { dt_set_error("%s: Split with invert=true is not supported", t->path); return -1; }
        t->split = 1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_get_bool(p, "add_prefix_space", 0)) {
            dt_set_error("%s: ByteLevel add_prefix_space=true is not supported", t->path);
            return -1;
        }
        if (json_get_bool(p, "use_regex", 1)) {
            dt_set_error("%s: ByteLevel use_regex=true (GPT-2 split) is not supported; the Qwen2 Split must precede it",
                         t->path);
            return -1;
        }
        *seen_bytelevel = 1;
        return 0;
    }
    dt_set_error("%s: unsupported pre-tokenizer type '%s' (supported: Sequence, Split, ByteLevel)", t->path, type);
    return -1;
}

static int special_ids(dt_tokenizer *t, const json *specials, const char *name, int32_t **arr, int *n) {
    const json *sp = specials ? json_get(specials, name) : NULL;
    const json *ids = sp ? json_get(sp, "ids") : NULL;
    if (!ids || ids->type != JSON_ARRAY) {
        dt_set_error("%s: TemplateProcessing special token '%s' has no \"ids\"", t->path, name);
        return -1;
    }
    for (size_t i = 0; i < ids->len; i++) {
        const json *x = ids->items[i];
        if (x->type != JSON_NUMBER || !x->is_integer || x->integer < 0 || x->integer > INT32_MAX) {
            dt_set_error("%s: TemplateProcessing special token '%s' has a bad id", t->path, name);
            return -1;
        }
        *arr = dt_realloc(*arr, (size_t)(*n + 1) * sizeof **arr);
        (*arr)[(*n)++] = (int32_t)x->integer;
    }
    return 0;
}

static int parse_post(dt_tokenizer *t, const json *p) {
    if (!p || p->type == JSON_NULL) return 0;
    const char *type = p->type == JSON_OBJECT ? json_get_str(p, "type") : NULL;
    if (!type) { dt_set_error("%s: post_processor without a \"type\"", t->path); return -1; }
    if (!strcmp(type, "ByteLevel")) return 0;                /* only touches offsets */
    if (!strcmp(type, "Sequence")) {
        const json *list = json_get(p, "processors");
        if (!list || list->type != JSON_ARRAY) {
            dt_set_error("%s: Sequence post_processor without a \"processors\" list", t->path);
            return -1;
        }
        for (size_t i = 0; i < list->len; i++)
            if (parse_post(t, list->items[i]) < 0) return -1;
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const json *single = json_get(p, "single"), *specials = json_get(p, "special_tokens");
        if (!single || single->type != JSON_ARRAY) {
            dt_set_error("%s: TemplateProcessing without a \"single\" template", t->path);
            return -1;
        }
        if (t->npre || t->npost) { dt_set_error("%s: more than one TemplateProcessing", t->path); return -1; }
        int seen_a = 0;
        for (size_t i = 0; i < single->len; i++) {
            const json *it = single->items[i], *seq = json_get(it, "Sequence"), *sp = json_get(it, "SpecialToken");
            if (seq) {
                const char *id = json_get_str(seq, "id");
                if (!id || strcmp(id, "A") || seen_a) {
                    dt_set_error("%s: TemplateProcessing \"single\" must hold sequence A once", t->path);
                    return -1;
                }
                seen_a = 1;
            } else if (sp && json_get_str(sp, "id")) {
                if (special_ids(t, specials, json_get_str(sp, "id"), seen_a ? &t->post_ids : &t->pre_ids,
                                seen_a ? &t->npost : &t->npre) < 0)
                    return -1;
            } else {
                dt_set_error("%s: TemplateProcessing \"single\" has an unknown piece", t->path);
                return -1;
            }
        }
        if (!seen_a) { dt_set_error("%s: TemplateProcessing \"single\" has no sequence A", t->path); return -1; }
        return 0;
    }
    dt_set_error("%s: unsupported post_processor type '%s' (supported: ByteLevel, TemplateProcessing, Sequence)",
                 t->path, type);
    return -1;
}

/* Look a token up by string in a JSON string of known length. */
static int32_t vocab_get(const dt_tokenizer *t, const char *s, size_t n) { return strmap_get(&t->vocab, s, n); }

static int parse_merges(dt_tokenizer *t, const json *merges) {
    mergemap_init(&t->merges, merges->len);
    char *buf = NULL;
    size_t bcap = 0;
    for (size_t r = 0; r < merges->len; r++) {
        const json *m = merges->items[r];
        const char *a, *b;
        size_t la, lb;
        if (m->type == JSON_STRING) {
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str))) {
                free(buf);
                dt_set_error("%s: merge #%zu \"%.60s\" is not two tokens separated by one space", t->path, r, m->str);
                return -1;
            }
            a = m->str; la = (size_t)(sp - m->str);
            b = sp + 1; lb = m->len - la - 1;
        } else if (m->type == JSON_ARRAY && m->len == 2 && m->items[0]->type == JSON_STRING &&
                   m->items[1]->type == JSON_STRING) {
            a = m->items[0]->str; la = m->items[0]->len;
            b = m->items[1]->str; lb = m->items[1]->len;
        } else {
            free(buf);
            dt_set_error("%s: merge #%zu is neither \"a b\" nor [\"a\", \"b\"]", t->path, r);
            return -1;
        }
        int32_t ia = vocab_get(t, a, la), ib = vocab_get(t, b, lb);
        if (bcap < la + lb + 1) { bcap = 2 * (la + lb + 1); buf = dt_realloc(buf, bcap); }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        buf[la + lb] = 0;
        int32_t inew = vocab_get(t, buf, la + lb);
        if (ia < 0 || ib < 0 || inew < 0) {
            const char *missing = ia < 0 ? a : ib < 0 ? b : buf;
            dt_set_error("%s: merge #%zu refers to a token that is not in the vocabulary: \"%.60s\"", t->path, r,
                         missing);
            free(buf);
            return -1;
        }
        if (r > INT32_MAX) { free(buf); dt_set_error("%s: too many merges", t->path); return -1; }
        mergemap_put(&t->merges, ia, ib, (int32_t)r, inew);
    }
    free(buf);
    return 0;
}

static int parse_model(dt_tokenizer *t, const json *model) {
    if (!model || model->type != JSON_OBJECT) { dt_set_error("%s: no \"model\" object", t->path); return -1; }
    const char *type = json_get_str(model, "type");
    const json *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    if (type && strcmp(type, "BPE")) {
        dt_set_error("%s: unsupported model type '%s' (only byte-level BPE is implemented)", t->path, type);
        return -1;
    }
    if (!vocab || vocab->type != JSON_OBJECT) { dt_set_error("%s: model has no \"vocab\" object", t->path); return -1; }
    if (!merges || merges->type != JSON_ARRAY) { dt_set_error("%s: model has no \"merges\" list", t->path); return -1; }
    const json *dropout = json_get(model, "dropout");
    if (dropout && dropout->type == JSON_NUMBER && dropout->number > 0 && dropout->number < 1) {
        dt_set_error("%s: BPE dropout is not supported", t->path);
        return -1;
    }
    const char *cont = json_get_str(model, "continuing_subword_prefix"), *eow = json_get_str(model, "end_of_word_suffix");
    if ((cont && *cont) || (eow && *eow)) {
        dt_set_error("%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", t->path);
        return -1;
    }
    if (json_get_bool(model, "byte_fallback", 0)) { dt_set_error("%s: BPE byte_fallback is not supported", t->path); return -1; }
    t->fuse_unk = json_get_bool(model, "fuse_unk", 0);
    t->ignore_merges = json_get_bool(model, "ignore_merges", 0);

    strmap_init(&t->vocab, vocab->len);
    for (size_t i = 0; i < vocab->len; i++) {
        const json *v = vocab->items[i];
        if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer >= INT32_MAX) {
            dt_set_error("%s: vocab entry \"%.60s\" has no valid id", t->path, vocab->keys[i]);
            return -1;
        }
        strmap_put(&t->vocab, vocab->keys[i], strlen(vocab->keys[i]), (int32_t)v->integer);
        if ((int32_t)v->integer + 1 > t->vocab_size) t->vocab_size = (int32_t)v->integer + 1;
    }
    t->unk_id = -1;
    const char *unk = json_get_str(model, "unk_token");
    if (unk) {
        t->unk_id = vocab_get(t, unk, strlen(unk));
        if (t->unk_id < 0) { dt_set_error("%s: unk_token \"%.60s\" is not in the vocabulary", t->path, unk); return -1; }
    }
    return parse_merges(t, merges);
}

static int parse_added(dt_tokenizer *t, const json *list) {
    strmap_init(&t->added_map, list ? list->len : 0);
    if (!list || list->type == JSON_NULL) return 0;
    if (list->type != JSON_ARRAY) { dt_set_error("%s: \"added_tokens\" is not a list", t->path); return -1; }
    t->added = dt_calloc(list->len + 1, sizeof *t->added);
    for (size_t i = 0; i < list->len; i++) {
        const json *a = list->items[i], *c = json_get(a, "content");
        int64_t id = json_get_int(a, "id", -1);
        if (!c || c->type != JSON_STRING || id < 0 || id >= INT32_MAX) {
            dt_set_error("%s: added_tokens[%zu] needs a string \"content\" and an integer \"id\"", t->path, i);
            return -1;
        }
        added_tok *x = &t->added[t->nadded];
        x->content = dt_malloc(c->len + 1);
        memcpy(x->content, c->str, c->len + 1);
        x->len = c->len;
        x->id = (int32_t)id;
        x->single_word = json_get_bool(a, "single_word", 0);
        x->lstrip = json_get_bool(a, "lstrip", 0);
        x->rstrip = json_get_bool(a, "rstrip", 0);
        x->special = json_get_bool(a, "special", 0);
        x->normalized = json_get_bool(a, "normalized", !x->special);
        t->nadded++;
        strmap_put(&t->added_map, x->content, x->len, x->id);
        if (x->id + 1 > t->vocab_size) t->vocab_size = x->id + 1;
    }
    return 0;
}

/* Build the raw and normalized matching sets (normalized tokens are matched in their normalized form). */
static int build_matchsets(dt_tokenizer *t) {
    t->raw_set.p = dt_calloc(t->nadded + 1, sizeof(pattern));
    t->norm_set.p = dt_calloc(t->nadded + 1, sizeof(pattern));
    t->norm_set.owned = dt_calloc(t->nadded + 1, sizeof(char *));
    for (size_t i = 0; i < t->nadded; i++) {
        const added_tok *x = &t->added[i];
        if (!x->len) continue;
        if (!x->normalized) {
            t->raw_set.p[t->raw_set.n++] = (pattern){x->content, x->len, x};
            continue;
        }
        size_t nn = x->len;
        char *ns = normalize(t, x->content, x->len, &nn);
        if (!ns) { dt_set_error("%s: added token %d is not valid UTF-8", t->path, x->id); return -1; }
        t->norm_set.owned[t->norm_set.nowned++] = ns;
        if (nn) t->norm_set.p[t->norm_set.n++] = (pattern){ns, nn, x};
    }
    matchset_build(&t->raw_set);
    matchset_build(&t->norm_set);
    return 0;
}

/* ByteLevel alphabet (GPT-2's bytes_to_unicode): printable bytes stand for themselves, the others
 * are mapped in order to U+0100 and up. */
static void build_byte_table(dt_tokenizer *t) {
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + extra++);
        char *o = t->byte_chr[b];
        if (cp < 0x80) { o[0] = (char)cp; o[1] = 0; }
        else { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); o[2] = 0; }
        t->byte_id[b] = vocab_get(t, o, strlen(o));
    }
}

static const char *token_content(const json *v) {
    if (!v) return NULL;
    if (v->type == JSON_STRING) return v->str;
    if (v->type == JSON_OBJECT) return json_get_str(v, "content");
    return NULL;
}

static int parse_side(const json *cfg, const char *key, const char *cfgpath, int *left) {
    const char *s = json_get_str(cfg, key);
    if (!s) return 0;
    if (!strcmp(s, "left")) *left = 1;
    else if (!strcmp(s, "right")) *left = 0;
    else { dt_set_error("%s: %s must be \"left\" or \"right\" (got \"%s\")", cfgpath, key, s); return -1; }
    return 0;
}

static int load_config(dt_tokenizer *t, const char *cfgpath) {
    t->pad_id = -1;
    const char *pad = NULL;
    json *cfg = NULL;
    struct stat st;
    if (cfgpath && stat(cfgpath, &st) == 0) {
        cfg = json_parse_file(cfgpath);
        if (!cfg) return -1;
        if (cfg->type != JSON_OBJECT) { json_free(cfg); dt_set_error("%s: not a JSON object", cfgpath); return -1; }
        if (parse_side(cfg, "padding_side", cfgpath, &t->pad_left) < 0 ||
            parse_side(cfg, "truncation_side", cfgpath, &t->trunc_left) < 0) {
            json_free(cfg);
            return -1;
        }
        pad = token_content(json_get(cfg, "pad_token"));
        if (pad) {
            t->pad_id = dt_tokenizer_token_id(t, pad);
            if (t->pad_id < 0) {
                dt_set_error("%s: pad_token \"%.60s\" is not a known token", cfgpath, pad);
                json_free(cfg);
                return -1;
            }
        }
    }
    json_free(cfg);
    if (t->pad_id < 0) t->pad_id = strmap_get(&t->added_map, DEFAULT_PAD, strlen(DEFAULT_PAD));
    return 0;
}

dt_tokenizer *dt_tokenizer_load(const char *dir_or_file) {
    if (!dir_or_file || !*dir_or_file) { dt_set_error("tokenizer: no path given"); return NULL; }
    int kind = dt_input_kind(dir_or_file);   /* 0 file, 1 folder; a FIFO, a loop or a missing path: an error */
    if (kind < 0) return NULL;
    size_t pl = strlen(dir_or_file);
    char *file, *cfg;
    if (kind == 1) {
        file = dt_malloc(pl + 32);
        cfg = dt_malloc(pl + 32);
        snprintf(file, pl + 32, "%s/tokenizer.json", dir_or_file);
        snprintf(cfg, pl + 32, "%s/tokenizer_config.json", dir_or_file);
    } else {
        file = dt_strdup(dir_or_file);
        cfg = dt_malloc(pl + 32);
        const char *slash = strrchr(dir_or_file, '/');
        if (slash) snprintf(cfg, pl + 32, "%.*s/tokenizer_config.json", (int)(slash - dir_or_file), dir_or_file);
        else snprintf(cfg, pl + 32, "tokenizer_config.json");
    }
    dt_tokenizer *t = dt_calloc(1, sizeof *t);
    t->path = file;
    t->max_digits = 1;
    t->unk_id = -1;
    t->pad_id = -1;
    json *root = json_parse_file(file);
    int ok = root != NULL;
    if (ok && root->type != JSON_OBJECT) { dt_set_error("%s: not a JSON object", file); ok = 0; }
    if (ok) ok = parse_model(t, json_get(root, "model")) == 0;
    if (ok) ok = parse_added(t, json_get(root, "added_tokens")) == 0;
    if (ok) ok = parse_normalizer(t, json_get(root, "normalizer")) == 0;
    if (ok) {
        const json *pre = json_get(root, "pre_tokenizer");
        int seen_bl = 0;
        if (!pre || pre->type == JSON_NULL) {
            dt_set_error("%s: no pre_tokenizer (only byte-level BPE with the Qwen2 split is supported)", file);
            ok = 0;
        } else {
            ok = parse_pretok_one(t, pre, &seen_bl) == 0;
            if (ok && !seen_bl) {
                dt_set_error("%s: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)", file);
                ok = 0;
            }
        }
    }
    if (ok) ok = parse_post(t, json_get(root, "post_processor")) == 0;
    /* "truncation" / "padding" in tokenizer.json are ignored: transformers overrides them per call. */
    json_free(root);
    if (ok) { build_byte_table(t); ok = build_matchsets(t) == 0; }
    if (ok) ok = load_config(t, cfg) == 0;
    free(cfg);
    if (!ok) { dt_tokenizer_free(t); return NULL; }
    return t;
}
