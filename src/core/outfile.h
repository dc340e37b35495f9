/* outfile.h — every file ditrun writes goes through here, so that an output is either the complete new file or
 * the old one, never a truncated or deleted one, and never one of the command's inputs.
 *
 *   dt_outfile   a regular-file output is written to a temporary in the target's folder (".NAME.PID-N.tmp"),
 *                flushed and fsync'ed, then renamed over the target (keeping an existing target's permissions);
 *                on any error the temporary is removed and an existing target is untouched. A character device
 *                or FIFO target (/dev/null, a pipe) is written in place and never unlinked; other non-regular
 *                targets (folders, block devices, sockets) are refused. A symbolic link is followed: the file it
 *                names is replaced, the link stays.
 *   dt_outdir    a new folder is built as a temporary folder beside the target (".NAME.PID-N.tmp") and renamed
 *                into place when complete; on any error its whole tree is removed. The target must not exist or
 *                be an empty folder.
 *   cleanup      live temporaries (files and folders) are registered; the first dt_outfile/dt_outdir installs a
 *                handler for SIGINT, SIGTERM and SIGHUP (only where the signal has its default action) that
 *                removes them and then dies of the signal as before. A program with its own handlers calls
 *                dt_outfile_cleanup_all() from them (async-signal-safe).
 *   checks       dt_output_check (before long work: the output can be created) and dt_output_not_input (the
 *                output is not the same file as an input or a file under an input folder: st_dev/st_ino).
 *
 * Errors follow common.h: -1 / NULL with dt_set_error("PATH: problem").
 */
#ifndef DT_OUTFILE_H
#define DT_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_outfile dt_outfile;

dt_outfile *dt_outfile_open(const char *path);
FILE *dt_outfile_fp(dt_outfile *f);              /* write through this stream (binary) */
const char *dt_outfile_path(const dt_outfile *f); /* the target, as given */
/* Flush, fsync, rename over the target. 0 or -1 (the temporary removed, the target untouched); frees f. */
int dt_outfile_commit(dt_outfile *f);
/* Drop what was written (the temporary removed, the target untouched); frees f. NULL is a no-op. */
void dt_outfile_abort(dt_outfile *f);

/* The whole file at once through dt_outfile. 0 or -1. */
int dt_write_file(const char *path, const void *data, size_t n);

typedef struct dt_outdir dt_outdir;

/* Starts a new folder `target` (must not exist, or be an empty folder). NULL on error. */
dt_outdir *dt_outdir_begin(const char *target);
const char *dt_outdir_path(const dt_outdir *d);  /* the temporary folder to write into */
/* Renames the temporary folder into place. 0 or -1 (its tree removed); frees d. */
int dt_outdir_commit(dt_outdir *d);
/* Removes the temporary folder's tree; frees d. NULL is a no-op. */
void dt_outdir_abort(dt_outdir *d);

/* 0 when `path` can be written as an output (see above; its folder exists and accepts a new file), else -1. */
int dt_output_check(const char *path);
/* For a new folder output (dt_outdir_begin's rules): 0 or -1. */
int dt_output_dir_check(const char *path);
/* -1 (error "OUT: is the input IN ...") when OUT exists and is the same file as one of the n inputs, or as a file
 * under an input folder (searched 4 levels deep); else 0. NULL inputs are skipped. */
int dt_output_not_input(const char *out, const char *const *inputs, int n);

/* A temporary file or folder of the caller's own (e.g. a cache entry built beside its final name) removed by the
 * signal handler too: returns a handle for dt_temp_forget (-1 when the registry is full). */
int dt_temp_track(const char *path, int is_dir);
void dt_temp_forget(int handle);   /* -1 is a no-op */

/* Removes every live temporary now (async-signal-safe; for programs with their own signal handlers). */
void dt_outfile_cleanup_all(void);

#ifdef __cplusplus
}
#endif
#endif
