/* flux2_sp.c — the split (sequence-parallel) FLUX.2 forward (flux2_sp.h, docs/sequence-parallel.md).
 *
 * Each rank runs flux2.c's own block functions on its rows: T_r text rows then n_r image rows (text and image split
 * separately, flux2_sp_part), with the blocks' attention replaced (flux2_attn_hook) by sp_attention:
 *   pack      for every rank s, the columns of s's heads of Q, K, V -> a contiguous send block [T_r + n_r, 3·h_s·hd]
 *   exchange  each block to its rank as two messages (text rows, image rows); rank r receives every rank's rows of its
 *             own heads into recv [L (+ cached reference rows), 3·h_r·hd] at their single-GPU rows: [all text | all
 *             image], so the keys are in the one-GPU order
 *   attention over h_r heads -> o_att [L, h_r·hd]
 *   exchange  o_att's rows of rank s back to s (two messages) into a staging block [T_s + n_s, h_r·hd] per peer
 *   unpack    each staging block into its head columns of the block's attention output.
 * Everything else (timestep MLP and modulation: replicated; embedders, norms, Linears, RoPE, final layer: per row)
 * is local. Each rank writes its own noise rows of the output into the host array (the ranks share the process).
 *
 * Ranks and threads: rank 0 runs in the caller's thread on the caller's backend; ranks 1..N-1 are threads started at
 * load, each creating its backend in its own thread (a CUDA backend's device is that thread's) and serving jobs until
 * freed. A job (load, text upload, forward, free) runs on every rank between the communicator's enter and leave. */
#include "flux2_sp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct flux2_sp_rank sp_rank;

/* One pass through the blocks, the same on every rank. */
typedef struct {
    int t, n;             /* text rows, image rows (noise + appended references; the references alone in extract) */
    int n_noise;          /* image rows that are projected out (0: none, the reference-only pass) */
    int kv_rows;          /* cached reference K|V rows behind the live keys (0: none) */
    int store;            /* 1: the reference-only pass keeps each block's K|V of its heads */
    float timestep;       /* sigma (the model multiplies by 1000) */
    const float *img, *ref_tok;       /* host image rows: [n_noise] from img, then [n - n_noise] from ref_tok */
    const float *img_ids, *ref_ids;   /* their position ids */
    const float *txt, *txt_ids;       /* host text [t, joint] (or a resident key) and its ids */
    float *out;                       /* host [n_noise, out_channels] */
} sp_pass;

struct flux2_sp_rank {
    flux2_sp *sp;
    int rank;
    dt_backend *be;       /* this rank's backend (buffers, the communicator) */
    int own_be;
    flux2_model *model;
    dt_backend *ops;      /* the backend the model's ops run on: be, or the model's LoRA wrapper of it */
    const flux2_outer_w *ow;
    const flux2_double_w *db;
    const flux2_single_w *sb;
    flux2_config c;
    /* activations of the current shape: n image rows, t text rows of this rank; L rows and kv cached rows overall */
    int n, t, L, kv;
    flux2_acts x;
    dt_mat send;          /* [T_r + n_r, 3D]: the peers' blocks one after the other */
    dt_mat recv;          /* [L + kv, 3·h_r·hd] */
    dt_mat oatt;          /* [L, h_r·hd] */
    dt_mat ostage;        /* [T_r + n_r, D]: the peers' returned blocks one after the other */
    float *ids;           /* the ids the RoPE tables were built from [(t + n) * n_axes] */
    struct { const void *key; int t; dt_mat dev; unsigned long use; } res[2];   /* resident text, this rank's rows */
    dt_mat *cache;        /* KV references: per block [R, 2·h_r·hd] */
    const sp_pass *pass;  /* the pass running (read by the attention hook) */
    int block;            /* the block whose attention runs next */
    int device;           /* CUDA device (ranks 1..N-1 create their backend on it) */
    int failed;
    char err[512];
    pthread_t thread;
    int started;
};

struct flux2_sp {
    int n;
    flux2_config c;
    dt_comm *comm;
    sp_rank rank[FLUX2_SP_MAX_RANKS];
    int heads[FLUX2_SP_MAX_RANKS], head0[FLUX2_SP_MAX_RANKS];
    const char *path;
    flux2_load_opts load;   /* during flux2_sp_load */
    /* jobs for ranks 1..N-1 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long job_gen;
    int started;          /* rank threads running (ranks 1..started) */
    int job_done, quit;
    void (*job)(sp_rank *r, void *arg);
    void *job_arg;
    unsigned long res_clock;
    struct { int r, kv_cached, filled; float *tok, *ids; } ref;
};

static void rank_fail(sp_rank *r, const char *msg) {
    if (!r->failed) snprintf(r->err, sizeof r->err, "%s", msg);
    r->failed = 1;
}

/* ------------------------------------------------------------------ jobs on every rank */

static void run_job(sp_rank *r, void (*fn)(sp_rank *, void *), void *arg) {
    dt_comm *c = r->sp->comm;
    if (c) c->enter(c, r->rank);
    fn(r, arg);
    if (c) c->leave(c, r->rank);
}

static void *rank_thread(void *p);

/* fn on every rank (rank 0 here, the others in their threads); 0, or -1 with dt_last_error naming the first rank that
 * failed. */
static int run_all(flux2_sp *sp, void (*fn)(sp_rank *, void *), void *arg) {
    for (int i = 0; i < sp->n; i++) sp->rank[i].failed = 0;
    pthread_mutex_lock(&sp->mu);
    sp->job = fn;
    sp->job_arg = arg;
    sp->job_done = 0;
    sp->job_gen++;
    pthread_cond_broadcast(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    run_job(&sp->rank[0], fn, arg);
    pthread_mutex_lock(&sp->mu);
    while (sp->job_done < sp->started) pthread_cond_wait(&sp->cv, &sp->mu);
    pthread_mutex_unlock(&sp->mu);
    for (int i = 0; i < sp->n; i++)
        if (sp->rank[i].failed) {
            dt_set_error("sequence parallel rank %d: %s", i, sp->rank[i].err);
            return -1;
        }
    return 0;
}

/* Ranks 1..N-1: create the backend (reported through job_done), then run jobs until quit. */
static void *rank_thread(void *p) {
    sp_rank *r = p;
    flux2_sp *sp = r->sp;
    dt_backend *be0 = sp->rank[0].be;
    dt_backend_opts o = be0->opts;
    o.device = r->device;
    r->be = dt_backend_create(be0->name, &o);
    if (!r->be) rank_fail(r, dt_last_error());
    r->own_be = r->be != NULL;
    pthread_mutex_lock(&sp->mu);
    sp->job_done++;
    pthread_cond_broadcast(&sp->cv);
    unsigned long seen = sp->job_gen;
    for (;;) {
        while (sp->job_gen == seen && !sp->quit) pthread_cond_wait(&sp->cv, &sp->mu);
        if (sp->quit) break;
        seen = sp->job_gen;
        void (*fn)(sp_rank *, void *) = sp->job;
        void *arg = sp->job_arg;
        pthread_mutex_unlock(&sp->mu);
        if (r->be) run_job(r, fn, arg);
        pthread_mutex_lock(&sp->mu);
        sp->job_done++;
        pthread_cond_broadcast(&sp->cv);
    }
    pthread_mutex_unlock(&sp->mu);
    if (r->own_be) r->be->destroy(r->be);
    r->be = NULL;
    return NULL;
}

/* ------------------------------------------------------------------ buffers */

static void free_buffers(sp_rank *r) {
    dt_backend *be = r->be;
    flux2_acts_free(be, &r->x);
    dt_mat *m[] = {&r->send, &r->recv, &r->oatt, &r->ostage};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (m[i]->data) be->free(be, m[i]);
    free(r->ids);
    r->ids = NULL;
    r->n = r->t = r->L = r->kv = 0;
}

static void free_cache(sp_rank *r) {
    int nb = r->c.num_layers + r->c.num_single_layers;
    for (int i = 0; r->cache && i < nb; i++)
        if (r->cache[i].data) r->be->free(r->be, &r->cache[i]);
    free(r->cache);
    r->cache = NULL;
}

/* Activations for n image and t text rows of this rank, L rows and kv cached rows in all. */
static void ensure_buffers(sp_rank *r, int n, int t, int L, int kv) {
    if (r->x.s.data && r->n == n && r->t == t && r->L == L && r->kv == kv) return;
    free_buffers(r);
    dt_backend *be = r->be;
    const flux2_config *c = &r->c;
    int64_t D = c->hidden, lr = (int64_t)n + t, hr = r->sp->heads[r->rank] * (int64_t)c->head_dim;
    flux2_acts_alloc(be, c, n, t, c->num_layers > 0, c->num_single_layers > 0, &r->x);
    r->send = dt_alloc_or_die(be, lr, 3 * D, be->act_dtype);
    r->recv = dt_alloc_or_die(be, (int64_t)L + kv, 3 * hr, be->act_dtype);
    r->oatt = dt_alloc_or_die(be, L, hr, be->act_dtype);
    r->ostage = dt_alloc_or_die(be, lr, D, be->act_dtype);
    r->n = n; r->t = t; r->L = L; r->kv = kv;
}

/* A contiguous [rows, cols] matrix at element offset off of buffer m. */
static dt_mat block_at(dt_mat m, int64_t off, int64_t rows, int64_t cols) {
    dt_mat v = m;
    v.data = (char *)m.data + (size_t)off * dt_dtype_size(m.dtype);
    v.rows = rows;
    v.cols = cols;
    v.ld = cols;
    return v;
}

/* ------------------------------------------------------------------ the attention of one block */

static void exchange(sp_rank *r, const dt_comm_msg *send, int ns, const dt_comm_msg *recv, int nr) {
    if (r->sp->comm->exchange(r->sp->comm, r->rank, send, ns, recv, nr)) rank_fail(r, dt_last_error());
}

static void sp_attention(void *ud, dt_mat o, dt_mat q, dt_mat k, dt_mat v) {
    sp_rank *r = ud;
    flux2_sp *sp = r->sp;
    dt_backend *be = r->ops;
    const sp_pass *p = r->pass;
    const int N = sp->n, me = r->rank, hd = r->c.head_dim;
    const int64_t L = (int64_t)p->t + p->n, lr = (int64_t)r->t + r->n, hr = (int64_t)sp->heads[me] * hd;
    dt_comm_msg send[2 * FLUX2_SP_MAX_RANKS], recv[2 * FLUX2_SP_MAX_RANKS];
    int ns = 0, nr = 0;
    int64_t off = 0;
    /* pack: the columns of rank s's heads of this rank's rows, Q | K | V side by side */
    for (int s = 0; s < N; s++) {
        int64_t hs = (int64_t)sp->heads[s] * hd, c0 = (int64_t)sp->head0[s] * hd;
        dt_mat blk = block_at(r->send, off, lr, 3 * hs);
        be->copy(be, dt_mat_cols(blk, 0, hs), dt_mat_cols(q, c0, hs));
        be->copy(be, dt_mat_cols(blk, hs, hs), dt_mat_cols(k, c0, hs));
        be->copy(be, dt_mat_cols(blk, 2 * hs, hs), dt_mat_cols(v, c0, hs));
        send[ns++] = (dt_comm_msg){s, dt_mat_rows(blk, 0, r->t)};
        send[ns++] = (dt_comm_msg){s, dt_mat_rows(blk, r->t, r->n)};
        off += lr * 3 * hs;
        int ts0, ns0;
        int ts = flux2_sp_part(p->t, N, s, &ts0), nsr = flux2_sp_part(p->n, N, s, &ns0);
        recv[nr++] = (dt_comm_msg){s, dt_mat_rows(r->recv, ts0, ts)};
        recv[nr++] = (dt_comm_msg){s, dt_mat_rows(r->recv, (int64_t)p->t + ns0, nsr)};
    }
    exchange(r, send, ns, recv, nr);
    /* cached reference K|V of this rank's heads: kept (reference-only pass) or placed behind the live keys */
    dt_mat kv = dt_mat_cols(r->recv, hr, 2 * hr);
    if (p->store) be->copy(be, r->cache[r->block], dt_mat_rows(kv, 0, L));
    if (p->kv_rows) be->copy(be, dt_mat_rows(kv, L, p->kv_rows), r->cache[r->block]);
    if (hr > 0) {
        dt_mat qa = dt_mat_rows(dt_mat_cols(r->recv, 0, hr), 0, L);
        dt_mat ka = dt_mat_rows(dt_mat_cols(r->recv, hr, hr), 0, L + p->kv_rows);
        dt_mat va = dt_mat_rows(dt_mat_cols(r->recv, 2 * hr, hr), 0, L + p->kv_rows);
        flux2_block_attention(be, &r->c, r->oatt, qa, ka, va, sp->heads[me]);
    }
    /* back: rank s's rows of the output of this rank's heads; s's returned blocks into the staging buffer */
    ns = nr = 0;
    off = 0;
    for (int s = 0; s < N; s++) {
        int ts0, ns0;
        int ts = flux2_sp_part(p->t, N, s, &ts0), nsr = flux2_sp_part(p->n, N, s, &ns0);
        send[ns++] = (dt_comm_msg){s, dt_mat_rows(r->oatt, ts0, ts)};
        send[ns++] = (dt_comm_msg){s, dt_mat_rows(r->oatt, (int64_t)p->t + ns0, nsr)};
        int64_t hs = (int64_t)sp->heads[s] * hd;
        dt_mat blk = block_at(r->ostage, off, lr, hs);
        recv[nr++] = (dt_comm_msg){s, dt_mat_rows(blk, 0, r->t)};
        recv[nr++] = (dt_comm_msg){s, dt_mat_rows(blk, r->t, r->n)};
        off += lr * hs;
    }
    exchange(r, send, ns, recv, nr);
    off = 0;
    for (int s = 0; s < N; s++) {   /* unpack into the head columns of the block's attention output */
        int64_t hs = (int64_t)sp->heads[s] * hd;
        be->copy(be, dt_mat_cols(o, (int64_t)sp->head0[s] * hd, hs), block_at(r->ostage, off, lr, hs));
        off += lr * hs;
    }
    r->block++;
}

/* ------------------------------------------------------------------ one pass on one rank */

/* How many of the image rows [r0, r0 + count) are noise rows (the image sequence is [noise | references]). */
static int noise_rows(const sp_pass *p, int r0, int count) {
    int e = r0 + count < p->n_noise ? r0 + count : p->n_noise;
    return e > r0 ? e - r0 : 0;
}

/* Host rows [r0, r0 + count) of the image sequence [noise (p->img) | references (p->ref_tok)] -> dst [count, in]. */
static void upload_image_rows(dt_backend *be, dt_mat dst, const sp_pass *p, int r0, int count, int width) {
    int nn = noise_rows(p, r0, count);
    if (nn > 0) be->upload(be, dt_mat_rows(dst, 0, nn), p->img + (size_t)r0 * width);
    if (count - nn > 0)
        be->upload(be, dt_mat_rows(dst, nn, count - nn), p->ref_tok + (size_t)(r0 + nn - p->n_noise) * width);
}

static void pass_rank(sp_rank *r, void *arg) {
    const sp_pass *p = arg;
    flux2_sp *sp = r->sp;
    dt_backend *be = r->ops;
    const flux2_config *c = &r->c;
    const int N = sp->n, me = r->rank, na = c->n_axes;
    int t0, n0;
    const int t = flux2_sp_part(p->t, N, me, &t0), n = flux2_sp_part(p->n, N, me, &n0);
    ensure_buffers(r, n, t, p->t + p->n, p->kv_rows);
    r->pass = p;
    r->block = 0;

    /* RoPE of this rank's rows: [its text rows | its image rows] (rebuilt when the ids change) */
    size_t nid = (size_t)(t + n) * na;
    float *ids = dt_malloc(sizeof(float) * (nid ? nid : 1));
    if (t > 0) memcpy(ids, p->txt_ids + (size_t)t0 * na, sizeof(float) * (size_t)t * na);
    const int nn = noise_rows(p, n0, n);   /* image rows [n0, n0 + nn) are noise, the rest references */
    if (nn > 0) memcpy(ids + (size_t)t * na, p->img_ids + (size_t)n0 * na, sizeof(float) * (size_t)nn * na);
    if (n - nn > 0)
        memcpy(ids + (size_t)(t + nn) * na, p->ref_ids + (size_t)(n0 + nn - p->n_noise) * na,
               sizeof(float) * (size_t)(n - nn) * na);
    if (r->ids && !memcmp(r->ids, ids, sizeof(float) * nid)) {
        free(ids);
    } else {
        free(r->ids);
        r->ids = ids;
        flux2_acts_rope(be, c, &r->x, ids, t + n);
    }

    /* inputs: timestep sinusoid, this rank's image rows, its text rows (resident or from the host) */
    float *emb = dt_malloc(sizeof(float) * c->tg_channels);
    flux2_timestep_sinusoid(p->timestep * 1000.0f, c->tg_channels, emb);
    be->upload(be, r->x.emb, emb);
    free(emb);
    upload_image_rows(be, r->x.in_img, p, n0, n, c->in_channels);
    if (t > 0) {
        int slot = -1;
        for (int i = 0; i < 2; i++)
            if (r->res[i].key && r->res[i].key == p->txt && r->res[i].t == p->t) slot = i;
        if (slot >= 0) be->copy(be, r->x.in_txt, r->res[slot].dev);
        else be->upload(be, r->x.in_txt, p->txt + (size_t)t0 * c->joint_dim);
    }

    /* the blocks (flux2.c's), the attention through sp_attention */
    int nd = c->num_layers, nsb = c->num_single_layers;
    int64_t lr = (int64_t)t + n;
    flux2_outer_io oio = flux2_acts_outer(&r->x);
    if (nd > 0) dt_prefetch(be, r->db[0].to_qkv, dt_mat_null(), n);
    else if (nsb > 0) dt_prefetch(be, flux2_single_first(&r->sb[0]), dt_mat_null(), lr);
    flux2_pre(be, r->ow, &oio, n, t);
    flux2_double_io io = flux2_acts_double(&r->x);
    io.attn = sp_attention;
    io.attn_ud = r;
    for (int i = 0; i < nd; i++) {
        int last = i == nd - 1;
        const dt_linear *next = !last ? r->db[i + 1].to_qkv : nsb > 0 ? flux2_single_first(&r->sb[0]) : NULL;
        flux2_double_block(be, c, &r->db[i], &io, n, t, i == 0, last, next, last ? lr : n);
    }
    flux2_single_io sio = flux2_acts_single(&r->x);
    sio.attn = sp_attention;
    sio.attn_ud = r;
    for (int i = 0; i < nsb; i++)
        flux2_single_block(be, c, &r->sb[i], &sio, i + 1 < nsb ? flux2_single_first(&r->sb[i + 1]) : NULL);

    /* this rank's noise rows: final norm + projection, into the host output at their offset */
    if (nn > 0) {
        oio.out = dt_mat_rows(oio.out, 0, nn);
        flux2_final(be, c, r->ow, &oio, nn, t, NULL, NULL);
        be->download(be, p->out + (size_t)n0 * c->out_channels, oio.out);
    }
    if (be->sync(be)) rank_fail(r, dt_last_error());
    r->pass = NULL;
}

/* ------------------------------------------------------------------ load / free */

static void load_rank(sp_rank *r, void *arg) {
    (void)arg;
    if (r->rank == 0) return;   /* rank 0 loaded first, alone (its errors are the caller's) */
    r->model = flux2_load_ex(r->be, r->sp->path, &r->sp->load);
    if (!r->model) { rank_fail(r, dt_last_error()); return; }
    r->ops = flux2_model_backend(r->model);
    r->c = *flux2_get_config(r->model);
    flux2_model_weights(r->model, &r->ow, &r->db, &r->sb);
}

static void text_drop_rank(sp_rank *r, void *arg) {
    (void)arg;
    for (int i = 0; i < 2; i++)
        if (r->res[i].dev.data) r->be->free(r->be, &r->res[i].dev);
    memset(r->res, 0, sizeof r->res);
}

static void free_rank(sp_rank *r, void *arg) {
    (void)arg;
    if (!r->be) return;
    free_buffers(r);
    free_cache(r);
    text_drop_rank(r, NULL);
    flux2_free(r->model);
    r->model = NULL;
}

void flux2_sp_free(flux2_sp *sp) {
    if (!sp) return;
    if (sp->comm || sp->rank[0].model) run_all(sp, free_rank, NULL);
    dt_comm_destroy(sp->comm);   /* before the backends (NCCL's communicators live on their devices) */
    sp->comm = NULL;
    pthread_mutex_lock(&sp->mu);
    sp->quit = 1;
    pthread_cond_broadcast(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    for (int i = 1; i < sp->n; i++)
        if (sp->rank[i].started) pthread_join(sp->rank[i].thread, NULL);
    free(sp->ref.tok);
    free(sp->ref.ids);
    pthread_cond_destroy(&sp->cv);
    pthread_mutex_destroy(&sp->mu);
    free((char *)sp->path);
    free(sp);
}

flux2_sp *flux2_sp_load(dt_backend *be, const char *path, const flux2_sp_opts *o) {
    const int N = o->ranks;
    if (N < 1 || N > FLUX2_SP_MAX_RANKS) {
        dt_set_error("--sequence-parallel %d: 1 to %d ranks", N, FLUX2_SP_MAX_RANKS);
        return NULL;
    }
    int dev[FLUX2_SP_MAX_RANKS];
    for (int r = 0; r < N; r++) dev[r] = o->n_devices > r ? o->devices[r] : be->opts.device + r;
    if (!strcmp(be->name, "cuda")) {
        int have = dt_backend_cuda_device_count();
        for (int r = 0; r < N; r++)
            if (dev[r] < 0 || dev[r] >= have) {
                dt_set_error("--sequence-parallel %d needs %d GPUs: rank %d is on device %d, but %d GPU%s visible", N, N,
                             r, dev[r], have, have == 1 ? " is" : "s are");
                return NULL;
            }
        if (dev[0] != be->opts.device) {
            dt_set_error("sequence parallel: rank 0's device %d is not the backend's (%d)", dev[0], be->opts.device);
            return NULL;
        }
    }
    flux2_sp *sp = dt_calloc(1, sizeof *sp);
    sp->n = N;
    sp->path = dt_strdup(path);
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cv, NULL);
    sp_rank *r0 = &sp->rank[0];
    r0->sp = sp;
    r0->be = be;
    /* rank 0 first, here: its errors (a bad folder, a bad config) come out as they would on one GPU */
    sp->load = o->load;
    r0->model = flux2_load_ex(be, path, &sp->load);
    if (!r0->model) { flux2_sp_free(sp); return NULL; }
    r0->ops = flux2_model_backend(r0->model);
    sp->c = r0->c = *flux2_get_config(r0->model);
    flux2_model_weights(r0->model, &r0->ow, &r0->db, &r0->sb);
    if (N > sp->c.heads) {
        dt_set_error("--sequence-parallel %d: the transformer has %d attention heads, so at most %d ranks (each rank "
                     "computes whole heads)", N, sp->c.heads, sp->c.heads);
        flux2_sp_free(sp);
        return NULL;
    }
    for (int r = 0; r < N; r++) sp->heads[r] = flux2_sp_part(sp->c.heads, N, r, &sp->head0[r]);
    /* ranks 1..N-1: one thread each, started one after the other (each creates its backend and reports through
     * job_done), then loaded together */
    for (int r = 1; r < N; r++) {
        sp_rank *rk = &sp->rank[r];
        rk->sp = sp;
        rk->rank = r;
        rk->device = dev[r];
        pthread_mutex_lock(&sp->mu);
        int before = sp->job_done;
        pthread_mutex_unlock(&sp->mu);
        if (pthread_create(&rk->thread, NULL, rank_thread, rk)) {
            dt_set_error("sequence parallel: cannot start the thread of rank %d", r);
            flux2_sp_free(sp);
            return NULL;
        }
        rk->started = 1;
        pthread_mutex_lock(&sp->mu);
        sp->started = r;
        while (sp->job_done == before) pthread_cond_wait(&sp->cv, &sp->mu);
        pthread_mutex_unlock(&sp->mu);
        if (!rk->be) {
            dt_set_error("--sequence-parallel %d: rank %d (device %d): %s", N, r, dev[r], rk->err);
            flux2_sp_free(sp);
            return NULL;
        }
    }
    dt_backend *bes[FLUX2_SP_MAX_RANKS];
    for (int r = 0; r < N; r++) bes[r] = sp->rank[r].be;
    sp->comm = dt_comm_create(bes, N);
    if (!sp->comm) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_last_error());
        dt_set_error("--sequence-parallel %d: %s", N, why);
        flux2_sp_free(sp);
        return NULL;
    }
    if (run_all(sp, load_rank, NULL)) { flux2_sp_free(sp); return NULL; }
    dt_log(1, "ditrun: sequence parallel: %d rank%s (%s), %d heads as", N, N > 1 ? "s" : "", sp->comm->name, sp->c.heads);
    for (int r = 0; r < N; r++) dt_log(1, "%s%d", r ? "+" : " ", sp->heads[r]);
    dt_log(1, "\n");
    return sp;
}

const flux2_config *flux2_sp_get_config(const flux2_sp *sp) { return &sp->c; }
int flux2_sp_ranks(const flux2_sp *sp) { return sp->n; }
const char *flux2_sp_comm_name(const flux2_sp *sp) { return sp->comm->name; }

/* ------------------------------------------------------------------ resident text */

typedef struct { const void *key; const float *txt; int t; } text_job;

static void text_rank(sp_rank *r, void *arg) {
    const text_job *j = arg;
    int t0, t = flux2_sp_part(j->t, r->sp->n, r->rank, &t0);
    int slot = -1;
    for (int i = 0; i < 2; i++)
        if (r->res[i].key == j->key && r->res[i].t == j->t) slot = i;
    if (slot < 0) {
        slot = r->res[0].use <= r->res[1].use ? 0 : 1;
        if (r->res[slot].dev.data) r->be->free(r->be, &r->res[slot].dev);
        if (t > 0 && r->be->alloc(r->be, &r->res[slot].dev, t, r->c.joint_dim, r->be->act_dtype)) {
            rank_fail(r, dt_last_error());
            r->res[slot].key = NULL;
            return;
        }
        r->res[slot].key = j->key;
        r->res[slot].t = j->t;
    }
    r->res[slot].use = r->sp->res_clock;
    if (t > 0) r->be->upload(r->be, r->res[slot].dev, j->txt + (size_t)t0 * r->c.joint_dim);
}

static int text_upload(flux2_sp *sp, const void *key, const float *txt, int t) {
    if (t <= 0) { dt_set_error("flux2: resident text needs at least one token (got %d)", t); return -1; }
    sp->res_clock++;
    text_job j = {key, txt, t};
    return run_all(sp, text_rank, &j);
}

int flux2_sp_text_resident(flux2_sp *sp, const float *txt, int t) {
    if (!txt) return run_all(sp, text_drop_rank, NULL);
    return text_upload(sp, txt, txt, t);
}

int flux2_sp_text_resident_mat(flux2_sp *sp, const void *key, dt_mat src) {
    if (!key || src.rows <= 0 || src.cols != sp->c.joint_dim) {
        dt_set_error("flux2: resident text from a [%lld, %lld] matrix, expected [tokens, %d] and a key",
                     (long long)src.rows, (long long)src.cols, sp->c.joint_dim);
        return -1;
    }
    /* on rank 0's device: through the host once (the ranks share it), then each rank uploads its rows */
    float *h = dt_malloc(sizeof(float) * (size_t)src.rows * src.cols);
    dt_backend *be = sp->rank[0].be;
    be->download(be, h, src);
    int rc = text_upload(sp, key, h, (int)src.rows);
    free(h);
    return rc;
}

/* ------------------------------------------------------------------ references and the forward */

static void drop_cache_rank(sp_rank *r, void *arg) {
    (void)arg;
    free_cache(r);
}

static void alloc_cache_rank(sp_rank *r, void *arg) {
    int R = *(const int *)arg, nb = r->c.num_layers + r->c.num_single_layers;
    int64_t hr = (int64_t)r->sp->heads[r->rank] * r->c.head_dim;
    r->cache = dt_calloc(nb ? nb : 1, sizeof(dt_mat));
    for (int i = 0; i < nb; i++)
        if (r->be->alloc(r->be, &r->cache[i], R, 2 * hr, r->be->act_dtype)) { rank_fail(r, dt_last_error()); return; }
}

int flux2_sp_set_refs(flux2_sp *sp, const float *tokens, const float *ids, int r, int kv_cached) {
    run_all(sp, drop_cache_rank, NULL);
    free(sp->ref.tok);
    free(sp->ref.ids);
    memset(&sp->ref, 0, sizeof sp->ref);
    if (!tokens || r <= 0) return 0;
    if (!ids) { dt_set_error("flux2: reference tokens need their position ids"); return -1; }
    const flux2_config *c = &sp->c;
    sp->ref.tok = dt_malloc(sizeof(float) * (size_t)r * c->in_channels);
    memcpy(sp->ref.tok, tokens, sizeof(float) * (size_t)r * c->in_channels);
    sp->ref.ids = dt_malloc(sizeof(float) * (size_t)r * c->n_axes);
    memcpy(sp->ref.ids, ids, sizeof(float) * (size_t)r * c->n_axes);
    sp->ref.r = r;
    sp->ref.kv_cached = kv_cached != 0;
    if (kv_cached) {
        if (r < sp->n) {
            dt_set_error("flux2: %d KV-cached reference tokens cannot be split over %d ranks", r, sp->n);
            return -1;
        }
        if (run_all(sp, alloc_cache_rank, &r)) { flux2_sp_set_refs(sp, NULL, NULL, 0, 0); return -1; }
    }
    return 0;
}

int flux2_sp_forward(flux2_sp *sp, const float *img, int n, const float *txt, int t, float timestep,
                     const float *img_ids, const float *txt_ids, float *out) {
    if (n <= 0 || t < 0) { dt_set_error("flux2: need at least one image token (got %d image, %d text)", n, t); return -1; }
    if (!(timestep == timestep)) { dt_set_error("flux2: timestep is NaN"); return -1; }
    int ra = sp->ref.r && !sp->ref.kv_cached ? sp->ref.r : 0, kv = sp->ref.kv_cached ? sp->ref.r : 0;
    if (n + ra < sp->n) {
        dt_set_error("flux2: %d image tokens cannot be split over %d ranks (sequence parallelism needs at least one per "
                     "rank)", n + ra, sp->n);
        return -1;
    }
    if (kv && !sp->ref.filled) {   /* the reference-only pass, split too: each rank keeps its heads' K|V */
        sp_pass e = {.t = 0, .n = kv, .n_noise = 0, .kv_rows = 0, .store = 1, .timestep = 0.0f, .img = NULL,
                     .ref_tok = sp->ref.tok, .img_ids = NULL, .ref_ids = sp->ref.ids, .txt = NULL, .txt_ids = NULL,
                     .out = NULL};
        if (run_all(sp, pass_rank, &e)) return -1;
        sp->ref.filled = 1;
    }
    sp_pass p = {.t = t, .n = n + ra, .n_noise = n, .kv_rows = kv, .store = 0, .timestep = timestep, .img = img,
                 .ref_tok = sp->ref.tok, .img_ids = img_ids, .ref_ids = sp->ref.ids, .txt = txt, .txt_ids = txt_ids,
                 .out = out};
    return run_all(sp, pass_rank, &p);
}
