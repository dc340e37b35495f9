/* fuzz_config.c — libFuzzer target: parse a config-like JSON document and read it the way the engine's
 * loaders do (model configs, quantization blocks, index weight maps, scheduler and tokenizer fields),
 * with every lookup tolerant of missing keys and wrong types. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/json.h"

static const char *keys[] = {
    "_class_name", "_diffusers_version", "patch_size", "in_channels", "out_channels", "num_layers", "num_single_layers",
    "attention_head_dim", "num_attention_heads", "num_key_value_heads", "joint_attention_dim", "hidden_size",
    "intermediate_size", "num_hidden_layers", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta", "eps",
    "mlp_ratio", "guidance_embeds", "timestep_guidance_channels", "tie_word_embeddings", "latent_channels",
    "norm_num_groups", "layers_per_block", "batch_norm_eps", "shift", "base_shift", "max_shift",
    "use_dynamic_shifting", "num_train_timesteps", "time_shift_type", "is_distilled", "torch_dtype",
};

static volatile double sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json *cfg = json_parse((const char *)data, size, "config.json");
    if (!cfg) return 0;
    double acc = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        acc += json_get_num(cfg, keys[i], 0) + (double)json_get_int(cfg, keys[i], -1) + json_get_bool(cfg, keys[i], 0);
        const char *s = json_get_str(cfg, keys[i]);
        if (s) acc += (double)strlen(s);
    }
    /* arrays of numbers: axes_dims_rope, block_out_channels, text-encoder taps */
    const char *arrays[] = {"axes_dims_rope", "block_out_channels", "axes_dims", "text_encoder_out_layers"};
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
        const json *arr = json_get(cfg, arrays[a]);
        for (size_t i = 0; arr && i < arr->len; i++) {
            const json *e = json_at(arr, i);
            if (e && e->type == JSON_NUMBER) acc += e->is_integer ? (double)e->integer : e->number;
        }
    }
    /* quantization block (config.json of MLX checkpoints) */
    const json *q = json_get(cfg, "quantization");
    if (!q) q = json_get(cfg, "quantization_config");
    acc += (double)json_get_int(q, "bits", 0) + (double)json_get_int(q, "group_size", 0);
    const char *mode = json_get_str(q, "mode");
    if (mode) acc += (double)strlen(mode);
    /* index files: weight_map of tensor -> shard */
    const json *wm = json_get(cfg, "weight_map");
    for (size_t i = 0; wm && wm->type == JSON_OBJECT && i < wm->len; i++) {
        const char *shard = json_get_str(wm, wm->keys[i]);
        if (shard) acc += (double)strlen(shard);
    }
    /* model_index.json: component -> [library, class] */
    for (size_t i = 0; cfg->type == JSON_OBJECT && i < cfg->len; i++) {
        const json *v = cfg->items[i];
        if (v->type == JSON_ARRAY && v->len == 2) {
            const json *lib = json_at(v, 0), *cls = json_at(v, 1);
            if (lib && lib->type == JSON_STRING && cls && cls->type == JSON_STRING) acc += (double)(lib->len + cls->len);
        }
    }
    /* tokenizer.json: model.vocab (object) and model.merges (array of strings or pairs) */
    const json *model = json_get(cfg, "model");
    const json *vocab = json_get(model, "vocab");
    for (size_t i = 0; vocab && vocab->type == JSON_OBJECT && i < vocab->len; i++) acc += (double)json_get_int(vocab, vocab->keys[i], 0);
    const json *merges = json_get(model, "merges");
    for (size_t i = 0; merges && i < merges->len; i++) {
        const json *m = json_at(merges, i);
        if (m && m->type == JSON_ARRAY) acc += (double)m->len;
        else if (m && m->type == JSON_STRING) acc += (double)m->len;
    }
    sink = acc;
    json_free(cfg);
    return 0;
}
