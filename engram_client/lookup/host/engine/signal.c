/* Stream signals: how a CUDA stream and the gather workers hand a job to each other without host
 * functions.  This file owns one slot's word and one run; signal_set.c owns a pool's set of them.
 *
 * A host function runs ~35 us after the stream reaches it (measured on the H200 machine); a stream
 * memory operation on pinned host memory is seen by a polling CPU thread in a few microseconds.  So
 * each staged slot owns one 32-bit word in pinned memory, written by both sides:
 *
 *     IDLE (0xFFFFFFFF)   nothing asked, or a worker has taken the job         (initial state)
 *        |  stream: cuStreamWriteValue32(word, ARMED) once the ids are in pinned memory
 *        v
 *     ARMED (0)           a job waits for a worker
 *        |  worker: compare-and-swap ARMED -> IDLE (exactly one claims it), starts the job
 *        v
 *     IDLE, then 1 .. nchunks: chunks [0, k) are in pinned staging (workers; only grows)
 *        |  stream: before copying chunk c, cuStreamWaitValue32(word, c + 1, GEQ)
 *        v
 *     nchunks             the run is over for the CPU; the next run arms the word again
 *
 * The wait's GEQ is cyclic ((int32_t)(word - value) >= 0), so IDLE (-1) and ARMED (0) satisfy no
 * wait for 1 .. MAX_CHUNKS.  Every value the stream writes or waits for is a constant, so the same
 * calls captured in a CUDA graph replay correctly.  An eager call whose ids are already in host
 * memory, and whose slot the stream has finished with, skips ARMED: the enqueue resets the word
 * to IDLE and starts the job at once (signal_start_now), so the gather runs while the stream is
 * still busy with earlier work.
 *
 * A run belongs to one claim: `active` is set at the claim and cleared when the last worker has
 * left the job (job_leave), so a replay that arms the word while workers are still leaving the
 * previous run is claimed right after (by the worker that ends that run), never on top of it.
 *
 * How workers learn of work: an eager enqueue wakes them (pool_prewake) and they poll the words
 * while they spin; under graph replay nothing on the host announces the work, so while any
 * signal is registered one idle worker, the watcher, polls the words: it spins for
 * signal_tuning.spin_ns after the last job it saw, then naps between polls, longer the longer
 * nothing came (since / 64, from poll_min_ns up to poll_max_ns).  On the node's budget it holds no
 * token, so it spins only in the predicted window below, and only while a token is unheld
 * (pool.h's pool_spin_room): eight ranks' watchers spinning after every call cost them 29% of their
 * decode-size rows on a 16-CPU node (docs/history/benchmarks-2026-12.md, "The signal watcher on the
 * node's budget").  The other workers sleep on the pool's condition variable; a claim wakes
 * them, but a futex wake-up costs tens of microseconds in a VM.  Decode replays a graph at a
 * steady period, so the watcher also learns the period of the bursts of claims (one per step)
 * and, with signal_tuning.predict, wakes the whole pool to spin from a lead before the next
 * expected burst to a lead after it (lead: period / 32, within [30 us, 300 us]); a burst that
 * does not come within four periods ends the prediction.
 * signal_set.c holds the watcher and the orphans' thread; docs/BENCHMARKS.md has what each
 * costs the engine's thread and the host's cores.
 *
 * When a pool stops (close, deallocation) its signals move to the orphans, answered by one
 * process-wide thread: a graph captured before close and replayed after must not hang on a
 * wait nobody answers (its disarmed slot zeroes its rows).  At exit, before the driver frees
 * pinned memory, an atexit handler closes the gate every poll passes, so no thread reads a word
 * after that.
 *
 * Owns: the word's states and the run's end (signal_publish, signal_run_closed, signal_try_claim,
 * signal_start_now).  May call: the pool's job functions (pool.h).  Must never: start a run while
 * the previous one is active, move the word back within a run (it only grows), or touch Python objects
 * (workers and the janitor run it off the GIL).
 */
#include "signal.h"

#define BURST_GAP_NS 200000        /* claims closer than this belong to one step */
#define PERIOD_MAX_NS 200000000    /* longer gaps are pauses, not a period */

/* ---- the run ----------------------------------------------------------------------------------------- */

/* Advance the word over every chunk whose blocks are all in staging (lock-free; the word only grows).
 * ARMED is never a word of this run: within a run the word is IDLE or 1 .. nchunks.  A worker
 * descheduled in here until the stream has passed its last wait and armed the next replay would
 * otherwise read ARMED (0) as "no chunk yet", find this run's chunks all done, and publish them to
 * the armed replay, whose waits would then pass on the last replay's rows (seen once under load in
 * tests/unit/test_stream_signal.py).  The armed replay is claimed when this run ends. */
void signal_publish(Job *job) {
    Signal *sig = job->signal;
    for (;;) {
        uint32_t w = word_load(sig);
        if (w == SIGNAL_ARMED) return;
        uint32_t k = (w == SIGNAL_IDLE) ? 0 : w;
        if ((int64_t)k >= job->nchunks || atomic_load(&job->chunk_done[k]) < chunk_blocks(job, k)) return;
        __atomic_compare_exchange_n(sig->word, &w, k + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
}

/* The run is over on the CPU side: unlist it, let the slot be reused, take a replay armed meanwhile. */
static void signal_run_end(Job *job) {
    Signal *sig = job->signal;
    Pool *pool = job->pool;
    if (pool != NULL && pool_usable(pool)) job_unlist(job);
    if (pool) atomic_fetch_add(&pool->jobs_run, 1);
    atomic_store(&sig->active, 0);
    /* An eager slot may be reused, or freed (host_lookup.py replaces one too small), the moment its
     * runs in flight fall to 0: that is the last this thread touches of it.  Nothing can be armed on
     * it before then (its next run is prepared only after), and a later run's ARMED is claimed by
     * the watcher or a polling worker. */
    if (sig->in_flight) {
        atomic_fetch_sub(sig->in_flight, 1);
        return;
    }
    signal_try_claim(sig);  /* a graph's replay armed while this run's workers were leaving */
}

/* The last worker left the run (pool.c's job_leave, through PoolSignalOps): end it, if it is still active. */
void signal_run_closed(Job *job) {
    if (atomic_load(&job->signal->active)) signal_run_end(job);
}

/* Gather a claimed run on this thread alone (a stopped pool's orphans), then end it. */
void signal_run_here(Job *job) {
    for (int64_t c = 0; c < job->nchunks; c++) job_wait_chunk(job, c);
    int spins = 0;
    while (atomic_load(&job->users) & ~USERS_CLOSED) pause_briefly(&spins);
    signal_run_end(job);
}

/* A claim: when it came, and (if it opens a burst) the period between bursts.  Racy updates by
 * concurrent claimers only blur an estimate. */
static void note_claim(SignalSet *set) {
    int64_t now = now_ns(), burst = atomic_load(&set->burst_ns);
    atomic_store(&set->last_seen_ns, now);
    if (now - burst < BURST_GAP_NS) return;
    int64_t gap = now - burst, period = atomic_load(&set->period_ns);
    if (burst && gap < PERIOD_MAX_NS) atomic_store(&set->period_ns, period ? period + (gap - period) / 4 : gap);
    atomic_store(&set->burst_ns, now);
}

static void signal_started(Signal *sig) {
    SignalSet *set = sig->set;
    if (set) note_claim(set);
    /* Listed for the workers (who are woken); where the pool is gone (an orphan), run here. */
    if (!job_start(sig->job)) signal_run_here(sig->job);
}

/* ARMED -> IDLE for exactly one thread, once the previous run has ended.  1: this thread started it. */
int signal_try_claim(Signal *sig) {
    if (word_load(sig) != SIGNAL_ARMED || atomic_load(&sig->active)) return 0;
    int idle = 0;
    if (!atomic_compare_exchange_strong(&sig->active, &idle, 1)) return 0;
    uint32_t armed = SIGNAL_ARMED;
    if (!__atomic_compare_exchange_n(sig->word, &armed, SIGNAL_IDLE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        atomic_store(&sig->active, 0);
        return 0;
    }
    signal_started(sig);
    return 1;
}

/* An eager run whose ids are already in pinned memory and whose staging the stream no longer reads
 * (its last run has ended).  A poller that read ARMED with `active` 0 before that last run was
 * claimed may still hold `active` for a moment (signal_try_claim): it lets go once it finds the
 * word no longer ARMED.  So `active` is taken from 0, never stored over such a borrow, whose
 * letting go would otherwise clear this run's: its end would then be skipped and the slot stay in
 * flight for good.  The borrow lasts a few instructions unless that thread is descheduled; after
 * START_WAIT_NS the run starts anyway, as before this wait. */
#define START_WAIT_NS 1000000000LL
void signal_start_now(Signal *sig) {
    __atomic_store_n(sig->word, SIGNAL_IDLE, __ATOMIC_SEQ_CST);  /* before the stream's waits are enqueued */
    int spins = 0, idle = 0;
    int64_t give_up = now_ns() + START_WAIT_NS;
    while (!atomic_compare_exchange_weak(&sig->active, &idle, 1)) {
        idle = 0;
        if (now_ns() > give_up) {
            atomic_store(&sig->active, 1);
            break;
        }
        pause_briefly(&spins);
    }
    signal_started(sig);
}
