/* dev/stcmp.c — compare the tensors of two safetensors files: for each tensor of A, whether B has it with the same
 * shape, and then max |A - B|, max |A| and the relative L2 of B against A ("identical" when every value is the same
 * bit pattern after conversion to f32). tools/gpu_run.sh's `ab` section uses it on the outputs of two builds.
 *   usage: stcmp A.safetensors B.safetensors   (exit 0 when every tensor is present with its shape, 1 otherwise) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: stcmp A.safetensors B.safetensors\n");
        return 2;
    }
    st_file *a = st_open(argv[1]), *b = a ? st_open(argv[2]) : NULL;
    if (!a || !b) {
        fprintf(stderr, "stcmp: %s\n", dt_last_error());
        st_close(a);
        return 2;
    }
    int bad = 0;
    for (size_t i = 0; i < st_count(a); i++) {
        const st_tensor *ta = st_at(a, i), *tb = st_find(b, ta->name);
        if (!tb || tb->numel != ta->numel || tb->ndim != ta->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * (size_t)ta->ndim)) {
            printf("%-32s missing or of another shape in %s\n", ta->name, argv[2]);
            bad = 1;
            continue;
        }
        float *x = st_to_f32(ta), *y = st_to_f32(tb);
        if (!x || !y) {
            printf("%-32s not a float tensor\n", ta->name);
            free(x);
            free(y);
            continue;
        }
        double md = 0, mx = 0;
        size_t same = 0;
        for (int64_t k = 0; k < ta->numel; k++) {
            double d = fabs((double)x[k] - y[k]);
            if (d != d) d = INFINITY;
            if (d > md) md = d;
            if (fabs(x[k]) > mx) mx = fabs(x[k]);
            same += !memcmp(&x[k], &y[k], sizeof(float));
        }
        printf("%-32s %s  max|A-B| %.3g  max|A| %.3g  rel L2 %.3g\n", ta->name,
               same == (size_t)ta->numel ? "identical" : "differs  ", md, mx, dt_rel_l2(y, x, (size_t)ta->numel));
        free(x);
        free(y);
    }
    st_close(a);
    st_close(b);
    return bad;
}
