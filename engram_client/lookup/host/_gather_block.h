/* One block of a gather job: its rows copied from the mapped table into staging, and the counts
 * that tell the waiter, the stream and the counters so (included by _gather_pool.h, after Pool).
 * How each row is fetched and stored is _gather_tuning.h's.
 */
#include "_gather_job.h"
#include "_gather_tuning.h"

static void gather_block(Job *job, int64_t block) {
    int64_t lo = block * job->block_rows, hi = lo + job->block_rows;
    if (hi > job->n) hi = job->n;
    const int64_t rb = job->row_bytes;
    int64_t bad = 0, skipped = 0;
    if (job->table == NULL) {      /* a disarmed job (its client is gone): never read, all rows zero */
        memset(job->staging + lo * rb, 0, (size_t)((hi - lo) * rb));
        bad = hi - lo;
    } else {
        const int near = gather_tuning.near, far = gather_tuning.far, hint = gather_tuning.hint;
        const int streaming = CAN_STREAM && gather_tuning.streaming &&
                              !(((uintptr_t)job->table | (uintptr_t)job->staging | (uintptr_t)rb) & 7);
        for (int64_t i = lo; i < hi && i < lo + near; i++) prefetch_row(job, i, hint);
        for (int64_t i = lo + near; i < hi && i < lo + far; i++) prefetch_first_line(job, i, hint);
        for (int64_t i = lo; i < hi; i++) {
            if (i + near < hi) prefetch_row(job, i + near, hint);
            if (far > near && i + far < hi) prefetch_first_line(job, i + far, hint);
            int64_t id = id_at(job, i);
            uint8_t *dst = job->staging + i * rb;
            if (id == SKIP_ID && job->skip_marked) {  /* served from the HBM cache: its staging row is never read */
                skipped++;
            } else if (id < job->row_lo || id >= job->row_hi) {
                memset(dst, 0, (size_t)rb);
                bad++;
#if CAN_STREAM
            } else if (streaming) {
                copy_row_streaming(dst, job->table + (id - job->row_lo) * rb, rb);
#endif
            } else if (rb == 264) {  /* the V4.1 row: a constant size lets the compiler inline the copy */
                memcpy(dst, job->table + (id - job->row_lo) * 264, 264);
            } else {
                memcpy(dst, job->table + (id - job->row_lo) * rb, (size_t)rb);
            }
        }
    }
#if CAN_STREAM
    _mm_sfence();  /* streamed rows are visible before the block is counted done */
#endif
    if (job->pool && job->table) {
        atomic_fetch_add(&job->pool->rows_fetched, hi - lo - skipped - bad);
        if (job->skip_marked) {
            atomic_fetch_add(&job->pool->cache_hits, skipped);
            atomic_fetch_add(&job->pool->cache_misses, hi - lo - skipped - bad);
        }
    }
    if (bad) {
        atomic_fetch_add(&job->bad, bad);
        if (job->bad_total) __atomic_fetch_add(job->bad_total, bad, __ATOMIC_RELAXED);
    }
    /* Sequentially consistent, not just release: two workers finishing two chunks each read the
     * other's count when they publish (signal_publish), and one of them must see both. */
    atomic_fetch_add(&job->chunk_done[block / job->chunk_blocks], 1);
}

static int take_block(Job *job) {
    int64_t block = atomic_fetch_add(&job->next_block, 1);
    if (block >= job->nblocks) return 0;
    gather_block(job, block);
    if (job->signal) signal_publish(job);  /* tell the stream which chunks it may copy */
    return 1;
}
