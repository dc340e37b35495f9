/* test_layering.c — the source tree keeps its shape (README "Layout"): every #include between src/ folders points
 * down the layers (core ← io ← quant ← backends ← models ← text, synth, export ← pipeline ← cli; serve and bench
 * beside cli; image/ needs only core), and the diffusers class names that choose a family appear only in that
 * family's own files (their names carry the family's model name), so every command finds a family through the
 * registry (pipeline/family.h). A source check, run from the repository root (as `make test` does). */
#include <dirent.h>
#include <sys/stat.h>

#include "test.h"

/* Which folders each folder may include (its own always). */
static const struct { const char *dir, *may; } layers[] = {
    {"core", ""},
    {"io", "core"},
    {"quant", "core io"},
    {"backends", "core io quant"},
    {"models", "core io quant backends"},
    {"text", "core io"},
    {"image", "core"},
    {"synth", "core io quant backends models"},
    {"export", "core io quant backends models"},
    {"pipeline", "core io quant backends models text image synth"},
    {"serve", "core io quant backends models text image synth pipeline"},
    {"bench", "core io quant backends models text image synth pipeline"},
    {"cli", "core io quant backends models text image synth export pipeline serve bench"},
    {"", "core io quant backends models text image synth export pipeline"},   /* src/ditrun_api.c, the library API */
};
#define N_LAYERS (sizeof layers / sizeof *layers)

/* Upward includes still in the tree, each with the move that ends it. */
static const char *const pending[] = {
    "src/models/zimage_synth.c synth",   /* the Z-Image synthetic writer moves to src/synth/ after its merge */
};

/* Family class names (the ones that choose a family) and the words one of which a file's name must
 * contain to hold them. */
static const struct { const char *cls, *owners; } classes[] = {
    {"Flux2Transformer2DModel", "flux2 klein"},
    {"Flux2KleinPipeline", "flux2 klein"},
    {"Krea2Transformer2DModel", "krea2"},
    {"Krea2Pipeline", "krea2"},
};

static int word_in(const char *list, const char *w, size_t n) {
    for (const char *p = list; *p;) {
        while (*p == ' ') p++;
        size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, w, n)) return 1;
        p += k;
    }
    return 0;
}

static int layer_of(const char *dir) {
    for (size_t i = 0; i < N_LAYERS; i++)
        if (!strcmp(layers[i].dir, dir)) return (int)i;
    return -1;
}

static int n_files, n_includes;
static char bad_inc[4096], bad_cls[4096];

static void add(char *buf, const char *fmt, const char *a, const char *b, const char *c) {
    size_t k = strlen(buf);
    if (k < 4000) snprintf(buf + k, 4096 - k, fmt, a, b, c);
}

/* Check one source file: its includes of other folders, the class names it holds. */
static void check_file(const char *path, const char *dir) {
    char *s = t_slurp(path, NULL);
    if (!s) return;
    n_files++;
    const int L = layer_of(dir);
    for (const char *p = s; (p = strstr(p, "#include \"")); p += 10) {
        const char *q = p + 10;
        while (!strncmp(q, "../", 3)) q += 3;
        size_t n = strcspn(q, "/\"");
        if (q[n] != '/') continue;   /* a file of the same folder */
        char inc[64];
        snprintf(inc, sizeof inc, "%.*s", (int)(n < 63 ? n : 63), q);
        if (layer_of(inc) < 0 || !strcmp(inc, dir)) continue;   /* a subfolder (cpu/, cuda/) or its own */
        n_includes++;
        if (L >= 0 && word_in(layers[L].may, inc, strlen(inc))) continue;
        char key[512];
        snprintf(key, sizeof key, "%s %s", path, inc);
        int known = 0;
        for (size_t i = 0; i < sizeof pending / sizeof *pending; i++) known |= !strcmp(pending[i], key);
        if (!known) add(bad_inc, "%s includes %s/ (%s); ", path, inc, dir[0] ? dir : "src");
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    for (size_t c = 0; c < sizeof classes / sizeof *classes; c++) {
        const char *hit = strstr(s, classes[c].cls);
        if (!hit) continue;
        int owned = 0;
        for (const char *o = classes[c].owners; *o;) {
            while (*o == ' ') o++;
            size_t k = strcspn(o, " ");
            char w[32];
            snprintf(w, sizeof w, "%.*s", (int)k, o);
            if (k && strstr(base, w)) owned = 1;
            o += k;
        }
        if (!owned) add(bad_cls, "%s names %s%s; ", path, classes[c].cls, " outside its family's files");
    }
    free(s);
}

/* Every .c / .h / .cu file under path; dir: its first folder under src/ ("" for src/ itself). */
static void walk(const char *path, const char *dir) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        struct stat st;
        if (stat(p, &st)) continue;
        if (S_ISDIR(st.st_mode)) {
            walk(p, dir[0] ? dir : e->d_name);
        } else {
            const char *x = strrchr(e->d_name, '.');
            if (x && (!strcmp(x, ".c") || !strcmp(x, ".h") || !strcmp(x, ".cu"))) check_file(p, dir);
        }
    }
    closedir(d);
}

int main(void) {
    walk("src", "");
    if (n_files < 100) {
        T_FAIL("layering_sources", "read %d source files under src/ (run from the repository root)", n_files);
        return T_DONE();
    }
    printf("# %d source files, %d includes across folders\n", n_files, n_includes);
    T_CHECK("layering: includes point down the layers", !bad_inc[0], "%s", bad_inc);
    T_CHECK("layering: family class names only in the family's own files", !bad_cls[0], "%s", bad_cls);

    /* the checks can fail: a planted upward include and a class name in a file of no family */
    n_files = 0;
    bad_inc[0] = bad_cls[0] = 0;
    char tmp[] = "/tmp/test_layering_XXXXXX";
    if (!mkdtemp(tmp)) { T_FAIL("layering_planted", "mkdtemp failed"); return T_DONE(); }
    char path[256];
    snprintf(path, sizeof path, "%s/placement_sizes.c", tmp);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("#include \"serve/api.h\"\nstatic const char *k = \"Krea2Transformer2DModel\";\n", f);
        fclose(f);
    }
    check_file(path, "models");
    T_CHECK("layering: a planted upward include (models -> serve) is found", strstr(bad_inc, "serve/") != NULL,
            "not reported: '%s'", bad_inc);
    T_CHECK("layering: a planted class name outside its family is found", strstr(bad_cls, "Krea2Transformer") != NULL,
            "not reported: '%s'", bad_cls);
    unlink(path);
    rmdir(tmp);
    return T_DONE();
}
