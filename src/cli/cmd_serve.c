/* cmd_serve.c — `ditrun serve`: the options of the HTTP server (serve/serve.h) and its start. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "core/infile.h"
#include "serve/serve.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditrun serve [--model ROOT] [options]\n\n"
            "Keeps a pipeline loaded and serves images over HTTP: POST /v1/images/generations (OpenAI Images API shape,\n"
            "\"stream\": true for progress events), GET /health, /v1/models, /metrics, and a web page at GET /.\n"
            "Without --model the bundled tiny model (tests/fixtures/model, random weights) is used.\n\n"
            "options:\n"
            "  --model ROOT                pipeline root (default: the bundled tiny model)\n"
            "  --model-id NAME             the model's name in /v1/models and requests (default: ROOT's folder name)\n"
            "  --host ADDR                 address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N                    port (default 8080; 0 = any free port, printed in the \"listening on\" line)\n"
            "  --max-queue N               requests that may wait for the model; past that 429 (default 16)\n"
            "  --max-pixels N              width * height of one image at most (default: 2048x2048 on a GPU; on the\n"
            "                              CPU 1024x1024, the native size: minutes an image there, 2048x2048 tens of minutes;\n"
            "                              lower, down to the page's default size, where that size's memory plan would\n"
            "                              slow every image or not fit: logged)\n"
            "  --max-queued-image-bytes N  decoded upload bytes that edits hold together while queued or running\n"
            "                              (width x height x channels of each image, known from the headers before\n"
            "                              decoding); past that 429 with Retry-After, or 413 for one edit alone over it\n"
            "                              (default 2147483648 = 2 GiB; one edit's images: at most 4096x4096 each)\n"
            "  --max-steps N               steps of one request at most (default 100)\n"
            "  --max-sequence-length N     text tokens of every request (default 512, as generate)\n"
            "  --api-key-file FILE         every /v1 route needs \"Authorization: Bearer KEY\" with the key on FILE's\n"
            "                              first line (/health, /metrics and the page stay open)\n"
            "  --warmup WxH                generate one image of this size before /health reports ready (attention\n"
            "                              plans, GEMM choices, kernels), e.g. 1024x1024 (default: none)\n"
            "  --cors ORIGIN               allow browsers on ORIGIN (e.g. https://example.com) to call the API\n"
            "                              ('*': any site, e.g. behind your own gateway; default: no CORS headers)\n"
            "  --allow-host NAME           accept requests whose Host header is NAME (repeatable); without it only\n"
            "                              localhost, IP addresses and --host's name are accepted (421 otherwise:\n"
            "                              DNS rebinding). Needed to reach a --host 0.0.0.0 server by a host name\n"
            "  --request-timeout S         seconds a connection has to send a whole request, headers and body (not\n"
            "                              restarted by each byte; counted from the connection or its last answer);\n"
            "                              past it the connection is closed (default 60)\n"
            "  --max-client-connections N  connections one client address may hold at once; more are closed when\n"
            "                              accepted (default 32; raise it behind a reverse proxy)\n"
            "  --backend cpu|cuda|auto     (default auto: cuda when a GPU is usable)\n"
            "  --threads N                 CPU threads (default: all cores)\n"
            "  --qpath auto|mixed|fused|transient|cached   quantized weight path on CUDA\n"
            "  --precision bf16|fp8        the DiT blocks' Linears (fp8: opt-in, see ditrun generate --help)\n"
            "  --attn-precision bf16|fp8   the DiT blocks' attention (opt-in)\n"
            "  --cache SPEC                step caching of requests that name none (default off; a request's\n"
            "                              \"cache\" overrides it): first-block=T or taylorseer=N[:ORDER] (see\n"
            "                              ditrun generate --help)\n"
            "  --cuda-graph                replay the DiT forward as a CUDA graph\n"
            "  --guidance-batch on|off     a guided step's two passes in one forward or two (default on: one)\n"
            "  --kernels auto|portable     CUDA: portable takes the paths of a non-Hopper card on any card\n"
            "  --no-prefetch               CUDA: no transient-weight prefetch (the models' hints ignored; A/B timings)\n"
            "  --max-vram SIZE             GPU memory budget of each worker (K, M, G suffixes: 12G; default: the card's\n"
            "                              free memory): the CUDA pool refuses to hold more; planned for the largest\n"
            "                              image (--max-pixels): the VAE tiles, the text encoder is reloaded for each\n"
            "                              new prompt, when needed; a budget nothing fits is refused before loading\n"
            "  --devices all|I,J,...       CUDA: one worker per listed GPU (all: every visible GPU), each with its own\n"
            "                              copy of the pipeline, behind the one queue (default: device 0)\n"
            "  --sequence-parallel N       each worker's DiT forward split over N GPUs (NCCL, libnccl.so.2): the\n"
            "                              devices are taken N at a time (--devices all on 4 GPUs with N = 2: 2 workers\n"
            "                              of 2 GPUs); on the CPU backend N thread ranks (tests). docs/sequence-parallel.md\n"
            "  --vae-tiling                decode (and encode) images larger than one VAE tile in overlapping tiles,\n"
            "                              blended (diffusers' enable_tiling); --vae-tile-size N: the tile side in\n"
            "                              pixels (see ditrun generate --help)\n"
            "  --lora FILE[:SCALE]         a LoRA adapter for the DiT, loaded with the model (repeatable, up to 8;\n"
            "                              see ditrun generate --help); --lora-side: side products on dense weights too\n"
            "  -q, --quiet / -v, --verbose\n\n"
            "SIGTERM or SIGINT: stop accepting connections, finish the accepted requests, exit 0.\n\n"
            "examples, from the repository's root (sizes for the CPU backend, where 256x256 takes seconds and 1024x1024\n"
            "minutes; on a GPU use 1024x1024, a fraction of a second; the server logs each request's estimated time):\n"
            "  ditrun serve --port 8080                     # the bundled tiny model; the page at http://127.0.0.1:8080/\n"
            "  save() { python3 -c 'import sys, json, base64; sys.stdout.buffer.write(base64.b64decode(json.load(sys.stdin)[\"data\"][0][\"b64_json\"]))' > \"$1\"; }\n"
            "  curl -s http://127.0.0.1:8080/v1/images/generations -H 'Content-Type: application/json' \\\n"
            "       -d '{\"prompt\": \"a red fox in the snow\", \"size\": \"256x256\", \"seed\": 1}' | save fox.png\n"
            "  curl -s http://127.0.0.1:8080/v1/images/edits -F prompt='make it blue' -F size=256x256 \\\n"
            "       -F 'image[]=@tests/fixtures/edit/edit2.png' | save edit.png\n"
            "  curl -s http://127.0.0.1:8080/v1/images/edits -F prompt='a hole in the wall' \\\n"
            "       -F 'image[]=@tests/fixtures/edit/inpaint.png' -F mask=@tests/fixtures/edit/mask.png | save inpainted.png\n");
}

/* --devices all|I,J,...: the CUDA device list into d (at most DT_SERVE_MAX_WORKERS). The count, or -1 (error printed). */
static int parse_devices(const char *v, const char *backend, int *d) {
    if (!v || !*v) { cli_error("--devices needs a value (all, or GPU indices like 0,1)"); return -1; }
    if (!strcmp(backend, "cpu")) {
        cli_error("--devices picks GPUs; the cpu backend runs one worker (use --backend cuda)");
        return -1;
    }
    int have = dt_backend_cuda_available() ? dt_backend_cuda_device_count() : 0;
    if (have <= 0) {
        cli_error("--devices %s: no usable CUDA GPU (%s)", v, dt_backend_cuda_available() ? "none visible" : "no CUDA");
        return -1;
    }
    int n = 0;
    if (!strcmp(v, "all")) {
        for (int i = 0; i < have && n < DT_SERVE_MAX_WORKERS; i++) d[n++] = i;
        return n;
    }
    for (const char *p = v; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 4096 || (*end && *end != ',')) {
            cli_error("--devices: '%s' is not 'all' or a comma-separated list of GPU indices", v);
            return -1;
        }
        if (x >= have) {
            cli_error("--devices: GPU %ld does not exist (%d visible: 0..%d)", x, have, have - 1);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (d[i] == x) { cli_error("--devices: GPU %ld is listed twice", x); return -1; }
        if (n == DT_SERVE_MAX_WORKERS) { cli_error("--devices: at most %d GPUs", DT_SERVE_MAX_WORKERS); return -1; }
        d[n++] = (int)x;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* The key on the first line of path (trailing spaces and line ends dropped): malloc'd, or NULL (error printed). */
static char *read_key(const char *path) {
    FILE *f = dt_fopen_input(path);   /* a FIFO or device is refused without waiting */
    if (!f) { cli_error("--api-key-file %s", dt_last_error()); return NULL; }
    char line[4096];
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    if (!got) { cli_error("--api-key-file %s: the file is empty", path); return NULL; }
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = 0;
    if (n == 0) { cli_error("--api-key-file %s: the first line holds no key", path); return NULL; }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)line[i] < 0x21 || (unsigned char)line[i] > 0x7e) {
            cli_error("--api-key-file %s: the key has a space or a non-printable character", path);
            return NULL;
        }
    return dt_strdup(line);
}

int cmd_serve(int argc, char **argv) {
    dt_serve_opts o;
    dt_serve_opts_default(&o);
    cli_model_opts mo;
    cli_model_opts_default(&mo);
    const char *key_file = NULL, *devices = NULL;
    static cli_lora_opts lor;   /* (static: 32 KB of adapter paths) */
    cli_vae_opts vo = {0, 0};
    long l;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_model_opt(&mo, argc, argv, &i);
        if (!r) r = cli_lora_opt(&lor, argc, argv, &i);
        if (!r) r = cli_vae_opt(&vo, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { if (!v) return cli_error("--model needs a value"); o.load.model = v; i++; }
        else if (!strcmp(a, "--model-id")) { if (!v || !*v) return cli_error("--model-id needs a value"); o.model_id = v; i++; }
        else if (!strcmp(a, "--host")) { if (!v || !*v) return cli_error("--host needs a value"); o.host = v; i++; }
        else if (!strcmp(a, "--port")) { if (cli_parse_int(a, v, 0, 65535, &l)) return 1; o.port = (int)l; i++; }
        else if (!strcmp(a, "--max-queue")) { if (cli_parse_int(a, v, 1, 100000, &l)) return 1; o.max_queue = (int)l; i++; }
        else if (!strcmp(a, "--max-pixels")) { if (cli_parse_int(a, v, 1, 1L << 40, &l)) return 1; o.max_pixels = l; i++; }
        else if (!strcmp(a, "--max-queued-image-bytes")) { if (cli_parse_int(a, v, 1, 1L << 50, &l)) return 1; o.max_image_bytes = l; i++; }
        else if (!strcmp(a, "--max-steps")) { if (cli_parse_int(a, v, 1, 1000, &l)) return 1; o.max_steps = (int)l; i++; }
        else if (!strcmp(a, "--max-sequence-length")) { if (cli_parse_int(a, v, 1, 32768, &l)) return 1; o.max_seq_len = (int)l; i++; }
        else if (!strcmp(a, "--api-key-file")) { if (!v) return cli_error("--api-key-file needs a value"); key_file = v; i++; }
        else if (!strcmp(a, "--devices")) { if (!v) return cli_error("--devices needs a value (all, or GPU indices like 0,1)"); devices = v; i++; }
        else if (!strcmp(a, "--sequence-parallel")) { if (cli_parse_int(a, v, 1, DT_GEN_MAX_RANKS, &l)) return 1; o.load.sequence_parallel = (int)l; i++; }
        else if (!strcmp(a, "--cache")) {
            if (!v) return cli_error("--cache needs a value (first-block=T or taylorseer=N[:ORDER])");
            if (dt_cache_parse(v, &o.cache)) return cli_error("--cache: %s", dt_last_error());
            i++;
        }
        else if (!strcmp(a, "--request-timeout")) { if (cli_parse_int(a, v, 1, 86400, &l)) return 1; o.request_timeout = (int)l; i++; }
        else if (!strcmp(a, "--max-client-connections")) { if (cli_parse_int(a, v, 1, 256, &l)) return 1; o.max_client_connections = (int)l; i++; }
        else if (!strcmp(a, "--allow-host")) {
            if (!v || !*v || strpbrk(v, " \t\r\n/:[]")) return cli_error("--allow-host needs a host name (no port, no scheme)");
            if (o.n_allow_hosts == DT_SERVE_MAX_ALLOW_HOSTS) return cli_error("--allow-host: at most %d names", DT_SERVE_MAX_ALLOW_HOSTS);
            o.allow_hosts[o.n_allow_hosts++] = v;
            i++;
        }
        else if (!strcmp(a, "--cors")) { if (!v || !*v) return cli_error("--cors needs an origin"); o.cors_origin = v; i++; }
        else if (!strcmp(a, "--warmup")) {
            int w = 0, h = 0;
            char tail;
            if (!v || sscanf(v, "%dx%d%c", &w, &h, &tail) != 2 || w < 1 || h < 1 || w > 16384 || h > 16384)
                return cli_error("--warmup: '%s' is not a size like 1024x1024", v ? v : "");
            o.warmup_w = w;
            o.warmup_h = h;
            i++;
        }
        else return cli_error("serve: unknown option '%s' (see ditrun serve --help)", a);
    }
    if (o.cors_origin && (strchr(o.cors_origin, '\r') || strchr(o.cors_origin, '\n')))
        return cli_error("--cors: the origin has a line break");
    if (!o.load.model) {
        o.load.model = cli_bundled_model();
        dt_log(1, "ditrun: no --model given: using the bundled tiny model %s (random weights)\n", o.load.model);
    }
    int kind = dt_input_kind(o.load.model);   /* a missing path, a FIFO, a file: said before listening */
    if (kind < 0) return cli_error("--model %s", dt_last_error());
    if (kind == 0) return cli_error("--model %s: not a folder (a pipeline root holds model_index.json)", o.load.model);
    /* workers: one per device, or per group of N devices with --sequence-parallel N */
    const int ranks = o.load.sequence_parallel > 1 ? o.load.sequence_parallel : 1;
    int nd = ranks;
    if (devices) {
        if ((nd = parse_devices(devices, mo.backend, o.devices)) < 0) return 1;
        if (nd % ranks)
            return cli_error("--devices lists %d GPU%s, not a multiple of --sequence-parallel %d", nd, nd == 1 ? "" : "s",
                             ranks);
    } else {
        for (int r = 0; r < ranks; r++) o.devices[r] = r;
    }
    o.n_workers = nd / ranks;
    char *key = NULL;
    if (key_file && !(key = read_key(key_file))) return 1;
    o.api_key = key;
    o.backend = mo.backend;
    o.be = mo.be;
    o.load.cuda_graph = mo.cuda_graph;
    o.load.guidance_batch = mo.guidance_batch;
    o.load.precision = mo.precision;
    o.load.attn_precision = mo.attn_precision;
    o.load.loras = lor.loras;
    o.load.n_loras = lor.n;
    o.load.lora_side = lor.side;
    o.load.max_vram = mo.max_vram;
    o.load.vae_tiling = vo.tiling || (vo.tile && !mo.max_vram);   /* (under --max-vram the plan decides) */
    o.load.vae_tile = vo.tile;
    int rc = dt_serve_run(&o);
    free(key);
    return rc;
}
