/* threadpool.h — a small pthread pool for the CPU backend's elementwise / norm / attention work.
 *
 * dt_pool_run(pool, n, grain, fn, ctx) splits the index range [0, n) into chunks of `grain`
 * indices and calls fn(ctx, i0, i1, tid) for each chunk; chunks are handed out dynamically
 * (atomic counter) to the calling thread (tid 0) and the pool's workers (tid 1..threads-1).
 * It returns when every chunk is done. One dt_pool_run at a time per pool (not reentrant).
 */
#ifndef DT_CPU_THREADPOOL_H
#define DT_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct dt_pool dt_pool;
typedef void (*dt_pool_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

/* threads = total participants including the caller (>= 1). NULL on error (message set). */
dt_pool *dt_pool_create(int threads);
void dt_pool_destroy(dt_pool *p);
int dt_pool_threads(const dt_pool *p);
void dt_pool_run(dt_pool *p, int64_t n, int64_t grain, dt_pool_fn fn, void *ctx);

#endif
