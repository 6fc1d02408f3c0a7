/* A pool's stream signals: the set a pool answers, the idle worker that watches their words (the
 * watcher), the thread that answers a stopped pool's signals (the janitor), and the gate every poll
 * passes until exit.  signal.c draws the protocol and says how the watcher spins, naps and predicts.
 *
 * Owns: every SignalSet (the pools' and the orphans'), signal_tuning (set by module.c's
 * set_signal_tuning), the janitor, the exit gate, and pool_signal_ops, the pool's way to all of it.
 * May call: signal.c and the pool (pool.h).  Must never: free a Signal a scanner may still hold
 * (set_remove_locked waits for the scanners), read a word after the exit gate closed, or touch
 * Python objects (workers and the janitor run it off the GIL).
 */
#include "signal_set.h"

/* Set by set_signal_tuning() (docs/BENCHMARKS.md has the measures behind the defaults). */
SignalTuning signal_tuning = {2000000, 20000, 1000000, 1};

/* Every poll of a word passes this gate; the atexit handler closes it and waits for the polls in progress. */
static atomic_int signal_gate_closed, signal_polls;
static SignalSet orphans = {PTHREAD_MUTEX_INITIALIZER};
static atomic_int janitor_running;

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

static int set_poll(Pool *pool) {
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

int signal_register(Pool *pool, Signal *sig) {
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
void signal_unregister(Signal *sig) {
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

static void set_free(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    if (set) {
        pthread_mutex_destroy(&set->lock);
        free(set);
    }
}

/* ---- watching ----------------------------------------------------------------------------------------- */

static void nap_ns(int64_t ns) {
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    nanosleep(&ts, NULL);
}

/* Called by an idle worker with pool->lock held, instead of sleeping: 1 if it watched (lock held again). */
static int set_watch(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    int none = 0;
    if (set == NULL || !atomic_load(&set->count) || !atomic_compare_exchange_strong(&set->watcher, &none, 1))
        return 0;
    pthread_mutex_unlock(&pool->lock);
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  /* naps of tens of microseconds, not the default 50 us more */
#endif
    int64_t woken_for = 0;         /* the expected burst the pool was last woken for */
    while (!atomic_load(&pool->stop) && !atomic_load(&pool->lists[WORKERS].listed) && atomic_load(&set->count)) {
        if (set_claim_any(set)) break;
        int64_t now = now_ns(), since = now - atomic_load(&set->last_seen_ns);
        /* pool_spin_room reads the group's holders on a budget: asked only where a spin is in question. */
        if (since < signal_tuning.spin_ns && pool_spin_room(pool) == SPIN_ANY) {
            for (int i = 0; i < 32; i++) cpu_relax();
            continue;
        }
        int64_t nap = since / 64, period = atomic_load(&set->period_ns), burst = atomic_load(&set->burst_ns);
        if (signal_tuning.predict && period && now - burst < 4 * period) {
            int64_t lead = period / 32 < 30000 ? 30000 : period / 32 > 300000 ? 300000 : period / 32;
            int64_t expect = burst + period;
            while (expect + lead < now) expect += period;
            if (now >= expect - lead) {  /* inside the window: everyone polls, awake */
                if (woken_for != expect) {
                    pool_prewake_until(pool, expect + lead);
                    woken_for = expect;
                }
                if (pool_spin_room(pool) == SPIN_NONE) {
                    nap_ns(signal_tuning.poll_min_ns);
                    continue;
                }
                for (int i = 0; i < 32; i++) cpu_relax();
                continue;
            }
            if (nap > expect - lead - now) nap = expect - lead - now;  /* wake up for the window */
        }
        nap_ns(nap < signal_tuning.poll_min_ns ? signal_tuning.poll_min_ns
               : nap > signal_tuning.poll_max_ns ? signal_tuning.poll_max_ns : nap);
    }
    atomic_store(&set->watcher, 0);
    pthread_mutex_lock(&pool->lock);
    return 1;
}

/* ---- a stopped pool's signals -------------------------------------------------------------------------- */

static void *janitor_main(void *unused) {
    pthread_setname_np(pthread_self(), "engram-signals");
    while (!atomic_load(&signal_gate_closed)) {
        set_claim_any(&orphans);  /* a claim gathers (or zeroes) the rows on this thread */
        nap_ns(signal_tuning.poll_max_ns);
    }
    atomic_store(&janitor_running, 0);
    return NULL;
}

/* The pool's workers are joined: finish any run they left, and hand the signals to the janitor. */
static void set_orphan(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    if (set == NULL) return;
    pthread_mutex_lock(&set->lock);
    Signal *sig;
    while ((sig = atomic_load(&set->head))) {
        set_remove_locked(set, sig);
        if (atomic_load(&sig->active)) signal_run_here(sig->job);  /* claimed, but no worker finished it */
        set_add(&orphans, sig);
    }
    pthread_mutex_unlock(&set->lock);
    int idle = 0;
    if (atomic_load(&orphans.count) && atomic_compare_exchange_strong(&janitor_running, &idle, 1)) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, janitor_main, NULL) != 0) atomic_store(&janitor_running, 0);
        pthread_attr_destroy(&attr);
    }
}

const PoolSignalOps pool_signal_ops = {
    .publish = signal_publish, .run_closed = signal_run_closed, .poll = set_poll, .watch = set_watch,
    .orphan = set_orphan, .free = set_free,
};
