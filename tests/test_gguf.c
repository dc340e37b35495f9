/* test_gguf.c — the GGUF reader and writer: a file written by the streaming writer reads back with the same
 * tensors (shapes reversed to row-major, dtypes, bytes, alignment), metadata and ComfyUI-GGUF's orig_shape;
 * hand-built broken files (every truncation of a valid one, bad magic/version, absurd counts, unknown and
 * unsupported types, partial blocks, misaligned / out-of-range / overlapping offsets, duplicate names, bad
 * alignment, bad bools, deep arrays) fail with one error line naming the file and the problem. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/gguf.h"
#include "quant/ggml_quants.h"
#include "test.h"

/* ---- a little byte builder for hand-made files ---- */
typedef struct { unsigned char *b; size_t n, cap; } buf;
static void put(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) { o->cap = (o->n + n) * 2 + 64; o->b = realloc(o->b, o->cap); }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void u32(buf *o, uint32_t v) { unsigned char b[4]; for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> 8 * i); put(o, b, 4); }
static void u64(buf *o, uint64_t v) { unsigned char b[8]; for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> 8 * i); put(o, b, 8); }
static void str(buf *o, const char *s) { u64(o, strlen(s)); put(o, s, strlen(s)); }
static void pad(buf *o, size_t a) { while (o->n % a) put(o, "", 1); }

typedef struct { const char *name; uint32_t nd; uint64_t ne[5]; uint32_t type; uint64_t off; } tinfo;   /* ne[4]: the 5-D case */

/* header + kvs (already serialized in kv, nkv of them) + tensor infos + padding + data_bytes of 0x11 */
static buf make(uint32_t version, uint64_t nt_claim, const tinfo *ti, int nt, uint64_t nkv, const buf *kv, size_t data_bytes) {
    buf o = {0};
    put(&o, "GGUF", 4);
    u32(&o, version);
    u64(&o, nt_claim);
    u64(&o, nkv);
    if (kv) put(&o, kv->b, kv->n);
    for (int i = 0; i < nt; i++) {
        str(&o, ti[i].name);
        u32(&o, ti[i].nd);
        for (uint32_t d = 0; d < ti[i].nd; d++) u64(&o, ti[i].ne[d]);
        u32(&o, ti[i].type);
        u64(&o, ti[i].off);
    }
    pad(&o, 32);
    for (size_t i = 0; i < data_bytes; i++) put(&o, "\x11", 1);
    return o;
}

static void expect_fail(const char *name, const buf *o, const char *word) {
    dt_clear_error();
    gguf_file *f = gguf_open_memory(o->b, o->n, "bad.gguf");
    const char *e = dt_last_error();
    T_CHECK(name, !f && strstr(e, "bad.gguf") && strstr(e, word), "%s (error: '%s'; wanted '%s')",
            f ? "SUCCEEDED" : "failed", e, word);
    gguf_close(f);
}

int main(void) {
    char dir[512], path[600];
    if (t_tmpdir(dir, sizeof dir, "gguf")) { T_FAIL("gguf_tmpdir", "mkdtemp"); return T_DONE(); }
    snprintf(path, sizeof path, "%s/t.gguf", dir);

    /* ---- writer -> reader round trip ---- */
    float w[64 * 256], bias[64], norm[7];
    for (int i = 0; i < 64 * 256; i++) w[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < 64; i++) bias[i] = (float)i - 3.5f;
    for (int i = 0; i < 7; i++) norm[i] = 0.25f * (float)i;
    uint8_t *q4k = malloc(dt_dtype_bytes(DT_Q4_K, 64 * 256)), *q80 = malloc(dt_dtype_bytes(DT_Q8_0, 64 * 256));
    uint16_t wb[64 * 256];
    dt_ggml_quant(DT_Q4_K, w, 64 * 256, q4k);
    dt_ggml_quant(DT_Q8_0, w, 64 * 256, q80);
    for (int i = 0; i < 64 * 256; i++) wb[i] = dt_f32_to_bf16(w[i]);
    gguf_stream *s = gguf_stream_open(path);
    gguf_stream_meta_str(s, "general.architecture", "flux");
    gguf_stream_meta_u32(s, "general.quantization_version", 2);
    int32_t orig[3] = {4, 16, 256};
    gguf_stream_meta_i32_array(s, "comfy.gguf.orig_shape.q8", 3, orig);
    int64_t sh_w[2] = {64, 256}, sh_b[1] = {64}, sh_n[1] = {7};
    gguf_stream_declare(s, "double_blocks.0.img_attn.qkv.weight", DT_Q4_K, 2, sh_w);
    gguf_stream_declare(s, "q8", DT_Q8_0, 2, sh_w);
    gguf_stream_declare(s, "bf", DT_BF16, 2, sh_w);
    gguf_stream_declare(s, "bias", DT_F32, 1, sh_b);
    gguf_stream_declare(s, "norm", DT_F32, 1, sh_n);
    int wr = gguf_stream_begin_data(s) || gguf_stream_write(s, q4k, dt_dtype_bytes(DT_Q4_K, 64 * 256)) ||
             gguf_stream_write(s, q80, 100) || gguf_stream_write(s, q80 + 100, dt_dtype_bytes(DT_Q8_0, 64 * 256) - 100) ||
             gguf_stream_write(s, wb, sizeof wb) || gguf_stream_write(s, bias, sizeof bias) || gguf_stream_write(s, norm, sizeof norm);
    wr = wr || gguf_stream_close(s);
    T_CHECK("gguf_write", !wr && access(path, F_OK) == 0, "%s", dt_last_error());
    gguf_file *f = gguf_open(path);
    if (!f) { T_FAIL("gguf_read_back", "%s", dt_last_error()); return T_DONE(); }
    const st_tensor *t = gguf_find(f, "double_blocks.0.img_attn.qkv.weight");
    T_CHECK("gguf_read_shape_reversed", t && t->ndim == 2 && t->shape[0] == 64 && t->shape[1] == 256 && t->dtype == DT_Q4_K &&
            t->nbytes == dt_dtype_bytes(DT_Q4_K, 64 * 256) && !memcmp(t->data, q4k, t->nbytes),
            "shape/dtype/bytes of the Q4_K tensor");
    t = gguf_find(f, "q8");
    T_CHECK("gguf_read_orig_shape", t && t->ndim == 3 && t->shape[0] == 4 && t->shape[1] == 16 && t->shape[2] == 256 &&
            !memcmp(t->data, q80, t->nbytes), "comfy.gguf.orig_shape not applied");
    t = gguf_find(f, "bf");
    T_CHECK("gguf_read_bf16", t && t->dtype == DT_BF16 && !memcmp(t->data, wb, sizeof wb), "bf16 bytes");
    t = gguf_find(f, "norm");
    T_CHECK("gguf_read_f32_aligned", t && t->numel == 7 && !memcmp(t->data, norm, sizeof norm) &&
            ((const unsigned char *)t->data - (const unsigned char *)gguf_at(f, 0)->data) % 32 == 0, "f32 tensor");
    T_CHECK("gguf_meta", gguf_version(f) == 3 && gguf_count(f) == 5 && !strcmp(gguf_meta(f, "general.architecture"), "flux") &&
            !strcmp(gguf_meta(f, "general.quantization_version"), "2") && !gguf_meta(f, "nope") && gguf_meta_count(f) == 3,
            "version/count/metadata");
    gguf_close(f);

    /* ---- every truncation of the valid file fails cleanly ---- */
    {
        FILE *fp = fopen(path, "rb");
        fseek(fp, 0, SEEK_END);
        long n = ftell(fp);
        rewind(fp);
        unsigned char *all = malloc((size_t)n);
        size_t got = fread(all, 1, (size_t)n, fp);
        fclose(fp);
        int bad = 0;
        for (long k = 0; k < n && got == (size_t)n; k += (k < 1024 ? 1 : 97)) {
            gguf_file *g = gguf_open_memory(all, (size_t)k, "cut.gguf");
            if (g || !strstr(dt_last_error(), "cut.gguf")) bad++;
            gguf_close(g);
        }
        T_CHECK("gguf_every_truncation_fails", bad == 0, "%d truncated images were accepted or unnamed", bad);
        free(all);
    }

    /* ---- hand-made broken files ---- */
    tinfo ok = {"w", 2, {32, 4}, 8 /* Q8_0 */, 0};
    buf o;
    o = make(3, 1, &ok, 1, 0, NULL, 4 * 34);
    dt_clear_error();
    f = gguf_open_memory(o.b, o.n, "good.gguf");
    T_CHECK("gguf_minimal_valid", f && gguf_count(f) == 1 && gguf_at(f, 0)->shape[0] == 4, "%s", dt_last_error());
    gguf_close(f);
    free(o.b);
    o = make(3, 1, &ok, 1, 0, NULL, 4 * 34);
    memcpy(o.b, "GGUG", 4);
    expect_fail("gguf_bad_magic", &o, "not a GGUF file");
    free(o.b);
    o = make(1, 1, &ok, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_version1", &o, "version 1");
    free(o.b);
    o = make(0x03000000u, 1, &ok, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_version_unknown", &o, "version");
    free(o.b);
    o = make(3, 1ull << 40, &ok, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_absurd_tensor_count", &o, "tensor count");
    free(o.b);
    o = make(3, 1, &ok, 1, 1ull << 50, NULL, 4 * 34);
    expect_fail("gguf_absurd_metadata_count", &o, "metadata count");
    free(o.b);
    tinfo t_unknown = ok; t_unknown.type = 77;
    o = make(3, 1, &t_unknown, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_unknown_type", &o, "unknown ggml type 77");
    free(o.b);
    tinfo t_q3 = ok; t_q3.type = 11; t_q3.ne[0] = 256;
    o = make(3, 1, &t_q3, 1, 0, NULL, 4 * 110);
    expect_fail("gguf_unsupported_type", &o, "Q3_K");
    free(o.b);
    tinfo t_part = ok; t_part.ne[0] = 48;
    o = make(3, 1, &t_part, 1, 0, NULL, 4 * 68);
    expect_fail("gguf_partial_block_row", &o, "whole number of Q8_0 blocks");
    free(o.b);
    tinfo t_k = ok; t_k.type = 12; t_k.ne[0] = 128;
    o = make(3, 1, &t_k, 1, 0, NULL, 4 * 144);
    expect_fail("gguf_partial_superblock_row", &o, "Q4_K blocks (256");
    free(o.b);
    tinfo t_mis = ok; t_mis.off = 16;
    o = make(3, 1, &t_mis, 1, 0, NULL, 4 * 34 + 32);
    expect_fail("gguf_misaligned_offset", &o, "not a multiple of the alignment");
    free(o.b);
    tinfo t_far = ok; t_far.off = 1ull << 40;
    o = make(3, 1, &t_far, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_offset_out_of_range", &o, "outside the data section");
    free(o.b);
    o = make(3, 1, &ok, 1, 0, NULL, 4 * 34 - 1);
    expect_fail("gguf_data_truncated", &o, "outside the data section");
    free(o.b);
    tinfo two[2] = {ok, ok};
    two[1].name = "v";
    two[1].off = 64;   /* [64, 200) overlaps [0, 136) */
    o = make(3, 2, two, 2, 0, NULL, 4 * 34 + 64);
    expect_fail("gguf_overlap", &o, "overlap");
    free(o.b);
    two[1].name = "w";
    two[1].off = 160;
    o = make(3, 2, two, 2, 0, NULL, 160 + 4 * 34);
    expect_fail("gguf_duplicate_name", &o, "appears twice");
    free(o.b);
    tinfo t_dims = ok; t_dims.nd = 5;
    o = make(3, 1, &t_dims, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_too_many_dims", &o, "dimensions");
    free(o.b);
    tinfo t_huge = ok; t_huge.ne[1] = 1ull << 62;
    o = make(3, 1, &t_huge, 1, 0, NULL, 4 * 34);
    expect_fail("gguf_shape_overflow", &o, "overflow");
    free(o.b);
    {
        buf kv = {0};
        str(&kv, "general.alignment"); u32(&kv, 4 /* u32 */); u32(&kv, 24);
        o = make(3, 1, &ok, 1, 1, &kv, 4 * 34);
        expect_fail("gguf_bad_alignment", &o, "general.alignment");
        free(o.b); free(kv.b);
        kv = (buf){0};
        str(&kv, "x.flag"); u32(&kv, 7 /* bool */); put(&kv, "\x02", 1);
        o = make(3, 1, &ok, 1, 1, &kv, 4 * 34);
        expect_fail("gguf_bad_bool", &o, "bool value 2");
        free(o.b); free(kv.b);
        kv = (buf){0};
        str(&kv, "x.big"); u32(&kv, 9 /* array */); u32(&kv, 8 /* string */); u64(&kv, 1ull << 60);
        o = make(3, 1, &ok, 1, 1, &kv, 4 * 34);
        expect_fail("gguf_absurd_array", &o, "does not fit");
        free(o.b); free(kv.b);
        kv = (buf){0};
        str(&kv, "x.deep");
        u32(&kv, 9);                                              /* value type: array */
        for (int i = 0; i < 6; i++) { u32(&kv, 9); u64(&kv, 1); } /* of one array of one array ... */
        u32(&kv, 4); u64(&kv, 0);                                 /* of no u32 */
        o = make(3, 1, &ok, 1, 1, &kv, 4 * 34);
        expect_fail("gguf_nested_arrays", &o, "nested");
        free(o.b); free(kv.b);
        kv = (buf){0};
        str(&kv, "x.a"); u32(&kv, 4); u32(&kv, 1);
        str(&kv, "x.a"); u32(&kv, 4); u32(&kv, 2);
        o = make(3, 1, &ok, 1, 2, &kv, 4 * 34);
        expect_fail("gguf_duplicate_key", &o, "appears twice");
        free(o.b); free(kv.b);
        kv = (buf){0};
        str(&kv, "comfy.gguf.orig_shape.w"); u32(&kv, 9); u32(&kv, 5 /* i32 */); u64(&kv, 2); u32(&kv, 3); u32(&kv, 33);
        o = make(3, 1, &ok, 1, 1, &kv, 4 * 34);
        expect_fail("gguf_orig_shape_mismatch", &o, "original shape");
        free(o.b); free(kv.b);
        kv = (buf){0};
        str(&kv, "x.s"); u32(&kv, 8); u64(&kv, 1000);
        o = make(3, 1, &ok, 1, 1, &kv, 4);
        expect_fail("gguf_string_past_end", &o, "truncated");
        free(o.b); free(kv.b);
    }
    /* the writer refuses rows that are not whole blocks and a short write */
    {
        snprintf(path, sizeof path, "%s/bad.gguf", dir);
        gguf_stream *b = gguf_stream_open(path);
        int64_t sh[2] = {2, 40};
        gguf_stream_declare(b, "x", DT_Q8_0, 2, sh);
        int rc = gguf_stream_close(b);
        T_CHECK("gguf_writer_partial_block", rc == -1 && strstr(dt_last_error(), "whole blocks") && access(path, F_OK) != 0,
                "rc %d: %s", rc, dt_last_error());
        b = gguf_stream_open(path);
        int64_t sh2[1] = {8};
        gguf_stream_declare(b, "x", DT_F32, 1, sh2);
        gguf_stream_write(b, norm, 4);
        rc = gguf_stream_close(b);
        T_CHECK("gguf_writer_short", rc == -1 && strstr(dt_last_error(), "not fully written") && access(path, F_OK) != 0,
                "rc %d: %s", rc, dt_last_error());
    }
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path)) {}
    free(q4k);
    free(q80);
    return T_DONE();
}
