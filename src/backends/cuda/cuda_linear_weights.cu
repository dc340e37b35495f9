/* cuda_linear_weights.cu — a Linear's weights on the GPU: upload (dense F32/F16/BF16 -> bf16; MLX affine 4/8-bit kept
 * packed, dequantized once (qpath cached), re-laid for the mixed GEMM (qpath mixed) or converted to fp8; GGUF blocks
 * kept as the file has them (cuda_ggml.cu dequantizes them); fp8 files on the fp8 GEMM as stored, or widened to bf16
 * where it cannot take them), the dequantization every transient path uses, destroy, and the -v line naming each
 * Linear's path. MLX forms dequantize w = fmaf(scale, q, bias) in fp32 and round to bf16, so every path agrees up to
 * the GEMM's summation order. */
#include "cuda_linear.cuh"

/* Dequantize packed -> bf16 [N, K]; one thread per 8 output elements. */
template <int BITS>
__global__ void k_dequant(__nv_bfloat16 *dst, const uint32_t *qw, const float2 *sb, int64_t N, int64_t K, int group,
                          const void *rowscale, int rs_f32) {
    int64_t chunks = N * (K / 8);
    int64_t ng = K / group;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < chunks; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / (K / 8), c = (i - n * (K / 8)) * 8;
        float2 s = sb[n * ng + c / group];
        float f[8];
        if (BITS == 4) {
            uint32_t q = qw[n * (K / 8) + c / 8];
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = fmaf(s.x, u2f((q >> (4 * j)) & 15u), s.y);
        } else {
            uint2 q = *(const uint2 *)(qw + n * (K / 4) + c / 4);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                f[j] = fmaf(s.x, u2f((q.x >> (8 * j)) & 255u), s.y);
                f[4 + j] = fmaf(s.x, u2f((q.y >> (8 * j)) & 255u), s.y);
            }
        }
        if (rowscale) {   /* the gate of linear_gated_add, folded into the weight rows */
            float g = rs_f32 ? ((const float *)rowscale)[n] : __bfloat162float(((const __nv_bfloat16 *)rowscale)[n]);
#pragma unroll
            for (int jj = 0; jj < 8; jj++) f[jj] *= g;
        }
        *(uint4 *)(dst + n * K + c) = f_to_bf8(f);
    }
}

/* rowscale: NULL, or a [N] vector (bf16, or f32 when rs_f32) multiplied into each dequantized row. */
void dtc_dequant_launch(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const dt_linear *w,
                        const void *rowscale, int rs_f32) {
    if (w->gq) {   /* GGUF blocks */
        dtc_ggml_dequant(st, stream, dst, w->gq, w->gtype, w->out, w->in, rowscale, rs_f32);
        return;
    }
    dtc_dequant_launch_from(st, stream, dst, w, w->qw, w->sb, rowscale, rs_f32);
}

void dtc_dequant_launch_from(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const dt_linear *w,
                             const uint32_t *qw, const float2 *sb, const void *rowscale, int rs_f32) {
    int64_t chunks = w->out * (w->in / 8);
    int64_t b = (chunks + 255) / 256;
    if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
    if (w->bits == 4)
        k_dequant<4><<<(unsigned)b, 256, 0, stream>>>(dst, qw, sb, w->out, w->in, w->group, rowscale, rs_f32);
    else
        k_dequant<8><<<(unsigned)b, 256, 0, stream>>>(dst, qw, sb, w->out, w->in, w->group, rowscale, rs_f32);
    CK_LAUNCH("dequant");
}

size_t dtc_packed_bytes(const dt_linear *w, size_t *qbytes, size_t *sb_off) {
    const size_t q = (size_t)w->out * (size_t)(w->in * w->bits / 32) * 4;
    const size_t off = (q + 15) / 16 * 16;
    if (qbytes) *qbytes = q;
    if (sb_off) *sb_off = off;
    return off + (size_t)w->out * (size_t)(w->in / w->group) * sizeof(float2);
}

static float host_half(const void *p, dt_dtype t, int64_t i) {
    if (t == DT_F32) return ((const float *)p)[i];
    if (t == DT_F16) return dt_f16_to_f32(((const uint16_t *)p)[i]);
    return dt_bf16_to_f32(((const uint16_t *)p)[i]);
}

int dtc_host_scales(const dt_linear_src *src, float2 *h, int64_t n) {
    if (src->sb_dtype == DT_BF16) {
        /* the common case, without a per-element dtype switch and exactness test (bf16 -> f32 is exact): 7x
         * faster on the host (0.54 -> 0.07 s for a klein-4B's 60 M pairs on the dev machine) */
        const uint16_t *sc = (const uint16_t *)src->scales, *bi = (const uint16_t *)src->biases;
        for (int64_t i = 0; i < n; i++) {
            h[i].x = dt_bf16_to_f32(sc[i]);
            h[i].y = dt_bf16_to_f32(bi[i]);
        }
        return 1;
    }
    int exact = 1;
    for (int64_t i = 0; i < n; i++) {
        h[i].x = host_half(src->scales, src->sb_dtype, i);
        h[i].y = host_half(src->biases, src->sb_dtype, i);
        exact &= dt_bf16_to_f32(dt_f32_to_bf16(h[i].x)) == h[i].x && dt_bf16_to_f32(dt_f32_to_bf16(h[i].y)) == h[i].y;
    }
    return exact;
}

void dtc_linear_destroy(dt_backend *be, dt_linear *w) {
    if (!w) return;
    dtc_state *st = dtc(be);
    dtc_prefetch_drop(st, w);
    dtc_pool_free(st, w->w);
    if (w->host) {   /* (a kernel may still read them: the queues first) */
        CK(cudaDeviceSynchronize());
        cudaFreeHost(w->qw);
        cudaFreeHost(w->sb);
    } else {
        dtc_pool_free(st, w->qw);
        dtc_pool_free(st, w->sb);
    }
    dtc_pool_free(st, w->gq);
    dtc_pool_free(st, w->bias);
    dtc_fp8_weight_free(st, w->f8);
    dtc_qgemm_free(st, &w->mx);
    free(w);
}

/* The MLX-packed copy once another form was made from it (cached dense, mixed layout): free it when done. */
static void drop_packed(dtc_state *st, dt_linear *w) {
    CK(cudaStreamSynchronize(st->q.stream));
    dtc_pool_free(st, w->qw);
    dtc_pool_free(st, w->sb);
    w->qw = nullptr;
    w->sb = nullptr;
}

/* The execution path of a prepared Linear, in words (linear_path: the -v summary of a model's Linears). */
static const char *linear_path_name(const dt_backend *be, const dt_linear *w, const dt_linear_src *src) {
    if (w->f8)
        return dt_linear_src_fp8(src) ? "fp8: the file's e4m3 codes and scales, cuBLASLt e4m3 GEMM"
                                      : "fp8: e4m3 weights with per-channel scales, cuBLASLt e4m3 GEMM";
    if (w->gq) return "GGUF blocks on the GPU, dequantized to bf16 before each cuBLASLt GEMM (transient)";
    if (w->w && dt_linear_src_blocks(src)) return "cached: GGUF blocks dequantized to bf16 once at load, cuBLASLt";
    if (w->w && dt_linear_src_fp8(src)) return "dense bf16 (an fp8 file widened: the fp8 GEMM needs in and out % 16 "
                                                         "and compute 8.9+)";
    if (w->w && !src->bits)
        return src->precision == DT_PREC_FP8 ? "dense bf16 (fp8 asked for; the fp8 GEMM needs in and out % 16)"
                                             : "dense bf16, cuBLASLt";
    if (w->w) return "cached: dequantized to bf16 once at load, cuBLASLt";
    if (w->host) return "transient, packed weights in host memory: dequantized over the bus to bf16 before each "
                        "cuBLASLt GEMM (fused qmm at <= 64 rows)";
    if (w->mx.q) return "mixed: packed weights dequantized in registers inside our wgmma GEMM";
    switch (be->opts.qpath) {
    case DT_QPATH_FUSED: return "fused: our qmm GEMM dequantizes each tile (transient where its layout does not fit)";
    case DT_QPATH_TRANSIENT: return "transient: dequantized to bf16 before each cuBLASLt GEMM";
    default:
        return "transient: dequantized to bf16 before each cuBLASLt GEMM (fused qmm at <= 64 rows)";
    }
}

#define LIN_ALLOC(ptr, bytes)                                                                   \
    do {                                                                                        \
        *(void **)&(ptr) = dtc_pool_alloc(st, (bytes));                                         \
        if (!(ptr)) { dtc_linear_destroy(be, w); return NULL; }                                 \
    } while (0)

dt_linear *dtc_linear_create(dt_backend *be, const dt_linear_src *src) {
    dtc_state *st = dtc(be);
    const char *nm = src->name ? src->name : "?";
    if (src->out <= 0 || src->in <= 0) {
        dt_set_error("cuda: linear %s: bad shape [%lld, %lld]", nm, (long long)src->out, (long long)src->in);
        return NULL;
    }
    dt_linear *w = (dt_linear *)calloc(1, sizeof(dt_linear));
    if (!w) { dt_set_error("cuda: out of host memory"); return NULL; }
    w->out = src->out;
    w->in = src->in;
    w->bits = src->bits;
    w->group = src->group_size;
    w->f8_unfused = src->fp8_unfused;
    const int64_t N = src->out, K = src->in;
    /* fp8 files run on the fp8 GEMM as stored (no bf16 copy); --precision fp8 converts other forms. cuBLASLt's
     * e4m3 GEMM needs compute 8.9+ (dt_cuda_fp8_supported): below, fp8 files are widened to bf16 and
     * --precision fp8 is an error. */
    const int fp8_card = dt_cuda_fp8_supported(st->cc_major, st->cc_minor);
    if (src->precision == DT_PREC_FP8 && !fp8_card) {
        dt_set_error("cuda: linear %s: --precision fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, "
                     "Blackwell); this one is %d.%d: use --precision bf16", nm, st->cc_major, st->cc_minor);
        free(w);
        return NULL;
    }
    if ((src->precision == DT_PREC_FP8 || dt_linear_src_fp8(src)) && fp8_card && dtc_fp8_eligible(src)) {
        w->f8 = dtc_fp8_weight_create(st, src);
        if (!w->f8) { free(w); return NULL; }
    } else if (dt_linear_src_blocks(src)) {   /* GGUF: the blocks on the device, dequantized before the GEMM */
        if (!dtc_ggml_supported(src->dtype) || K % 32) {
            dt_set_error("cuda: linear %s: unsupported GGUF block type %s (in %lld)", nm, dt_dtype_name(src->dtype), (long long)K);
            free(w);
            return NULL;
        }
        const size_t bytes = dt_dtype_bytes(src->dtype, K) * (size_t)N;
        LIN_ALLOC(w->gq, bytes);
        w->gtype = src->dtype;
        CK(cudaMemcpyAsync(w->gq, src->data, bytes, cudaMemcpyHostToDevice, st->q.stream));
        if (be->opts.qpath == DT_QPATH_CACHED) {
            LIN_ALLOC(w->w, (size_t)N * K * 2);
            dtc_dequant_launch(st, st->q.stream, w->w, w, nullptr, 0);
            CK(cudaStreamSynchronize(st->q.stream));
            dtc_pool_free(st, w->gq);
            w->gq = nullptr;
        } else if (st->pf_stream) {   /* the transient scratch (or the prefetch slots) now: graph capture never allocates */
            dtc_scratch_reserve(st, &st->pf[0].buf, (size_t)N * K * 2);
            dtc_scratch_reserve(st, &st->pf[1].buf, (size_t)N * K * 2);
        } else {
            dtc_scratch_get(st, &st->q.s_qdeq, (size_t)N * K * 2);
        }
    } else if (dt_linear_src_fp8(src)) {   /* an fp8 Linear the fp8 GEMM cannot take (in/out % 16): bf16 */
        LIN_ALLOC(w->w, (size_t)N * K * 2);
        int64_t rows = ((int64_t)1 << 24) / K;
        if (rows < 1) rows = 1;
        if (rows > N) rows = N;
        float *h = (float *)malloc((size_t)(rows * K) * sizeof(float));
        void *stage = dtc_pool_alloc(st, (size_t)(rows * K) * sizeof(float));
        if (!h || !stage) { free(h); dtc_pool_free(st, stage); dtc_linear_destroy(be, w); return NULL; }
        for (int64_t r0 = 0; r0 < N; r0 += rows) {
            int64_t nr = N - r0 < rows ? N - r0 : rows;
            dt_linear_src_rows_f32(src, r0, nr, h);
            CK(cudaMemcpyAsync(stage, h, (size_t)(nr * K) * sizeof(float), cudaMemcpyHostToDevice, st->q.stream));
            dtc_convert_to_bf16(st, w->w + r0 * K, stage, DT_F32, nr * K);
            CK(cudaStreamSynchronize(st->q.stream));   /* h and the stage are reused */
        }
        free(h);
        dtc_pool_free(st, stage);
    } else if (src->bits == 0) {
        if (src->dtype != DT_F32 && src->dtype != DT_F16 && src->dtype != DT_BF16) {
            dt_set_error("cuda: linear %s: unsupported weight dtype %s", nm, dt_dtype_name(src->dtype));
            free(w);
            return NULL;
        }
        LIN_ALLOC(w->w, (size_t)N * K * 2);
        if (src->dtype == DT_BF16) {
            CK(cudaMemcpyAsync(w->w, src->data, (size_t)N * K * 2, cudaMemcpyHostToDevice, st->q.stream));
        } else {
            /* stage raw bytes in chunks and convert on the device */
            size_t es = dt_dtype_size(src->dtype);
            int64_t total = N * K, chunk = (int64_t)1 << 26;
            if (chunk > total) chunk = total;
            void *stage = dtc_pool_alloc(st, (size_t)chunk * es);
            if (!stage) { dtc_linear_destroy(be, w); return NULL; }
            for (int64_t off = 0; off < total; off += chunk) {
                int64_t nn = total - off < chunk ? total - off : chunk;
                CK(cudaMemcpyAsync(stage, (const char *)src->data + (size_t)off * es, (size_t)nn * es,
                                   cudaMemcpyHostToDevice, st->q.stream));
                dtc_convert_to_bf16(st, w->w + off, stage, src->dtype, nn);
            }
            CK(cudaStreamSynchronize(st->q.stream));
            dtc_pool_free(st, stage);
        }
    } else {
        if ((src->bits != 4 && src->bits != 8) || src->group_size <= 0 || K % src->group_size || K % 8) {
            dt_set_error("cuda: linear %s: unsupported quantization bits=%d group=%d in=%lld", nm, src->bits,
                         src->group_size, (long long)K);
            free(w);
            return NULL;
        }
        int64_t words = K * src->bits / 32, ng = K / src->group_size;
        const size_t qbytes = (size_t)N * words * 4, sbytes = (size_t)N * ng * sizeof(float2);
        /* host weights: the packed form stays in mapped pinned memory, read in place by the dequantization (unified
         * addressing: the host pointer is the device's); only for the paths that read the packed form each time */
        w->host = st->o.host_weights && be->opts.qpath != DT_QPATH_CACHED && be->opts.qpath != DT_QPATH_MIXED;
        if (w->host) {
            if (cudaHostAlloc((void **)&w->qw, qbytes, cudaHostAllocMapped) != cudaSuccess ||
                cudaHostAlloc((void **)&w->sb, sbytes, cudaHostAllocMapped) != cudaSuccess) {
                cudaGetLastError();
                dt_set_error("cuda: linear %s: no pinned host memory for its %zu packed bytes (host weights)", nm,
                             qbytes + sbytes);
                dtc_linear_destroy(be, w);
                return NULL;
            }
            void *dq = nullptr, *ds = nullptr;
            if (cudaHostGetDevicePointer(&dq, w->qw, 0) != cudaSuccess || dq != (void *)w->qw ||
                cudaHostGetDevicePointer(&ds, w->sb, 0) != cudaSuccess || ds != (void *)w->sb) {
                cudaGetLastError();
                dt_set_error("cuda: linear %s: host weights need unified addressing (the device reads the host's "
                             "pointers)", nm);
                dtc_linear_destroy(be, w);
                return NULL;
            }
            memcpy(w->qw, src->data, qbytes);
            /* the copy a prefetch hint makes of them (cuda_prefetch.cu): reserved now, so capture never allocates */
            if (st->pf_stream) dtc_scratch_reserve(st, &st->pf_stage, dtc_packed_bytes(w, NULL, NULL));
        } else {
            LIN_ALLOC(w->qw, qbytes);
            LIN_ALLOC(w->sb, sbytes);
            CK(cudaMemcpyAsync(w->qw, src->data, qbytes, cudaMemcpyHostToDevice, st->q.stream));
        }
        float2 *h = w->host ? w->sb : (float2 *)malloc(sbytes);
        if (!h) { dt_set_error("cuda: out of host memory"); dtc_linear_destroy(be, w); return NULL; }
        /* every scale and bias a bf16 value? (the mixed GEMM's bf16x2 dequantization needs it) */
        int sb_bf16_exact = dtc_host_scales(src, h, N * ng);
        if (!w->host) {
            CK(cudaMemcpyAsync(w->sb, h, sbytes, cudaMemcpyHostToDevice, st->q.stream));
            CK(cudaStreamSynchronize(st->q.stream));
            free(h);
        }
        if (be->opts.qpath == DT_QPATH_CACHED) {
            LIN_ALLOC(w->w, (size_t)N * K * 2);
            dtc_dequant_launch(st, st->q.stream, w->w, w, nullptr, 0);
            drop_packed(st, w);
        } else if (be->opts.qpath == DT_QPATH_MIXED && dtc_qgemm_eligible(st, N, K, src->bits, src->group_size)) {
            if (dtc_qgemm_pack(st, &w->mx, w->qw, w->sb, N, K, src->bits, src->group_size, sb_bf16_exact)) {
                dtc_linear_destroy(be, w);
                return NULL;
            }
            drop_packed(st, w);
        } else {
            /* grow the transient scratch (or the prefetch slots) now, so graph capture never allocates */
            if (st->pf_stream) {
                dtc_scratch_reserve(st, &st->pf[0].buf, (size_t)N * K * 2);
                dtc_scratch_reserve(st, &st->pf[1].buf, (size_t)N * K * 2);
            } else {
                dtc_scratch_get(st, &st->q.s_qdeq, (size_t)N * K * 2);
            }
        }
    }
    if (src->bias) {
        uint16_t *hb = (uint16_t *)malloc((size_t)N * 2);
        if (!hb) { dt_set_error("cuda: out of host memory"); dtc_linear_destroy(be, w); return NULL; }
        for (int64_t i = 0; i < N; i++) hb[i] = dt_f32_to_bf16(host_half(src->bias, src->bias_dtype, i));
        LIN_ALLOC(w->bias, (size_t)N * 2);
        CK(cudaMemcpyAsync(w->bias, hb, (size_t)N * 2, cudaMemcpyHostToDevice, st->q.stream));
        CK(cudaStreamSynchronize(st->q.stream));
        free(hb);
    }
    CK(cudaStreamSynchronize(st->q.stream));
    w->path = linear_path_name(be, w, src);
    return w;
}

const char *dtc_linear_path(dt_backend *be, const dt_linear *w) {
    (void)be;
    return w->path;
}

int dtc_linear_on_host(dt_backend *be, const dt_linear *w) {
    (void)be;
    return w->host;
}

/* preloading (see cuda_common.cuh) */
void dtc_preload_linear(dtc_state *st) {
    dtc_preload_fn((const void *)k_dequant<4>);
    dtc_preload_fn((const void *)k_dequant<8>);
    /* one small cuBLASLt product: its first call initialises the library's internals (once per process) */
    void *buf = dtc_pool_alloc(st, 3 * 128 * 128 * 2);
    if (buf) {
        __nv_bfloat16 *a = (__nv_bfloat16 *)buf, *b = a + 128 * 128, *d = b + 128 * 128;
        CK(cudaMemsetAsync(buf, 0, 2 * 128 * 128 * 2, st->q.stream));
        dtc_gemm(st, 1, 0, 128, 128, 128, a, 128, b, 128, d, 128, DT_BF16, 1.f, nullptr);
        CK(cudaStreamSynchronize(st->q.stream));
        dtc_pool_free(st, buf);
    } else {
        cudaGetLastError();
    }
}
