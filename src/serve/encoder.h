/* encoder.h — a worker's image encoder: one thread that turns each finished image's pixels into the bytes the
 * request asked for (output_format / output_compression, image/image_out.h, with the generation's parameters as
 * text), while the worker's next image runs on the device. It publishes the bytes in the job (and a stream's image
 * event), then ends the job (state, the stream's done or error event, the log line) once every image handed over
 * before the end is encoded. The only place served images are encoded. */
#ifndef DT_SERVE_ENCODER_H
#define DT_SERVE_ENCODER_H

#include "serve/queue.h"

typedef struct dt_server dt_server;
typedef struct dt_encoder dt_encoder;

/* Start the encoder of worker `worker` (its index, for the log). NULL and the error set when no thread starts. */
dt_encoder *dt_encoder_start(dt_server *s, int worker);
/* Hand over image i of j: rgb [h, w, 3] (taken), made with `steps` steps. Waits while DT_ENCODER_BACKLOG images
 * are pending (bounded memory when the encoder is slower than the device). */
void dt_encoder_image(dt_encoder *e, dt_job *j, int i, uint8_t *rgb, int w, int h, int steps);
/* End j as `end` (DONE, FAILED with j->error set, CANCELLED) after its images handed over so far. */
void dt_encoder_end(dt_encoder *e, dt_job *j, dt_job_state end);
/* Finish what was handed over, then stop the thread and free e. */
void dt_encoder_stop(dt_encoder *e);

#define DT_ENCODER_BACKLOG 2

#endif
