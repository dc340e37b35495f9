/* sse.c — Server-Sent Events of a job (sse.h). */
#include "serve/sse.h"

void dt_sse_queued(dt_strbuf *o, int position, int running) {
    sb_printf(o, "event: queued\ndata: {\"type\": \"queued\", \"position\": %d, \"running\": %d}\n\n", position, running);
}

void dt_sse_progress(dt_strbuf *o, int index, int n, int step, int steps, double elapsed) {
    sb_printf(o, "event: progress\ndata: {\"type\": \"progress\", \"index\": %d, \"n\": %d, \"step\": %d, \"steps\": %d, "
                 "\"elapsed\": %.4f}\n\n", index, n, step, steps, elapsed);
}

void dt_sse_image(dt_strbuf *o, int index, uint64_t seed, const char *format, const uint8_t *img, size_t len) {
    sb_printf(o, "event: image\ndata: {\"type\": \"image\", \"index\": %d, \"seed\": %llu, \"output_format\": \"%s\", "
                 "\"b64_json\": \"", index, (unsigned long long)seed, format);
    sb_base64(o, img, len);
    sb_puts(o, "\"}\n\n");
}

void dt_sse_done(dt_strbuf *o, long long created, int n, double seconds) {
    sb_printf(o, "event: done\ndata: {\"type\": \"done\", \"created\": %lld, \"n\": %d, \"seconds\": %.4f}\n\n", created,
              n, seconds);
}

void dt_sse_error(dt_strbuf *o, const dt_api_error *e) {
    dt_strbuf j;
    sb_init(&j);
    dt_api_error_json(&j, e);
    while (j.len && j.data[j.len - 1] == '\n') j.data[--j.len] = 0;   /* one data line */
    sb_puts(o, "event: error\ndata: {\"type\": \"error\", ");
    sb_putn(o, j.data + 1, j.len - 1);   /* the error object's members, after its opening brace */
    sb_puts(o, "\n\n");
    sb_free(&j);
}
