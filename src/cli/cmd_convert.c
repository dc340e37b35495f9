/* cmd_convert.c — `ditrun convert`: rewrite a FLUX.2 transformer checkpoint under diffusers key names
 * (from BFL or mflux layouts; the mapping itself lives in src/models/flux2_layouts.c), or as an fp8 / GGUF
 * single file in BFL names (src/export/flux2_export.c). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "cli_model.h"
#include "export/flux2_export.h"
#include "models/flux2_layouts.h"
#include "models/krea2.h"
#include "pipeline/family.h"
#include "export/krea2_export.h"

/* --format NAME -> export options; 0 or -1 */
static int parse_format(const char *f, flux2_export_opts *o) {
    memset(o, 0, sizeof *o);
    static const struct { const char *name; dt_dtype t; } gg[] = {
        {"q4_0", DT_Q4_0}, {"q4_1", DT_Q4_1}, {"q5_0", DT_Q5_0}, {"q5_1", DT_Q5_1}, {"q8_0", DT_Q8_0},
        {"q4_k", DT_Q4_K}, {"q5_k", DT_Q5_K}, {"q6_k", DT_Q6_K}, {"bf16", DT_BF16}, {"f16", DT_F16}};
    if (!strcmp(f, "fp8") || !strcmp(f, "fp8-channel") || !strcmp(f, "fp8-comfy") || !strcmp(f, "fp8-e5m2")) {
        o->type = strcmp(f, "fp8-e5m2") ? DT_F8_E4M3 : DT_F8_E5M2;
        o->comfy = !strcmp(f, "fp8-comfy");
        o->per_channel = !strcmp(f, "fp8-channel");
        return 0;
    }
    const char *g = NULL;
    if (!strncmp(f, "gguf-", 5)) { g = f + 5; o->comfy = 1; }
    else if (!strncmp(f, "sdcpp-", 6)) g = f + 6;
    for (size_t i = 0; g && i < sizeof gg / sizeof gg[0]; i++)
        if (!strcasecmp(g, gg[i].name)) {
            o->gguf = 1;
            o->type = gg[i].t;
            return 0;
        }
    return -1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun convert --input PATH --output OUT [--to diffusers | --format FORMAT]\n\n"
               "Rewrites a FLUX.2 transformer with diffusers key names, e.g. an original BFL single file\n"
               "(double_blocks.N.img_attn.qkv, final_layer.adaLN_modulation.1, ...) or an mflux folder, so that\n"
               "it can be shared with diffusers users. Cheap: renames, the fused qkv split into q/k/v rows and the\n"
               "final modulation's shift|scale halves swapped; quantized weights stay quantized; no arithmetic.\n\n"
               "  --input PATH     .safetensors file, folder (sharded or not) or pipeline root (its transformer/)\n"
               "  --output OUT     a folder (gets config.json + diffusion_pytorch_model.safetensors), or a\n"
               "                   FILE.safetensors (config.json is written beside it)\n"
               "  --to LAYOUT      diffusers (the only target for now; default)\n"
               "  --format FORMAT  instead: one file OUT in BFL key names, the blocks' Linears in\n"
               "                   fp8          F8_E4M3 + per-tensor weight_scale + input_scale (BFL's fp8 files)\n"
               "                   fp8-channel  the same with one scale per output channel\n"
               "                   fp8-e5m2     F8_E5M2 + per-tensor weight_scale\n"
               "                   fp8-comfy    ComfyUI's scaled fp8 (model.diffusion_model. prefix, scale_weight)\n"
               "                   gguf-TYPE    GGUF as ComfyUI-GGUF writes it (TYPE: q4_0 q4_1 q5_0 q5_1 q8_0 q4_k\n"
               "                                q5_k q6_k bf16 f16; img_in/txt_in/time_in/final_layer stay bf16)\n"
               "                   sdcpp-TYPE   GGUF as stable-diffusion.cpp writes it (model.diffusion_model. names)\n"
               "                   (round-to-nearest quantization; other weights bf16, 1-D tensors F32 in GGUF)\n"
               "  A Krea 2 transformer takes --format fp8, fp8-channel or fp8-e5m2: OUT is a folder (config.json +\n"
               "  diffusion_pytorch_model.safetensors), diffusers names, the transformer blocks' Linears in fp8.\n"
               "  -q, --quiet      no summary\n"
               "  -h, --help       this help\n"
               "Without config.json the geometry is inferred from the tensor shapes and written as config.json.\n");
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *to = "diffusers", *format = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--input")) { if (!v) return cli_error("--input needs a value"); in = v; i++; }
        else if (!strcmp(a, "--output")) { if (!v) return cli_error("--output needs a value"); out = v; i++; }
        else if (!strcmp(a, "--to")) { if (!v) return cli_error("--to needs a value (diffusers)"); to = v; i++; }
        else if (!strcmp(a, "--format")) { if (!v) return cli_error("--format needs a value (see ditrun convert --help)"); format = v; i++; }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { quiet = 1; dt_log_level = 0; }
        else return cli_error("convert: unknown option '%s' (see ditrun convert --help)", a);
    }
    if (!in || !out) { usage(stderr); return cli_error("convert: --input and --output are required"); }
    if (strcmp(to, "diffusers")) return cli_error("convert: --to '%s' is not supported (diffusers)", to);
    flux2_export_opts eo;
    if (format && parse_format(format, &eo)) return cli_error("convert: unknown --format '%s' (see ditrun convert --help)", format);
    if (cli_check_input(in, 0)) return 1;   /* a FIFO, a loop, a missing path: the real reason, before any work */
    int written, skipped;
    double t0 = dt_now();
    const dt_family *fam = format ? dt_family_for_model(in) : NULL;
    if (fam && !strcmp(fam->name, "krea2")) {
        if (eo.gguf || eo.comfy)
            return cli_error("convert: --format %s: Krea 2 converts to fp8, fp8-channel or fp8-e5m2 only", format);
        if (krea2_export_fp8(in, out, eo.type, eo.per_channel, &written)) return cli_error("%s", dt_last_error());
        if (!quiet) printf("converted %s -> %s: %d tensors as %s (%.1f s)\n", in, out, written, format, dt_now() - t0);
        return 0;
    }
    if (format) {
        if (flux2_export(in, out, &eo, &written)) return cli_error("%s", dt_last_error());
        if (!quiet) printf("converted %s -> %s: %d tensors as %s (%.1f s)\n", in, out, written, format, dt_now() - t0);
        return 0;
    }
    if (flux2_convert_to_diffusers(in, out, &written, &skipped)) return cli_error("%s", dt_last_error());
    if (!quiet)
        printf("converted %s -> %s: %d tensors with diffusers names%s (%.1f s)\n", in, out, written,
               skipped ? ", some input tensors skipped (not used by FLUX.2-klein)" : "", dt_now() - t0);
    return 0;
}
