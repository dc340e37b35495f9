/* test_api.c — the public API (include/ditrun.h): engine, transformer step, generate, errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ditrun.h"
#include "io/safetensors.h"
#include "test.h"

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
        snprintf(ap, sizeof ap, "/tmp/ditrun_api_lora_%d.safetensors", (int)getpid());
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
    ditrun_engine_free(e);
    return T_DONE();
}
