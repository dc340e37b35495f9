/* cuda_image.cu — image ops for the VAE on the GPU. Images are [C, H*W] (channel-major rows).
 *   conv2d      stride 1, same-size output: up to 4 output channels (conv_out) a direct kernel; 1x1 convs are one
 *               cuBLASLt GEMM on the input directly; k x k convs
 *               build im2col columns (bf16, in chunks of pixels to bound memory) and run a cuBLASLt GEMM
 *               y[cout, P] = W[cout, cin*k*k] · col[cin*k*k, P]; bias added per output channel.
 *   conv2d_strided  the same with any stride and per-side zero padding (im2col over output pixels).
 *   group_norm  fp32 partial sums per (group, chunk) block, combined in double, then one normalise pass
 *               (gamma/beta, optional fused SiLU).
 *   upsample2x  nearest neighbour.
 *   channel_rmsnorm  one thread per pixel walks the channels twice (sum of squares in fp32, then scale); a warp
 *               reads 32 neighbouring pixels of one channel row, so every load is coalesced. */
#include <math.h>

#include "cuda_common.cuh"

struct dt_conv {
    int cout, cin, k, pad;
    __nv_bfloat16 *w;  /* [cout, cin*k*k] */
    float *bias;       /* [cout] or NULL */
};

dt_conv *dtc_conv_create(dt_backend *be, const float *w, const float *bias, int cout, int cin, int k, int pad) {
    dtc_state *st = dtc(be);
    if (cout <= 0 || cin <= 0 || k <= 0 || pad < 0) {
        dt_set_error("cuda: conv_create: bad shape cout=%d cin=%d k=%d pad=%d", cout, cin, k, pad);
        return NULL;
    }
    dt_conv *c = (dt_conv *)calloc(1, sizeof(dt_conv));
    if (!c) { dt_set_error("cuda: out of host memory"); return NULL; }
    c->cout = cout; c->cin = cin; c->k = k; c->pad = pad;
    size_t n = (size_t)cout * cin * k * k;
    c->w = (__nv_bfloat16 *)dtc_pool_alloc(st, n * 2);
    if (!c->w) { free(c); return NULL; }
    uint16_t *hb = (uint16_t *)malloc(n * 2);
    if (!hb) { dt_set_error("cuda: out of host memory"); dtc_pool_free(st, c->w); free(c); return NULL; }
    for (size_t i = 0; i < n; i++) hb[i] = dt_f32_to_bf16(w[i]);
    CK(cudaMemcpyAsync(c->w, hb, n * 2, cudaMemcpyHostToDevice, st->q.stream));
    if (bias) {
        c->bias = (float *)dtc_pool_alloc(st, (size_t)cout * 4);
        if (!c->bias) { CK(cudaStreamSynchronize(st->q.stream)); free(hb); dtc_pool_free(st, c->w); free(c); return NULL; }
        CK(cudaMemcpyAsync(c->bias, bias, (size_t)cout * 4, cudaMemcpyHostToDevice, st->q.stream));
    }
    CK(cudaStreamSynchronize(st->q.stream));
    free(hb);
    return c;
}

void dtc_conv_destroy(dt_backend *be, dt_conv *c) {
    if (!c) return;
    dtc_pool_free(dtc(be), c->w);
    dtc_pool_free(dtc(be), c->bias);
    free(c);
}

/* col[kidx, p] (ld = ldc) for output pixels p0 .. p0+np-1 of a Wo-wide output; kidx = (ci*k + kh)*k + kw; the
 * source pixel is (py*stride + kh - pt, px*stride + kw - pl), zero outside the H x W input. */
__global__ void k_im2col(__nv_bfloat16 *col, int64_t ldc, dmat x, int cin, int k, int stride, int pt, int pl, int H,
                         int W, int Wo, int64_t p0, int64_t np) {
    int64_t total = (int64_t)cin * k * k * np;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t kidx = i / np, p = i - kidx * np;
        int kw = (int)(kidx % k), kh = (int)((kidx / k) % k), ci = (int)(kidx / (k * k));
        int64_t pix = p0 + p;
        int py = (int)(pix / Wo), px = (int)(pix - (int64_t)py * Wo);
        int sy = py * stride + kh - pt, sx = px * stride + kw - pl;
        float v = 0.f;
        if (sy >= 0 && sy < H && sx >= 0 && sx < W) v = dm_get(x, ci, (int64_t)sy * W + sx);
        col[kidx * ldc + p] = __float2bfloat16_rn(v);
    }
}

/* Vectorised im2col for bf16 input rows and W % 8 == 0: block row blockIdx.y = kidx (< 65536), each thread writes 8
 * consecutive pixels (one 16-byte store) of the band; one division per 8 outputs. */
__global__ void k_im2col8(__nv_bfloat16 *col, int64_t ldc, const __nv_bfloat16 *x, int64_t ldx, int k, int pad, int H,
                          int W, int64_t p0, int64_t np) {
    const int kidx = blockIdx.y;
    const int kw = kidx % k, kh = (kidx / k) % k, ci = kidx / (k * k);
    const __nv_bfloat16 *xr = x + (int64_t)ci * ldx;
    __nv_bfloat16 *cr = col + (int64_t)kidx * ldc;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o * 8 < np; o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pix = p0 + o * 8;
        const int py = (int)(pix / W), px = (int)(pix - (int64_t)py * W);
        const int sy = py + kh - pad;
        union {
            uint4 u;
            unsigned short h[8];
        } v;
        v.u = make_uint4(0, 0, 0, 0);
        if (sy >= 0 && sy < H) {
            const unsigned short *src = (const unsigned short *)xr + (int64_t)sy * W;
            const int sx0 = px + kw - pad;
            if (sx0 >= 0 && sx0 + 8 <= W) {
#pragma unroll
                for (int j = 0; j < 8; j++) v.h[j] = src[sx0 + j];
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    int sx = sx0 + j;
                    v.h[j] = (sx >= 0 && sx < W) ? src[sx] : (unsigned short)0;
                }
            }
        }
        *(uint4 *)(cr + o * 8) = v.u;
    }
}

/* Direct convolution for a few output channels (the VAE's conv_out: 3): one thread per output pixel, all CO
 * channels, weights in shared memory as f32 [CO, cin·k·k]. An im2col GEMM with N = 3 pays the whole column
 * buffer for almost no arithmetic (1.9 ms at 1024² and 128 inputs; this reads the input from cache). */
template <int CO>
__global__ void k_conv_small_cout(dmat y, const __nv_bfloat16 *x, int64_t ldx, const __nv_bfloat16 *wgt,
                                  const float *bias, int cin, int k, int pad, int H, int W) {
    extern __shared__ float ws[];
    const int K = cin * k * k;
    for (int i = threadIdx.x; i < CO * K; i += blockDim.x) ws[i] = __bfloat162float(wgt[i]);
    __syncthreads();
    const int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (p >= (int64_t)H * W) return;
    const int py = (int)(p / W), px = (int)(p - (int64_t)py * W);
    float acc[CO];
#pragma unroll
    for (int o = 0; o < CO; o++) acc[o] = bias ? bias[o] : 0.f;
    for (int ci = 0; ci < cin; ci++) {
        const __nv_bfloat16 *xc = x + (int64_t)ci * ldx;
        for (int kh = 0; kh < k; kh++) {
            const int sy = py + kh - pad;
            if (sy < 0 || sy >= H) continue;
            for (int kw = 0; kw < k; kw++) {
                const int sx = px + kw - pad;
                if (sx < 0 || sx >= W) continue;
                const float v = __bfloat162float(xc[(int64_t)sy * W + sx]);
                const int t = (ci * k + kh) * k + kw;
#pragma unroll
                for (int o = 0; o < CO; o++) acc[o] = fmaf(ws[o * K + t], v, acc[o]);
            }
        }
    }
#pragma unroll
    for (int o = 0; o < CO; o++) dm_set(y, o, p, acc[o]);
}

template <int CO>
static void conv_small_cout(dtc_state *st, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int pad) {
    const int64_t HW = (int64_t)h * w;
    const size_t smem = (size_t)CO * c->cin * c->k * c->k * sizeof(float);
    k_conv_small_cout<CO><<<(unsigned)((HW + 255) / 256), 256, smem, st->q.stream>>>(
        dtc_dm(y), (const __nv_bfloat16 *)x.data, x.ld, c->w, c->bias, c->cin, c->k, pad, h, w);
    CK_LAUNCH("conv_small_cout");
}

/* y [cout, ho*wo] = conv(x [cin, h*w]) with stride s and zero padding pt/pl/pb/pr. */
static void conv_run(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int s, int pt, int pl, int pb,
                     int pr) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(s >= 1 && pt >= 0 && pl >= 0 && pb >= 0 && pr >= 0, "conv2d: stride %d pads %d %d %d %d", s, pt, pl,
                pb, pr);
    const int ho = h + pt + pb >= c->k ? (h + pt + pb - c->k) / s + 1 : 0;
    const int wo = w + pl + pr >= c->k ? (w + pl + pr - c->k) / s + 1 : 0;
    const int64_t HW = (int64_t)h * w, HWo = (int64_t)ho * wo;
    DTC_REQUIRE(h > 0 && w > 0 && ho > 0 && wo > 0, "conv2d: %dx%d image, k=%d stride %d pads %d %d %d %d", h, w, c->k,
                s, pt, pl, pb, pr);
    DTC_REQUIRE(x.rows == c->cin && x.cols == HW, "conv2d: x is [%lld,%lld], expected [%d,%lld]", (long long)x.rows,
                (long long)x.cols, c->cin, (long long)HW);
    DTC_REQUIRE(y.rows == c->cout && y.cols == HWo, "conv2d: y is [%lld,%lld], expected [%d,%lld]", (long long)y.rows,
                (long long)y.cols, c->cout, (long long)HWo);
    DTC_REQUIRE(y.dtype == DT_BF16 || y.dtype == DT_F32, "conv2d: y dtype %s", dt_dtype_name(y.dtype));
    const int same = s == 1 && ho == h && wo == w && pt == pl && pl == pb && pb == pr;
    const int64_t K = (int64_t)c->cin * c->k * c->k;
    if (same && c->cout <= 4 && c->k > 1 && x.dtype == DT_BF16 && (size_t)c->cout * K * sizeof(float) <= 48 * 1024 &&
        HW / 256 < 0x7fffffff) {
        switch (c->cout) {
        case 1: conv_small_cout<1>(st, y, x, c, h, w, pt); break;
        case 2: conv_small_cout<2>(st, y, x, c, h, w, pt); break;
        case 3: conv_small_cout<3>(st, y, x, c, h, w, pt); break;
        default: conv_small_cout<4>(st, y, x, c, h, w, pt); break;
        }
        return;   /* bias added inside */
    }
    if (c->k == 1 && same && pt == 0 && x.dtype == DT_BF16) {
        /* yᵀ[HW, cout] = xᵀ[HW, cin] · Wᵀ[cin, cout] */
        dtc_gemm(st, 0, 0, HW, c->cout, K, x.data, x.ld, c->w, K, y.data, y.ld, y.dtype, 1.f, nullptr);
    } else {
        int64_t P = ((int64_t)1 << 27) / K;  /* <= 256 MB of bf16 columns */
        if (P > HWo) P = HWo;
        P = (P + 7) / 8 * 8;
        if (P < 64) P = 64;
        __nv_bfloat16 *col = (__nv_bfloat16 *)dtc_scratch_get(st, &st->s_conv, (size_t)K * P * 2);
        /* bf16 input, same-size stride-1 conv, rows of whole 8-pixel groups: the vectorised im2col (bands start at
         * multiples of 8) */
        const int vec = same && x.dtype == DT_BF16 && w % 8 == 0 && K < 65536 && dtc_aligned16(x.data) && x.ld % 8 == 0;
        for (int64_t p0 = 0; p0 < HWo; p0 += P) {
            int64_t np = HWo - p0 < P ? HWo - p0 : P;
            int64_t total = K * np;
            int64_t b = (total + 255) / 256;
            if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
            if (vec) {
                int64_t octs = np / 8, bx = (octs + 255) / 256;
                int64_t maxbx = ((int64_t)st->sm_count * 16 + K - 1) / K;   /* blocks loop over the band beyond */
                if (maxbx < 1) maxbx = 1;
                if (bx > maxbx) bx = maxbx;
                k_im2col8<<<dim3((unsigned)bx, (unsigned)K), 256, 0, st->q.stream>>>(
                    col, P, (const __nv_bfloat16 *)x.data, x.ld, c->k, pt, h, w, p0, np);
            } else {
                k_im2col<<<(unsigned)b, 256, 0, st->q.stream>>>(col, P, dtc_dm(x), c->cin, c->k, s, pt, pl, h, w, wo,
                                                                   p0, np);
            }
            CK_LAUNCH("im2col");
            void *yp = (char *)y.data + (size_t)p0 * dt_dtype_size(y.dtype);
            dtc_gemm(st, 0, 0, np, c->cout, K, col, P, c->w, K, yp, y.ld, y.dtype, 1.f, nullptr);
        }
    }
    if (c->bias) dtc_add_col_bias(st, y, c->bias);
}

void dtc_conv2d(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w) {
    DTC_REQUIRE(h + 2 * c->pad - c->k + 1 == h && w + 2 * c->pad - c->k + 1 == w,
                "conv2d: k=%d pad=%d does not keep the size", c->k, c->pad);
    conv_run(be, y, x, c, h, w, 1, c->pad, c->pad, c->pad, c->pad);
}

void dtc_conv2d_strided(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int stride, int pad_top,
                        int pad_left, int pad_bottom, int pad_right) {
    conv_run(be, y, x, c, h, w, stride, pad_top, pad_left, pad_bottom, pad_right);
}

/* ------------------------------------------------------------------ group norm */
/* The block's sums of x and x² (each thread's f32 partials, reduced in f64) into out[0], out[1]. */
__device__ __forceinline__ void gn_store_partial(float s, float q, double *out) {
    __shared__ double sh[2][32];
    double ds = s, dq = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ds += __shfl_xor_sync(0xffffffffu, ds, o);
        dq += __shfl_xor_sync(0xffffffffu, dq, o);
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) { sh[0][wid] = ds; sh[1][wid] = dq; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double a = 0, b = 0;
        for (int i = 0; i < nw; i++) { a += sh[0][i]; b += sh[1][i]; }
        out[0] = a;
        out[1] = b;
    }
}

__global__ void k_gn_partial(dmat x, int64_t HW, int cpg, int chunks, double *part) {
    int g = blockIdx.x, ch = blockIdx.y;
    int64_t n = (int64_t)cpg * HW;
    int64_t per = (n + chunks - 1) / chunks;
    int64_t e0 = (int64_t)ch * per, e1 = e0 + per < n ? e0 + per : n;
    float s = 0.f, q = 0.f;
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        int64_t r = (int64_t)g * cpg + e / HW, c = e % HW;
        float v = dm_get(x, r, c);
        s += v;
        q += v * v;
    }
    gn_store_partial(s, q, part + ((int64_t)g * chunks + ch) * 2);
}

__global__ void k_gn_final(const double *part, int chunks, double count, float eps, float *stats, int groups) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    double a = 0, b = 0;
    for (int i = 0; i < chunks; i++) { a += part[((int64_t)g * chunks + i) * 2]; b += part[((int64_t)g * chunks + i) * 2 + 1]; }
    double mean = a / count, var = b / count - mean * mean;
    if (var < 0) var = 0;
    stats[2 * g] = (float)mean;
    stats[2 * g + 1] = (float)(1.0 / sqrt(var + (double)eps));
}

__global__ void k_gn_apply(dmat y, dmat x, int64_t C, int64_t HW, int cpg, const float *stats, const float *gamma,
                           const float *beta, int silu) {
    int64_t total = C * HW;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / HW, c = i - r * HW;
        int g = (int)(r / cpg);
        float v = (dm_get(x, r, c) - stats[2 * g]) * stats[2 * g + 1];
        v = v * (gamma ? gamma[r] : 1.f) + (beta ? beta[r] : 0.f);
        if (silu) {
            if (y.isbf) v = bfr(v);
            v = v / (1.f + __expf(-v));
        }
        dm_set(y, r, c, v);
    }
}

/* Vectorised variants (bf16, rows of whole 16-byte vectors): 8 elements per load, no per-element division. */
__global__ void k_gn_partial8(const __nv_bfloat16 *x, int64_t ldx, int hw8, int cpg, int chunks, double *part) {
    int g = blockIdx.x, ch = blockIdx.y;
    int64_t n8 = (int64_t)cpg * hw8;
    int64_t per = (n8 + chunks - 1) / chunks;
    int64_t e0 = (int64_t)ch * per, e1 = e0 + per < n8 ? e0 + per : n8;
    const __nv_bfloat16 *xg = x + (int64_t)g * cpg * ldx;
    float s = 0.f, q = 0.f;
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        int r = (int)(e / hw8);
        int c = (int)(e - (int64_t)r * hw8) * 8;
        uint4 u = *(const uint4 *)(xg + (int64_t)r * ldx + c);
        float f[8];
        bf8_to_f(u, f);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s += f[i];
            q += f[i] * f[i];
        }
    }
    gn_store_partial(s, q, part + ((int64_t)g * chunks + ch) * 2);
}

__global__ void k_gn_apply8(__nv_bfloat16 *y, int64_t ldy, const __nv_bfloat16 *x, int64_t ldx, int64_t C, int hw8,
                            int cpg, const float *stats, const float *gamma, const float *beta, int silu) {
    for (int64_t r = blockIdx.y; r < C; r += gridDim.y) {
        const int g = (int)(r / cpg);
        const float mean = stats[2 * g], rstd = stats[2 * g + 1];
        const float ga = gamma ? gamma[r] : 1.f, be = beta ? beta[r] : 0.f;
        const __nv_bfloat16 *xr = x + r * ldx;
        __nv_bfloat16 *yr = y + r * ldy;
        for (int c8 = blockIdx.x * blockDim.x + threadIdx.x; c8 < hw8; c8 += gridDim.x * blockDim.x) {
            float f[8];
            bf8_to_f(*(const uint4 *)(xr + (int64_t)c8 * 8), f);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float v = (f[i] - mean) * rstd;
                v = v * ga + be;
                if (silu) {
                    v = bfr(v);
                    v = v / (1.f + __expf(-v));
                }
                f[i] = v;
            }
            *(uint4 *)(yr + (int64_t)c8 * 8) = f_to_bf8(f);
        }
    }
}

void dtc_group_norm(dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat gamma, dt_mat beta, float eps, int silu) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(y.rows == x.rows && y.cols == x.cols, "group_norm: y/x shape mismatch");
    DTC_REQUIRE(groups > 0 && x.rows % groups == 0, "group_norm: %lld channels not divisible by %d groups",
                (long long)x.rows, groups);
    DTC_REQUIRE(!gamma.data || (gamma.dtype == DT_F32 && gamma.cols == x.rows), "group_norm: gamma must be F32 [1, C]");
    DTC_REQUIRE(!beta.data || (beta.dtype == DT_F32 && beta.cols == x.rows), "group_norm: beta must be F32 [1, C]");
    if (x.rows <= 0 || x.cols <= 0) return;
    const int cpg = (int)(x.rows / groups);
    const int64_t n = (int64_t)cpg * x.cols;
    int chunks = (int)((4 * (int64_t)st->sm_count + groups - 1) / groups);
    int64_t maxc = (n + 4095) / 4096;
    if (chunks > maxc) chunks = (int)maxc;
    if (chunks < 1) chunks = 1;
    if (chunks > 65535) chunks = 65535;
    size_t pbytes = (size_t)groups * chunks * 2 * sizeof(double);
    char *buf = (char *)dtc_scratch_get(st, &st->s_misc, pbytes + (size_t)groups * 2 * sizeof(float) + 256);
    double *part = (double *)buf;
    float *stats = (float *)(buf + ((pbytes + 255) / 256) * 256);
    const int vec = dtc_vec8_ok(x) && dtc_vec8_ok(y) && x.cols / 8 < (1LL << 31);
    if (vec)
        k_gn_partial8<<<dim3((unsigned)groups, (unsigned)chunks), 256, 0, st->q.stream>>>(
            (const __nv_bfloat16 *)x.data, x.ld, (int)(x.cols / 8), cpg, chunks, part);
    else
        k_gn_partial<<<dim3((unsigned)groups, (unsigned)chunks), 256, 0, st->q.stream>>>(dtc_dm(x), x.cols, cpg, chunks, part);
    CK_LAUNCH("group_norm partial");
    k_gn_final<<<(groups + 127) / 128, 128, 0, st->q.stream>>>(part, chunks, (double)n, eps, stats, groups);
    CK_LAUNCH("group_norm final");
    if (vec) {
        int64_t hw8 = x.cols / 8, gx = (hw8 + 255) / 256;
        if (gx > 65535) gx = 65535;
        int64_t gy = x.rows < 65535 ? x.rows : 65535;
        k_gn_apply8<<<dim3((unsigned)gx, (unsigned)gy), 256, 0, st->q.stream>>>(
            (__nv_bfloat16 *)y.data, y.ld, (const __nv_bfloat16 *)x.data, x.ld, x.rows, (int)hw8, cpg, stats,
            (const float *)gamma.data, (const float *)beta.data, silu);
        CK_LAUNCH("group_norm apply");
        return;
    }
    int64_t total = x.rows * x.cols;
    int64_t b = (total + 255) / 256;
    if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
    k_gn_apply<<<(unsigned)b, 256, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), x.rows, x.cols, cpg, stats,
                                                    (const float *)gamma.data, (const float *)beta.data, silu);
    CK_LAUNCH("group_norm apply");
}

/* ------------------------------------------------------------------ upsample */
__global__ void k_upsample2x(dmat y, dmat x, int64_t C, int H, int W) {
    int64_t W2 = 2 * (int64_t)W, total = C * 4 * (int64_t)H * W;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / (4 * (int64_t)H * W), p = i - r * 4 * (int64_t)H * W;
        int64_t oy = p / W2, ox = p - oy * W2;
        dm_set(y, r, p, dm_get(x, r, (oy >> 1) * W + (ox >> 1)));
    }
}

/* bf16, W % 4 == 0: each thread reads 4 input pixels (8 bytes) and writes 8 output pixels to both output rows. */
__global__ void k_upsample2x_v(__nv_bfloat16 *y, int64_t ldy, const __nv_bfloat16 *x, int64_t ldx, int64_t C, int H,
                               int W) {
    const int w4 = W / 4;
    const int64_t nrows = C * H;
    for (int64_t row = blockIdx.y; row < nrows; row += gridDim.y) {
        const int64_t c = row / H;
        const int iy = (int)(row - c * H);
        const __nv_bfloat16 *xr = x + c * ldx + (int64_t)iy * W;
        __nv_bfloat16 *y0 = y + c * ldy + (int64_t)(2 * iy) * (2 * W), *y1 = y0 + 2 * W;
        for (int ix = blockIdx.x * blockDim.x + threadIdx.x; ix < w4; ix += gridDim.x * blockDim.x) {
            uint2 in = *(const uint2 *)(xr + 4 * ix);
            uint32_t a = in.x & 0xffffu, b = in.x >> 16, cc = in.y & 0xffffu, d = in.y >> 16;
            uint4 o = make_uint4(a | (a << 16), b | (b << 16), cc | (cc << 16), d | (d << 16));
            *(uint4 *)(y0 + 8 * ix) = o;
            *(uint4 *)(y1 + 8 * ix) = o;
        }
    }
}

void dtc_upsample2x(dt_backend *be, dt_mat y, dt_mat x, int h, int w) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.cols == (int64_t)h * w && y.rows == x.rows && y.cols == 4 * (int64_t)h * w,
                "upsample2x: x [%lld,%lld] y [%lld,%lld] for %dx%d", (long long)x.rows, (long long)x.cols,
                (long long)y.rows, (long long)y.cols, h, w);
    int64_t total = y.rows * y.cols;
    if (total <= 0) return;
    if (x.dtype == DT_BF16 && y.dtype == DT_BF16 && w % 4 == 0 && dtc_aligned16(x.data) && dtc_aligned16(y.data) &&
        x.ld % 8 == 0 && y.ld % 8 == 0) {
        int64_t gx = (w / 4 + 127) / 128, gy = x.rows * h;
        if (gy > 65535) gy = 65535;
        k_upsample2x_v<<<dim3((unsigned)gx, (unsigned)gy), 128, 0, st->q.stream>>>(
            (__nv_bfloat16 *)y.data, y.ld, (const __nv_bfloat16 *)x.data, x.ld, x.rows, h, w);
        CK_LAUNCH("upsample2x");
        return;
    }
    int64_t b = (total + 255) / 256;
    if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
    k_upsample2x<<<(unsigned)b, 256, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), x.rows, h, w);
    CK_LAUNCH("upsample2x");
}

/* ------------------------------------------------------------------ channel RMS norm */
__global__ void k_channel_rmsnorm(dmat y, dmat x, int64_t C, int64_t HW, const float *gamma, float scale, int silu) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < HW; p += (int64_t)gridDim.x * blockDim.x) {
        float ss = 0.f;
        for (int64_t c = 0; c < C; c++) {
            float v = dm_get(x, c, p);
            ss += v * v;
        }
        const float inv = 1.f / fmaxf(sqrtf(ss), 1e-12f);
        for (int64_t c = 0; c < C; c++) {
            float v = dm_get(x, c, p) * inv * scale * (gamma ? gamma[c] : 1.f);
            if (silu) {
                if (y.isbf) v = bfr(v);
                v = v / (1.f + __expf(-v));
            }
            dm_set(y, c, p, v);
        }
    }
}

void dtc_channel_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat gamma, int silu) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(y.rows == x.rows && y.cols == x.cols, "channel_rmsnorm: y [%lld,%lld] for x [%lld,%lld]",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols);
    DTC_REQUIRE(!gamma.data || (gamma.dtype == DT_F32 && gamma.cols == x.rows),
                "channel_rmsnorm: gamma must be F32 [1, %lld]", (long long)x.rows);
    if (x.rows <= 0 || x.cols <= 0) return;
    int64_t b = (x.cols + 127) / 128;
    if (b > (int64_t)st->sm_count * 64) b = (int64_t)st->sm_count * 64;
    k_channel_rmsnorm<<<(unsigned)b, 128, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), x.rows, x.cols,
                                                           (const float *)gamma.data, sqrtf((float)x.rows), silu);
    CK_LAUNCH("channel_rmsnorm");
}

/* ------------------------------------------------------------------ preloading (see cuda_common.cuh) */
void dtc_preload_image(dtc_state *st) {
    (void)st;
    dtc_preload_fn((const void *)k_im2col);
    dtc_preload_fn((const void *)k_gn_partial);
    dtc_preload_fn((const void *)k_gn_final);
    dtc_preload_fn((const void *)k_gn_apply);
    dtc_preload_fn((const void *)k_upsample2x);
    dtc_preload_fn((const void *)k_upsample2x_v);
    dtc_preload_fn((const void *)k_im2col8);
    dtc_preload_fn((const void *)k_gn_partial8);
    dtc_preload_fn((const void *)k_gn_apply8);
    dtc_preload_fn((const void *)k_channel_rmsnorm);
}
