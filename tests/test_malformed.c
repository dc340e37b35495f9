/* test_malformed.c — hostile or broken checkpoints must fail cleanly: NULL/-1, no crash, no leak, and a
 * one-line error naming the file and the problem. Every case writes its own input into a temp folder. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/weights.h"
#include "test.h"

static char tmp[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return; }
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* 8-byte length + header + `ndata` bytes of data */
static void write_st(const char *path, const char *header, size_t ndata) {
    size_t hl = strlen(header);
    unsigned char *b = calloc(1, 8 + hl + ndata);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    write_bytes(path, b, 8 + hl + ndata);
    free(b);
}

static void expect_fail(const char *name, int failed, const char *file, const char *word) {
    const char *e = dt_last_error();
    T_CHECK(name, failed && strstr(e, file) && strstr(e, word), "%s (error: '%s'; wanted '%s' and '%s')",
            failed ? "failed" : "SUCCEEDED", e, file, word);
}

/* st_open must fail with an error naming the file and containing `word` */
static void st_case(const char *name, const char *fname, const char *header, size_t ndata, const char *word) {
    const char *p = tpath(fname);
    write_st(p, header, ndata);
    dt_clear_error();
    st_file *f = st_open(p);
    expect_fail(name, f == NULL, fname, word);
    st_close(f);
}

static void mk(const char *sub) { mkdir(tpath(sub), 0755); }

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/ditrun_bad_XXXXXX");
    if (!mkdtemp(tmp)) { T_FAIL("malformed_tmpdir", "mkdtemp failed"); return T_DONE(); }
    st_file *f;

    /* 1. empty file */
    write_bytes(tpath("empty.safetensors"), "", 0);
    dt_clear_error();
    f = st_open(tpath("empty.safetensors"));
    expect_fail("malformed_empty_file", !f, "empty.safetensors", "empty");
    st_close(f);
    /* 2. shorter than 8 bytes */
    write_bytes(tpath("short.safetensors"), "\x05\0\0", 3);
    dt_clear_error();
    f = st_open(tpath("short.safetensors"));
    expect_fail("malformed_shorter_than_8", !f, "short.safetensors", "too short");
    st_close(f);
    /* 3. header length larger than the file */
    {
        unsigned char b[16] = {0x00, 0x10, 0, 0, 0, 0, 0, 0, '{', '}'};
        write_bytes(tpath("hlen.safetensors"), b, 10);
        dt_clear_error();
        f = st_open(tpath("hlen.safetensors"));
        expect_fail("malformed_header_len_past_eof", !f, "hlen.safetensors", "exceeds the file size");
        st_close(f);
        memset(b, 0xff, 8);
        write_bytes(tpath("hlen2.safetensors"), b, 10);
        dt_clear_error();
        f = st_open(tpath("hlen2.safetensors"));
        expect_fail("malformed_header_len_2^64-1", !f, "hlen2.safetensors", "exceeds the file size");
        st_close(f);
    }
    /* 4. header not JSON */
    st_case("malformed_header_not_json", "notjson.safetensors", "{\"a\": nope}", 0, "JSON error at byte");
    st_case("malformed_header_binary", "binary.safetensors", "\x01\x02\x03\xff", 0, "JSON error");
    /* 5. JSON, but not an object */
    st_case("malformed_header_not_object", "array.safetensors", "[1, 2, 3]", 0, "not a JSON object");
    /* 6. unknown dtype */
    st_case("malformed_unknown_dtype", "dtype.safetensors",
            "{\"x.weight\":{\"dtype\":\"C64\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "unknown dtype");
    /* 7. data_offsets past the end of the data section */
    st_case("malformed_offsets_past_end", "past.safetensors",
            "{\"x.weight\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[0,100]}}", 64, "exceed the data section");
    /* 8. overlapping tensors */
    st_case("malformed_overlap", "overlap.safetensors",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, "overlap");
    /* 9. shape / byte count mismatch */
    st_case("malformed_shape_bytes_mismatch", "mismatch.safetensors",
            "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[0,16]}}", 16, "mismatch");
    /* 10. negative dimension */
    st_case("malformed_negative_shape", "neg.safetensors",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,0]}}", 0, "negative");
    /* 11. shape product overflows */
    st_case("malformed_shape_overflow", "ovf.safetensors",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,0]}}", 0, "overflow");
    st_case("malformed_shape_overflow_elemsize", "ovf2.safetensors",
            "{\"x\":{\"dtype\":\"I64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}", 0, "overflow");
    /* 12. begin > end */
    st_case("malformed_begin_gt_end", "order.safetensors",
            "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "begin > end");
    /* more header problems */
    st_case("malformed_duplicate_name", "dupname.safetensors",
            "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
            2, "duplicate");
    st_case("malformed_metadata_not_string", "meta.safetensors", "{\"__metadata__\":{\"a\":1}}", 0, "not a string");
    st_case("malformed_offsets_not_integers", "offf.safetensors",
            "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.5,1]}}", 1, "data_offsets");
    st_case("malformed_offsets_three", "off3.safetensors",
            "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, "data_offsets");
    st_case("malformed_missing_shape", "noshape.safetensors", "{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "shape");
    st_case("malformed_too_many_dims", "dims.safetensors",
            "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "dimensions");
    st_case("malformed_entry_not_object", "entry.safetensors", "{\"x\":[1]}", 0, "not a JSON object");
    st_case("malformed_truncated_json", "trunc.safetensors", "{\"x\":{\"dtype\":\"U8\",\"sha", 0, "JSON error");
    /* not a regular file / missing file */
    dt_clear_error();
    f = st_open(tmp);
    expect_fail("malformed_directory_as_file", !f, tmp, "not a regular file");
    dt_clear_error();
    f = st_open(tpath("does_not_exist.safetensors"));
    expect_fail("malformed_missing_file", !f, "does_not_exist.safetensors", "cannot open");

    /* weights-level cases */
    float v4[4] = {1, 2, 3, 4};
    int64_t s4[1] = {4};
    dt_weights *w;
    /* 13. index naming a missing shard */
    mk("idx_missing");
    {
        st_writer *sw = st_writer_new();
        st_writer_add_f32(sw, "a", 1, s4, v4);
        st_writer_save(sw, tpath("idx_missing/0.safetensors"));
        st_writer_free(sw);
        const char *idx = "{\"weight_map\": {\"a\": \"0.safetensors\", \"b\": \"1.safetensors\"}}";
        write_bytes(tpath("idx_missing/model.safetensors.index.json"), idx, strlen(idx));
        dt_clear_error();
        w = dt_weights_open(tpath("idx_missing"));
        expect_fail("malformed_index_missing_shard", !w, "1.safetensors", "does not exist");
        dt_weights_close(w);
    }
    /* 14. index naming a tensor that its shard lacks */
    mk("idx_tensor");
    {
        st_writer *sw = st_writer_new();
        st_writer_add_f32(sw, "a", 1, s4, v4);
        st_writer_save(sw, tpath("idx_tensor/diffusion_pytorch_model-00001-of-00001.safetensors"));
        st_writer_free(sw);
        const char *idx = "{\"weight_map\": {\"a\": \"diffusion_pytorch_model-00001-of-00001.safetensors\","
                          " \"ghost.weight\": \"diffusion_pytorch_model-00001-of-00001.safetensors\"}}";
        write_bytes(tpath("idx_tensor/diffusion_pytorch_model.safetensors.index.json"), idx, strlen(idx));
        dt_clear_error();
        w = dt_weights_open(tpath("idx_tensor"));
        expect_fail("malformed_index_tensor_not_in_shard", !w, "diffusion_pytorch_model-00001-of-00001.safetensors", "ghost.weight");
        expect_fail("malformed_index_tensor_not_in_shard_word", !w, "index.json", "missing");
        dt_weights_close(w);
    }
    /* index that is not JSON, and one with a path in weight_map */
    mk("idx_bad");
    write_bytes(tpath("idx_bad/model.safetensors.index.json"), "{\"weight_map\":", 14);
    dt_clear_error();
    w = dt_weights_open(tpath("idx_bad"));
    expect_fail("malformed_index_not_json", !w, "model.safetensors.index.json", "JSON error");
    dt_weights_close(w);
    mk("idx_path");
    write_bytes(tpath("idx_path/model.safetensors.index.json"), "{\"weight_map\":{\"a\":\"../x.safetensors\"}}", 39);
    dt_clear_error();
    w = dt_weights_open(tpath("idx_path"));
    expect_fail("malformed_index_path_escape", !w, "model.safetensors.index.json", "plain file name");
    dt_weights_close(w);
    /* a bad shard inside a folder: the error names the shard */
    mk("badshard");
    write_bytes(tpath("badshard/0.safetensors"), "\x02\0\0\0\0\0\0\0[]", 10);
    dt_clear_error();
    w = dt_weights_open(tpath("badshard"));
    expect_fail("malformed_bad_shard_in_folder", !w, "badshard/0.safetensors", "not a JSON object");
    dt_weights_close(w);
    /* invalid config.json next to valid weights */
    mk("badcfg");
    {
        st_writer *sw = st_writer_new();
        st_writer_add_f32(sw, "a", 1, s4, v4);
        st_writer_save(sw, tpath("badcfg/model.safetensors"));
        st_writer_free(sw);
        write_bytes(tpath("badcfg/config.json"), "{\"a\":1,}", 8);
        dt_clear_error();
        w = dt_weights_open(tpath("badcfg"));
        expect_fail("malformed_config_json", !w, "config.json", "JSON error");
        dt_weights_close(w);
    }
    /* 15. packed weights with an impossible group size / bits, missing scales */
    mk("packed");
    {
        uint32_t pk[16] = {0};
        uint16_t sb[12] = {0};
        int64_t sp[2] = {4, 4}, s3[2] = {4, 3}, s2[2] = {4, 2}, s1[2] = {4, 1};
        st_writer *sw = st_writer_new();
        st_writer_add(sw, "g3.weight", DT_U32, 2, sp, pk);
        st_writer_add(sw, "g3.scales", DT_BF16, 2, s3, sb);
        st_writer_add(sw, "g3.biases", DT_BF16, 2, s3, sb);
        st_writer_add(sw, "g16.weight", DT_U32, 2, sp, pk);
        st_writer_add(sw, "g16.scales", DT_BF16, 2, s2, sb);
        st_writer_add(sw, "g16.biases", DT_BF16, 2, s2, sb);
        st_writer_add(sw, "noscales.weight", DT_U32, 2, sp, pk);
        st_writer_add(sw, "mixed.weight", DT_U32, 2, sp, pk);
        st_writer_add(sw, "mixed.scales", DT_BF16, 2, s1, sb);
        st_writer_add(sw, "mixed.biases", DT_F16, 2, s1, sb);
        st_writer_add_f32(sw, "dense.weight", 1, s4, v4);
        st_writer_save(sw, tpath("packed/model.safetensors"));
        st_writer_free(sw);
        w = dt_weights_open(tpath("packed"));
        T_CHECK("malformed_packed_file_opens", w != NULL, "%s", dt_last_error());
        if (w) {
            dt_linear_src L;
            dt_clear_error();
            int r = dt_weights_linear(w, "g3", 0, 0, 0, &L);
            expect_fail("malformed_impossible_group_inferred", r == -1, "packed/model.safetensors", "impossible group size");
            expect_fail("malformed_impossible_group_inferred_names_tensor", r == -1, "g3", "impossible group size");
            dt_clear_error();
            r = dt_weights_linear(w, "g3", 4, 32, 0, &L);
            expect_fail("malformed_impossible_group_given_in", r == -1, "g3.scales", "impossible group size");
            dt_clear_error();
            r = dt_weights_linear(w, "g16", 4, 32, 0, &L);  /* group 16: not an MLX group size */
            expect_fail("malformed_group_16", r == -1, "g16", "impossible group size");
            dt_clear_error();
            r = dt_weights_linear(w, "g16", 4, 64, 0, &L);  /* 4 packed words hold 64 inputs only at 2 bits */
            expect_fail("malformed_impossible_bits", r == -1, "g16", "impossible bits");
            dt_clear_error();
            r = dt_weights_linear(w, "noscales", 0, 0, 0, &L);
            expect_fail("malformed_packed_without_scales", r == -1, "noscales.scales", "scales");
            dt_clear_error();
            r = dt_weights_linear(w, "mixed", 0, 0, 0, &L);
            expect_fail("malformed_scales_biases_dtype_differ", r == -1, "mixed", "dtype");
            dt_clear_error();
            r = dt_weights_linear(w, "dense", 0, 0, 0, &L);
            expect_fail("malformed_linear_1d_weight", r == -1, "dense", "dimensions");
            dt_clear_error();
            r = dt_weights_linear(w, "absent", 0, 0, 0, &L);
            expect_fail("malformed_linear_missing", r == -1, "absent.weight", "not found");
            /* 16. missing tensor */
            dt_clear_error();
            const st_tensor *t = dt_weights_get(w, "nothing.here", 1, s4);
            expect_fail("malformed_get_missing_tensor", !t, "packed", "not found");
            expect_fail("malformed_get_missing_tensor_name", !t, "nothing.here", "not found");
            /* 17. wrong shape */
            int64_t s5[1] = {5};
            dt_clear_error();
            t = dt_weights_get(w, "dense.weight", 1, s5);
            expect_fail("malformed_get_wrong_shape", !t, "packed/model.safetensors", "wrong shape");
            dt_clear_error();
            t = dt_weights_get(w, "dense.weight", 2, sp);
            expect_fail("malformed_get_wrong_ndim", !t, "dense.weight", "wrong shape");
            dt_clear_error();
            float out[8];
            r = dt_weights_read_f32(w, "g3.weight", out, 8);
            expect_fail("malformed_read_f32_of_u32", r == -1, "g3.weight", "float");
            dt_weights_close(w);
        }
    }
    /* 18. folder without safetensors */
    mk("nothing");
    write_bytes(tpath("nothing/config.json"), "{}", 2);
    dt_clear_error();
    w = dt_weights_open(tpath("nothing"));
    expect_fail("malformed_folder_without_safetensors", !w, "nothing", "no .safetensors");
    dt_weights_close(w);
    dt_clear_error();
    w = dt_weights_open(tpath("no_such_folder"));
    expect_fail("malformed_weights_missing_path", !w, "no_such_folder", "cannot open");
    dt_weights_close(w);

    /* edge cases kept as regression inputs for fuzz/fuzz_safetensors.c (fuzzing found no crash so far):
     * empty header, non-numeric dims, 2^64-1 offsets, overflowing dims after a zero dim */
    {
        static const struct { const char *name; const char *header; size_t ndata; } reg[] = {
            {"fuzz_zero_len_header", "", 0},
            {"fuzz_dims_not_numbers", "{\"x\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1},
            {"fuzz_huge_offset", "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551615,0]}}", 1},
            {"fuzz_zero_dim_overflow", "{\"x\":{\"dtype\":\"U8\",\"shape\":[0,9223372036854775807,9223372036854775807],\"data_offsets\":[0,1]}}", 1},
        };
        for (size_t i = 0; i < sizeof reg / sizeof reg[0]; i++) {
            char nm[96], fn[96];
            snprintf(nm, sizeof nm, "malformed_regression_%s", reg[i].name);
            snprintf(fn, sizeof fn, "%s.safetensors", reg[i].name);
            const char *p = tpath(fn);
            write_st(p, reg[i].header, reg[i].ndata);
            dt_clear_error();
            f = st_open(p);
            T_CHECK(nm, !f && strstr(dt_last_error(), fn), "%s", f ? "accepted" : dt_last_error());
            st_close(f);
        }
    }

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return T_DONE();
}
