/* cuda_transfer.cu — host <-> device copies of the CUDA backend: upload / download through page-locked staging
 * buffers (one per direction, grown on demand), and sync (joins the prefetch stream, reports device errors). */
#include "cuda_common.cuh"

/* Pinned host staging for transfers of up to PINNED_MAX bytes: a copy from pageable memory runs at ~6 GB/s
 * (the driver stages it itself), from page-locked memory at the link's speed. One buffer per direction, grown
 * on demand; before the upload buffer is refilled, the transfer that last read it must have finished. */
#define PINNED_MAX ((size_t)64 << 20)
static void *pinned_get(dtc_pinned *b, size_t bytes) {
    if (b->pending) {
        CK(cudaEventSynchronize(b->ev));
        b->pending = 0;
    }
    if (bytes > b->size) {
        if (b->p) CK(cudaFreeHost(b->p));
        b->p = nullptr;
        b->size = 0;
        if (cudaHostAlloc(&b->p, bytes, cudaHostAllocDefault) != cudaSuccess) {   /* no pinned memory: pageable */
            cudaGetLastError();
            b->p = nullptr;
            return nullptr;
        }
        b->size = bytes;
    }
    if (!b->ev) CK(cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming));
    return b->p;
}
void dtc_pinned_release(dtc_pinned *b) {
    if (b->pending) cudaEventSynchronize(b->ev);
    if (b->p) cudaFreeHost(b->p);
    if (b->ev) cudaEventDestroy(b->ev);
    memset(b, 0, sizeof *b);
}

/* host src -> device dst (bytes), through the pinned buffer when it fits */
static void h2d(dtc_state *st, void *dst, const void *src, size_t bytes) {
    void *p = (!st->capturing && bytes <= PINNED_MAX) ? pinned_get(&st->pin_up, bytes) : nullptr;
    if (!p) {
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->q.stream));
        return;
    }
    memcpy(p, src, bytes);
    CK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, st->q.stream));
    CK(cudaEventRecord(st->pin_up.ev, st->q.stream));
    st->pin_up.pending = 1;
}
/* device src -> host dst (bytes), synchronizing the stream */
static void d2h_sync(dtc_state *st, void *dst, const void *src, size_t bytes) {
    dtc_prefetch_join(st);
    void *p = bytes <= PINNED_MAX ? pinned_get(&st->pin_down, bytes) : nullptr;
    CK(cudaMemcpyAsync(p ? p : dst, src, bytes, cudaMemcpyDeviceToHost, st->q.stream));
    CK(cudaStreamSynchronize(st->q.stream));
    if (p) memcpy(dst, p, bytes);
}

void dtc_upload(dt_backend *be, dt_mat m, const float *src) {
    dtc_state *st = dtc(be);
    if (m.rows <= 0 || m.cols <= 0) return;
    size_t n = (size_t)m.rows * (size_t)m.cols;
    if (m.dtype == DT_F32 && m.ld == m.cols) {
        h2d(st, m.data, src, n * 4);
        return;
    }
    float *tmp = (float *)dtc_pool_alloc(st, n * 4);
    if (!tmp) { fprintf(stderr, "ditrun: cuda: %s\n", dt_last_error()); exit(1); }
    h2d(st, tmp, src, n * 4);
    dt_mat s = {tmp, m.rows, m.cols, m.cols, DT_F32};
    dtc_copy(be, m, s);
    dtc_pool_free(st, tmp);
}

void dtc_download(dt_backend *be, float *dst, dt_mat m) {
    dtc_state *st = dtc(be);
    if (m.rows <= 0 || m.cols <= 0) return;
    size_t n = (size_t)m.rows * (size_t)m.cols;
    if (m.dtype == DT_F32 && m.ld == m.cols) {
        d2h_sync(st, dst, m.data, n * 4);
        return;
    }
    float *tmp = (float *)dtc_pool_alloc(st, n * 4);
    if (!tmp) { fprintf(stderr, "ditrun: cuda: %s\n", dt_last_error()); exit(1); }
    dt_mat d = {tmp, m.rows, m.cols, m.cols, DT_F32};
    dtc_copy(be, d, m);
    d2h_sync(st, dst, tmp, n * 4);
    dtc_pool_free(st, tmp);
}

/* dst[p, ch] = dt_image_u8(x[ch, p]) for the 3 channel rows of x, the host formula operation for operation:
 * v * 0.5 is exact (as v / 2), so v * 0.5 + 0.5 rounds once whether or not it is fused; then · 255 and
 * round-half-even. */
__global__ void k_image_rgb8(uint8_t *dst, dmat x, int64_t hw) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < hw; p += (int64_t)gridDim.x * blockDim.x)
#pragma unroll
        for (int ch = 0; ch < 3; ch++) {
            float f = __fadd_rn(__fmul_rn(dm_get(x, ch, p), 0.5f), 0.5f);
            if (!(f >= 0.0f)) f = 0.0f;
            if (f > 1.0f) f = 1.0f;
            dst[p * 3 + ch] = (uint8_t)rintf(__fmul_rn(f, 255.0f));
        }
}

void dtc_image_rgb8(dt_backend *be, uint8_t *dst, dt_mat x) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.rows == 3, "image_rgb8: x is [%lld,%lld], expected 3 channel rows", (long long)x.rows,
                (long long)x.cols);
    const int64_t hw = x.cols;
    if (hw <= 0) return;
    uint8_t *d = (uint8_t *)dtc_pool_alloc(st, (size_t)hw * 3);
    if (!d) { fprintf(stderr, "ditrun: cuda: %s\n", dt_last_error()); exit(1); }
    int64_t b = (hw + 255) / 256;
    if (b > (int64_t)st->sm_count * 16) b = (int64_t)st->sm_count * 16;
    k_image_rgb8<<<(unsigned)b, 256, 0, st->q.stream>>>(d, dtc_dm(x), hw);
    CK_LAUNCH("image_rgb8");
    d2h_sync(st, dst, d, (size_t)hw * 3);
    dtc_pool_free(st, d);
}

int dtc_sync(dt_backend *be) {
    dtc_prefetch_join(dtc(be));
    cudaError_t e = cudaStreamSynchronize(dtc(be)->q.stream);
    if (e != cudaSuccess) {
        dt_set_error("cuda: stream synchronize failed: %s", cudaGetErrorString(e));
        return -1;
    }
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        dt_set_error("cuda: device error: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
