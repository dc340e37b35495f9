/* krea2_export.c — a Krea 2 transformer written as an fp8 checkpoint folder (krea2_export.h: krea2_export_fp8): the
 * transformer blocks' eight Linears (attn.to_q/k/v/gate/out.0, ff.gate/up/down) in fp8, through the shared writer
 * (fp8_export.h). */
#include "krea2_export.h"

#include "models/krea2.h"

#include <stdio.h>
#include <string.h>

#include "fp8_export.h"

/* Is NAME ("transformer_blocks.3.attn.to_q.weight") a block Linear's weight? Its base (without ".weight") into base. */
static int block_linear(const char *name, char *base, size_t blen) {
    static const char *const lin[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_gate", "attn.to_out.0",
                                      "ff.gate", "ff.up", "ff.down"};
    int blk, off = 0;
    if (sscanf(name, "transformer_blocks.%d.%n", &blk, &off) != 1 || off == 0) return 0;
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        size_t l = strlen(lin[i]);
        if (!strncmp(name + off, lin[i], l) && !strcmp(name + off + l, ".weight")) {
            snprintf(base, blen, "%.*s", (int)(strlen(name) - 7), name);
            return 1;
        }
    }
    return 0;
}

static int check_config(const json *cfg, const char *what) {
    krea2_config c;
    return krea2_config_parse(cfg, what, &c);
}

int krea2_export_fp8(const char *input, const char *output, dt_dtype type, int per_channel, int *written) {
    static const dt_fp8_export_family fam = {"Krea2Transformer2DModel", "Krea 2", check_config, block_linear};
    return dt_fp8_export(input, output, type, per_channel, &fam, written);
}
