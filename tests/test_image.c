/* test_image.c — image reading and editing preprocessing against Pillow's own results
 * (tests/images/vectors.safetensors, made by tools/make_image_vectors.py with Debian's python3-pil):
 * decoding every PNG / JPEG / WebP mode from a file and from memory, conversion to RGB and L, the
 * refusals (16-bit PNG, CMYK JPEG, truncated files, absurd sizes, animated WebP, non-images), Lanczos and
 * nearest resizing in every mode, the reference-image rule (sizes, checks, area resize + center crop,
 * [-1, 1]), the output-size rule and the inpainting init image + mask preparation; a caller's limits
 * (dt_image_limits) applied from the header: a PNG decompression bomb refused without its pixels' memory, JPEG and
 * WebP headers declaring too many pixels, the reference rule's sides and aspect ratio; the JPEG and WebP encoders
 * (decoded back within a PSNR bound per quality, their text in a COM marker / XMP chunk, bad arguments refused). */
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jpeglib.h>

#include "image/edit_prep.h"
#include "image/image.h"
#include "image/image_resample.h"
#include "io/safetensors.h"
#include "bomb_png.h"
#include "test.h"

/* Lossless formats decode to exactly Pillow's pixels (same libpng semantics, same conversions). */
#define PNG_MAX_DIFF 0
/* JPEG and lossy WebP: the same libraries as Pillow here, but other builds (SIMD paths, versions) may
 * round a colour conversion differently by one level. */
#define LOSSY_MAX_DIFF 1
/* A refused bomb may raise the peak resident memory of the process by at most this (libpng's and zlib's state and
 * one row: well under a MB; the bomb's pixels would be 192 MiB). */
#define BOMB_HWM_TOL_KB (16 * 1024)
/* Encoders, on a smooth 97x61 test picture (odd sizes: partial MCUs and macroblocks): both formats store 4:2:0
 * chroma, which bounds the best quality; measured here 48.5 dB (JPEG 100), 41.2 (JPEG 75), 44.8 (WebP 100),
 * 36.8 (WebP 75); the bounds leave ~3.5 dB for other library versions. */
#define JPEG100_MIN_PSNR 45.0
#define JPEG75_MIN_PSNR 37.5
#define WEBP100_MIN_PSNR 41.0
#define WEBP75_MIN_PSNR 33.0
/* Resizing follows Pillow's fixed-point arithmetic step for step: bit-exact expected, the contract is ±1. */
#define RESIZE_MAX_DIFF 1
/* The bilinear mask interpolation is float32 as torch computes it; values are sums of 4 products. */
#define MASK_LATENT_TOL 1e-6

static st_file *vec;
static const char *DIR_ = "tests/images";

static const st_tensor *need(const char *name) {
    const st_tensor *t = st_find(vec, name);
    if (!t) {
        printf("FAIL vectors: tensor '%s' missing\n", name);
        exit(1);
    }
    return t;
}

static char pbuf[512];
static const char *path(const char *f) {
    snprintf(pbuf, sizeof pbuf, "%s/%s", DIR_, f);
    return pbuf;
}

static uint8_t *read_bytes(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* max |a - b| over n bytes; *exact receives the count of equal bytes. */
static int max_diff(const uint8_t *a, const uint8_t *b, size_t n, size_t *exact) {
    int m = 0;
    size_t e = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m) m = d;
        e += d == 0;
    }
    if (exact) *exact = e;
    return m;
}

static int check_u8(const char *name, const uint8_t *got, const st_tensor *ref, int gw, int gh, int gc, int tol) {
    const int rc = ref->ndim == 3 ? (int)ref->shape[2] : 1;
    if (ref->shape[0] != gh || ref->shape[1] != gw || rc != gc) {
        T_FAIL(name, "size %dx%dx%d, Pillow %lldx%lldx%d", gw, gh, gc, (long long)ref->shape[1],
               (long long)ref->shape[0], rc);
        return 0;
    }
    size_t n = (size_t)gw * gh * gc, exact;
    int m = max_diff(got, ref->data, n, &exact);
    if (m > tol) {
        T_FAIL(name, "max diff %d > %d (%.2f%% exact)", m, tol, 100.0 * exact / n);
        return 0;
    }
    printf("PASS %s (max diff %d, %.2f%% exact)\n", name, m, 100.0 * exact / n);
    t_passed++;
    return 1;
}

static const char *good[] = {"rgb.png", "rgba.png", "gray.png", "graya.png", "palette.png", "palette4.png",
                             "gray1.png", "gray_trns.png", "rgb_trns.png", "gray2.png", "interlaced.png",
                             "rgb420.jpg", "rgb444.jpg", "progressive.jpg", "gray.jpg", "lossy.webp",
                             "lossless_rgba.webp", "lossy_alpha.webp"};

static void test_decode(void) {
    char name[160], key[160];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        const char *f = good[i];
        const int tol = strstr(f, ".png") || strstr(f, "lossless") ? PNG_MAX_DIFF : LOSSY_MAX_DIFF;
        dt_image im;
        snprintf(name, sizeof name, "decode %s", f);
        if (dt_image_read_file(path(f), &im)) { T_FAIL(name, "%s", dt_last_error()); continue; }
        uint8_t *rgb = dt_image_to_rgb(&im), *l = dt_image_to_l(&im);
        snprintf(key, sizeof key, "rgb.%s", f);
        snprintf(name, sizeof name, "decode %s -> RGB vs Pillow", f);
        check_u8(name, rgb, need(key), im.w, im.h, 3, tol);
        snprintf(key, sizeof key, "l.%s", f);
        snprintf(name, sizeof name, "decode %s -> L vs Pillow", f);
        check_u8(name, l, need(key), im.w, im.h, 1, tol);
        /* the same bytes from memory give the same pixels */
        size_t n;
        uint8_t *b = read_bytes(path(f), &n);
        dt_image mm;
        snprintf(name, sizeof name, "decode %s from memory", f);
        if (!b || dt_image_decode(b, n, "upload", &mm)) {
            T_FAIL(name, "%s", dt_last_error());
        } else {
            T_CHECK(name, mm.w == im.w && mm.h == im.h && mm.channels == im.channels &&
                              !memcmp(mm.px, im.px, (size_t)im.w * im.h * im.channels),
                    "differs from the file decode");
            dt_image_free(&mm);
        }
        free(b);
        free(rgb);
        free(l);
        dt_image_free(&im);
    }
    /* modes as Pillow opens them: what the resizer needs */
    struct { const char *f; int ch, nearest; } modes[] = {
        {"rgb.png", 3, 0}, {"rgba.png", 4, 0}, {"gray.png", 1, 0}, {"graya.png", 2, 0}, {"palette.png", 3, 1},
        {"gray1.png", 1, 1}, {"gray2.png", 1, 0}, {"gray_trns.png", 1, 0}, {"rgb_trns.png", 3, 0},
        {"gray.jpg", 1, 0}, {"lossy.webp", 3, 0}, {"lossy_alpha.webp", 4, 0}};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        dt_image im;
        snprintf(name, sizeof name, "mode of %s", modes[i].f);
        if (dt_image_read_file(path(modes[i].f), &im)) { T_FAIL(name, "%s", dt_last_error()); continue; }
        T_CHECK(name, im.channels == modes[i].ch && im.nearest == modes[i].nearest, "channels %d nearest %d",
                im.channels, im.nearest);
        dt_image_free(&im);
    }
}

static void test_refusals(void) {
    struct { const char *f, *why; } bad[] = {
        {"bad_rgb16.png", "16-bit"}, {"bad_gray16.png", "16-bit"}, {"bad_cmyk.jpg", "CMYK"},
        {"bad_truncated_rgb_png.png", "truncated"}, {"bad_truncated_rgb420_jpg.jpg", "truncated"},
        {"bad_truncated_progressive_jpg.jpg", "truncated"}, {"bad_truncated_lossy_webp.webp", "WebP"},
        {"bad_not_image.png", "not a PNG, JPEG or WebP"}, {"bad_empty.png", "empty"},
        {"bad_huge.png", "too large"}, {"bad_huge.jpg", "too large"}, {"bad_huge.webp", "too large"},
        {"bad_animated.webp", "animated"}, {"does_not_exist.png", "cannot open"}};
    char name[160];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dt_image im;
        snprintf(name, sizeof name, "refuse %s", bad[i].f);
        double t0 = dt_now();
        int rc = dt_image_read_file(path(bad[i].f), &im);
        double s = dt_now() - t0;
        const char *e = dt_last_error();
        if (rc == 0) { T_FAIL(name, "accepted (%dx%d)", im.w, im.h); dt_image_free(&im); continue; }
        printf("INFO %s\n", e);
        /* one line naming the file and the reason; bombs are refused from the header (no decoding time) */
        T_CHECK(name, strstr(e, bad[i].f) && strstr(e, bad[i].why) && !strchr(e, '\n') && s < 1.0,
                "error '%s' (%.2f s)", e, s);
    }
}

/* ---- limits from the header ---- */

/* The peak resident memory of this process (VmHWM, kB), or -1. */
static long hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* In a child process (its own peak memory): decode data within lim; reports whether it was refused with `why` in
 * the message, and how much the peak resident memory grew (kB). */
static int decode_in_child(const uint8_t *data, size_t n, const dt_image_limits *lim, const char *why, long *grew_kb,
                           char *msg, size_t nmsg) {
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        long h0 = hwm_kb();
        dt_image im;
        int rc = dt_image_decode_ex(data, n, "bomb.png", lim, &im);
        long grew = hwm_kb() - h0;
        char out[600];
        int refused = rc != 0 && strstr(dt_last_error(), why) != NULL;
        int k = snprintf(out, sizeof out, "%d %ld %s", refused, grew, rc ? dt_last_error() : "decoded");
        if (write(fd[1], out, (size_t)k) < 0) {}
        _exit(0);
    }
    close(fd[1]);
    char in[600] = "";
    ssize_t k = read(fd[0], in, sizeof in - 1);
    close(fd[0]);
    waitpid(pid, NULL, 0);
    if (k <= 0) return -1;
    in[k] = 0;
    int refused = 0;
    int used = 0;
    if (sscanf(in, "%d %ld %n", &refused, grew_kb, &used) < 2) return -1;
    snprintf(msg, nmsg, "%s", in + used);
    return refused;
}

static void test_header_limits(void) {
    char name[200], msg[600];
    const dt_image_limits server = {.max_pixels = (int64_t)4096 * 4096};
    /* a PNG bomb: 8192² declared (192 MiB of RGB) in well under a MB; refused from its header */
    size_t n = 0;
    uint8_t *bomb = bomb_png(8192, 8192, &n);
    if (!bomb) { T_FAIL("PNG bomb: written", "libpng failed"); return; }
    long grew = -1;
    int refused = decode_in_child(bomb, n, &server, "too large", &grew, msg, sizeof msg);
    snprintf(name, sizeof name, "PNG bomb 8192x8192 (%zu bytes) over a 4096² limit: refused from the header, peak memory "
             "+%ld kB < %d kB", n, grew, BOMB_HWM_TOL_KB);
    T_CHECK(name, refused == 1 && grew >= 0 && grew < BOMB_HWM_TOL_KB, "refused %d, +%ld kB: %s", refused, grew, msg);
    /* the measurement sees a decode: within the default limits the same file is decoded, its pixels counted */
    refused = decode_in_child(bomb, n, NULL, "too large", &grew, msg, sizeof msg);
    snprintf(name, sizeof name, "PNG bomb within the default limits: decoded, peak memory +%ld kB (the check above can "
             "see a decode)", grew);
    T_CHECK(name, refused == 0 && !strcmp(msg, "decoded") && grew > 8192L * 8192 * 3 / 1024 * 9 / 10, "refused %d, "
            "+%ld kB: %s", refused, grew, msg);
    free(bomb);

    /* a JPEG whose frame header declares 6000x6000 (36 M pixels), the data cut short: refused from the header */
    struct jpeg_compress_struct cj;
    struct jpeg_error_mgr je;
    cj.err = jpeg_std_error(&je);
    jpeg_create_compress(&cj);
    unsigned char *jb = NULL;
    unsigned long jn = 0;
    jpeg_mem_dest(&cj, &jb, &jn);
    cj.image_width = 64;
    cj.image_height = 64;
    cj.input_components = 3;
    cj.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cj);
    jpeg_start_compress(&cj, TRUE);
    uint8_t row[64 * 3] = {0};
    JSAMPROW rp = row;
    while (cj.next_scanline < cj.image_height) jpeg_write_scanlines(&cj, &rp, 1);
    jpeg_finish_compress(&cj);
    jpeg_destroy_compress(&cj);
    int patched = 0;
    for (unsigned long i = 0; i + 9 < jn && !patched; i++)
        if (jb[i] == 0xFF && jb[i + 1] == 0xC0) {   /* SOF0: length(2) precision(1) height(2) width(2) */
            jb[i + 5] = 6000 >> 8; jb[i + 6] = 6000 & 255;
            jb[i + 7] = 6000 >> 8; jb[i + 8] = 6000 & 255;
            patched = 1;
        }
    dt_image im;
    int rc = patched ? dt_image_decode_ex(jb, jn, "big.jpg", &server, &im) : 0;
    T_CHECK("JPEG header of 6000x6000 over a 4096² limit: refused naming the limit", patched && rc != 0 &&
            strstr(dt_last_error(), "big.jpg") && strstr(dt_last_error(), "too large") &&
            strstr(dt_last_error(), "16777216"), "patched %d rc %d: %s", patched, rc, dt_last_error());
    free(jb);

    /* a lossless WebP whose VP8L header declares 5000x5000: refused from the header (libwebp's feature probe) */
    uint8_t wp[40] = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'L', 13, 0, 0, 0, 0x2f};
    const uint32_t bits = (5000u - 1) | (5000u - 1) << 14;
    for (int i = 0; i < 4; i++) wp[21 + i] = (uint8_t)(bits >> (8 * i));
    const uint32_t riff = sizeof wp - 8;
    for (int i = 0; i < 4; i++) wp[4 + i] = (uint8_t)(riff >> (8 * i));
    rc = dt_image_decode_ex(wp, sizeof wp, "big.webp", &server, &im);
    T_CHECK("WebP header of 5000x5000 over a 4096² limit: refused naming the limit", rc != 0 &&
            strstr(dt_last_error(), "big.webp") && strstr(dt_last_error(), "too large"), "rc %d: %s", rc, dt_last_error());
    if (rc == 0) dt_image_free(&im);

    /* the reference rule as limits: a 63-pixel side and a 9:1 aspect ratio refused from the header; 64x64 passes */
    const dt_image_limits ref = dt_prep_reference_limits(0);
    struct { int w, h; const char *why; } chk[] = {{63, 80, "at least 64"}, {9 * 64 + 8, 64, "at most 8:1"},
                                                   {64, 64, NULL}};
    for (size_t i = 0; i < sizeof chk / sizeof *chk; i++) {
        uint8_t *p = bomb_png(chk[i].w, chk[i].h, &n);
        rc = dt_image_decode_ex(p, n, "ref.png", &ref, &im);
        snprintf(name, sizeof name, "reference limits from the header: %dx%d %s", chk[i].w, chk[i].h,
                 chk[i].why ? "refused" : "accepted");
        if (chk[i].why) T_CHECK(name, rc != 0 && strstr(dt_last_error(), chk[i].why), "rc %d: %s", rc, dt_last_error());
        else T_CHECK(name, rc == 0 && im.w == 64, "%s", dt_last_error());
        if (rc == 0) dt_image_free(&im);
        free(p);
    }
}

static void test_resize(void) {
    char name[200], key[200];
    for (size_t i = 0; i < st_count(vec); i++) {
        const st_tensor *t = st_at(vec, i);
        if (strncmp(t->name, "resize.", 7)) continue;
        char f[64];
        int w, h;
        const char *spec = t->name + 7, *dot = strrchr(spec, '.');
        snprintf(f, sizeof f, "%.*s", (int)(dot - spec), spec);
        if (sscanf(dot + 1, "%dx%d", &w, &h) != 2) continue;
        dt_image im, r;
        snprintf(name, sizeof name, "resize %s to %dx%d (Pillow LANCZOS)", f, w, h);
        if (dt_image_read_file(path(f), &im) || dt_image_resize(&im, w, h, &r)) {
            T_FAIL(name, "%s", dt_last_error());
            continue;
        }
        uint8_t *rgb = dt_image_to_rgb(&r), *l = dt_image_to_l(&r);
        check_u8(name, rgb, t, w, h, 3, RESIZE_MAX_DIFF);
        snprintf(key, sizeof key, "resize_l.%s", spec);
        snprintf(name, sizeof name, "resize %s to %dx%d, then L", f, w, h);
        check_u8(name, l, need(key), w, h, 1, RESIZE_MAX_DIFF);
        free(rgb);
        free(l);
        dt_image_free(&r);
        dt_image_free(&im);
    }
}

/* The value the image processor gives u (table from numpy) and our normalization, for every u8. */
static void test_normalize(void) {
    const st_tensor *t = need("normalize_table");
    uint8_t u[256];
    for (int i = 0; i < 256; i++) u[i] = (uint8_t)i;
    /* as a 256 x 1 image of gray RGB triples: all three planes must equal the table */
    uint8_t rgb[256 * 3];
    for (int i = 0; i < 256; i++) rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = u[i];
    float out[3 * 256];
    dt_prep_normalize(rgb, 256, 1, out);
    int bad = 0;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 256; i++) bad += memcmp(&out[c * 256 + i], (const float *)t->data + i, 4) != 0;
    T_CHECK("normalize 2*(u/255)-1 bit-exact vs numpy float32", bad == 0, "%d values differ", bad);
}

/* prepared [3, h, w] floats -> u8 through the table (exact inverse: the table is strictly increasing). */
static void denorm(const dt_prep_image *p, uint8_t *rgb) {
    const float *tab = need("normalize_table")->data;
    const size_t hw = (size_t)p->w * p->h;
    for (size_t i = 0; i < hw; i++)
        for (int c = 0; c < 3; c++) {
            const float v = p->rgb[(size_t)c * hw + i];
            int lo = 0, hi = 255;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (tab[mid] < v) lo = mid + 1;
                else hi = mid;
            }
            rgb[3 * i + (size_t)c] = (uint8_t)(tab[lo] == v ? lo : 0xFF ^ lo);   /* non-table value: flagged */
        }
}

static void test_reference_rule(void) {
    /* sizes: the area rule and the floor, for sizes around and far above 1024² */
    const st_tensor *t = need("ref_sizes");
    const int32_t *r = t->data;
    int bad = 0;
    for (int64_t i = 0; i < t->shape[0]; i++, r += 7) {
        int rw, rh;
        dt_prep_area_size(r[0], r[1], &rw, &rh);
        int fw = rw / r[2] * r[2], fh = rh / r[2] * r[2];
        if (rw != r[3] || rh != r[4] || fw != r[5] || fh != r[6]) {
            printf("INFO %dx%d (multiple %d): got %dx%d -> %dx%d, reference %dx%d -> %dx%d\n", r[0], r[1], r[2], rw, rh,
                   fw, fh, r[3], r[4], r[5], r[6]);
            bad++;
        }
    }
    T_CHECK("reference sizes: area rule (1024² kept, more resized) and floor", bad == 0, "%d of %lld differ", bad,
            (long long)t->shape[0]);

    /* the editing fixtures' references with the tiny VAE's multiple (8) */
    const char *refs[] = {"ref0.png", "ref1.png"};
    char name[160], key[64], p[256];
    dt_prep_image prep[2] = {{0}};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/edit/%s", t_fixtures(), refs[k]);
        dt_image im;
        snprintf(name, sizeof name, "reference %s prepared (crop, RGB, [-1,1])", refs[k]);
        if (dt_image_read_file(p, &im) || dt_prep_reference(&im, p, 8, &prep[k])) {
            T_FAIL(name, "%s", dt_last_error());
            continue;
        }
        snprintf(key, sizeof key, "ref.%s", refs[k]);
        uint8_t *u = malloc((size_t)prep[k].w * prep[k].h * 3);
        denorm(&prep[k], u);
        check_u8(name, u, need(key), prep[k].w, prep[k].h, 3, 0);
        free(u);
        dt_image_free(&im);
    }
    T_CHECK("reference sizes of the fixtures", prep[0].w == 96 && prep[0].h == 72 && prep[1].w == 64 && prep[1].h == 72,
            "%dx%d, %dx%d", prep[0].w, prep[0].h, prep[1].w, prep[1].h);
    int H = 0, W = 0;
    dt_prep_output_size(prep, 2, &H, &W);
    T_CHECK("output size from the first reference", H == 72 && W == 96, "%dx%d", W, H);
    H = 64;
    W = 0;
    dt_prep_output_size(prep, 2, &H, &W);
    T_CHECK("output size: a given side is kept", H == 64 && W == 96, "%dx%d", W, H);
    H = 0;
    W = 0;
    dt_prep_output_size(prep, 0, &H, &W);
    T_CHECK("output size without references stays unset", H == 0 && W == 0, "%dx%d", W, H);
    for (int k = 0; k < 2; k++) dt_prep_image_free(&prep[k]);

    /* a large image: Lanczos to the 1024² area, floor to 16, center crop (sampled values vs Pillow) */
    const int32_t *bs = need("big.size")->data;
    const int BW = bs[0], BH = bs[1];
    dt_image big = {.w = BW, .h = BH, .channels = 3, .nearest = 0, .px = malloc((size_t)BW * BH * 3)};
    for (int y = 0; y < BH; y++)
        for (int x = 0; x < BW; x++) {
            uint8_t *q = big.px + ((size_t)y * BW + x) * 3;
            q[0] = (uint8_t)((x * 3 + y * 5) % 256);
            q[1] = (uint8_t)(((int64_t)x * y / 7) % 256);
            q[2] = (uint8_t)(((x ^ y) * 11) % 256);
        }
    dt_prep_image bp;
    if (dt_prep_reference(&big, "big", 16, &bp)) {
        T_FAIL("large reference prepared", "%s", dt_last_error());
    } else {
        T_CHECK("large reference: size after area resize + crop", bp.w == bs[4] && bp.h == bs[5],
                "%dx%d, reference %dx%d", bp.w, bp.h, bs[4], bs[5]);
        if (bp.w == bs[4] && bp.h == bs[5]) {
            uint8_t *u = malloc((size_t)bp.w * bp.h * 3);
            denorm(&bp, u);
            const st_tensor *smp = need("big.sample");
            const int step = ((const int32_t *)need("big.sample_step")->data)[0];
            uint8_t *got = malloc((size_t)smp->numel);
            for (int64_t i = 0; i < smp->numel; i++) got[i] = u[i * step];
            size_t exact;
            int m = max_diff(got, smp->data, (size_t)smp->numel, &exact);
            T_CHECK("large reference: Lanczos to 1024² area vs Pillow (sampled)", m <= RESIZE_MAX_DIFF,
                    "max diff %d (%.2f%% exact)", m, 100.0 * exact / smp->numel);
            printf("INFO large reference %dx%d -> %dx%d: %zu of %lld samples exact\n", BW, BH, bp.w, bp.h, exact,
                   (long long)smp->numel);
            free(got);
            free(u);
        }
        dt_prep_image_free(&bp);
    }
    dt_image_free(&big);

    /* the checks: a 63-pixel side, an aspect ratio over 8 (exactly 8 passes) */
    struct { int w, h, ok; const char *why; } chk[] = {
        {63, 100, 0, "at least 64"}, {100, 63, 0, "at least 64"}, {64, 64, 1, ""}, {512, 64, 1, ""},
        {520, 64, 0, "at most 8:1"}, {64, 600, 0, "at most 8:1"}};
    for (size_t i = 0; i < sizeof chk / sizeof *chk; i++) {
        dt_image im = {.w = chk[i].w, .h = chk[i].h, .channels = 1, .px = calloc((size_t)chk[i].w * chk[i].h, 1)};
        dt_prep_image pp;
        snprintf(name, sizeof name, "reference check %dx%d %s", chk[i].w, chk[i].h, chk[i].ok ? "accepted" : "refused");
        int rc = dt_prep_reference(&im, "refX.png", 16, &pp);
        if (chk[i].ok) {
            T_CHECK(name, rc == 0 && pp.w == chk[i].w / 16 * 16, "%s", dt_last_error());
            dt_prep_image_free(&pp);
        } else {
            T_CHECK(name, rc != 0 && strstr(dt_last_error(), "refX.png") && strstr(dt_last_error(), chk[i].why),
                    "rc %d, '%s'", rc, dt_last_error());
        }
        dt_image_free(&im);
    }
}

static void inpaint_case(const char *tag, const char *init_path, const char *mask_path, int multiple) {
    char name[160], key[96];
    dt_image init, mask;
    snprintf(name, sizeof name, "inpaint %s: read", tag);
    if (dt_image_read_file(init_path, &init) || dt_image_read_file(mask_path, &mask)) {
        T_FAIL(name, "%s", dt_last_error());
        return;
    }
    dt_prep_image p;
    float *m01 = NULL, *lat = NULL;
    snprintf(name, sizeof name, "inpaint %s: prepare", tag);
    if (dt_prep_init_image(&init, init_path, multiple, &p) ||
        dt_prep_mask(&mask, mask_path, init.w, init.h, p.w, p.h, multiple, &m01, &lat)) {
        T_FAIL(name, "%s", dt_last_error());
        dt_image_free(&init);
        dt_image_free(&mask);
        return;
    }
    snprintf(key, sizeof key, "inpaint.%s.size", tag);
    const int32_t *sz = need(key)->data;
    snprintf(name, sizeof name, "inpaint %s: output size (from the init image)", tag);
    T_CHECK(name, p.w == sz[0] && p.h == sz[1], "%dx%d, reference %dx%d", p.w, p.h, sz[0], sz[1]);
    if (p.w == sz[0] && p.h == sz[1]) {
        uint8_t *u = malloc((size_t)p.w * p.h * 3);
        denorm(&p, u);
        snprintf(key, sizeof key, "inpaint.%s.init", tag);
        snprintf(name, sizeof name, "inpaint %s: init image (Lanczos stretch, [-1,1]) vs Pillow", tag);
        check_u8(name, u, need(key), p.w, p.h, 3, RESIZE_MAX_DIFF);
        free(u);
        snprintf(key, sizeof key, "inpaint.%s.mask", tag);
        const float *rm = need(key)->data;
        size_t n = (size_t)p.w * p.h, bad = 0;
        for (size_t i = 0; i < n; i++) bad += m01[i] != rm[i];
        snprintf(name, sizeof name, "inpaint %s: binarized mask vs Pillow", tag);
        T_CHECK(name, bad == 0, "%zu of %zu differ", bad, n);
        snprintf(key, sizeof key, "inpaint.%s.mask_latent", tag);
        const st_tensor *rl = need(key);
        double md = 0;
        for (int64_t i = 0; i < rl->numel; i++) {
            double d = fabs((double)lat[i] - ((const float *)rl->data)[i]);
            if (d > md) md = d;
        }
        snprintf(name, sizeof name, "inpaint %s: mask on the latent grid (bilinear)", tag);
        T_CHECK(name, rl->numel == (int64_t)(p.w / multiple) * (p.h / multiple) && md <= MASK_LATENT_TOL,
                "%lld values, max diff %.3g", (long long)rl->numel, md);
    }
    free(m01);
    free(lat);
    dt_prep_image_free(&p);
    dt_image_free(&init);
    dt_image_free(&mask);
}

static void test_inpaint(void) {
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/edit/ref9.png", t_fixtures());
    snprintf(b, sizeof b, "%s/edit/mask.png", t_fixtures());
    inpaint_case("fixture", a, b, 8);
    snprintf(a, sizeof a, "%s/edit/ref0.png", t_fixtures());
    char m[256];
    snprintf(m, sizeof m, "%s/mask_rgb.png", DIR_);
    inpaint_case("stretch", a, m, 8);
    inpaint_case("stretch16", a, m, 16);
    /* a mask of another size than the init image */
    dt_image init, mask;
    dt_prep_image p;
    float *lat = NULL;
    snprintf(b, sizeof b, "%s/edit/mask.png", t_fixtures());
    if (dt_image_read_file(a, &init) || dt_image_read_file(b, &mask)) {
        T_FAIL("inpaint: mask of another size refused", "%s", dt_last_error());
        return;
    }
    int rc = dt_prep_init_image(&init, a, 8, &p);
    int rc2 = rc ? -1 : dt_prep_mask(&mask, b, init.w, init.h, p.w, p.h, 8, NULL, &lat);
    T_CHECK("inpaint: mask of another size refused", rc == 0 && rc2 != 0 && strstr(dt_last_error(), "mask.png") &&
                                                         strstr(dt_last_error(), "same size"),
            "'%s'", dt_last_error());
    free(lat);
    dt_prep_image_free(&p);
    dt_image_free(&init);
    dt_image_free(&mask);
}

/* Inpainting's reference batch: every reference center-cropped (never resized) to the first one's floored size with
 * PIL's crop box: left = floor((w - fw) / 2) (Python's floor division: a 101-wide image in a 128-wide box starts at
 * column 14 of the box, not 13), black outside the image. Exact values: nothing is interpolated. */
static void test_inpaint_reference_batch(void) {
    const int FW = 128, FH = 96;
    struct { int w, h, ch; } cases[] = {{101, 77, 3}, {300, 200, 1}, {128, 96, 4}, {90, 150, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int w = cases[c].w, h = cases[c].h, ch = cases[c].ch;
        dt_image im = {.w = w, .h = h, .channels = ch, .px = malloc((size_t)w * h * ch)};
        for (int i = 0; i < w * h * ch; i++) im.px[i] = (uint8_t)(1 + (i * 37 + i / 7) % 250);   /* never 0 */
        dt_prep_image pp;
        char name[96];
        snprintf(name, sizeof name, "inpainting reference batch: %dx%d (%d channels) in a %dx%d box", w, h, ch, FW, FH);
        if (dt_prep_reference_in_batch(&im, "ref.png", FW, FH, &pp)) {
            T_FAIL(name, "%s", dt_last_error());
            dt_image_free(&im);
            continue;
        }
        uint8_t *u = malloc((size_t)FW * FH * 3), *rgb = dt_image_to_rgb(&im);
        denorm(&pp, u);
        const int dx = w - FW, dy = h - FH;
        const int left = dx >= 0 ? dx / 2 : -((-dx + 1) / 2), top = dy >= 0 ? dy / 2 : -((-dy + 1) / 2);
        int bad = 0;
        for (int y = 0; y < FH && !bad; y++)
            for (int x = 0; x < FW && !bad; x++)
                for (int k = 0; k < 3; k++) {
                    const int sx = left + x, sy = top + y;
                    const int want = sx < 0 || sy < 0 || sx >= w || sy >= h ? 0 : rgb[((size_t)sy * w + sx) * 3 + k];
                    if (u[((size_t)y * FW + x) * 3 + k] != want) { bad = 1; break; }
                }
        T_CHECK(name, pp.w == FW && pp.h == FH && !bad, "size %dx%d, values differ from the crop box", pp.w, pp.h);
        free(u);
        free(rgb);
        dt_prep_image_free(&pp);
        dt_image_free(&im);
    }
    dt_image small = {.w = 63, .h = 100, .channels = 3, .px = calloc(63 * 100 * 3, 1)};
    dt_prep_image pp;
    int rc = dt_prep_reference_in_batch(&small, "tiny.png", FW, FH, &pp);
    T_CHECK("inpainting reference batch: a 63-pixel side refused", rc != 0 && strstr(dt_last_error(), "tiny.png"), "rc %d",
            rc);
    dt_image_free(&small);
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n) {
    double se = 0;
    for (size_t i = 0; i < n; i++) se += (double)(a[i] - b[i]) * (a[i] - b[i]);
    return se == 0 ? 99.0 : 10 * log10(255.0 * 255.0 * (double)n / se);
}

static int has_bytes(const uint8_t *hay, size_t n, const char *needle) {
    return memmem(hay, n, needle, strlen(needle)) != NULL;
}

static void test_encode(void) {
    const int w = 97, h = 61;
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(128 + 100 * sin(x * 0.11) * cos(y * 0.07));
            p[1] = (uint8_t)(x * 255 / (w - 1));
            p[2] = (uint8_t)(y * 255 / (h - 1) / 2 + 60 + 30 * sin((x + y) * 0.2));
        }
    const dt_image_text text[] = {{"prompt", "a fox & \"snow\" <b>"}, {"seed", "7"}, {"Software", "ditrun"}};
    static const struct { int webp, quality; double min_psnr; } cs[] = {
        {0, 100, JPEG100_MIN_PSNR}, {0, 75, JPEG75_MIN_PSNR}, {1, 100, WEBP100_MIN_PSNR}, {1, 75, WEBP75_MIN_PSNR}};
    size_t sizes[4] = {0};
    for (int k = 0; k < 4; k++) {
        uint8_t *out = NULL;
        size_t n = 0;
        const char *fmt = cs[k].webp ? "WebP" : "JPEG";
        int rc = cs[k].webp ? dt_image_encode_webp(px, w, h, cs[k].quality, text, 3, &out, &n)
                            : dt_image_encode_jpeg(px, w, h, cs[k].quality, text, 3, &out, &n);
        dt_image im;
        memset(&im, 0, sizeof im);
        const int magic = rc == 0 && (cs[k].webp ? n > 12 && !memcmp(out, "RIFF", 4) && !memcmp(out + 8, "WEBP", 4)
                                                 : n > 3 && out[0] == 0xFF && out[1] == 0xD8 && out[2] == 0xFF);
        const int dec = magic && dt_image_decode(out, n, "encoded", &im) == 0 && im.w == w && im.h == h && im.channels == 3;
        const double q = dec ? psnr(px, im.px, (size_t)w * h * 3) : 0;
        char name[160];
        snprintf(name, sizeof name, "encode %s quality %d: decodes to %dx%d RGB within PSNR >= %.0f dB", fmt,
                 cs[k].quality, w, h, cs[k].min_psnr);
        T_CHECK(name, dec && q >= cs[k].min_psnr, "rc %d magic %d decoded %d, PSNR %.2f dB (%s)", rc, magic, dec, q,
                rc ? dt_last_error() : "");
        printf("# %s quality %d: %zu bytes, PSNR %.2f dB\n", fmt, cs[k].quality, n, q);
        /* the text: JPEG one COM marker (FF FE) of "key: value" lines; WebP an XMP chunk with escaped attributes */
        int meta = 0;
        if (rc == 0 && !cs[k].webp)
            meta = has_bytes(out, n, "\xFF\xFE") && has_bytes(out, n, "prompt: a fox & \"snow\" <b>\nseed: 7\nSoftware: ditrun\n");
        if (rc == 0 && cs[k].webp)
            meta = has_bytes(out, n, "VP8X") && has_bytes(out, n, "XMP ") &&
                   has_bytes(out, n, "ditrun:prompt=\"a fox &amp; &quot;snow&quot; &lt;b&gt;\"") &&
                   has_bytes(out, n, "ditrun:seed=\"7\"");
        snprintf(name, sizeof name, "encode %s quality %d: the parameters in the file (%s)", fmt, cs[k].quality,
                 cs[k].webp ? "XMP chunk" : "COM marker");
        T_CHECK(name, meta, "text not found in %zu bytes", n);
        sizes[k] = n;
        dt_image_free(&im);
        free(out);
    }
    T_CHECK("encode: quality 75 files are smaller than quality 100", sizes[1] < sizes[0] && sizes[3] < sizes[2],
            "JPEG %zu vs %zu, WebP %zu vs %zu", sizes[1], sizes[0], sizes[3], sizes[2]);
    uint8_t *out = NULL;
    size_t n = 0;
    T_CHECK("encode: bad arguments refused (quality 101, width 0, WebP side over 16383)",
            dt_image_encode_jpeg(px, w, h, 101, NULL, 0, &out, &n) && dt_image_encode_jpeg(px, 0, h, 90, NULL, 0, &out, &n) &&
                dt_image_encode_webp(px, w, h, 101, NULL, 0, &out, &n) &&
                dt_image_encode_webp(px, 16384, 1, 90, NULL, 0, &out, &n) && !out,
            "accepted");
    free(px);
}

int main(void) {
    test_encode();
    vec = st_open(path("vectors.safetensors"));
    if (!vec) {
        printf("FAIL vectors: %s\n", dt_last_error());
        return 1;
    }
    test_decode();
    test_refusals();
    test_header_limits();
    test_resize();
    test_normalize();
    test_reference_rule();
    test_inpaint();
    test_inpaint_reference_batch();
    st_close(vec);
    return T_DONE();
}
