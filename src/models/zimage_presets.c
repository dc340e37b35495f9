/* zimage_presets.c — Z-Image geometry presets (zimage.h: zimage_preset): the released Z-Image(-Turbo) geometry and the
 * test fixture's, for the synthetic writers, the bench and the tests. */
#include <string.h>

#include "zimage.h"

int zimage_preset(const char *name, zimage_config *c) {
    memset(c, 0, sizeof *c);
    c->in_channels = 16;
    c->patch = 2;
    c->qk_norm = 1;
    c->rope_theta = 256.0f;
    c->t_scale = 1000.0f;
    c->eps = 1e-5f;
    c->t_mid = 1024;   /* fixed in the reference's code */
    if (!strcmp(name, "z-image-turbo")) {
        /* ZImageTransformer2DModel's defaults (diffusers transformer_z_image.py): Z-Image(-Turbo), 6 B */
        c->dim = 3840; c->n_layers = 30; c->n_refiner = 2; c->heads = 30; c->cap_dim = 2560;
        c->axes[0] = 32; c->axes[1] = 48; c->axes[2] = 48;
        c->axes_len[0] = 1024; c->axes_len[1] = 512; c->axes_len[2] = 512;
    } else if (!strcmp(name, "z-image-tiny")) {
        /* tests/fixtures/zimage/model/transformer/config.json */
        c->dim = 32; c->n_layers = 2; c->n_refiner = 2; c->heads = 2; c->cap_dim = 32;
        c->axes[0] = 4; c->axes[1] = 6; c->axes[2] = 6;
        c->axes_len[0] = 256; c->axes_len[1] = 32; c->axes_len[2] = 32;
    } else {
        dt_set_error("unknown Z-Image preset '%s' (z-image-turbo, z-image-tiny)", name);
        return -1;
    }
    c->head_dim = c->dim / c->heads;
    c->patch_channels = c->patch * c->patch * c->in_channels;
    c->ffn = (int)((double)c->dim / 3.0 * 8.0);
    c->adaln = c->dim < ZIMAGE_ADALN_MAX ? c->dim : ZIMAGE_ADALN_MAX;
    return 0;
}

