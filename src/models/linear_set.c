/* linear_set.c — one list of a model's prepared Linears and the description of their formats. */
#include "linear_set.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_linear *dt_linear_set_add(dt_linear_set *s, const dt_linear_src *src) {
    dt_linear *l = s->be->linear_create(s->be, src);
    if (!l) return NULL;
    s->all = dt_realloc(s->all, sizeof *s->all * (size_t)(s->n + 1));
    s->all[s->n++] = l;
    char f[32];
    if (src->bits) snprintf(f, sizeof f, "q%d g%d", src->bits, src->group_size);
    else snprintf(f, sizeof f, "%s", src->dtype == DT_BF16 ? "bf16" : src->dtype == DT_F16 ? "f16" : "f32");
    if (!strstr(s->fmt, f)) {
        size_t len = strlen(s->fmt);
        snprintf(s->fmt + len, sizeof s->fmt - len, "%s%s", len ? "+" : "", f);
    }
    return l;
}

dt_linear *dt_linear_set_load(dt_linear_set *s, const dt_weights *w, const char *name, int64_t out, int64_t in,
                              int want_bias) {
    dt_linear_src src;
    if (dt_weights_linear(w, name, out, in, want_bias, &src) != 0) return NULL;
    return dt_linear_set_add(s, &src);
}

void dt_linear_set_free(dt_linear_set *s) {
    for (int i = 0; i < s->n; i++) s->be->linear_destroy(s->be, s->all[i]);
    free(s->all);
    s->all = NULL;
    s->n = 0;
    s->fmt[0] = 0;
}
