/* krea2_presets.c — Krea 2 geometry presets (krea2.h: krea2_preset): the released model's and the test fixture's,
 * for the synthetic writers, the bench and the tests. */
#include <string.h>

#include "krea2.h"

int krea2_preset(const char *name, krea2_config *c) {
    memset(c, 0, sizeof *c);
    c->head_dim = 128;
    c->t_embed = 256;
    c->n_axes = 3;
    c->axes[0] = 32; c->axes[1] = 48; c->axes[2] = 48;
    c->rope_theta = 1000.0f;
    c->eps = 1e-5f;
    if (!strcmp(name, "krea2")) {
        /* Krea2Transformer2DModel defaults (diffusers transformer_krea2.py): the released 12.9 B model */
        c->in_channels = 64; c->num_layers = 28; c->heads = 48; c->kv_heads = 12; c->intermediate = 16384;
        c->text_dim = 2560; c->text_layers = 12; c->text_heads = 20; c->text_kv_heads = 20;
        c->text_intermediate = 6912; c->n_layerwise = 2; c->n_refiner = 2;
    } else if (!strcmp(name, "krea2-tiny")) {
        /* tests/fixtures/krea2/transformer/config.json */
        c->in_channels = 16; c->num_layers = 2; c->heads = 4; c->kv_heads = 1; c->intermediate = 512;
        c->text_dim = 64; c->text_layers = 3; c->text_heads = 2; c->text_kv_heads = 1;
        c->text_intermediate = 128; c->n_layerwise = 1; c->n_refiner = 1;
    } else {
        dt_set_error("unknown Krea 2 preset '%s' (krea2, krea2-tiny)", name);
        return -1;
    }
    c->out_channels = c->in_channels;
    c->hidden = c->heads * c->head_dim;
    c->text_head_dim = c->text_dim / c->text_heads;
    return 0;
}
