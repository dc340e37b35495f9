/* budget.c — the memory plan of a run acted on (budget.h): the budget, the pipeline's sizes at the image size, the
 * plan, the load options it sets, the log line and the refusal before loading. */
#include "pipeline/budget.h"

#include <stdio.h>
#include <string.h>

#include "backends/backend_cuda.h"

/* The budget a run plans within: o->max_vram, else a CUDA pool's (the card's free memory plus what it holds
 * already); the CPU has none (0). *cuda: the backend is CUDA. */
static int64_t budget_of(dt_backend *be, const dt_pipeline_opts *o, int *cuda) {
    int64_t budget = o->max_vram;
    *cuda = dt_backend_cuda_mem_budget(be, o->max_vram > 0 ? NULL : &budget, NULL) == 0;
    return !*cuda && o->max_vram <= 0 ? 0 : budget;
}

/* The plan of a W x H image within budget, nothing acted on: 0 (it fits), 1 (nothing fits: *pl the smallest
 * placement, dt_last_error why), or -1 when the sizes cannot be read. */
static int plan_at(dt_backend *be, const dt_pipeline_opts *o, int64_t budget, int cuda, int W, int H, int T,
                   int resident, dt_place_plan *pl) {
    memset(pl, 0, sizeof *pl);
    dt_place_sizes s;
    if (dt_place_sizes_for(o->model, W, H, T, (int)dt_dtype_size(be->act_dtype), o->vae_tile, resident,
                           o->guidance_batch && o->sequence_parallel <= 1, &s))
        return -1;
    /* host weights: only a CUDA backend on a path that reads the packed weights each time */
    s.host_ok = cuda && be->opts.qpath != DT_QPATH_CACHED && be->opts.qpath != DT_QPATH_MIXED;
    return dt_place_plan_make(budget, &s, pl) ? 1 : 0;
}

/* What a plan costs a resident pipeline's images of floor_side, as bits (the higher, the dearer): nothing fits the
 * budget; the weights in host memory; the text encoder reloaded per new prompt; guidance in two passes; the VAE
 * decoding a floor_side image in tiles (a 1024² klein decode in 512 px tiles took 0.12-0.13 s against 0.053 s whole,
 * PERF.md). */
enum { COST_TILES = 1, COST_TWO_PASSES = 2, COST_TE_RELOAD = 4, COST_HOST = 8, COST_NO_FIT = 16 };
static unsigned plan_cost(int rc, const dt_place_plan *p, int floor_side) {
    return (rc ? COST_NO_FIT : 0u) | (p->host_weights ? COST_HOST : 0u) |
           (p->release_text_encoder ? COST_TE_RELOAD : 0u) | (p->guidance_two_passes ? COST_TWO_PASSES : 0u) |
           (p->vae_tiling && (p->vae_tile_px <= 0 || p->vae_tile_px < floor_side) ? COST_TILES : 0u);
}

int dt_budget_largest_side(dt_backend *be, const dt_pipeline_opts *o, int max_side, int floor_side, int T,
                           int resident, char *why, size_t n) {
    if (why && n) why[0] = 0;
    if (max_side <= floor_side) return max_side;
    int cuda;
    const int64_t budget = budget_of(be, o, &cuda);
    if (budget <= 0) return max_side;
    dt_place_plan pl;
    const int rf = plan_at(be, o, budget, cuda, floor_side, floor_side, T, resident, &pl);
    if (rf < 0) {
        dt_clear_error();
        return max_side;
    }
    const unsigned base = plan_cost(rf, &pl, floor_side);
    unsigned extra = COST_NO_FIT;   /* floor_side itself does not fit: plan for it, so that a refusal names it */
    if (!(base & COST_NO_FIT)) {
        const int rm = plan_at(be, o, budget, cuda, max_side, max_side, T, resident, &pl);
        extra = rm < 0 ? 0u : plan_cost(rm, &pl, floor_side) & ~base;
    }
    dt_clear_error();
    if (!extra) return max_side;
    /* the plans grow with the side: the largest floor_side + 64 k below max_side whose plan adds nothing (lo: known
     * to add nothing; the answer is in [lo, hi]) */
    int lo = 0, hi = base & COST_NO_FIT ? 0 : (max_side - floor_side - 1) / 64;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2, side = floor_side + 64 * mid;
        const int r = plan_at(be, o, budget, cuda, side, side, T, resident, &pl);
        if (r >= 0 && !(plan_cost(r, &pl, floor_side) & ~base)) lo = mid;
        else hi = mid - 1;
    }
    dt_clear_error();
    if (why && n) {
        char b[32], tiles[64];
        dt_place_bytes(budget, b, sizeof b);
        snprintf(tiles, sizeof tiles, "%dx%d images decoded in VAE tiles", floor_side, floor_side);
        if (extra & COST_NO_FIT) snprintf(why, n, "%dx%d does not fit %s", max_side, max_side, b);
        else
            snprintf(why, n, "%dx%d would need %s within %s", max_side, max_side,
                     extra & COST_HOST ? "the 4/8-bit weights in host memory"
                     : extra & COST_TE_RELOAD ? "the text encoder reloaded for each new prompt"
                     : extra & COST_TWO_PASSES ? "guidance in two passes" : tiles, b);
    }
    return floor_side + 64 * lo;
}

int dt_budget_apply(dt_backend *be, dt_pipeline_opts *o, int W, int H, int T, int resident, dt_place_plan *out) {
    dt_place_plan pl;
    memset(&pl, 0, sizeof pl);
    if (out) *out = pl;
    const int explicit_budget = o->max_vram > 0;
    int cuda;
    const int64_t budget = budget_of(be, o, &cuda);
    const int rc = plan_at(be, o, budget, cuda, W, H, T, resident, &pl);
    if (rc < 0) {
        if (explicit_budget) return -1;
        dt_log(2, "ditrun: no memory plan (%s)\n", dt_last_error());
        dt_clear_error();
        return 0;
    }
    char line[400], b[32];
    const char *whose = explicit_budget ? "" : cuda ? " (the card's free memory)" : "";
    dt_place_plan_describe(&pl, line, sizeof line);
    if (rc) {
        if (explicit_budget) {
            char why[600];
            snprintf(why, sizeof why, "%s", dt_last_error());
            dt_set_error("%dx%d: %s", W, H, why);
            return -1;
        }
        dt_log(1, "ditrun: warning: %dx%d may not fit the card: %s; trying the smallest plan: %s\n", W, H,
               dt_last_error(), line);
        dt_clear_error();
    }
    /* said at level 1 when asked for (a budget) or when the plan changes how the pipeline loads */
    const int tiles = pl.vae_tiling && !o->vae_tiling, releases = pl.release_text_encoder && !o->release_text_encoder;
    const int loud = explicit_budget || tiles || (releases && resident) || pl.host_weights || pl.guidance_two_passes;
    if (budget > 0)
        dt_log(loud ? 1 : 2, "ditrun: memory plan at %dx%d%s within %s%s: %s\n", W, H, resident ? " (loaded pipeline)" : "",
               dt_place_bytes(budget, b, sizeof b), whose, line);
    else
        dt_log(2, "ditrun: memory plan at %dx%d%s (%s activations; no budget; transformer and text encoder estimated): "
                  "%s\n", W, H, resident ? " (loaded pipeline)" : "", dt_dtype_name(be->act_dtype), line);
    if (budget > 0) {   /* (without a budget the plan is the cheapest of all: nothing to change) */
        if (pl.vae_tiling) o->vae_tiling = 1;
        if (pl.vae_tiling && pl.vae_tile_px > 0) o->vae_tile = pl.vae_tile_px;
        if (pl.release_text_encoder) o->release_text_encoder = 1;
        if (pl.guidance_two_passes) o->guidance_batch = 0;
        dt_cuda_opts *co = dt_backend_cuda_opts(be);   /* (for every Linear loaded from now on) */
        if (pl.host_weights && co) co->host_weights = 1;
    }
    if (out) *out = pl;
    return 0;
}
