/* fuzz_tmp.h — the private folder a fuzz target writes its files into: $TMPDIR/ditrun-fuzz-TAG-XXXXXX (TMPDIR
 * defaults to /tmp), removed with everything in it when the fuzzer exits (fuzz/run.sh also checks that nothing is
 * left in the TMPDIR it gives each target). */
#ifndef DT_FUZZ_TMP_H
#define DT_FUZZ_TMP_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

static char fuzz_tmp_root[512];

static int fuzz_tmp_rm(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    remove(p);
    return 0;
}

static void fuzz_tmp_cleanup(void) {
    if (fuzz_tmp_root[0]) nftw(fuzz_tmp_root, fuzz_tmp_rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* Creates the folder once per process and returns it (aborts when it cannot). */
static const char *fuzz_tmpdir(const char *tag) {
    if (fuzz_tmp_root[0]) return fuzz_tmp_root;
    const char *t = getenv("TMPDIR");
    snprintf(fuzz_tmp_root, sizeof fuzz_tmp_root, "%s/ditrun-fuzz-%s-XXXXXX", t && *t ? t : "/tmp", tag);
    if (!mkdtemp(fuzz_tmp_root)) abort();
    atexit(fuzz_tmp_cleanup);
    return fuzz_tmp_root;
}

#endif
