/* The row copy of one block of a gather job: rows from the mapped table into staging, and the
 * counts that tell the waiter, the stream and the counters so.
 *
 * Rows are random, so every row costs a TLB miss and a few cache misses: software prefetch keeps
 * rows in flight, and its settings, with the kind of store that writes staging, are what
 * benchmarks/lookups/host_overlap.py sweeps (docs/history/benchmarks-2026-11.md, "The host-gather path").
 *
 * Owns: gather_tuning (set by module.c's set_tuning).  May call: nothing of the engine but common.h.
 * Must never: use an id outside [row_lo, row_hi) as an address (its staged row is zeroed and counted),
 * take a lock, or touch Python objects (it runs on the gather threads, off the GIL).
 */
#include "gather.h"

/* Set by set_tuning(), read once per block.  Software prefetch: whole rows `near` rows ahead of the copy; with `far` > near,
 * also the first line of the row `far` ahead, which starts its page walk early (on 4 KiB pages
 * every random row misses the TLB); `hint` is the locality (0: non-temporal .. 3: every cache
 * level; 3 measured ~5% faster than 0 on the H200 machine, and unlike 0 it leaves rows in the
 * shared cache for calls that repeat them).  `streaming`: write staging with non-temporal stores (x86-64): the copy
 * engine reads it next, not this core, and plain stores would first read every staging line and
 * push table rows and page-table entries out of the last-level cache. */
GatherTuning gather_tuning = {PREFETCH_ROWS, 0, 3, 0};

#if defined(__x86_64__)
#define CAN_STREAM 1
/* dst, src and nbytes multiples of 8 (checked per block). */
static inline void copy_row_streaming(uint8_t *dst, const uint8_t *src, int64_t nbytes) {
    for (int64_t off = 0; off < nbytes; off += 8) {
        long long word;
        memcpy(&word, src + off, 8);
        _mm_stream_si64((long long *)(dst + off), word);
    }
}
#else
#define CAN_STREAM 0
#endif

static inline void prefetch_line(const uint8_t *p, int hint) {
    switch (hint) {  /* the hint must be a constant */
    case 0: __builtin_prefetch(p, 0, 0); break;
    case 1: __builtin_prefetch(p, 0, 1); break;
    case 2: __builtin_prefetch(p, 0, 2); break;
    default: __builtin_prefetch(p, 0, 3); break;
    }
}

static inline const uint8_t *row_address(const Job *job, int64_t i) {
    int64_t id = id_at(job, i);
    if (id < job->row_lo || id >= job->row_hi) return NULL;
    return job->table + (id - job->row_lo) * job->row_bytes;
}

static inline void prefetch_row(const Job *job, int64_t i, int hint) {
    const uint8_t *src = row_address(job, i);
    if (src == NULL) return;
    for (int64_t off = 0; off < job->row_bytes; off += 64) prefetch_line(src + off, hint);
    prefetch_line(src + job->row_bytes - 1, hint);
}

static inline void prefetch_first_line(const Job *job, int64_t i, int hint) {
    const uint8_t *src = row_address(job, i);
    if (src != NULL) prefetch_line(src, hint);
}

void gather_block(Job *job, int64_t block) {
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
    if (job->counts && job->table) {
        atomic_fetch_add(&job->counts->rows_fetched, hi - lo - skipped - bad);
        if (job->skip_marked) {
            atomic_fetch_add(&job->counts->cache_hits, skipped);
            atomic_fetch_add(&job->counts->cache_misses, hi - lo - skipped - bad);
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
