/* cmd_quantize.c — `ditrun quantize`: write an MLX affine 4/8-bit single-file checkpoint (streamed tensor
 * by tensor; see src/export/quantize_file.h) and report the per-tensor and whole-model weight error. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "export/quantize_file.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun quantize --input DIR_OR_FILE --output FILE.safetensors [options]\n\n"
               "Writes one .safetensors file in MLX's affine format: every 2-D Linear weight becomes NAME.weight\n"
               "U32 (packed, element 0 in the low bits) + NAME.scales + NAME.biases (bf16, one per group of inputs);\n"
               "norms, biases, conv weights and 1-D tensors are copied. Key names are kept (diffusers, BFL or\n"
               "mflux: ditrun loads all three). Memory stays near one tensor whatever the checkpoint size.\n"
               "config.json of the input folder is copied beside the output with a \"quantization\" entry.\n\n"
               "  --input PATH        .safetensors file, component folder (sharded or not) or pipeline root\n"
               "  --output FILE       the quantized .safetensors file to write\n"
               "  --bits B            4 (default) or 8\n"
               "  --group-size G      32, 64 (default) or 128 inputs per scale/bias\n"
               "  --keep PATTERN      keep weights whose name matches dense (glob with * ? [ ], else substring;\n"
               "                      repeat or separate with commas), e.g. --keep 'x_embedder,proj_out'\n"
               "  --rule R            mlx (default: MLX's quantizer, the larger-magnitude edge exact) or minmax\n"
               "                      (scale = (max-min)/(2^B-1), bias = min, both bf16 first)\n"
               "  --threads N         worker threads (default: all cores)\n"
               "  --no-config         do not write config.json beside the output\n"
               "  -v, --verbose       the relative error of every quantized tensor (default: the 10 worst)\n"
               "  -q, --quiet         only the summary line\n"
               "  -h, --help          this help\n");
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    dt_quant_opts o;
    dt_quant_opts_default(&o);
    static char keepbuf[4096];
    size_t kb = 0;
    long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--input")) { if (!val) return cli_error("--input needs a value"); in = val; i++; }
        else if (!strcmp(a, "--output")) { if (!val) return cli_error("--output needs a value"); out = val; i++; }
        else if (!strcmp(a, "--bits")) {
            if (cli_parse_int(a, val, 1, 32, &v)) return 1;
            if (v != 4 && v != 8) return cli_error("--bits must be 4 or 8 (got %ld)", v);
            o.bits = (int)v; i++;
        } else if (!strcmp(a, "--group-size")) {
            if (cli_parse_int(a, val, 1, 4096, &v)) return 1;
            if (v != 32 && v != 64 && v != 128) return cli_error("--group-size must be 32, 64 or 128 (got %ld)", v);
            o.group = (int)v; i++;
        } else if (!strcmp(a, "--rule")) {
            if (!val) return cli_error("--rule needs a value (mlx, minmax)");
            if (!strcmp(val, "mlx")) o.rule = MLX_RULE_MLX;
            else if (!strcmp(val, "minmax")) o.rule = MLX_RULE_MINMAX;
            else return cli_error("--rule: unknown rule '%s' (mlx, minmax)", val);
            i++;
        } else if (!strcmp(a, "--keep")) {
            if (!val || !*val) return cli_error("--keep needs a pattern");
            size_t len = strlen(val);
            if (kb + len + 1 > sizeof keepbuf) return cli_error("--keep: patterns too long");
            char *p = keepbuf + kb;
            memcpy(p, val, len + 1);
            kb += len + 1;
            for (char *tok = strtok(p, ","); tok; tok = strtok(NULL, ",")) {
                if (!*tok) continue;
                if (o.n_keep == DT_QUANT_MAX_KEEP) return cli_error("--keep: at most %d patterns", DT_QUANT_MAX_KEEP);
                o.keep[o.n_keep++] = tok;
            }
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int(a, val, 1, 16, &v)) return 1;
            o.threads = (int)v; i++;
        } else if (!strcmp(a, "--no-config")) o.write_config = 0;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o.report = 2;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o.report = 0;
        else return cli_error("quantize: unknown option '%s' (see ditrun quantize --help)", a);
    }
    if (!in || !out) { usage(stderr); return cli_error("quantize: --input and --output are required"); }
    size_t ol = strlen(out);
    if (ol < 12 || strcmp(out + ol - 12, ".safetensors")) return cli_error("quantize: --output must name a .safetensors file (got '%s')", out);
    if (cli_check_input(in, 0)) return 1;   /* a FIFO, a loop, a missing path: the real reason, before any work */
    if (o.report) fprintf(stderr, "ditrun: quantizing %s to q%d g%d (%s rule) -> %s\n", in, o.bits, o.group,
                          o.rule == MLX_RULE_MINMAX ? "minmax" : "mlx", out);
    dt_quant_stats st;
    if (dt_quantize_checkpoint(in, out, &o, &st)) return cli_error("%s", dt_last_error());
    printf("quantized %d Linears to q%d g%d (%s rule), copied %d tensors (%d 2-D weights kept dense)\n", st.n_quantized,
           o.bits, o.group, o.rule == MLX_RULE_MINMAX ? "minmax" : "mlx", st.n_copied, st.n_kept);
    printf("whole-model weight rel error %.4e (worst tensor %.4e: %s)\n", st.rel_err, st.worst_rel,
           st.n_quantized ? st.worst_name : "-");
    printf("%.3f GB -> %.3f GB in %.1f s; wrote %s%s\n", st.in_bytes / 1e9, st.out_bytes / 1e9, st.seconds, out,
           st.wrote_config ? " and config.json beside it" : "");
    return 0;
}
