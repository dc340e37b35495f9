/* cmd_info.c — `ditrun info PATH`: what a checkpoint holds (components, geometry, formats, bytes). Every component
 * it recognises (FLUX.2 / Krea 2 transformer, Qwen3 / Qwen3-VL text encoder, FLUX.2 / Qwen-Image VAE, scheduler)
 * has its config checked by the parser the pipeline uses; an invalid config, an unreadable component or a pipeline
 * folder missing a component exits 1 with one error line, after everything else that can be described is printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/backend_cuda.h"
#include "cli.h"
#include "core/infile.h"
#include "io/weights.h"
#include "models/flux2.h"
#include "models/flux2_layouts.h"
#include "models/qwen3.h"
#include "models/vae_flux2.h"
#include "models/vae_kl.h"
#include "models/vae_qwenimage.h"
#include "pipeline/family.h"
#include "pipeline/placement.h"
#include "pipeline/scheduler.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ditrun info PATH [--size WxH] [--text-tokens T] [--max-vram SIZE] [--vae-tile-size N]\n"
               "       ditrun info --devices [--kernels auto|portable]\n\n"
               "PATH: a pipeline root (model_index.json + component folders), a component folder\n"
               "(config.json + safetensors, sharded or not) or a single .safetensors or .gguf file.\n"
               "Prints per component: class, geometry, tensor count, bytes, dtypes and quantized Linears.\n"
               "--devices: each CUDA GPU's compute capability and the path each op family takes on it under\n"
               "the kernel mode (default auto, or DITRUN_CUDA_KERNELS; portable: the paths of a non-Hopper card).\n"
               "For a pipeline root also the GPU memory plan of one image (bf16 activations): which parts stay\n"
               "resident, whether the VAE decodes in tiles, the predicted peak of each phase and the smallest\n"
               "workable budget, for one image (generate) and for a loaded pipeline (serve). The weights come from the\n"
               "files and the VAE's activations from its config; the transformer's and text encoder's activations are\n"
               "estimates from their widths (pipeline/placement.h).\n\n"
               "  --size WxH          the image size (default 1024x1024)\n"
               "  --text-tokens T     text tokens (default 512)\n"
               "  --max-vram SIZE     plan within SIZE bytes (suffix K, M, G: binary units, e.g. 12G); exit 1 with the\n"
               "                      smallest workable budget when nothing fits (default: no bound)\n"
               "  --vae-tile-size N   the VAE tile side in pixels (default: the VAE's, see generate --help)\n");
}

/* The memory plan of a pipeline root for one image (info's last lines). 0, or 1 (error printed) when one image fits
 * no placement within the budget or the sizes cannot be read. */
static int print_plan(const char *root, int W, int H, int T, int64_t budget, int tile) {
    int bad = 0;
    for (int resident = 0; resident < 2; resident++) {
        dt_place_sizes s;
        if (dt_place_sizes_for(root, W, H, T, 2, tile, resident, 1, &s)) return cli_error("%s", dt_last_error());
        if (!resident) {
            char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], k[32];
            printf("memory at %dx%d, %d text tokens (bf16 activations): weights text encoder %s, transformer %s, VAE %s; "
                   "activations encode %s, forward %s (estimates%s), VAE decode %s untiled, %s per tile; dequantized-weight "
                   "buffers %s; workspaces and pool slack %s\n", W, H, T,
                   dt_place_bytes(s.text_encoder, a, sizeof a), dt_place_bytes(s.transformer, b, sizeof b),
                   dt_place_bytes(s.vae, c, sizeof c), dt_place_bytes(s.te_act, d, sizeof d),
                   dt_place_bytes(s.dit_act, e, sizeof e),
                   s.dit_batch > 1 ? "; the prompt and the negative prompt in one forward" : "",
                   dt_place_bytes(s.vae_act, f, sizeof f),
                   s.vae_tile_act ? dt_place_bytes(s.vae_tile_act, g, sizeof g) : "(one tile)",
                   dt_place_bytes(s.te_qbuf > s.dit_qbuf ? s.te_qbuf : s.dit_qbuf, h, sizeof h),
                   dt_place_bytes(s.workspace, k, sizeof k));
        }
        dt_place_plan p;
        char line[400], lim[32];
        int rc = dt_place_plan_make(budget, &s, &p);
        dt_place_plan_describe(&p, line, sizeof line);
        printf("plan (%s, budget %s): %s\n", resident ? "serve" : "generate",
               budget > 0 ? dt_place_bytes(budget, lim, sizeof lim) : "none", rc ? dt_last_error() : line);
        if (!resident) bad = rc != 0;   /* a serve plan needs at least as much */
    }
    if (bad) return cli_error("--max-vram %s: no placement fits one image (see the plan lines)",
                              dt_place_bytes(budget, (char[32]){0}, 32));
    return 0;
}

/* info --devices: the CUDA GPUs and the path of each op family (backends/cuda_paths.c) under kernel mode k. */
static int describe_devices(dt_cuda_kernels k) {
    const int n = dt_backend_cuda_available() ? dt_backend_cuda_device_count() : 0;
    printf("kernels      %s\n", dt_cuda_kernels_name(k));
    if (n <= 0) {
        printf("cuda         no usable CUDA GPU (compute 8.0+; ditrun -v says why)\n");
        return 0;
    }
    for (int d = 0; d < n; d++) {
        char name[256];
        int major = 0, minor = 0;
        if (dt_backend_cuda_device_info(d, name, sizeof name, &major, &minor)) return cli_error("%s", dt_last_error());
        printf("device %d     %s, compute %d.%d\n", d, name, major, minor);
        for (int f = 0; f < DT_CUDA_OPS_COUNT; f++)
            printf("  %-16s %s\n", dt_cuda_ops_name((dt_cuda_ops)f),
                   dt_cuda_path_text((dt_cuda_ops)f, dt_cuda_ops_path((dt_cuda_ops)f, major, minor, k)));
    }
    return 0;
}

static int is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static int is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

/* Text encoders and VAEs: the geometry line from the parser the pipeline loads them with. Returns 1 when that
 * parser refuses the config (error set), 0 when printed, -1 when the component is of no kind it knows. */
static int describe_encoder_or_vae(const char *label, const char *path, const char *cls) {
    int text = !strcmp(label, "text_encoder") || (cls && !strncmp(cls, "Qwen3", 5));
    int vae = !text && (!strcmp(label, "vae") || (cls && !strncmp(cls, "AutoencoderKL", 13)));
    if (text) {
        dt_qwen3_config q;
        if (dt_qwen3_read_config(path, &q)) return 1;
        printf("  geometry     D=%d (%d heads x %d, %d kv), %d layers, MLP %d, vocab %d; rope theta %g, eps %g\n", q.hidden,
               q.heads, q.head_dim, q.kv_heads, q.num_layers, q.intermediate, q.vocab, q.rope_theta, q.eps);
        return 0;
    }
    if (!vae || !is_dir(path)) return -1;   /* a lone VAE file has no config.json to check */
    if (cls && !strcmp(cls, "AutoencoderKLQwenImage")) {
        static dt_qvae_config q;   /* (static: 2 KB of latent statistics) */
        if (dt_qvae_read_config(path, &q)) return 1;
        printf("  geometry     base %d, z %d, dim_mult (", q.base_dim, q.z_dim);
        for (int i = 0; i < q.n_mult; i++) printf("%s%d", i ? "," : "", q.dim_mult[i]);
        printf("), %d res blocks, %dx upsampling\n", q.num_res_blocks, q.scale_factor);
        return 0;
    }
    dt_vae_config v;
    const int kl = cls && !strcmp(cls, "AutoencoderKL");   /* FLUX.1's / Z-Image's: no batch norm, scaling + shift */
    if (kl ? dt_vae_kl_read_config(path, &v) : dt_vae_read_config(path, &v)) return 1;
    if (kl) printf("  geometry     latent %d (scaling %g, shift %g), blocks (", v.latent_channels, v.scaling_factor,
                   v.shift_factor);
    else printf("  geometry     latent %d x patch %d, blocks (", v.latent_channels, v.patch);
    for (int i = 0; i < v.n_blocks; i++) printf("%s%d", i ? "," : "", v.block_out[i]);
    printf("), %d layers per block, %d groups, %dx upsampling\n", v.layers_per_block, v.norm_groups, v.scale_factor);
    return 0;
}

/* Summarise one set of tensors. Returns 0, 1 when it was printed but its config is invalid (error set), or -1 when
 * it cannot be read (error set). */
static int describe(const char *label, const char *path) {
    int invalid = 0, known;
    dt_weights *w = dt_weights_open(path);
    if (!w) return -1;
    /* BFL / mflux transformers: diffusers names and, without config.json, the geometry from the shapes */
    flux2_layout layout = flux2_layout_detect(w);
    if (layout != FLUX2_LAYOUT_UNKNOWN && flux2_layout_install(w)) dt_clear_error();
    size_t n = dt_weights_count(w), bytes = 0, per_dtype[DT_DTYPE_COUNT] = {0}, bytes_dtype[DT_DTYPE_COUNT] = {0};
    int qlin = 0, qbits = 0, qgroup = 0, mixed = 0;
    int f8lin[2] = {0, 0}, f8chan = 0, f8input = 0, f8unscaled = 0, blk[DT_DTYPE_COUNT] = {0}, nblk = 0, comfy_quant = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        bytes += t->nbytes;
        per_dtype[t->dtype]++;
        bytes_dtype[t->dtype] += t->nbytes;
        size_t len = strlen(t->name);
        if (len > 12 && !strcmp(t->name + len - 12, ".comfy_quant")) comfy_quant++;
        if ((dt_dtype_is_fp8(t->dtype) || dt_dtype_is_block(t->dtype)) && t->ndim == 2 && len > 7 &&
            !strcmp(t->name + len - 7, ".weight")) {
            char base[512];
            snprintf(base, sizeof base, "%.*s", (int)(len - 7), t->name);
            dt_linear_src src;
            if (dt_weights_linear(w, base, -1, -1, 0, &src) == 0) {
                if (dt_linear_src_blocks(&src)) { blk[src.dtype]++; nblk++; }
                else {
                    f8lin[src.dtype == DT_F8_E5M2]++;
                    f8chan += src.w_scales != NULL;
                    f8input += src.input_scale != 0;
                    if (!src.w_scales && src.w_scale == 1.0f) f8unscaled++;
                }
            } else {
                dt_clear_error();
            }
        }
        if (t->dtype == DT_U32 && len > 7 && !strcmp(t->name + len - 7, ".weight")) {
            char base[512];
            snprintf(base, sizeof base, "%.*s", (int)(len - 7), t->name);
            dt_linear_src src;
            if (dt_weights_linear(w, base, -1, -1, -1, &src) == 0 && src.bits) {
                if (qlin && (src.bits != qbits || src.group_size != qgroup)) mixed = 1;
                qbits = src.bits; qgroup = src.group_size; qlin++;
            }
        }
    }
    printf("%s: %s\n", label, dt_weights_path(w));
    const char *arch = dt_weights_metadata(w, "general.architecture");
    printf("  format       %s%s%s%s\n", dt_weights_container(w), arch ? " (general.architecture " : "", arch ? arch : "",
           arch ? ")" : "");
    const json *cfg = dt_weights_config(w);
    const char *cls = cfg ? json_get_str(cfg, "_class_name") : NULL;
    if (!cls && cfg) {
        const json *arch = json_get(cfg, "architectures");
        if (arch && arch->type == JSON_ARRAY && arch->len && json_at(arch, 0)->type == JSON_STRING) cls = json_at(arch, 0)->str;
    }
    if (cls) printf("  class        %s\n", cls);
    if (layout != FLUX2_LAYOUT_UNKNOWN)
        printf("  layout       %s keys%s%s\n", flux2_layout_name(layout),
               layout == FLUX2_LAYOUT_BFL || layout == FLUX2_LAYOUT_MFLUX ? " (mapped to diffusers names)" : "",
               json_get_bool(cfg, "_ditrun_inferred", 0) ? "; no config.json, geometry inferred from tensor shapes" : "");
    /* a family's transformer (by class, or by its keys: quantized folders often drop _class_name) */
    const dt_family *fam = dt_family_for_config(cfg);
    if (fam) {
        if (fam->describe(cfg, stdout)) {
            printf("  geometry     (config invalid: %s)\n", dt_last_error());
            invalid = 1;
        }
    } else if ((known = describe_encoder_or_vae(label, path, cls)) >= 0) {
        if (known) printf("  geometry     (config invalid: %s)\n", dt_last_error());
        invalid = known;
    } else if (cfg) {
        const char *keys[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                              "intermediate_size", "vocab_size", "latent_channels", "num_layers", "attention_head_dim",
                              "base_dim", "z_dim", "num_text_layers", "text_hidden_dim"};
        /* Qwen3-VL text encoders keep the text model's geometry under text_config */
        const json *tc = json_get(cfg, "text_config"), *gc = tc && tc->type == JSON_OBJECT ? tc : cfg;
        int any = 0;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const json *v = json_get(gc, keys[k]);
            if (v && v->type == JSON_NUMBER) { printf("%s%s=%g", any ? ", " : "  config       ", keys[k], v->number); any = 1; }
        }
        if (any) printf("\n");
    }
    printf("  tensors      %zu\n", n);
    printf("  bytes        %zu (%.2f GB)\n", bytes, bytes / 1e9);
    printf("  dtypes      ");
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        if (per_dtype[d]) printf(" %s x%zu (%.1f MB)", dt_dtype_name((dt_dtype)d), per_dtype[d], bytes_dtype[d] / 1e6);
    printf("\n");
    if (qlin) printf("  quantized    %d Linears, MLX affine %d-bit, group %d%s\n", qlin, qbits, qgroup, mixed ? " (mixed)" : "");
    for (int e = 0; e < 2; e++)
        if (f8lin[e])
            printf("  quantized    %d Linears fp8 %s, weight scales %s%s%s%s\n", f8lin[e], e ? "e5m2" : "e4m3",
                   f8chan ? "per output channel" : "per tensor", f8unscaled ? " (some none: scale 1)" : "",
                   f8input ? "; input_scale present (not used: activations are scaled per token)" : "",
                   dt_weights_metadata(w, "_quantization_metadata") || comfy_quant || dt_weights_find(w, "model.diffusion_model.scaled_fp8") ||
                           dt_weights_find(w, "scaled_fp8") ? "; ComfyUI quantization markers" : "");
    if (nblk) {
        printf("  quantized    %d Linears GGUF blocks:", nblk);
        for (int d = 0; d < DT_DTYPE_COUNT; d++)
            if (blk[d]) printf(" %s x%d", dt_dtype_name((dt_dtype)d), blk[d]);
        printf("\n");
    }
    if (!qlin && !f8lin[0] && !f8lin[1] && !nblk) printf("  quantized    none (dense)\n");
    if (invalid) {   /* keep the config's error, naming the component */
        char why[900];
        snprintf(why, sizeof why, "%s", dt_last_error());
        dt_set_error("%s: invalid config: %s", dt_weights_path(w), why);
    }
    dt_weights_close(w);
    return invalid;
}

/* Keeps the first problem found (the one line info ends with). */
static void note_problem(char *problem, size_t n, const char *msg) {
    if (!problem[0]) snprintf(problem, n, "%s", msg);
}

/* A pipeline root: transformer, text_encoder and vae are described, the scheduler config checked, and every
 * component a pipeline needs (and every one model_index.json lists as [library, class]) must be there. Returns the
 * exit code: 1 with one error line naming the first problem, after printing everything that could be read. */
static int describe_pipeline(const char *path, const char *index) {
    json *idx = json_parse_file(index);
    if (!idx) return cli_error("%s", dt_last_error());
    if (idx->type != JSON_OBJECT) { json_free(idx); return cli_error("%s: not a JSON object", index); }
    const char *cls = json_get_str(idx, "_class_name");
    int krea2 = cls && !strncmp(cls, "Krea2", 5);
    printf("pipeline: %s (%s, distilled: %s)\n", path, cls ? cls : "?", json_get_bool(idx, "is_distilled", 0) ? "yes" : "no");
    char p[4200], problem[1200] = "", msg[1200];
    static const char *described[] = {"transformer", "text_encoder", "vae"};
    for (size_t c = 0; c < sizeof described / sizeof described[0]; c++) {
        snprintf(p, sizeof p, "%s/%s", path, described[c]);
        if (!is_dir(p)) {
            snprintf(msg, sizeof msg, "%.400s: no '%s' folder (a pipeline root has transformer/, text_encoder/, vae/, "
                     "tokenizer/%s)", path, described[c], krea2 ? ", scheduler/" : " and optionally scheduler/");
            note_problem(problem, sizeof problem, msg);
            continue;
        }
        if (describe(described[c], p)) note_problem(problem, sizeof problem, dt_last_error());
    }
    snprintf(p, sizeof p, "%s/tokenizer/tokenizer.json", path);
    if (is_file(p)) printf("tokenizer: %s\n", p);
    else {
        snprintf(msg, sizeof msg, "%.400s: no tokenizer/tokenizer.json", path);
        note_problem(problem, sizeof problem, msg);
    }
    snprintf(p, sizeof p, "%s/scheduler", path);
    if (is_dir(p) || krea2) {   /* FLUX.2-klein runs on the scheduler defaults without one; Krea 2 needs its own */
        dt_sched_config sc;
        if (dt_sched_config_load(p, &sc)) note_problem(problem, sizeof problem, dt_last_error());
        else if (sc.use_dynamic_shifting) printf("scheduler: dynamic shifting, %d train timesteps\n", sc.num_train_timesteps);
        else printf("scheduler: shift %g, %d train timesteps\n", sc.shift, sc.num_train_timesteps);
    }
    /* components listed as [library, class] (optional ones are [null, null]) */
    for (size_t i = 0; i < idx->len; i++) {
        const json *v = idx->items[i];
        const char *k = idx->keys[i];
        if (k[0] == '_' || v->type != JSON_ARRAY || v->len != 2 || json_at(v, 1)->type != JSON_STRING) continue;
        snprintf(p, sizeof p, "%s/%s", path, k);
        if (strchr(k, '/') || !is_dir(p)) {
            snprintf(msg, sizeof msg, "%.400s: component '%.100s' (%.100s) listed in model_index.json has no folder", path,
                     k, json_at(v, 1)->str);
            note_problem(problem, sizeof problem, msg);
        }
    }
    json_free(idx);
    if (problem[0]) return cli_error("%s", problem);
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    int W = 1024, H = 1024, T = 512, tile = 0;
    int64_t budget = 0;
    long l;
    int devices = 0, kernels_given = 0;
    dt_cuda_opts co;
    if (dt_cuda_opts_from_env(&co)) return cli_error("%s", dt_last_error());
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        if (!strcmp(argv[i], "--size")) {
            char tail;
            if (!v || sscanf(v, "%dx%d%c", &W, &H, &tail) != 2 || W < 16 || H < 16 || W > 16384 || H > 16384)
                return cli_error("--size: '%s' is not a size like 1024x1024 (16..16384)", v ? v : "");
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--text-tokens")) { if (cli_parse_int(argv[i], v, 1, 32768, &l)) return 1; T = (int)l; i++; continue; }
        if (!strcmp(argv[i], "--vae-tile-size")) { if (cli_parse_int(argv[i], v, 1, 65536, &l)) return 1; tile = (int)l; i++; continue; }
        if (!strcmp(argv[i], "--max-vram")) {
            if ((budget = cli_parse_bytes(argv[i], v)) < 0) return 1;
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--devices")) { devices = 1; continue; }
        if (!strcmp(argv[i], "--kernels")) {
            if (i + 1 >= argc) return cli_error("--kernels needs a value (auto, portable)");
            if (dt_cuda_kernels_from_name(argv[++i], &co.kernels)) return cli_error("--kernels: %s", dt_last_error());
            kernels_given = 1;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) return cli_error("info: unknown option '%s' (see ditrun info --help)", argv[i]);
        if (path) return cli_error("info: only one PATH is accepted");
        path = argv[i];
    }
    if (kernels_given && !devices) return cli_error("info: --kernels goes with --devices");
    if (devices) {
        if (path) return cli_error("info: --devices takes no PATH");
        return describe_devices(co.kernels);
    }
    if (!path) { usage(stderr); return cli_error("info: PATH is required"); }
    int kind = dt_input_kind(path);   /* 0 file, 1 folder; a loop, a FIFO, a missing path: the real reason */
    if (kind < 0) return cli_error("%s", dt_last_error());
    if (kind == 1) {
        char p[4200];
        snprintf(p, sizeof p, "%s/model_index.json", path);
        struct stat st;
        if (lstat(p, &st) == 0) {
            int r = describe_pipeline(path, p);
            return r ? r : print_plan(path, W, H, T, budget, tile);
        }
        snprintf(p, sizeof p, "%s/transformer", path);
        if (is_dir(p))
            return cli_error("%s: a folder with transformer/ but no model_index.json (a pipeline root needs one; or give "
                             "a component folder)", path);
    }
    int r = describe("model", path);
    if (r != 0) return cli_error("%s", dt_last_error());
    return 0;
}
