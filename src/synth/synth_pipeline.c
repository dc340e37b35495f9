/* synth_pipeline.c — the pieces the synthetic pipeline writers (synth_flux2.c, synth_krea2.c) share: the Qwen3 text
 * model's tensors, the transformer file's diffusers name, the bundled files' copy. */
#include "synth_pipeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/infile.h"
#include "core/outfile.h"
#include "io/safetensors.h"
#include "synth.h"

int dt_synth_copy_file(const char *src, const char *dst) {
    FILE *in = dt_fopen_input(src);
    if (!in) return -1;
    dt_outfile *of = dt_outfile_open(dst);
    if (!of) { fclose(in); return -1; }
    char buf[65536];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, dt_outfile_fp(of)) == n;
    if (ok && ferror(in)) { dt_set_error("%s: read error", src); fclose(in); dt_outfile_abort(of); return -1; }
    fclose(in);
    if (!ok) { dt_set_error("%s: write failed: %s", dst, strerror(errno)); dt_outfile_abort(of); return -1; }
    return dt_outfile_commit(of);
}

int dt_synth_write_text_model(const char *dir, const char *config, const char *prefix, const dt_synth_text_geom *g,
                              int bits, int group, uint64_t seed) {
    if (synth_mkdir(dir)) return -1;
    char p[8500], nm[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (synth_write_text(p, config)) return -1;
    synth_list l = {0};
    int64_t D = g->hidden, hd = g->hd;
    /* the embedding is a [vocab, D] "Linear" for quantization purposes (MLX quantizes embeddings too) */
    snprintf(nm, sizeof nm, "%s.embed_tokens", prefix); synth_add_linear(&l, nm, g->vocab, D, 0);
    l.t[l.n - 1].amp = 1.0f;
    for (int i = 0; i < g->layers; i++) {
        snprintf(nm, sizeof nm, "%s.layers.%d.input_layernorm.weight", prefix, i); synth_add(&l, nm, 1, &D, 1.0f, 0.2f);
        snprintf(nm, sizeof nm, "%s.layers.%d.post_attention_layernorm.weight", prefix, i); synth_add(&l, nm, 1, &D, 1.0f, 0.2f);
        snprintf(nm, sizeof nm, "%s.layers.%d.self_attn.q_proj", prefix, i); synth_add_linear(&l, nm, (int64_t)g->heads * g->hd, D, 0);
        snprintf(nm, sizeof nm, "%s.layers.%d.self_attn.k_proj", prefix, i); synth_add_linear(&l, nm, (int64_t)g->kv * g->hd, D, 0);
        snprintf(nm, sizeof nm, "%s.layers.%d.self_attn.v_proj", prefix, i); synth_add_linear(&l, nm, (int64_t)g->kv * g->hd, D, 0);
        snprintf(nm, sizeof nm, "%s.layers.%d.self_attn.o_proj", prefix, i); synth_add_linear(&l, nm, D, (int64_t)g->heads * g->hd, 0);
        snprintf(nm, sizeof nm, "%s.layers.%d.self_attn.q_norm.weight", prefix, i); synth_add(&l, nm, 1, &hd, 1.0f, 0.2f);
        snprintf(nm, sizeof nm, "%s.layers.%d.self_attn.k_norm.weight", prefix, i); synth_add(&l, nm, 1, &hd, 1.0f, 0.2f);
        snprintf(nm, sizeof nm, "%s.layers.%d.mlp.gate_proj", prefix, i); synth_add_linear(&l, nm, g->inter, D, 0);
        snprintf(nm, sizeof nm, "%s.layers.%d.mlp.up_proj", prefix, i); synth_add_linear(&l, nm, g->inter, D, 0);
        snprintf(nm, sizeof nm, "%s.layers.%d.mlp.down_proj", prefix, i); synth_add_linear(&l, nm, D, g->inter, 0);
    }
    snprintf(nm, sizeof nm, "%s.norm.weight", prefix); synth_add(&l, nm, 1, &D, 1.0f, 0.2f);
    return synth_write_model(&l, dir, bits, group, seed);
}

int dt_synth_name_transformer_for_diffusers(const char *dir) {
    char p[4200], q[4200];
    snprintf(p, sizeof p, "%s/transformer/model.safetensors", dir);
    snprintf(q, sizeof q, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    if (rename(p, q)) { dt_set_error("%s: cannot rename to %s (%s)", p, q, strerror(errno)); return -1; }
    return 0;
}

void dt_synth_bundled_sibling(const char *bundled_model, const char *sub, char *root, size_t n) {
    const size_t len = bundled_model ? strlen(bundled_model) : 0;
    if (len >= 6 && !strcmp(bundled_model + len - 6, "/model"))
        snprintf(root, n, "%.*s/%s", (int)(len - 6), bundled_model, sub);
    else
        snprintf(root, n, "tests/fixtures/%s", sub);
}

int dt_synth_qwen3_pipeline_parts(const char *dir, const char *what, const dt_synth_text_geom *te,
                                  const dt_synth_vae_geom *vg, int kl, int bits, int group, uint64_t seed,
                                  const char *bundled) {
    char p[4200];
    dt_log(1, "ditrun: synthetic %s: text encoder ...\n", what);
    snprintf(p, sizeof p, "%s/text_encoder", dir);
    if (dt_synth_write_qwen3(p, te, bits, group, seed + 1)) return -1;
    dt_log(1, "ditrun: synthetic %s: VAE ...\n", what);
    snprintf(p, sizeof p, "%s/vae", dir);
    if (dt_synth_write_vae(p, vg, kl, seed + 2)) return -1;
    static const char *const files[][2] = {{"tokenizer", "tokenizer.json"}, {"tokenizer", "tokenizer_config.json"},
                                           {"tokenizer", "chat_template.jinja"}, {"scheduler", "scheduler_config.json"}};
    return dt_synth_copy_bundled(dir, bundled, files, 4);
}

int dt_synth_copy_bundled(const char *dir, const char *root, const char *const files[][2], int n) {
    char p[4200], q[4200];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
        if (synth_mkdir(p)) return -1;
        snprintf(p, sizeof p, "%s/%s/%s", root, files[i][0], files[i][1]);
        snprintf(q, sizeof q, "%s/%s/%s", dir, files[i][0], files[i][1]);
        if (dt_synth_copy_file(p, q)) return -1;
    }
    return 0;
}

/* The Qwen3ForCausalLM text encoder of a FLUX.2-klein pipeline. */
