/* main.c — the ditrun command: dispatches to subcommands (cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/common.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "prompt in, PNG out (tokenizer, text encoder, sampler, DiT, VAE)"},
    {"serve", cmd_serve, "keep a pipeline loaded and serve images over HTTP (OpenAI Images API, web page)"},
    {"forward", cmd_forward, "one transformer forward on inputs from a safetensors file"},
    {"info", cmd_info, "print a checkpoint's geometry, formats, tensor count and bytes"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"bench", cmd_bench, "measure one DiT step: ledger, utilization, A/B arms"},
    {"quantize", cmd_quantize, "write an MLX affine 4/8-bit single-file checkpoint"},
    {"convert", cmd_convert, "convert a checkpoint between key layouts (BFL -> diffusers)"},
    {"synth", cmd_synth, "write a synthetic checkpoint with random weights at a preset geometry"},
};

static void usage(FILE *f) {
    fprintf(f, "ditrun %s — diffusion transformer inference (FLUX.2-klein, Krea 2) on CPU and CUDA\n\n"
               "usage: ditrun COMMAND [options]    (ditrun COMMAND --help for its options)\n\ncommands:\n",
            DITRUN_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nglobal: --version, --help\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 1; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version")) { printf("ditrun %s\n", DITRUN_VERSION); return 0; }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "ditrun: error: unknown command '%s' (see ditrun --help)\n", argv[1]);
    return 1;
}
