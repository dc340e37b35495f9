/* image_budget.h — the server-wide budget of decoded image bytes held by edit requests, from their uploads' decoding
 * until their job is freed (queued, running, or answering). An edit reserves what its images will decode to (from
 * their headers, before any pixel is decoded); a reservation past the budget is refused, so that queued edits cannot
 * multiply a small body into gigabytes (16 references of 4096² RGBA are 1 GiB from a 1 MB upload). */
#ifndef DT_SERVE_IMAGE_BUDGET_H
#define DT_SERVE_IMAGE_BUDGET_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    pthread_mutex_t mu;
    int64_t max;        /* bytes at most (--max-queued-image-bytes) */
    int64_t held;       /* bytes reserved now */
    int64_t peak;       /* the most ever reserved at once */
} dt_image_budget;

void dt_image_budget_init(dt_image_budget *b, int64_t max);
void dt_image_budget_destroy(dt_image_budget *b);
/* Reserve bytes: 0 ok; -1 the budget is spent for now (others hold it: retry later); -2 bytes alone are over it. */
int dt_image_budget_reserve(dt_image_budget *b, int64_t bytes);
void dt_image_budget_release(dt_image_budget *b, int64_t bytes);
/* Bytes reserved now and at most so far. */
void dt_image_budget_counts(dt_image_budget *b, int64_t *held, int64_t *peak);

#endif
