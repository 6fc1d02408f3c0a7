/* Stream signals: how a CUDA stream and the gather workers hand a job to each other without host
 * functions (included by _host_gather.c after _gather_pool.h).
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
 * nothing came (since / 64, from poll_min_ns up to poll_max_ns).  The other workers sleep on the
 * pool's condition variable; a claim wakes them, but a futex wake-up costs tens of microseconds
 * in a VM.  Decode replays a graph at a steady period, so the watcher also learns the period of
 * the bursts of claims (one per step) and, with signal_tuning.predict, wakes the whole pool to
 * spin from a lead before the next expected burst to a lead after it (lead: period / 32, within
 * [30 us, 300 us]); a burst that does not come within four periods ends the prediction.
 * _signal_watch.h holds the watcher and the orphans' thread; docs/BENCHMARKS.md has what each
 * costs the engine's thread and the host's cores.
 *
 * When a pool stops (close, deallocation) its signals move to the orphans, answered by one
 * process-wide thread: a graph captured before close and replayed after must not hang on a
 * wait nobody answers (its disarmed slot zeroes its rows).  At exit, before the driver frees
 * pinned memory, an atexit handler closes the gate every poll passes, so no thread reads a word
 * after that.
 */
#include <sys/prctl.h>

#define SIGNAL_IDLE 0xFFFFFFFFu
#define SIGNAL_ARMED 0u

struct Signal {
    uint32_t *word;                /* pinned, device-visible; its own cache line */
    Job *job;
    atomic_int active;             /* claimed, and the last worker has not left yet */
    atomic_int *in_flight;         /* an eager slot's count of runs not ended; NULL for a graph slot */
    Signal *_Atomic next;          /* in set's list */
    SignalSet *set;                /* the pool's set, or the orphans */
};

struct SignalSet {
    pthread_mutex_t lock;          /* writers of the list */
    Signal *_Atomic head;
    atomic_int count, scanners;    /* scanners: threads walking the list now (unregister waits) */
    atomic_int watcher;            /* an idle worker watches the words */
    atomic_llong last_seen_ns;     /* the last claim or eager enqueue */
    atomic_llong burst_ns;         /* when the last burst of claims began (claims > BURST_GAP_NS apart) */
    atomic_llong period_ns;        /* a running mean of the gaps between bursts, 0: none yet */
};

#define BURST_GAP_NS 200000        /* claims closer than this belong to one step */
#define PERIOD_MAX_NS 200000000    /* longer gaps are pauses, not a period */

/* Set by set_signal_tuning() (docs/BENCHMARKS.md has the measures behind the defaults). */
static struct { int64_t spin_ns, poll_min_ns, poll_max_ns; int predict; } signal_tuning = {2000000, 20000, 1000000, 1};

/* Every poll of a word passes this gate; the atexit handler closes it and waits for the polls in progress. */
static atomic_int signal_gate_closed, signal_polls;
static SignalSet orphans = {PTHREAD_MUTEX_INITIALIZER};
static atomic_int janitor_running;

static inline uint32_t word_load(const Signal *sig) { return __atomic_load_n(sig->word, __ATOMIC_SEQ_CST); }

static int signal_try_claim(Signal *sig);

/* ---- the run ----------------------------------------------------------------------------------------- */

/* Advance the word over every chunk whose blocks are all in staging (lock-free; the word only grows). */
static void signal_publish(Job *job) {
    Signal *sig = job->signal;
    for (;;) {
        uint32_t w = word_load(sig);
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
    if (sig->in_flight) atomic_fetch_sub(sig->in_flight, 1);
    signal_try_claim(sig);
}

/* Tests only (set_leave_pause): how long a worker pauses after it has left a job, widening the
 * moment in which a synchronous gather's caller may return and reuse its stack. */
static _Atomic int64_t leave_pause_ns;

/* Leave a job this thread joined (job_join).  A job of pool.gather lives on its caller's stack,
 * and once `users` is 0 that caller may return, so nothing of such a job is read after the
 * decrement.  (Reading `signal` after it raced with the return: a rank gathering while other
 * ranks kept the cores busy crashed on a stale pointer.)  A signalled job lives in its slot's
 * state, and its run ends when its last worker leaves it with every block taken: that leave is
 * one transition of `users`, 1 -> USERS_CLOSED, so exactly one thread ends the run, and no thread
 * joins it afterwards.  Deciding after a plain decrement ended runs twice: a worker that left a
 * run with blocks still to take (a yield), then lost its CPU, found the slot's next run exhausted
 * and active when it ran again and ended that one too; and a worker that joined just as the last
 * one left became a second last worker.  Each time the slot's in_flight fell below zero, and a
 * run could be ended while its last blocks were still being written (eight ranks of 15 threads
 * each on 16 CPUs raised "this staging slot is still in use" on the H200 machine). */
static void job_leave(Job *job) {
    Signal *sig = job->signal;
    if (sig == NULL) {
        atomic_fetch_sub(&job->users, 1);
        test_pause(&leave_pause_ns);
        return;
    }
    for (int n = atomic_load(&job->users);;) {  /* this thread is counted in n, so the job stays its run's */
        int closing = n == 1 && atomic_load(&job->next_block) >= job->nblocks;
        if (atomic_compare_exchange_weak(&job->users, &n, closing ? USERS_CLOSED : n - 1)) {
            test_pause(&leave_pause_ns);
            if (closing && atomic_load(&sig->active)) signal_run_end(job);
            return;
        }
    }
}

/* Gather a claimed run on this thread alone (a stopped pool's orphans), then end it. */
static void signal_run_here(Job *job) {
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
static int signal_try_claim(Signal *sig) {
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

/* An eager run whose ids are already in pinned memory and whose staging the stream no longer reads. */
static void signal_start_now(Signal *sig) {
    atomic_store(&sig->active, 1);
    __atomic_store_n(sig->word, SIGNAL_IDLE, __ATOMIC_SEQ_CST);  /* before the stream's waits are enqueued */
    signal_started(sig);
}

/* ---- the list of a pool's signals ------------------------------------------------------------------- */

static int scan_enter(SignalSet *set) {
    atomic_fetch_add(&signal_polls, 1);
    if (atomic_load(&signal_gate_closed)) {
        atomic_fetch_sub(&signal_polls, 1);
        return 0;
    }
    atomic_fetch_add(&set->scanners, 1);
    return 1;
}

static void scan_leave(SignalSet *set) {
    atomic_fetch_sub(&set->scanners, 1);
    atomic_fetch_sub(&signal_polls, 1);
}

static int set_claim_any(SignalSet *set) {
    if (!atomic_load(&set->count) || !scan_enter(set)) return 0;
    int claimed = 0;
    for (Signal *sig = atomic_load(&set->head); sig && !claimed; sig = atomic_load(&sig->next))
        claimed = signal_try_claim(sig);
    scan_leave(set);
    return claimed;
}

static int signals_poll(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    return set ? set_claim_any(set) : 0;
}

static void signals_at_exit(void) {
    atomic_store(&signal_gate_closed, 1);
    for (int i = 0; atomic_load(&signal_polls) && i < 100000; i++) {  /* a poll lasts microseconds; 0.1 s at most */
        struct timespec ts = {0, 1000};
        nanosleep(&ts, NULL);
    }
}

static void set_add(SignalSet *set, Signal *sig) {
    pthread_mutex_lock(&set->lock);
    sig->set = set;
    atomic_store(&sig->next, atomic_load(&set->head));
    atomic_store(&set->head, sig);
    atomic_fetch_add(&set->count, 1);
    pthread_mutex_unlock(&set->lock);
}

/* Unlink; on return no scanner of this set still holds `sig`.  The set's lock is held. */
static void set_remove_locked(SignalSet *set, Signal *sig) {
    Signal *_Atomic *link = &set->head;
    for (Signal *s; (s = atomic_load(link)); link = &s->next)
        if (s == sig) {
            atomic_store(link, atomic_load(&sig->next));
            atomic_fetch_sub(&set->count, 1);
            break;
        }
    int spins = 0;
    while (atomic_load(&set->scanners)) pause_briefly(&spins);
    sig->set = NULL;
}

static pthread_mutex_t signals_init_lock = PTHREAD_MUTEX_INITIALIZER;

static int signal_register(Pool *pool, Signal *sig) {
    static int exit_hook;
    pthread_mutex_lock(&signals_init_lock);
    if (!exit_hook) {  /* registered after libcuda's own handlers, so it runs before they free pinned memory */
        atexit(signals_at_exit);
        exit_hook = 1;
    }
    SignalSet *set = atomic_load(&pool->signals);
    if (set == NULL) {
        set = calloc(1, sizeof(SignalSet));
        if (set == NULL) {
            pthread_mutex_unlock(&signals_init_lock);
            return -1;
        }
        pthread_mutex_init(&set->lock, NULL);
        atomic_store(&pool->signals, set);
    }
    pthread_mutex_unlock(&signals_init_lock);
    set_add(set, sig);
    pthread_mutex_lock(&pool->lock);  /* a worker asleep with nothing to watch becomes the watcher */
    list_wake(&pool->lists[WORKERS]);
    pthread_mutex_unlock(&pool->lock);
    return 0;
}

/* The slot is being freed: no thread may look at its word again. */
static void signal_unregister(Signal *sig) {
    for (;;) {
        SignalSet *set = sig->set;
        if (set == NULL) return;
        pthread_mutex_lock(&set->lock);
        if (sig->set == set) {  /* not moved to the orphans meanwhile */
            set_remove_locked(set, sig);
            pthread_mutex_unlock(&set->lock);
            return;
        }
        pthread_mutex_unlock(&set->lock);
    }
}

static void signals_free(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    if (set) {
        pthread_mutex_destroy(&set->lock);
        free(set);
    }
}

#include "_signal_watch.h"
