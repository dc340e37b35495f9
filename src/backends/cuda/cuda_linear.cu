/* cuda_linear.cu — the Linear ops of the CUDA backend and which path each product takes: fp8 Linears (cuda_fp8.cu),
 * dense bf16 and cached weights (cuBLASLt), the mixed-input GEMM (cuda_qgemm.cu), the fused qmm (cuda_qmm.cu, <= 64
 * rows under auto) or transient dequantization + cuBLASLt; the gated residual folded into the GEMM where it can be
 * (linear_gated_add), and the fp8 Linears fed by their producing norm / SwiGLU (norm_linear, rmsnorm_mod_linears,
 * act_linear_gated). */
#include "cuda_linear.cuh"

/* fp8 Linears take their activations from the producing op (norm_linear, act_linear_gated) and fold the gated
 * residual into the GEMM; a Linear created with dt_linear_src.fp8_unfused, or the fp8-internals extension's
 * force_unfused, turns both off (A/B arm: the quantizing pass and linear + gated_add). */
static int fp8_fuse_on(const dt_backend *be, const dt_linear *w) {
    return !w->f8_unfused && !((const dtc_state *)be->impl)->fp8_force_unfused;
}

/* The quantized-weight path for a product of `rows` tokens: the requested one, or (auto) the fused qmm for
 * mat-vec-like sizes and transient dequantization above. CACHED and MIXED Linears leave the packed form at load
 * (dense, or re-laid for the mixed GEMM), so a Linear that kept it under either behaves as auto. */
dt_qpath dtc_qpath_for(const dt_backend *be, int64_t rows) {
    dt_qpath path = be->opts.qpath;
    if (path == DT_QPATH_AUTO || path == DT_QPATH_CACHED || path == DT_QPATH_MIXED)
        path = rows > 64 ? DT_QPATH_TRANSIENT : DT_QPATH_FUSED;
    return path;
}

static void dense_gemm(dtc_state *st, dt_mat y, dt_mat x, const __nv_bfloat16 *W, const dt_linear *w) {
    /* column-major view: yᵀ[N,M] = W[N,K] (stored as col-major [K,N], transposed) · xᵀ (col-major [K,M]) */
    int bias_epi = w->bias && y.dtype == DT_BF16;
    dtc_gemm_run(st, 1, 0, w->out, x.rows, w->in, W, w->in, x.data, x.ld, y.data, y.ld, y.dtype, 1.f,
             bias_epi ? w->bias : nullptr, 0, 1);
    if (w->bias && !bias_epi) dtc_add_row_bias(st, y, w->bias);
}

void dtc_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.cols == w->in && y.cols == w->out && y.rows == x.rows,
                "linear: y[%lld,%lld] = x[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)y.rows,
                (long long)y.cols, (long long)x.rows, (long long)x.cols, (long long)w->out, (long long)w->in);
    DTC_REQUIRE(y.dtype == DT_BF16 || y.dtype == DT_F32, "linear: y dtype %s", dt_dtype_name(y.dtype));
    DTC_REQUIRE(x.dtype == DT_BF16 || x.dtype == DT_F32, "linear: x dtype %s", dt_dtype_name(x.dtype));
    if (x.rows <= 0) return;
    if (w->f8) {
        dtc_fp8_linear(st, y, x, w->f8, w->bias);
        return;
    }
    if (x.dtype != DT_BF16) {  /* cast F32 input to a bf16 scratch copy */
        void *p = dtc_scratch_get(st, &st->q.s_cast, (size_t)x.rows * x.cols * 2);
        dt_mat xb = {p, x.rows, x.cols, x.cols, DT_BF16};
        dtc_copy(be, xb, x);
        x = xb;
    }
    if (w->w) {
        dense_gemm(st, y, x, w->w, w);
        return;
    }
    if (w->mx.q) {
        dtc_qg_epi e = {w->bias, nullptr, 0, 0};
        if (dtc_qgemm(st, y, x, &w->mx, &e) == 0) return;
        __nv_bfloat16 *tmp = (__nv_bfloat16 *)dtc_scratch_get(st, &st->q.s_qdeq, (size_t)w->out * w->in * 2);
        dtc_qgemm_dequant(st, tmp, &w->mx, nullptr, 0);
        dense_gemm(st, y, x, tmp, w);
        return;
    }
    /* (the fused qmm takes the MLX layout only; GGUF blocks go transient) */
    if (w->qw && dtc_qpath_for(be, x.rows) == DT_QPATH_FUSED && dtc_qmm_linear(st, y, x, w) == 0) return;
    dense_gemm(st, y, x, dtc_transient_weights(st, w, nullptr, 0), w);
}

/* x[M,N] += gate ⊙ (a[M,K] · Wᵀ), gate [1,N]. With transient quantized weights the gate is folded into the
 * dequantized rows (W' = diag(gate)·W, in the dequantization pass that runs anyway) and the GEMM accumulates into
 * x (beta = 1, C = D = x): one pass, no y buffer, no gated_add pass. The weight products are rounded to bf16 once
 * (gate·w instead of w) and the sum once (instead of y, gate·y and x + ...). Dense weights, biases, F32 x and the
 * fused-qmm sizes take linear + gated_add. (cuBLASLt's per-row alpha vector would fold the gate without touching
 * W, but it is not supported for bf16 on sm_90: "the requested functionality is not supported".) */
void dtc_linear_gated_add(dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat gate) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(a.cols == w->in && x.cols == w->out && x.rows == a.rows,
                "linear_gated_add: x[%lld,%lld] += a[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)x.rows,
                (long long)x.cols, (long long)a.rows, (long long)a.cols, (long long)w->out, (long long)w->in);
    DTC_REQUIRE(!gate.data || gate.cols == x.cols, "linear_gated_add: gate has %lld columns, x %lld",
                (long long)gate.cols, (long long)x.cols);
    if (a.rows <= 0) return;
    if (w->f8 && fp8_fuse_on(be, w) && (a.dtype == DT_BF16 || a.dtype == DT_F32) && (x.dtype == DT_BF16 || x.dtype == DT_F32)) {
        /* fp8: the gate folded into the weight scales, the residual as the GEMM's C (dtc_fp8_gemm_q) */
        float *sx;
        uint8_t *xq = dtc_fp8_quant_act(st, a, &sx);
        dtc_fp8_gemm_q(be, x, xq, sx, w->f8, w->bias, gate, 1);
        return;
    }
    if (w->mx.q && a.dtype == DT_BF16 && (x.dtype == DT_BF16 || x.dtype == DT_F32) &&
        (!gate.data || gate.dtype == DT_BF16 || gate.dtype == DT_F32)) {
        /* mixed-input GEMM: bias, gate and the residual add in its epilogue, weights untouched */
        dtc_qg_epi e = {w->bias, gate.data, gate.dtype == DT_F32, 1};
        if (dtc_qgemm(st, x, a, &w->mx, &e) == 0) return;
    }
    /* packed weights only (w->qw or w->gq: not dense, not dequantized at load, not fp8) */
    int ok = gate.data && !w->bias && (w->qw || w->gq) && dtc_qpath_for(be, a.rows) == DT_QPATH_TRANSIENT &&
             x.dtype == DT_BF16 && a.dtype == DT_BF16 &&
             (gate.dtype == DT_BF16 || gate.dtype == DT_F32) &&
             x.ld % 8 == 0 && a.ld % 8 == 0 && dtc_aligned16(x.data) && dtc_aligned16(a.data);
    if (ok) {
        __nv_bfloat16 *W = dtc_transient_weights(st, w, gate.data, gate.dtype == DT_F32);
        if (dtc_gemm_run(st, 1, 0, w->out, a.rows, w->in, W, w->in, a.data, a.ld, x.data, x.ld, DT_BF16, 1.f, nullptr,
                     1, 1) == 0)
            return;
    }
    /* no gate (a plain x += a·Wᵀ, e.g. a LoRA side product's second GEMM) on dense weights: accumulate directly */
    if (!gate.data && w->w && !w->bias && x.dtype == DT_BF16 && a.dtype == DT_BF16 && x.ld % 8 == 0 && a.ld % 8 == 0 &&
        dtc_aligned16(x.data) && dtc_aligned16(a.data) &&
        dtc_gemm_run(st, 1, 0, w->out, a.rows, w->in, w->w, w->in, a.data, a.ld, x.data, x.ld, DT_BF16, 1.f, nullptr, 1, 1) == 0)
        return;
    void *yp = dtc_scratch_get(st, &st->q.s_lga, (size_t)x.rows * x.cols * 2);
    dt_mat y = {yp, x.rows, x.cols, x.cols, DT_BF16};
    dtc_linear(be, y, a, w);
    dtc_gated_add(be, x, gate, y);
}

/* layernorm_mod + linear; for fp8 Linears the norm writes the GEMM's e4m3 activations directly (a not written). */
void dtc_norm_linear(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps, const dt_linear *w,
                     dt_mat a) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.cols == w->in && y.cols == w->out && y.rows == x.rows && a.rows == x.rows && a.cols == x.cols,
                "norm_linear: y[%lld,%lld] = LN(x[%lld,%lld]) · W[%lld,%lld]ᵀ via a[%lld,%lld]: shape mismatch",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols, (long long)w->out,
                (long long)w->in, (long long)a.rows, (long long)a.cols);
    if (w->f8 && fp8_fuse_on(be, w) && x.rows > 0 && (y.dtype == DT_BF16 || y.dtype == DT_F32)) {
        float *sx;
        uint8_t *xq = dtc_fp8_act_scratch(st, x.rows, x.cols, &sx);
        if (dtc_layernorm_mod_e4m3(st, x, shift, scale, eps, xq, sx) == 0) {
            dtc_fp8_gemm_q(be, y, xq, sx, w->f8, w->bias, dt_mat_null(), 0);
            return;
        }
    }
    dtc_layernorm_mod(be, a, x, shift, scale, eps);
    dtc_linear(be, y, a, w);
}

/* rmsnorm_mod + n linears; when every Linear is an fp8 Linear taking its input fused, the norm writes the e4m3
 * activations once and each GEMM reads them (a not written). */
void dtc_rmsnorm_mod_linears(dt_backend *be, dt_mat x, dt_mat nw, dt_mat shift, float eps, dt_mat a, int n,
                             const dt_linear *const *w, const dt_mat *y) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(n >= 0 && a.rows == x.rows && a.cols == x.cols, "rmsnorm_mod_linears: %d Linears, a[%lld,%lld] for "
                "x[%lld,%lld]", n, (long long)a.rows, (long long)a.cols, (long long)x.rows, (long long)x.cols);
    int f8 = n > 0 && x.rows > 0;
    for (int i = 0; i < n; i++) {
        DTC_REQUIRE(x.cols == w[i]->in && y[i].cols == w[i]->out && y[i].rows == x.rows,
                    "rmsnorm_mod_linears: y%d[%lld,%lld] = norm(x[%lld,%lld]) · W[%lld,%lld]ᵀ: shape mismatch", i,
                    (long long)y[i].rows, (long long)y[i].cols, (long long)x.rows, (long long)x.cols,
                    (long long)w[i]->out, (long long)w[i]->in);
        f8 = f8 && w[i]->f8 && fp8_fuse_on(be, w[i]) && (y[i].dtype == DT_BF16 || y[i].dtype == DT_F32);
    }
    if (f8) {
        float *sx;
        uint8_t *xq = dtc_fp8_act_scratch(st, x.rows, x.cols, &sx);
        if (dtc_rmsnorm_mod_e4m3(st, x, nw, shift, eps, xq, sx) == 0) {
            for (int i = 0; i < n; i++) dtc_fp8_gemm_q(be, y[i], xq, sx, w[i]->f8, w[i]->bias, dt_mat_null(), 0);
            return;
        }
    }
    dtc_rmsnorm_mod(be, a, x, nw, shift, eps);
    for (int i = 0; i < n; i++) dtc_linear(be, y[i], a, w[i]);
}

/* act_mul into c[:, lead:] + linear_gated_add; for fp8 Linears one pass writes the GEMM's e4m3 activations of
 * [c[:, :lead] | act(a) ⊙ b] (c[:, lead:] not written). */
void dtc_act_linear_gated(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                          const dt_linear *w, dt_mat gate, dt_mat y) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(lead >= 0 && lead <= c.cols && a.cols == c.cols - lead && a.rows == c.rows,
                "act_linear_gated: c[%lld,%lld] from column %lld and a[%lld,%lld]: shape mismatch", (long long)c.rows,
                (long long)c.cols, (long long)lead, (long long)a.rows, (long long)a.cols);
    DTC_REQUIRE(c.cols == w->in && x.cols == w->out && x.rows == c.rows,
                "act_linear_gated: x[%lld,%lld] += c[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)x.rows,
                (long long)x.cols, (long long)c.rows, (long long)c.cols, (long long)w->out, (long long)w->in);
    if (w->f8 && fp8_fuse_on(be, w) && c.rows > 0 && (x.dtype == DT_BF16 || x.dtype == DT_F32)) {
        float *sx;
        uint8_t *xq = dtc_fp8_act_scratch(st, c.rows, c.cols, &sx);
        if (dtc_act_e4m3(st, dt_mat_cols(c, 0, lead), a, b, act, xq, sx) == 0) {
            dtc_fp8_gemm_q(be, x, xq, sx, w->f8, w->bias, gate, 1);
            return;
        }
    }
    dtc_act_mul(be, dt_mat_cols(c, lead, c.cols - lead), a, b, act);
    dtc_linear_gated_add(be, x, c, w, gate);
    (void)y;
}
