/* tokenizer_load.c — a Hugging Face tokenizer.json (Qwen2/Qwen3 family) read into the tokenizer's tables: vocab
 * and merges hash tables, added tokens and their matching sets, normalizer, pre-tokenizer, post-processor, and
 * tokenizer_config.json's padding and truncation sides; every unsupported or malformed part is one error naming
 * the file. tokenizer.c encodes with the result. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer_internal.h"

#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "../core/infile.h"
#include "../io/json.h"

/* The Qwen2 pre-tokenizer regex, and the cl100k variant that differs only by \p{N}{1,3}. */
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char CL100K_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

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

/* The items of a Sequence node's list N[key] (a normalizer's, pre-tokenizer's or post_processor's parts); NULL with
 * the error set when the list is missing or not an array. */
static const json *sequence_items(const dt_tokenizer *t, const json *n, const char *key, const char *what) {
    const json *list = json_get(n, key);
    if (!list || list->type != JSON_ARRAY) {
        dt_set_error("%s: Sequence %s without a \"%s\" list", t->path, what, key);
        return NULL;
    }
    return list;
}

static int parse_normalizer(dt_tokenizer *t, const json *n) {
    if (!n || n->type == JSON_NULL) return 0;
    if (n->type != JSON_OBJECT) { dt_set_error("%s: \"normalizer\" is not an object", t->path); return -1; }
    const char *type = json_get_str(n, "type");
    if (!type) { dt_set_error("%s: normalizer without a \"type\"", t->path); return -1; }
    if (!strcmp(type, "Sequence")) {
        const json *list = sequence_items(t, n, "normalizers", "normalizer");
        if (!list) return -1;
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
        const json *list = sequence_items(t, p, "pretokenizers", "pre-tokenizer");
        if (!list) return -1;
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
        const json *list = sequence_items(t, p, "processors", "post_processor");
        if (!list) return -1;
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
        char *ns = tok_normalize(t, x->content, x->len, &nn);
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

