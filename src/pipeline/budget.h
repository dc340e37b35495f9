/* budget.h — the placement planner (pipeline/placement.h) acted on before a pipeline loads: the budget a run plans
 * within (--max-vram, dt_pipeline_opts.max_vram; without one, on a CUDA backend, what its pool may hold: the card's
 * free memory), the plan at the run's image size, and the load options it sets — the VAE tiled, the text encoder
 * released (a one-shot run always releases it; a resident pipeline, serve or --count, reloads it for every new
 * prompt when the plan says so), and as the last resort the 4/8-bit weights kept in host memory (the CUDA backend's
 * host_weights, set on be for every Linear loaded after). The CUDA pool enforces the same budget
 * (backends/backend_cuda.h, max_vram). */
#ifndef DT_BUDGET_H
#define DT_BUDGET_H

#include "backends/backend.h"
#include "pipeline/generate.h"
#include "pipeline/placement.h"

/* Plans a W x H image with T text tokens for o->model on be (resident: a loaded pipeline serving many prompts)
 * and sets o->vae_tiling / o->release_text_encoder as the plan needs; the plan goes to *out when out is given
 * (plan->peak 0: nothing planned). Logged: at level 1 under an explicit budget or when the plan changes a load
 * option, else at level 2 (-v). An explicit budget (o->max_vram > 0) that no placement fits is refused: -1 with
 * "WxH: memory budget X is below the smallest workable Y ..." — before anything loads. Under the implicit budget
 * (the card's free memory) the smallest plan is taken with a warning (the pool reports a real shortage); sizes
 * that cannot be read are an error only with an explicit budget. 0 or -1. */
int dt_budget_apply(dt_backend *be, dt_pipeline_opts *o, int W, int H, int T, int resident, dt_place_plan *out);

/* The largest square image side, max_side or a floor_side + 64 k below it, whose plan for o->model on be within the
 * run's budget needs nothing that floor_side's plan does not (of: a budget it does not fit, the weights in host
 * memory, the text encoder reloaded per new prompt, guidance in two passes, VAE tiles smaller than floor_side, which
 * would tile every floor_side image); floor_side when even that does not fit. Nothing is acted on. What serve takes
 * as its largest image when --max-pixels is not given, so that a small card serves its default size at full speed.
 * max_side without a budget or when the sizes cannot be read; when lower, why (n bytes) gets "2048x2048 would need
 * ... within 7.00 GiB" or "2048x2048 does not fit 7.00 GiB". */
int dt_budget_largest_side(dt_backend *be, const dt_pipeline_opts *o, int max_side, int floor_side, int T,
                           int resident, char *why, size_t n);

#endif
