/* cuda_prefetch.cu — transient weights of the CUDA backend: the two slots that hold the main queue's dequantized
 * 4/8-bit Linears, the prefetch hint that fills one ahead on a low-priority stream (linear_prefetch; host weights:
 * the packed form copied to the device by the copy engine first), and the lookup a GEMM makes for its weights. */
#include "cuda_linear.cuh"

/* On the main queue (not the side queue, not with the prefetch off) every transient Linear's dequantized weights
 * go through two slots, each as large as the largest transient Linear. linear_prefetch(w, gate) dequantizes w
 * (rows scaled by gate, as linear_gated_add folds it) into the slot used least recently on pf_stream, after the
 * main queue's work issued so far (so the gate is final and the slot's last GEMM has finished); the Linear that
 * matches (same w and gate) waits for it and runs its GEMM from the slot. A Linear without a matching prefetch
 * dequantizes into a slot on the main queue as before. pf_stream has the lowest priority and the queues the
 * highest (unless o.no_prefetch), so the dequantization fills the SMs that the queued kernels leave idle (wave
 * tails, launch gaps) instead of delaying them. Results are bit-identical with and without prefetching. */
static int pf_usable(const dtc_state *st, const dt_linear *w) {
    return st->pf_stream && st->cur_queue == 0 && (w->qw || w->gq) && !w->w && (size_t)w->out * w->in * 2 <= st->pf[0].buf.size &&
           (size_t)w->out * w->in * 2 <= st->pf[1].buf.size;
}

static int pf_find(const dtc_state *st, const dt_linear *w, const void *gate, int gate_f32) {
    for (int i = 0; i < 2; i++)
        if (st->pf[i].w == w && st->pf[i].gate == gate && (!gate || st->pf[i].gate_f32 == gate_f32)) return i;
    return -1;
}

/* The slot to (re)fill: not holding an unconsumed prefetch, least recently used; -1 if both hold one. */
static int pf_victim(const dtc_state *st) {
    int v = -1;
    for (int i = 0; i < 2; i++)
        if (!st->pf[i].pending && (v < 0 || st->pf[i].stamp < st->pf[v].stamp)) v = i;
    return v;
}

/* Slot i holds nothing reusable (after its Linear consumed it, or when its events or Linear are gone). */
static void pf_clear(dtc_state *st, int i) {
    st->pf[i].w = st->pf[i].gate = nullptr;
    st->pf[i].pending = 0;
}

void dtc_prefetch_join(dtc_state *st) {
    if (!st->pf_unjoined) return;
    CK(cudaEventRecord(st->pf_last, st->pf_stream));
    CK(cudaStreamWaitEvent(st->q.stream, st->pf_last, 0));
    st->pf_unjoined = 0;
}

/* Forget every slot's content (their events may belong to another capture); the caller joined first. */
void dtc_prefetch_forget(dtc_state *st) {
    for (int i = 0; i < 2; i++) pf_clear(st, i);
}

void dtc_linear_prefetch(dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows) {
    dtc_state *st = dtc(be);
    if (!w || rows <= 0 || !pf_usable(st, w) || dtc_qpath_for(be, rows) != DT_QPATH_TRANSIENT) return;
    if (gate.data && (w->bias || (gate.dtype != DT_BF16 && gate.dtype != DT_F32))) return;  /* not folded */
    const int gf = gate.data && gate.dtype == DT_F32;
    if (pf_find(st, w, gate.data, gf) >= 0) return;
    int s = pf_victim(st);
    if (s < 0) return;
    CK(cudaEventRecord(st->pf_pos, st->q.stream));
    CK(cudaStreamWaitEvent(st->pf_stream, st->pf_pos, 0));
    /* host weights: the packed form crosses the bus by the copy engine into pf_stage, then the dequantization reads
     * it there: the copy needs no SM, so it overlaps the GEMMs, where a dequantization reading host memory itself
     * would only find SMs in their wave tails. (After the wait like every pf_stream write: a captured graph's
     * dequantization may still be reading the stage; in a bus-bound stream the main queue's work is done by then.) */
    size_t qbytes = 0, sb_off = 0, staged = w->host && w->qw && !w->gq ? dtc_packed_bytes(w, &qbytes, &sb_off) : 0;
    if (staged && staged > st->pf_stage.size) staged = 0;   /* (not reserved: read in place, as without the hint) */
    if (staged) {
        char *stage = (char *)st->pf_stage.ptr;
        CK(cudaMemcpyAsync(stage, w->qw, qbytes, cudaMemcpyHostToDevice, st->pf_stream));
        CK(cudaMemcpyAsync(stage + sb_off, w->sb, staged - sb_off, cudaMemcpyHostToDevice, st->pf_stream));
        dtc_dequant_launch_from(st, st->pf_stream, (__nv_bfloat16 *)st->pf[s].buf.ptr, w, (const uint32_t *)stage,
                                (const float2 *)(stage + sb_off), gate.data, gf);
    } else
        dtc_dequant_launch(st, st->pf_stream, (__nv_bfloat16 *)st->pf[s].buf.ptr, w, gate.data, gf);
    CK(cudaEventRecord(st->pf[s].ready, st->pf_stream));
    st->pf[s].w = w;
    st->pf[s].gate = gate.data;
    st->pf[s].gate_f32 = gf;
    st->pf[s].pending = 1;
    st->pf[s].stamp = ++st->pf_clock;
    st->pf_unjoined = 1;
}

/* w's dequantized weights (rows scaled by rowscale when given) for a GEMM on the current queue. */
__nv_bfloat16 *dtc_transient_weights(dtc_state *st, const dt_linear *w, const void *rowscale, int rs_f32) {
    if (!pf_usable(st, w)) {
        __nv_bfloat16 *tmp = (__nv_bfloat16 *)dtc_scratch_get(st, &st->q.s_qdeq, (size_t)w->out * w->in * 2);
        dtc_dequant_launch(st, st->q.stream, tmp, w, rowscale, rs_f32);
        return tmp;
    }
    int s = pf_find(st, w, rowscale, rs_f32);
    if (s >= 0 && st->pf[s].pending) {   /* prefetched: wait for it */
        CK(cudaStreamWaitEvent(st->q.stream, st->pf[s].ready, 0));
    } else {
        s = pf_victim(st);
        if (s < 0) {   /* both slots hold prefetches for other Linears: take the older one's slot */
            s = st->pf[0].stamp < st->pf[1].stamp ? 0 : 1;
            CK(cudaStreamWaitEvent(st->q.stream, st->pf[s].ready, 0));
        }
        dtc_dequant_launch(st, st->q.stream, (__nv_bfloat16 *)st->pf[s].buf.ptr, w, rowscale, rs_f32);
    }
    /* consumed: the content is not reused (a later call dequantizes again, as without prefetching) */
    pf_clear(st, s);
    st->pf[s].stamp = ++st->pf_clock;
    return (__nv_bfloat16 *)st->pf[s].buf.ptr;
}

void dtc_prefetch_drop(dtc_state *st, const dt_linear *w) {
    for (int i = 0; i < 2; i++)
        if (st->pf[i].w == w) {   /* a later Linear at this address must not match the slot */
            dtc_prefetch_join(st);
            pf_clear(st, i);
        }
}
