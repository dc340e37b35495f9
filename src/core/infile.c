/* infile.c — non-blocking open + regular-file check for inputs (infile.h). */
#include "infile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

static const char *kind_name(mode_t m) {
    return S_ISDIR(m) ? "a folder, not a regular file" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

static void open_error(const char *path, int err) {
    if (err == ENOENT) dt_set_error("%s: cannot open: no such file or folder", path);
    else dt_set_error("%s: cannot open: %s", path, strerror(err));
}

int dt_open_input(const char *path) {
    if (!path || !*path) { dt_set_error("empty input path"); return -1; }
    /* O_NONBLOCK: opening a FIFO nobody writes to (or a device) must not wait */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) { open_error(path, errno); return -1; }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        dt_set_error("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) dt_set_error("%s: is a folder, not a regular file", path);
        else dt_set_error("%s: is %s; inputs must be regular files", path, kind_name(st.st_mode));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

FILE *dt_fopen_input(const char *path) {
    int fd = dt_open_input(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        dt_set_error("%s: cannot open a stream: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int dt_input_kind(const char *path) {
    if (!path || !*path) { dt_set_error("empty input path"); return -1; }
    struct stat st;
    if (stat(path, &st) != 0) {
        open_error(path, errno);
        return -1;
    }
    if (S_ISREG(st.st_mode)) return 0;
    if (S_ISDIR(st.st_mode)) return 1;
    dt_set_error("%s: is %s; inputs must be regular files or folders", path, kind_name(st.st_mode));
    return -1;
}

char *dt_path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = dt_malloc(n);
    snprintf(s, n, "%s/%s", a, b);
    return s;
}

int dt_path_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}
