/* budget.c — the memory plan of a run acted on (budget.h): the budget, the pipeline's sizes at the image size, the
 * plan, the load options it sets, the log line and the refusal before loading. */
#include "pipeline/budget.h"

#include <stdio.h>
#include <string.h>

#include "backends/backend_cuda.h"

int dt_budget_apply(dt_backend *be, dt_pipeline_opts *o, int W, int H, int T, int resident, dt_place_plan *out) {
    dt_place_plan pl;
    memset(&pl, 0, sizeof pl);
    if (out) *out = pl;
    const int explicit_budget = o->max_vram > 0;
    int64_t budget = o->max_vram;
    /* no budget given: a CUDA pool's (the card's free memory plus what it holds already); the CPU has none */
    const int cuda = dt_backend_cuda_mem_budget(be, explicit_budget ? NULL : &budget, NULL) == 0;
    if (!cuda && !explicit_budget) budget = 0;
    dt_place_sizes s;
    if (dt_place_sizes_for(o->model, W, H, T, (int)dt_dtype_size(be->act_dtype), o->vae_tile, resident,
                           o->guidance_batch && o->sequence_parallel <= 1, &s)) {
        if (explicit_budget) return -1;
        dt_log(2, "ditrun: no memory plan (%s)\n", dt_last_error());
        dt_clear_error();
        return 0;
    }
    /* host weights: only a CUDA backend on a path that reads the packed weights each time */
    s.host_ok = cuda && be->opts.qpath != DT_QPATH_CACHED && be->opts.qpath != DT_QPATH_MIXED;
    char line[400], b[32];
    const char *whose = explicit_budget ? "" : cuda ? " (the card's free memory)" : "";
    int rc = dt_place_plan_make(budget, &s, &pl);
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
