/* cmd_synth.c — `ditrun synth`: write a synthetic FLUX.2 or Krea 2 checkpoint (random weights) at a preset
 * geometry, or random forward inputs for one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "core/outfile.h"
#include "models/flux2.h"
#include "models/flux2_dit.h"
#include "pipeline/family.h"
#include "synth/synth_pipeline.h"
#include "synth/synth_dit.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun synth --preset NAME --output DIR [--bits 0|4|8] [--group-size N] [--seed S] [--pipeline]\n"
               "       ditrun synth --preset NAME --inputs FILE [--image-size PX] [--text-tokens T] [--ref-size PX] [--seed S]\n"
               "       ditrun synth (--preset NAME | --model DIR) --lora FILE [--lora-rank R] [--lora-layout L]\n"
               "                    [--lora-modulation] [--seed S]\n\n"
               "Writes DIR/config.json and DIR/model.safetensors with random weights at a real geometry\n"
               "(for tests, the bench and speed runs without downloading weights), or with --inputs a\n"
               "random `ditrun forward` input file (in.hidden_states, in.encoder_hidden_states, in.timestep,\n"
               "in.img_ids, in.txt_ids) for a PX x PX image and T text tokens.\n"
               "Krea 2 presets write a Krea 2 transformer folder; their inputs are in.hidden_states\n"
               "[1,N,64], in.encoder_hidden_states [1,T,layers,dim], in.timestep, in.position_ids [T+N,3] and\n"
               "in.encoder_attention_mask [1,T] (U8, the pipeline's [prompt | padding | suffix] layout).\n\n"
               "  --preset NAME      klein-4b, klein-9b, tiny, krea2 (12.9 B, real geometry) or krea2-tiny\n"
               "  --output DIR       folder to create (must not exist or be empty; written beside it and renamed into\n"
               "                     place when complete, so an error or an interrupt leaves nothing)\n"
               "  --bits B           0 = bf16 weights (default), 4 or 8 = MLX affine quantized Linears\n"
               "  --group-size N     quantization group (32, 64, 128; default 64)\n"
               "  --seed S           random seed (default 1)\n"
               "  --pipeline         write a whole pipeline folder for `ditrun generate`: FLUX.2 presets the\n"
               "                     transformer, a Qwen3 text encoder and the FLUX.2 VAE; Krea 2 presets the\n"
               "                     transformer, a Qwen3-VL text encoder (Qwen3-VL-4B text geometry for krea2)\n"
               "                     and the Qwen-Image VAE, in the layouts diffusers loads; both with the\n"
               "                     bundled tokenizer and scheduler\n"
               "  --inputs FILE      write random forward inputs instead of a checkpoint\n"
               "  --image-size PX    image side in pixels for --inputs (default 1024; 16 pixels per token side)\n"
               "  --text-tokens T    text tokens for --inputs (default 512)\n"
               "  --ref-size PX      FLUX.2 --inputs: also one PX x PX reference image's tokens (in.ref_hidden_states\n"
               "                     [1,R,C], in.ref_ids [1,R,4] with T = 10), which `ditrun forward` appends or\n"
               "                     KV-caches (--kv-refs)\n"
               "  --lora FILE        FLUX.2: write a random LoRA adapter instead (bf16, alpha = rank/2, the update a tenth\n"
               "                     of a unit-variance Linear): every Linear of the blocks, img_in, txt_in, time_in and\n"
               "                     final_layer.linear (for `--lora` tests, speed runs and tools/lora_reference.py)\n"
               "  --model DIR        --lora: the geometry of DIR's transformer config.json (pipeline root or transformer\n"
               "                     folder) instead of --preset\n"
               "  --lora-rank R      its rank (default 32)\n"
               "  --lora-layout L    its key layout: diffusers (default; PEFT keys, alpha in the lora_adapter_metadata\n"
               "                     header), kohya (lora_unet_double_blocks_0_img_attn_qkv.lora_down/.lora_up/.alpha) or\n"
               "                     bfl (diffusion_model.double_blocks.0.img_attn.qkv.lora_A/.lora_B, fused q|k|v and\n"
               "                     linear1, no alpha); the three layouts of one rank and seed are the same update\n"
               "  --lora-modulation  also the modulation Linears and final_layer.adaLN_modulation.1 (diffusers' kohya\n"
               "                     converter drops these; its BFL one maps the last without swapping its halves)\n");
}

/* --lora FILE: a random adapter for the geometry of --preset or --model */
static int synth_lora(const char *preset, const char *model, const char *path, const flux2_synth_lora_opts *o) {
    flux2_config c;
    if (model ? flux2_config_read(model, &c) : flux2_preset(preset, &c)) return cli_error("%s", dt_last_error());
    if (cli_check_output(path, model, NULL)) return 1;
    if (flux2_synth_lora(&c, path, o)) return cli_error("%s", dt_last_error());
    static const char *const names[] = {"diffusers", "kohya", "bfl"};
    fprintf(stderr, "ditrun: wrote a random rank-%d LoRA adapter (%s layout%s) for %s to %s\n", o->rank,
            names[o->layout], o->modulation ? ", with the modulation Linears" : "", model ? model : preset, path);
    return 0;
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *model = NULL;
    const char *inputs = NULL, *lora = NULL, *layout = NULL;
    long lora_rank = 32;
    int pipeline = 0, modulation = 0;
    long bits = 0, group = 64, seed = 1, px = 1024, ntxt = 512, ref_px = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--preset")) { if (!v) return cli_error("--preset needs a value"); preset = v; i++; }
        else if (!strcmp(a, "--output")) { if (!v) return cli_error("--output needs a value"); out = v; i++; }
        else if (!strcmp(a, "--bits")) { if (cli_parse_int(a, v, 0, 8, &bits)) return 1; i++; }
        else if (!strcmp(a, "--group-size")) { if (cli_parse_int(a, v, 32, 128, &group)) return 1; i++; }
        else if (!strcmp(a, "--seed")) { if (cli_parse_int(a, v, 0, 1L << 30, &seed)) return 1; i++; }
        else if (!strcmp(a, "--pipeline")) pipeline = 1;
        else if (!strcmp(a, "--inputs")) { if (!v) return cli_error("--inputs needs a value"); inputs = v; i++; }
        else if (!strcmp(a, "--image-size")) { if (cli_parse_int(a, v, 16, 16384, &px)) return 1; i++; }
        else if (!strcmp(a, "--text-tokens")) { if (cli_parse_int(a, v, 0, 65536, &ntxt)) return 1; i++; }
        else if (!strcmp(a, "--ref-size")) { if (cli_parse_int(a, v, 16, 16384, &ref_px)) return 1; i++; }
        else if (!strcmp(a, "--lora")) { if (!v) return cli_error("--lora needs a value (FILE)"); lora = v; i++; }
        else if (!strcmp(a, "--lora-rank")) { if (cli_parse_int(a, v, 1, 4096, &lora_rank)) return 1; i++; }
        else if (!strcmp(a, "--lora-layout")) {
            if (!v) return cli_error("--lora-layout needs a value (diffusers, kohya, bfl)");
            layout = v; i++;
        }
        else if (!strcmp(a, "--lora-modulation")) modulation = 1;
        else if (!strcmp(a, "--model")) { if (!v) return cli_error("--model needs a value"); model = v; i++; }
        else return cli_error("synth: unknown option '%s' (see ditrun synth --help)", a);
    }
    if (lora) {
        if (!preset == !model || out || inputs)
            return cli_error("synth: --lora FILE takes one of --preset / --model and none of --output / --inputs");
        flux2_synth_lora_opts o = {(int)lora_rank, (uint64_t)seed, FLUX2_LORA_DIFFUSERS, modulation};
        if (layout && flux2_lora_layout_parse(layout, &o.layout)) return cli_error("--lora-layout: %s", dt_last_error());
        return synth_lora(preset, model, lora, &o);
    }
    if (layout || modulation || model)
        return cli_error("synth: --lora-layout, --lora-modulation and --model go with --lora FILE");
    if (!preset || (!out && !inputs)) return cli_error("synth: --preset and --output (or --inputs) are required (see ditrun synth --help)");
    if (out && inputs)
        return cli_error("synth: --output DIR writes a checkpoint, --inputs FILE forward inputs: give one of them");
    if (inputs && cli_check_output(inputs, NULL, NULL)) return 1;
    if (bits != 0 && bits != 4 && bits != 8) return cli_error("--bits must be 0, 4 or 8");
    if (group != 32 && group != 64 && group != 128) return cli_error("--group-size must be 32, 64 or 128");
    if (ref_px && !inputs) return cli_error("--ref-size: FLUX.2 --inputs only");
    const dt_family *fam = dt_family_for_preset(preset);
    if (!fam) return cli_error("%s", dt_last_error());
    /* a checkpoint folder is built as a temporary folder beside --output and renamed into place when complete:
     * an error or an interrupt leaves nothing (an existing non-empty folder is refused, never mixed into) */
    dt_outdir *stage = NULL;
    if (out && !(stage = dt_outdir_begin(out))) return cli_error("%s", dt_last_error());
    const char *dir = stage ? dt_outdir_path(stage) : NULL;
    dt_synth_req req = {preset, dir, out, inputs, pipeline, (int)bits, (int)group, (uint64_t)seed, (int)(px / 16),
                        (int)ntxt, (int)(ref_px / 16), cli_bundled_model()};
    int rc = fam->synth(&req) ? cli_error("%s", dt_last_error()) : 0;
    if (stage) {
        if (rc == 0 && dt_outdir_commit(stage)) rc = cli_error("%s", dt_last_error());
        else if (rc != 0) dt_outdir_abort(stage);
    }
    if (rc == 0 && out) fprintf(stderr, "ditrun: done\n");
    return rc;
}
