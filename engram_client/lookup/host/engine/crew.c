/* The prefill crew: a pool's threads that gather only prefill-size jobs, at SCHED_IDLE or off the
 * decode CPUs.
 *
 * Beside ranks that prefill, a decode-size lookup loses its time waiting for a CPU, not for a
 * token: its workers wake up runnable behind the prefill gatherers on the same cores (on the H200
 * machine a 6,144-row call took 2.42 ms beside three prefilling ranks against 0.33 alone, its
 * workers queued for a CPU 5.2 ms a call; with this crew, 0.53-0.55 ms:
 * docs/history/benchmarks-2026-12.md, "The prefill crew").
 * A thread cannot leave SCHED_IDLE without CAP_SYS_NICE, so prefill jobs get threads of their own:
 * where the daemon's budget says so (--prefill-gathers idle, bit NB_FLAG_PREFILL_IDLE of the budget's
 * header), a job of more than small_rows rows goes to the crew's list, and the pool's workers, at
 * normal priority, keep the decode-size ones.  The crew draws tokens like the workers, so the budget's
 * count of gathering threads still holds.  What it costs: beside CPU-bound threads of normal
 * priority on the same cores, the crew gathers only in the time they leave, and a crew thread
 * holding a token may not run for seconds: decode-size waiters then stand in for it
 * (nb_stand_in, budget_tokens.c), which is why a crew thread says it runs (nb_crew_seen).
 *
 * Where the budget keeps decode CPUs instead (engramd --decode-cpus, the header's decode count D),
 * the crew runs at normal priority, pinned to the pool's CPUs less the D highest of them (the
 * daemon names the same ones: the group's last D), and the token rule keeps it to tokens - D
 * tokens.  So no prefill gather of normal priority runs on a decode CPU, and a decode call's woken
 * workers (pinned to every gather CPU) land there at once: the kernel places a waking thread on an
 * idle CPU, and one that runs only SCHED_IDLE threads counts as idle.  To keep prefill
 * work-conserving, D spares at SCHED_IDLE pinned to the decode CPUs gather the crew's jobs while
 * those CPUs are otherwise free (none where the budget says --decode-spares off) and, where it says
 * quiet (the default), while no rank of the group has started a decode-size job in the last
 * NB_DECODE_QUIET_NS (spare_stands_aside, budget_pool.c).  Spares hold no
 * token: a decode-size waiter never waits for one (a stand-in would come only after
 * NB_CREW_STALL_NS, too late for decode), so the group's count of
 * gathering threads may exceed its tokens by the spares, which take no CPU from any thread of
 * normal priority.  Their price: a block a spare took when a thread of normal priority wanted its
 * CPU waits for it, so a prefill call's last block may come late beside a busy decode CPU.
 *
 * While a crew takes every prefill-size job, the pool's workers gather decode-size jobs alone, and
 * where the client asks (decode_rt_asked) and the process may (CAP_SYS_NICE, or RLIMIT_RTPRIO at
 * least that priority) they run at SCHED_FIFO (workers_realtime).  Decode CPUs leave a decode call
 * CPUs to wake on, but the kernel does not always place a woken worker there: beside three
 * prefilling ranks a 6,144-row call's slowest cases still had its workers runnable 2-11 ms summed,
 * behind the crews of normal priority (docs/history/benchmarks-2026-12.md, "Where a decode call's
 * workers wait").  A woken SCHED_FIFO thread takes a CPU from any thread of normal priority at once.
 * Such a worker holds a token while it gathers, as before, so the group's count of gathering
 * threads still holds; it gathers at most small_rows rows a job, and stands aside for nothing else.
 *
 * Owns: starting the crew and its spares, where they run (crew_split), and the workers' scheduling
 * while a crew takes prefill (workers_realtime).  Which job goes to the crew is a budget rule
 * (crew_takes, budget_pool.c); the pool joins the crew as it joins its workers (crew_join, pool.c).
 * May call: the pool (pool.h), budget_pool.c's worker loop.  Must never: raise the priority of a
 * crew thread (a crew at SCHED_IDLE stays there), leave a worker at SCHED_FIFO while it may take a
 * prefill-size job, or fail the pool when a sandbox refuses SCHED_IDLE or SCHED_FIFO (crew_error
 * and decode_rt_error say why, the client reports it).  Runs with the GIL released.
 */
#include "crew.h"
#include "budget_pool.h"

static void *crew_main(void *arg) { return budget_worker_main(arg, 1); }
static void *spare_main(void *arg) { return budget_worker_main(arg, 2); }

#define CREW_MAX_SPARES 64

/* Split the pool's CPUs for a budget with `decode` decode tokens: the highest `decode` of them go to
 * `spares` (the decode CPUs), the rest to `crew`.  The number of decode CPUs; 0 where there is no
 * split (not pinned, no decode tokens, or no CPU would be left for the crew). */
static int crew_split(const Pool *pool, int decode, cpu_set_t *crew, cpu_set_t *spares) {
    *crew = pool->pin;
    CPU_ZERO(spares);
    if (!pool->pinned || decode <= 0 || CPU_COUNT(crew) <= decode) return 0;
    int found = 0;
    for (int c = CPU_SETSIZE - 1; c >= 0 && found < decode && found < CREW_MAX_SPARES; c--)
        if (CPU_ISSET(c, crew)) {
            CPU_CLR(c, crew);
            CPU_SET(c, spares);
            found++;
        }
    return found;
}

/* The workers at SCHED_FIFO, priority decode_rt_asked (on), or back at SCHED_OTHER.  `on` only
 * where a crew runs that takes every prefill-size job (crew_takes): a worker at SCHED_FIFO that took
 * 393,216 rows would keep the CPUs it runs on from every thread of normal priority for milliseconds.
 * All or none: a refusal (no CAP_SYS_NICE and RLIMIT_RTPRIO below the priority, or a cgroup with no
 * real-time time) puts back the workers already moved and keeps its errno in decode_rt_error.  Under
 * the pool's lock, checking stop there: pool_stop sets stop before it takes the lock and joins the
 * workers after, so no worker is joined while this moves it. */
static void workers_realtime(Pool *pool, int on) {
    int prio = on ? pool->decode_rt_asked : 0;
    pthread_mutex_lock(&pool->lock);
    if (!on) pool->decode_rt_error = 0;  /* nothing asked of the kernel on this budget: no refusal to report */
    if (!atomic_load(&pool->stop) && prio != atomic_load(&pool->decode_rt)) {
        struct sched_param param = {.sched_priority = prio}, normal = {0};
        int err = 0, moved = 0;
        for (; moved < pool->nthreads && !err; moved++)
            err = pthread_setschedparam(pool->threads[moved], prio ? SCHED_FIFO : SCHED_OTHER, &param);
        if (err) {
            for (int i = 0; i < moved; i++) pthread_setschedparam(pool->threads[i], SCHED_OTHER, &normal);
            prio = 0;
        }
        if (on) pool->decode_rt_error = err;
        atomic_store(&pool->decode_rt, prio);
    }
    pthread_mutex_unlock(&pool->lock);
}

/* Start the crew the pool's budget asks for: as many threads as the pool was asked for (a prefill
 * job's caller does not gather beside them), at SCHED_IDLE (--prefill-gathers idle), or at normal
 * priority off the decode CPUs, one per CPU there at most, plus one spare per decode CPU.  A crew of
 * another kind (the pool moved to a new daemon's budget with another rule) is joined first; one
 * that the new budget does not use stays, idle.  0, or an errno: nothing started (pool->crew_error
 * keeps it, for the client to say why its prefill gathers at normal priority beside decode calls). */
int crew_start(Pool *pool) {
    NodeBudget *b = atomic_load(&pool->budget);
    if (!b || atomic_load(&pool->stop))  /* a closed pool (set_budget refuses one; this is for a close racing it) */
        return 0;
    int idle = (b->flags & NB_FLAG_PREFILL_IDLE) != 0;
    cpu_set_t crew_pin = pool->pin, decode_pin;
    CPU_ZERO(&decode_pin);
    int split = idle ? 0 : crew_split(pool, b->decode, &crew_pin, &decode_pin);
    int spares = b->flags & NB_FLAG_NO_SPARES ? 0 : split;
    if (!idle && !split) {  /* the workers take prefill-size jobs again (a crew left from before stays idle) */
        workers_realtime(pool, 0);
        return 0;
    }
    if (pool->crew_started) {
        if (pool->crew_idle == idle && pool->crew_split == split && pool->crew_spares == spares &&
            CPU_EQUAL(&decode_pin, &pool->decode_pin))
            return 0;  /* the crew this budget asks for runs already */
        workers_realtime(pool, 0);  /* until the new crew runs, prefill-size jobs go to the workers */
        atomic_store(&pool->crew_quit, 1);
        crew_join(pool);
    }
    pool->decode_pin = decode_pin, pool->crew_split = pool->crew_spares = 0, pool->crew_idle = idle;
    /* Off the decode CPUs the crew gathers on at most one token per CPU left to it (the token rule:
     * tokens - D for the whole group), so a thread beyond those CPUs never gathers: it wakes for
     * every job and waits for a token on a CPU a holder needs.  One rank alone at 393,216 rows on
     * the H100 machine: fifteen crew threads on nine CPUs took 1.09x (1.23x in an earlier run) the
     * time it took with no decode CPUs, nine 1.02x (docs/history/benchmarks-2026-12.md, "The busy
     * node: a crew no larger than its CPUs"). */
    int n = pool->threads_asked, err = 0;
    if (split && n > CPU_COUNT(&crew_pin)) n = CPU_COUNT(&crew_pin);
    /* sized for the largest crew any budget may ask of this pool: a later one may want more threads */
    if (!pool->crew && !(pool->crew = calloc((size_t)pool->threads_asked + CREW_MAX_SPARES, sizeof(pthread_t))))
        return pool->crew_error = ENOMEM;
    atomic_store(&pool->crew_quit, 0);
    struct sched_param idle_param = {0};
    for (int i = 0; i < n + spares && !err; i++) {
        int spare = i >= n;
        if ((err = pthread_create(&pool->crew[i], NULL, spare ? spare_main : crew_main, pool)) != 0) break;
        pool->crew_started = i + 1;
        pthread_setname_np(pool->crew[i], spare ? "engram-spare" : "engram-prefill");  /* how tests and operators count them */
        if (spare) pthread_setaffinity_np(pool->crew[i], sizeof pool->decode_pin, &pool->decode_pin);
        else if (pool->pinned) pthread_setaffinity_np(pool->crew[i], sizeof crew_pin, idle ? &pool->pin : &crew_pin);
        if (idle || spare)  /* lowering needs no privilege, but a sandbox may refuse */
            err = pthread_setschedparam(pool->crew[i], SCHED_IDLE, &idle_param);
    }
    if (err) {
        atomic_store(&pool->crew_quit, 1);
        crew_join(pool);
        return pool->crew_error = err;
    }
    pool->crew_error = 0;
    pool->crew_split = split, pool->crew_spares = spares;
    atomic_store(&pool->ncrew, n);  /* from now on, prefill jobs are listed for the crew */
    workers_realtime(pool, 1);
    return 0;
}
