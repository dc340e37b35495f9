/* scheduler.h — FlowMatchEulerDiscreteScheduler as used by the FLUX.2-klein pipeline (diffusers
 * schedulers/scheduling_flow_match_euler_discrete.py): the sigma/timestep schedule (dynamic "empirical mu"
 * shifting or a fixed shift) and the Euler step.
 *
 * Numerics follow diffusers: input sigmas linspace(1, 1/n, n) in float64 rounded to float32, the
 * shift evaluated in float32 (e^mu rounded to float32 first), timesteps = 1000·sigma in float32,
 * and a final sigma of 0 appended.
 */
#ifndef DT_SCHEDULER_H
#define DT_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "io/json.h"

typedef enum { DT_TIME_SHIFT_EXPONENTIAL = 0, DT_TIME_SHIFT_LINEAR } dt_time_shift_type;

typedef struct {
    int use_dynamic_shifting;        /* 1: sigma shifted with mu (FLUX.2); 0: fixed `shift` */
    dt_time_shift_type time_shift_type;
    double shift;                    /* fixed shift (non-dynamic form) */
    double base_shift, max_shift;    /* kept for reference; FLUX.2 derives mu empirically */
    int64_t base_image_seq_len, max_image_seq_len;
    int num_train_timesteps;         /* timesteps = sigma * num_train_timesteps */
    double shift_terminal;           /* 0 = none; else stretch so the last sigma = shift_terminal */
    int invert_sigmas;               /* unsupported for generation; parsed so it can be rejected */
} dt_sched_config;

/* Defaults of the FLUX.2 scheduler config (dynamic exponential shifting, shift 3). */
void dt_sched_config_default(dt_sched_config *c);
/* Parse a scheduler_config.json object; absent keys keep defaults. `what` names the source in errors.
 * Unsupported options (karras/exponential/beta sigmas, stochastic sampling, invert_sigmas, unknown
 * time_shift_type) are errors. 0 ok, -1 error. */
int dt_sched_config_parse(const json *j, const char *what, dt_sched_config *c);
/* Load from a file, a scheduler/ folder or a pipeline root (ROOT/scheduler/scheduler_config.json).
 * A missing file is an error. 0 ok, -1 error. */
int dt_sched_config_load(const char *path, dt_sched_config *c);

/* FLUX.2 `compute_empirical_mu` (image tokens N, steps n), in float64. */
double dt_compute_empirical_mu(int64_t n_image_tokens, int n_steps);

/* The most image tokens the dynamic exponential shift holds: above it e^mu (rounded to float32, as the reference
 * does) overflows and every sigma would be NaN (521,451 tokens, about 722x722 latent patches). */
int64_t dt_schedule_max_image_tokens(void);

/* The schedule for n_steps steps and n_image_tokens image tokens (latent grid h·w after packing):
 *   sigmas    [n_steps + 1]  shifted sigmas, sigmas[n_steps] = 0
 *   timesteps [n_steps]      1000·sigma (num_train_timesteps·sigma)
 * 0 ok, -1 error (n_steps < 1, n_image_tokens < 1, or more than dt_schedule_max_image_tokens() with the dynamic
 * exponential shift, the error saying the limit). */
int dt_schedule_make(const dt_sched_config *cfg, int n_steps, int64_t n_image_tokens, float *sigmas,
                     float *timesteps);

/* The same for a given time shift mu (the dynamic-shifting forms; a non-dynamic config ignores mu). */
int dt_schedule_make_mu(const dt_sched_config *cfg, int n_steps, double mu, float *sigmas, float *timesteps);

/* diffusers `calculate_shift` (FLUX.1 / Krea 2), in float64: mu linear in the image token count N through
 * (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift) of cfg. */
double dt_calculate_shift(const dt_sched_config *cfg, int64_t n_image_tokens);

/* The most image tokens a calculate_shift schedule of cfg holds with the dynamic exponential shift (e^mu finite in
 * float32); 0 when nothing bounds it (a fixed or linear shift, or a line that does not grow with N). */
int64_t dt_calculate_shift_max_tokens(const dt_sched_config *cfg);

/* Euler step in float32: x[n] += (sigma_next − sigma) · v[n]. */
void dt_euler_step(float *x, const float *v, size_t n, float sigma, float sigma_next);

#endif
