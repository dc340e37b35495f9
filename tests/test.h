/* test.h — the tiny test protocol shared by every tests/test_*.c program.
 *
 * Each program prints one line per check: "PASS name", "FAIL name: why" or "SKIP name: why",
 * and exits 0 when nothing failed. tests/run_tests.sh runs every program and prints the
 * closing "N passed, N failed, N skipped" line. Tolerances are named constants with a reason.
 */
#ifndef DT_TEST_H
#define DT_TEST_H

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"

static int t_failed __attribute__((unused)), t_passed __attribute__((unused)), t_skipped __attribute__((unused));

/* stdout line-buffered from the start: run_tests.sh reads stdout and stderr through one pipe and counts whole
 * "PASS " / "FAIL " lines, and a block-buffered stdout flushed mid-line let a stderr line (a progress message) split
 * one, losing it from the count. */
__attribute__((constructor)) static void t_line_buffered(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

#define T_PASS(name) (printf("PASS %s\n", name), t_passed++)
#define T_FAIL(name, ...) (printf("FAIL %s: ", name), printf(__VA_ARGS__), printf("\n"), t_failed++)
#define T_SKIP(name, ...) (printf("SKIP %s: ", name), printf(__VA_ARGS__), printf("\n"), t_skipped++)
#define T_CHECK(name, cond, ...) ((cond) ? (void)T_PASS(name) : (void)T_FAIL(name, __VA_ARGS__))
#define T_DONE() (fflush(stdout), t_failed ? 1 : 0)

/* Compare got vs ref by relative L2; on failure print the worst element. Returns 1 if ok. */
static inline int t_check_rel_l2(const char *name, const float *got, const float *ref, size_t n, double tol) {
    double err = dt_rel_l2(got, ref, n);
    if (err <= tol) { printf("PASS %s (rel_l2 %.3g <= %.3g)\n", name, err, tol); t_passed++; return 1; }
    size_t worst = 0; double wd = -1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d != d) { worst = i; break; }
        if (d > wd) { wd = d; worst = i; }
    }
    printf("FAIL %s: rel_l2 %.3g > %.3g; worst element [%zu] got %.7g ref %.7g\n", name, err, tol, worst,
           n ? got[worst] : 0.0, n ? ref[worst] : 0.0);
    t_failed++;
    return 0;
}

/* A whole file read into memory, NUL-terminated (so text can be used as a string); *n (may be NULL) gets its size.
 * NULL when it cannot be opened. */
static inline char *t_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(len > 0 ? (size_t)len + 1 : 1);
    size_t got = len > 0 ? fread(b, 1, (size_t)len, f) : 0;
    b[got] = 0;
    fclose(f);
    if (n) *n = got;
    return b;
}

/* Fixture folder: $DITRUN_FIXTURES or tests/fixtures (tests run from the repository root). */
static inline const char *t_fixtures(void) {
    const char *e = getenv("DITRUN_FIXTURES");
    return e && *e ? e : "tests/fixtures";
}

/* The folder for a test's own files: $TMPDIR, or /tmp without one. */
static inline const char *t_tmp_root(void) {
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

/* A fresh folder for a test's files: $TMPDIR/ditrun-TAG-XXXXXX (TMPDIR defaults to /tmp; tests/run_tests.sh points
 * it at a private folder and fails a program that leaves anything there). Returns 0, or -1 when it cannot. */
static inline int t_tmpdir(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "%s/ditrun-%s-XXXXXX", t_tmp_root(), tag);
    return mkdtemp(buf) ? 0 : -1;
}

static inline int t_rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    remove(p);   /* best effort: keep going */
    return 0;
}
/* Removes a folder and everything under it (symbolic links are removed, not followed). */
static inline void t_rmtree(const char *dir) {
    if (dir && *dir) nftw(dir, t_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* GPU tests: skip (with a reason) unless a GPU is usable; with DITRUN_REQUIRE_GPU=1 a missing GPU fails. */
static inline int t_require_gpu_env(void) { const char *e = getenv("DITRUN_REQUIRE_GPU"); return e && *e == '1'; }

#endif
