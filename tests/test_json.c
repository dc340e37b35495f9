/* test_json.c — the strict JSON parser: values, escapes and surrogates, nesting and the depth limit,
 * numbers (exact int64), lookups, and rejection of invalid input with a "WHAT: JSON error at byte N" message. */
#include <string.h>

#include "io/json.h"
#include "test.h"

static json *P(const char *s) { return json_parse(s, strlen(s), "t.json"); }

static void check_rejects(const char *name, const char *text, size_t len, const char *want_in_msg) {
    dt_clear_error();
    json *j = json_parse(text, len, "bad.json");
    const char *e = dt_last_error();
    int ok = !j && strstr(e, "bad.json: JSON error at byte ") && (!want_in_msg || strstr(e, want_in_msg));
    T_CHECK(name, ok, "accepted or bad message: '%s'", j ? "(accepted)" : e);
    json_free(j);
}

int main(void) {
    /* values */
    json *j = P(" {\"a\": 1, \"b\": -2.5e3, \"c\": true, \"d\": false, \"e\": null, \"f\": \"x\", \"g\": [1, [2, {}], []]} ");
    T_CHECK("json_object_values", j && j->type == JSON_OBJECT && j->len == 7, "parse failed: %s", dt_last_error());
    if (j) {
        T_CHECK("json_int", json_get_int(j, "a", 0) == 1 && json_get(j, "a")->is_integer, "a");
        T_CHECK("json_float", json_get_num(j, "b", 0) == -2500.0 && !json_get(j, "b")->is_integer
                && json_get_int(j, "b", 7) == 7, "b");
        T_CHECK("json_bool", json_get_bool(j, "c", 0) == 1 && json_get_bool(j, "d", 1) == 0 && json_get_bool(j, "zz", 5) == 5, "bools");
        T_CHECK("json_null", json_get(j, "e") && json_get(j, "e")->type == JSON_NULL && !json_get_str(j, "e"), "null");
        T_CHECK("json_string", json_get_str(j, "f") && strcmp(json_get_str(j, "f"), "x") == 0, "string");
        const json *g = json_get(j, "g");
        T_CHECK("json_nested", g && g->len == 3 && json_at(g, 1)->len == 2 && json_at(json_at(g, 1), 1)->type == JSON_OBJECT
                && json_at(g, 2)->len == 0 && !json_at(g, 3), "nesting");
        T_CHECK("json_wrong_type_default", json_get_num(j, "f", 3.0) == 3.0 && !json_get_str(j, "a") && !json_get(g, "x"), "types");
    }
    json_free(j);

    /* keys keep file order; duplicates: first wins */
    j = P("{\"z\":1,\"a\":2,\"z\":3}");
    T_CHECK("json_key_order_dup_first", j && j->len == 3 && strcmp(j->keys[0], "z") == 0 && json_get_int(j, "z", 0) == 1, "dup");
    json_free(j);

    /* escapes, \u, surrogate pairs, embedded NUL */
    j = P("\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9 \\u20AC \\ud83d\\ude00 \\u0000end\"");
    const char want[] = "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \0end";
    T_CHECK("json_escapes_utf8", j && j->type == JSON_STRING && j->len == sizeof want - 1 && memcmp(j->str, want, j->len) == 0,
            "got len %zu", j ? j->len : 0);
    json_free(j);
    j = P("\"h\xc3\xa9llo \xe4\xb8\xad \xf0\x9f\x98\x80\"");
    T_CHECK("json_raw_utf8", j && strcmp(j->str, "h\xc3\xa9llo \xe4\xb8\xad \xf0\x9f\x98\x80") == 0, "raw utf8");
    json_free(j);

    /* numbers */
    j = P("[0, -0, 9007199254740993, -9223372036854775808, 9223372036854775807, 9223372036854775808, 1.5, 1e2, 2E-2, -0.0]");
    int ok = j && j->len == 10;
    if (ok) {
        ok = json_at(j, 0)->is_integer && json_at(j, 0)->integer == 0 && json_at(j, 1)->is_integer &&
             json_at(j, 2)->integer == 9007199254740993LL && json_at(j, 3)->integer == INT64_MIN &&
             json_at(j, 4)->integer == INT64_MAX && !json_at(j, 5)->is_integer && json_at(j, 5)->number == 9223372036854775808.0 &&
             json_at(j, 6)->number == 1.5 && !json_at(j, 7)->is_integer && json_at(j, 7)->number == 100.0 &&
             fabs(json_at(j, 8)->number - 0.02) < 1e-17 && !json_at(j, 9)->is_integer;
    }
    T_CHECK("json_numbers", ok, "number parsing");
    json_free(j);

    /* depth: exactly JSON_MAX_DEPTH nested arrays is fine, one more is rejected */
    {
        char buf[2 * (JSON_MAX_DEPTH + 2)];
        for (int d = 0; d < 2; d++) {
            int n = JSON_MAX_DEPTH + d;
            for (int i = 0; i < n; i++) buf[i] = '[';
            for (int i = 0; i < n; i++) buf[n + i] = ']';
            dt_clear_error();
            json *x = json_parse(buf, 2 * (size_t)n, "deep.json");
            if (d == 0) T_CHECK("json_depth_limit_ok", x != NULL, "%s", dt_last_error());
            else T_CHECK("json_depth_limit_exceeded", !x && strstr(dt_last_error(), "deep.json: JSON error at byte") &&
                         strstr(dt_last_error(), "deep"), "%s", dt_last_error());
            json_free(x);
        }
    }

    /* not NUL-terminated input: parse only len bytes */
    {
        const char buf[] = {'1', '2', '3', '4'};
        json *x = json_parse(buf, 2, "n.json");
        T_CHECK("json_len_bounded", x && x->integer == 12, "len");
        json_free(x);
    }

    /* invalid inputs */
    check_rejects("json_rej_empty", "", 0, "byte 0");
    check_rejects("json_rej_ws_only", "   ", 3, NULL);
    check_rejects("json_rej_trailing_comma_arr", "[1,]", 4, NULL);
    check_rejects("json_rej_trailing_comma_obj", "{\"a\":1,}", 8, NULL);
    check_rejects("json_rej_single_quotes", "{'a':1}", 7, NULL);
    check_rejects("json_rej_unquoted_key", "{a:1}", 5, NULL);
    check_rejects("json_rej_leading_zero", "01", 2, "leading zero");
    check_rejects("json_rej_plus", "+1", 2, NULL);
    check_rejects("json_rej_dot", "1.", 2, NULL);
    check_rejects("json_rej_exp", "1e", 2, NULL);
    check_rejects("json_rej_nan", "NaN", 3, NULL);
    check_rejects("json_rej_inf", "-Infinity", 9, NULL);
    check_rejects("json_rej_bad_literal", "tru", 3, NULL);
    check_rejects("json_rej_two_values", "1 2", 3, "byte 2");
    check_rejects("json_rej_unterminated_str", "\"abc", 4, "unterminated");
    check_rejects("json_rej_control_char", "\"a\nb\"", 5, "control");
    check_rejects("json_rej_bad_escape", "\"\\x\"", 4, "escape");
    check_rejects("json_rej_short_u", "\"\\u12\"", 6, NULL);
    check_rejects("json_rej_lone_high", "\"\\ud800\"", 8, "surrogate");
    check_rejects("json_rej_lone_low", "\"\\udc00\"", 8, "surrogate");
    check_rejects("json_rej_high_high", "\"\\ud800\\ud800\"", 14, "surrogate");
    check_rejects("json_rej_bad_utf8", "\"\xff\"", 3, "UTF-8");
    check_rejects("json_rej_overlong_utf8", "\"\xc0\xaf\"", 4, "UTF-8");
    check_rejects("json_rej_utf8_surrogate", "\"\xed\xa0\x80\"", 5, "UTF-8");
    check_rejects("json_rej_missing_colon", "{\"a\" 1}", 7, "':'");
    check_rejects("json_rej_unclosed_obj", "{\"a\":1", 6, NULL);
    check_rejects("json_rej_unclosed_arr", "[1, 2", 5, NULL);
    check_rejects("json_rej_comment", "[1] // c", 8, NULL);
    check_rejects("json_rej_nul_in_middle", "[1,\0 2]", 7, NULL);
    check_rejects("json_rej_bom", "\xef\xbb\xbf{}", 5, "byte 0");

    /* file API */
    dt_clear_error();
    json *nf = json_parse_file("/nonexistent/dir/x.json");
    T_CHECK("json_file_missing", !nf && strstr(dt_last_error(), "/nonexistent/dir/x.json"), "%s", dt_last_error());
    char path[512];
    snprintf(path, sizeof path, "%s/model/transformer/config.json", t_fixtures());
    json *cfg = json_parse_file(path);
    T_CHECK("json_file_fixture_config", cfg && json_get_int(cfg, "num_attention_heads", 0) == 2 &&
            json_get_int(cfg, "in_channels", 0) == 32 && json_get(cfg, "axes_dims_rope") &&
            json_get(cfg, "axes_dims_rope")->len == 4, "%s", dt_last_error());
    json_free(cfg);
    snprintf(path, sizeof path, "%s/model/tokenizer/tokenizer.json", t_fixtures());
    json *tok = json_parse_file(path);
    T_CHECK("json_file_fixture_tokenizer", tok && json_get(tok, "model") && json_get(json_get(tok, "model"), "vocab"),
            "%s", dt_last_error());
    json_free(tok);
    return T_DONE();
}
