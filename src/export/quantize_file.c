/* quantize_file.c — streaming MLX affine quantization of a whole checkpoint into one .safetensors file.
 * Tensor by tensor from the mapped input: rows are converted to f32 a block at a time, quantized with
 * mlx_quant_row (split over worker threads), dequantized again to measure the error, and the packed
 * words streamed out; scales and biases of the tensor follow. Input pages are released after each
 * tensor (dt_weights_release) so resident memory does not grow with the checkpoint. */
#include "quantize_file.h"

#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/outfile.h"
#include "io/config_file.h"
#include "io/weights.h"

#define BLOCK_ELEMS (1 << 20)   /* f32 elements per row block (4 MB) */

void dt_quant_opts_default(dt_quant_opts *o) {
    memset(o, 0, sizeof *o);
    o->bits = 4;
    o->group = 64;
    o->rule = MLX_RULE_MLX;
    o->report = 1;
    o->write_config = 1;
}

int dt_quant_keep_match(const char *pattern, const char *name) {
    if (!pattern || !*pattern) return 0;
    if (strpbrk(pattern, "*?[")) return fnmatch(pattern, name, 0) == 0;
    return strstr(name, pattern) != NULL;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* ------------------------------------------------------------------ row-block workers */

typedef struct {
    const dt_quant_opts *o;
    const st_tensor *t;
    int64_t in, r0, r1;          /* rows [r0, r1) of the tensor, relative to block start `b0` */
    int64_t b0;
    float *f32, *deq;            /* per-worker scratch [in] */
    uint32_t *packed;            /* block output [rows, in*bits/32] */
    uint16_t *scales, *biases;   /* whole tensor [out, in/group] */
    double err2, ref2;
} qjob;

static void *qwork(void *arg) {
    qjob *j = arg;
    const int64_t in = j->in, words = in * j->o->bits / 32, ng = in / j->o->group;
    const size_t es = dt_dtype_size(j->t->dtype);
    double e2 = 0, r2 = 0;
    for (int64_t r = j->r0; r < j->r1; r++) {
        int64_t row = j->b0 + r;
        dt_convert_to_f32(j->f32, (const char *)j->t->data + (size_t)(row * in) * es, j->t->dtype, (size_t)in);
        uint32_t *pk = j->packed + r * words;
        uint16_t *sc = j->scales + row * ng, *bi = j->biases + row * ng;
        mlx_quant_row(j->f32, in, j->o->bits, j->o->group, j->o->rule, pk, sc, bi);
        mlx_dequant_row(j->deq, pk, sc, bi, DT_BF16, in, j->o->bits, j->o->group);
        for (int64_t k = 0; k < in; k++) {
            double d = (double)j->deq[k] - j->f32[k];
            e2 += d * d;
            r2 += (double)j->f32[k] * j->f32[k];
        }
    }
    j->err2 = e2;
    j->ref2 = r2;
    return NULL;
}

typedef struct { char *name; int64_t out, in; double rel; } tensor_report;

static int cmp_report(const void *a, const void *b) {
    double x = ((const tensor_report *)a)->rel, y = ((const tensor_report *)b)->rel;
    return (x < y) - (x > y);
}

/* Quantize t and stream NAME.weight, NAME.scales, NAME.biases (declared in that order). */
static int quantize_tensor(st_stream *s, const st_tensor *t, const dt_quant_opts *o, int nthreads, double *err2,
                           double *ref2) {
    const int64_t out = t->shape[0], in = t->shape[1], words = in * o->bits / 32, ng = in / o->group;
    int64_t brows = BLOCK_ELEMS / in;
    if (brows < nthreads) brows = nthreads;
    if (brows > out) brows = out;
    uint32_t *packed = dt_malloc(sizeof(uint32_t) * (size_t)(brows * words));
    uint16_t *scales = dt_malloc(sizeof(uint16_t) * (size_t)(out * ng)), *biases = dt_malloc(sizeof(uint16_t) * (size_t)(out * ng));
    qjob jobs[16];
    pthread_t th[16];
    int started[16] = {0};
    for (int k = 0; k < nthreads; k++) {
        jobs[k].f32 = dt_malloc(sizeof(float) * (size_t)in);
        jobs[k].deq = dt_malloc(sizeof(float) * (size_t)in);
    }
    double e2 = 0, r2 = 0;
    int rc = 0;
    for (int64_t b0 = 0; b0 < out && rc == 0; b0 += brows) {
        int64_t nb = out - b0 < brows ? out - b0 : brows;
        int nt = nb < nthreads ? (int)nb : nthreads;
        for (int k = 0; k < nt; k++) {
            qjob *j = &jobs[k];
            j->o = o; j->t = t; j->in = in; j->b0 = b0;
            j->r0 = nb * k / nt; j->r1 = nb * (k + 1) / nt;
            j->packed = packed; j->scales = scales; j->biases = biases;
            started[k] = k > 0 && pthread_create(&th[k], NULL, qwork, j) == 0;
            if (k > 0 && !started[k]) qwork(j);   /* no thread: do its rows here */
        }
        qwork(&jobs[0]);
        for (int k = 1; k < nt; k++) if (started[k]) pthread_join(th[k], NULL);
        for (int k = 0; k < nt; k++) { e2 += jobs[k].err2; r2 += jobs[k].ref2; }
        rc = st_stream_write(s, packed, sizeof(uint32_t) * (size_t)(nb * words));
    }
    if (rc == 0) rc = st_stream_write(s, scales, sizeof(uint16_t) * (size_t)(out * ng));
    if (rc == 0) rc = st_stream_write(s, biases, sizeof(uint16_t) * (size_t)(out * ng));
    for (int k = 0; k < nthreads; k++) { free(jobs[k].f32); free(jobs[k].deq); }
    free(packed); free(scales); free(biases);
    *err2 = e2;
    *ref2 = r2;
    return rc;
}

/* ------------------------------------------------------------------ config.json beside the output */

static char *dir_of(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) return dt_strdup(".");
    if (sl == path) return dt_strdup("/");
    char *d = dt_malloc((size_t)(sl - path) + 1);
    memcpy(d, path, (size_t)(sl - path));
    d[sl - path] = 0;
    return d;
}

/* DIR(output)/config.json (cp), or NULL when it would be the input's own config.json (never overwritten). */
static char *config_beside(const char *in_dir, const char *output, FILE *log) {
    char *od = dir_of(output), ip[PATH_MAX + 16], r1[PATH_MAX], r2[PATH_MAX];
    size_t n = strlen(od) + 16;
    char *cp = dt_malloc(n);
    snprintf(cp, n, "%s/config.json", od);
    snprintf(ip, sizeof ip, "%s/config.json", in_dir);
    free(od);
    if (realpath(cp, r1) && realpath(ip, r2) && !strcmp(r1, r2)) {
        fprintf(log, "ditrun: note: not writing %s: it is the input's own config.json\n", cp);
        free(cp);
        return NULL;
    }
    return cp;
}

/* Writes cp = the input config without its quantization entries + ours (through a temporary). 0 or -1. */
static int write_config(const json *cfg, const char *cp, const dt_quant_opts *o) {
    dt_outfile *of = dt_outfile_open(cp);
    if (!of) return -1;
    FILE *f = dt_outfile_fp(of);
    fputs("{", f);
    int n = 0;
    for (size_t i = 0; i < cfg->len; i++) {
        if (!strcmp(cfg->keys[i], "quantization") || !strcmp(cfg->keys[i], "quantization_config")) continue;
        fprintf(f, "%s\n  ", n++ ? "," : "");
        json_write_string(f, cfg->keys[i], strlen(cfg->keys[i]));
        fputs(": ", f);
        json_write(f, cfg->items[i], 1);
    }
    fprintf(f, "%s\n  \"quantization\": {\"group_size\": %d, \"bits\": %d, \"mode\": \"affine\"}\n}\n", n ? "," : "",
            o->group, o->bits);
    return dt_outfile_commit(of);
}

/* ------------------------------------------------------------------ the whole checkpoint */

static int quantizable(const dt_weights *w, const st_tensor *t, const dt_quant_opts *o, int *kept) {
    *kept = 0;
    if (!ends_with(t->name, ".weight") || t->ndim != 2) return 0;
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16) return 0;
    *kept = 1;
    if (t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[1] % o->group || (t->shape[1] * o->bits) % 32) return 0;
    for (int k = 0; k < o->n_keep; k++)
        if (dt_quant_keep_match(o->keep[k], t->name)) return 0;
    /* the names it would produce must be free */
    char nm[1024];
    size_t bl = strlen(t->name) - 7;
    snprintf(nm, sizeof nm, "%.*s.scales", (int)bl, t->name);
    if (dt_weights_find(w, nm)) return 0;
    snprintf(nm, sizeof nm, "%.*s.biases", (int)bl, t->name);
    if (dt_weights_find(w, nm)) return 0;
    *kept = 0;
    return 1;
}

int dt_quantize_checkpoint(const char *input, const char *output, const dt_quant_opts *o, dt_quant_stats *st) {
    memset(st, 0, sizeof *st);
    FILE *log = o->log ? o->log : stderr;
    if (o->bits != 4 && o->bits != 8) { dt_set_error("quantize: bits must be 4 or 8 (got %d)", o->bits); return -1; }
    if (o->group != 32 && o->group != 64 && o->group != 128) {
        dt_set_error("quantize: group size must be 32, 64 or 128 (got %d)", o->group);
        return -1;
    }
    double t0 = dt_now();
    char *dir = dt_weights_component_dir(input, "transformer");
    if (!dir) return -1;
    dt_weights *w = dt_weights_open(dir);
    if (!w) { free(dir); return -1; }
    int nthreads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 16) nthreads = 16;

    size_t n = dt_weights_count(w);
    char *is_q = dt_calloc(n ? n : 1, 1);
    tensor_report *rep = dt_calloc(n ? n : 1, sizeof *rep);
    int nrep = 0, rc = -1;
    st_stream *s = NULL;
    char *cp = NULL, *made_dir = NULL;
    /* before any work: the outputs are not inputs, a config.json already beside the output is this model's */
    const char *inputs[2] = {input, dir};
    const json *cfg = dt_weights_config(w);
    if (dt_output_not_input(output, inputs, 2)) goto done;
    char *od = dir_of(output);
    if (mkdir(od, 0755) == 0) { dt_log(2, "%s: created\n", od); made_dir = od; }   /* one missing level is created */
    else free(od);
    if (o->write_config && cfg && cfg->type == JSON_OBJECT && (cp = config_beside(dir, output, log)) &&
        (dt_output_not_input(cp, inputs, 2) || dt_config_beside_ok(cp, cfg) || dt_output_check(cp)))
        goto done;
    s = st_stream_open(output);   /* the temporary beside the output exists from here on */
    if (!s) goto done;
    char nm[1024];
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        int kept;
        st->in_bytes += t->nbytes;
        is_q[i] = (char)quantizable(w, t, o, &kept);
        if (!is_q[i]) {
            st_stream_declare(s, t->name, t->dtype, t->ndim, t->shape);
            st->out_bytes += t->nbytes;
            st->n_copied++;
            st->n_kept += kept;
            continue;
        }
        size_t bl = strlen(t->name) - 7;
        int64_t sw[2] = {t->shape[0], t->shape[1] * o->bits / 32}, sg[2] = {t->shape[0], t->shape[1] / o->group};
        st_stream_declare(s, t->name, DT_U32, 2, sw);
        snprintf(nm, sizeof nm, "%.*s.scales", (int)bl, t->name);
        st_stream_declare(s, nm, DT_BF16, 2, sg);
        snprintf(nm, sizeof nm, "%.*s.biases", (int)bl, t->name);
        st_stream_declare(s, nm, DT_BF16, 2, sg);
        st->out_bytes += (uint64_t)(sw[0] * sw[1]) * 4 + (uint64_t)(sg[0] * sg[1]) * 4;
        st->n_quantized++;
    }
    char q[96];
    snprintf(q, sizeof q, "{\"group_size\": %d, \"bits\": %d, \"mode\": \"affine\"}", o->group, o->bits);
    st_stream_set_metadata(s, "quantization", q);
    st_stream_set_metadata(s, "format", "mlx");
    st_stream_set_metadata(s, "quantization_rule", o->rule == MLX_RULE_MINMAX ? "minmax" : "mlx");
    if (st_stream_begin_data(s)) goto done;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        int r;
        if (!is_q[i]) {
            r = st_stream_write(s, t->data, t->nbytes);
        } else {
            double e2, r2;
            r = quantize_tensor(s, t, o, nthreads, &e2, &r2);
            st->err2 += e2;
            st->ref2 += r2;
            double rel = r2 > 0 ? sqrt(e2 / r2) : 0;
            rep[nrep].name = dt_strdup(t->name);
            rep[nrep].out = t->shape[0];
            rep[nrep].in = t->shape[1];
            rep[nrep].rel = rel;
            nrep++;
            if (rel > st->worst_rel || nrep == 1) {
                st->worst_rel = rel;
                snprintf(st->worst_name, sizeof st->worst_name, "%s", t->name);
            }
            if (o->report >= 2) fprintf(log, "  %-56s [%6lld, %6lld]  rel err %.4e\n", t->name, (long long)t->shape[0], (long long)t->shape[1], rel);
        }
        dt_weights_release(w, t);
        if (r) goto done;
    }
    if (st_stream_close(s)) { s = NULL; goto done; }
    s = NULL;
    st->rel_err = st->ref2 > 0 ? sqrt(st->err2 / st->ref2) : 0;
    if (o->report == 1 && nrep) {
        qsort(rep, (size_t)nrep, sizeof *rep, cmp_report);
        int show = nrep < 10 ? nrep : 10;
        fprintf(log, "ditrun: the %d quantized tensors with the largest relative error:\n", show);
        for (int k = 0; k < show; k++)
            fprintf(log, "  %-56s [%6lld, %6lld]  rel err %.4e\n", rep[k].name, (long long)rep[k].out, (long long)rep[k].in, rep[k].rel);
    }
    if (cp) {
        if (write_config(cfg, cp, o)) goto done;
        st->wrote_config = 1;
    }
    st->seconds = dt_now() - t0;
    rc = 0;
done:
    if (s) st_stream_abort(s);   /* an error before the end: the temporary goes, an existing output stays */
    if (rc && made_dir) rmdir(made_dir);
    free(made_dir);
    free(cp);
    for (int k = 0; k < nrep; k++) free(rep[k].name);
    free(rep);
    free(is_q);
    dt_weights_close(w);
    free(dir);
    return rc;
}
