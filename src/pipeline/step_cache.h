/* step_cache.h — the sampler's step caching (`--cache`, serve's "cache"), one mechanism for every family
 * (NOTES.md "Step caching"):
 *   first-block=T     diffusers' FirstBlockCache: per pass, after the first block, the rest is skipped and its
 *                     cached residual added when the first block's residual changed by at most T (relative mean
 *                     absolute difference) since the last computed pass (models/block_cache.h, in the forward);
 *   taylorseer=N[:O]  diffusers' TaylorSeerCache (lite mode: the transformer output): a full pass in the first
 *                     DT_TAYLORSEER_WARMUP steps and every N-th after, the others' output extrapolated from the
 *                     computed ones by divided differences up to order O (default 1).
 * Each guidance branch keeps its own state; the first and the last step always compute. */
#ifndef DT_STEP_CACHE_H
#define DT_STEP_CACHE_H

#include <stddef.h>

#include "models/block_cache.h"

#define DT_TAYLORSEER_WARMUP 3      /* diffusers' disable_cache_before_step default */
#define DT_TAYLORSEER_MAX_ORDER 4
#define DT_CACHE_SPEC_MAX 64

typedef enum { DT_CACHE_OFF = 0, DT_CACHE_FIRST_BLOCK, DT_CACHE_TAYLORSEER } dt_cache_kind;

/* A request's caching choice (all zero: off). */
typedef struct {
    dt_cache_kind kind;
    float threshold;    /* first-block: >= 0 */
    int interval;       /* taylorseer: N >= 1 (1 = every step computed) */
    int order;          /* taylorseer: 1 .. DT_TAYLORSEER_MAX_ORDER */
} dt_cache_opts;

/* Parse "off" / "none" / "" (off), "first-block=T", "taylorseer=N" or "taylorseer=N:ORDER". 0, or -1 with an
 * error naming the value and what is accepted (o is then off). */
int dt_cache_parse(const char *spec, dt_cache_opts *o);
/* The canonical spelling ("off", "first-block=0.08", "taylorseer=3:1") into buf. */
void dt_cache_format(const dt_cache_opts *o, char *buf, size_t len);

/* A guidance branch's TaylorSeer factors. */
typedef struct {
    int last;                         /* the loop step of the last computed pass (-1: none) */
    int nf;                           /* factors held (0 .. order + 1) */
    float *f[DT_TAYLORSEER_MAX_ORDER + 1];   /* [n] each: factor k ≈ the k-th derivative in steps */
} dt_taylor_branch;

/* One request's cache state: per guidance branch the First Block Cache state (handed to the forward) and the
 * TaylorSeer factors (host, n values each). */
typedef struct {
    dt_cache_opts o;
    int steps;                        /* steps the loop runs */
    size_t n;                         /* values of one model output */
    dt_fbc_branch fbc[2];
    dt_taylor_branch ts[2];
    int computed, total;              /* transformer passes computed / run so far */
    int paired;                       /* of them, run two in one forward (the sampler's guidance batch) */
    float *decisions;                 /* [steps, 2] per loop step and branch: 1 computed, 0 cached (observed as
                                       * "cache_computed" [steps, passes]) */
} dt_step_cache;

void dt_step_cache_init(dt_step_cache *c, const dt_cache_opts *o, int steps, size_t n);
void dt_step_cache_free(dt_step_cache *c);
/* Whether pass `branch` of loop step k (0-based) runs the transformer in full for TaylorSeer (always 1 otherwise). */
int dt_taylorseer_computes(const dt_step_cache *c, int k);
/* After a computed pass: its output v [n] updates the branch's factors (TaylorSeer). */
void dt_taylorseer_update(dt_step_cache *c, int branch, int k, const float *v);
/* A skipped pass: v [n] = the extrapolated output of the branch at loop step k. */
void dt_taylorseer_predict(const dt_step_cache *c, int branch, int k, float *v);
/* The First Block Cache state to hand the forward of pass `branch` at loop step k (NULL when that cache is off). */
dt_fbc_branch *dt_step_cache_fbc(dt_step_cache *c, int branch, int k);

#endif
