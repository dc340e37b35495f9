/* outfile.c — outputs through temporaries renamed into place, the registry of live temporaries and the
 * signal handler that removes them, and the output checks (outfile.h). */
#include "outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

/* ------------------------------------------------------------------ registry of live temporaries */

#define MAX_LIVE 64
#define TREE_DEPTH 8

/* Each slot holds a heap copy of a temporary's path, its lowest bit set for a folder (malloc'd pointers are
 * aligned), or NULL when free; the signal handler reads the slots without locks. */
static _Atomic(uintptr_t) g_live[MAX_LIVE];
static atomic_uint g_counter;
static atomic_int g_handlers;   /* 1 once the signal handlers are decided */

/* Removes everything under the open folder fd, then nothing else (async-signal-safe: getdents64, unlinkat,
 * openat, close only). Entries are removed while the folder is read, so it is read again until a pass
 * removes nothing. */
static void empty_dir_fd(int fd, int depth) {
    char buf[4096] __attribute__((aligned(8)));
    for (int pass = 0; pass < 64; pass++) {
        int removed = 0;
        if (lseek(fd, 0, SEEK_SET) != 0) return;
        for (;;) {
            long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
            if (n <= 0) break;
            for (long off = 0; off < n;) {
                /* struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, name */
                unsigned short reclen;
                unsigned char type;
                memcpy(&reclen, buf + off + 16, 2);
                type = (unsigned char)buf[off + 18];
                const char *name = buf + off + 19;
                off += reclen;
                if (reclen == 0) return;
                if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
                if (type != DT_DIR && unlinkat(fd, name, 0) == 0) { removed = 1; continue; }
                if (depth <= 0) continue;
                int sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub < 0) continue;
                empty_dir_fd(sub, depth - 1);
                close(sub);
                if (unlinkat(fd, name, AT_REMOVEDIR) == 0) removed = 1;
            }
        }
        if (!removed) return;
    }
}

static void remove_tree(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        empty_dir_fd(fd, TREE_DEPTH);
        close(fd);
    }
    rmdir(path);
}

void dt_outfile_cleanup_all(void) {
    for (int i = 0; i < MAX_LIVE; i++) {
        uintptr_t v = atomic_load(&g_live[i]);
        if (!v) continue;
        const char *p = (const char *)(v & ~(uintptr_t)1);
        if (v & 1) remove_tree(p);
        else unlink(p);
    }
}

static void on_signal(int sig) {
    int saved = errno;
    dt_outfile_cleanup_all();
    errno = saved;
    raise(sig);   /* SA_RESETHAND restored the default action: dies of the signal once the handler returns */
}

static void install_handlers(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_handlers, &expected, 1)) return;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(sigs[i], &sa, NULL);
    }
    /* over a file-size limit, writes fail with EFBIG (a clean error, the temporary removed) instead of the
     * process being killed by SIGXFSZ */
    struct sigaction old;
    if (sigaction(SIGXFSZ, NULL, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO))
        signal(SIGXFSZ, SIG_IGN);
}

/* Registers a temporary; returns its slot or -1 when the registry is full (then it is only removed on errors). */
static int live_add(const char *path, int is_dir) {
    install_handlers();
    char *copy = dt_strdup(path);
    uintptr_t v = (uintptr_t)copy | (uintptr_t)(is_dir != 0);
    for (int i = 0; i < MAX_LIVE; i++) {
        uintptr_t expected = 0;
        if (atomic_compare_exchange_strong(&g_live[i], &expected, v)) return i;
    }
    free(copy);
    dt_log(2, "ditrun: more than %d temporary outputs at once; %s is not removed on an interrupt\n", MAX_LIVE, path);
    return -1;
}

static void live_remove(int slot) {
    if (slot < 0) return;
    uintptr_t v = atomic_exchange(&g_live[slot], (uintptr_t)0);
    free((char *)(v & ~(uintptr_t)1));
}

int dt_temp_track(const char *path, int is_dir) { return live_add(path, is_dir); }
void dt_temp_forget(int handle) { live_remove(handle); }

/* ------------------------------------------------------------------ paths */

/* Folder part of path ("." when none). */
static char *dir_of(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) return dt_strdup(".");
    if (sl == path) return dt_strdup("/");
    size_t n = (size_t)(sl - path);
    char *d = dt_malloc(n + 1);
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

/* A fresh temporary name beside path: DIR/.NAME.PID-N.tmp (NAME cut to keep within NAME_MAX). */
static char *temp_name(const char *path) {
    char *dir = dir_of(path);
    const char *sl = strrchr(path, '/');
    const char *base = sl ? sl + 1 : path;
    size_t n = strlen(dir) + strlen(base) + 64;
    char *t = dt_malloc(n);
    snprintf(t, n, "%s/.%.200s.%ld-%u.tmp", dir, base, (long)getpid(), atomic_fetch_add(&g_counter, 1));
    free(dir);
    return t;
}

/* The error of a failed creation in path's folder, named after the target. */
static void create_error(const char *target, int err) {
    if (err == ENOENT) {
        char *dir = dir_of(target);
        dt_set_error("%s: cannot create: folder '%s' does not exist", target, dir);
        free(dir);
    } else if (err == EACCES || err == EROFS || err == EPERM) {
        /* the file is written beside its target and renamed: its folder must take a new file */
        char *dir = dir_of(target);
        dt_set_error("%s: cannot create a file in folder '%s': %s", target, dir, strerror(err));
        free(dir);
    } else {
        dt_set_error("%s: cannot create: %s", target, strerror(err));
    }
}

/* Creates a new temporary file beside `beside`; *tmp gets its name, *slot its registration (made before the file
 * exists, so an interrupt right after the creation still removes it). Returns the fd or -1 (errno set). */
static int create_temp(const char *beside, char **tmp, int *slot) {
    for (int attempt = 0; attempt < 100; attempt++) {
        *tmp = temp_name(beside);
        *slot = live_add(*tmp, 0);
        int fd = open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) return fd;
        int e = errno;
        live_remove(*slot);
        *slot = -1;
        free(*tmp);
        *tmp = NULL;
        if (e != EEXIST) { errno = e; return -1; }
    }
    errno = EEXIST;
    return -1;
}

/* What an existing target is, for the error messages. */
static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* ------------------------------------------------------------------ dt_outfile */

struct dt_outfile {
    char *target;   /* as given */
    char *final;    /* renamed onto (a symbolic link's file) */
    char *tmp;      /* NULL: written in place (character device, FIFO) */
    FILE *fp;
    int slot;
};

/* Classifies an existing target: 0 = absent (create), 1 = regular, 2 = write in place, -1 = refused (error set).
 * *st gets its stat. */
static int classify(const char *path, struct stat *st) {
    if (!path || !*path) { dt_set_error("empty output path"); return -1; }
    if (stat(path, st) != 0) {
        if (errno == ENOENT) return 0;
        dt_set_error("%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st->st_mode)) {
        if (access(path, W_OK) != 0) { dt_set_error("%s: cannot write: %s", path, strerror(errno)); return -1; }
        return 1;
    }
    if (S_ISCHR(st->st_mode) || S_ISFIFO(st->st_mode)) return 2;
    dt_set_error("%s: is %s; an output must be a regular file (or a FIFO or character device)", path, kind_of(st->st_mode));
    return -1;
}

/* Opens a FIFO / character device for writing without blocking on a FIFO nobody reads. */
static int open_in_place(const char *path) {
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENXIO) dt_set_error("%s: a FIFO that no process is reading", path);
        else dt_set_error("%s: cannot open for writing: %s", path, strerror(errno));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

dt_outfile *dt_outfile_open(const char *path) {
    struct stat st;
    int kind = classify(path, &st);
    if (kind < 0) return NULL;
    dt_outfile *f = dt_calloc(1, sizeof *f);
    f->target = dt_strdup(path);
    f->slot = -1;
    int fd;
    if (kind == 2) {
        fd = open_in_place(path);
        if (fd < 0) { free(f->target); free(f); return NULL; }
    } else {
        f->final = kind == 1 ? realpath(path, NULL) : NULL;   /* a symbolic link: replace the file it names */
        if (!f->final) f->final = dt_strdup(path);
        install_handlers();
        fd = create_temp(f->final, &f->tmp, &f->slot);
        if (fd < 0) {
            create_error(path, errno);
            free(f->final); free(f->target); free(f);
            return NULL;
        }
        if (kind == 1) {   /* the new file keeps the old one's permissions (and owner, where allowed) */
            if (fchmod(fd, st.st_mode & 07777) != 0) dt_log(2, "%s: cannot keep the permissions\n", path);
            if (geteuid() == 0 && fchown(fd, st.st_uid, st.st_gid) != 0) dt_log(2, "%s: cannot keep the owner\n", path);
        }
    }
    f->fp = fdopen(fd, "wb");
    if (!f->fp) {
        dt_set_error("%s: cannot open a stream: %s", path, strerror(errno));
        close(fd);
        if (f->tmp) unlink(f->tmp);
        live_remove(f->slot);
        free(f->tmp); free(f->final); free(f->target); free(f);
        return NULL;
    }
    return f;
}

FILE *dt_outfile_fp(dt_outfile *f) { return f->fp; }
const char *dt_outfile_path(const dt_outfile *f) { return f->target; }

static void outfile_free(dt_outfile *f) {
    live_remove(f->slot);
    free(f->tmp); free(f->final); free(f->target); free(f);
}

int dt_outfile_commit(dt_outfile *f) {
    if (!f) return -1;
    int err = 0;
    if (fflush(f->fp) != 0) err = errno ? errno : EIO;
    if (!err && ferror(f->fp)) err = errno ? errno : EIO;
    if (!err && f->tmp && fsync(fileno(f->fp)) != 0) err = errno;
    if (fclose(f->fp) != 0 && !err) err = errno;
    if (!err && f->tmp && rename(f->tmp, f->final) != 0) err = errno;
    if (err) {
        dt_set_error("%s: write failed: %s", f->target, strerror(err));
        if (f->tmp) unlink(f->tmp);
    }
    outfile_free(f);
    return err ? -1 : 0;
}

void dt_outfile_abort(dt_outfile *f) {
    if (!f) return;
    fclose(f->fp);
    if (f->tmp) unlink(f->tmp);
    outfile_free(f);
}

int dt_write_file(const char *path, const void *data, size_t n) {
    dt_outfile *f = dt_outfile_open(path);
    if (!f) return -1;
    if (n && fwrite(data, 1, n, f->fp) != n) {
        dt_set_error("%s: write failed: %s", path, strerror(errno ? errno : EIO));
        dt_outfile_abort(f);
        return -1;
    }
    return dt_outfile_commit(f);
}

/* ------------------------------------------------------------------ dt_outdir */

struct dt_outdir {
    char *target, *tmp;
    int slot;
};

/* Target rules of a new folder: absent, or an empty folder. 0 ok, -1 refused (error set). */
static int dir_target_ok(const char *path) {
    if (!path || !*path) { dt_set_error("empty output path"); return -1; }
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        dt_set_error("%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        dt_set_error("%s: exists and is not a folder", path);
        return -1;
    }
    DIR *d = opendir(path);
    if (!d) { dt_set_error("%s: %s", path, strerror(errno)); return -1; }
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { empty = 0; break; }
    closedir(d);
    if (!empty) {
        dt_set_error("%s: the folder exists and is not empty (a new folder is written; remove it or choose another)", path);
        return -1;
    }
    return 0;
}

/* mkdir of a fresh temporary folder beside target, registered before it exists. Returns 0 with *tmp and *slot
 * set, or -1 (error set). */
static int create_temp_dir(const char *target, char **tmp, int *slot) {
    for (int attempt = 0; attempt < 100; attempt++) {
        *tmp = temp_name(target);
        *slot = live_add(*tmp, 1);
        if (mkdir(*tmp, 0777) == 0) return 0;
        int e = errno;
        live_remove(*slot);
        *slot = -1;
        free(*tmp);
        *tmp = NULL;
        if (e != EEXIST) { create_error(target, e); return -1; }
    }
    create_error(target, EEXIST);
    return -1;
}

dt_outdir *dt_outdir_begin(const char *target) {
    if (dir_target_ok(target)) return NULL;
    install_handlers();
    dt_outdir *d = dt_calloc(1, sizeof *d);
    d->target = dt_strdup(target);
    /* a trailing slash would put the temporary inside the target */
    size_t n = strlen(d->target);
    while (n > 1 && d->target[n - 1] == '/') d->target[--n] = 0;
    if (create_temp_dir(d->target, &d->tmp, &d->slot)) { free(d->target); free(d); return NULL; }
    return d;
}

const char *dt_outdir_path(const dt_outdir *d) { return d->tmp; }

static void outdir_free(dt_outdir *d) {
    live_remove(d->slot);
    free(d->tmp); free(d->target); free(d);
}

int dt_outdir_commit(dt_outdir *d) {
    if (!d) return -1;
    if (rename(d->tmp, d->target) != 0) {
        int e = errno;
        if (e == ENOTEMPTY || e == EEXIST) dt_set_error("%s: the folder appeared and is not empty; nothing written", d->target);
        else dt_set_error("%s: cannot move the new folder into place: %s", d->target, strerror(e));
        remove_tree(d->tmp);
        outdir_free(d);
        return -1;
    }
    outdir_free(d);
    return 0;
}

void dt_outdir_abort(dt_outdir *d) {
    if (!d) return;
    remove_tree(d->tmp);
    outdir_free(d);
}

/* ------------------------------------------------------------------ checks before the work */

int dt_output_check(const char *path) {
    struct stat st;
    int kind = classify(path, &st);
    if (kind < 0) return -1;
    if (kind == 2) {
        if (S_ISCHR(st.st_mode) && access(path, W_OK) != 0) { dt_set_error("%s: cannot write: %s", path, strerror(errno)); return -1; }
        return 0;
    }
    char *real = kind == 1 ? realpath(path, NULL) : NULL, *tmp = NULL;
    int slot = -1;
    int fd = create_temp(real ? real : path, &tmp, &slot);
    int e = errno;
    free(real);
    if (fd < 0) { create_error(path, e); return -1; }
    close(fd);
    unlink(tmp);
    live_remove(slot);
    free(tmp);
    return 0;
}

int dt_output_dir_check(const char *path) {
    if (dir_target_ok(path)) return -1;
    char *copy = dt_strdup(path), *tmp = NULL;
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
    int slot = -1;
    int rc = create_temp_dir(copy, &tmp, &slot);
    if (rc == 0) rmdir(tmp);
    live_remove(slot);
    free(tmp);
    free(copy);
    return rc;
}

/* 1 when a regular file under folder `dir` (depth levels) is (dev, ino); *found gets its path. */
static int find_inode(const char *dir, dev_t dev, ino_t ino, int depth, int *budget, char **found) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int hit = 0;
    while (!hit && (e = readdir(d)) && --*budget > 0) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        char *p = dt_malloc(n);
        snprintf(p, n, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0) {
            if (st.st_dev == dev && st.st_ino == ino) { *found = p; hit = 1; continue; }
            if (S_ISDIR(st.st_mode) && depth > 0) hit = find_inode(p, dev, ino, depth - 1, budget, found);
        }
        free(p);
    }
    closedir(d);
    return hit;
}

int dt_output_not_input(const char *out, const char *const *inputs, int n) {
    struct stat so;
    if (!out || stat(out, &so) != 0 || S_ISDIR(so.st_mode)) return 0;
    if (S_ISCHR(so.st_mode) || S_ISFIFO(so.st_mode)) return 0;   /* written in place, never replaced */
    for (int i = 0; i < n; i++) {
        struct stat si;
        if (!inputs[i] || stat(inputs[i], &si) != 0) continue;
        if (si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
            dt_set_error("%s: is the input %s (the same file); choose another output", out, inputs[i]);
            return -1;
        }
        if (S_ISDIR(si.st_mode)) {
            int budget = 100000;
            char *found = NULL;
            if (find_inode(inputs[i], so.st_dev, so.st_ino, 4, &budget, &found)) {
                dt_set_error("%s: is %s, a file of the input %s; choose another output", out, found, inputs[i]);
                free(found);
                return -1;
            }
        }
    }
    return 0;
}
