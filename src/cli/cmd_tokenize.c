/* cmd_tokenize.c — `ditrun tokenize`: print the token ids of a text (raw, or in the Qwen3 chat
 * template padded to a fixed length, as the FLUX.2-klein pipeline feeds its text encoder). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/common.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditrun tokenize --tokenizer DIR [--chat] [--max-length N] [--mask] [--] TEXT\n\n"
            "Prints the token ids of TEXT on one line, separated by spaces.\n\n"
            "options:\n"
            "  --tokenizer DIR   folder holding tokenizer.json (and tokenizer_config.json), or the\n"
            "                    tokenizer.json file itself (required)\n"
            "  --chat            wrap TEXT in the Qwen3 chat template (one user turn, thinking off):\n"
            "                    <|im_start|>user\\nTEXT<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n\n"
            "                    and pad/truncate to --max-length (default 512) with the pad token\n"
            "  --max-length N    pad with the pad token / truncate to exactly N ids (1..1048576);\n"
            "                    without --chat the raw ids are padded/truncated the same way\n"
            "  --mask            also print a second line: the attention mask (1 real token, 0 padding)\n"
            "  --                end of options (TEXT may then start with '-')\n"
            "  -h, --help        show this help\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    int chat = 0, want_mask = 0, only_text = 0;
    long max_len = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_text && a[0] == '-' && a[1]) {
            if (!strcmp(a, "--")) { only_text = 1; continue; }
            if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
            if (!strcmp(a, "--chat")) { chat = 1; continue; }
            if (!strcmp(a, "--mask")) { want_mask = 1; continue; }
            if (!strcmp(a, "--tokenizer")) {
                if (i + 1 >= argc) return cli_error("option --tokenizer needs a value");
                dir = argv[++i];
                continue;
            }
            if (!strcmp(a, "--max-length")) {
                if (cli_parse_int("--max-length", i + 1 < argc ? argv[i + 1] : NULL, 1, 1048576, &max_len)) return 1;
                i++;
                continue;
            }
            return cli_error("unknown option '%s' (see ditrun tokenize --help)", a);
        }
        if (text) return cli_error("more than one TEXT given ('%s'); quote the text (see ditrun tokenize --help)", a);
        text = a;
    }
    if (!dir) return cli_error("--tokenizer DIR is required (see ditrun tokenize --help)");
    if (!text) return cli_error("no TEXT given (see ditrun tokenize --help)");

    dt_tokenizer *tok = dt_tokenizer_load(dir);
    if (!tok) return cli_error("%s", dt_last_error());

    int32_t *ids = NULL, *mask = NULL;
    int n = 0, rc = 0;
    if (chat || max_len > 0) {
        if (max_len <= 0) max_len = 512;
        ids = dt_malloc((size_t)max_len * sizeof *ids);
        mask = dt_malloc((size_t)max_len * sizeof *mask);
        if (chat) {
            rc = dt_tokenize_chat(tok, text, (int)max_len, ids, mask);
        } else {
            int32_t *raw = NULL;
            int nraw = 0;
            rc = dt_tokenize(tok, text, &raw, &nraw);
            if (rc == 0) rc = dt_tokenizer_pad(tok, raw, nraw, (int)max_len, ids, mask);
            free(raw);
        }
        n = (int)max_len;
    } else {
        rc = dt_tokenize(tok, text, &ids, &n);
    }
    if (rc < 0) {
        free(ids); free(mask);
        dt_tokenizer_free(tok);
        return cli_error("%s", dt_last_error());
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    if (want_mask) {
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", mask ? mask[i] : 1);
        printf("\n");
    }
    free(ids); free(mask);
    dt_tokenizer_free(tok);
    return 0;
}
