/* cmd_synth.c — `ditrun synth`: write a synthetic FLUX.2 or Krea 2 checkpoint (random weights) at a preset
 * geometry, or random forward inputs for one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "core/outfile.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "models/flux2.h"
#include "models/krea2.h"
#include "pipeline/synth_pipeline.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun synth --preset NAME --output DIR [--bits 0|4|8] [--group-size N] [--seed S] [--pipeline]\n"
               "       ditrun synth --preset NAME --inputs FILE [--image-size PX] [--text-tokens T] [--ref-size PX] [--seed S]\n"
               "       ditrun synth (--preset NAME | --model DIR) --lora FILE [--lora-rank R] [--lora-layout L]\n"
               "                    [--lora-modulation] [--seed S]\n\n"
               "Writes DIR/config.json and DIR/model.safetensors with random weights at a real geometry\n"
               "(for tests, the bench and speed runs without downloading weights), or with --inputs a\n"
               "random `ditrun forward` input file (in.hidden_states, in.encoder_hidden_states, in.timestep,\n"
               "in.img_ids, in.txt_ids) for a PX x PX image and T text tokens.\n"
               "Krea 2 presets write a Krea2Transformer2DModel folder; their inputs are in.hidden_states\n"
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

/* Random forward inputs for a grid x grid latent and t text tokens (uniform values, never zeros), and with
 * ref_grid > 0 the tokens of one ref_grid x ref_grid reference image (ids T = 10, row, column, 0). */
static int write_inputs(const flux2_config *c, const char *path, int grid, int t, int ref_grid, uint64_t seed) {
    int64_t n = (int64_t)grid * grid, nr = (int64_t)ref_grid * ref_grid;
    float *img = malloc(sizeof(float) * n * c->in_channels), *txt = malloc(sizeof(float) * (t ? t : 1) * c->joint_dim);
    float *iid = calloc((size_t)n * 4, sizeof(float)), *tid = calloc((size_t)(t ? t : 1) * 4, sizeof(float));
    if (!img || !txt || !iid || !tid) { free(img); free(txt); free(iid); free(tid); return cli_error("synth: out of memory"); }
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
    for (int64_t i = 0; i < n * c->in_channels; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; img[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
    for (int64_t i = 0; i < (int64_t)t * c->joint_dim; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; txt[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
    for (int r = 0; r < grid; r++)
        for (int col = 0; col < grid; col++) { iid[(r * grid + col) * 4 + 1] = (float)r; iid[(r * grid + col) * 4 + 2] = (float)col; }
    for (int l = 0; l < t; l++) tid[l * 4 + 3] = (float)l;
    float ts = 0.75f;
    st_writer *w = st_writer_new();
    int64_t si[3] = {1, n, c->in_channels}, st[3] = {1, t, c->joint_dim}, sii[3] = {1, n, 4}, sti[3] = {1, t, 4}, s1[1] = {1};
    st_writer_add_f32(w, "in.hidden_states", 3, si, img);
    st_writer_add_f32(w, "in.encoder_hidden_states", 3, st, txt);
    st_writer_add_f32(w, "in.img_ids", 3, sii, iid);
    st_writer_add_f32(w, "in.txt_ids", 3, sti, tid);
    st_writer_add_f32(w, "in.timestep", 1, s1, &ts);
    float *ref = NULL, *rid = NULL;
    if (nr > 0) {
        ref = malloc(sizeof(float) * nr * c->in_channels);
        rid = calloc((size_t)nr * 4, sizeof(float));
        if (!ref || !rid) { free(ref); free(rid); st_writer_free(w); free(img); free(txt); free(iid); free(tid); return cli_error("synth: out of memory"); }
        for (int64_t i = 0; i < nr * c->in_channels; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; ref[i] = (float)((s >> 40) / 16777216.0 * 2 - 1); }
        for (int64_t i = 0; i < nr; i++) { rid[i * 4] = 10; rid[i * 4 + 1] = (float)(i / ref_grid); rid[i * 4 + 2] = (float)(i % ref_grid); }
        int64_t sr[3] = {1, nr, c->in_channels}, sri[3] = {1, nr, 4};
        st_writer_add_f32(w, "in.ref_hidden_states", 3, sr, ref);
        st_writer_add_f32(w, "in.ref_ids", 3, sri, rid);
    }
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    free(img); free(txt); free(iid); free(tid); free(ref); free(rid);
    if (rc) return cli_error("%s", dt_last_error());
    fprintf(stderr, "ditrun: wrote %s (%lld image + %d text tokens", path, (long long)n, t);
    if (nr > 0) fprintf(stderr, " + %lld reference tokens", (long long)nr);
    fprintf(stderr, ")\n");
    return 0;
}

/* Krea 2: random inputs for a grid x grid latent and t text tokens (krea2_synth_inputs). */
static int write_inputs_krea2(const krea2_config *c, const char *path, int grid, int t, uint64_t seed) {
    if (t < 1) return cli_error("synth: Krea 2 inputs need at least one text token (--text-tokens)");
    int64_t n = (int64_t)grid * grid, L = n + t;
    float *img = malloc(sizeof(float) * n * c->in_channels);
    float *txt = malloc(sizeof(float) * (size_t)t * c->text_layers * c->text_dim);
    float *pos = malloc(sizeof(float) * L * c->n_axes);
    uint8_t *mask = malloc((size_t)t);
    if (!img || !txt || !pos || !mask) { free(img); free(txt); free(pos); free(mask); return cli_error("synth: out of memory"); }
    krea2_synth_inputs(c, grid, grid, t, seed, img, txt, pos, mask);
    int valid = 0;
    for (int i = 0; i < t; i++) valid += mask[i];
    float ts = 0.75f;
    st_writer *w = st_writer_new();
    int64_t si[3] = {1, n, c->in_channels}, st[4] = {1, t, c->text_layers, c->text_dim}, sp[2] = {L, c->n_axes};
    int64_t sm[2] = {1, t}, s1[1] = {1};
    st_writer_add_f32(w, "in.hidden_states", 3, si, img);
    st_writer_add_f32(w, "in.encoder_hidden_states", 4, st, txt);
    st_writer_add_f32(w, "in.position_ids", 2, sp, pos);
    st_writer_add(w, "in.encoder_attention_mask", DT_U8, 2, sm, mask);
    st_writer_add_f32(w, "in.timestep", 1, s1, &ts);
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    free(img); free(txt); free(pos); free(mask);
    if (rc) return cli_error("%s", dt_last_error());
    fprintf(stderr, "ditrun: wrote %s (%lld image + %d text tokens, %d valid)\n", path, (long long)n, t, valid);
    return 0;
}

/* out: the folder named by --output (messages), dir: where to write it (its temporary folder). */
static int synth_krea2(const char *preset, const char *out, const char *dir, const char *inputs, int pipeline, int bits,
                       int group, uint64_t seed, int grid, int ntxt) {
    krea2_config c;
    if (krea2_preset(preset, &c)) return cli_error("%s", dt_last_error());
    if (inputs) return write_inputs_krea2(&c, inputs, grid, ntxt, seed);
    if (pipeline) {
        /* tokenizer and scheduler from the bundled tiny Krea 2 pipeline, beside the bundled FLUX.2 one */
        char root[4300];
        const char *m = cli_bundled_model();
        size_t n = strlen(m);
        if (n >= 6 && !strcmp(m + n - 6, "/model")) snprintf(root, sizeof root, "%.*s/krea2", (int)(n - 6), m);
        else snprintf(root, sizeof root, "tests/fixtures/krea2");
        fprintf(stderr, "ditrun: writing a synthetic %s pipeline (%s) to %s ...\n", preset,
                bits ? (bits == 4 ? "q4" : "q8") : "bf16", out);
        return dt_synth_krea2_pipeline(preset, dir, bits, group, seed, root) ? cli_error("%s", dt_last_error()) : 0;
    }
    fprintf(stderr, "ditrun: writing synthetic %s checkpoint (%s) to %s ...\n", preset,
            bits ? (bits == 4 ? "q4" : "q8") : "bf16", out);
    if (krea2_synth_write(&c, dir, bits, group, seed)) return cli_error("%s", dt_last_error());
    return 0;
}

/* The FLUX.2 geometry of a model folder (pipeline root or transformer folder): its transformer config.json. */
static int model_geometry(const char *model, flux2_config *c) {
    char *dir = dt_weights_component_dir(model, "transformer");
    if (!dir) return -1;
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    free(dir);
    json *cfg = json_parse_file(p);
    if (!cfg) return -1;
    const char *cls = json_get_str(cfg, "_class_name");
    int rc;
    if (cls && strcmp(cls, "Flux2Transformer2DModel")) {
        dt_set_error("%s: _class_name is '%s'; --lora adapters are written for Flux2Transformer2DModel", p, cls);
        rc = -1;
    } else {
        rc = flux2_config_parse(cfg, p, c);
    }
    json_free(cfg);
    return rc;
}

/* --lora FILE: a random adapter for the geometry of --preset or --model */
static int synth_lora(const char *preset, const char *model, const char *path, const flux2_synth_lora_opts *o) {
    flux2_config c;
    if (model ? model_geometry(model, &c) : flux2_preset(preset, &c)) return cli_error("%s", dt_last_error());
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
    if (ref_px && (!inputs || !strncmp(preset, "krea2", 5))) return cli_error("--ref-size: FLUX.2 --inputs only");
    /* a checkpoint folder is built as a temporary folder beside --output and renamed into place when complete:
     * an error or an interrupt leaves nothing (an existing non-empty folder is refused, never mixed into) */
    dt_outdir *stage = NULL;
    if (out && !(stage = dt_outdir_begin(out))) return cli_error("%s", dt_last_error());
    const char *dir = stage ? dt_outdir_path(stage) : NULL;
    int rc;
    if (!strncmp(preset, "krea2", 5)) {
        rc = synth_krea2(preset, out, dir, inputs, pipeline, (int)bits, (int)group, (uint64_t)seed, (int)(px / 16), (int)ntxt);
    } else {
        flux2_config c;
        if (flux2_preset(preset, &c)) rc = cli_error("%s", dt_last_error());
        else if (inputs) rc = write_inputs(&c, inputs, (int)(px / 16), (int)ntxt, (int)(ref_px / 16), (uint64_t)seed);
        else {
            fprintf(stderr, "ditrun: writing synthetic %s checkpoint (%s) to %s ...\n", preset,
                    bits ? (bits == 4 ? "q4" : "q8") : "bf16", out);
            rc = (pipeline ? dt_synth_pipeline(preset, dir, (int)bits, (int)group, (uint64_t)seed, cli_bundled_model())
                           : flux2_synth_write(&c, dir, (int)bits, (int)group, (uint64_t)seed))
                     ? cli_error("%s", dt_last_error()) : 0;
        }
    }
    if (stage) {
        if (rc == 0 && dt_outdir_commit(stage)) rc = cli_error("%s", dt_last_error());
        else if (rc != 0) dt_outdir_abort(stage);
    }
    if (rc == 0 && out) fprintf(stderr, "ditrun: done\n");
    return rc;
}
