/* gguf.h — GGUF files (the ggml file format, versions 2 and 3): a validating memory-mapped reader with
 * zero-copy tensor views, and a streaming writer.
 *
 * File: "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata key/value pairs (typed:
 * integers, floats, bool, string = u64 length + bytes, arrays of any of these), then per tensor its name,
 * u32 n_dims, u64 dims[n_dims] (dims[0] the contiguous one), u32 ggml type, u64 offset; then padding to
 * general.alignment (default 32) and the data section, each tensor at an aligned offset from its start.
 *
 * Tensors are presented as st_tensor with the row-major shape of the model code (the reversed dims: a
 * Linear's [out, in] weight is stored with dims {in, out}), dtype F32/F16/BF16/F64/I8..I64 or one of the
 * block types Q4_0 ... Q6_K (core/common.h). ComfyUI-GGUF's "comfy.gguf.orig_shape.NAME" metadata, when
 * present, gives the shape instead. Every error is one line naming the file and what is wrong. */
#ifndef DT_GGUF_H
#define DT_GGUF_H

#include <stdint.h>

#include "safetensors.h"

typedef struct gguf_file gguf_file;

/* Open + validate (magic, version, counts against the file size, strings, array lengths, alignment, tensor
 * types, shapes, block multiples, offsets, overlap). NULL on error (dt_last_error names the file). */
gguf_file *gguf_open(const char *path);
/* Same on an in-memory image (copied; `name` is used in messages). */
gguf_file *gguf_open_memory(const void *data, size_t len, const char *name);
void gguf_close(gguf_file *f);
const char *gguf_path(const gguf_file *f);
uint32_t gguf_version(const gguf_file *f);
uint32_t gguf_alignment(const gguf_file *f);
size_t gguf_count(const gguf_file *f);
const st_tensor *gguf_at(const gguf_file *f, size_t i);             /* in file order */
const st_tensor *gguf_find(const gguf_file *f, const char *name);   /* NULL if absent */
/* The ggml type id a tensor was stored with (its dtype's id). */
uint32_t gguf_tensor_type(const gguf_file *f, size_t i);

/* Metadata: the value of KEY as a string (strings as they are; integers, floats and bools printed; arrays as
 * "[N x TYPE]"), or NULL when absent. The pointer stays valid until gguf_close. */
const char *gguf_meta(const gguf_file *f, const char *key);
size_t gguf_meta_count(const gguf_file *f);
const char *gguf_meta_key(const gguf_file *f, size_t i);

/* GGUF's type ids: ggml_type of a dtype (-1 when none) and its name ("Q4_K", also for types ditrun does not
 * read; NULL for an unknown id). */
int gguf_type_of(dt_dtype t);
const char *gguf_type_name(uint32_t id);

/* ---- streaming writer: metadata and tensor declarations first, then each tensor's bytes in declaration
 * order (padding is added between tensors). Written through core/outfile.h (a temporary renamed over PATH by
 * gguf_stream_close), so a failed write never leaves a truncated PATH. ---- */
typedef struct gguf_stream gguf_stream;
gguf_stream *gguf_stream_open(const char *path);
void gguf_stream_meta_str(gguf_stream *s, const char *key, const char *value);
void gguf_stream_meta_u32(gguf_stream *s, const char *key, uint32_t value);
void gguf_stream_meta_i32_array(gguf_stream *s, const char *key, int n, const int32_t *values);
/* shape: the row-major shape (ndim 1..4; written reversed); the innermost dimension must be a whole number of
 * blocks for a block dtype. */
void gguf_stream_declare(gguf_stream *s, const char *name, dt_dtype dtype, int ndim, const int64_t *shape);
int gguf_stream_begin_data(gguf_stream *s);                     /* writes header, metadata and tensor infos */
int gguf_stream_write(gguf_stream *s, const void *data, size_t nbytes);
int gguf_stream_close(gguf_stream *s);                          /* checks every declared byte; 0 or -1 */
void gguf_stream_abort(gguf_stream *s);                         /* drops the output (PATH untouched), frees */

#endif
