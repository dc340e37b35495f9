/* infile.h — opening the user's input files without hanging on a FIFO or a device: the path is opened
 * non-blocking, checked to be a regular file, then switched back to blocking reads. Errors name the path and the
 * real reason (strerror: "Too many levels of symbolic links", "File name too long", ...), one line. */
#ifndef DT_INFILE_H
#define DT_INFILE_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A read-only descriptor of the regular file at path, or -1 (error set: "PATH: cannot open: ...", "PATH: is a
 * folder, not a regular file", "PATH: is a FIFO; inputs must be regular files"). */
int dt_open_input(const char *path);
/* The same as a stream ("rb"). */
FILE *dt_fopen_input(const char *path);
/* What an input path that may be a file or a folder is: 0 regular file, 1 folder, -1 anything else or an error
 * (error set; a missing path is "PATH: cannot open: no such file or folder"). */
int dt_input_kind(const char *path);

#ifdef __cplusplus
}
#endif
/* "a/b" (malloc'd), and whether path exists (stat succeeds). */
char *dt_path_join(const char *a, const char *b);
int dt_path_exists(const char *path);

#endif
