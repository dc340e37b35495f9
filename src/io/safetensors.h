/* safetensors.h — memory-mapped safetensors reader and writer.
 *
 * Reader: the file is mmap'd read-only; the 8-byte little-endian header length and the JSON
 * header are validated (length within file, valid JSON object, known dtypes, shapes non-negative
 * and not overflowing, data_offsets inside the data section, byte size == numel*elem size,
 * tensors not overlapping). Tensor data are zero-copy views into the mapping.
 * Every error message names the file and the tensor/problem in one line.
 *
 * Writer: collects named f32/other tensors and writes a valid file (used for outputs and tests). Both writers
 * write through core/outfile.h: a temporary beside the target, renamed over it only when complete, removed on
 * any error or interrupt (an existing target is never truncated).
 */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../core/common.h"

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;            /* points into the st_file */
    dt_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data;            /* zero-copy view into the mapping */
    size_t nbytes;
    const char *file;            /* path of the file that holds it */
} st_tensor;

typedef struct st_file st_file;

/* Open + validate. NULL on error (dt_last_error() says what, naming the file). */
st_file *st_open(const char *path);
/* Same validation on an in-memory image of a file (copied; `name` is used in messages). */
st_file *st_open_memory(const void *data, size_t len, const char *name);
void st_close(st_file *f);
const char *st_path(const st_file *f);
size_t st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, size_t i);            /* in header order */
const st_tensor *st_find(const st_file *f, const char *name);  /* NULL if absent */
const char *st_metadata(const st_file *f, const char *key);    /* __metadata__ string value or NULL */

/* Drop the resident pages of a tensor's mapped bytes (streaming tools such as `ditrun quantize` keep
 * memory near one tensor this way). The view stays valid: reading it again faults the pages back in.
 * Returns 1 when pages were released, 0 when t is not a view into f's mapping (aligned copy, memory image). */
int st_release_pages(const st_file *f, const st_tensor *t);

/* Read a tensor of any float dtype (F32/F16/BF16/F64) or integer dtype (I64/I32/U8/BOOL/U32...) as f32.
 * Returns a malloc'd array of t->numel floats. */
float *st_to_f32(const st_tensor *t);

/* ---- writer ---- */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
/* Copies data. shape has ndim entries. */
void st_writer_add(st_writer *w, const char *name, dt_dtype dtype, int ndim, const int64_t *shape, const void *data);
void st_writer_add_f32(st_writer *w, const char *name, int ndim, const int64_t *shape, const float *data);
void st_writer_set_metadata(st_writer *w, const char *key, const char *value);
int st_writer_save(st_writer *w, const char *path);  /* 0 ok, -1 error (dt_last_error) */
void st_writer_free(st_writer *w);

/* ---- streaming writer: declare every tensor first, then write their bytes in declaration order.
 * Memory stays O(header); used for large synthetic checkpoints and `ditrun quantize`. ---- */
typedef struct st_stream st_stream;
st_stream *st_stream_open(const char *path);
void st_stream_declare(st_stream *s, const char *name, dt_dtype dtype, int ndim, const int64_t *shape);
void st_stream_set_metadata(st_stream *s, const char *key, const char *value);
int st_stream_begin_data(st_stream *s);                     /* writes the header */
int st_stream_write(st_stream *s, const void *data, size_t nbytes); /* appends bytes of the next tensor(s) */
int st_stream_close(st_stream *s);                          /* checks every declared byte was written */
void st_stream_abort(st_stream *s);                         /* discards the output (target untouched), keeps the error */

#endif
