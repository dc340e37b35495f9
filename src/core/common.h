/* common.h — shared basics for every layer: dtypes, half-precision conversions,
 * error reporting (one clear line, kept for the caller), logging and checked allocation.
 *
 * Error convention: a failing function calls dt_set_error("file: problem") and returns
 * a negative int / NULL. The CLI prints dt_last_error() as "ditrun: error: ..." and exits 1.
 */
#ifndef DT_COMMON_H
#define DT_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DITRUN_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types found in safetensors files and used by backends, then the block-quantized types of GGUF
 * files (ggml's Q4_0 ... Q6_K: a tensor row is a sequence of fixed-size blocks of 32 or 256 values; their
 * layouts and dequantization: quant/ggml_quants.h). F8_E4M3 / F8_E5M2 are the safetensors fp8 dtypes. */
typedef enum {
    DT_F32 = 0, DT_F16, DT_BF16, DT_U32, DT_I32, DT_I64, DT_U8, DT_BOOL, DT_F64, DT_I8, DT_U16, DT_I16,
    DT_F8_E4M3, DT_F8_E5M2,
    DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K,
    DT_DTYPE_COUNT
} dt_dtype;

const char *dt_dtype_name(dt_dtype t);      /* "F32", "BF16", "F8_E4M3", "Q4_K", ... */
size_t dt_dtype_size(dt_dtype t);           /* bytes per element; 0 for block types */
int dt_dtype_is_block(dt_dtype t);          /* 1 for the GGUF block-quantized types */
int dt_dtype_is_fp8(dt_dtype t);            /* 1 for F8_E4M3 and F8_E5M2 */
int dt_dtype_block_elems(dt_dtype t);       /* values per block (32 or 256); 1 for element types */
size_t dt_dtype_block_bytes(dt_dtype t);    /* bytes per block; the element size for element types */
/* Bytes of n consecutive values (n a multiple of the block size for block types). */
static inline size_t dt_dtype_bytes(dt_dtype t, int64_t n) {
    return (size_t)(n / dt_dtype_block_elems(t)) * dt_dtype_block_bytes(t);
}

/* How a backend runs a Linear or an attention (a run-time choice, not a property of the file): bf16 (f32 on
 * the CPU) or fp8 (e4m3 weights with one scale per output channel, e4m3 activations with one dynamic scale per
 * row; CPU: the same rounding emulated in f32). */
typedef enum { DT_PREC_BF16 = 0, DT_PREC_FP8 = 1 } dt_precision;
/* "bf16" / "fp8" -> *out; 0, or -1 for anything else (NULL included), *out untouched. */
int dt_precision_from_name(const char *name, dt_precision *out);

/* ---- error reporting ---- */
#if defined(__GNUC__)
#define DT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DT_PRINTF(a, b)
#endif
void dt_set_error(const char *fmt, ...) DT_PRINTF(1, 2);
const char *dt_last_error(void);
void dt_clear_error(void);

/* ---- logging: level 0 quiet, 1 normal (progress), 2 verbose ---- */
extern int dt_log_level;
void dt_log(int level, const char *fmt, ...) DT_PRINTF(2, 3);

/* ---- checked allocation: on failure prints one line and exits(1) (out of host memory) ---- */
void *dt_malloc(size_t n);
void *dt_calloc(size_t n, size_t size);
void *dt_realloc(void *p, size_t n);
/* A growable buffer p of *cap bytes (0: none yet) made to hold at least `need`: its capacity doubles from `first`;
 * returns the (possibly moved) buffer. */
void *dt_grow(void *p, size_t *cap, size_t need, size_t first);
char *dt_strdup(const char *s);

/* ---- half-precision conversion (round-to-nearest-even) ---- */
static inline float dt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t dt_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float dt_bf16_round(float f) { return dt_bf16_to_f32(dt_f32_to_bf16(f)); }
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);

/* Convert n elements of a float-like dtype (F32/F16/BF16/F64/F8_E4M3/F8_E5M2) to f32 (exact).
 * Returns -1 for other dtypes. */
int dt_convert_to_f32(float *dst, const void *src, dt_dtype t, size_t n);

/* Monotonic wall-clock seconds. */
double dt_now(void);

/* A cancellation flag that a caller sets (from another thread or a signal handler) and long computations poll at safe
 * points: between sampler steps, DiT blocks, VAE stages, text-encoder layers. NULL: never cancelled. */
static inline int dt_cancel_requested(const volatile int *flag) {
    return flag && __atomic_load_n(flag, __ATOMIC_RELAXED);
}

/* Relative L2 error ||a-b|| / ||b|| (b = reference), computed in double. */
double dt_rel_l2(const float *a, const float *b, size_t n);

#ifdef __cplusplus
}
#endif
#endif
