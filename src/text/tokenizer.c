/* tokenizer.c — byte-level BPE encoding with a loaded Hugging Face tokenizer (Qwen2/Qwen3 family;
 * tokenizer_load.c reads tokenizer.json): added-token splitting, utf8proc normalization, the Qwen2 split regex as a
 * hand-written matcher, ByteLevel mapping, rank-ordered BPE merges with a binary heap, padding and the Qwen3 chat
 * template. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer_internal.h"

#include <limits.h>
#include <stdio.h>

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

char *tok_normalize(const dt_tokenizer *t, const char *s, size_t n, size_t *outn) {
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
    char *ns = tok_normalize(t, s, n, &nn);
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

