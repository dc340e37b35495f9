/* sse.h — a job's progress as Server-Sent Events (text/event-stream): "progress" after each step of each image,
 * "image" with each finished image, then "done" (or "error"); before the job starts, "queued" with its place in line
 * (sent when it starts waiting and each time the place changes). Each event's data is one line of JSON. */
#ifndef DT_SERVE_SSE_H
#define DT_SERVE_SSE_H

#include <stddef.h>
#include <stdint.h>

#include "serve/api.h"
#include "serve/strbuf.h"

/* event: queued    data: {"type": "queued", "position": p (1 = next), "running": jobs the workers run now} */
void dt_sse_queued(dt_strbuf *o, int position, int running);
/* event: progress  data: {"type": "progress", "index": i, "n": n, "step": s, "steps": S, "elapsed": seconds} */
void dt_sse_progress(dt_strbuf *o, int index, int n, int step, int steps, double elapsed);
/* event: image     data: {"type": "image", "index": i, "seed": seed, "output_format": format, "b64_json": bytes} */
void dt_sse_image(dt_strbuf *o, int index, uint64_t seed, const char *format, const uint8_t *img, size_t len);
/* event: done      data: {"type": "done", "created": T, "n": n, "seconds": server-side seconds} */
void dt_sse_done(dt_strbuf *o, long long created, int n, double seconds);
/* event: error     data: {"type": "error", "error": {...}} */
void dt_sse_error(dt_strbuf *o, const dt_api_error *e);

#endif
