/* zimage_export.c — a Z-Image transformer written as an fp8 checkpoint folder (zimage_export.h: zimage_export_fp8): the
 * refiner and joint blocks' attention and FFN Linears (attention.to_q/k/v/to_out.0, feed_forward.w1/w2/w3; in an
 * original-layout file attention.qkv and attention.out) in fp8, through the shared writer (fp8_export.h); adaLN,
 * embedders and the final layer stay as stored, as --precision fp8 leaves them. */
#include "zimage_export.h"

#include <stdio.h>
#include <string.h>

#include "fp8_export.h"
#include "models/zimage.h"

/* Is NAME ("layers.3.attention.to_q.weight", optionally prefixed) a block Linear's weight? Its base into base. */
static int block_linear(const char *name, char *base, size_t blen) {
    static const char *const blocks[] = {"layers.", "noise_refiner.", "context_refiner."};
    static const char *const lin[] = {"attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0",
                                      "attention.qkv", "attention.out", "feed_forward.w1", "feed_forward.w2",
                                      "feed_forward.w3"};
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
        const char *at = strstr(name, blocks[b]);
        int blk, off = 0;
        if (!at || (at != name && at[-1] != '.') || sscanf(at + strlen(blocks[b]), "%d.%n", &blk, &off) != 1 || !off)
            continue;
        const char *rest = at + strlen(blocks[b]) + off;
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
            const size_t l = strlen(lin[i]);
            if (!strncmp(rest, lin[i], l) && !strcmp(rest + l, ".weight")) {
                snprintf(base, blen, "%.*s", (int)(strlen(name) - 7), name);
                return 1;
            }
        }
    }
    return 0;
}

static int check_config(const json *cfg, const char *what) {
    zimage_config c;
    return zimage_config_parse(cfg, what, &c);
}

int zimage_export_fp8(const char *input, const char *output, dt_dtype type, int per_channel, int *written) {
    static const dt_fp8_export_family fam = {"ZImageTransformer2DModel", "Z-Image", check_config, block_linear};
    return dt_fp8_export(input, output, type, per_channel, &fam, written);
}
