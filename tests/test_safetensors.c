/* test_safetensors.c — safetensors writer and streaming writer round trips (bit-exact, every dtype,
 * metadata, header padding), st_to_f32 conversions, misaligned data, and opening the fixtures. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test.h"

static char dir[256];

static int same_tensor(const st_tensor *t, dt_dtype dt, int ndim, const int64_t *shape, const void *data) {
    if (!t || t->dtype != dt || t->ndim != ndim) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) { if (t->shape[i] != shape[i]) return 0; n *= shape[i]; }
    if (t->numel != n || t->nbytes != (size_t)n * dt_dtype_size(dt)) return 0;
    return t->nbytes == 0 || memcmp(t->data, data, t->nbytes) == 0;
}

static long file_size(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ditrun_st_XXXXXX");
    if (!mkdtemp(dir)) { T_FAIL("st_tmpdir", "mkdtemp failed"); return T_DONE(); }
    char path[512], path2[512];

    /* test data of several dtypes */
    float f32[12];
    for (int i = 0; i < 12; i++) f32[i] = (float)i * 0.37f - 2.0f;
    f32[5] = -0.0f;
    uint16_t bf16[12], f16[6];
    for (int i = 0; i < 12; i++) bf16[i] = dt_f32_to_bf16(f32[i]);
    for (int i = 0; i < 6; i++) f16[i] = dt_f32_to_f16(f32[i]);
    uint32_t u32[4] = {0, 1, 0x89abcdefu, 0xffffffffu};
    int32_t i32[3] = {-7, 0, 2147483647};
    int64_t i64[2] = {-5, 1099511627776LL};
    uint8_t u8[5] = {0, 1, 128, 255, 7}, bl[3] = {0, 1, 1};
    double f64[2] = {1.25, -3.5};
    int8_t i8[2] = {-128, 127};
    int64_t s34[2] = {3, 4}, s6[1] = {6}, s232[3] = {2, 3, 2}, s4[1] = {4}, s3[1] = {3}, s2[1] = {2}, s5[1] = {5};
    int64_t s0[2] = {0, 5};

    st_writer *w = st_writer_new();
    st_writer_set_metadata(w, "format", "pt");
    st_writer_set_metadata(w, "note", "quote\" backslash\\ newline\n \xc3\xa9");
    st_writer_set_metadata(w, "format", "pt2"); /* replaces */
    st_writer_add_f32(w, "a.f32", 2, s34, f32);
    st_writer_add(w, "b.bf16", DT_BF16, 3, s232, bf16);
    st_writer_add(w, "c.f16", DT_F16, 1, s6, f16);
    st_writer_add(w, "d.u32", DT_U32, 1, s4, u32);
    st_writer_add(w, "e.i32", DT_I32, 1, s3, i32);
    st_writer_add(w, "f.i64", DT_I64, 1, s2, i64);
    st_writer_add(w, "g.u8", DT_U8, 1, s5, u8);
    st_writer_add(w, "h.bool", DT_BOOL, 1, s3, bl);
    st_writer_add(w, "i.f64", DT_F64, 1, s2, f64);
    st_writer_add(w, "j.i8", DT_I8, 1, s2, i8);
    st_writer_add(w, "k.empty", DT_F32, 2, s0, NULL);
    st_writer_add(w, "l.scalar", DT_F32, 0, NULL, f32);
    st_writer_add(w, "name with \"quotes\" and \xe2\x82\xac", DT_U8, 1, s2, u8);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    T_CHECK("st_writer_save", rc == 0, "%s", dt_last_error());

    st_file *f = st_open(path);
    T_CHECK("st_open_written", f != NULL, "%s", dt_last_error());
    if (f) {
        T_CHECK("st_count", st_count(f) == 13, "count %zu", st_count(f));
        T_CHECK("st_header_order", strcmp(st_at(f, 0)->name, "a.f32") == 0 && strcmp(st_at(f, 12)->name, "name with \"quotes\" and \xe2\x82\xac") == 0, "order");
        T_CHECK("st_rt_f32", same_tensor(st_find(f, "a.f32"), DT_F32, 2, s34, f32), "f32");
        T_CHECK("st_rt_bf16", same_tensor(st_find(f, "b.bf16"), DT_BF16, 3, s232, bf16), "bf16");
        T_CHECK("st_rt_f16", same_tensor(st_find(f, "c.f16"), DT_F16, 1, s6, f16), "f16");
        T_CHECK("st_rt_u32", same_tensor(st_find(f, "d.u32"), DT_U32, 1, s4, u32), "u32");
        T_CHECK("st_rt_i32", same_tensor(st_find(f, "e.i32"), DT_I32, 1, s3, i32), "i32");
        T_CHECK("st_rt_i64", same_tensor(st_find(f, "f.i64"), DT_I64, 1, s2, i64), "i64");
        T_CHECK("st_rt_u8", same_tensor(st_find(f, "g.u8"), DT_U8, 1, s5, u8), "u8");
        T_CHECK("st_rt_bool", same_tensor(st_find(f, "h.bool"), DT_BOOL, 1, s3, bl), "bool");
        T_CHECK("st_rt_f64", same_tensor(st_find(f, "i.f64"), DT_F64, 1, s2, f64), "f64");
        T_CHECK("st_rt_i8", same_tensor(st_find(f, "j.i8"), DT_I8, 1, s2, i8), "i8");
        T_CHECK("st_rt_empty", same_tensor(st_find(f, "k.empty"), DT_F32, 2, s0, NULL), "empty");
        const st_tensor *sc = st_find(f, "l.scalar");
        T_CHECK("st_rt_scalar", sc && sc->ndim == 0 && sc->numel == 1 && memcmp(sc->data, f32, 4) == 0, "scalar");
        T_CHECK("st_rt_odd_name", same_tensor(st_find(f, "name with \"quotes\" and \xe2\x82\xac"), DT_U8, 1, s2, u8), "name");
        T_CHECK("st_find_absent", st_find(f, "nope") == NULL && st_find(f, "a.f3") == NULL, "absent");
        T_CHECK("st_metadata", st_metadata(f, "format") && strcmp(st_metadata(f, "format"), "pt2") == 0 &&
                st_metadata(f, "note") && strcmp(st_metadata(f, "note"), "quote\" backslash\\ newline\n \xc3\xa9") == 0 &&
                !st_metadata(f, "zzz"), "metadata");
        T_CHECK("st_tensor_file", strcmp(st_find(f, "a.f32")->file, path) == 0 && strcmp(st_path(f), path) == 0, "file");
        /* aligned views */
        int aligned = 1;
        for (size_t i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_at(f, i);
            if (t->nbytes && (uintptr_t)t->data % dt_dtype_size(t->dtype)) aligned = 0;
        }
        T_CHECK("st_views_aligned", aligned, "misaligned view");
        /* st_to_f32 */
        float *v = st_to_f32(st_find(f, "a.f32"));
        T_CHECK("st_to_f32_f32", memcmp(v, f32, sizeof f32) == 0, "f32");
        free(v);
        v = st_to_f32(st_find(f, "c.f16"));
        int okc = 1;
        for (int i = 0; i < 6; i++) okc &= v[i] == dt_f16_to_f32(f16[i]);
        T_CHECK("st_to_f32_f16", okc, "f16");
        free(v);
        v = st_to_f32(st_find(f, "d.u32"));
        T_CHECK("st_to_f32_u32", v[1] == 1.0f && v[3] == 4294967295.0f, "u32");
        free(v);
        v = st_to_f32(st_find(f, "e.i32"));
        T_CHECK("st_to_f32_i32", v[0] == -7.0f && v[2] == 2147483648.0f, "i32");
        free(v);
        v = st_to_f32(st_find(f, "f.i64"));
        T_CHECK("st_to_f32_i64", v[0] == -5.0f && v[1] == 1099511627776.0f, "i64");
        free(v);
        v = st_to_f32(st_find(f, "h.bool"));
        T_CHECK("st_to_f32_bool", v[0] == 0 && v[1] == 1 && v[2] == 1, "bool");
        free(v);
        v = st_to_f32(st_find(f, "i.f64"));
        T_CHECK("st_to_f32_f64", v[0] == 1.25f && v[1] == -3.5f, "f64");
        free(v);
        v = st_to_f32(st_find(f, "j.i8"));
        T_CHECK("st_to_f32_i8", v[0] == -128.0f && v[1] == 127.0f, "i8");
        free(v);
        v = st_to_f32(st_find(f, "g.u8"));
        T_CHECK("st_to_f32_u8", v[3] == 255.0f, "u8");
        free(v);
        st_close(f);
    }
    /* header is padded to a multiple of 8 */
    {
        FILE *fp = fopen(path, "rb");
        unsigned char h8[8] = {0};
        size_t got = fp ? fread(h8, 1, 8, fp) : 0;
        if (fp) fclose(fp);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | h8[i];
        T_CHECK("st_header_padded", got == 8 && hl % 8 == 0, "header length %llu", (unsigned long long)hl);
    }

    /* streaming writer: same bytes as the in-memory writer for the same content */
    {
        int64_t sh[2] = {3, 4}, sh2[1] = {4};
        snprintf(path2, sizeof path2, "%s/s.safetensors", dir);
        st_stream *s = st_stream_open(path2);
        st_stream_set_metadata(s, "k", "v");
        st_stream_declare(s, "x", DT_F32, 2, sh);
        st_stream_declare(s, "y", DT_U32, 1, sh2);
        int r = st_stream_begin_data(s);
        r |= st_stream_write(s, f32, 20);           /* tensor x in two pieces */
        r |= st_stream_write(s, f32 + 5, 28);
        r |= st_stream_write(s, u32, sizeof u32);   /* tensor y */
        r |= st_stream_close(s);
        T_CHECK("st_stream_write", r == 0, "%s", dt_last_error());
        w = st_writer_new();
        st_writer_set_metadata(w, "k", "v");
        st_writer_add_f32(w, "x", 2, sh, f32);
        st_writer_add(w, "y", DT_U32, 1, sh2, u32);
        snprintf(path, sizeof path, "%s/s2.safetensors", dir);
        st_writer_save(w, path);
        st_writer_free(w);
        long n1 = file_size(path), n2 = file_size(path2);
        int same = n1 > 0 && n1 == n2;
        if (same) {
            FILE *a = fopen(path, "rb"), *b = fopen(path2, "rb");
            for (long i = 0; i < n1 && same; i++) same = fgetc(a) == fgetc(b);
            fclose(a); fclose(b);
        }
        T_CHECK("st_stream_same_bytes_as_writer", same, "sizes %ld %ld", n1, n2);
        f = st_open(path2);
        T_CHECK("st_stream_read_back", f && same_tensor(st_find(f, "x"), DT_F32, 2, sh, f32) &&
                same_tensor(st_find(f, "y"), DT_U32, 1, sh2, u32) && strcmp(st_metadata(f, "k"), "v") == 0, "%s", dt_last_error());
        st_close(f);

        /* a tensor over twice the stream's 4 MiB buffer, written in 1.5 KB rows as the synthetic writers do (and one
         * odd-sized tail): the same bytes as the in-memory writer */
        {
            const int64_t rows = 7000, row = 1536 / 4, big_sh[2] = {rows, row}, tail_sh[1] = {3};
            uint32_t *big = malloc(sizeof(uint32_t) * (size_t)(rows * row));
            for (int64_t i = 0; i < rows * row; i++) big[i] = (uint32_t)(i * 2654435761u);
            const uint8_t tail[3] = {1, 2, 3};
            snprintf(path2, sizeof path2, "%s/big.safetensors", dir);
            s = st_stream_open(path2);
            st_stream_declare(s, "big", DT_U32, 2, big_sh);
            st_stream_declare(s, "tail", DT_U8, 1, tail_sh);
            r = st_stream_begin_data(s);
            for (int64_t i = 0; i < rows && r == 0; i++) r = st_stream_write(s, big + i * row, sizeof(uint32_t) * row);
            r |= st_stream_write(s, tail, 3);
            r |= st_stream_close(s);
            w = st_writer_new();
            st_writer_add(w, "big", DT_U32, 2, big_sh, big);
            st_writer_add(w, "tail", DT_U8, 1, tail_sh, tail);
            snprintf(path, sizeof path, "%s/big2.safetensors", dir);
            st_writer_save(w, path);
            st_writer_free(w);
            n1 = file_size(path), n2 = file_size(path2);
            same = r == 0 && n1 > 8 << 20 && n1 == n2;
            if (same) {
                FILE *a = fopen(path, "rb"), *b = fopen(path2, "rb");
                for (long i = 0; i < n1 && same; i++) same = fgetc(a) == fgetc(b);
                fclose(a); fclose(b);
            }
            T_CHECK("st_stream_same_bytes_as_writer past its buffer (10.3 MB in 1.5 KB rows)", same, "rc %d, sizes %ld %ld",
                    r, n1, n2);
            unlink(path);
            unlink(path2);
            free(big);
        }

        /* too few bytes: close fails, no file left behind */
        snprintf(path2, sizeof path2, "%s/short.safetensors", dir);
        s = st_stream_open(path2);
        st_stream_declare(s, "x", DT_F32, 2, sh);
        st_stream_begin_data(s);
        st_stream_write(s, f32, 8);
        dt_clear_error();
        r = st_stream_close(s);
        T_CHECK("st_stream_incomplete_fails", r == -1 && strstr(dt_last_error(), "short.safetensors") &&
                access(path2, F_OK) != 0, "%s", dt_last_error());
        /* too many bytes */
        s = st_stream_open(path2);
        st_stream_declare(s, "x", DT_F32, 1, sh2);
        st_stream_begin_data(s);
        r = st_stream_write(s, f32, 20);
        int r2 = st_stream_close(s);
        T_CHECK("st_stream_overflow_fails", r == -1 && r2 == -1 && access(path2, F_OK) != 0, "%s", dt_last_error());
        /* writer rejects duplicate names */
        w = st_writer_new();
        st_writer_add_f32(w, "x", 1, sh2, f32);
        st_writer_add_f32(w, "x", 1, sh2, f32);
        dt_clear_error();
        r = st_writer_save(w, path2);
        st_writer_free(w);
        T_CHECK("st_writer_duplicate_fails", r == -1 && strstr(dt_last_error(), "duplicate"), "%s", dt_last_error());
        /* cannot create */
        dt_clear_error();
        s = st_stream_open("/nonexistent_dir_xyz/a.safetensors");
        T_CHECK("st_stream_open_bad_dir", !s && strstr(dt_last_error(), "/nonexistent_dir_xyz/a.safetensors"), "%s", dt_last_error());
    }

    /* misaligned data offsets (valid file): views are still aligned copies with the right bytes */
    {
        const char *hdr = "{\"m\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
        size_t hl = strlen(hdr);
        unsigned char buf[256];
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
        memcpy(buf + 8, hdr, hl);
        buf[8 + hl] = 0xAA;
        memcpy(buf + 8 + hl + 1, f32, 8);
        f = st_open_memory(buf, 8 + hl + 9, "mis.safetensors");
        const st_tensor *t = f ? st_find(f, "m") : NULL;
        T_CHECK("st_misaligned_copy", t && (uintptr_t)t->data % 4 == 0 && memcmp(t->data, f32, 8) == 0, "%s", dt_last_error());
        st_close(f);
    }

    /* fixtures */
    const char *fx[] = {"model/transformer/diffusion_pytorch_model.safetensors", "model/vae/diffusion_pytorch_model.safetensors",
                        "model/text_encoder/model.safetensors", "transformer-q4/model.safetensors",
                        "transformer-q8/model.safetensors", "transformer_io.safetensors", "krea2_io.safetensors",
                        "pipeline_io.safetensors", "transformer-q4/expected_out.safetensors"};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", t_fixtures(), fx[i]);
        char name[128];
        snprintf(name, sizeof name, "st_open_fixture %s", fx[i]);
        f = st_open(path);
        T_CHECK(name, f && st_count(f) > 0, "%s", dt_last_error());
        st_close(f);
    }
    snprintf(path, sizeof path, "%s/transformer_io.safetensors", t_fixtures());
    f = st_open(path);
    if (f) {
        const st_tensor *t = st_find(f, "in.hidden_states");
        T_CHECK("st_fixture_io_shape", t && t->dtype == DT_F32 && t->ndim == 3 && t->shape[0] == 1 && t->shape[1] == 64 &&
                t->shape[2] == 32, "in.hidden_states");
        float *v = t ? st_to_f32(t) : NULL;
        int finite = v != NULL;
        for (int64_t k = 0; v && k < t->numel; k++) finite &= isfinite(v[k]);
        T_CHECK("st_fixture_io_finite", finite, "non-finite");
        free(v);
        st_close(f);
    }
    snprintf(path, sizeof path, "%s/transformer-q4/model.safetensors", t_fixtures());
    f = st_open(path);
    T_CHECK("st_fixture_q4_metadata", f && st_metadata(f, "format") && strcmp(st_metadata(f, "format"), "mlx") == 0, "meta");
    st_close(f);

    /* cleanup */
    const char *names[] = {"w.safetensors", "s.safetensors", "s2.safetensors"};
    for (size_t i = 0; i < 3; i++) { snprintf(path, sizeof path, "%s/%s", dir, names[i]); unlink(path); }
    rmdir(dir);
    return T_DONE();
}
