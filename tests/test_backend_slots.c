/* test_backend_slots.c — every slot of the backend interface (struct dt_backend in src/backends/backend.h) is traced
 * by the CUDA backend's trace decorator (src/backends/cuda/cuda_trace.cu installs `be->SLOT = tr_SLOT`) or named in
 * its list of untraced slots with the reason; a slot added to the interface without either fails here, so a new op
 * cannot go untraced silently. (A source check: the decorator itself runs only on a GPU.) Also the reverse: a name
 * in the decorator that is no slot any more. Run from the repository root (as `make test` does). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) { fclose(f); free(s); return NULL; }
    s[n] = 0;
    fclose(f);
    return s;
}

/* Whether `word` occurs in s as a whole word between a and b. */
static int has_word(const char *a, const char *b, const char *word) {
    size_t n = strlen(word);
    for (const char *p = a; p && p < b && (p = strstr(p, word)) && p < b; p += n) {
        int left = p == a || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int right = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (left && right) return 1;
    }
    return 0;
}

int main(void) {
    char *hdr = slurp("src/backends/backend.h"), *tr = slurp("src/backends/cuda/cuda_trace.cu");
    if (!hdr || !tr) {
        T_FAIL("backend_slots_sources", "cannot read src/backends/backend.h or src/backends/cuda/cuda_trace.cu "
                                        "(run from the repository root)");
        return T_DONE();
    }
    const char *body = strstr(hdr, "struct dt_backend {"), *end = body ? strstr(body, "\n};") : NULL;
    const char *install = strstr(tr, "void dtc_trace_install("), *iend = install ? strstr(install, "\n}") : NULL;
    const char *untraced = install ? strstr(install, "untraced") : NULL;
    if (!body || !end || !install || !iend || !untraced || untraced > iend) {
        T_FAIL("backend_slots_found", "struct dt_backend, dtc_trace_install or its untraced list not found");
        return T_DONE();
    }
    int slots = 0, missing = 0;
    char names[128][64];
    for (const char *p = body; (p = strstr(p, "(*")) && p < end; p += 2) {
        const char *q = p + 2;
        size_t n = 0;
        while ((isalnum((unsigned char)q[n]) || q[n] == '_') && n < 63) n++;
        if (!n || q[n] != ')' || slots == 128) continue;
        memcpy(names[slots], q, n);
        names[slots][n] = 0;
        char assign[160];
        snprintf(assign, sizeof assign, "be->%s = tr_%s;", names[slots], names[slots]);
        const char *a = strstr(install, assign);
        int traced = a && a < iend, listed = has_word(untraced, iend, names[slots]);
        char nm[96];
        snprintf(nm, sizeof nm, "slot_%.60s_traced_or_listed", names[slots]);
        if (traced && listed) T_FAIL(nm, "both traced and in the untraced list");
        else if (!traced && !listed) { T_FAIL(nm, "no trace wrapper in cuda_trace.cu and not in its untraced list"); missing++; }
        else T_PASS(nm);
        slots++;
    }
    /* at least the 46 slots the interface had when this test was written: a parse that finds none cannot pass */
    T_CHECK("backend_slots_parsed", slots >= 40, "only %d function-pointer slots parsed from struct dt_backend", slots);
    /* every tr_X the decorator installs is a slot (a renamed op would leave a stale wrapper) */
    for (const char *p = install; (p = strstr(p, "be->")) && p < iend; p += 4) {
        char nm[64];
        size_t n = 0;
        while ((isalnum((unsigned char)p[4 + n]) || p[4 + n] == '_') && n < 63) n++;
        memcpy(nm, p + 4, n);
        nm[n] = 0;
        int found = 0;
        for (int i = 0; i < slots && !found; i++) found = !strcmp(names[i], nm);
        if (!found) {
            char t[96];
            snprintf(t, sizeof t, "installed_%.60s_is_a_slot", nm);
            T_FAIL(t, "dtc_trace_install sets be->%s, which struct dt_backend does not have", nm);
        }
    }
    printf("# %d slots, %d without a trace wrapper or a reason\n", slots, missing);
    free(hdr);
    free(tr);
    return T_DONE();
}
