/* One lookup enqueued on a slot (included by _host_gather_staged.h, where StagedState is drawn):
 * the run's fields, the host ids copied and counted, and the stream's side of the hand-over:
 * host functions per chunk, or the stream signals of _stream_signal.h with a wait before each
 * chunk's copy.
 */

/* A job is on its way: the workers awake, and the watcher spinning, when it comes. */
static void staged_announce(StagedState *state) {
    if (state->signalled && state->signal.set) atomic_store(&state->signal.set->last_seen_ns, now_ns());
    pool_prewake(state->job.pool);
}

/* Copy host ids into the pinned buffer, counting those outside [lo, hi) on the way (one pass). */
static int64_t copy_and_count(void *dst, const void *src, int ids64, int64_t n, int64_t lo, int64_t hi) {
    int64_t bad = 0;
    if (ids64) {
        const int64_t *in = src;
        int64_t *out = dst;
        for (int64_t i = 0; i < n; i++) {
            out[i] = in[i];
            bad += (in[i] < lo) | (in[i] >= hi);
        }
    } else {
        const int32_t *in = src;
        int32_t *out = dst;
        for (int64_t i = 0; i < n; i++) {
            out[i] = in[i];
            bad += ((int64_t)in[i] < lo) | ((int64_t)in[i] >= hi);
        }
    }
    return bad;
}

/* Host functions: the stream runs host_step per chunk, which gathers (with the pool) and returns. */
static int enqueue_host_functions(StagedState *state, CUstream s, uint64_t device_staging) {
    Job *job = &state->job;
    const int64_t rb = state->row_bytes, chunk_rows = job->chunk_blocks * job->block_rows;
    for (int64_t c = 0; c < job->nchunks; c++) {
        int64_t r0 = c * chunk_rows, r1 = r0 + chunk_rows > job->n ? job->n : r0 + chunk_rows;
        if (cu_failed(cu.launch_host_func(s, host_step, &state->steps[c]), "cuLaunchHostFunc of the row gather") ||
            cu_failed(cu.memcpy_htod((CUdeviceptr)(device_staging + r0 * rb), state->staging + r0 * rb,
                                     (size_t)((r1 - r0) * rb), s),
                      "copy of the gathered rows to the GPU (cuMemcpyHtoDAsync)"))
            return -1;  /* in_flight stays raised: the slot is never reused or freed */
    }
    return 0;
}

/* Stream signals: each chunk's copy waits until the word says the chunk is staged. */
static int enqueue_chunk_copies(StagedState *state, CUstream s, uint64_t device_staging) {
    Job *job = &state->job;
    const int64_t rb = state->row_bytes, chunk_rows = job->chunk_blocks * job->block_rows;
    for (int64_t c = 0; c < job->nchunks; c++) {
        int64_t r0 = c * chunk_rows, r1 = r0 + chunk_rows > job->n ? job->n : r0 + chunk_rows;
        if (cu_failed(cu.stream_wait_value32(s, state->word_dev, (uint32_t)(c + 1), 0x0 /* GEQ */),
                      "cuStreamWaitValue32 for a staged chunk") ||
            cu_failed(cu.memcpy_htod((CUdeviceptr)(device_staging + r0 * rb), state->staging + r0 * rb,
                                     (size_t)((r1 - r0) * rb), s),
                      "copy of the gathered rows to the GPU (cuMemcpyHtoDAsync)"))
            return -1;
    }
    return 0;
}

static int enqueue_fork(StagedState *state, CUstream caller, CUstream s) {
    if (caller == s) return 0;  /* the prefetch stream itself (the HBM cache forked before its classify kernel) */
    return cu_failed(cu.event_record(state->fork, caller), "cuEventRecord on the caller's stream") ||
           cu_failed(cu.stream_wait_event(s, state->fork, 0), "cuStreamWaitEvent on the prefetch stream") ? -1 : 0;
}

/* The job's fields for one run; host ids are copied into pinned memory and counted on the way
 * (checked here, so that a bad call raises at once and enqueues nothing): returns the bad ones. */
static int64_t staged_prepare(StagedState *state, uint64_t table, int64_t row_lo, int64_t row_hi, uint64_t ids,
                              int where, int ids64, int64_t n, uint64_t counter, int64_t nchunks, int skip_marked) {
    Job *job = &state->job;
    job->skip_marked = skip_marked;
    job->table = (const uint8_t *)(uintptr_t)table;
    job->row_lo = row_lo, job->row_hi = row_hi, job->row_bytes = state->row_bytes;
    job->ids64 = ids64;
    job->staging = state->staging;
    job->bad_total = (int64_t *)(uintptr_t)counter;
    if (where == IDS_ON_HOST) {
        int64_t bad = copy_and_count(state->ids_buf, (const void *)(uintptr_t)ids, ids64, n, row_lo, row_hi);
        if (bad) return bad;
    }
    job->ids = where == IDS_IN_PLACE ? (const void *)(uintptr_t)ids  /* a graph's host input: read at every replay */
                                     : state->ids_buf;
    job_plan(job, n, nchunks);
    return 0;
}

static PyObject *staged_enqueue(StagedJobObject *self, PyObject *args) {
    unsigned long long caller, stream, table, ids, device_staging, counter;
    long long row_lo, row_hi, n, nchunks;
    int where, ids64, skip_marked = 0;
    if (!PyArg_ParseTuple(args, "KKKLLKipLKKL|p", &caller, &stream, &table, &row_lo, &row_hi, &ids, &where, &ids64,
                          &n, &device_staging, &counter, &nchunks, &skip_marked))
        return NULL;
    StagedState *state = self->state;
    if (!state || check_pool(state->job.pool)) return NULL;
    if (n < 1 || n > state->capacity || row_hi <= row_lo || where < IDS_ON_HOST || where > IDS_IN_PLACE) {
        PyErr_Format(PyExc_ValueError, "cannot stage %lld ids (capacity %lld) from rows [%lld, %lld), ids at %d",
                     n, state->capacity, row_lo, row_hi, where);
        return NULL;
    }
    if (!state->graph && atomic_load(&state->in_flight)) {
        PyErr_SetString(err_class(), "this staging slot is still in use by an earlier lookup");
        return NULL;
    }
    CUstream s = (CUstream)(uintptr_t)stream, from = (CUstream)(uintptr_t)caller;
    CUcontext ctx = NULL;
    if (cu_failed(cu.ctx_get_current(&ctx), "cuCtxGetCurrent")) return NULL;
    if (ctx == NULL) {  /* a thread that never touched CUDA: use the stream's context */
        if (cu_failed(cu.stream_get_ctx(s, &ctx), "cuStreamGetCtx") ||
            cu_failed(cu.ctx_set_current(ctx), "cuCtxSetCurrent"))
            return NULL;
    }
    if (skip_marked && (where != IDS_ON_DEVICE || !ids64)) {
        PyErr_SetString(PyExc_ValueError, "ids marked by the HBM cache come from the device, as int64");
        return NULL;
    }
    int64_t bad = staged_prepare(state, table, row_lo, row_hi, ids, where, ids64, n, counter, nchunks, skip_marked);
    if (bad) return PyLong_FromLongLong(bad);
    const size_t id_bytes = ids64 ? 8 : 4;
    /* Ids already in pinned memory and staging the stream has finished copying (the slot's last
     * lookup is done): gather now, while the stream may still be busy with earlier work.  The
     * fork then only has to precede the dequant, which writes memory the caller's stream allocated. */
    const int now = state->signalled && where == IDS_ON_HOST && cu.event_query(state->done) == 0;
    if (!state->graph) atomic_fetch_add(&state->in_flight, 1);
    if (now) {
        signal_start_now(&state->signal);
        if (enqueue_chunk_copies(state, s, device_staging) || enqueue_fork(state, from, s)) return NULL;
        return PyLong_FromLong(0);
    }
    staged_announce(state);
    if (enqueue_fork(state, from, s)) return NULL;
    if (where == IDS_ON_DEVICE &&
        cu_failed(cu.memcpy_dtoh(state->ids_buf, (CUdeviceptr)ids, (size_t)n * id_bytes, s),
                  "copy of the ids to pinned memory (cuMemcpyDtoHAsync)"))
        return NULL;
    if (!state->signalled) return enqueue_host_functions(state, s, device_staging) ? NULL : PyLong_FromLong(0);
    /* The write carries a memory barrier: the ids' copy is visible before a worker sees ARMED. */
    if (cu_failed(cu.stream_write_value32(s, state->word_dev, SIGNAL_ARMED, 0x0 /* DEFAULT */),
                  "cuStreamWriteValue32 that starts the row gather") ||
        enqueue_chunk_copies(state, s, device_staging))
        return NULL;  /* in_flight stays raised: the slot is never reused or freed */
    return PyLong_FromLong(0);
}
