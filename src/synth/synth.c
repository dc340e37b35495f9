/* synth.c — random-weight safetensors writer shared by the synthetic checkpoint generators. */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/outfile.h"
#include "io/safetensors.h"

static void add(synth_list *l, const char *name, int ndim, const int64_t *shape, int q, float center, float amp) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = dt_realloc(l->t, sizeof *l->t * l->cap);
    }
    synth_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    t->name = dt_strdup(name);
    if (ndim < 1 || ndim > 5) { fprintf(stderr, "ditrun: synth: tensor %s has %d dims (1..5 supported)\n", name, ndim); abort(); }
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->quantizable = q;
    t->center = center;
    t->amp = amp;
}

void synth_add_linear(synth_list *l, const char *name, int64_t out, int64_t in, int bias) {
    char nm[512];
    int64_t s[2] = {out, in};
    snprintf(nm, sizeof nm, "%s.weight", name);
    add(l, nm, 2, s, 1, 0.0f, sqrtf(3.0f / (float)in));   /* uniform(-a, a): variance a^2/3 = 1/in */
    if (bias) {
        snprintf(nm, sizeof nm, "%s.bias", name);
        add(l, nm, 1, &out, 0, 0.0f, 0.02f);
    }
}

void synth_add(synth_list *l, const char *name, int ndim, const int64_t *shape, float center, float amp) {
    add(l, name, ndim, shape, 0, center, amp);
}

void synth_list_free(synth_list *l) {
    for (int i = 0; i < l->n; i++) free(l->t[i].name);
    free(l->t);
    memset(l, 0, sizeof *l);
}

static uint64_t rng_next(uint64_t *s) {  /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}
static float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static int is_quantized(const synth_tensor *t, int bits, int group) {
    return bits && t->quantizable && t->ndim == 2 && t->shape[1] % group == 0 && (t->shape[1] * bits) % 32 == 0;
}

int synth_write(const synth_list *l, const char *path, int bits, int group, dt_dtype dense, uint64_t seed) {
    if (bits && bits != 4 && bits != 8) { dt_set_error("synthetic checkpoint: bits must be 0, 4 or 8"); return -1; }
    if (dense != DT_BF16 && dense != DT_F32) { dt_set_error("synthetic checkpoint: dense dtype must be BF16 or F32"); return -1; }
    st_stream *s = st_stream_open(path);
    if (!s) return -1;
    char nm[600];
    for (int i = 0; i < l->n; i++) {
        const synth_tensor *t = &l->t[i];
        if (is_quantized(t, bits, group)) {
            size_t len = strlen(t->name);
            int64_t sw[2] = {t->shape[0], t->shape[1] * bits / 32}, sg[2] = {t->shape[0], t->shape[1] / group};
            st_stream_declare(s, t->name, DT_U32, 2, sw);
            snprintf(nm, sizeof nm, "%.*s.scales", (int)(len - 7), t->name);
            st_stream_declare(s, nm, DT_BF16, 2, sg);
            snprintf(nm, sizeof nm, "%.*s.biases", (int)(len - 7), t->name);
            st_stream_declare(s, nm, DT_BF16, 2, sg);
        } else {
            st_stream_declare(s, t->name, dense, t->ndim, t->shape);
        }
    }
    if (bits) {
        char q[96];
        snprintf(q, sizeof q, "{\"group_size\": %d, \"bits\": %d, \"mode\": \"affine\"}", group, bits);
        st_stream_set_metadata(s, "quantization", q);
        st_stream_set_metadata(s, "format", "mlx");
    }
    int rc = st_stream_begin_data(s);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    size_t esz = dt_dtype_size(dense);
    for (int i = 0; i < l->n && rc == 0; i++) {
        const synth_tensor *t = &l->t[i];
        if (is_quantized(t, bits, group)) {
            /* random codes, then scales = 2a/(2^bits-1) and biases = -a jittered per group */
            int64_t out = t->shape[0], in = t->shape[1], ng = in / group, pw = in * bits / 32;
            uint32_t *packed = dt_malloc(sizeof(uint32_t) * pw);
            uint16_t *sc = dt_malloc(sizeof(uint16_t) * out * ng), *bi = dt_malloc(sizeof(uint16_t) * out * ng);
            float qmax = (float)((1 << bits) - 1);
            for (int64_t r = 0; r < out && rc == 0; r++) {
                for (int64_t j = 0; j < pw; j++) packed[j] = (uint32_t)(rng_next(&rng) >> 32);
                for (int64_t g = 0; g < ng; g++) {
                    float ag = t->amp * (1.0f + 0.25f * rng_uniform(&rng));
                    sc[r * ng + g] = dt_f32_to_bf16(2.0f * ag / qmax);
                    bi[r * ng + g] = dt_f32_to_bf16(t->center - ag);
                }
                rc = st_stream_write(s, packed, sizeof(uint32_t) * pw);
            }
            if (rc == 0) rc = st_stream_write(s, sc, sizeof(uint16_t) * out * ng);
            if (rc == 0) rc = st_stream_write(s, bi, sizeof(uint16_t) * out * ng);
            free(packed); free(sc); free(bi);
        } else {
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            int64_t chunk = 1 << 20;
            void *buf = dt_malloc((size_t)chunk * esz);
            for (int64_t off = 0; off < numel && rc == 0; off += chunk) {
                int64_t m = numel - off < chunk ? numel - off : chunk;
                for (int64_t j = 0; j < m; j++) {
                    float v = t->center + t->amp * rng_uniform(&rng);
                    if (dense == DT_BF16) ((uint16_t *)buf)[j] = dt_f32_to_bf16(v);
                    else ((float *)buf)[j] = v;
                }
                rc = st_stream_write(s, buf, (size_t)m * esz);
            }
            free(buf);
        }
    }
    if (st_stream_close(s) && rc == 0) rc = -1;
    return rc;
}

int synth_write_text(const char *path, const char *text) { return dt_write_file(path, text, strlen(text)); }

int synth_write_model(synth_list *l, const char *dir, int bits, int group, uint64_t seed) {
    char p[8500];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int rc = synth_write(l, p, bits, group, DT_BF16, seed);
    synth_list_free(l);
    return rc;
}

int synth_mkdir(const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", dir, strerror(errno)); return -1; }
    return 0;
}

void synth_quantization_entry(char *dst, size_t n, int bits, int group) {
    if (bits) snprintf(dst, n, ",\n  \"quantization\": {\"group_size\": %d, \"bits\": %d}", group, bits);
    else if (n) dst[0] = 0;
}

dt_outfile *synth_config_begin(const char *dir, const char *class_name, int head_dim, const int *axes, int n_axes) {
    char p[8500];
    snprintf(p, sizeof p, "%s/config.json", dir);
    dt_outfile *of = dt_outfile_open(p);
    if (!of) return NULL;
    FILE *f = dt_outfile_fp(of);
    fprintf(f, "{\n  \"_class_name\": \"%s\",\n  \"attention_head_dim\": %d,\n  \"axes_dims_rope\": [", class_name, head_dim);
    for (int a = 0; a < n_axes; a++) fprintf(f, "%s%d", a ? ", " : "", axes[a]);
    fprintf(f, "]");
    return of;
}

int synth_config_end(dt_outfile *of, int bits, int group) {
    char quant[96];
    synth_quantization_entry(quant, sizeof quant, bits, group);
    fprintf(dt_outfile_fp(of), "%s\n}\n", quant);
    return dt_outfile_commit(of);
}
