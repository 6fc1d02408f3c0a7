/* The gather job: the one definition of Job, which the pool (_gather_pool.h) runs and the
 * row copy (_gather_block.h, _gather_tuning.h) reads; each includes this header rather than rely on another for it.
 * Like the other parts of _host_gather.c, it uses what that file includes and defines first
 * (<stdatomic.h>, <stdint.h>, MAX_CHUNKS).
 */
#ifndef ENGRAM_GATHER_JOB_H
#define ENGRAM_GATHER_JOB_H

typedef struct Pool Pool;
typedef struct Job {
    const uint8_t *table;          /* rows [row_lo, row_hi), row_bytes each; NULL: disarmed, zero-fill */
    int64_t row_lo, row_hi, row_bytes;
    const void *ids;
    int ids64;
    int skip_marked;               /* ids of SKIP_ID are rows the HBM cache holds: neither read nor counted bad */
    int64_t n, block_rows, nblocks, chunk_blocks, nchunks;
    uint8_t *staging;
    int64_t *bad_total;            /* caller-owned counter, added to atomically; may be NULL */
    atomic_llong next_block, bad;
    atomic_llong chunk_done[MAX_CHUNKS];
    atomic_int users;              /* workers in this job (job_join, job_leave), | USERS_CLOSED once its run ended */
    Signal *signal;                /* started by a stream and reporting to it (_stream_signal.h), or NULL */
    int listed;
    int for_crew;                  /* listed for the prefill crew (_prefill_crew.h), not the workers */
    struct Job *next;
    Pool *pool;
} Job;

/* `users` of a signalled job whose run its last worker ended: nobody joins it until it starts again. */
#define USERS_CLOSED (1 << 30)

/* The classify kernel of the HBM cache (hot_cache_kernels.py) marks its hits so; it never passes a
 * caller's id through unchanged where that id is out of range (it writes -2 instead), so a caller's -1
 * is still counted bad. */
#define SKIP_ID (-1)

static inline int64_t id_at(const Job *job, int64_t i) {
    return job->ids64 ? ((const int64_t *)job->ids)[i] : (int64_t)((const int32_t *)job->ids)[i];
}

#endif
