/* The prefill crew: a pool's threads at SCHED_IDLE that gather only prefill-size jobs (included by
 * _host_gather.c after _node_budget.h).
 *
 * Beside ranks that prefill, a decode-size lookup loses its time waiting for a CPU, not for a
 * token: its workers wake up runnable behind the prefill gatherers on the same cores (on the H200
 * machine a 6,144-row call took 2.42 ms beside three prefilling ranks against 0.33 alone, its
 * workers queued for a CPU 5.2 ms a call; with this crew, 0.53-0.55 ms: docs/BENCHMARKS.md,
 * "The prefill crew").
 * A thread cannot leave SCHED_IDLE without CAP_SYS_NICE, so prefill jobs get threads of their own:
 * where the daemon's budget says so (--prefill-gathers idle, bit NB_FLAG_PREFILL_IDLE of the budget's
 * header), a job of more than small_rows rows goes to the crew's list, and the pool's workers, at
 * normal priority, keep the decode-size ones.  The crew draws tokens like the workers, so the budget's
 * count of gathering threads still holds.  What it costs: beside CPU-bound threads of normal
 * priority on the same cores, the crew gathers only in the time they leave, and a crew thread
 * holding a token may not run for seconds: decode-size waiters then stand in for it
 * (nb_stand_in, _node_budget_tokens.h), which is why a crew thread says it runs (nb_crew_seen).
 */

/* Whether `job` (being listed; pool lock held) goes to the crew. */
static int crew_takes(Pool *pool, const Job *job) {
    NodeBudget *b = atomic_load(&pool->budget);
    return b && atomic_load(&pool->ncrew) > 0 && (b->flags & NB_FLAG_PREFILL_IDLE) && job->n > b->small_rows;
}

static void *crew_main(void *arg) { return budget_worker_main(arg, 1); }

static void crew_join(Pool *pool) {
    atomic_store(&pool->ncrew, 0);  /* nothing is listed for it any more */
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->lists[CREW].wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->crew_started; i++) pthread_join(pool->crew[i], NULL);
    pool->crew_started = 0;
}

/* Start the crew if the pool's budget asks for one and it has none: as many threads as the pool was
 * asked for (a prefill job's caller does not gather beside them).  0, or an errno: nothing started
 * (pool->crew_error keeps it, for the client to say why its prefill gathers at normal priority). */
static int crew_start(Pool *pool) {
    NodeBudget *b = atomic_load(&pool->budget);
    if (!b || !(b->flags & NB_FLAG_PREFILL_IDLE) || pool->crew_started || atomic_load(&pool->ncrew) ||
        atomic_load(&pool->stop))  /* a closed pool (set_budget refuses one; this is for a close racing it) */
        return 0;
    int n = pool->threads_asked, err = 0;
    if (!pool->crew && !(pool->crew = calloc((size_t)n, sizeof(pthread_t)))) return pool->crew_error = ENOMEM;
    atomic_store(&pool->crew_quit, 0);
    struct sched_param idle = {0};
    for (int i = 0; i < n && !err; i++) {
        if ((err = pthread_create(&pool->crew[i], NULL, crew_main, pool)) != 0) break;
        pool->crew_started = i + 1;
        pthread_setname_np(pool->crew[i], "engram-prefill");  /* how tests and operators count them */
        if (pool->pinned) pthread_setaffinity_np(pool->crew[i], sizeof pool->pin, &pool->pin);
        err = pthread_setschedparam(pool->crew[i], SCHED_IDLE, &idle);  /* lowering needs no privilege, but a sandbox may refuse */
    }
    if (err) {
        atomic_store(&pool->crew_quit, 1);
        crew_join(pool);
        return pool->crew_error = err;
    }
    pool->crew_error = 0;
    atomic_store(&pool->ncrew, n);  /* from now on, prefill jobs are listed for the crew */
    return 0;
}
