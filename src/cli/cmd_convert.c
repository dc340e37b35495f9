/* cmd_convert.c — `ditrun convert`: rewrite a FLUX.2 transformer checkpoint under diffusers key names
 * (from BFL or mflux layouts; the mapping itself lives in src/models/flux2_layouts.c). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "models/flux2_layouts.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun convert --input PATH --output OUT [--to diffusers]\n\n"
               "Rewrites a FLUX.2 transformer with diffusers key names, e.g. an original BFL single file\n"
               "(double_blocks.N.img_attn.qkv, final_layer.adaLN_modulation.1, ...) or an mflux folder, so that\n"
               "it can be shared with diffusers users. Cheap: renames, the fused qkv split into q/k/v rows and the\n"
               "final modulation's shift|scale halves swapped; quantized weights stay quantized; no arithmetic.\n\n"
               "  --input PATH     .safetensors file, folder (sharded or not) or pipeline root (its transformer/)\n"
               "  --output OUT     a folder (gets config.json + diffusion_pytorch_model.safetensors), or a\n"
               "                   FILE.safetensors (config.json is written beside it)\n"
               "  --to LAYOUT      diffusers (the only target for now; default)\n"
               "  -q, --quiet      no summary\n"
               "  -h, --help       this help\n"
               "Without config.json the geometry is inferred from the tensor shapes and written as config.json.\n");
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *to = "diffusers";
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--input")) { if (!v) return cli_error("--input needs a value"); in = v; i++; }
        else if (!strcmp(a, "--output")) { if (!v) return cli_error("--output needs a value"); out = v; i++; }
        else if (!strcmp(a, "--to")) { if (!v) return cli_error("--to needs a value (diffusers)"); to = v; i++; }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { quiet = 1; dt_log_level = 0; }
        else return cli_error("convert: unknown option '%s' (see ditrun convert --help)", a);
    }
    if (!in || !out) { usage(stderr); return cli_error("convert: --input and --output are required"); }
    if (strcmp(to, "diffusers")) return cli_error("convert: --to '%s' is not supported (diffusers)", to);
    if (cli_check_input(in, 0)) return 1;   /* a FIFO, a loop, a missing path: the real reason, before any work */
    int written, skipped;
    double t0 = dt_now();
    if (flux2_convert_to_diffusers(in, out, &written, &skipped)) return cli_error("%s", dt_last_error());
    if (!quiet)
        printf("converted %s -> %s: %d tensors with diffusers names%s (%.1f s)\n", in, out, written,
               skipped ? ", some input tensors skipped (not used by FLUX.2-klein)" : "", dt_now() - t0);
    return 0;
}
