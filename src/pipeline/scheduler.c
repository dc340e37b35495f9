/* scheduler.c — flow-matching Euler schedule (diffusers FlowMatchEulerDiscreteScheduler): config parsing,
 * sigma/timestep construction with FLUX.2's empirical mu or a given mu (Krea 2), and the Euler update. */
#include "pipeline/scheduler.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"

void dt_sched_config_default(dt_sched_config *c) {
    memset(c, 0, sizeof *c);
    c->use_dynamic_shifting = 1;
    c->time_shift_type = DT_TIME_SHIFT_EXPONENTIAL;
    c->shift = 3.0;
    c->base_shift = 0.5;
    c->max_shift = 1.15;
    c->base_image_seq_len = 256;
    c->max_image_seq_len = 4096;
    c->num_train_timesteps = 1000;
    c->shift_terminal = 0.0;
    c->invert_sigmas = 0;
}

int dt_sched_config_parse(const json *j, const char *what, dt_sched_config *c) {
    dt_sched_config_default(c);
    if (!j || j->type != JSON_OBJECT) {
        dt_set_error("%s: scheduler config is not a JSON object", what);
        return -1;
    }
    const char *cls = json_get_str(j, "_class_name");
    if (cls && strcmp(cls, "FlowMatchEulerDiscreteScheduler") != 0) {
        dt_set_error("%s: scheduler class '%s' is not supported (expected FlowMatchEulerDiscreteScheduler)", what,
                     cls);
        return -1;
    }
    c->use_dynamic_shifting = json_get_bool(j, "use_dynamic_shifting", c->use_dynamic_shifting);
    const char *ts = json_get_str(j, "time_shift_type");
    if (ts) {
        if (!strcmp(ts, "exponential")) c->time_shift_type = DT_TIME_SHIFT_EXPONENTIAL;
        else if (!strcmp(ts, "linear")) c->time_shift_type = DT_TIME_SHIFT_LINEAR;
        else {
            dt_set_error("%s: time_shift_type '%s' is not supported (expected exponential or linear)", what, ts);
            return -1;
        }
    }
    c->shift = json_get_num(j, "shift", c->shift);
    c->base_shift = json_get_num(j, "base_shift", c->base_shift);
    c->max_shift = json_get_num(j, "max_shift", c->max_shift);
    c->base_image_seq_len = json_get_int(j, "base_image_seq_len", c->base_image_seq_len);
    c->max_image_seq_len = json_get_int(j, "max_image_seq_len", c->max_image_seq_len);
    int64_t ntt = json_get_int(j, "num_train_timesteps", c->num_train_timesteps);
    if (ntt < 1 || ntt > 1000000) {
        dt_set_error("%s: num_train_timesteps %lld out of range", what, (long long)ntt);
        return -1;
    }
    c->num_train_timesteps = (int)ntt;
    c->shift_terminal = json_get_num(j, "shift_terminal", 0.0);
    if (c->shift_terminal != 0.0 && !(c->shift_terminal > 0.0 && c->shift_terminal < 1.0)) {
        dt_set_error("%s: shift_terminal %g must be in (0, 1)", what, c->shift_terminal);
        return -1;
    }
    c->invert_sigmas = json_get_bool(j, "invert_sigmas", 0);
    if (!(c->shift > 0.0) || !isfinite(c->shift)) {
        dt_set_error("%s: shift %g must be positive", what, c->shift);
        return -1;
    }
    static const char *unsupported[] = {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                                        "stochastic_sampling", "invert_sigmas"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        if (json_get_bool(j, unsupported[i], 0)) {
            dt_set_error("%s: %s = true is not supported", what, unsupported[i]);
            return -1;
        }
    }
    return 0;
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int dt_sched_config_load(const char *path, dt_sched_config *c) {
    char buf[4096];
    const char *file = NULL;
    if (is_file(path)) {
        file = path;
    } else {
        snprintf(buf, sizeof buf, "%s/scheduler_config.json", path);
        if (is_file(buf)) file = buf;
        else {
            snprintf(buf, sizeof buf, "%s/scheduler/scheduler_config.json", path);
            if (is_file(buf)) file = buf;
        }
    }
    if (!file) {
        dt_set_error("%s: no scheduler_config.json (looked in the folder and in scheduler/)", path);
        return -1;
    }
    json *j = json_parse_file(file);
    if (!j) return -1;
    int rc = dt_sched_config_parse(j, file, c);
    json_free(j);
    return rc;
}

double dt_compute_empirical_mu(int64_t n_image_tokens, int n_steps) {
    const double a1 = 8.73809524e-05, b1 = 1.89833333;
    const double a2 = 0.00016927, b2 = 0.45666666;
    const double N = (double)n_image_tokens;
    if (n_image_tokens > 4300) return a2 * N + b2;
    double m200 = a2 * N + b2;
    double m10 = a1 * N + b1;
    double a = (m200 - m10) / 190.0;
    double b = m200 - 200.0 * a;
    return a * (double)n_steps + b;
}

int64_t dt_schedule_max_image_tokens(void) {
    /* mu = a2·N + b2 above 4300 tokens; the reference rounds e^mu to float32, finite while mu <= ln(FLT_MAX) */
    const double a2 = 0.00016927, b2 = 0.45666666;
    int64_t n = (int64_t)((log((double)FLT_MAX) - b2) / a2);
    while (n > 1 && !isfinite((float)exp(dt_compute_empirical_mu(n, 1)))) n--;
    return n;
}

double dt_calculate_shift(const dt_sched_config *cfg, int64_t n_image_tokens) {
    const double m = (cfg->max_shift - cfg->base_shift) / (double)(cfg->max_image_seq_len - cfg->base_image_seq_len);
    const double b = cfg->base_shift - m * (double)cfg->base_image_seq_len;
    return (double)n_image_tokens * m + b;
}

int64_t dt_calculate_shift_max_tokens(const dt_sched_config *cfg) {
    if (!cfg->use_dynamic_shifting || cfg->time_shift_type != DT_TIME_SHIFT_EXPONENTIAL) return 0;
    const double m = (cfg->max_shift - cfg->base_shift) / (double)(cfg->max_image_seq_len - cfg->base_image_seq_len);
    const double b = cfg->base_shift - m * (double)cfg->base_image_seq_len;
    const double n = (log((double)FLT_MAX) - b) / m;
    if (!(m > 0.0) || !(n < 4e18)) return 0;
    if (n < 1.0) return 1;   /* (dt_schedule_make_mu reports such a config for any size) */
    int64_t k = (int64_t)n;
    while (k > 1 && !isfinite((float)exp(dt_calculate_shift(cfg, k)))) k--;
    return k;
}

int dt_schedule_make(const dt_sched_config *cfg, int n_steps, int64_t n_image_tokens, float *sigmas,
                     float *timesteps) {
    if (n_steps < 1 || n_steps > 100000) {
        dt_set_error("scheduler: steps must be in 1..100000 (got %d)", n_steps);
        return -1;
    }
    if (n_image_tokens < 1) {
        dt_set_error("scheduler: image token count must be positive (got %lld)", (long long)n_image_tokens);
        return -1;
    }
    if (cfg->use_dynamic_shifting && cfg->time_shift_type == DT_TIME_SHIFT_EXPONENTIAL &&
        n_image_tokens > dt_schedule_max_image_tokens()) {
        dt_set_error("scheduler: %lld image tokens is more than the schedule holds: its shift e^mu overflows float32 "
                     "above %lld image tokens (e.g. %lldx%lld latent patches)", (long long)n_image_tokens,
                     (long long)dt_schedule_max_image_tokens(), (long long)sqrt((double)dt_schedule_max_image_tokens()),
                     (long long)sqrt((double)dt_schedule_max_image_tokens()));
        return -1;
    }
    return dt_schedule_make_mu(cfg, n_steps, dt_compute_empirical_mu(n_image_tokens, n_steps), sigmas, timesteps);
}

int dt_schedule_make_mu(const dt_sched_config *cfg, int n_steps, double mu, float *sigmas, float *timesteps) {
    if (n_steps < 1 || n_steps > 100000) {
        dt_set_error("scheduler: steps must be in 1..100000 (got %d)", n_steps);
        return -1;
    }
    if (!isfinite(mu) ||
        (cfg->use_dynamic_shifting && cfg->time_shift_type == DT_TIME_SHIFT_EXPONENTIAL && !isfinite((float)exp(mu)))) {
        dt_set_error("scheduler: time shift mu %g is out of range (e^mu must be a finite float32)", mu);
        return -1;
    }
    /* numpy linspace(1, 1/n, n) in float64: start + i·step, last element exactly `stop`. */
    const double start = 1.0, stop = 1.0 / (double)n_steps;
    const double step = n_steps > 1 ? (stop - start) / (double)(n_steps - 1) : 0.0;
    const float e_mu = (float)exp(mu), mu_f = (float)mu;
    const float shift = (float)cfg->shift, shift_m1 = (float)(cfg->shift - 1.0);
    for (int i = 0; i < n_steps; i++) {
        double sd = (n_steps > 1 && i == n_steps - 1) ? stop : (double)i * step + start;
        float s = (float)sd, sig;
        if (cfg->use_dynamic_shifting) {
            float r = 1.0f / s - 1.0f;   /* (1/t − 1)^1 */
            if (cfg->time_shift_type == DT_TIME_SHIFT_EXPONENTIAL) sig = e_mu / (e_mu + r);
            else sig = mu_f / (mu_f + r);
        } else {
            sig = (shift * s) / (1.0f + shift_m1 * s);
        }
        sigmas[i] = sig;
    }
    if (cfg->shift_terminal > 0.0) {
        /* stretch so that the last sigma equals shift_terminal */
        float scale = (1.0f - sigmas[n_steps - 1]) / (float)(1.0 - cfg->shift_terminal);
        for (int i = 0; i < n_steps; i++) sigmas[i] = 1.0f - (1.0f - sigmas[i]) / scale;
    }
    const float ntt = (float)cfg->num_train_timesteps;
    for (int i = 0; i < n_steps; i++) timesteps[i] = sigmas[i] * ntt;
    sigmas[n_steps] = 0.0f;
    return 0;
}

void dt_euler_step(float *x, const float *v, size_t n, float sigma, float sigma_next) {
    const float dt = sigma_next - sigma;
    for (size_t i = 0; i < n; i++) x[i] = x[i] + dt * v[i];
}

