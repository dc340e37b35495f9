/* png.c — deterministic RGB8 PNG writer with text chunks, and an RGB8 reader (libpng). The writer filters and
 * deflates the image data in bands of rows on several threads (zlib), libpng frames the chunks; the file writer goes
 * through core/outfile.h (a temporary renamed over the target when complete); the reader opens only regular files. */
#include "image/png.h"

#include <errno.h>
#include <png.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/common.h"
#include "core/infile.h"
#include "core/outfile.h"

static void png_err_cb(png_structp png, png_const_charp msg) {
    const char *path = (const char *)png_get_error_ptr(png);
    int err = errno;
    if (!strcmp(msg, "Write Error") && err) dt_set_error("%s: write failed: %s", path ? path : "(png)", strerror(err));
    else dt_set_error("%s: PNG error: %s", path ? path : "(png)", msg);
    png_longjmp(png, 1);
}

static void png_warn_cb(png_structp png, png_const_charp msg) {
    const char *path = (const char *)png_get_error_ptr(png);
    dt_log(2, "%s: PNG warning: %s\n", path ? path : "(png)", msg);
}

static int key_ok(const char *k) {
    size_t n = strlen(k);
    if (n < 1 || n > 79 || k[0] == ' ' || k[n - 1] == ' ') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)k[i];
        if (!((c >= 32 && c <= 126) || c >= 161)) return 0;
        if (c == ' ' && k[i + 1] == ' ') return 0;
    }
    return 1;
}

static int is_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s >= 128) return 0;
    return 1;
}

/* In-memory output of dt_png_encode (libpng's write callback appends here). */
typedef struct {
    uint8_t *data;
    size_t len, cap;
} mem_sink;

static void mem_write(png_structp png, png_bytep data, png_size_t n) {
    mem_sink *m = (mem_sink *)png_get_io_ptr(png);
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 65536;
        while (cap < m->len + n) cap *= 2;
        m->data = dt_realloc(m->data, cap);
        m->cap = cap;
    }
    memcpy(m->data + m->len, data, n);
    m->len += n;
}

static void mem_flush(png_structp png) { (void)png; }

/* ---- the image data: rows filtered and deflated in bands, in parallel ----
 * The rows are cut into bands of BAND_ROWS rows (the cut depends on the size only, so the bytes never depend on the
 * thread count). Each band's rows are Paeth-filtered and deflated on their own as raw deflate ending in a
 * Z_SYNC_FLUSH (the last band: Z_FINISH), so the bands concatenate into one valid deflate stream; the zlib header
 * goes before it and the adler32 of all filtered bytes (adler32_combine over the bands) after it, as pigz does.
 * Level 1 runs Z_RLE (matches at distance 1 only: nothing is lost at a band's start), other levels zlib's default
 * strategy (each band starts with an empty window: a little larger than one stream). */
#define BAND_ROWS 32
#define MAX_THREADS 16

typedef struct {
    const uint8_t *rgb;
    int w, h, level, n_bands;
    uint8_t **out;        /* [n_bands] deflated bytes */
    size_t *out_len;
    uLong *adler;         /* [n_bands] adler32 of the band's filtered bytes */
    size_t *raw_len;      /* [n_bands] filtered bytes */
    int next;             /* the next band to take (atomic) */
    int failed;           /* atomic */
} band_work;

static inline uint8_t paeth(int a, int b, int c) {
    const int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return (uint8_t)(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

/* Filter type byte 4 (Paeth) and the row's filtered bytes; prev NULL: the first row (the row above is zeros). */
static void filter_row(uint8_t *dst, const uint8_t *row, const uint8_t *prev, int w) {
    const int n = w * 3;
    dst[0] = 4;
    uint8_t *d = dst + 1;
    if (!prev) {
        for (int i = 0; i < 3; i++) d[i] = row[i];
        for (int i = 3; i < n; i++) d[i] = (uint8_t)(row[i] - row[i - 3]);   /* Paeth(a, 0, 0) = a */
        return;
    }
    for (int i = 0; i < 3; i++) d[i] = (uint8_t)(row[i] - prev[i]);          /* Paeth(0, b, 0) = b */
    for (int i = 3; i < n; i++) d[i] = (uint8_t)(row[i] - paeth(row[i - 3], prev[i], prev[i - 3]));
}

/* Filter and deflate band b with z (a raw deflate stream, reset here); buf holds the band's filtered rows. */
static int deflate_band(band_work *bw, z_stream *z, uint8_t *buf, int b) {
    const size_t stride = (size_t)bw->w * 3, fstride = stride + 1;
    const int y0 = b * BAND_ROWS, y1 = y0 + BAND_ROWS < bw->h ? y0 + BAND_ROWS : bw->h;
    for (int y = y0; y < y1; y++)
        filter_row(buf + (size_t)(y - y0) * fstride, bw->rgb + (size_t)y * stride,
                   y ? bw->rgb + (size_t)(y - 1) * stride : NULL, bw->w);
    const size_t raw = (size_t)(y1 - y0) * fstride;
    const size_t cap = deflateBound(z, (uLong)raw) + 16;   /* + the sync flush's empty stored block */
    uint8_t *out = malloc(cap);
    if (!out || deflateReset(z) != Z_OK) {
        free(out);
        return -1;
    }
    z->next_in = buf;
    z->avail_in = (uInt)raw;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    const int last = b == bw->n_bands - 1;
    const int rc = deflate(z, last ? Z_FINISH : Z_SYNC_FLUSH);
    if ((last ? rc != Z_STREAM_END : rc != Z_OK) || z->avail_in != 0) {
        free(out);
        return -1;
    }
    bw->out[b] = out;
    bw->out_len[b] = cap - z->avail_out;
    bw->raw_len[b] = raw;
    bw->adler[b] = adler32(adler32(0L, Z_NULL, 0), buf, (uInt)raw);
    return 0;
}

/* One thread: take bands until none is left (or one failed). */
static void *band_thread(void *arg) {
    band_work *bw = arg;
    z_stream z;
    memset(&z, 0, sizeof z);
    const int strategy = bw->level == 1 ? Z_RLE : Z_DEFAULT_STRATEGY;
    uint8_t *buf = malloc((size_t)BAND_ROWS * ((size_t)bw->w * 3 + 1));
    if (!buf || deflateInit2(&z, bw->level, Z_DEFLATED, -15, 8, strategy) != Z_OK) {
        free(buf);
        __atomic_store_n(&bw->failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    for (;;) {
        const int b = __atomic_fetch_add(&bw->next, 1, __ATOMIC_RELAXED);
        if (b >= bw->n_bands || __atomic_load_n(&bw->failed, __ATOMIC_RELAXED)) break;
        if (deflate_band(bw, &z, buf, b)) {
            __atomic_store_n(&bw->failed, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    deflateEnd(&z);
    free(buf);
    return NULL;
}

int dt_png_threads_default(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

/* Deflate the whole image into bw (the caller frees bw->out[*] and the arrays). 0 or -1 (error set, naming what). */
static int deflate_bands(band_work *bw, int threads, const char *what) {
    if (threads <= 0) threads = dt_png_threads_default();
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > bw->n_bands) threads = bw->n_bands;
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tid[started], NULL, band_thread, bw)) break;   /* fewer threads: still correct */
        started++;
    }
    band_thread(bw);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    if (bw->failed) {
        dt_set_error("%s: PNG deflate failed (out of memory?)", what);
        return -1;
    }
    return 0;
}

/* The part of the writer that runs under setjmp; everything it needs is allocated by the caller, the image data
 * already deflated (bw). The bytes go to fp, or to mem when fp is NULL. */
static int write_body(png_structp png, png_infop info, FILE *fp, mem_sink *mem, const band_work *bw, png_textp txt,
                      int n_text) {
    if (setjmp(png_jmpbuf(png))) return -1;
    if (fp) png_init_io(png, fp);
    else png_set_write_fn(png, mem, mem_write, mem_flush);
    png_set_IHDR(png, info, (png_uint_32)bw->w, (png_uint_32)bw->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (n_text > 0) png_set_text(png, info, txt, n_text);
    png_write_info(png, info);   /* signature, IHDR, the text chunks */
    /* the zlib stream: header (CMF 0x78: deflate with a 32 KiB window; FLG: the level's class, check bits), the
     * bands, the adler32 of all filtered bytes (big-endian); one IDAT chunk per band */
    const int flevel = bw->level <= 1 ? 0 : bw->level <= 5 ? 1 : bw->level == 6 ? 2 : 3;
    uint8_t head[2] = {0x78, (uint8_t)(flevel << 6)};
    head[1] = (uint8_t)(head[1] + 31 - ((head[0] << 8) + head[1]) % 31);
    uLong adler = bw->adler[0];
    for (int b = 1; b < bw->n_bands; b++) adler = adler32_combine(adler, bw->adler[b], (z_off_t)bw->raw_len[b]);
    const uint8_t tail[4] = {(uint8_t)(adler >> 24), (uint8_t)(adler >> 16), (uint8_t)(adler >> 8), (uint8_t)adler};
    static const png_byte idat[5] = {'I', 'D', 'A', 'T', '\0'}, iend[5] = {'I', 'E', 'N', 'D', '\0'};
    for (int b = 0; b < bw->n_bands; b++) {
        const int first = b == 0, last = b == bw->n_bands - 1;
        png_write_chunk_start(png, idat, (png_uint_32)(bw->out_len[b] + (first ? 2 : 0) + (last ? 4 : 0)));
        if (first) png_write_chunk_data(png, head, 2);
        png_write_chunk_data(png, bw->out[b], bw->out_len[b]);
        if (last) png_write_chunk_data(png, tail, 4);
        png_write_chunk_end(png);
    }
    png_write_chunk(png, iend, NULL, 0);
    png_write_flush(png);
    return 0;
}

/* The arguments of a write, checked before anything is created. what names the output in errors. */
static int check_args(const char *what, int w, int h, const dt_png_text *text, int n_text, const dt_png_opts *o) {
    if (o && (o->level < 0 || o->level > 9)) {
        dt_set_error("%s: invalid PNG compression level %d (1..9, 0 = the default)", what, o->level);
        return -1;
    }
    if (w <= 0 || h <= 0 || w > 1000000 || h > 1000000) {
        dt_set_error("%s: invalid PNG size %dx%d", what, w, h);
        return -1;
    }
    if (n_text < 0 || (n_text > 0 && !text)) {
        dt_set_error("%s: invalid text list", what);
        return -1;
    }
    for (int i = 0; i < n_text; i++) {
        if (!text[i].key || !key_ok(text[i].key)) {
            dt_set_error("%s: invalid PNG text key '%s' (1..79 printable Latin-1 characters)", what,
                         text[i].key ? text[i].key : "(null)");
            return -1;
        }
        if (!text[i].value) {
            dt_set_error("%s: PNG text '%s' has no value", what, text[i].key);
            return -1;
        }
    }
    return 0;
}

/* libpng's text entries for a text list: tEXt for ASCII values, uncompressed iTXt (UTF-8) otherwise. */
static void fill_text(png_textp txt, const dt_png_text *text, int n_text) {
    for (int i = 0; i < n_text; i++) {
        txt[i].key = (png_charp)text[i].key;
        txt[i].text = (png_charp)text[i].value;
        txt[i].text_length = strlen(text[i].value);
        if (is_ascii(text[i].value)) {
            txt[i].compression = PNG_TEXT_COMPRESSION_NONE;
        } else {
#ifdef PNG_iTXt_SUPPORTED
            txt[i].compression = PNG_ITXT_COMPRESSION_NONE;
            txt[i].lang = NULL;
            txt[i].lang_key = NULL;
            txt[i].itxt_length = txt[i].text_length;
            txt[i].text_length = 0;
#else
            txt[i].compression = PNG_TEXT_COMPRESSION_NONE;
#endif
        }
    }
}

/* One whole PNG to fp or (fp NULL) to mem: the image data deflated in bands, then the libpng structures and the
 * text list around write_body. */
static int encode(const char *what, FILE *fp, mem_sink *mem, const uint8_t *rgb, int w, int h, const dt_png_text *text,
                  int n_text, const dt_png_opts *o) {
    band_work bw = {.rgb = rgb, .w = w, .h = h, .level = o && o->level ? o->level : DT_PNG_LEVEL_DEFAULT};
    bw.n_bands = (h + BAND_ROWS - 1) / BAND_ROWS;
    bw.out = dt_calloc((size_t)bw.n_bands, sizeof *bw.out);
    bw.out_len = dt_calloc((size_t)bw.n_bands, sizeof *bw.out_len);
    bw.adler = dt_calloc((size_t)bw.n_bands, sizeof *bw.adler);
    bw.raw_len = dt_calloc((size_t)bw.n_bands, sizeof *bw.raw_len);
    int rc = deflate_bands(&bw, o ? o->threads : 0, what);
    if (rc == 0) {
        png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, (png_voidp)what, png_err_cb, png_warn_cb);
        png_infop info = png ? png_create_info_struct(png) : NULL;
        png_textp txt = n_text > 0 ? dt_calloc((size_t)n_text, sizeof *txt) : NULL;
        rc = -1;
        if (!png || !info) {
            dt_set_error("%s: cannot initialize libpng", what);
        } else {
            fill_text(txt, text, n_text);
            rc = write_body(png, info, fp, mem, &bw, txt, n_text);
        }
        png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
        free(txt);
    }
    for (int b = 0; b < bw.n_bands; b++) free(bw.out[b]);
    free(bw.out);
    free(bw.out_len);
    free(bw.adler);
    free(bw.raw_len);
    return rc;
}

int dt_png_write(const char *path, const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text) {
    if (check_args(path, w, h, text, n_text, NULL)) return -1;
    dt_outfile *of = dt_outfile_open(path);
    if (!of) return -1;
    errno = 0;
    if (encode(path, dt_outfile_fp(of), NULL, rgb, w, h, text, n_text, NULL) == 0)
        return dt_outfile_commit(of);   /* flush, fsync, rename over the target */
    dt_outfile_abort(of);               /* the target, if any, is untouched */
    return -1;
}

int dt_png_encode(const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text, uint8_t **png, size_t *len) {
    return dt_png_encode_opts(rgb, w, h, text, n_text, NULL, png, len);
}

int dt_png_encode_opts(const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text, const dt_png_opts *o,
                       uint8_t **png, size_t *len) {
    *png = NULL;
    *len = 0;
    if (check_args("(png in memory)", w, h, text, n_text, o)) return -1;
    mem_sink m = {NULL, 0, 0};
    if (encode("(png in memory)", NULL, &m, rgb, w, h, text, n_text, o)) {
        free(m.data);
        return -1;
    }
    *png = m.data;
    *len = m.len;
    return 0;
}

/* Reader state that must survive a longjmp lives in this struct (not in locals of the setjmp frame). */
typedef struct {
    uint8_t *pix;
    png_bytep *rows;
    dt_png_text *text;
    int n_text;
} read_state;

static int read_body(png_structp png, png_infop info, FILE *fp, read_state *st, int *w_out, int *h_out,
                     int want_text) {
    if (setjmp(png_jmpbuf(png))) return -1;
    png_init_io(png, fp);
    png_set_user_limits(png, 65536, 65536);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int ct = png_get_color_type(png, info), bd = png_get_bit_depth(png, info);
    if (bd == 16) png_set_strip_16(png);
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) png_error(png, "unexpected row size after conversion");
    st->pix = malloc((size_t)w * h * 3);
    st->rows = malloc((size_t)h * sizeof *st->rows);
    if (!st->pix || !st->rows) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++) st->rows[y] = st->pix + (size_t)y * w * 3;
    png_read_image(png, st->rows);
    png_read_end(png, info);
    if (want_text) {
        png_textp t = NULL;
        int n = png_get_text(png, info, &t, NULL);
        if (n > 0) {
            st->text = calloc((size_t)n, sizeof *st->text);
            if (!st->text) png_error(png, "out of memory");
            for (int i = 0; i < n; i++) {
                size_t len = t[i].compression >= PNG_ITXT_COMPRESSION_NONE ? t[i].itxt_length : t[i].text_length;
                char *k = strdup(t[i].key ? t[i].key : "");
                char *v = malloc(len + 1);
                if (!k || !v) { free(k); free(v); png_error(png, "out of memory"); }
                if (len) memcpy(v, t[i].text, len);
                v[len] = 0;
                st->text[i].key = k;
                st->text[i].value = v;
                st->n_text = i + 1;
            }
        }
    }
    *w_out = (int)w;
    *h_out = (int)h;
    return 0;
}

int dt_png_read(const char *path, uint8_t **rgb, int *w, int *h, dt_png_text **text, int *n_text) {
    *rgb = NULL;
    if (text) { *text = NULL; *n_text = 0; }
    FILE *fp = dt_fopen_input(path);
    if (!fp) return -1;
    unsigned char sig[8];
    if (fread(sig, 1, 8, fp) != 8 || png_sig_cmp(sig, 0, 8) != 0) {
        fclose(fp);
        dt_set_error("%s: not a PNG file", path);
        return -1;
    }
    rewind(fp);
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, (png_voidp)path, png_err_cb, png_warn_cb);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    read_state *st = dt_calloc(1, sizeof *st);
    int rc = -1;
    if (!png || !info) dt_set_error("%s: cannot initialize libpng", path);
    else rc = read_body(png, info, fp, st, w, h, text != NULL);
    png_destroy_read_struct(png ? &png : NULL, info ? &info : NULL, NULL);
    fclose(fp);
    free(st->rows);
    if (rc == 0) {
        *rgb = st->pix;
        if (text) { *text = st->text; *n_text = st->n_text; }
    } else {
        free(st->pix);
        dt_png_text_free(st->text, st->n_text);
    }
    free(st);
    return rc;
}

void dt_png_text_free(dt_png_text *text, int n_text) {
    if (!text) return;
    for (int i = 0; i < n_text; i++) {
        free((char *)text[i].key);
        free((char *)text[i].value);
    }
    free(text);
}

const char *dt_png_text_get(const dt_png_text *text, int n_text, const char *key) {
    for (int i = 0; i < n_text; i++)
        if (text[i].key && !strcmp(text[i].key, key)) return text[i].value;
    return NULL;
}
