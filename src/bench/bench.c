/* bench.c — orchestration of `ditrun bench`, the same for every model family: pick the family (preset name or
 * the checkpoint's config.json), create the backend, let the family set up (geometry, checkpoint, workload,
 * inputs) and time its whole forward, then run the ledger, utilization and A/B-arm parts through the family's
 * interface (bench_internal.h). Also the helpers the families' set-up shares: the synthetic checkpoint cache
 * and the workload defaults. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_internal.h"
#include "core/outfile.h"
#include "io/json.h"

void bench_opts_default(bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->preset = "klein-4b";
    o->hidden = o->heads = o->kv_heads = o->n_double = o->n_single = -1;
    o->format = BENCH_FMT_Q4;
    o->group = -1;
    o->image_size = o->text_tokens = -1;
    o->reps = o->warmup = -1;
    o->backend = "auto";
    o->be.rope_fp32 = 1;
    o->sections = BENCH_ALL;
    o->seed = 1;
}


const char *bench_fmt_name(int f) {
    switch (f) {
    case BENCH_FMT_F32: return "f32";
    case BENCH_FMT_BF16: return "bf16";
    case BENCH_FMT_Q4: return "q4";
    case BENCH_FMT_Q8: return "q8";
    }
    return "?";
}

/* ------------------------------------------------------------------ synthetic checkpoint cache */

static int dir_complete(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.bench-complete", dir);
    return access(p, F_OK) == 0;
}

static int mark_complete(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.bench-complete", dir);
    return dt_write_file(p, "ok\n", 3);
}

void bench_remove_checkpoint(const char *dir) {
    /* a transformer's folder, or the Krea 2 text encoder and VAE in their subfolders */
    const char *subs[] = {"/text_encoder", "/vae", ""};
    const char *names[] = {".bench-complete", "config.json", "model.safetensors", "diffusion_pytorch_model.safetensors"};
    char p[4200];
    for (size_t s = 0; s < sizeof subs / sizeof subs[0]; s++) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            snprintf(p, sizeof p, "%s%s/%s", dir, subs[s], names[i]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s%s", dir, subs[s]);
        rmdir(p);
    }
}

char *bench_checkpoint(bench_ctx *x, const char *key, int (*write)(bench_ctx *x, const char *dir)) {
    const char *base = x->o->cache_dir;
    char root[1024];
    if (!base) {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, sizeof root, "%s/ditrun-bench-cache", tmp && *tmp ? tmp : "/tmp");
        base = root;
    }
    if (mkdir(base, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", base, strerror(errno)); return NULL; }
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/%s", base, key);
    if (!x->o->fresh && dir_complete(dir)) {
        bench_progress("using cached synthetic checkpoint %s", dir);
        return dt_strdup(dir);
    }
    /* write into a private folder, then rename it into place: concurrent runs never see half a checkpoint */
    char tmpd[1500];
    snprintf(tmpd, sizeof tmpd, "%s.tmp-%d", dir, (int)getpid());
    bench_remove_checkpoint(tmpd);
    double t0 = dt_now();
    bench_progress("writing synthetic %s checkpoint %s ...", bench_fmt_name(x->o->format), dir);
    int track = dt_temp_track(tmpd, 1);   /* an interrupt removes the half-written folder */
    if (write(x, tmpd) || mark_complete(tmpd)) { bench_remove_checkpoint(tmpd); dt_temp_forget(track); return NULL; }
    if (x->o->fresh || !dir_complete(dir)) bench_remove_checkpoint(dir);   /* replace a stale or incomplete folder */
    int moved = rename(tmpd, dir);
    dt_temp_forget(track);
    if (moved) {
        bench_remove_checkpoint(tmpd);
        if (!dir_complete(dir)) { dt_set_error("%s: cannot move the synthetic checkpoint into place (%s)", dir, strerror(errno)); return NULL; }
        bench_progress("another run wrote %s first; using it", dir);
    }
    x->r->synth_s = dt_now() - t0;
    bench_progress("wrote it in %.1f s", x->r->synth_s);
    return dt_strdup(dir);
}

/* ------------------------------------------------------------------ workload */

int bench_workload(bench_ctx *x, const bench_workload_base *cpu_dflt, int arm_tokens_cpu) {
    const bench_opts *o = x->o;
    bench_report *r = x->r;
    static const bench_workload_base cuda_dflt = {1024, 512, 20, 3};
    const bench_workload_base *d = x->is_cpu ? cpu_dflt : &cuda_dflt;
    const char *flag[4] = {"--image-size", "--text-tokens", "--reps", "--warmup"};
    const int given[4] = {o->image_size, o->text_tokens, o->reps, o->warmup};
    const int unset[4] = {given[0] <= 0, given[1] < 0, given[2] <= 0, given[3] < 0};
    const int dv[4] = {d->img_size, d->txt, d->reps, d->warmup};
    int v[4];
    char scaled[300] = "";   /* CPU: the flags the scaled-down defaults amount to */
    for (int i = 0; i < 4; i++) {
        v[i] = unset[i] ? dv[i] : given[i];
        if (unset[i] && x->is_cpu) {
            size_t len = strlen(scaled);
            snprintf(scaled + len, sizeof scaled - len, " %s %d", flag[i], dv[i]);
        }
    }
    if (v[0] % 16 || v[0] < 16) {
        dt_set_error("bench: --image-size %d must be a positive multiple of 16", v[0]);
        return -1;
    }
    const char *arm_dflt = "";
    if (arm_tokens_cpu > 0) {   /* the quantized-path arm's token counts */
        arm_dflt = " --arm-tokens 256,1024,4096,16384";
        if (o->n_arm_tokens) {
            memcpy(x->arm_tokens, o->arm_tokens, sizeof(int) * o->n_arm_tokens);
            x->n_arm_tokens = o->n_arm_tokens;
        } else if (x->is_cpu) {
            x->arm_tokens[0] = arm_tokens_cpu;
            x->n_arm_tokens = 1;
            size_t len = strlen(scaled);
            snprintf(scaled + len, sizeof scaled - len, " --arm-tokens %d", arm_tokens_cpu);
        } else {
            int dd[4] = {256, 1024, 4096, 16384};
            memcpy(x->arm_tokens, dd, sizeof dd);
            x->n_arm_tokens = 4;
        }
    }
    if (scaled[0]) {
        bench_note(r, "cpu backend: workload scaled down for a small CPU (CUDA defaults are --image-size 1024 "
                      "--text-tokens 512 --reps 20 --warmup 3%s); used:%s", arm_dflt, scaled);
        bench_progress("cpu: scaled down:%s (pass the flags to override)", scaled);
    }
    r->image_size = v[0];
    x->h = x->w = v[0] / 16;
    x->n = r->n_img = x->h * x->w;
    x->t = r->n_txt = v[1];
    x->reps = r->reps = v[2];
    x->warmup = r->warmup = v[3];
    double llc_mb = 0;
    r->l2_mb = bench_cache_mb(o, x->is_cpu, &llc_mb);
    if (llc_mb > 0)
        bench_note(r, "cpu: the last-level cache reports %.0f MB; rotations target 2 x 32 MB (pass --l2-mb to change)", llc_mb);
    x->rot_bytes = 2.0 * r->l2_mb * 1e6;
    r->peak_tflops = bench_peak_tflops(o, x->is_cpu, r->peak_src, sizeof r->peak_src);
    return 0;
}

/* ------------------------------------------------------------------ run */

static const bench_family *const bench_families[] = {&bench_flux2_family, &bench_krea2_family, &bench_zimage_family};

const bench_family *bench_family_of(const dt_family *f) {
    for (size_t i = 0; i < sizeof bench_families / sizeof bench_families[0]; i++)
        if (bench_families[i]->family == f) return bench_families[i];
    if (f) dt_set_error("bench: no bench for %s models", f->title);
    return NULL;
}

/* The family (registry, pipeline/family.h): of the preset, or of the checkpoint's config (a config no family claims:
 * the family that infers its config, whose set-up says what is wrong). --model: x->dir and x->cfg are set (the
 * family's set-up parses the config). */
static const bench_family *pick_family(bench_ctx *x) {
    const bench_opts *o = x->o;
    if (!o->model_dir) {
        /* (an unknown preset: FLUX.2's set-up names the presets, as before the registry) */
        const dt_family *f = o->preset ? dt_family_for_preset(o->preset) : NULL;
        return f ? bench_family_of(f) : &bench_flux2_family;
    }
    x->cfg = bench_open_config(o->model_dir, &x->dir, x->cfg_path, sizeof x->cfg_path);
    if (!x->cfg) return NULL;
    snprintf(x->r->source, sizeof x->r->source, "%s", x->dir);
    snprintf(x->r->preset, sizeof x->r->preset, "checkpoint");
    const dt_family *f = dt_family_for_config(x->cfg);
    return f ? bench_family_of(f) : &bench_flux2_family;
}

int bench_run(const bench_opts *o, bench_report *r) {
    memset(r, 0, sizeof *r);
    double t_start = dt_now();
    bench_ctx x;
    memset(&x, 0, sizeof x);
    x.o = o;
    x.r = r;
    x.fam = pick_family(&x);
    if (!x.fam) goto fail;
    r->family = x.fam;
    x.be = dt_backend_create(o->backend, &o->be);
    if (!x.be) goto fail;
    x.is_cpu = !strcmp(x.be->name, "cpu");
    snprintf(r->backend, sizeof r->backend, "%s", x.be->name);

    if (x.fam->setup(&x) || x.fam->whole_forward(&x)) goto fail;
    if ((o->sections & BENCH_LEDGER) && bench_ledger(&x)) goto fail;
    if ((o->sections & BENCH_UTIL) && bench_perf(&x)) goto fail;
    if ((o->sections & BENCH_ARMS) && bench_arms(&x)) goto fail;

    x.fam->release(&x);
    if (x.be->mem_stats) {
        size_t cur = 0, peak = 0;
        x.be->mem_stats(x.be, &cur, &peak);
        r->mem_peak_gb = peak / 1e9;
    }
    x.be->destroy(x.be);
    json_free(x.cfg);
    free(x.dir);
    r->total_s = dt_now() - t_start;
    bench_progress("done in %.1f s", r->total_s);
    return 0;
fail:
    if (x.fam && x.be) x.fam->release(&x);
    if (x.be) x.be->destroy(x.be);
    json_free(x.cfg);
    free(x.dir);
    return -1;
}
