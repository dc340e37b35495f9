/* test_png.c — PNG writer/reader: pixel round trip, text chunks (ASCII tEXt and UTF-8 iTXt),
 * byte-identical output for identical input (file and in-memory encoder), the fixture image's pixels, and error paths;
 * the image data deflated in row bands on several threads: the pixels read back by libpng (which checks the zlib
 * stream's adler32) for odd sizes, one row, more threads than rows, every level; the bytes the same for every thread
 * count; pngcheck accepts the files when it is installed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "image/png.h"
#include "test.h"

static char path_buf[1024];
static const char *fx(const char *rel) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", t_fixtures(), rel);
    return path_buf;
}

static int contains(const unsigned char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(hay + i, needle, m)) return 1;
    return 0;
}

/* Random-ish pixels with smooth runs (what Paeth and Z_RLE see in photos), seeded. */
static uint8_t *test_pixels(int w, int h, uint32_t seed) {
    uint8_t *p = malloc((size_t)w * h * 3);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)((i / 3 % (size_t)w) * 3 + (i / 3 / (size_t)w) * 2 + ((seed >> 24) & 7));
    }
    return p;
}

/* Band-parallel PNG: every (size, threads, level) decodes to its pixels through libpng; the bytes do not depend on the
 * thread count. */
static void test_bands(const char *dir) {
    static const int sizes[][2] = {{1, 1}, {1, 31}, {5, 3}, {3000, 1}, {37, 33}, {64, 64}, {97, 65}, {1, 200}, {300, 257}};
    static const int threads[] = {1, 2, 3, 16};
    static const int levels[] = {1, 2, 6, 9};
    const int have_pngcheck = system("command -v pngcheck > /dev/null 2>&1") == 0;
    char path[512];
    snprintf(path, sizeof path, "%s/band.png", dir);
    int bad_pixels = 0, bad_bytes = 0, bad_check = 0, runs = 0;
    char why[200] = "";
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int w = sizes[si][0], h = sizes[si][1];
        uint8_t *px = test_pixels(w, h, (uint32_t)si + 1);
        for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
            uint8_t *first = NULL;
            size_t first_n = 0;
            for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
                const dt_png_opts o = {levels[li], threads[ti]};
                uint8_t *png = NULL;
                size_t n = 0;
                runs++;
                const dt_png_text text[] = {{"prompt", "bands"}};
                if (dt_png_encode_opts(px, w, h, text, 1, &o, &png, &n)) {
                    bad_pixels++;
                    snprintf(why, sizeof why, "%dx%d level %d: %s", w, h, levels[li], dt_last_error());
                    continue;
                }
                FILE *f = fopen(path, "wb");
                if (f) { fwrite(png, 1, n, f); fclose(f); }
                uint8_t *back = NULL;
                int bw = 0, bh = 0;
                if (dt_png_read(path, &back, &bw, &bh, NULL, NULL) || bw != w || bh != h ||
                    memcmp(back, px, (size_t)w * h * 3)) {
                    bad_pixels++;
                    snprintf(why, sizeof why, "%dx%d level %d threads %d: %s", w, h, levels[li], threads[ti],
                             back ? "pixels differ" : dt_last_error());
                }
                free(back);
                if (have_pngcheck && ti == 1) {
                    char cmd[600];
                    snprintf(cmd, sizeof cmd, "pngcheck -q '%s' > /dev/null 2>&1", path);
                    if (system(cmd) != 0) bad_check++;
                }
                if (!first) {
                    first = png;
                    first_n = n;
                } else {
                    if (n != first_n || memcmp(png, first, n)) bad_bytes++;
                    free(png);
                }
            }
            free(first);
        }
        free(px);
    }
    T_CHECK("png bands: pixels read back exactly (odd sizes, 1 row, 1 column, more threads than rows, levels 1-9)",
            bad_pixels == 0, "%d of %d runs: %s", bad_pixels, runs, why);
    T_CHECK("png bands: the same bytes for 1, 2, 3 and 16 threads", bad_bytes == 0, "%d runs differ", bad_bytes);
    if (have_pngcheck) T_CHECK("png bands: pngcheck accepts every file", bad_check == 0, "%d files refused", bad_check);
    else T_SKIP("png bands: pngcheck", "pngcheck not installed");
    /* a level out of range is refused */
    uint8_t *png = NULL;
    size_t n = 0;
    uint8_t px[3] = {1, 2, 3};
    const dt_png_opts o = {10, 1};
    T_CHECK("png bands: level 10 refused", dt_png_encode_opts(px, 1, 1, NULL, 0, &o, &png, &n) != 0 && !png,
            "accepted");
}

int main(void) {
    char dir_t[] = "/tmp/ditrun_png_XXXXXX";
    char *dir = mkdtemp(dir_t);
    if (!dir) { T_FAIL("tmpdir", "mkdtemp failed"); return T_DONE(); }
    char p1[256], p2[256], p3[256];
    snprintf(p1, sizeof p1, "%s/a.png", dir);
    snprintf(p2, sizeof p2, "%s/b.png", dir);
    snprintf(p3, sizeof p3, "%s/c.png", dir);

    const int W = 37, H = 23;
    uint8_t *img = malloc((size_t)W * H * 3);
    uint32_t s = 12345;
    for (int i = 0; i < W * H * 3; i++) { s = s * 1664525u + 1013904223u; img[i] = (uint8_t)(s >> 24); }
    const dt_png_text text[] = {
        {"prompt", "a red fox standing in fresh snow, golden hour"},
        {"seed", "42"},
        {"steps", "4"},
        {"size", "37x23"},
        {"model", "FLUX.2-klein-4B"},
        {"software", "ditrun 0.1"},
        {"prompt_utf8", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\xa6\x8a"},
    };
    const int nt = (int)(sizeof text / sizeof *text);

    int rc = dt_png_write(p1, img, W, H, text, nt);
    T_CHECK("png_write", rc == 0, "%s", dt_last_error());
    uint8_t *back = NULL;
    int w = 0, h = 0, n_back = 0;
    dt_png_text *tb = NULL;
    rc = dt_png_read(p1, &back, &w, &h, &tb, &n_back);
    T_CHECK("png_read", rc == 0 && w == W && h == H, "rc %d %dx%d: %s", rc, w, h, dt_last_error());
    T_CHECK("png_pixels_roundtrip", rc == 0 && !memcmp(back, img, (size_t)W * H * 3), "pixels differ");
    int all = rc == 0 && n_back == nt;
    for (int i = 0; i < nt && all; i++) {
        const char *v = dt_png_text_get(tb, n_back, text[i].key);
        all = v && !strcmp(v, text[i].value);
    }
    T_CHECK("png_text_chunks", all, "%d chunks read back (%d written) or a value differs", n_back, nt);
    free(back);
    dt_png_text_free(tb, n_back);

    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = (unsigned char *)t_slurp(p1, &n1);
    T_CHECK("png_chunk_types", b1 && contains(b1, n1, "tEXtprompt") && contains(b1, n1, "iTXtprompt_utf8") &&
                                   !contains(b1, n1, "tIME"),
            "expected tEXt for ASCII values, iTXt for UTF-8, no tIME");
    rc = dt_png_write(p2, img, W, H, text, nt);
    unsigned char *b2 = (unsigned char *)t_slurp(p2, &n2);
    T_CHECK("png_deterministic", rc == 0 && b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1),
            "two writes of the same input differ (%zu vs %zu bytes)", n1, n2);
    /* in memory: the same bytes as the file */
    uint8_t *mem = NULL;
    size_t nm = 0;
    rc = dt_png_encode(img, W, H, text, nt, &mem, &nm);
    T_CHECK("png_encode_equals_file", rc == 0 && b1 && nm == n1 && !memcmp(mem, b1, n1),
            "rc %d, %zu bytes in memory vs %zu in the file: %s", rc, nm, n1, rc ? dt_last_error() : "bytes differ");
    free(mem);
    T_CHECK("png_encode_bad_key", dt_png_encode(img, W, H, (const dt_png_text[]){{"", "x"}}, 1, &mem, &nm) != 0 &&
                                      mem == NULL && nm == 0, "empty key accepted");
    free(b1);
    free(b2);

    /* no text at all */
    rc = dt_png_write(p3, img, W, H, NULL, 0);
    rc |= dt_png_read(p3, &back, &w, &h, NULL, NULL);
    T_CHECK("png_no_text", rc == 0 && !memcmp(back, img, (size_t)W * H * 3), "%s", dt_last_error());
    free(back);

    /* the fixture image: pixels equal out.image_u8 */
    st_file *io = st_open(fx("pipeline_io.safetensors"));
    const st_tensor *u8 = io ? st_find(io, "out.image_u8") : NULL;
    rc = dt_png_read(fx("pipeline_image.png"), &back, &w, &h, NULL, NULL);
    T_CHECK("png_fixture_pixels", rc == 0 && u8 && w == 64 && h == 64 && u8->numel == 64 * 64 * 3 &&
                                      !memcmp(back, u8->data, 64 * 64 * 3),
            "rc %d %dx%d: %s", rc, w, h, rc ? dt_last_error() : "pixels differ");
    free(back);
    if (io) st_close(io);

    /* errors */
    const dt_png_text badkey[] = {{"", "x"}};
    T_CHECK("png_bad_key", dt_png_write(p3, img, W, H, badkey, 1) != 0, "empty key accepted");
    const dt_png_text longkey[] = {{"0123456789012345678901234567890123456789012345678901234567890123456789012345678"
                                    "9", "x"}};
    T_CHECK("png_long_key", dt_png_write(p3, img, W, H, longkey, 1) != 0, "80-char key accepted");
    T_CHECK("png_bad_size", dt_png_write(p3, img, 0, H, NULL, 0) != 0, "0 width accepted");
    T_CHECK("png_unwritable", dt_png_write("/nonexistent_dir/x.png", img, W, H, NULL, 0) != 0, "write succeeded");
    T_CHECK("png_read_missing", dt_png_read("/nonexistent_dir/x.png", &back, &w, &h, NULL, NULL) != 0, "read ok");
    T_CHECK("png_read_not_png", dt_png_read(fx("pipeline_case.json"), &back, &w, &h, NULL, NULL) != 0, "read ok");
    /* truncated PNG */
    b1 = (unsigned char *)t_slurp(p1, &n1);
    FILE *f = fopen(p3, "wb");
    if (f && b1) { fwrite(b1, 1, n1 / 2, f); fclose(f); }
    rc = dt_png_read(p3, &back, &w, &h, &tb, &n_back);
    T_CHECK("png_read_truncated", rc != 0 && back == NULL, "truncated file accepted");
    free(b1);

    test_bands(dir);
    char band[300];
    snprintf(band, sizeof band, "%s/band.png", dir);
    unlink(band);
    unlink(p1);
    unlink(p2);
    unlink(p3);
    rmdir(dir);
    free(img);
    return T_DONE();
}
