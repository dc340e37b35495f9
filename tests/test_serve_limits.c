/* test_serve_limits.c — `ditrun serve` against memory and time abuse, on real servers of $BUILD/ditrun (the bundled
 * tiny model on the CPU, ephemeral ports, curl): decompression bombs (8192² PNGs of 0.2 MB each, eight at once) are
 * refused from their headers with the server's peak resident memory (VmHWM) nearly flat; queued big edits are held to
 * --max-queued-image-bytes (429 with Retry-After past it, 413 for one edit alone over it, the budget given back when
 * a job goes away), the peak memory within the budget; a cancelled big job frees the worker within about one DiT
 * block instead of the rest of its step. */
#include <png.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_helpers.h"
#include "bomb_png.h"
#include "test.h"

/* Eight refused bombs may raise the server's peak memory by at most this: the uploads' bytes (0.2 MB each, a few
 * copies), the connection threads' stacks and arenas; one decoded bomb would be 192 MiB. */
#define BOMB_HWM_TOL_MB 64
#define BOMBS 8
/* The budget of the queued-edits test, and what one accepted edit holds (3 images of 4096² RGB, 48 MiB each). */
#define BUDGET_MB 160
#define EDIT_IMAGES 3
/* Past the images an accepted edit holds, the peak memory may grow by this: the forms' bytes, the connection threads,
 * the allocator's arenas; each refused edit would add 144 MiB without the budget. */
#define BUDGET_HWM_TOL_MB 48
/* After a cancel, the worker takes the next request within this fraction of a step: it finishes the block it is in
 * (the tiny model has 3 blocks a step: about a third) instead of the rest of the step (without the per-block check it
 * waited 0.9 of a step); the rest is headroom for a loaded machine. */
#define CANCEL_STEP_FRAC 0.5
/* Also allowed after a cancel: the waiting HTTP thread notices the client is gone within a 50 ms slice, curl starts. */
#define CANCEL_SLACK_S 1.0
/* The cancelled job's size: large enough that one step takes seconds on one thread. */
#define CANCEL_SIDE 512

/* A /proc/PID/status field in kB (VmHWM, VmRSS), or -1. */
static long status_kb(pid_t pid, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = atol(line + n + 1);
    if (f) fclose(f);
    return kb;
}

/* The bomb (bomb_png.h) of w x h as a file. 0 ok. */
static int zero_png(const char *path, int w, int h) {
    size_t n = 0;
    uint8_t *b = bomb_png(w, h, &n);
    FILE *f = b ? fopen(path, "wb") : NULL;
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f && fclose(f)) ok = 0;
    free(b);
    return ok ? 0 : -1;
}

/* `sh -c cmd` in the background; *out_fd (when given) reads its stdout. Its pid. */
static pid_t spawn(const char *cmd, int *out_fd) {
    int fd[2] = {-1, -1};
    if (out_fd && pipe(fd)) return -1;
    pid_t p = fork();
    if (p == 0) {
        if (out_fd) {
            dup2(fd[1], 1);
            close(fd[0]);
            close(fd[1]);
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (out_fd) {
        close(fd[1]);
        *out_fd = fd[0];
    }
    return p;
}

static void stop(pid_t p) {
    if (p <= 0) return;
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

/* A streamed generation of side x side and steps in the background (curl -N; its events on *out_fd when given). */
static pid_t generation(const server *s, int side, int steps, int *out_fd) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec curl -s -N %s -X POST -H 'Content-Type: application/json' --data-binary '{\"prompt\": "
             "\"slow\", \"size\": \"%dx%d\", "
             "\"steps\": %d, \"stream\": true}' http://127.0.0.1:%d/v1/images/generations", out_fd ? "" : "-o /dev/null",
             side, side, steps, s->port);
    return spawn(cmd, out_fd);
}

/* curl arguments of an edit with k copies of image: -F 'image[]=@IMAGE' ... -F prompt=x -F steps=1 */
static void edit_form(char *out, size_t n, const char *image, int k) {
    size_t o = 0;
    for (int i = 0; i < k && o < n; i++) o += (size_t)snprintf(out + o, n - o, "-F 'image[]=@%s' ", image);
    if (o < n) snprintf(out + o, n - o, "-F prompt=x -F steps=1");
}

static void test_bombs(void) {
    char bomb[600], cmd[2048], codes[600];
    snprintf(bomb, sizeof bomb, "%s/bomb.png", serve_tmp);
    snprintf(codes, sizeof codes, "%s/bomb.codes", serve_tmp);
    if (zero_png(bomb, 8192, 8192)) { T_FAIL("serve bombs: write the bomb", "libpng failed"); return; }
    server s;
    if (server_start(&s, "bombs", "") || server_ready(&s)) { T_FAIL("serve bombs: start", "see %s", s.log); return; }
    long hwm0 = status_kb(s.pid, "VmHWM");
    snprintf(cmd, sizeof cmd, "seq %d | xargs -P %d -I{} curl -s -m 60 -o /dev/null -w '%%{http_code}\\n' -F "
             "'image[]=@%s' -F prompt=x -F steps=1 http://127.0.0.1:%d/v1/images/edits > %s", BOMBS, BOMBS, bomb, s.port,
             codes);
    int sys = system(cmd);
    long hwm1 = status_kb(s.pid, "VmHWM");
    char *t = t_slurp(codes, NULL);
    int n400 = 0;
    for (char *l = t ? strtok(t, "\n") : NULL; l; l = strtok(NULL, "\n")) n400 += !strcmp(l, "400");
    free(t);
    char *body = NULL;
    char form[1200];
    snprintf(form, sizeof form, "-F 'image[]=@%s' -F prompt=x -F steps=1", bomb);
    int code = http(&s, "POST", "/v1/images/edits", NULL, form, &body, NULL);
    T_CHECK("serve bombs: an 8192² PNG bomb -> 400 naming the per-image limit",
            code == 400 && body && strstr(body, "too large") && strstr(body, "16777216"), "status %d: %s", code,
            body ? body : "");
    free(body);
    char name[300];
    snprintf(name, sizeof name, "serve bombs: %d at once -> %d x 400, peak memory %+ld kB < %d MB (refused from the "
             "header)", BOMBS, n400, hwm1 - hwm0, BOMB_HWM_TOL_MB);
    T_CHECK(name, sys == 0 && n400 == BOMBS && hwm0 > 0 && hwm1 - hwm0 < BOMB_HWM_TOL_MB * 1024L,
            "%d of %d answered 400, VmHWM %ld -> %ld kB", n400, BOMBS, hwm0, hwm1);
    T_CHECK("serve bombs: server stops with 0", server_stop(&s) == 0, "see %s", s.log);
    unlink(bomb);
    unlink(codes);
}

static void test_image_budget(void) {
    char img[600], extra[200], form[4096];
    snprintf(img, sizeof img, "%s/big4096.png", serve_tmp);
    if (zero_png(img, 4096, 4096)) { T_FAIL("serve budget: write the image", "libpng failed"); return; }
    snprintf(extra, sizeof extra, "--max-queued-image-bytes %lld --max-queue 8 --max-steps 1000",
             (long long)BUDGET_MB << 20);
    server s;
    if (server_start(&s, "budget", extra) || server_ready(&s)) { T_FAIL("serve budget: start", "see %s", s.log); return; }
    /* the worker busy with a long generation (1000 steps, ~60 s on 2 cores: it must outlast every edit below, or a
     * re-sent edit runs at once instead of queueing; it is cancelled at the end); one edit of 3 x 48 MiB waits in the
     * queue */
    pid_t slow = generation(&s, 128, 1000, NULL);
    int running = wait_metric(&s, "ditrun_jobs_running", 1, 30000);
    long hwm0 = status_kb(s.pid, "VmHWM");
    char cmd[4600];
    edit_form(form, sizeof form, img, EDIT_IMAGES);
    snprintf(cmd, sizeof cmd, "exec curl -s -o /dev/null %s http://127.0.0.1:%d/v1/images/edits", form, s.port);
    pid_t e1 = spawn(cmd, NULL);
    int queued = wait_metric(&s, "ditrun_queue_depth", 1, 30000);
    /* more of the same: the budget is spent (429 with Retry-After); one edit of 4 x 48 MiB alone is over it (413) */
    int n429 = 0, ra = 1, named = 1;
    for (int i = 0; i < 3; i++) {
        char *body = NULL, *hdr = NULL;
        int code = http(&s, "POST", "/v1/images/edits", NULL, form, &body, &hdr);
        n429 += code == 429;
        ra &= hdr && strcasestr(hdr, "Retry-After:") != NULL;
        named &= body && strstr(body, "--max-queued-image-bytes") && strstr(body, "\"error\"");
        free(body);
        free(hdr);
    }
    T_CHECK("serve budget: edits past --max-queued-image-bytes -> 429 with Retry-After and a JSON error naming it",
            running && queued && n429 == 3 && ra && named, "running %d queued %d, %d x 429, Retry-After %d, named %d",
            running, queued, n429, ra, named);
    char big[4096], *body = NULL;
    edit_form(big, sizeof big, img, EDIT_IMAGES + 1);
    int code = http(&s, "POST", "/v1/images/edits", NULL, big, &body, NULL);
    T_CHECK("serve budget: one edit whose images alone are over the budget -> 413 with a JSON error",
            code == 413 && body && strstr(body, "--max-queued-image-bytes"), "status %d: %s", code, body ? body : "");
    free(body);
    long hwm1 = status_kb(s.pid, "VmHWM");
    const long held_kb = (long)EDIT_IMAGES * 4096 * 4096 * 3 / 1024;
    char name[300];
    snprintf(name, sizeof name, "serve budget: peak memory %+ld kB through 5 big edits < the queued one's %ld kB + %d MB",
             hwm1 - hwm0, held_kb, BUDGET_HWM_TOL_MB);
    T_CHECK(name, hwm0 > 0 && hwm1 - hwm0 < held_kb + BUDGET_HWM_TOL_MB * 1024L, "VmHWM %ld -> %ld kB", hwm0, hwm1);
    /* the queued edit's client goes away: its images' bytes are given back, the same edit is accepted again */
    stop(e1);
    int cancelled = wait_metric(&s, "ditrun_jobs_cancelled_total", 1, 30000);
    pid_t e2 = spawn(cmd, NULL);
    int requeued = wait_metric(&s, "ditrun_queue_depth", 1, 30000);
    T_CHECK("serve budget: a cancelled edit gives its bytes back (the same edit is queued again)", cancelled && requeued,
            "cancelled %d, queued again %d", cancelled, requeued);
    stop(e2);
    stop(slow);
    wait_metric(&s, "ditrun_jobs_cancelled_total", 3, 60000);
    T_CHECK("serve budget: server stops with 0", server_stop(&s) == 0, "see %s", s.log);
    unlink(img);
}

/* Read the event stream on fd until the progress event of step 1: its "elapsed" seconds, or -1. */
static double first_step(int fd) {
    FILE *f = fdopen(fd, "r");
    char line[4096];
    double el = -1;
    while (f && el < 0 && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step\": 1,");
        const char *e = p ? strstr(p, "\"elapsed\": ") : NULL;
        if (e) el = atof(e + strlen("\"elapsed\": "));
    }
    if (f) fclose(f);
    return el;
}

static void test_cancel_in_step(void) {
    server s;
    if (server_start(&s, "cancel", "") || server_ready(&s)) { T_FAIL("serve cancel: start", "see %s", s.log); return; }
    const char *small = "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}";
    double t0 = dt_now();
    int c0 = http(&s, "POST", "/v1/images/generations", small, NULL, NULL, NULL);
    double t_small = dt_now() - t0;
    /* a 2-step job: cancelled right after its first step's progress event, inside its second step */
    int fd = -1;
    pid_t big = generation(&s, CANCEL_SIDE, 2, &fd);
    double t_step = first_step(fd);
    double t_cancel = dt_now();
    stop(big);
    int code = http(&s, "POST", "/v1/images/generations", small, NULL, NULL, NULL);
    double waited = dt_now() - t_cancel;
    int cancelled = metric(&s, "ditrun_jobs_cancelled_total") >= 1;
    double bound = CANCEL_STEP_FRAC * t_step + t_small + CANCEL_SLACK_S;
    char name[300];
    snprintf(name, sizeof name, "serve cancel: a %d² job cancelled in its step (%.1f s a step) frees the worker: the next "
             "request done %.2f s after the cancel < %.2f s (%.1f of a step + %.2f s + %.1f s)", CANCEL_SIDE, t_step,
             waited, bound, CANCEL_STEP_FRAC, t_small, CANCEL_SLACK_S);
    T_CHECK(name, c0 == 200 && t_step > 0 && code == 200 && cancelled && waited < bound,
            "status %d/%d, step %.2f s, cancelled %d", c0, code, t_step, cancelled);
    T_CHECK("serve cancel: server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

int main(void) {
    serve_setup();
    if (access(serve_exe, X_OK)) { T_SKIP("serve limits", "%s not built", serve_exe); return T_DONE(); }
    if (system("curl --version >/dev/null 2>&1")) { T_SKIP("serve limits", "curl is not installed"); return T_DONE(); }
    if (t_tmpdir(serve_tmp, sizeof serve_tmp, "serve_limits")) { T_FAIL("serve limits: tmpdir", "failed"); return T_DONE(); }
    test_bombs();
    test_image_budget();
    test_cancel_in_step();
    if (!t_failed) t_rmtree(serve_tmp);
    return T_DONE();
}
