/* cmd_generate.c — `ditrun generate`: prompt in, PNG out (FLUX.2-klein or Krea 2 pipelines). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "image/edit_prep.h"
#include "io/safetensors.h"
#include "pipeline/engine.h"
#include "core/outfile.h"
#include "pipeline/image_meta.h"
#include "image/png.h"
#include "image/image_out.h"
#include "pipeline/budget.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditrun generate [--model ROOT] --prompt TEXT --output OUT.png|.jpg|.webp [options]\n\n"
            "Generates an image with a FLUX.2-klein or Krea 2 pipeline folder (model_index.json, tokenizer/,\n"
            "text_encoder/, transformer/, vae/, scheduler/); the family comes from model_index.json. Without --model\n"
            "the bundled tiny model (tests/fixtures/model, random weights) is used.\n\n"
            "options:\n"
            "  --model ROOT                pipeline root (default: the bundled tiny model)\n"
            "  -p, --prompt TEXT           the prompt (required)\n"
            "  -o, --output FILE           image to write (required): JPEG for .jpg/.jpeg, WebP for .webp, else PNG;\n"
            "                              another image format's name (.gif, .bmp, .tif, ...) is an error;\n"
            "                              the parameters go into its text (PNG tEXt, JPEG comment, WebP XMP)\n"
            "  --output-compression N      0..100 (default 100), the API's output_compression: JPEG/WebP quality;\n"
            "                              PNG zlib effort (100 fastest, 0 level 9)\n"
            "  --height H, --width W       image size in pixels (default 1024x1024), rounded to a multiple of the\n"
            "                              model's VAE factor x patch size (16 for every family: FLUX.2-klein and\n"
            "                              Z-Image round down; Krea 2 rounds up, as its reference pipeline) and at most the model's\n"
            "                              largest side (8192)\n"
            "  --steps N                   denoising steps (default: FLUX.2 4 for distilled models, 50 otherwise;\n"
            "                              Krea 2 8 for distilled checkpoints, 28 otherwise; Z-Image 9 for Turbo, 50\n"
            "                              otherwise)\n"
            "  --seed S                    noise seed (default 0); same seed = same image on every backend\n"
            "  --guidance G                classifier-free guidance (FLUX.2: non-distilled models only, default 4.0;\n"
            "                              Krea 2: cond + G*(cond - uncond) whenever G > 0, default 4.5, 0 distilled;\n"
            "                              Z-Image: the same whenever G > 0, default 5, 0 for Turbo)\n"
            "  --negative-prompt TEXT      CFG negative prompt (default empty, as the reference)\n"
            "  --cfg-normalization F       Z-Image: cap the guided prediction's norm at F x the prompt's (0: off, default)\n"
            "  --cfg-truncation F          Z-Image: no guidance on steps past (1000 - t)/1000 > F (default 1: never)\n"
            "  --noise FILE                read the initial noise from FILE (tensor in.initial_latents [1,C,h,w]:\n"
            "                              FLUX.2 the packed grid, Krea 2 and Z-Image the VAE latent grid; for\n"
            "                              inpainting the Gaussian noise before it is mixed with the init image;\n"
            "                              Z-Image: in.posterior_noise, when present, the VAE posterior's draw)\n"
            "  --image FILE                FLUX.2: a reference image to edit from (PNG, JPEG or WebP; repeatable, in\n"
            "                              order, up to 16); without --height/--width the first one sets the size (over\n"
            "                              1024x1024 pixels it is resized to that area, then cropped to multiples of 16)\n"
            "  --init-image FILE           inpainting (FLUX.2, Z-Image): the image to edit (sets the output size) ...\n"
            "  --mask FILE                 ... and its mask, the same size (white = repaint, black = keep); Z-Image\n"
            "                              without --mask: img2img (the whole image re-noised to --strength)\n"
            "  --strength S                inpainting, img2img: how much to repaint, in (0, 1] (default 0.8): the noisiest\n"
            "                              (1 - S) of the steps are skipped\n"
            "  --max-sequence-length N     text tokens (default 512)\n"
            "  --text-encoder-layers a,b,c hidden-state taps (FLUX.2 default 9,18,27 for 36-layer encoders, k*L/(n+1)\n"
            "                              in general; Krea 2 default: model_index.json text_encoder_select_layers)\n"
            "  --te-rope-bf16              text-encoder RoPE frequencies rounded to bf16 (as in the test fixtures)\n"
            "  --count N                   N images from one load (seeds S, S+1, ...) written as OUT-1.png .. OUT-N.png;\n"
            "                              prints each image's time and the first vs the warm ones\n"
            "  --save-latents FILE         write intermediates (prompt embeds, sigmas, per-step latents, unpacked\n"
            "                              latents, float image) to a safetensors file\n"
            "  --backend cpu|cuda|auto     (default auto: cuda when a GPU is usable)\n"
            "  --threads N                 CPU threads (default: all cores)\n"
            "  --qpath auto|mixed|fused|transient|cached   quantized weight path on CUDA\n"
            "  --precision bf16|fp8        fp8: the DiT blocks' Linears in e4m3 (per-channel weight and per-token\n"
            "                              activation scales); text encoder and VAE stay bf16; opt-in\n"
            "  --attn-precision bf16|fp8   fp8: the DiT blocks' attention with e4m3 Q/K/V/P (one scale per tensor;\n"
            "                              CUDA through cuDNN); opt-in\n"
            "  --compare-bf16              with --precision fp8 and/or --attn-precision fp8: generate again with\n"
            "                              bf16 and report the relative L2 error of the final latents (the PNG\n"
            "                              written is the fp8 one)\n"
            "  --cuda-graph                replay the DiT forward as a CUDA graph from the second step on\n"
            "  --guidance-batch on|off     with guidance, the prompt's and the negative prompt's passes of a step in\n"
            "                              one forward (a batch of 2: each weight read once; Krea 2, FLUX.2 base)\n"
            "                              or two (default on: one, faster at every size; off: a smaller memory\n"
            "                              peak); a step cache (--cache) always runs two\n"
            "  --kernels auto|portable     CUDA: portable takes the paths of a non-Hopper card on any card\n"
            "  --cache SPEC                step caching (default off): first-block=T (skip the other blocks while the\n"
            "                              first block's residual changed by at most T, relative; e.g. 0.08) or\n"
            "                              taylorseer=N[:ORDER] (a full pass every N steps after 3 warm-up steps, the\n"
            "                              others extrapolated; ORDER 1..4, default 1). Per guidance branch; the first\n"
            "                              and last steps always run. Speed/quality measured on random weights says\n"
            "                              nothing about real weights\n"
            "  --lora FILE[:SCALE]         a LoRA adapter for the DiT (repeatable, up to 8; SCALE default 1):\n"
            "                              PEFT/diffusers, kohya/ai-toolkit or BFL-named safetensors; merged into dense\n"
            "                              weights, a low-rank side product on quantized ones (q4/q8, fp8, GGUF)\n"
            "  --lora-side                 apply adapters as side products on dense weights too (instead of merging)\n"
            "  --vae-tiling                decode (and, for editing, encode) images larger than one VAE tile in\n"
            "                              overlapping tiles blended over the overlap, as diffusers' enable_tiling: VAE\n"
            "                              memory follows the tile, not the image; seams differ slightly from one pass\n"
            "  --vae-tile-size N           the tile side in pixels, a multiple of 32 for the released VAEs (default\n"
            "                              FLUX.2 1024, its config's sample_size; Krea 2 256); implies --vae-tiling,\n"
            "                              except under --max-vram, whose plan decides\n"
            "  --max-vram SIZE             GPU memory budget (K, M, G suffixes: 12G; default: the card's free memory):\n"
            "                              the CUDA pool refuses to hold more; the plan fits the image in it (the VAE\n"
            "                              tiles, with --count the text encoder is reloaded per prompt, when needed);\n"
            "                              a budget below the smallest workable is refused before anything loads,\n"
            "                              naming it (ditrun info --size --max-vram shows the plan; -v logs it)\n"
            "  --no-prefetch               CUDA: no transient-weight prefetch: each 4/8-bit Linear dequantized right\n"
            "                              before its GEMM, the model's prefetch hints ignored (A/B timings)\n"
            "  --sequence-parallel N       split the DiT's forward over N GPUs (devices 0..N-1 from the backend's;\n"
            "                              NCCL, libnccl.so.2, loaded at run time); on the CPU backend N thread ranks\n"
            "                              (the same schedule, for tests: not faster). docs/sequence-parallel.md\n"
            "  -q, --quiet / -v, --verbose\n");
}

typedef struct {
    st_writer *w;
    float *lat;        /* --compare-bf16: copy of the final latents (latents_unpacked) */
    int64_t nlat;
} save_ctx;

static void save_obs(void *ud, const char *name, const float *d, int ndim, const int64_t *shape) {
    save_ctx *s = ud;
    if (!strcmp(name, "latents_unpacked")) {
        int64_t n = 1;
        for (int i = 0; i < ndim; i++) n *= shape[i];
        free(s->lat);
        s->lat = dt_malloc(sizeof(float) * (size_t)n);
        memcpy(s->lat, d, sizeof(float) * (size_t)n);
        s->nlat = n;
    }
    if (!s->w) return;
    char nm[96];
    const char *prefix = (!strcmp(name, "latents_unpacked") || !strcmp(name, "image_float")) ? "out" : "mid";
    snprintf(nm, sizeof nm, "%s.%s", prefix, name);
    st_writer_add_f32(s->w, nm, ndim, shape, d);
}

/* The image with the generation's parameters as text: JPEG or WebP when the path ends in .jpg/.jpeg/.webp (at
 * compression, image/image_out.h), else PNG (the server's bytes for the same settings and compression). */
static int write_image(const char *path, const uint8_t *rgb, int w, int h, const dt_gen_params *p, int steps,
                       const char *model, int compression) {
    dt_image_meta meta;
    dt_image_meta_fill(&meta, p, steps, w, h, model);
    dt_out_format f = DT_OUT_PNG;
    uint8_t *bytes = NULL;
    size_t n = 0;
    int rc = dt_out_format_for_path(path, &f);   /* checked before the work too */
    if (rc) return -1;
    rc = dt_image_out_encode(f, compression, 0, rgb, w, h, meta.text, meta.n, &bytes, &n);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_last_error());
        dt_set_error("%s: %s", path, why);
    } else {
        rc = dt_write_file(path, bytes, n);
    }
    free(bytes);
    if (rc == 0) dt_log(1, "ditrun: wrote %s\n", path);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --count N's k-th output: OUT.png -> OUT-k.png (malloc'd). */
static char *numbered_output(const char *output, int k) {
    size_t ol = strlen(output);
    const char *dot = strrchr(output, '.');
    size_t stem = dot && !strchr(dot, '/') ? (size_t)(dot - output) : ol;
    size_t n = ol + 24;
    char *path = dt_malloc(n);
    snprintf(path, n, "%.*s-%d%s", (int)stem, output, k, output + stem);
    return path;
}

/* --count N: one load, N images (seeds seed .. seed + N - 1) written as OUT-1.png .. OUT-N.png; per-image timings
 * and the first image vs the median of the warm ones. */
static int generate_many(dt_backend *be, const dt_pipeline_opts *lo, dt_gen_params *p, const char *output, int count,
                         int compression) {
    double t0 = dt_now();
    dt_pipeline_opts o = *lo;   /* the plan of a loaded pipeline (the text encoder kept or reloaded per prompt) */
    if (dt_budget_apply(be, &o, p->width ? p->width : 1024, p->height ? p->height : 1024,
                        p->max_seq_len ? p->max_seq_len : 512, 1, NULL))
        return cli_error("%s", dt_last_error());
    dt_pipeline *pl = dt_pipeline_load(be, &o);
    if (!pl) return cli_error("%s", dt_last_error());
    double t_load = dt_now() - t0;
    dt_log(1, "ditrun: pipeline loaded in %.2f s\n", t_load);
    double *tot = dt_malloc(sizeof(double) * (size_t)count);
    int rc = 0;
    const uint64_t seed0 = p->seed;
    for (int i = 0; i < count && rc == 0; i++) {
        p->seed = seed0 + (uint64_t)i;
        uint8_t *rgb = NULL;
        int w, h;
        dt_gen_timings tm;
        double ts = dt_now();
        if (dt_pipeline_generate(pl, p, &rgb, &w, &h, &tm, NULL, NULL)) { rc = cli_error("%s", dt_last_error()); break; }
        tot[i] = dt_now() - ts;
        printf("image %d/%d (seed %llu): encode %.3f s, denoise %.3f s (%.4f s/step, %d of %d transformer passes "
               "computed), decode %.3f s, total %.3f s\n", i + 1, count, (unsigned long long)p->seed, tm.t_encode,
               tm.t_denoise, tm.t_denoise / tm.steps, tm.passes_computed, tm.passes, tm.t_decode, tot[i]);
        if (p->n_refs || p->init_image)
            printf("  images (preparation + VAE encoder) %.3f s%s\n", tm.t_images,
                   tm.refs_cached ? " (the previous image's references: not encoded again)" : "");
        printf("  steps:");
        for (int k = 0; k < tm.steps && k < 256; k++) printf(" %.4f", tm.t_step[k]);
        printf(" s\n");
        char *path = numbered_output(output, i + 1);
        if (write_image(path, rgb, w, h, p, tm.steps, lo->model, compression)) rc = cli_error("%s", dt_last_error());
        free(path);
        free(rgb);
    }
    if (rc == 0 && count > 1) {
        qsort(tot + 1, (size_t)count - 1, sizeof(double), cmp_double);
        int m = count - 1;
        double med = m % 2 ? tot[1 + m / 2] : 0.5 * (tot[m / 2] + tot[m / 2 + 1]);
        printf("load %.3f s; first image %.3f s; warm images: median %.3f s, min %.3f s, max %.3f s (%d)\n", t_load, tot[0],
               med, tot[1], tot[count - 1], m);
    }
    free(tot);
    dt_pipeline_free(pl);
    return rc ? 1 : 0;
}

/* The editing inputs of a request, decoded from their files (each error names its file). */
typedef struct {
    const char *ref_paths[DT_GEN_MAX_REFS];
    dt_image refs[DT_GEN_MAX_REFS], init, mask;
    int n_refs;
    const char *init_path, *mask_path;
} edit_files;

static int edit_files_load(edit_files *e, dt_gen_params *p) {
    const dt_image_limits ref_lim = dt_prep_reference_limits(0);   /* refused from the file's header */
    for (int i = 0; i < e->n_refs; i++)
        if (dt_image_read_file_ex(e->ref_paths[i], &ref_lim, &e->refs[i])) return -1;
    if (e->init_path && dt_image_read_file(e->init_path, &e->init)) return -1;
    if (e->mask_path && dt_image_read_file(e->mask_path, &e->mask)) return -1;
    p->refs = e->refs;
    p->ref_names = e->ref_paths;
    p->n_refs = e->n_refs;
    p->init_image = e->init_path ? &e->init : NULL;
    p->init_name = e->init_path;
    p->mask = e->mask_path ? &e->mask : NULL;
    p->mask_name = e->mask_path;
    return 0;
}

static void edit_files_free(edit_files *e) {
    for (int i = 0; i < e->n_refs; i++) dt_image_free(&e->refs[i]);
    dt_image_free(&e->init);
    dt_image_free(&e->mask);
}

int cmd_generate(int argc, char **argv) {
    dt_gen_params p;
    edit_files ef;
    memset(&ef, 0, sizeof ef);
    dt_gen_params_default(&p);
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    static cli_lora_opts lor;   /* (static: 32 KB of adapter paths) */
    cli_vae_opts vo = {0, 0};
    cli_model_opts mo;
    cli_model_opts_default(&mo);
    const char *output = NULL, *save = NULL;
    int compare = 0, count = 1, compression = -1;
    long l;
    double d;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_model_opt(&mo, argc, argv, &i);
        if (!r) r = cli_lora_opt(&lor, argc, argv, &i);
        if (!r) r = cli_vae_opt(&vo, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { if (!v) return cli_error("--model needs a value"); lo.model = v; i++; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!v) return cli_error("%s needs a value", a); p.prompt = v; i++; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { if (!v) return cli_error("%s needs a value", a); output = v; i++; }
        else if (!strcmp(a, "--output-compression")) { if (cli_parse_int(a, v, 0, 100, &l)) return 1; compression = (int)l; i++; }
        else if (!strcmp(a, "--negative-prompt")) { if (!v) return cli_error("%s needs a value", a); p.negative_prompt = v; i++; }
        else if (!strcmp(a, "--height")) { if (cli_parse_int(a, v, 1, 16384, &l)) return 1; p.height = (int)l; i++; }
        else if (!strcmp(a, "--width")) { if (cli_parse_int(a, v, 1, 16384, &l)) return 1; p.width = (int)l; i++; }
        else if (!strcmp(a, "--steps")) { if (cli_parse_int(a, v, 1, 1000, &l)) return 1; p.steps = (int)l; i++; }
        else if (!strcmp(a, "--seed")) { if (cli_parse_int(a, v, 0, 0x7fffffffffffffffL, &l)) return 1; p.seed = (uint64_t)l; i++; }
        else if (!strcmp(a, "--guidance")) { if (cli_parse_float(a, v, &d)) return 1; if (d < 0 || d > 100) return cli_error("--guidance must be in [0, 100]"); p.guidance = (float)d; i++; }
        else if (!strcmp(a, "--noise")) { if (!v) return cli_error("--noise needs a value"); p.noise_file = v; i++; }
        else if (!strcmp(a, "--cfg-normalization") || !strcmp(a, "--cfg-truncation")) {
            if (cli_parse_float(a, v, &d)) return 1;
            if (!(d >= 0 && d <= 100)) return cli_error("%s %s is out of range [0, 100]", a, v);
            if (a[6] == 'n') { p.cfg_normalization = (float)d; p.cfg_normalization_set = 1; }
            else { p.cfg_truncation = (float)d; p.cfg_truncation_set = 1; }
            i++;
        }
        else if (!strcmp(a, "--image")) {
            if (!v) return cli_error("--image needs a file");
            if (ef.n_refs == DT_GEN_MAX_REFS) return cli_error("--image: at most %d reference images", DT_GEN_MAX_REFS);
            ef.ref_paths[ef.n_refs++] = v;
            i++;
        }
        else if (!strcmp(a, "--init-image")) { if (!v) return cli_error("--init-image needs a file"); ef.init_path = v; i++; }
        else if (!strcmp(a, "--mask")) { if (!v) return cli_error("--mask needs a file"); ef.mask_path = v; i++; }
        else if (!strcmp(a, "--cache")) {
            if (!v) return cli_error("--cache needs a value (first-block=T or taylorseer=N[:ORDER])");
            if (dt_cache_parse(v, &p.cache)) return cli_error("--cache: %s", dt_last_error());
            i++;
        }
        else if (!strcmp(a, "--strength")) {
            if (cli_parse_float(a, v, &d)) return 1;
            if (!(d > 0 && d <= 1)) return cli_error("--strength %s is out of range (0, 1]", v);
            p.strength = d;
            i++;
        }
        else if (!strcmp(a, "--max-sequence-length")) { if (cli_parse_int(a, v, 1, 32768, &l)) return 1; p.max_seq_len = (int)l; i++; }
        else if (!strcmp(a, "--text-encoder-layers")) {
            if (!v) return cli_error("--text-encoder-layers needs a value like 9,18,27");
            lo.n_taps = 0;
            const char *s = v;
            while (*s) {
                char *end;
                long t = strtol(s, &end, 10);
                if (end == s || (*end && *end != ','))
                    return cli_error("--text-encoder-layers: '%s' is not a comma-separated list of layer numbers", v);
                if (t < 0 || t > 4096) return cli_error("--text-encoder-layers: layer %ld is out of range 0..4096", t);
                if (lo.n_taps == DT_GEN_MAX_TAPS)
                    return cli_error("--text-encoder-layers: '%s' lists more than %d layers", v, DT_GEN_MAX_TAPS);
                lo.taps[lo.n_taps++] = (int)t;
                s = *end ? end + 1 : end;
            }
            i++;
        }
        else if (!strcmp(a, "--sequence-parallel")) { if (cli_parse_int(a, v, 1, DT_GEN_MAX_RANKS, &l)) return 1; lo.sequence_parallel = (int)l; i++; }
        else if (!strcmp(a, "--count")) { if (cli_parse_int(a, v, 1, 100000, &l)) return 1; count = (int)l; i++; }
        else if (!strcmp(a, "--te-rope-bf16")) lo.te_inv_freq_bf16 = 1;
        else if (!strcmp(a, "--compare-bf16")) compare = 1;
        else if (!strcmp(a, "--save-latents")) { if (!v) return cli_error("--save-latents needs a value"); save = v; i++; }
        else return cli_error("generate: unknown option '%s' (see ditrun generate --help)", a);
    }
    if (!p.prompt) return cli_error("generate: --prompt is required (see ditrun generate --help)");
    if (!output) return cli_error("generate: --output is required (see ditrun generate --help)");
    if (count > 1 && (compare || save))
        return cli_error("generate: --count runs one pipeline for many images; --compare-bf16 and --save-latents take one");
    if (compare && mo.precision != DT_PREC_FP8 && mo.attn_precision != DT_PREC_FP8)
        return cli_error("--compare-bf16 needs --precision fp8 or --attn-precision fp8");
    if (ef.mask_path && !ef.init_path) return cli_error("generate: --mask needs --init-image (the image to inpaint)");
    /* --init-image without --mask: img2img where the family has it (Z-Image), else the engine's error */
    if (p.strength != 0 && !ef.init_path)
        return cli_error("generate: --strength applies to inpainting and img2img (--init-image)");
    if (!lo.model) {
        lo.model = cli_bundled_model();
        dt_log(1, "ditrun: no --model given: using the bundled tiny model %s (random weights)\n", lo.model);
    }
    /* before loading anything: the model is a file or folder, the noise file a file, every output can be written
     * and none is an input */
    if (cli_check_input(lo.model, 0) || (p.noise_file && cli_check_input(p.noise_file, 1))) return 1;
    if (save && cli_check_output(save, lo.model, p.noise_file)) return 1;
    dt_out_format out_format;
    if (dt_out_format_for_path(output, &out_format)) return cli_error("%s", dt_last_error());
    if (count == 1 && cli_check_output(output, lo.model, p.noise_file)) return 1;
    for (int k = 1; k <= (count > 1 ? count : 0); k++) {
        char *path = numbered_output(output, k);
        int bad = cli_check_output(path, lo.model, p.noise_file);
        free(path);
        if (bad) return 1;
    }
    /* ... nor one of the editing images, which are then decoded (each error names its file) */
    const char *ins[DT_GEN_MAX_REFS + 2];
    int n_ins = 0;
    for (int k = 0; k < ef.n_refs; k++) ins[n_ins++] = ef.ref_paths[k];
    if (ef.init_path) ins[n_ins++] = ef.init_path;
    if (ef.mask_path) ins[n_ins++] = ef.mask_path;
    for (int k = 0; k < n_ins; k++) {
        if (cli_check_input(ins[k], 1) || (save && cli_check_output(save, ins[k], NULL))) return 1;
        for (int o = count > 1 ? 1 : 0; o <= (count > 1 ? count : 0); o++) {
            char *path = o ? numbered_output(output, o) : NULL;
            int bad = cli_check_output(o ? path : output, ins[k], NULL);
            free(path);
            if (bad) return 1;
        }
    }
    if (edit_files_load(&ef, &p)) { edit_files_free(&ef); return cli_error("%s", dt_last_error()); }
    lo.cuda_graph = mo.cuda_graph;
    lo.guidance_batch = mo.guidance_batch;
    lo.precision = mo.precision;
    lo.attn_precision = mo.attn_precision;
    lo.loras = lor.loras;
    lo.n_loras = lor.n;
    lo.lora_side = lor.side;
    lo.max_vram = mo.max_vram;
    lo.vae_tiling = vo.tiling || (vo.tile && !lo.max_vram);   /* (under --max-vram the plan decides) */
    lo.vae_tile = vo.tile;
    dt_backend *be = cli_model_backend(&mo);
    if (!be) { edit_files_free(&ef); return 1; }
    dt_log(1, "ditrun: backend %s\n", be->name);
    cli_sp_note(be, lo.sequence_parallel);
    if (count > 1) {
        int r = generate_many(be, &lo, &p, output, count, compression);
        be->destroy(be);
        edit_files_free(&ef);
        return r;
    }
    save_ctx sc = {save ? st_writer_new() : NULL, NULL, 0};
    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    dt_gen_timings tm;
    int rc = dt_generate(be, &lo, &p, &rgb, &w, &h, &tm, save || compare ? save_obs : NULL, &sc);
    if (rc == 0 && dt_log_level >= 2 && be->mem_stats) {   /* -v: what the plan's prediction is measured against */
        size_t cur = 0, peak = 0;
        be->mem_stats(be, &cur, &peak);
        dt_log(2, "ditrun: device memory peak %.1f MiB (the backend's allocations%s)\n", peak / 1048576.0,
               strcmp(be->name, "cpu") ? " and its cache of freed blocks" : "");
    }
    if (rc == 0 && save && st_writer_save(sc.w, save)) rc = -1;
    if (rc == 0 && compare) {   /* the same generation with bf16 Linears: error of the final latents */
        save_ctx rc2 = {NULL, NULL, 0};
        float *lat8 = sc.lat;
        int64_t n8 = sc.nlat;
        sc.lat = NULL;
        uint8_t *rgb2 = NULL;
        int w2, h2;
        dt_gen_timings tm2;
        lo.precision = lo.attn_precision = DT_PREC_BF16;
        rc = dt_generate(be, &lo, &p, &rgb2, &w2, &h2, &tm2, save_obs, &rc2);
        free(rgb2);
        if (rc == 0 && (!lat8 || rc2.nlat != n8)) { dt_set_error("--compare-bf16: final latents not observed"); rc = -1; }
        if (rc == 0) {
            double e2 = 0, r2 = 0;
            for (int64_t i = 0; i < n8; i++) {
                double dd = (double)lat8[i] - rc2.lat[i];
                e2 += dd * dd;
                r2 += (double)rc2.lat[i] * rc2.lat[i];
            }
            double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
            printf("fp8 vs bf16 generate (%s, %d steps, final latents): rel_l2 %.5f (%.2f%%); fp8 could be the default "
                   "only under 3%%: %s (it stays opt-in)\n", cli_fp8_what(&mo), tm.steps, rel, rel * 100,
                   rel < 0.03 ? "under" : "NOT under");
        }
        free(lat8);
        free(rc2.lat);
    }
    if (rc == 0) rc = write_image(output, rgb, w, h, &p, tm.steps, lo.model, compression);
    if (rc) cli_error("%s", dt_last_error());
    free(rgb);
    if (sc.w) st_writer_free(sc.w);
    free(sc.lat);
    be->destroy(be);
    edit_files_free(&ef);
    return rc ? 1 : 0;
}
