/* test_layouts.c — FLUX.2 checkpoints in the layouts users have (src/models/flux2_layouts.c):
 * from the tiny fixture's diffusers weights the test builds, by the key rules of src/models/flux2_layouts.h,
 *   - an original BFL single file (fused qkv, shift|scale final modulation, `.scale` norms), without and
 *     with config.json, bare and under ComfyUI's "model.diffusion_model." prefix, dense and quantized;
 *   - mflux folders: shards 0/1/2.safetensors + model.safetensors.index.json with mflux key names, no
 *     config.json, dense and q4 (metadata quantization_level), also as a pipeline root;
 * and checks that the forward of each matches the fixture's out.sample (1e-4), in process and through
 * `ditrun forward`; `ditrun info` names the layout; `ditrun convert` reproduces the diffusers file
 * byte for byte; `ditrun quantize` of the BFL file reproduces the q4 fixture's output; bad files fail
 * with one clear error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flux2_fixture_io.h"
#include "io/weights.h"
#include "models/flux2_layouts.h"
#include "export/quantize_file.h"

static char tmpdir[256];
static char fx_dense[512], fx_q4[512], io_file[512], q4_expected[512], fx_config[512];

static const char *exe_path(void) {
    static char exe[512];
    const char *b = getenv("BUILD");
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    return exe;
}

/* ------------------------------------------------------------------ building other layouts */

/* Rows of tensors NAME[0..n) + SUFFIX of F, concatenated (swap: the two halves of one tensor exchanged),
 * added to W as OUT + OUTSUFFIX. Returns 0, or -1 when a source is missing. */
static int add_cat(st_writer *w, const st_file *f, const char *out, const char *outsuf, int n, const char *const *names,
                   const char *suffix, int swap) {
    const st_tensor *t[3];
    char key[300];
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s.%s", names[i], suffix);
        if (!(t[i] = st_find(f, key))) return -1;
        bytes += t[i]->nbytes;
    }
    char *buf = dt_malloc(bytes), *p = buf;
    int64_t shape[8];
    memcpy(shape, t[0]->shape, sizeof shape);
    shape[0] = 0;
    for (int i = 0; i < n; i++) { memcpy(p, t[i]->data, t[i]->nbytes); p += t[i]->nbytes; shape[0] += t[i]->shape[0]; }
    if (swap) {   /* [a | b] -> [b | a] */
        size_t half = bytes / 2;
        char *tmp = dt_malloc(bytes);
        memcpy(tmp, buf + half, half);
        memcpy(tmp + half, buf, half);
        free(buf);
        buf = tmp;
    }
    snprintf(key, sizeof key, "%s.%s", out, outsuf);
    st_writer_add(w, key, t[0]->dtype, t[0]->ndim, shape, buf);
    free(buf);
    return 0;
}

typedef enum { TO_BFL, TO_MFLUX } target_layout;

/* Writes the fixture at SRC (diffusers names) into W with BFL or mflux names; quantized sources carry
 * .scales and .biases along with every .weight. prefix is prepended to every BFL name. */
static int build_layout(st_writer *w, const char *src, target_layout to, const char *prefix) {
    st_file *f = st_open(src);
    if (!f) return -1;
    int q = st_find(f, "x_embedder.scales") != NULL, rc = 0;
    const char *sufs[3] = {"weight", "scales", "biases"};
    int nsuf = q ? 3 : 1;
    char out[300], a[200], b[200], c[200];
    const char *one[1];
#define LIN(OUT, SRC) do { one[0] = (SRC); for (int s_ = 0; s_ < nsuf; s_++) rc |= add_cat(w, f, (OUT), sufs[s_], 1, one, sufs[s_], 0); } while (0)
#define NORM(OUT, SRC) do { one[0] = (SRC); rc |= add_cat(w, f, (OUT), to == TO_BFL ? "scale" : "weight", 1, one, "weight", 0); } while (0)
    if (to == TO_MFLUX) {
        /* mflux: diffusers names except double-block attn.to_out (no .0) and time_guidance_embed.linear_1/2 */
        for (size_t i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_at(f, i);
            const char *nm = t->name, *p;
            if (!strncmp(nm, "time_guidance_embed.timestep_embedder.", 38)) snprintf(out, sizeof out, "time_guidance_embed.%s", nm + 38);
            else if (!strncmp(nm, "transformer_blocks.", 19) && (p = strstr(nm, ".attn.to_out.0.")))
                snprintf(out, sizeof out, "%.*s.attn.to_out.%s", (int)(p - nm), nm, p + 15);
            else snprintf(out, sizeof out, "%s", nm);
            st_writer_add(w, out, t->dtype, t->ndim, t->shape, t->data);
        }
        st_close(f);
        return 0;
    }
    /* BFL */
    snprintf(out, sizeof out, "%simg_in", prefix); LIN(out, "x_embedder");
    snprintf(out, sizeof out, "%stxt_in", prefix); LIN(out, "context_embedder");
    snprintf(out, sizeof out, "%stime_in.in_layer", prefix); LIN(out, "time_guidance_embed.timestep_embedder.linear_1");
    snprintf(out, sizeof out, "%stime_in.out_layer", prefix); LIN(out, "time_guidance_embed.timestep_embedder.linear_2");
    snprintf(out, sizeof out, "%sdouble_stream_modulation_img.lin", prefix); LIN(out, "double_stream_modulation_img.linear");
    snprintf(out, sizeof out, "%sdouble_stream_modulation_txt.lin", prefix); LIN(out, "double_stream_modulation_txt.linear");
    snprintf(out, sizeof out, "%ssingle_stream_modulation.lin", prefix); LIN(out, "single_stream_modulation.linear");
    snprintf(out, sizeof out, "%sfinal_layer.linear", prefix); LIN(out, "proj_out");
    one[0] = "norm_out.linear";
    snprintf(out, sizeof out, "%sfinal_layer.adaLN_modulation.1", prefix);
    for (int s = 0; s < nsuf; s++) rc |= add_cat(w, f, out, sufs[s], 1, one, sufs[s], 1);
    for (int i = 0; st_find(f, (snprintf(a, sizeof a, "transformer_blocks.%d.attn.to_q.weight", i), a)); i++) {
        const char *img[3], *txt[3];
        char qn[3][100], tn[3][100];
        const char *iq[3] = {"to_q", "to_k", "to_v"}, *tq[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
        for (int k = 0; k < 3; k++) {
            snprintf(qn[k], sizeof qn[k], "transformer_blocks.%d.attn.%s", i, iq[k]); img[k] = qn[k];
            snprintf(tn[k], sizeof tn[k], "transformer_blocks.%d.attn.%s", i, tq[k]); txt[k] = tn[k];
        }
        for (int s = 0; s < nsuf; s++) {
            snprintf(out, sizeof out, "%sdouble_blocks.%d.img_attn.qkv", prefix, i); rc |= add_cat(w, f, out, sufs[s], 3, img, sufs[s], 0);
            snprintf(out, sizeof out, "%sdouble_blocks.%d.txt_attn.qkv", prefix, i); rc |= add_cat(w, f, out, sufs[s], 3, txt, sufs[s], 0);
        }
        static const char *pairs[][2] = {{"img_attn.proj", "attn.to_out.0"}, {"txt_attn.proj", "attn.to_add_out"},
                                         {"img_mlp.0", "ff.linear_in"}, {"img_mlp.2", "ff.linear_out"},
                                         {"txt_mlp.0", "ff_context.linear_in"}, {"txt_mlp.2", "ff_context.linear_out"}};
        for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
            snprintf(out, sizeof out, "%sdouble_blocks.%d.%s", prefix, i, pairs[k][0]);
            snprintf(b, sizeof b, "transformer_blocks.%d.%s", i, pairs[k][1]);
            LIN(out, b);
        }
        static const char *norms[][2] = {{"img_attn.norm.query_norm", "attn.norm_q"}, {"img_attn.norm.key_norm", "attn.norm_k"},
                                         {"txt_attn.norm.query_norm", "attn.norm_added_q"}, {"txt_attn.norm.key_norm", "attn.norm_added_k"}};
        for (size_t k = 0; k < 4; k++) {
            snprintf(out, sizeof out, "%sdouble_blocks.%d.%s", prefix, i, norms[k][0]);
            snprintf(b, sizeof b, "transformer_blocks.%d.%s", i, norms[k][1]);
            NORM(out, b);
        }
    }
    for (int i = 0; st_find(f, (snprintf(a, sizeof a, "single_transformer_blocks.%d.attn.to_out.weight", i), a)); i++) {
        snprintf(out, sizeof out, "%ssingle_blocks.%d.linear1", prefix, i);
        snprintf(c, sizeof c, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i); LIN(out, c);
        snprintf(out, sizeof out, "%ssingle_blocks.%d.linear2", prefix, i);
        snprintf(c, sizeof c, "single_transformer_blocks.%d.attn.to_out", i); LIN(out, c);
        snprintf(out, sizeof out, "%ssingle_blocks.%d.norm.query_norm", prefix, i);
        snprintf(c, sizeof c, "single_transformer_blocks.%d.attn.norm_q", i); NORM(out, c);
        snprintf(out, sizeof out, "%ssingle_blocks.%d.norm.key_norm", prefix, i);
        snprintf(c, sizeof c, "single_transformer_blocks.%d.attn.norm_k", i); NORM(out, c);
    }
#undef LIN
#undef NORM
    st_close(f);
    return rc;
}

static int write_bfl(const char *path, const char *src, const char *prefix) {
    st_writer *w = st_writer_new();
    int rc = build_layout(w, src, TO_BFL, prefix);
    if (rc == 0) rc = st_writer_save(w, path);
    st_writer_free(w);
    return rc;
}

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int rc = a && b ? 0 : -1;
    char buf[65536];
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, a)) > 0) if (fwrite(buf, 1, n, b) != n) rc = -1;
    if (a) fclose(a);
    if (b && fclose(b)) rc = -1;
    return rc;
}

/* mflux folder DIR: the tensors of SRC under mflux names spread over 3 shards + index; metadata as mflux writes. */
static int write_mflux(const char *dir, const char *src, const char *qlevel) {
    mkdir(dir, 0755);
    st_writer *all = st_writer_new();
    if (build_layout(all, src, TO_MFLUX, "")) { st_writer_free(all); return -1; }
    char p[600];
    snprintf(p, sizeof p, "%s/all.tmp", tmpdir);
    int rc = st_writer_save(all, p);
    st_writer_free(all);
    if (rc) return -1;
    st_file *f = st_open(p);
    if (!f) return -1;
    st_writer *sh[3] = {st_writer_new(), st_writer_new(), st_writer_new()};
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *ix = fopen(p, "w");
    fprintf(ix, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        int s = (int)(i * 3 / st_count(f));
        st_writer_add(sh[s], t->name, t->dtype, t->ndim, t->shape, t->data);
        fprintf(ix, "%s\"%s\": \"%d.safetensors\"", i ? ", " : "", t->name, s);
    }
    fprintf(ix, "}}\n");
    fclose(ix);
    for (int s = 0; s < 3; s++) {
        st_writer_set_metadata(sh[s], "mflux_version", "0.99.0");
        if (qlevel) st_writer_set_metadata(sh[s], "quantization_level", qlevel);
        snprintf(p, sizeof p, "%s/%d.safetensors", dir, s);
        rc |= st_writer_save(sh[s], p);
        st_writer_free(sh[s]);
    }
    st_close(f);
    snprintf(p, sizeof p, "%s/all.tmp", tmpdir);
    unlink(p);
    return rc;
}

/* ------------------------------------------------------------------ checks */

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void cli_forward(const char *name, const char *model, const char *expected) {
    char cmd[2048], out[8192], res[600];
    snprintf(res, sizeof res, "%s/cli-out.safetensors", tmpdir);
    snprintf(cmd, sizeof cmd, "%s forward --model %s --inputs %s --output %s --backend cpu -q 2>&1", exe_path(), model, io_file, res);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc) { T_FAIL(name, "exit %d: %s", rc, out); return; }
    size_t n1 = 0, n2 = 0;
    float *a = fx_reference(res, &n1), *b = fx_reference(expected, &n2);
    if (a && b && n1 == n2) t_check_rel_l2(name, a, b, n1, FIXTURE_FORWARD_TOL);
    else T_FAIL(name, "outputs unreadable");
    free(a); free(b);
}

static void bfl_dense(void) {
    char p[700], d[600], cfg[700];
    snprintf(p, sizeof p, "%s/flux-2-klein-tiny.safetensors", tmpdir);
    if (write_bfl(p, fx_dense, "")) { T_FAIL("build BFL file", "%s", dt_last_error()); return; }
    /* the file really is in BFL layout */
    dt_weights *w = dt_weights_open(p);
    T_CHECK("BFL file detected as BFL", w && flux2_layout_detect(w) == FLUX2_LAYOUT_BFL && !dt_weights_find(w, "x_embedder.weight"),
            "layout %s", w ? flux2_layout_name(flux2_layout_detect(w)) : dt_last_error());
    if (w && flux2_layout_install(w) == 0) {
        flux2_config c;
        int ok = flux2_config_parse(dt_weights_config(w), "inferred", &c) == 0;
        T_CHECK("BFL geometry inferred from shapes", ok && c.hidden == 256 && c.heads == 2 && c.head_dim == 128 && c.num_layers == 1 &&
                    c.num_single_layers == 2 && c.mlp_hidden == 768 && c.in_channels == 32 && c.out_channels == 32 &&
                    c.joint_dim == 96 && c.tg_channels == 256 && c.axes[0] == 32 && c.rope_theta == 2000.0f,
                "D=%d heads=%d hd=%d layers=%d/%d F=%d in=%d out=%d joint=%d", c.hidden, c.heads, c.head_dim, c.num_layers,
                c.num_single_layers, c.mlp_hidden, c.in_channels, c.out_channels, c.joint_dim);
        /* the views are the fixture's bytes: q/k/v thirds and the swapped final modulation */
        st_file *ref = st_open(fx_dense);
        const char *names[] = {"transformer_blocks.0.attn.to_q.weight", "transformer_blocks.0.attn.to_v.weight",
                               "transformer_blocks.0.attn.add_k_proj.weight", "norm_out.linear.weight",
                               "single_transformer_blocks.1.attn.norm_k.weight", "time_guidance_embed.timestep_embedder.linear_2.weight"};
        int same = 1;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            const st_tensor *a = dt_weights_find(w, names[k]), *b = st_find(ref, names[k]);
            same &= a && b && a->nbytes == b->nbytes && a->shape[0] == b->shape[0] && !memcmp(a->data, b->data, b->nbytes);
        }
        T_CHECK("BFL views equal the diffusers tensors (qkv thirds, swapped halves, norms)", same, "a mapped tensor differs");
        st_close(ref);
    } else T_FAIL("BFL install", "%s", dt_last_error());
    dt_weights_close(w);
    fx_forward_check("BFL single file, no config.json: forward", p, io_file, FIXTURE_FORWARD_TOL);
    cli_forward("BFL single file through `ditrun forward`", p, io_file);
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s info %s 2>&1", exe_path(), p);
    int rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("`ditrun info` on the BFL file", rc == 0 && strstr(out, "layout       BFL keys") && strstr(out, "geometry inferred") &&
                strstr(out, "D=256 (2 heads x 128), 1 double + 2 single blocks"), "exit %d: %s", rc, out);
    /* ComfyUI prefix */
    snprintf(p, sizeof p, "%s/comfy-prefixed.safetensors", tmpdir);
    if (write_bfl(p, fx_dense, "model.diffusion_model.")) T_FAIL("build prefixed BFL file", "%s", dt_last_error());
    else fx_forward_check("BFL file under model.diffusion_model.: forward", p, io_file, FIXTURE_FORWARD_TOL);
    /* a BFL folder with the diffusers config.json */
    snprintf(d, sizeof d, "%s/bfl-folder", tmpdir);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    snprintf(cfg, sizeof cfg, "%s/config.json", d);
    if (write_bfl(p, fx_dense, "") || copy_file(fx_config, cfg)) T_FAIL("build BFL folder", "%s", dt_last_error());
    else fx_forward_check("BFL folder with config.json: forward", d, io_file, FIXTURE_FORWARD_TOL);
}

static void bfl_quantized(void) {
    char p[600], q[600];
    /* a q4 BFL file from the q4 fixture: fused qkv as U32 rows with their scales and biases */
    snprintf(p, sizeof p, "%s/bfl-q4.safetensors", tmpdir);
    if (write_bfl(p, fx_q4, "")) { T_FAIL("build q4 BFL file", "%s", dt_last_error()); return; }
    fx_forward_check("BFL q4 file (packed qkv split): forward vs q4 expected", p, q4_expected, FIXTURE_FORWARD_TOL);
    /* ditrun quantize of the dense BFL file keeps BFL names; minmax g32 reproduces the q4 fixture */
    snprintf(p, sizeof p, "%s/flux-2-klein-tiny.safetensors", tmpdir);
    snprintf(q, sizeof q, "%s/bfl-quantized-here.safetensors", tmpdir);
    dt_quant_opts o;
    dt_quant_opts_default(&o);
    o.bits = 4; o.group = 32; o.rule = MLX_RULE_MINMAX; o.report = 0;
    dt_quant_stats st;
    if (dt_quantize_checkpoint(p, q, &o, &st)) { T_FAIL("quantize the BFL file", "%s", dt_last_error()); return; }
    T_CHECK("quantize the BFL file: every Linear", st.n_quantized == 21 && st.n_kept == 0, "%d quantized (want 21: fused qkv), %d kept",
            st.n_quantized, st.n_kept);
    fx_forward_check("quantized BFL file (minmax q4 g32): forward vs q4 expected", q, q4_expected, FIXTURE_FORWARD_TOL);
}

static void mflux(void) {
    char d[600], root[600], p[700];
    snprintf(d, sizeof d, "%s/mflux-transformer", tmpdir);
    if (write_mflux(d, fx_dense, NULL)) { T_FAIL("build mflux folder", "%s", dt_last_error()); return; }
    dt_weights *w = dt_weights_open(d);
    T_CHECK("mflux folder: 3 shards via the index, mflux layout", w && flux2_layout_detect(w) == FLUX2_LAYOUT_MFLUX &&
                dt_weights_find(w, "transformer_blocks.0.attn.to_out.weight") && !dt_weights_find(w, "transformer_blocks.0.attn.to_out.0.weight"),
            "%s", w ? flux2_layout_name(flux2_layout_detect(w)) : dt_last_error());
    dt_weights_close(w);
    fx_forward_check("mflux folder (shards + index, no config.json): forward", d, io_file, FIXTURE_FORWARD_TOL);
    cli_forward("mflux folder through `ditrun forward`", d, io_file);
    /* as a pipeline root: ROOT/transformer/ */
    snprintf(root, sizeof root, "%s/mflux-root", tmpdir);
    mkdir(root, 0755);
    snprintf(p, sizeof p, "%s/transformer", root);
    if (write_mflux(p, fx_dense, NULL)) T_FAIL("build mflux pipeline root", "%s", dt_last_error());
    else fx_forward_check("mflux pipeline root: forward", root, io_file, FIXTURE_FORWARD_TOL);
    /* quantized mflux: U32 + scales + biases, bits from quantization_level, group from the shapes */
    snprintf(d, sizeof d, "%s/mflux-q4", tmpdir);
    if (write_mflux(d, fx_q4, "4")) T_FAIL("build mflux q4 folder", "%s", dt_last_error());
    else fx_forward_check("mflux q4 folder: forward vs q4 expected", d, q4_expected, FIXTURE_FORWARD_TOL);
}

/* Every tensor of A equals the tensor of the same name in B (dtype, shape, bytes), and the counts agree. */
static int same_tensors(const char *a_path, const char *b_path, char *why, size_t cap) {
    st_file *a = st_open(a_path), *b = st_open(b_path);
    int ok = a && b && st_count(a) == st_count(b);
    if (!ok) snprintf(why, cap, "%s", a && b ? "tensor counts differ" : dt_last_error());
    for (size_t i = 0; ok && i < st_count(b); i++) {
        const st_tensor *y = st_at(b, i), *x = st_find(a, y->name);
        ok = x && x->dtype == y->dtype && x->nbytes == y->nbytes && x->ndim == y->ndim && !memcmp(x->data, y->data, y->nbytes);
        if (!ok) snprintf(why, cap, "tensor %s differs or is missing", y->name);
    }
    st_close(a);
    st_close(b);
    return ok;
}

static void convert(void) {
    char bfl[600], d[600], p[700], why[400], cmd[2048], out[8192];
    snprintf(bfl, sizeof bfl, "%s/flux-2-klein-tiny.safetensors", tmpdir);
    snprintf(d, sizeof d, "%s/converted", tmpdir);
    int nw, ns;
    if (flux2_convert_to_diffusers(bfl, d, &nw, &ns)) { T_FAIL("convert BFL -> diffusers", "%s", dt_last_error()); return; }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", d);
    T_CHECK("convert BFL -> diffusers: the fixture's tensors byte for byte", nw == 33 && ns == 0 && same_tensors(p, fx_dense, why, sizeof why),
            "%d written, %d skipped: %s", nw, ns, why);
    dt_weights *w = dt_weights_open(d);
    flux2_config c;
    T_CHECK("convert writes a diffusers config.json", w && dt_weights_config(w) && !json_get(dt_weights_config(w), "_ditrun_inferred") &&
                flux2_config_parse(dt_weights_config(w), "converted", &c) == 0 && c.hidden == 256 && c.num_single_layers == 2,
            "%s", dt_last_error());
    dt_weights_close(w);
    fx_forward_check("converted folder: forward", d, io_file, FIXTURE_FORWARD_TOL);
    /* CLI: a quantized BFL file to one diffusers file; it must equal the q4 fixture */
    snprintf(p, sizeof p, "%s/converted-q4.safetensors", tmpdir);
    snprintf(cmd, sizeof cmd, "%s convert --input %s/bfl-q4.safetensors --output %s --to diffusers 2>&1", exe_path(), tmpdir, p);
    int rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("`ditrun convert` q4 BFL -> diffusers file equals the q4 fixture", rc == 0 && same_tensors(p, fx_q4, why, sizeof why),
            "exit %d: %s %s", rc, out, why);
    /* mflux shards -> diffusers */
    snprintf(p, sizeof p, "%s/converted-mflux", tmpdir);
    snprintf(cmd, sizeof cmd, "%s convert --input %s/mflux-transformer --output %s -q 2>&1", exe_path(), tmpdir, p);
    rc = run_cmd(cmd, out, sizeof out);
    char f[800];
    snprintf(f, sizeof f, "%s/diffusion_pytorch_model.safetensors", p);
    T_CHECK("`ditrun convert` mflux folder -> diffusers equals the fixture", rc == 0 && same_tensors(f, fx_dense, why, sizeof why),
            "exit %d: %s %s", rc, out, why);
    snprintf(cmd, sizeof cmd, "%s convert --input %s --output %s/x --to bfl 2>&1", exe_path(), bfl, tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("`ditrun convert --to bfl` is refused", rc == 1 && strstr(out, "ditrun: error:") && strstr(out, "bfl"), "exit %d: %s", rc, out);
}

/* Bad BFL files: one clear error, never a crash. */
static void errors(void) {
    char p[600];
    st_file *f = st_open(fx_dense);
    /* qkv whose rows are not a multiple of 3 */
    st_writer *w = st_writer_new();
    build_layout(w, fx_dense, TO_BFL, "");
    const st_tensor *q = st_find(f, "transformer_blocks.0.attn.to_q.weight");
    int64_t shape[2] = {q->shape[0] + 1, q->shape[1]};
    char *buf = dt_calloc((size_t)(shape[0] * shape[1]), 2);
    st_writer_add(w, "double_blocks.1.img_attn.qkv.weight", DT_BF16, 2, shape, buf);
    free(buf);
    snprintf(p, sizeof p, "%s/bad-qkv.safetensors", tmpdir);
    st_writer_save(w, p);
    st_writer_free(w);
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){0});
    flux2_model *m = flux2_load(be, p);
    T_CHECK("BFL qkv with 257 rows: error names the tensor", !m && strstr(dt_last_error(), "double_blocks.1.img_attn.qkv.weight") &&
                strstr(dt_last_error(), "multiple of 3"), "%s", m ? "loaded" : dt_last_error());
    flux2_free(m);
    /* drop img_in: no config.json and no geometry */
    snprintf(p, sizeof p, "%s/flux-2-klein-tiny.safetensors", tmpdir);
    st_file *tmpf = st_open(p);
    w = st_writer_new();
    for (size_t i = 0; tmpf && i < st_count(tmpf); i++) {
        const st_tensor *t = st_at(tmpf, i);
        if (strcmp(t->name, "img_in.weight")) st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    st_close(tmpf);
    snprintf(p, sizeof p, "%s/bfl-noimgin.safetensors", tmpdir);
    st_writer_save(w, p);
    st_writer_free(w);
    m = flux2_load(be, p);
    T_CHECK("BFL file without img_in: error says the geometry cannot be inferred", !m && strstr(dt_last_error(), "config.json") &&
                strstr(dt_last_error(), "x_embedder"), "%s", m ? "loaded" : dt_last_error());
    flux2_free(m);
    /* a FLUX.2-dev file (guidance embedder) is refused rather than run without its guidance */
    w = st_writer_new();
    build_layout(w, fx_dense, TO_BFL, "");
    const st_tensor *l1 = st_find(f, "time_guidance_embed.timestep_embedder.linear_1.weight");
    st_writer_add(w, "guidance_in.in_layer.weight", l1->dtype, l1->ndim, l1->shape, l1->data);
    snprintf(p, sizeof p, "%s/bfl-dev.safetensors", tmpdir);
    st_writer_save(w, p);
    st_writer_free(w);
    m = flux2_load(be, p);
    T_CHECK("BFL file with guidance_in (FLUX.2-dev): clear error", !m && strstr(dt_last_error(), "FLUX.2-dev"), "%s",
            m ? "loaded" : dt_last_error());
    flux2_free(m);
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s convert --input %s --output %s/y 2>&1", exe_path(), fx_config, tmpdir);
    int rc = run_cmd(cmd, out, sizeof out);
    T_CHECK("`ditrun convert` of a non-checkpoint is an error", rc == 1 && strstr(out, "ditrun: error:"), "exit %d: %s", rc, out);
    be->destroy(be);
    st_close(f);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/ditrun-layouts-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) { T_FAIL("tmpdir", "mkdtemp failed"); return T_DONE(); }
    snprintf(fx_dense, sizeof fx_dense, "%s/model/transformer/diffusion_pytorch_model.safetensors", t_fixtures());
    snprintf(fx_config, sizeof fx_config, "%s/model/transformer/config.json", t_fixtures());
    snprintf(fx_q4, sizeof fx_q4, "%s/transformer-q4/model.safetensors", t_fixtures());
    snprintf(io_file, sizeof io_file, "%s/transformer_io.safetensors", t_fixtures());
    snprintf(q4_expected, sizeof q4_expected, "%s/transformer-q4/expected_out.safetensors", t_fixtures());
    bfl_dense();
    bfl_quantized();
    mflux();
    convert();
    errors();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("# could not remove %s\n", tmpdir);
    return T_DONE();
}
