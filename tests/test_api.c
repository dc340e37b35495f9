/* test_api.c — the public API (include/ditrun.h): engine, transformer step, generate, errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ditrun.h"
#include "io/safetensors.h"
#include "test.h"

/* Editing through the API: a reference from a file and the same bytes from memory give the same image, whose size
 * comes from the reference; inpainting takes the init image's size; a resident pipeline gives the same image again
 * and, after an editing request, the same text-to-image pixels as before it; inconsistent inputs are errors. */
static void editing(ditrun_engine *e) {
    char root[512], ref0[600], ref9[600], mask[600];
    snprintf(root, sizeof root, "%s/model", t_fixtures());
    snprintf(ref0, sizeof ref0, "%s/edit/ref0.png", t_fixtures());
    snprintf(ref9, sizeof ref9, "%s/edit/ref9.png", t_fixtures());
    snprintf(mask, sizeof mask, "%s/edit/mask.png", t_fixtures());
    size_t n0 = 0, n9 = 0, nm = 0;
    void *b0 = t_slurp(ref0, &n0), *b9 = t_slurp(ref9, &n9), *bm = t_slurp(mask, &nm);
    ditrun_generate_opts o = ditrun_generate_defaults();
    o.model = root;
    o.prompt = "turn the fox into a snow leopard";
    o.max_sequence_length = 32;
    o.seed = 5;
    ditrun_image_input file = {ref0, NULL, 0, NULL}, mem = {NULL, b0, n0, "upload.png"};
    o.images = &file;
    o.n_images = 1;
    ditrun_image a = {0}, b = {0}, c = {0}, d = {0};
    int ra = ditrun_generate(e, &o, &a);
    T_CHECK("API edit: the reference (100x77) sets the size 96x72", ra == 0 && a.width == 96 && a.height == 72,
            "rc %d %dx%d: %s", ra, a.width, a.height, ditrun_last_error());
    o.images = &mem;
    int rb = ditrun_generate(e, &o, &b);
    T_CHECK("API edit: the reference from memory = from its file", ra == 0 && rb == 0 && a.width == b.width &&
            a.height == b.height && !memcmp(a.rgb, b.rgb, (size_t)a.width * a.height * 3), "rc %d: %s", rb, ditrun_last_error());
    /* inpainting from memory: the init image's size (72x64) */
    ditrun_image_input init = {NULL, b9, n9, "init.png"}, mk = {NULL, bm, nm, "mask.png"};
    o.images = NULL;
    o.n_images = 0;
    o.init_image = &init;
    o.mask = &mk;
    o.strength = 0.6f;
    int rc = ditrun_generate(e, &o, &c);
    T_CHECK("API inpainting: the init image's size", rc == 0 && c.width == 72 && c.height == 64, "rc %d %dx%d: %s", rc,
            c.width, c.height, ditrun_last_error());
    o.init_image = NULL;
    T_CHECK("API: a mask without an init image is refused", ditrun_generate(e, &o, &d) != 0 &&
            strstr(ditrun_last_error(), "mask") && strstr(ditrun_last_error(), "init"), "error: %s", ditrun_last_error());
    o.mask = NULL;
    o.strength = 0;
    ditrun_image_input junk = {NULL, "not an image", 12, "junk.png"};
    o.images = &junk;
    o.n_images = 1;
    T_CHECK("API: undecodable reference bytes named in the error", ditrun_generate(e, &o, &d) != 0 &&
            strstr(ditrun_last_error(), "junk.png"), "error: %s", ditrun_last_error());
    /* a resident pipeline: edit, edit again (same bytes), then text-to-image = text-to-image before any edit */
    ditrun_load_opts lo = ditrun_load_defaults();
    lo.model = root;
    ditrun_pipeline *pl = ditrun_pipeline_load(e, &lo);
    ditrun_generate_opts t = ditrun_generate_defaults();
    t.prompt = "a red fox";
    t.width = t.height = 64;
    t.max_sequence_length = 32;
    t.seed = 3;
    ditrun_image t0 = {0}, t1 = {0}, e0 = {0}, e1 = {0};
    o.images = &file;
    int ok = pl && ditrun_pipeline_generate(pl, &t, &t0) == 0 && ditrun_pipeline_generate(pl, &o, &e0) == 0 &&
             ditrun_pipeline_generate(pl, &o, &e1) == 0 && ditrun_pipeline_generate(pl, &t, &t1) == 0;
    T_CHECK("API pipeline: edits repeat exactly and leave no reference behind", ok && e0.width == 96 &&
            !memcmp(e0.rgb, e1.rgb, 96 * 72 * 3) && !memcmp(e0.rgb, a.rgb, 96 * 72 * 3) && !memcmp(t0.rgb, t1.rgb, 64 * 64 * 3),
            "%s", ok ? "pixels differ" : ditrun_last_error());
    ditrun_pipeline_free(pl);
    ditrun_image *all[] = {&a, &b, &c, &d, &t0, &t1, &e0, &e1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ditrun_image_free(all[i]);
    free(b0); free(b9); free(bm);
}

int main(void) {
    T_CHECK("version", ditrun_version() && *ditrun_version(), "empty version");
    T_CHECK("unknown backend rejected", ditrun_engine_create("tpu", 0) == NULL && strstr(ditrun_last_error(), "tpu"),
            "error: %s", ditrun_last_error());
    ditrun_engine *e = ditrun_engine_create("cpu", 0);
    if (!e) { T_FAIL("engine", "%s", ditrun_last_error()); return T_DONE(); }
    T_CHECK("engine backend", !strcmp(ditrun_engine_backend(e), "cpu"), "got %s", ditrun_engine_backend(e));
    T_CHECK("unknown precision rejected", ditrun_engine_set_precision(e, "fp4") == -1 && strstr(ditrun_last_error(), "fp4"),
            "error: %s", ditrun_last_error());
    T_CHECK("precision fp8 / bf16 accepted", ditrun_engine_set_precision(e, "fp8") == 0 && ditrun_engine_set_precision(e, "bf16") == 0,
            "error: %s", ditrun_last_error());
    T_CHECK("unknown attention precision rejected",
            ditrun_engine_set_attn_precision(e, "int8") == -1 && strstr(ditrun_last_error(), "int8"), "error: %s",
            ditrun_last_error());
    T_CHECK("attention precision fp8 / bf16 accepted",
            ditrun_engine_set_attn_precision(e, "fp8") == 0 && ditrun_engine_set_attn_precision(e, "bf16") == 0,
            "error: %s", ditrun_last_error());

    char p[512];
    snprintf(p, sizeof p, "%s/model", t_fixtures());
    ditrun_transformer *t = ditrun_transformer_load(e, p);
    snprintf(p, sizeof p, "%s/transformer_io.safetensors", t_fixtures());
    st_file *io = st_open(p);
    if (!t || !io) T_FAIL("transformer load", "%s", ditrun_last_error());
    else {
        int cin, cout, joint;
        ditrun_transformer_dims(t, &cin, &cout, &joint);
        const st_tensor *h = st_find(io, "in.hidden_states"), *enc = st_find(io, "in.encoder_hidden_states");
        int n = (int)h->shape[1], nt = (int)enc->shape[1];
        float *img = st_to_f32(h), *txt = st_to_f32(enc), *iid = st_to_f32(st_find(io, "in.img_ids")),
              *tid = st_to_f32(st_find(io, "in.txt_ids")), *ts = st_to_f32(st_find(io, "in.timestep")),
              *ref = st_to_f32(st_find(io, "out.sample"));
        float *out = malloc(sizeof(float) * n * cout);
        if (ditrun_transformer_forward(t, img, n, txt, nt, ts[0], iid, tid, out)) T_FAIL("transformer forward", "%s", ditrun_last_error());
        else t_check_rel_l2("transformer forward via API", out, ref, (size_t)n * cout, 1e-4); /* f32 vs f32 reference */
        free(img); free(txt); free(iid); free(tid); free(ts); free(ref); free(out);
    }
    /* fp8 mode through the API: the same step within the fp8 quality tolerance of the f32 reference */
    if (io && ditrun_engine_set_precision(e, "fp8") == 0) {
        snprintf(p, sizeof p, "%s/model", t_fixtures());
        ditrun_transformer *t8 = ditrun_transformer_load(e, p);
        ditrun_engine_set_precision(e, "bf16");
        if (!t8) T_FAIL("fp8 transformer load", "%s", ditrun_last_error());
        else {
            const st_tensor *h = st_find(io, "in.hidden_states"), *enc = st_find(io, "in.encoder_hidden_states");
            int n = (int)h->shape[1], nt = (int)enc->shape[1], cout;
            ditrun_transformer_dims(t8, NULL, &cout, NULL);
            float *img = st_to_f32(h), *txt = st_to_f32(enc), *iid = st_to_f32(st_find(io, "in.img_ids")),
                  *tid = st_to_f32(st_find(io, "in.txt_ids")), *ts = st_to_f32(st_find(io, "in.timestep")),
                  *ref = st_to_f32(st_find(io, "out.sample"));
            float *out = malloc(sizeof(float) * n * cout);
            if (ditrun_transformer_forward(t8, img, n, txt, nt, ts[0], iid, tid, out)) T_FAIL("fp8 transformer forward", "%s", ditrun_last_error());
            /* e4m3 keeps 3 mantissa bits (~2-4% per Linear); the tiny fixture's output is mostly its residual path */
            else t_check_rel_l2("fp8 transformer forward via API vs f32 reference", out, ref, (size_t)n * cout, 0.03);
            free(img); free(txt); free(iid); free(tid); free(ts); free(ref); free(out);
            ditrun_transformer_free(t8);
        }
    }
    st_close(io);
    ditrun_transformer_free(t);

    ditrun_generate_opts o = ditrun_generate_defaults();
    snprintf(p, sizeof p, "%s/model", t_fixtures());
    o.model = p;
    o.prompt = "a red fox";
    o.width = o.height = 64;
    o.max_sequence_length = 32;
    o.seed = 3;
    ditrun_image img;
    int rc = ditrun_generate(e, &o, &img);
    T_CHECK("generate via API", rc == 0 && img.width == 64 && img.height == 64 && img.rgb, "rc %d: %s", rc, ditrun_last_error());
    ditrun_image_free(&img);
    o.prompt = NULL;
    T_CHECK("generate without prompt fails", ditrun_generate(e, &o, &img) != 0 && strstr(ditrun_last_error(), "prompt"),
            "error: %s", ditrun_last_error());
    /* LoRA adapters through the load options: a bad list or file is refused; a real adapter changes the image */
    {
        ditrun_load_opts lo = ditrun_load_defaults();
        lo.model = p;
        const char *bad[1] = {"/nonexistent/adapter.safetensors:0.5"};
        lo.loras = bad;
        lo.n_loras = 1;
        ditrun_pipeline *pp = ditrun_pipeline_load(e, &lo);
        T_CHECK("pipeline lora missing file", !pp && strstr(ditrun_last_error(), "/nonexistent/adapter.safetensors"),
                "error: %s", ditrun_last_error());
        ditrun_pipeline_free(pp);
        lo.n_loras = 9;
        pp = ditrun_pipeline_load(e, &lo);
        T_CHECK("pipeline lora count", !pp && strstr(ditrun_last_error(), "LoRA"), "error: %s", ditrun_last_error());
        ditrun_pipeline_free(pp);
        char ap[600];
        snprintf(ap, sizeof ap, "%s/ditrun_api_lora_%d.safetensors", t_tmp_root(), (int)getpid());
        st_writer *w = st_writer_new();
        float a[4 * 32], b[256 * 4];
        for (int i = 0; i < 4 * 32; i++) a[i] = (float)((i * 37) % 11 - 5) * 0.02f;
        for (int i = 0; i < 256 * 4; i++) b[i] = (float)((i * 13) % 7 - 3) * 0.2f;
        int64_t sa[2] = {4, 32}, sb[2] = {256, 4};
        st_writer_add_f32(w, "transformer.x_embedder.lora_A.weight", 2, sa, a);
        st_writer_add_f32(w, "transformer.x_embedder.lora_B.weight", 2, sb, b);
        st_writer_save(w, ap);
        st_writer_free(w);
        const char *good[1] = {ap};
        lo.loras = good;
        lo.n_loras = 1;
        pp = ditrun_pipeline_load(e, &lo);
        lo.n_loras = 0;
        ditrun_pipeline *p0 = ditrun_pipeline_load(e, &lo);
        ditrun_generate_opts go = ditrun_generate_defaults();
        go.prompt = "a fox";
        go.width = go.height = 64;
        go.max_sequence_length = 32;
        ditrun_image i1 = {0}, i0 = {0};
        int r1 = pp ? ditrun_pipeline_generate(pp, &go, &i1) : -1, r0 = p0 ? ditrun_pipeline_generate(p0, &go, &i0) : -1;
        long diff = 0;
        for (int i = 0; !r1 && !r0 && i < 64 * 64 * 3; i++) diff += abs((int)i1.rgb[i] - (int)i0.rgb[i]);
        T_CHECK("pipeline lora changes the image", !r1 && !r0 && diff > 64 * 64, "rc %d/%d, summed difference %ld: %s", r1,
                r0, diff, ditrun_last_error());
        ditrun_image_free(&i1);
        ditrun_image_free(&i0);
        ditrun_pipeline_free(pp);
        ditrun_pipeline_free(p0);
        remove(ap);
    }
    editing(e);
    ditrun_engine_free(e);
    return T_DONE();
}
