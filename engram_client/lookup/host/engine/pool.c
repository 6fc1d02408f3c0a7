/* Gather jobs and the worker pool that runs them (Job is gather.h's, Pool is pool.h's).
 *
 * A job copies rows ids[i] of the mapped table into staging row i, in blocks of block_rows taken
 * from an atomic counter by the pool's workers and by the thread that waits for the job.  Blocks
 * are grouped in chunks so that a waiter can hand out the first chunk while later ones are still
 * being gathered.  A pool lists the jobs that still have blocks; idle workers spin briefly on that
 * list, then sleep on a condition variable.  A job with a Signal is started by a CUDA stream and
 * reports its chunks to it through a word in pinned memory (signal.c): workers also poll
 * those words, and one of them watches them instead of sleeping while any are registered.  On a
 * budget that asks for it, prefill-size jobs go to a list of their own, served by the pool's prefill
 * crew (crew.c).
 *
 * Owns: the job lists and the pool's lock, a job's run from job_start to job_finish (job_join,
 * job_leave count its workers), the workers' lives (worker_main, pool_stop).  May call: gather.c,
 * and, through the interfaces of pool.h, a node budget (PoolBudgetOps: its worker loop and waiter
 * replace the pool's own) and the stream signals (PoolSignalOps).  Must never: read a budget or a
 * Signal itself, touch Python objects (its threads run off the GIL), or read a job of pool.gather
 * after its last worker left it (it lives on its caller's stack).
 */
#include "pool.h"

void pool_unref(Pool *pool) {
    if (atomic_fetch_sub(&pool->refs, 1) == 1) {
        if (atomic_load(&pool->signals)) pool->signal_ops->free(pool);
        if (pool->budget) pool->budget_ops->unref(pool->budget);
        for (int i = 0; i < pool->nretired; i++) pool->budget_ops->unref(pool->retired[i]);
        free(pool->threads);
        free(pool->crew);
        free(pool);
    }
}

int take_block(Job *job) {
    int64_t block = atomic_fetch_add(&job->next_block, 1);
    if (block >= job->nblocks) return 0;
    gather_block(job, block);
    if (job->signal) job->pool->signal_ops->publish(job);  /* tell the stream which chunks it may copy */
    return 1;
}

/* The first job with blocks left on the workers' list (or the crew's); exhausted jobs are unlisted
 * on the way.  Lock held. */
Job *job_with_work_in(JobList *list) {
    Job **link = &list->head;
    while (*link) {
        Job *job = *link;
        if (atomic_load(&job->next_block) < job->nblocks) return job;
        *link = job->next;
        job->listed = 0;
        atomic_fetch_sub(&list->listed, 1);
    }
    return NULL;
}

static Job *job_with_work(Pool *pool) { return job_with_work_in(&pool->lists[WORKERS]); }

/* Tests only: a pause of *ns (0: none) that widens a race window (set_join_pause, set_leave_pause). */
static void test_pause(_Atomic int64_t *ns) {
    const int64_t pause = atomic_load_explicit(ns, memory_order_relaxed);
    if (pause) {
        struct timespec ts = {0, (long)pause};
        nanosleep(&ts, NULL);
    }
}

_Atomic int64_t join_pause_ns;  /* tests only (set_join_pause): widens the moment before the count */

/* Count this thread among the workers of a job job_with_work_in just found (pool lock held): 0 if
 * it came too late, its run ended by its last worker meanwhile (job_leave).  Taken back under the
 * lock, which job_start holds when it resets the count for the next run. */
int job_join(Job *job) {
    test_pause(&join_pause_ns);
    if (atomic_fetch_add(&job->users, 1) & USERS_CLOSED) {
        atomic_fetch_sub(&job->users, 1);
        return 0;
    }
    return 1;
}

/* Workers poll the job list while a spin window is open (IDLE_SPIN_NS after their last job, or
 * until pool->spin_until), then sleep on the condition variable: a futex wake-up costs tens of
 * microseconds in a VM, as much as a decode-size gather. */
void *worker_main(void *arg) {
    Pool *pool = arg;
    if (pool->budget) return pool->budget_ops->worker_main(pool, 0);  /* node budget hook */
    int64_t idle_until = now_ns() + IDLE_SPIN_NS;
    for (;;) {
        while (!atomic_load(&pool->lists[WORKERS].listed) && !atomic_load(&pool->stop)) {
            if (signals_poll(pool)) break;  /* a stream armed a job: it is listed now */
            int64_t now = now_ns();
            if (now >= idle_until && now >= atomic_load(&pool->spin_until)) break;
            for (int i = 0; i < 32; i++) cpu_relax();
        }
        pthread_mutex_lock(&pool->lock);
        Job *job = NULL;
        while (!atomic_load(&pool->stop) && !(job = job_with_work(pool))) {
            int64_t now = now_ns();
            if (now < idle_until || now < atomic_load(&pool->spin_until)) break;  /* keep polling, awake */
            /* No host call announces a graph replay's job: while stream signals are registered, one
             * idle worker watches their words (bounded spin, then naps) instead of sleeping here. */
            if (signals_watch(pool)) continue;
            pool->lists[WORKERS].sleepers++;
            pthread_cond_wait(&pool->lists[WORKERS].wake, &pool->lock);
            pool->lists[WORKERS].sleepers--;
        }
        if (atomic_load(&pool->stop)) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        if (job == NULL || !job_join(job)) {
            pthread_mutex_unlock(&pool->lock);
            continue;
        }
        pthread_mutex_unlock(&pool->lock);
        while (take_block(job)) {}
        job_leave(job);  /* the last worker off a signalled job ends its run */
        idle_until = now_ns() + IDLE_SPIN_NS;
    }
}

/* Wake the sleeping workers for a job being listed on their list (or, job NULL, for a pre-wake): all
 * of them, or on a budget as many as it says could gather now (budget_pool.c says why). */
void pool_wake_workers(Pool *pool, const Job *job) {
    JobList *list = &pool->lists[WORKERS];
    if (!list->sleepers) return;
    int n = pool->budget_ops ? pool->budget_ops->workers_to_wake(pool, job) : INT_MAX;
    if (n < list->sleepers) {
        atomic_fetch_add(job ? &pool->wakes_in_part : &pool->prewakes_skipped, 1);
        atomic_fetch_add(&pool->left_asleep, list->sleepers - n);
    }
    list_wake_some(list, n);
}

/* Have the workers awake and polling until `until` (a pre-wake: on a busy budget, maybe nobody). */
void pool_prewake_until(Pool *pool, int64_t until) {
    atomic_store(&pool->spin_until, until);
    pthread_mutex_lock(&pool->lock);
    pool_wake_workers(pool, NULL);
    pthread_mutex_unlock(&pool->lock);
}

/* A job is about to be enqueued: have the workers awake and polling when its host function runs. */
void pool_prewake(Pool *pool) {
    pool_prewake_until(pool, now_ns() + PREWAKE_NS);
}

int pool_usable(const Pool *pool) {
    return pool->started && !atomic_load(&pool->stop) && pool->generation == atomic_load(&fork_generation);
}

/* Reset the job's progress and offer its blocks to the workers (if the pool still runs): 1 if listed. */
int job_start(Job *job) {
    atomic_store(&job->next_block, 0);
    atomic_store(&job->bad, 0);
    for (int c = 0; c < MAX_CHUNKS; c++) atomic_store(&job->chunk_done[c], 0);
    job->listed = job->for_crew = 0;
    Pool *pool = job->pool;
    if (pool != NULL && pool->budget_ops) pool->budget_ops->job_starting(pool, job);
    /* A signalled job has no waiting thread to gather a lone block: the workers take it. */
    if (pool == NULL || !pool_usable(pool) || (job->nblocks <= 1 && !job->signal)) {
        atomic_store(&job->users, 0);  /* never listed: nobody joins it */
        return 0;
    }
    pthread_mutex_lock(&pool->lock);
    atomic_store(&job->users, 0);  /* opens it again (a closed run's late joiner backs off under this lock) */
    int crew = job->for_crew = pool->budget_ops ? pool->budget_ops->crew_takes(pool, job) : 0;
    /* First come, first served: two layers' lookups armed together finish in the order asked. */
    JobList *list = pool_list(pool, crew);
    Job **link = &list->head;
    while (*link) link = &(*link)->next;
    job->next = NULL;
    *link = job;
    job->listed = 1;
    atomic_fetch_add(&list->listed, 1);
    if (crew) list_wake(list);
    else pool_wake_workers(pool, job);
    pthread_mutex_unlock(&pool->lock);
    return 1;
}

/* Spin a while, then nap, longer each time (2 us doubling to 0.5 ms): the thread waited for may
 * have lost its CPU (a crew thread at SCHED_IDLE beside busy threads), and this one, at normal
 * priority, must not keep taking the CPU it needs.  Naps of 2 us without end cost the caller of a
 * prefill job more CPU than the crew that gathered it (tests/unit/test_prefill_crew.py). */
void pause_briefly(int *spins) {
    if (++*spins < 2000) { cpu_relax(); return; }
    int doublings = *spins - 2000 < 8 ? *spins - 2000 : 8;
    struct timespec ts = {0, 2000L << doublings};
    nanosleep(&ts, NULL);
}

/* Gather alongside the workers until every block of `chunk` is in staging. */
void job_wait_chunk(Job *job, int64_t chunk) {
    if (job->pool && job->pool->budget) {  /* node budget hook */
        job->pool->budget_ops->wait_chunk(job, chunk);
        return;
    }
    int64_t need = chunk_blocks(job, chunk);
    int spins = 0;
    while (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need)
        if (!take_block(job)) pause_briefly(&spins);
}

/* Take a job off its pool's list, if it is on it (the pool's lock is taken here). */
void job_unlist(Job *job) {
    Pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    if (job->listed) {
        JobList *list = pool_list(pool, job->for_crew);
        for (Job **link = &list->head; *link; link = &(*link)->next)
            if (*link == job) {
                *link = job->next;
                atomic_fetch_sub(&list->listed, 1);
                break;
            }
        job->listed = 0;
    }
    pthread_mutex_unlock(&pool->lock);
}

/* Wait for the whole job; afterwards no worker touches it, so it may be started again. */
void job_finish(Job *job) {
    for (int64_t c = 0; c < job->nchunks; c++) job_wait_chunk(job, c);
    Pool *pool = job->pool;
    if (job->listed && pool != NULL) job_unlist(job);
    int spins = 0;
    while (atomic_load(&job->users)) pause_briefly(&spins);
    if (pool) atomic_fetch_add(&pool->jobs_run, 1);
}

void job_plan(Job *job, int64_t n, int64_t nchunks) {
    job->n = n;
    job->counts = job->pool ? &job->pool->counts : NULL;
    job->block_rows = n <= 16384 ? 32 : 128;  /* enough blocks to share at decode sizes, few atomics later */
    job->nblocks = (n + job->block_rows - 1) / job->block_rows;
    if (nchunks < 1) nchunks = 1;
    if (nchunks > MAX_CHUNKS) nchunks = MAX_CHUNKS;
    if (nchunks > job->nblocks) nchunks = job->nblocks ? job->nblocks : 1;
    job->chunk_blocks = job->nblocks ? (job->nblocks + nchunks - 1) / nchunks : 1;
    job->nchunks = job->nblocks ? (job->nblocks + job->chunk_blocks - 1) / job->chunk_blocks : 0;
}

/* Tests only (set_leave_pause): how long a worker pauses after it has left a job, widening the
 * moment in which a synchronous gather's caller may return and reuse its stack. */
_Atomic int64_t leave_pause_ns;

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
void job_leave(Job *job) {
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
            if (closing) job->pool->signal_ops->run_closed(job);  /* signal.c: ends it if it is still active */
            return;
        }
    }
}

/* Stop and join the workers and the crew (idempotent); the signals go to whoever answers them now. */
void pool_stop(Pool *pool) {
    if (!pool->started || atomic_exchange(&pool->stop, 1)) return;
    if (pool->generation != atomic_load(&fork_generation)) return;  /* a child: the threads are not here */
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->lists[WORKERS].wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->nthreads; i++) pthread_join(pool->threads[i], NULL);
    crew_join(pool);
    if (atomic_load(&pool->signals)) pool->signal_ops->orphan(pool);  /* graphs replayed after close must still be answered */
}

/* The crew is the pool's threads (crew.c starts it): called off and joined here, as the workers are. */
void crew_join(Pool *pool) {
    atomic_store(&pool->ncrew, 0);  /* nothing is listed for it any more */
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->lists[CREW].wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->crew_started; i++) pthread_join(pool->crew[i], NULL);
    pool->crew_started = 0;
}
