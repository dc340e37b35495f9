/* flux2_presets.c — FLUX.2-klein geometry presets (flux2.h: flux2_preset): the published klein-4B/9B geometry and
 * the test fixture's, for the synthetic writers, the bench and the tests. */
#include <string.h>

#include "flux2.h"

int flux2_preset(const char *name, flux2_config *c) {
    memset(c, 0, sizeof *c);
    c->head_dim = 128; c->tg_channels = 256; c->n_axes = 4;
    c->axes[0] = c->axes[1] = c->axes[2] = c->axes[3] = 32;
    c->rope_theta = 2000; c->eps = 1e-6f;
    if (!strcmp(name, "klein-4b")) {
        c->in_channels = 128; c->num_layers = 5; c->num_single_layers = 20; c->heads = 24; c->joint_dim = 7680;
    } else if (!strcmp(name, "klein-9b")) {
        c->in_channels = 128; c->num_layers = 8; c->num_single_layers = 24; c->heads = 32; c->joint_dim = 12288;
    } else if (!strcmp(name, "tiny")) {
        c->in_channels = 32; c->num_layers = 1; c->num_single_layers = 2; c->heads = 2; c->joint_dim = 96;
    } else {
        dt_set_error("unknown FLUX.2 preset '%s' (klein-4b, klein-9b, tiny)", name);
        return -1;
    }
    c->out_channels = c->in_channels;
    c->hidden = c->heads * c->head_dim;
    c->mlp_hidden = c->hidden * 3;
    return 0;
}
