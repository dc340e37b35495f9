/* placement.c — the device-memory placement planner (placement.h): each candidate's phase peaks, the cheapest that
 * fits the budget, the smallest workable budget. */
#include "pipeline/placement.h"

#include <stdio.h>

#include "core/common.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The phase peaks of one candidate placement. A loaded model keeps its activation buffers for the next request (the
 * text encoder's while it is loaded, the transformer's from its first forward on: the decode runs beside them). */
static void phases(const dt_place_sizes *s, int release_te, int tiled, int host, int two_passes, dt_place_plan *p) {
    /* tiled: 1 the tile, 2 the half tile; host: the packed weights off the device; two_passes: the guidance batch
     * dropped (one sequence's activations per forward) */
    const int64_t dit_act = two_passes && s->dit_batch > 1 ? s->dit_act / s->dit_batch : s->dit_act;
    const int64_t dec_act = tiled == 2 ? s->vae_small_tile_act : tiled && s->vae_tile_act > 0 ? s->vae_tile_act : s->vae_act;
    const int64_t te_w = s->text_encoder - (host ? s->te_packed : 0);
    const int64_t te = release_te ? 0 : te_w + s->te_act;
    const int64_t qbuf = max64(s->te_qbuf, s->dit_qbuf);   /* held once the transformer has loaded */
    const int64_t dit = s->transformer - (host ? s->transformer_packed : 0) + s->vae + qbuf + dit_act;
    const int64_t vsc = s->vae_scratch[tiled], held_vsc = s->resident ? vsc : 0;   /* (a resident pipeline: from
                                                                                     * its first image on) */
    /* one-shot with a released encoder: it runs alone, before the transformer and VAE are loaded; a resident
     * pipeline encodes the next prompt beside the transformer as the last request left it */
    p->phase_peak[DT_PHASE_ENCODE] =
        s->workspace + te_w + s->te_act + (release_te && !s->resident ? s->te_qbuf : dit + held_vsc);
    p->phase_peak[DT_PHASE_DENOISE] = s->workspace + te + dit + held_vsc;
    p->phase_peak[DT_PHASE_DECODE] = s->workspace + te + dit + dec_act + vsc;
    p->peak = max64(p->phase_peak[0], max64(p->phase_peak[1], p->phase_peak[2]));
    p->release_text_encoder = release_te;
    p->vae_tiling = tiled != 0;
    p->vae_tile_px = tiled == 2 ? s->vae_small_tile_px : tiled ? s->vae_tile_px : 0;
    p->host_weights = host;
    p->guidance_two_passes = two_passes && s->dit_batch > 1;
}

const char *dt_place_bytes(int64_t b, char *buf, size_t n) {
    if (b >= (1LL << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (1LL << 30));
    else if (b >= (1LL << 20)) snprintf(buf, n, "%.1f MiB", (double)b / (1LL << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / (1LL << 10));
    return buf;
}

int dt_place_plan_make(int64_t budget, const dt_place_sizes *s, dt_place_plan *p) {
    /* candidates, cheapest first: {release the text encoder, tile the VAE: 1 the tile, 2 the half tile} */
    static const int one_shot[][2] = {{1, 0}, {1, 1}, {1, 2}};
    static const int resident[][2] = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
    const int (*c)[2] = s->resident ? resident : one_shot;
    const int nc = s->resident ? 6 : 3;
    dt_place_plan best = {0}, smallest = {0};
    int found = 0, first = 1;
    /* each candidate with the guidance batch, then without it (two passes cost a little per step: dropped before the
     * next economy) */
    const int nb = s->dit_batch > 1 ? 2 : 1;
    for (int host = 0; host < 1 + (s->host_ok && (s->te_packed > 0 || s->transformer_packed > 0)); host++)
        for (int i = 0; i < nc * nb; i++) {
            const int *ci = c[i / nb], two = i % nb;
            if ((ci[1] == 1 && s->vae_tile_act <= 0) || (ci[1] == 2 && s->vae_small_tile_act <= 0))
                continue;   /* one tile: tiling changes nothing */
            dt_place_plan q = {0};   /* (every field set by phases; zeroed for gcc -O1's sanitizer build) */
            phases(s, ci[0], ci[1], host, two, &q);
            if (first || q.peak < smallest.peak) smallest = q;
            first = 0;
            if (!found && (budget <= 0 || q.peak <= budget)) { best = q; found = 1; }
        }
    *p = found ? best : smallest;
    p->min_budget = smallest.peak;
    if (found) return 0;
    char b1[32], b2[32];
    dt_set_error("memory budget %s is below the smallest workable %s for this model and size (text encoder %s, VAE "
                 "%s%s%s)", dt_place_bytes(budget, b1, sizeof b1), dt_place_bytes(smallest.peak, b2, sizeof b2),
                 smallest.release_text_encoder ? "released" : "resident", smallest.vae_tiling ? "tiled" : "untiled",
                 smallest.guidance_two_passes ? ", guidance in two passes" : "",
                 smallest.host_weights ? ", 4/8-bit weights in host memory" : "");
    return -1;
}

void dt_place_plan_describe(const dt_place_plan *p, char *buf, size_t n) {
    char a[32], b[32], c[32], d[32], e[32];
    char t[40] = "";
    if (p->vae_tiling && p->vae_tile_px > 0) snprintf(t, sizeof t, " (%d px tiles)", p->vae_tile_px);
    snprintf(buf, n, "text encoder %s, VAE %s%s%s%s; predicted peak %s (encode %s, denoise %s, decode %s); smallest "
             "workable %s", p->release_text_encoder ? "released" : "resident", p->vae_tiling ? "tiled" : "untiled", t,
             p->guidance_two_passes ? ", guidance in two passes" : "",
             p->host_weights ? ", 4/8-bit weights in host memory" : "",
             dt_place_bytes(p->peak, a, sizeof a), dt_place_bytes(p->phase_peak[0], b, sizeof b),
             dt_place_bytes(p->phase_peak[1], c, sizeof c), dt_place_bytes(p->phase_peak[2], d, sizeof d),
             dt_place_bytes(p->min_budget, e, sizeof e));
}
