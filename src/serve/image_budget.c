/* image_budget.c — the server-wide budget of decoded image bytes (image_budget.h). */
#include "serve/image_budget.h"

#include <string.h>

void dt_image_budget_init(dt_image_budget *b, int64_t max) {
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    b->max = max;
}

void dt_image_budget_destroy(dt_image_budget *b) { pthread_mutex_destroy(&b->mu); }

int dt_image_budget_reserve(dt_image_budget *b, int64_t bytes) {
    if (bytes > b->max) return -2;
    pthread_mutex_lock(&b->mu);
    int rc = b->held + bytes > b->max ? -1 : 0;
    if (rc == 0) {
        b->held += bytes;
        if (b->held > b->peak) b->peak = b->held;
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

void dt_image_budget_release(dt_image_budget *b, int64_t bytes) {
    if (bytes <= 0) return;
    pthread_mutex_lock(&b->mu);
    b->held -= bytes;
    pthread_mutex_unlock(&b->mu);
}

void dt_image_budget_counts(dt_image_budget *b, int64_t *held, int64_t *peak) {
    pthread_mutex_lock(&b->mu);
    *held = b->held;
    *peak = b->peak;
    pthread_mutex_unlock(&b->mu);
}
