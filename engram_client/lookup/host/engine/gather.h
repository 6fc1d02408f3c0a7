/* The gather job and the row copy of one block: the one definition of Job, which the pool (pool.c)
 * runs, the stream signals (signal.c) report on and the node budget (budget_pool.c) gathers on
 * tokens; and gather_block, which copies a block's rows from the mapped table into staging.
 */
#ifndef ENGRAM_ENGINE_GATHER_H
#define ENGRAM_ENGINE_GATHER_H
#include "common.h"

typedef struct Pool Pool;          /* pool.h */
typedef struct Signal Signal;      /* signal.h */

/* What the rows of every job of a pool came to (the pool's, read by GatherPool.cache_counts). */
typedef struct {
    atomic_llong cache_hits, cache_misses;  /* ids of skip_marked jobs: skipped (in HBM), fetched from the table */
    atomic_llong rows_fetched;     /* rows read from the table by every job */
} RowCounts;

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
    Signal *signal;                /* started by a stream and reporting to it (signal.c), or NULL */
    int listed;
    int for_crew;                  /* listed for the prefill crew (crew.c), not the workers */
    struct Job *next;
    Pool *pool;
    RowCounts *counts;             /* its pool's (job_plan sets it), or NULL without a pool */
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

/* The blocks of `chunk` (the last chunk may have fewer). */
static inline int64_t chunk_blocks(const Job *job, int64_t chunk) {
    int64_t end = (chunk + 1) * job->chunk_blocks;
    return (end > job->nblocks ? job->nblocks : end) - chunk * job->chunk_blocks;
}

/* Set by set_tuning() (module.c), read once per block: see gather.c. */
typedef struct { int near, far, hint, streaming; } GatherTuning;
extern GatherTuning gather_tuning;

/* Copy block `block` of the job into staging and count it done (bad ids zeroed and counted). */
void gather_block(Job *job, int64_t block);

#endif
