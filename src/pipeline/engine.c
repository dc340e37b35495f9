/* engine.c — the resident pipeline (engine.h): picks the family from model_index.json (the registry, family.h),
 * loads it once, validates and defaults each request, and hands it to the family; plus the one-shot dt_generate. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pipeline/family.h"
#include "pipeline/budget.h"

void dt_pipeline_opts_default(dt_pipeline_opts *o) {
    memset(o, 0, sizeof *o);
    o->guidance_batch = 1;   /* the guided step in one forward where the family can (PERF.md: measured faster) */
}

void dt_gen_params_default(dt_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->negative_prompt = "";
    p->guidance = -1;
}

dt_pipeline *dt_pipeline_load(dt_backend *be, const dt_pipeline_opts *o) {
    if (!o->model) { dt_set_error("generate: no model folder given"); return NULL; }
    struct stat st;
    if (stat(o->model, &st) != 0) { dt_set_error("%s: no such model folder", o->model); return NULL; }
    if (!S_ISDIR(st.st_mode)) { dt_set_error("%s: not a folder (a pipeline root holds model_index.json)", o->model); return NULL; }
    char *idx_path = dt_path_join(o->model, "model_index.json");
    if (!dt_path_exists(idx_path)) {
        dt_set_error("%s: missing (a pipeline root has model_index.json, tokenizer/, text_encoder/, transformer/, vae/, "
                     "scheduler/)", idx_path);
        free(idx_path);
        return NULL;
    }
    json *idx = json_parse_file(idx_path);
    free(idx_path);
    if (!idx) return NULL;
    const char *cls = json_get_str(idx, "_class_name");
    char what[4200];
    snprintf(what, sizeof what, "%s/model_index.json", o->model);
    const dt_family *fam = dt_family_for_pipeline(cls, what);
    if (!fam) {
        json_free(idx);
        return NULL;
    }
    if (o->sequence_parallel > 1 && !fam->sequence_parallel) {
        dt_set_error("%s: --sequence-parallel is not implemented for %s pipelines", o->model, fam->name);
        json_free(idx);
        return NULL;
    }
    dt_pipeline *p = dt_calloc(1, sizeof *p);
    p->be = be;
    p->opts = *o;
    p->root = dt_strdup(o->model);
    p->opts.model = p->root;
    if (o->n_loras > 0) {   /* the DiT may load later (release_text_encoder): keep our own copy of the adapter list */
        dt_lora_spec *l = dt_malloc(sizeof *l * (size_t)o->n_loras);
        memcpy(l, o->loras, sizeof *l * (size_t)o->n_loras);
        p->opts.loras = l;
    } else {
        p->opts.loras = NULL;
        p->opts.n_loras = 0;
    }
    p->class_name = dt_strdup(cls ? cls : "");
    p->family = fam;
    p->info.family = fam->name;
    p->info.class_name = p->class_name;
    if (fam->load(p, idx)) {
        json_free(idx);
        free((void *)p->opts.loras);
        free(p->root);
        free(p->class_name);
        free(p);
        return NULL;
    }
    json_free(idx);
    return p;
}

void dt_pipeline_free(dt_pipeline *p) {
    if (!p) return;
    p->family->free(p);
    free((void *)p->opts.loras);
    free(p->root);
    free(p->class_name);
    free(p);
}

const dt_pipeline_info *dt_pipeline_get_info(const dt_pipeline *p) { return &p->info; }
dt_backend *dt_pipeline_backend(const dt_pipeline *p) { return p->be; }

int dt_pipeline_generate(dt_pipeline *p, const dt_gen_params *g0, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                         dt_gen_observer obs, void *ud) {
    dt_gen_params g = *g0;
    int W0 = g.width, H0 = g.height;
    if (dt_gen_params_resolve(&p->info, &g)) return -1;
    if ((W0 && W0 != g.width) || (H0 && H0 != g.height))
        dt_log(1, "ditrun: %s: size %dx%d rounded %s to %dx%d (multiples of %d)\n", p->info.size_round_up ? "note" : "warning",
               W0, H0, p->info.size_round_up ? "up" : "down", g.width, g.height, p->info.size_multiple);
    return dt_pipeline_generate_resolved(p, &g, rgb, w, h, tm, obs, ud);
}

int dt_pipeline_generate_resolved(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h,
                                  dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
    dt_gen_timings tl;
    if (!tm) tm = &tl;
    memset(tm, 0, sizeof *tm);
    *rgb = NULL;
    *w = *h = 0;
    if (dt_gen_cancelled(g)) return DT_GEN_CANCELLED;
    return p->family->generate(p, g, rgb, w, h, tm, obs, ud);
}

int dt_generate(dt_backend *be, const dt_pipeline_opts *lo, const dt_gen_params *p, uint8_t **rgb, int *w, int *h,
                dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
    dt_gen_timings tl;
    if (!tm) tm = &tl;
    if (!p->prompt) { dt_set_error("generate: a prompt is required"); return -1; }
    double t0 = dt_now();
    dt_pipeline_opts o = *lo;
    o.release_text_encoder = 1;   /* one image: the text encoder never shares memory with the DiT */
    /* the memory plan at the request's size (before it is rounded: a multiple of 16 at most smaller): the VAE tiles
     * when the budget needs it; a budget nothing fits is refused here, before anything loads */
    if (dt_budget_apply(be, &o, p->width ? p->width : 1024, p->height ? p->height : 1024,
                        p->max_seq_len ? p->max_seq_len : 512, 0, NULL))
        return -1;
    dt_pipeline *pl = dt_pipeline_load(be, &o);
    if (!pl) return -1;
    double t_load = dt_now() - t0;
    int rc = dt_pipeline_generate(pl, p, rgb, w, h, tm, obs, ud);
    dt_pipeline_free(pl);
    tm->t_load += t_load;
    tm->t_total = dt_now() - t0;
    if (rc == 0)
        dt_log(1, "ditrun: %dx%d, %d steps: load %.2f s, encode %.2f s, denoise %.2f s (%.3f s/step, %d of %d "
                  "transformer passes computed%s), decode %.2f s, total %.2f s\n", tm->width, tm->height, tm->steps,
               tm->t_load, tm->t_encode, tm->t_denoise, tm->steps ? tm->t_denoise / tm->steps : 0.0,
               tm->passes_computed, tm->passes, tm->passes_paired ? ", both guidance passes in one forward" : "",
               tm->t_decode, tm->t_total);
    return rc;
}
