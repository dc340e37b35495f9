/* test_weights.c — dt_weights over the fixture layouts (diffusers folder, MLX q4/q8 folders), Linear
 * resolution (dense / affine, bits and group inferred), dequantization accuracy against the bf16
 * original, sharded folders with an index (diffusers and mflux naming), component folder lookup. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/weights.h"
#include "quant/dequant.h"
#include "test.h"

/* Tolerances for dequantized vs original weights. A uniform quantizer with step d has RMS error d/sqrt(12);
 * with group 32 of roughly Gaussian weights the group range is about 4-5 sigma, so d = range/(2^bits - 1)
 * gives a relative L2 error of about 0.08 at 4 bits and 0.005 at 8 bits (256/16 = 16x smaller). */
#define TOL_Q4 0.1
#define TOL_Q8 0.01

static char tmp[256];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(text, f); fclose(f); }
}

static void rm_dir(const char *d) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", d);
}

/* Splits the fixture transformer's tensors over `nshards` files named by fmt (printf with index, count)
 * in folder `dir`; writes an index named `index_name` (NULL: none). Returns 0 on success. */
static int write_shards(const dt_weights *src, const char *dir, const char *fmt, int base, int nshards, const char *index_name) {
    char path[600], fname[128];
    size_t n = dt_weights_count(src);
    size_t cap = 1 << 16, len = 0;
    char *idx = malloc(cap);
    len += (size_t)snprintf(idx + len, cap - len, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int s = 0; s < nshards; s++) {
        st_writer *w = st_writer_new();
        snprintf(fname, sizeof fname, fmt, s + base, nshards);
        for (size_t i = (size_t)s; i < n; i += (size_t)nshards) {
            const st_tensor *t = dt_weights_at(src, i);
            st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
            len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\": \"%s\"", len > 60 ? ", " : "", t->name, fname);
        }
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        int rc = st_writer_save(w, path);
        st_writer_free(w);
        if (rc) { free(idx); return -1; }
    }
    snprintf(idx + len, cap - len, "}}");
    if (index_name) {
        snprintf(path, sizeof path, "%s/%s", dir, index_name);
        write_text(path, idx);
    }
    free(idx);
    return 0;
}

/* every tensor of src is found in w with identical bytes */
static int same_tensors(const dt_weights *src, const dt_weights *w) {
    if (dt_weights_count(src) != dt_weights_count(w)) return 0;
    for (size_t i = 0; i < dt_weights_count(src); i++) {
        const st_tensor *a = dt_weights_at(src, i), *b = dt_weights_find(w, a->name);
        if (!b || a->dtype != b->dtype || a->nbytes != b->nbytes || memcmp(a->data, b->data, a->nbytes)) return 0;
    }
    return 1;
}

/* dt_linear_src_rows: rows [r0, r0+n) as a Linear of its own dequantize exactly as those rows of the original
 * (dense and 4/8-bit: weights, scales, biases offset together), and its bias starts at row r0. */
static void check_row_view(const char *name, const dt_linear_src *L, int64_t r0, int64_t n) {
    dt_linear_src v = dt_linear_src_rows(L, r0, n);
    float *a = malloc((size_t)(n * L->in) * sizeof(float)), *b = malloc((size_t)(n * L->in) * sizeof(float));
    dt_linear_src_rows_f32(L, r0, n, a);
    dt_linear_src_rows_f32(&v, 0, n, b);
    int bias_ok = !L->bias || v.bias == (const char *)L->bias + (size_t)r0 * dt_dtype_size(L->bias_dtype);
    T_CHECK(name, v.out == n && v.in == L->in && v.bits == L->bits && bias_ok &&
            memcmp(a, b, (size_t)(n * L->in) * sizeof(float)) == 0, "out %lld in %lld bias %s, rows %s",
            (long long)v.out, (long long)v.in, bias_ok ? "ok" : "off",
            memcmp(a, b, (size_t)(n * L->in) * sizeof(float)) ? "differ" : "agree");
    free(a); free(b);
}

int main(void) {
    char path[400], path2[700];
    snprintf(tmp, sizeof tmp, "/tmp/ditrun_wt_XXXXXX");
    if (!mkdtemp(tmp)) { T_FAIL("weights_tmpdir", "mkdtemp failed"); return T_DONE(); }

    snprintf(path, sizeof path, "%s/model/transformer", t_fixtures());
    dt_weights *ref = dt_weights_open(path);
    T_CHECK("weights_open_diffusers_folder", ref != NULL, "%s", dt_last_error());
    if (!ref) return T_DONE();
    T_CHECK("weights_count", dt_weights_count(ref) == 33, "count %zu", dt_weights_count(ref));
    T_CHECK("weights_config", dt_weights_config(ref) && json_get_int(dt_weights_config(ref), "num_attention_heads", 0) == 2,
            "config.json not kept");
    int64_t s_emb[2] = {256, 32}, s_bad[2] = {256, 33};
    T_CHECK("weights_get_shape_ok", dt_weights_get(ref, "x_embedder.weight", 2, s_emb) != NULL, "%s", dt_last_error());
    T_CHECK("weights_get_wrong_shape", dt_weights_get(ref, "x_embedder.weight", 2, s_bad) == NULL &&
            strstr(dt_last_error(), "x_embedder.weight"), "%s", dt_last_error());
    {
        float *v = malloc(128 * sizeof(float));
        int r = dt_weights_read_f32(ref, "transformer_blocks.0.attn.norm_q.weight", v, 128);
        const st_tensor *t = dt_weights_find(ref, "transformer_blocks.0.attn.norm_q.weight");
        T_CHECK("weights_read_f32", r == 0 && t && v[3] == dt_bf16_to_f32(((const uint16_t *)t->data)[3]), "%s", dt_last_error());
        T_CHECK("weights_read_f32_wrong_count", dt_weights_read_f32(ref, "transformer_blocks.0.attn.norm_q.weight", v, 127) == -1,
                "accepted");
        free(v);
    }
    /* dense linear */
    dt_linear_src L;
    int r = dt_weights_linear(ref, "single_transformer_blocks.0.attn.to_qkv_mlp_proj", 2304, 256, -1, &L);
    T_CHECK("weights_linear_dense", r == 0 && L.bits == 0 && L.out == 2304 && L.in == 256 && L.dtype == DT_BF16 && !L.bias,
            "%s", dt_last_error());
    if (r == 0) check_row_view("weights_dense_row_view (the single block's MLP-in rows)", &L, 768, 1536);
    r = dt_weights_linear(ref, "x_embedder", 0, 0, 0, &L);
    T_CHECK("weights_linear_dense_inferred", r == 0 && L.out == 256 && L.in == 32, "%s", dt_last_error());
    r = dt_weights_linear(ref, "x_embedder", 256, 64, 0, &L);
    T_CHECK("weights_linear_dense_wrong_in", r == -1 && strstr(dt_last_error(), "x_embedder"), "%s", dt_last_error());
    r = dt_weights_linear(ref, "x_embedder", 256, 32, 1, &L);
    T_CHECK("weights_linear_required_bias_missing", r == -1 && strstr(dt_last_error(), "x_embedder.bias"), "%s", dt_last_error());
    {
        float *rows = malloc(2 * 32 * sizeof(float));
        dt_weights_linear(ref, "x_embedder", 256, 32, 0, &L);
        dt_linear_src_rows_f32(&L, 5, 2, rows);
        const uint16_t *raw = L.data;
        T_CHECK("weights_dense_rows_f32", rows[0] == dt_bf16_to_f32(raw[5 * 32]) && rows[63] == dt_bf16_to_f32(raw[7 * 32 - 1]), "rows");
        free(rows);
    }

    /* linear with a bias: the VAE's mid-block attention */
    snprintf(path, sizeof path, "%s/model/vae", t_fixtures());
    dt_weights *vae = dt_weights_open(path);
    T_CHECK("weights_open_vae", vae != NULL, "%s", dt_last_error());
    if (vae) {
        r = dt_weights_linear(vae, "decoder.mid_block.attentions.0.to_q", 0, 0, 1, &L);
        T_CHECK("weights_linear_with_bias", r == 0 && L.bias && L.out == 32 && L.in == 32, "%s", dt_last_error());
        if (r == 0) check_row_view("weights_row_view_with_bias", &L, 8, 16);
        dt_weights_close(vae);
    }

    /* quantized folders */
    const char *qnames[2] = {"transformer-q4", "transformer-q8"};
    const int qbits[2] = {4, 8};
    const double qtol[2] = {TOL_Q4, TOL_Q8};
    const char *lin_names[] = {"context_embedder", "x_embedder", "proj_out", "norm_out.linear",
        "double_stream_modulation_img.linear", "double_stream_modulation_txt.linear", "single_stream_modulation.linear",
        "time_guidance_embed.timestep_embedder.linear_1", "time_guidance_embed.timestep_embedder.linear_2",
        "transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v",
        "transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.add_q_proj", "transformer_blocks.0.attn.add_k_proj",
        "transformer_blocks.0.attn.add_v_proj", "transformer_blocks.0.attn.to_add_out", "transformer_blocks.0.ff.linear_in",
        "transformer_blocks.0.ff.linear_out", "transformer_blocks.0.ff_context.linear_in", "transformer_blocks.0.ff_context.linear_out",
        "single_transformer_blocks.0.attn.to_qkv_mlp_proj", "single_transformer_blocks.0.attn.to_out",
        "single_transformer_blocks.1.attn.to_qkv_mlp_proj", "single_transformer_blocks.1.attn.to_out"};
    const int nlin = (int)(sizeof lin_names / sizeof lin_names[0]);
    for (int qi = 0; qi < 2; qi++) {
        char name[160];
        snprintf(path, sizeof path, "%s/%s", t_fixtures(), qnames[qi]);
        dt_weights *q = dt_weights_open(path);
        snprintf(name, sizeof name, "weights_open_%s", qnames[qi]);
        T_CHECK(name, q != NULL, "%s", dt_last_error());
        if (!q) continue;
        snprintf(name, sizeof name, "weights_%s_no_stray_files", qnames[qi]);
        T_CHECK(name, dt_weights_find(q, "out.sample") == NULL, "expected_out.safetensors was loaded as weights");
        /* every Linear resolves, with the logical shape given or inferred */
        int all_ok = 1;
        double num = 0, den = 0;
        for (int li = 0; li < nlin; li++) {
            dt_linear_src D, Q, Q2;
            if (dt_weights_linear(ref, lin_names[li], 0, 0, 0, &D) ||
                dt_weights_linear(q, lin_names[li], D.out, D.in, -1, &Q) ||
                dt_weights_linear(q, lin_names[li], 0, 0, -1, &Q2)) {
                printf("  %s: %s\n", lin_names[li], dt_last_error());
                all_ok = 0; continue;
            }
            if (Q.bits != qbits[qi] || Q.group_size != 32 || Q.out != D.out || Q.in != D.in || Q.sb_dtype != DT_BF16 ||
                Q2.bits != Q.bits || Q2.group_size != 32 || Q2.in != D.in || Q.dtype != DT_U32) {
                printf("  %s: bits %d/%d group %d/%d in %lld/%lld\n", lin_names[li], Q.bits, Q2.bits, Q.group_size,
                       Q2.group_size, (long long)Q.in, (long long)Q2.in);
                all_ok = 0; continue;
            }
            size_t n = (size_t)(D.out * D.in);
            float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
            dt_linear_src_rows_f32(&D, 0, D.out, a);
            dt_linear_src_rows_f32(&Q, 0, Q.out, b);
            for (size_t k = 0; k < n; k++) { double d = (double)b[k] - a[k]; num += d * d; den += (double)a[k] * a[k]; }
            if (li == nlin - 2) {
                snprintf(name, sizeof name, "weights_%s_dequant_vs_bf16 %s", qnames[qi], lin_names[li]);
                t_check_rel_l2(name, b, a, n, qtol[qi]);
                /* partial row ranges agree with the full dequantization */
                float *c = malloc(3 * (size_t)D.in * sizeof(float));
                dt_linear_src_rows_f32(&Q, 7, 3, c);
                snprintf(name, sizeof name, "weights_%s_rows_subrange", qnames[qi]);
                T_CHECK(name, memcmp(c, b + 7 * D.in, 3 * (size_t)D.in * sizeof(float)) == 0, "row range differs");
                free(c);
                snprintf(name, sizeof name, "weights_%s_row_view (rows 768.. of %s)", qnames[qi], lin_names[li]);
                check_row_view(name, &Q, 768, Q.out - 768);
            }
            free(a); free(b);
        }
        snprintf(name, sizeof name, "weights_%s_linear_resolution_bits%d_group32", qnames[qi], qbits[qi]);
        T_CHECK(name, all_ok, "see lines above");
        double rel = den > 0 ? sqrt(num / den) : 1;
        snprintf(name, sizeof name, "weights_%s_all_linears_dequant_rel_l2", qnames[qi]);
        printf("INFO %s whole-model dequantized vs bf16 rel L2 = %.5f\n", qnames[qi], rel);
        T_CHECK(name, rel < qtol[qi], "rel L2 %.4g >= %.4g", rel, qtol[qi]);
        /* wrong expected input count is rejected */
        r = dt_weights_linear(q, "proj_out", 32, 96, 0, &L);
        snprintf(name, sizeof name, "weights_%s_linear_wrong_in", qnames[qi]);
        T_CHECK(name, r == -1 && strstr(dt_last_error(), "proj_out"), "%s", dt_last_error());
        dt_weights_close(q);
    }

    /* single file path */
    snprintf(path, sizeof path, "%s/model/transformer/diffusion_pytorch_model.safetensors", t_fixtures());
    dt_weights *single = dt_weights_open(path);
    T_CHECK("weights_open_single_file", single && same_tensors(ref, single) && !dt_weights_config(single), "%s", dt_last_error());
    dt_weights_close(single);

    /* diffusers-style shards + index */
    snprintf(path, sizeof path, "%s/sharded", tmp);
    mkdir(path, 0755);
    r = write_shards(ref, path, "diffusion_pytorch_model-%05d-of-%05d.safetensors", 1, 2,
                     "diffusion_pytorch_model.safetensors.index.json");
    snprintf(path2, sizeof path2, "%s/config.json", path);
    write_text(path2, "{\"num_layers\": 1}");
    dt_weights *sh = r == 0 ? dt_weights_open(path) : NULL;
    T_CHECK("weights_sharded_index_opens", sh != NULL, "%s", dt_last_error());
    T_CHECK("weights_sharded_finds_every_tensor", sh && same_tensors(ref, sh), "tensors differ");
    T_CHECK("weights_sharded_config", sh && json_get_int(dt_weights_config(sh), "num_layers", 0) == 1, "config");
    dt_weights_close(sh);

    /* mflux-style 0.safetensors, 1.safetensors, 2.safetensors + model.safetensors.index.json */
    snprintf(path, sizeof path, "%s/mflux", tmp);
    mkdir(path, 0755);
    r = write_shards(ref, path, "%d.safetensors", 0, 3, "model.safetensors.index.json");
    sh = r == 0 ? dt_weights_open(path) : NULL;
    T_CHECK("weights_mflux_shards_index", sh && same_tensors(ref, sh), "%s", dt_last_error());
    dt_weights_close(sh);
    /* the same shards without an index: every file is loaded */
    snprintf(path2, sizeof path2, "%s/model.safetensors.index.json", path);
    unlink(path2);
    sh = dt_weights_open(path);
    T_CHECK("weights_mflux_shards_no_index", sh && same_tensors(ref, sh), "%s", dt_last_error());
    dt_weights_close(sh);
    /* 12 shards without index: natural order 0..11 (tensor order follows file order) */
    snprintf(path, sizeof path, "%s/many", tmp);
    mkdir(path, 0755);
    r = write_shards(ref, path, "%d.safetensors", 0, 12, NULL);
    sh = r == 0 ? dt_weights_open(path) : NULL;
    int order_ok = sh && same_tensors(ref, sh);
    if (order_ok) {
        const st_tensor *t0 = dt_weights_at(sh, 0), *tl = dt_weights_at(sh, dt_weights_count(sh) - 1);
        order_ok = strstr(t0->file, "/0.safetensors") && strstr(tl->file, "/11.safetensors");
    }
    T_CHECK("weights_many_shards_natural_order", order_ok, "%s", dt_last_error());
    dt_weights_close(sh);

    /* duplicate names across shards are an error */
    snprintf(path, sizeof path, "%s/dup", tmp);
    mkdir(path, 0755);
    {
        float v[2] = {1, 2};
        int64_t s2[1] = {2};
        for (int i = 0; i < 2; i++) {
            st_writer *w = st_writer_new();
            st_writer_add_f32(w, "same.weight", 1, s2, v);
            snprintf(path2, sizeof path2, "%s/%d.safetensors", path, i);
            st_writer_save(w, path2);
            st_writer_free(w);
        }
        dt_clear_error();
        sh = dt_weights_open(path);
        T_CHECK("weights_duplicate_across_files", !sh && strstr(dt_last_error(), "same.weight") && strstr(dt_last_error(), "duplicate"),
                "%s", dt_last_error());
        dt_weights_close(sh);
    }

    /* component folder lookup */
    snprintf(path, sizeof path, "%s/model", t_fixtures());
    char *cd = dt_weights_component_dir(path, "transformer");
    snprintf(path2, sizeof path2, "%s/model/transformer", t_fixtures());
    T_CHECK("weights_component_dir_sub", cd && strcmp(cd, path2) == 0, "%s", cd ? cd : dt_last_error());
    free(cd);
    cd = dt_weights_component_dir(path2, "transformer");
    T_CHECK("weights_component_dir_self", cd && strcmp(cd, path2) == 0, "%s", cd ? cd : dt_last_error());
    free(cd);
    snprintf(path2, sizeof path2, "%s/model/tokenizer", t_fixtures());
    cd = dt_weights_component_dir(path2, "transformer");
    T_CHECK("weights_component_dir_missing", !cd && strstr(dt_last_error(), "tokenizer"), "%s", cd ? cd : "");
    free(cd);

    dt_weights_close(ref);
    rm_dir(tmp);
    return T_DONE();
}
