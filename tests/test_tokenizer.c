/* test_tokenizer.c — the byte-level BPE tokenizer against the reference oracle: every case of
 * tokenizer_cases.json, the chat-templated pipeline prompt vs in.input_ids / in.attention_mask,
 * merges stored as "a b" strings, padding/truncation sides, a 150k-entry vocabulary load time,
 * long inputs, and clean errors for malformed or unsupported tokenizer.json files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "text/tokenizer.h"
#include "test.h"

/* Loading a 150k-token vocabulary + 150k merges must stay well under a second (brief: real Qwen
 * vocabularies); generous for a slow shared machine and sanitizer builds. */
#define LOAD_150K_MAX_S 3.0

static char tmpdir[256];

static void print_ids(const char *label, const int32_t *v, int n) {
    printf("    %s (%d):", label, n);
    for (int i = 0; i < n; i++) printf(" %d", v[i]);
    printf("\n");
}

/* Compare two id lists; on mismatch print both and the first differing index. */
static int same_ids(const char *name, const int32_t *got, int ng, const int32_t *want, int nw) {
    int k = 0;
    while (k < ng && k < nw && got[k] == want[k]) k++;
    if (k == ng && k == nw) return 1;
    T_FAIL(name, "first mismatch at index %d (got %d ids, want %d)", k, ng, nw);
    print_ids("got ", got, ng);
    print_ids("want", want, nw);
    return 0;
}

static int write_all(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(s, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Every case of tokenizer_cases.json against a loaded tokenizer. Returns the number of failures. */
static int run_cases(const dt_tokenizer *tok, const json *cases, const char *prefix) {
    int fails = 0;
    for (size_t i = 0; i < cases->len; i++) {
        const json *c = cases->items[i];
        const char *text = json_get_str(c, "text");
        const json *want = json_get(c, "ids");
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, cases->keys[i]);
        if (!text || !want || want->type != JSON_ARRAY) { T_FAIL(name, "malformed case"); fails++; continue; }
        int32_t *w = malloc((want->len + 1) * sizeof *w);
        for (size_t k = 0; k < want->len; k++) w[k] = (int32_t)want->items[k]->integer;
        int32_t *ids = NULL;
        int n = -1;
        if (dt_tokenize(tok, text, &ids, &n) != 0) {
            T_FAIL(name, "dt_tokenize failed: %s", dt_last_error());
            fails++;
        } else if (same_ids(name, ids, n, w, (int)want->len)) {
            T_PASS(name);
        } else {
            printf("    text: \"%s\"\n", text);
            fails++;
        }
        free(ids);
        free(w);
    }
    return fails;
}

/* Rewrite the merges of a tokenizer.json text from [["a","b"], ...] pairs to ["a b", ...] strings. */
static char *merges_to_strings(const char *src, size_t n, size_t *outn) {
    const char *m = NULL, *p = src;
    while ((p = strstr(p, "\"merges\""))) {
        const char *q = p + 8;
        while (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t' || *q == ':') q++;
        if (*q == '[') { m = q; break; }
        p = q;
    }
    if (!m) return NULL;
    char *out = malloc(n + 16);
    size_t o = (size_t)(m - src) + 1;
    memcpy(out, src, o);
    const char *s = m + 1;
#define SKIPWS() while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++
    for (;;) {
        SKIPWS();
        if (*s == ']') break;
        if (*s != '[') { free(out); return NULL; }
        s++;
        const char *str[2];
        size_t len[2];
        for (int k = 0; k < 2; k++) {
            SKIPWS();
            if (*s != '"') { free(out); return NULL; }
            str[k] = ++s;
            while (*s && *s != '"') s += (*s == '\\') ? 2 : 1;
            len[k] = (size_t)(s - str[k]);
            s++;
            SKIPWS();
            if (k == 0) { if (*s != ',') { free(out); return NULL; } s++; }
        }
        if (*s != ']') { free(out); return NULL; }
        s++;
        out[o++] = '"';
        memcpy(out + o, str[0], len[0]); o += len[0];
        out[o++] = ' ';
        memcpy(out + o, str[1], len[1]); o += len[1];
        out[o++] = '"';
        SKIPWS();
        if (*s == ',') { out[o++] = ','; s++; }
    }
#undef SKIPWS
    size_t rest = n - (size_t)(s - src);
    memcpy(out + o, s, rest);
    o += rest;
    out[o] = 0;
    *outn = o;
    return out;
}

static void check_load_error(const char *name, const char *content, const char *want_in_msg) {
    char path[300];
    snprintf(path, sizeof path, "%s/bad_%s.json", tmpdir, name);
    write_all(path, content, strlen(content));
    dt_clear_error();
    dt_tokenizer *t = dt_tokenizer_load(path);
    const char *e = dt_last_error();
    int ok = !t && strstr(e, path) && (!want_in_msg || strstr(e, want_in_msg));
    T_CHECK(name, ok, "%s: '%s'", t ? "accepted" : "bad message", t ? "" : e);
    dt_tokenizer_free(t);
}

/* Synthetic 150k vocabulary: the 256 ByteLevel characters, then lower-case strings of length 2..4 in
 * order; every string of length >= 2 gets the merge (prefix, last letter). */
static char *make_big_tokenizer(size_t *len, int *nvocab) {
    size_t cap = 16u << 20, o = 0;
    char *b = malloc(cap);
    o += (size_t)sprintf(b + o, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":%d,\"content\":\"<|endoftext|>\","
                                "\"special\":true,\"normalized\":false}],\"normalizer\":{\"type\":\"NFC\"},"
                                "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                                "\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                                "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                "\"trim_offsets\":false,\"use_regex\":false}]},\"post_processor\":null,"
                                "\"model\":{\"type\":\"BPE\",\"vocab\":{", 150000);
    int id = 0;
    for (int byte = 0, extra = 0; byte < 256; byte++) {
        int keep = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255);
        unsigned cp = keep ? (unsigned)byte : 256u + (unsigned)extra++;
        if (cp == '"' || cp == '\\') o += (size_t)sprintf(b + o, "\"\\%c\":%d,", (char)cp, id++);
        else if (cp < 0x80) o += (size_t)sprintf(b + o, "\"%c\":%d,", (char)cp, id++);
        else o += (size_t)sprintf(b + o, "\"%c%c\":%d,", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)), id++);
    }
    const int target = 150000;
    char w[8];
    int first_multi = id;
    for (int L = 2; L <= 4 && id < target; L++) {
        int total = 1;
        for (int k = 0; k < L; k++) total *= 26;
        for (int x = 0; x < total && id < target; x++) {
            int v = x;
            for (int k = L - 1; k >= 0; k--) { w[k] = (char)('a' + v % 26); v /= 26; }
            w[L] = 0;
            o += (size_t)sprintf(b + o, "\"%s\":%d,", w, id++);
        }
    }
    o--;  /* drop the last comma */
    o += (size_t)sprintf(b + o, "},\"merges\":[");
    int n2 = 0;
    for (int L = 2; L <= 4 && first_multi + n2 < id; L++) {
        int total = 1;
        for (int k = 0; k < L; k++) total *= 26;
        for (int x = 0; x < total && first_multi + n2 < id; x++, n2++) {
            int v = x;
            for (int k = L - 1; k >= 0; k--) { w[k] = (char)('a' + v % 26); v /= 26; }
            o += (size_t)sprintf(b + o, "%s\"%.*s %c\"", n2 ? "," : "", L - 1, w, w[L - 1]);
        }
    }
    o += (size_t)sprintf(b + o, "]}}");
    *len = o;
    *nvocab = id;
    return b;
}

int main(void) {
    char path[512];
    const char *fx = t_fixtures();
    if (t_tmpdir(tmpdir, sizeof tmpdir, "tokenizer")) { T_FAIL("mkdtemp", "cannot create a temp folder"); return T_DONE(); }

    snprintf(path, sizeof path, "%s/model/tokenizer", fx);
    double t0 = dt_now();
    dt_tokenizer *tok = dt_tokenizer_load(path);
    T_CHECK("load_fixture_dir", tok != NULL, "%s", dt_last_error());
    if (!tok) return T_DONE();
    printf("    loaded in %.3f ms\n", (dt_now() - t0) * 1e3);

    /* ---- oracle cases ---- */
    snprintf(path, sizeof path, "%s/tokenizer_cases.json", fx);
    json *cases = json_parse_file(path);
    T_CHECK("cases_json", cases && cases->type == JSON_OBJECT && cases->len > 0, "%s", dt_last_error());
    if (cases) run_cases(tok, cases, "case_");

    /* ---- token lookups ---- */
    T_CHECK("token_id", dt_tokenizer_token_id(tok, "<|im_start|>") == 701 && dt_tokenizer_token_id(tok, "</think>") == 704
            && dt_tokenizer_token_id(tok, "\xC4\xA0" "a") == 260 && dt_tokenizer_token_id(tok, "!") == 0
            && dt_tokenizer_token_id(tok, "no-such-token") == -1,
            "im_start %d, </think> %d, Ga %d", dt_tokenizer_token_id(tok, "<|im_start|>"),
            dt_tokenizer_token_id(tok, "</think>"), dt_tokenizer_token_id(tok, "\xC4\xA0" "a"));
    T_CHECK("pad_id", dt_tokenizer_pad_id(tok) == 700 && dt_tokenizer_vocab_size(tok) == 705, "pad %d vocab %d",
            dt_tokenizer_pad_id(tok), dt_tokenizer_vocab_size(tok));

    /* ---- pipeline case: chat template, max_length 32 ---- */
    snprintf(path, sizeof path, "%s/pipeline_case.json", fx);
    json *pc = json_parse_file(path);
    snprintf(path, sizeof path, "%s/pipeline_io.safetensors", fx);
    st_file *sf = st_open(path);
    const char *prompt = pc ? json_get_str(pc, "prompt") : NULL;
    int max_len = pc ? (int)json_get_int(pc, "max_sequence_length", 0) : 0;
    const st_tensor *ti = sf ? st_find(sf, "in.input_ids") : NULL, *tm = sf ? st_find(sf, "in.attention_mask") : NULL;
    if (!prompt || !ti || !tm || max_len != 32 || ti->numel != 32 || tm->numel != 32) {
        T_FAIL("chat_pipeline_case", "fixture missing: %s", dt_last_error());
    } else {
        float *fi = st_to_f32(ti), *fm = st_to_f32(tm);
        int32_t want_ids[32], want_mask[32], ids[32], mask[32];
        for (int i = 0; i < 32; i++) { want_ids[i] = (int32_t)fi[i]; want_mask[i] = (int32_t)fm[i]; }
        int nreal = dt_tokenize_chat(tok, prompt, 32, ids, mask);
        if (nreal < 0) T_FAIL("chat_pipeline_case", "%s", dt_last_error());
        else if (same_ids("chat_pipeline_ids", ids, 32, want_ids, 32)) T_PASS("chat_pipeline_ids");
        if (nreal >= 0 && same_ids("chat_pipeline_mask", mask, 32, want_mask, 32)) T_PASS("chat_pipeline_mask");
        free(fi); free(fm);

        /* the template text equals the case's chat_text, and padding beyond the template */
        const char *chat_text = json_get_str(pc, "chat_text");
        int32_t *raw = NULL;
        int nraw = 0;
        int rc = chat_text ? dt_tokenize(tok, chat_text, &raw, &nraw) : -1;
        int32_t ids64[64], mask64[64];
        int n64 = dt_tokenize_chat(tok, prompt, 64, ids64, mask64);
        int ok = rc == 0 && n64 == nraw && nraw < 64;
        for (int i = 0; ok && i < 64; i++)
            ok = i < nraw ? (ids64[i] == raw[i] && mask64[i] == 1) : (ids64[i] == 700 && mask64[i] == 0);
        T_CHECK("chat_padding_right", ok, "template %d ids, chat returned %d", nraw, n64);
        ok = rc == 0 && nraw > 32 && memcmp(ids, raw, 32 * sizeof *ids) == 0 && nreal == 32;
        T_CHECK("chat_truncation_right", ok, "real %d of %d", nreal, nraw);
        free(raw);
    }
    st_close(sf);

    /* ---- merges as "a b" strings: identical results ---- */
    size_t flen = 0, slen = 0;
    snprintf(path, sizeof path, "%s/model/tokenizer/tokenizer.json", fx);
    char *orig = t_slurp(path, &flen);
    char *strm = orig ? merges_to_strings(orig, flen, &slen) : NULL;
    char sdir[300], spath[400];
    snprintf(sdir, sizeof sdir, "%s/strmerges", tmpdir);
    mkdir(sdir, 0700);
    snprintf(spath, sizeof spath, "%s/tokenizer.json", sdir);
    dt_tokenizer *tok2 = NULL;
    if (!strm || write_all(spath, strm, slen) != 0) {
        T_FAIL("string_merges", "could not rewrite the fixture's merges");
    } else {
        T_CHECK("string_merges_rewritten", strstr(strm, "\"\xC4\xA0 \xC4\xA0\"") != NULL, "no \"a b\" merge found");
        tok2 = dt_tokenizer_load(spath);     /* the file itself; no tokenizer_config.json beside it */
        T_CHECK("string_merges_load", tok2 != NULL, "%s", dt_last_error());
        if (tok2 && cases) {
            int f = run_cases(tok2, cases, "string_merges_");
            T_CHECK("string_merges_all_cases", f == 0, "%d cases differ", f);
            int32_t a[40], am[40], b[40], bm[40];
            int na = dt_tokenize_chat(tok, "a red fox", 40, a, am), nb = dt_tokenize_chat(tok2, "a red fox", 40, b, bm);
            T_CHECK("string_merges_chat", na == nb && na > 0 && !memcmp(a, b, sizeof a) && !memcmp(am, bm, sizeof am),
                    "chat differs (%d vs %d)", na, nb);
        }
    }

    /* ---- tokenizer_config.json: left padding / left truncation ---- */
    if (tok2) {
        char cpath[400];
        snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", sdir);
        const char *cfg = "{\"pad_token\": {\"content\": \"<|im_end|>\"}, \"padding_side\": \"left\", \"truncation_side\": \"left\"}";
        write_all(cpath, cfg, strlen(cfg));
        dt_tokenizer *tl = dt_tokenizer_load(sdir);
        T_CHECK("config_load", tl != NULL, "%s", dt_last_error());
        if (tl) {
            int32_t *raw = NULL;
            int nraw = 0;
            dt_tokenize(tl, "hello world", &raw, &nraw);
            int32_t ids[16], mask[16];
            int n = dt_tokenizer_pad(tl, raw, nraw, 16, ids, mask);
            int ok = n == nraw && nraw < 16;
            for (int i = 0; ok && i < 16; i++) {
                int p = 16 - nraw;
                ok = i < p ? (ids[i] == 702 && mask[i] == 0) : (ids[i] == raw[i - p] && mask[i] == 1);
            }
            T_CHECK("config_left_padding", ok, "n %d raw %d", n, nraw);
            n = dt_tokenizer_pad(tl, raw, nraw, 2, ids, mask);
            T_CHECK("config_left_truncation", n == 2 && nraw > 2 && ids[0] == raw[nraw - 2] && ids[1] == raw[nraw - 1]
                    && mask[0] == 1 && mask[1] == 1, "n %d", n);
            free(raw);
            dt_tokenizer_free(tl);
        }
        cfg = "{\"pad_token\": \"<|nope|>\"}";
        write_all(cpath, cfg, strlen(cfg));
        dt_clear_error();
        tl = dt_tokenizer_load(sdir);
        T_CHECK("config_bad_pad_token", !tl && strstr(dt_last_error(), "tokenizer_config.json") &&
                strstr(dt_last_error(), "<|nope|>"), "%s", tl ? "accepted" : dt_last_error());
        dt_tokenizer_free(tl);
        unlink(cpath);
    }
    dt_tokenizer_free(tok2);
    unlink(spath);
    rmdir(sdir);
    free(strm);
    free(orig);

    /* ---- added tokens mid-word, invalid UTF-8, empty prompt ---- */
    {
        int32_t *ids = NULL;
        int n = 0;
        int rc = dt_tokenize(tok, "x<think>y</think><|im_end|><|im_end", &ids, &n);
        int ok = rc == 0 && n >= 5 && ids[1] == 703 && ids[3] == 704 && ids[4] == 702;
        T_CHECK("added_tokens_inside_text", ok, "rc %d n %d", rc, n);
        free(ids);
        ids = NULL;
        dt_clear_error();
        rc = dt_tokenize(tok, "bad \xC3\x28 utf8", &ids, &n);
        T_CHECK("invalid_utf8_rejected", rc < 0 && strstr(dt_last_error(), "UTF-8"), "rc %d: %s", rc, dt_last_error());
        free(ids);
        int32_t cids[32], cmask[32];
        int nc = dt_tokenize_chat(tok, "", 32, cids, cmask);
        T_CHECK("chat_empty_prompt", nc > 0 && nc < 32 && cids[0] == 701 && cmask[nc - 1] == 1 && cmask[nc] == 0
                && cids[nc] == 700, "n %d", nc);
        T_CHECK("chat_bad_max_len", dt_tokenize_chat(tok, "x", 0, cids, cmask) < 0, "max_len 0 accepted");
    }

    /* ---- long inputs: priority-queue BPE stays fast on a 200k-byte word and whitespace run ---- */
    {
        size_t L = 200000;
        char *s = malloc(L + 1);
        for (size_t i = 0; i < L; i++) s[i] = (i % 2) ? 'a' : 's';   /* "sasasa...": merges apply everywhere */
        s[L] = 0;
        int32_t *ids = NULL;
        int n = 0;
        double t1 = dt_now();
        int rc = dt_tokenize(tok, s, &ids, &n);
        free(ids);
        ids = NULL;
        memset(s, ' ', L);
        int rc2 = dt_tokenize(tok, s, &ids, &n);
        double dt = dt_now() - t1;
        int ok = rc == 0 && rc2 == 0 && n > 0 && n < (int)L / 4;   /* runs of spaces merge into multi-space tokens */
        T_CHECK("long_inputs", ok && dt < 2.0, "rc %d/%d, %d ids, %.3f s", rc, rc2, n, dt);
        printf("    2 x %zu bytes in %.1f ms\n", L, dt * 1e3);
        free(ids);
        free(s);
    }

    /* ---- malformed / unsupported files: clean errors naming the file ---- */
    check_load_error("not_json", "{\"model\": ", "JSON");
    check_load_error("missing_model", "{\"version\": \"1.0\", \"added_tokens\": []}", "model");
    check_load_error("unknown_model_type", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "WordPiece");
    check_load_error("unigram_model", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", "Unigram");
    check_load_error("merge_not_in_vocab",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]},"
                     "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": false}}", "merge #0");
    check_load_error("bad_merge_shape",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", "merge #0");
    check_load_error("unsupported_normalizer",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     "\"normalizer\": {\"type\": \"Lowercase\"}}", "Lowercase");
    check_load_error("unsupported_regex",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}}",
                     "Split regex");
    check_load_error("no_bytelevel",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     "\"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "Whitespace");
    check_load_error("unsupported_post",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": false},"
                     "\"post_processor\": {\"type\": \"BertProcessing\"}}", "BertProcessing");
    check_load_error("bad_added_token",
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     "\"added_tokens\": [{\"content\": 5}]}", "added_tokens[0]");
    dt_clear_error();
    T_CHECK("missing_path", !dt_tokenizer_load("/nonexistent/tok") && strstr(dt_last_error(), "/nonexistent/tok"),
            "%s", dt_last_error());

    /* ---- minimal tokenizer: ByteLevel only (no split), TemplateProcessing specials ---- */
    {
        const char *mini =
            "{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}],"
            "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false},"
            "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
            "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [3], \"tokens\": [\"<s>\"]}}},"
            "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\xC4\xA0\": 4}, \"merges\": [[\"a\", \"b\"]]}}";
        snprintf(path, sizeof path, "%s/mini.json", tmpdir);
        write_all(path, mini, strlen(mini));
        dt_tokenizer *tm2 = dt_tokenizer_load(path);
        T_CHECK("mini_load", tm2 != NULL, "%s", dt_last_error());
        if (tm2) {
            int32_t *ids = NULL;
            int n = 0;
            int rc = dt_tokenize(tm2, "abab a", &ids, &n);
            int32_t want[] = {3, 2, 2, 4, 0};
            if (rc == 0 && same_ids("mini_template_and_unknown", ids, n, want, 5)) T_PASS("mini_template_and_unknown");
            free(ids);
            dt_tokenizer_free(tm2);
        }
        unlink(path);
    }

    /* ---- a 150k-entry vocabulary with 150k string merges loads fast ---- */
    {
        size_t blen;
        int nv;
        char *big = make_big_tokenizer(&blen, &nv);
        snprintf(path, sizeof path, "%s/big.json", tmpdir);
        write_all(path, big, blen);
        free(big);
        double t1 = dt_now();
        dt_tokenizer *tb = dt_tokenizer_load(path);
        double dt = dt_now() - t1;
        T_CHECK("load_150k", tb != NULL && dt < LOAD_150K_MAX_S, "%s, %.3f s", tb ? "slow" : dt_last_error(), dt);
        printf("    %d tokens + merges (%.1f MB) loaded in %.1f ms\n", nv, blen / 1e6, dt * 1e3);
        if (tb) {
            int32_t *ids = NULL;
            int n = 0;
            dt_tokenize(tb, "abc zz", &ids, &n);
            int want_abcd = dt_tokenizer_token_id(tb, "abc"), want_zz = dt_tokenizer_token_id(tb, "zz");
            T_CHECK("big_vocab_encode", n == 3 && ids[0] == want_abcd && ids[2] == want_zz && want_abcd > 0,
                    "n %d", n);
            free(ids);
            dt_tokenizer_free(tb);
        }
        unlink(path);
    }

    json_free(cases);
    json_free(pc);
    dt_tokenizer_free(tok);
    t_rmtree(tmpdir);
    return T_DONE();
}
