/* cmd_synth.c — `ditrun synth`: write a synthetic FLUX.2 checkpoint (random weights) at a preset geometry. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "models/flux2.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun synth --preset NAME --output DIR [--bits 0|4|8] [--group-size N] [--seed S]\n\n"
               "Writes DIR/config.json and DIR/model.safetensors with random weights at a real geometry\n"
               "(for tests, the bench and speed runs without downloading weights).\n\n"
               "  --preset NAME      klein-4b, klein-9b or tiny\n"
               "  --output DIR       folder to create\n"
               "  --bits B           0 = bf16 weights (default), 4 or 8 = MLX affine quantized Linears\n"
               "  --group-size N     quantization group (32, 64, 128; default 64)\n"
               "  --seed S           random seed (default 1)\n");
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    long bits = 0, group = 64, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--preset")) { if (!v) return cli_error("--preset needs a value"); preset = v; i++; }
        else if (!strcmp(a, "--output")) { if (!v) return cli_error("--output needs a value"); out = v; i++; }
        else if (!strcmp(a, "--bits")) { if (cli_parse_int(a, v, 0, 8, &bits)) return 1; i++; }
        else if (!strcmp(a, "--group-size")) { if (cli_parse_int(a, v, 32, 128, &group)) return 1; i++; }
        else if (!strcmp(a, "--seed")) { if (cli_parse_int(a, v, 0, 1L << 30, &seed)) return 1; i++; }
        else return cli_error("synth: unknown option '%s' (see ditrun synth --help)", a);
    }
    if (!preset || !out) { usage(stderr); return cli_error("synth: --preset and --output are required"); }
    if (bits != 0 && bits != 4 && bits != 8) return cli_error("--bits must be 0, 4 or 8");
    if (group != 32 && group != 64 && group != 128) return cli_error("--group-size must be 32, 64 or 128");
    flux2_config c;
    if (flux2_preset(preset, &c)) return cli_error("%s", dt_last_error());
    fprintf(stderr, "ditrun: writing synthetic %s checkpoint (%s) to %s ...\n", preset,
            bits ? (bits == 4 ? "q4" : "q8") : "bf16", out);
    if (flux2_synth_write(&c, out, (int)bits, (int)group, (uint64_t)seed)) return cli_error("%s", dt_last_error());
    fprintf(stderr, "ditrun: done\n");
    return 0;
}
