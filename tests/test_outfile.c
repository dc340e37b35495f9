/* test_outfile.c — every writer goes through core/outfile.h: a failed write (file-size limit standing in for a
 * full disk, /dev/full, a FIFO nobody reads, a read-only folder) keeps the old file and leaves no temporary; a
 * SIGINT or SIGTERM in the middle of a file or a folder removes the temporaries and the process still dies of the
 * signal; folder outputs appear whole or not at all; outputs equal to inputs (same file, hard link, symbolic link,
 * a file under an input folder) and unwritable output paths are refused before any work; inputs that are FIFOs,
 * symbolic-link loops or over-long names get their real reason. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/infile.h"
#include "core/outfile.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "image/png.h"
#include "test.h"

static char tmp[512];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(text, f); fclose(f); }
}

static int file_is(const char *path, const char *text) {
    char *b = t_slurp(path, NULL);
    int ok = b && !strcmp(b, text);
    free(b);
    return ok;
}

/* Entries of dir other than the nkeep listed names; *first gets the first such name. */
static int count_others(const char *dir, const char *const *keep, int nkeep, char *first, size_t flen) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int n = 0;
    if (first) first[0] = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int kept = 0;
        for (int i = 0; i < nkeep; i++) kept |= !strcmp(e->d_name, keep[i]);
        if (kept) continue;
        if (!n && first) snprintf(first, flen, "%s", e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* Hidden entries (the temporaries are ".NAME.PID-N.tmp") in dir. */
static int count_hidden(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------ writers that fail keep the old file */

typedef int (*writer_fn)(const char *path);

static int w_png(const char *path) {
    static uint8_t rgb[256 * 256 * 3];
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < sizeof rgb; i++) {   /* xorshift noise: the PNG stays ~200 KB */
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        rgb[i] = (uint8_t)(r >> 32);
    }
    dt_png_text t[] = {{"prompt", "x"}};
    return dt_png_write(path, rgb, 256, 256, t, 1);
}

static int w_st(const char *path) {
    static float d[64 * 1024];
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) d[i] = (float)i;
    int64_t shape[1] = {64 * 1024};
    st_writer *w = st_writer_new();
    st_writer_add_f32(w, "x", 1, shape, d);
    int rc = st_writer_save(w, path);
    st_writer_free(w);
    return rc;
}

static int w_stream(const char *path) {
    static float d[64 * 1024];
    int64_t shape[1] = {64 * 1024};
    st_stream *s = st_stream_open(path);
    if (!s) return -1;
    st_stream_declare(s, "x", DT_F32, 1, shape);
    if (st_stream_begin_data(s) || st_stream_write(s, d, sizeof d)) { st_stream_abort(s); return -1; }
    return st_stream_close(s);
}

static int w_text(const char *path) {
    static char d[256 * 1024];
    memset(d, 'x', sizeof d);
    return dt_write_file(path, d, sizeof d);
}

/* In a child limited to 16 KB per file (a full disk as far as these writers can tell): the write fails, the old
 * target is intact, and nothing else is left in the folder. */
static void fails_keeping_old(const char *name, writer_fn fn) {
    char dir[700], target[760], msg[200] = "", other[300];
    snprintf(dir, sizeof dir, "%s/full-%s", tmp, name);
    mkdir(dir, 0755);
    snprintf(target, sizeof target, "%s/out.bin", dir);
    write_text(target, "OLD CONTENT");
    int pfd[2];
    if (pipe(pfd)) { T_FAIL(name, "pipe"); return; }
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        struct rlimit rl = {16384, 16384};
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &rl);
        int rc = fn(target);
        const char *e = rc ? dt_last_error() : "succeeded";
        if (write(pfd[1], e, strlen(e))) {}
        _exit(rc ? 0 : 1);
    }
    close(pfd[1]);
    ssize_t n = read(pfd[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    const char *keep[] = {"out.bin"};
    int others = count_others(dir, keep, 1, other, sizeof other);
    char label[200];
    snprintf(label, sizeof label, "%s: a failed write (file too large) keeps the old file, no temporary", name);
    T_CHECK(label, WIFEXITED(st) && WEXITSTATUS(st) == 0 && file_is(target, "OLD CONTENT") && others == 0 &&
                       strstr(msg, "out.bin") && strstr(msg, "File too large"),
            "child status %d, message '%s', old file %s, %d other entries (%s)", st, msg,
            file_is(target, "OLD CONTENT") ? "kept" : "CHANGED", others, other);
}

static void special_targets(void) {
    struct stat sb;
    /* a character device that refuses data: the error is reported, the node is not touched */
    if (stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode)) {
        int rc = w_png("/dev/full");
        T_CHECK("PNG to /dev/full: 'No space left', the device is kept",
                rc == -1 && strstr(dt_last_error(), "No space left") && stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode),
                "rc %d: %s", rc, dt_last_error());
    } else {
        T_SKIP("PNG to /dev/full", "no /dev/full on this machine");
    }
    /* /dev/null is written in place */
    T_CHECK("safetensors to /dev/null", w_st("/dev/null") == 0 && stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode), "%s",
            dt_last_error());
    /* a FIFO nobody reads: refused at once, the FIFO stays */
    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/out.fifo", tmp);
    if (mkfifo(fifo, 0644) == 0) {
        int rc = w_text(fifo);
        T_CHECK("output FIFO without a reader: refused, kept", rc == -1 && strstr(dt_last_error(), "no process is reading") &&
                    stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "rc %d: %s", rc, dt_last_error());
        unlink(fifo);
    }
    /* a folder is not an output */
    int rc = w_text(tmp);
    T_CHECK("output that is a folder: refused", rc == -1 && strstr(dt_last_error(), "a folder"), "rc %d: %s", rc, dt_last_error());
    /* a symbolic link: the file it names is replaced, the link stays */
    char real[700], link[700];
    snprintf(real, sizeof real, "%s/real.bin", tmp);
    snprintf(link, sizeof link, "%s/link.bin", tmp);
    write_text(real, "OLD");
    if (symlink("real.bin", link) == 0) {
        rc = dt_write_file(link, "NEW", 3);
        T_CHECK("output through a symbolic link: its file replaced, the link kept",
                rc == 0 && file_is(real, "NEW") && lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "rc %d: %s", rc,
                dt_last_error());
    }
    /* an existing file's permissions are kept */
    char priv[700];
    snprintf(priv, sizeof priv, "%s/private.bin", tmp);
    write_text(priv, "OLD");
    chmod(priv, 0600);
    rc = dt_write_file(priv, "NEW", 3);
    T_CHECK("replaced file keeps its permissions", rc == 0 && stat(priv, &sb) == 0 && (sb.st_mode & 0777) == 0600 &&
                file_is(priv, "NEW"), "rc %d, mode %o", rc, (unsigned)(sb.st_mode & 0777));
    /* a read-only folder (permission bits do not bind root) */
    if (geteuid() != 0) {
        char ro[700], t[760];
        snprintf(ro, sizeof ro, "%s/readonly", tmp);
        mkdir(ro, 0755);
        snprintf(t, sizeof t, "%s/out.bin", ro);
        write_text(t, "OLD CONTENT");
        chmod(ro, 0555);
        int r1 = dt_output_check(t), r2 = w_st(t);
        chmod(ro, 0755);
        T_CHECK("read-only folder: refused before and at the write, old file kept",
                r1 == -1 && r2 == -1 && strstr(dt_last_error(), "Permission denied") && file_is(t, "OLD CONTENT"),
                "check %d, write %d: %s", r1, r2, dt_last_error());
    } else {
        T_SKIP("read-only folder", "running as root: permission bits do not apply (the file-size limit case stands in)");
    }
}

/* ------------------------------------------------------------------ interrupts */

/* A child writes through an outfile (or builds a folder) and then gets `sig`: it must die of the signal, leaving
 * nothing but the old target. */
static void interrupted(int sig, int folder) {
    char dir[700], target[760], label[200], other[300];
    snprintf(dir, sizeof dir, "%s/sig%d-%s", tmp, sig, folder ? "dir" : "file");
    mkdir(dir, 0755);
    snprintf(target, sizeof target, "%s/%s", dir, folder ? "model" : "out.bin");
    if (!folder) write_text(target, "OLD CONTENT");
    pid_t pid = fork();
    if (pid == 0) {
        if (folder) {
            dt_outdir *d = dt_outdir_begin(target);
            if (!d) _exit(3);
            char p[900];
            snprintf(p, sizeof p, "%s/sub", dt_outdir_path(d));
            mkdir(p, 0755);
            snprintf(p, sizeof p, "%s/sub/config.json", dt_outdir_path(d));
            if (dt_write_file(p, "{}", 2)) _exit(4);
            snprintf(p, sizeof p, "%s/model.safetensors", dt_outdir_path(d));
            dt_outfile *f = dt_outfile_open(p);
            if (!f) _exit(5);
            fputs("partial", dt_outfile_fp(f));
            fflush(dt_outfile_fp(f));
        } else {
            dt_outfile *f = dt_outfile_open(target);
            if (!f) _exit(5);
            fputs("partial", dt_outfile_fp(f));
            fflush(dt_outfile_fp(f));
        }
        alarm(30);   /* a signal that does not end the child fails the check (SIGALRM) instead of hanging */
        kill(getpid(), sig);
        pause();
        _exit(6);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    const char *keep[] = {"out.bin"};
    int others = count_others(dir, keep, folder ? 0 : 1, other, sizeof other);
    snprintf(label, sizeof label, "%s during a %s write: no temporary left, dies of the signal", strsignal(sig),
             folder ? "folder" : "file");
    T_CHECK(label, WIFSIGNALED(st) && WTERMSIG(st) == sig && others == 0 && (folder || file_is(target, "OLD CONTENT")),
            "status %d (signaled %d, sig %d), %d entries left (%s)", st, WIFSIGNALED(st), WIFSIGNALED(st) ? WTERMSIG(st) : 0,
            others, other);
}

static void outdir_cases(void) {
    char target[700], p[900];
    snprintf(target, sizeof target, "%s/newdir", tmp);
    dt_outdir *d = dt_outdir_begin(target);
    struct stat sb;
    int absent_during = d && stat(target, &sb) != 0;
    if (d) {
        snprintf(p, sizeof p, "%s/a.txt", dt_outdir_path(d));
        dt_write_file(p, "A", 1);
    }
    int rc = d ? dt_outdir_commit(d) : -1;
    snprintf(p, sizeof p, "%s/a.txt", target);
    T_CHECK("new folder: absent until complete, then whole", d && absent_during && rc == 0 && file_is(p, "A"), "%s",
            dt_last_error());
    d = dt_outdir_begin(target);
    T_CHECK("new folder over a non-empty folder: refused", !d && strstr(dt_last_error(), "not empty"), "%s",
            d ? "accepted" : dt_last_error());
    dt_outdir_abort(d);
    snprintf(target, sizeof target, "%s/aborted", tmp);
    d = dt_outdir_begin(target);
    if (d) {
        snprintf(p, sizeof p, "%s/a.txt", dt_outdir_path(d));
        dt_write_file(p, "A", 1);
    }
    dt_outdir_abort(d);
    int n = count_hidden(tmp);
    T_CHECK("aborted folder: nothing left", d && stat(target, &sb) != 0 && n == 0, "%d hidden temporaries in %s", n, tmp);
}

/* ------------------------------------------------------------------ checks before the work */

static void output_checks(void) {
    char in[700], hard[700], lnk[700], folder[700], inner[800], miss[700];
    snprintf(in, sizeof in, "%s/in.bin", tmp);
    snprintf(hard, sizeof hard, "%s/hard.bin", tmp);
    snprintf(lnk, sizeof lnk, "%s/lnk.bin", tmp);
    write_text(in, "INPUT");
    unlink(hard);
    unlink(lnk);
    if (link(in, hard)) printf("# link failed\n");
    if (symlink(in, lnk)) printf("# symlink failed\n");
    const char *inputs[2] = {NULL, in};
    T_CHECK("output = input refused", dt_output_not_input(in, inputs, 2) == -1 && strstr(dt_last_error(), "is the input"),
            "%s", dt_last_error());
    T_CHECK("output = a hard link of the input refused", dt_output_not_input(hard, inputs, 2) == -1, "accepted");
    T_CHECK("output = a symbolic link to the input refused", dt_output_not_input(lnk, inputs, 2) == -1, "accepted");
    snprintf(folder, sizeof folder, "%s/model", tmp);
    mkdir(folder, 0755);
    snprintf(inner, sizeof inner, "%s/model/sub", tmp);
    mkdir(inner, 0755);
    snprintf(inner, sizeof inner, "%s/model/sub/w.safetensors", tmp);
    write_text(inner, "WEIGHTS");
    const char *model[1] = {folder};
    T_CHECK("output = a file under the input folder refused",
            dt_output_not_input(inner, model, 1) == -1 && strstr(dt_last_error(), "a file of the input"), "%s", dt_last_error());
    snprintf(miss, sizeof miss, "%s/model/new.png", tmp);
    T_CHECK("a new file beside the inputs is fine", dt_output_not_input(miss, model, 1) == 0 && dt_output_check(miss) == 0,
            "%s", dt_last_error());
    snprintf(miss, sizeof miss, "%s/no/such/folder/x.png", tmp);
    T_CHECK("output in a missing folder: refused naming the folder",
            dt_output_check(miss) == -1 && strstr(dt_last_error(), "does not exist"), "%s", dt_last_error());
    T_CHECK("output check leaves nothing", file_is(in, "INPUT"), "input changed");
}

static void input_checks(void) {
    char fifo[700], loop1[700], loop2[700];
    snprintf(fifo, sizeof fifo, "%s/in.fifo", tmp);
    mkfifo(fifo, 0644);
    int fd = dt_open_input(fifo);
    T_CHECK("FIFO input refused without waiting", fd < 0 && strstr(dt_last_error(), "FIFO"), "%s", dt_last_error());
    json *j = json_parse_file(fifo);
    T_CHECK("FIFO config refused", !j && strstr(dt_last_error(), "FIFO"), "%s", dt_last_error());
    json_free(j);
    unlink(fifo);
    snprintf(loop1, sizeof loop1, "%s/loop1", tmp);
    snprintf(loop2, sizeof loop2, "%s/loop2", tmp);
    if (symlink("loop2", loop1) || symlink("loop1", loop2)) printf("# symlink failed\n");
    st_file *f = st_open(loop1);
    T_CHECK("symbolic-link loop: says so", !f && strstr(dt_last_error(), "Too many levels of symbolic links"), "%s",
            dt_last_error());
    st_close(f);
    T_CHECK("symbolic-link loop as a folder-or-file input: says so",
            dt_input_kind(loop1) == -1 && strstr(dt_last_error(), "symbolic links"), "%s", dt_last_error());
    unlink(loop1);
    unlink(loop2);
    char longp[5000];
    snprintf(longp, sizeof longp, "%s/", tmp);
    size_t n = strlen(longp);
    memset(longp + n, 'a', 300);
    longp[n + 300] = 0;
    T_CHECK("over-long name: says so", dt_input_kind(longp) == -1 && strstr(dt_last_error(), "File name too long"), "%s",
            dt_last_error());
}

int main(void) {
    if (t_tmpdir(tmp, sizeof tmp, "outfile")) { T_FAIL("tmpdir", "cannot create"); return T_DONE(); }
    dt_log_level = 0;
    /* A program started in the background by a non-interactive shell (make test &, CI runners) inherits SIGINT and
     * SIGQUIT ignored, and outfile rightly leaves an ignored signal alone, so the interrupt cases would raise a
     * signal that does nothing: give them an interactive run's dispositions before any outfile is opened. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    fails_keeping_old("PNG", w_png);
    fails_keeping_old("safetensors", w_st);
    fails_keeping_old("safetensors stream", w_stream);
    fails_keeping_old("whole file", w_text);
    special_targets();
    interrupted(SIGINT, 0);
    interrupted(SIGTERM, 0);
    interrupted(SIGINT, 1);
    interrupted(SIGTERM, 1);
    outdir_cases();
    output_checks();
    input_checks();
    t_rmtree(tmp);
    return T_DONE();
}
