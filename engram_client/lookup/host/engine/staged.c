/* One lookup enqueued on a staged slot (staged.h draws the slot): the run's fields, the host ids
 * copied and counted, and the stream's side of the hand-over.
 *
 * A StagedJob owns pinned ids and staging buffers and enqueues, on a CUDA stream, in stream order:
 *
 *     [ids on the GPU: copy to pinned ids] -> write ARMED -> wait(chunk 0 staged) -> copy chunk 0
 *     -> wait(chunk 1 staged) -> copy chunk 1 -> ...        (stream memory operations, signal.c)
 *     [ids ...] -> host fn(start, gather chunk 0) -> copy chunk 0 -> host fn(chunk 1) -> ...  (fallback)
 *
 * so the copy of one chunk overlaps the gather of the next, and nothing holds SMs.  The same calls
 * record graph nodes when the stream is capturing, and every replay gathers the ids then in the
 * input buffer.  libcuda is opened with dlopen at the first GPU use: the module builds and runs
 * without CUDA, and the CPU gather never needs it.
 *
 * Owns: the slot's pinned buffers and events, and what is enqueued on the stream for one run.  May
 * call: libcuda (cuda.h), the pool's jobs (pool.h), the signal protocol (signal.h).  Must never: free
 * a slot a run may still touch (in_flight raised, or held by a graph), or enqueue part of a run after
 * a refusal it did not raise.  Everything here but host_step runs with the GIL held; host_step runs
 * on the driver's thread, without it, and touches no Python object.
 */
#include "staged.h"
#include "pool.h"

static void host_step(void *arg) {
    Step *step = arg;
    Job *job = &step->state->job;
    if (step->chunk == 0) job_start(job);
    job_wait_chunk(job, step->chunk);
    if (step->chunk == job->nchunks - 1) {
        job_finish(job);
        if (!step->state->graph) atomic_fetch_sub(&step->state->in_flight, 1);
    }
}

/* Allocate pinned memory, also while the caller's stream captures a graph (allowed in relaxed mode). */
static void *pinned_alloc(size_t nbytes) {
    void *ptr = NULL;
    /* DEVICEMAP: the device addresses the signal word in it (cuMemHostGetDevicePointer) */
    CUresult rc = cu.mem_host_alloc(&ptr, nbytes ? nbytes : 1, 0x1 | 0x2 /* PORTABLE | DEVICEMAP */);
    if (cu_failed(rc, "cuMemHostAlloc of lookup staging")) return NULL;
    return ptr;
}

void staged_free(StagedState *state) {  /* may fail at exit once the context is gone: nothing to do */
    if (state->simulated) {
        free(state->ids_buf);
        free(state->staging);
        free(state);
        return;
    }
    if (state->ids_buf) cu.mem_free_host(state->ids_buf);
    if (state->staging) cu.mem_free_host(state->staging);
    if (state->fork) cu.event_destroy(state->fork);
    if (state->done) cu.event_destroy(state->done);
    free(state);
}

/* Buffers and events (and where the device sees the signal word), allowed while the caller's
 * stream captures a graph (in relaxed mode). */
int staged_alloc(StagedState *state, int signalled) {
    int mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED */
    cu.exchange_capture_mode(&mode);
    int ok = (state->ids_buf = pinned_alloc(ids_bytes(state->capacity) + 64)) &&
             (state->staging = pinned_alloc((size_t)(state->capacity * state->row_bytes))) &&
             !cu_failed(cu.event_create(&state->fork, 0x2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate") &&
             !cu_failed(cu.event_create(&state->done, 0x2), "cuEventCreate") &&
             (!signalled || !cu_failed(cu.mem_host_get_device_pointer(&state->word_dev, state->ids_buf +
                                                                      ids_bytes(state->capacity), 0),
                                       "cuMemHostGetDevicePointer of the lookup's signal word"));
    cu.exchange_capture_mode(&mode);
    return ok ? 0 : -1;
}

/* A job is on its way: the workers awake, and the watcher spinning, when it comes. */
void staged_announce(StagedState *state) {
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
int enqueue_host_functions(StagedState *state, CUstream s, uint64_t device_staging) {
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
int enqueue_chunk_copies(StagedState *state, CUstream s, uint64_t device_staging) {
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

int enqueue_fork(StagedState *state, CUstream caller, CUstream s) {
    if (caller == s) return 0;  /* the prefetch stream itself (the HBM cache forked before its classify kernel) */
    return cu_failed(cu.event_record(state->fork, caller), "cuEventRecord on the caller's stream") ||
           cu_failed(cu.stream_wait_event(s, state->fork, 0), "cuStreamWaitEvent on the prefetch stream") ? -1 : 0;
}

/* The job's fields for one run; host ids are copied into pinned memory and counted on the way
 * (checked here, so that a bad call raises at once and enqueues nothing): returns the bad ones. */
int64_t staged_prepare(StagedState *state, uint64_t table, int64_t row_lo, int64_t row_hi, uint64_t ids,
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
