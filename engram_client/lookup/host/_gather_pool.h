/* Gather jobs and the worker pool that runs them (included by _host_gather.c; Job is _gather_job.h's).
 *
 * A job copies rows ids[i] of the mapped table into staging row i, in blocks of block_rows taken
 * from an atomic counter by the pool's workers and by the thread that waits for the job.  Blocks
 * are grouped in chunks so that a waiter can hand out the first chunk while later ones are still
 * being gathered.  A pool lists the jobs that still have blocks; idle workers spin briefly on that
 * list, then sleep on a condition variable.  A job with a Signal is started by a CUDA stream and
 * reports its chunks to it through a word in pinned memory (_stream_signal.h): workers also poll
 * those words, and one of them watches them instead of sleeping while any are registered.  On a
 * budget that asks for it, prefill-size jobs go to a list of their own, served by the pool's prefill
 * crew (_prefill_crew.h).
 */
typedef struct Signal Signal;
typedef struct SignalSet SignalSet;
#include "_gather_job.h"
/* Node budget hooks (_node_budget.h): a pool on a budget gathers only while holding its tokens. */
struct NodeBudget;
static void *budget_worker_main(Pool *pool, int crew);
static void budget_wait_chunk(Job *job, int64_t chunk);
static void nb_unref(struct NodeBudget *budget);
static int crew_takes(Pool *pool, const Job *job);  /* _prefill_crew.h */

/* Jobs with blocks left, first come first served, and the threads that serve them asleep on `wake`. */
typedef struct {
    Job *head;
    atomic_int listed;             /* jobs on it: read without the lock, as a hint */
    pthread_cond_t wake;
    int sleepers;
} JobList;

enum { WORKERS = 0, CREW = 1 };    /* Pool.lists: the workers', and the prefill crew's (_prefill_crew.h) */

static inline void list_wake(JobList *list) {  /* pool lock held */
    if (list->sleepers) pthread_cond_broadcast(&list->wake);
}

struct Pool {
    pthread_mutex_t lock;
    JobList lists[2];
    atomic_int stop;
    /* The prefill crew (_prefill_crew.h): threads that take only the jobs of lists[CREW], at SCHED_IDLE
     * (--prefill-gathers idle) or at normal priority off the decode CPUs with spares at SCHED_IDLE on them. */
    atomic_int ncrew, crew_quit;
    int crew_started, crew_error, threads_asked, pinned, crew_idle;
    int crew_split, crew_spares;   /* decode CPUs the crew keeps off, and its spares on them */
    pthread_t *crew;               /* the crew, then its spares */
    cpu_set_t pin;                 /* where the workers (and the crew) run, if pinned */
    cpu_set_t decode_pin;          /* the decode CPUs among them, where the crew has spares */
    atomic_llong spin_until;       /* workers poll, awake, until then (pool_prewake) */
    int nthreads, started;
    long generation;               /* fork_generation when the workers started */
    pid_t pid;
    atomic_int refs;               /* the Python object and every StagedJob */
    atomic_llong jobs_run;
    atomic_llong cache_hits, cache_misses;  /* ids of skip_marked jobs: skipped (in HBM), fetched from the table */
    atomic_llong rows_fetched;     /* rows read from the table by every job */
    pthread_t *threads;
    SignalSet *_Atomic signals;    /* the stream signals this pool answers; NULL until the first */
    struct NodeBudget *_Atomic budget;  /* the node's gather budget, or NULL: this pool alone decides */
    struct NodeBudget *retired[16];     /* budgets of earlier daemons, kept until the pool goes */
    int nretired;
};

static inline JobList *pool_list(Pool *pool, int crew) { return &pool->lists[crew ? CREW : WORKERS]; }

/* The stream-signal side of a pool (_stream_signal.h, included after this file). */
static void signal_publish(Job *job);
static int signals_poll(Pool *pool);
static int signals_watch(Pool *pool);
static void signals_free(Pool *pool);
static void job_leave(Job *job);

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void pool_unref(Pool *pool) {
    if (atomic_fetch_sub(&pool->refs, 1) == 1) {
        signals_free(pool);
        if (pool->budget) nb_unref(pool->budget);
        for (int i = 0; i < pool->nretired; i++) nb_unref(pool->retired[i]);
        free(pool->threads);
        free(pool->crew);
        free(pool);
    }
}

#include "_gather_block.h"   /* gather_block, take_block */

/* The first job with blocks left on the workers' list (or the crew's); exhausted jobs are unlisted
 * on the way.  Lock held. */
static Job *job_with_work_in(JobList *list) {
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

static _Atomic int64_t join_pause_ns;  /* tests only (set_join_pause): widens the moment before the count */

/* Count this thread among the workers of a job job_with_work_in just found (pool lock held): 0 if
 * it came too late, its run ended by its last worker meanwhile (job_leave).  Taken back under the
 * lock, which job_start holds when it resets the count for the next run. */
static int job_join(Job *job) {
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
static void *worker_main(void *arg) {
    Pool *pool = arg;
    if (pool->budget) return budget_worker_main(pool, 0);  /* node budget hook */
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

/* A job is about to be enqueued: have the workers awake and polling when its host function runs. */
static void pool_prewake(Pool *pool) {
    atomic_store(&pool->spin_until, now_ns() + PREWAKE_NS);
    pthread_mutex_lock(&pool->lock);
    list_wake(&pool->lists[WORKERS]);
    pthread_mutex_unlock(&pool->lock);
}

static int pool_usable(const Pool *pool) {
    return pool->started && !atomic_load(&pool->stop) && pool->generation == atomic_load(&fork_generation);
}

/* Reset the job's progress and offer its blocks to the workers (if the pool still runs): 1 if listed. */
static int job_start(Job *job) {
    atomic_store(&job->next_block, 0);
    atomic_store(&job->bad, 0);
    for (int c = 0; c < MAX_CHUNKS; c++) atomic_store(&job->chunk_done[c], 0);
    job->listed = job->for_crew = 0;
    Pool *pool = job->pool;
    /* A signalled job has no waiting thread to gather a lone block: the workers take it. */
    if (pool == NULL || !pool_usable(pool) || (job->nblocks <= 1 && !job->signal)) {
        atomic_store(&job->users, 0);  /* never listed: nobody joins it */
        return 0;
    }
    pthread_mutex_lock(&pool->lock);
    atomic_store(&job->users, 0);  /* opens it again (a closed run's late joiner backs off under this lock) */
    int crew = job->for_crew = crew_takes(pool, job);
    /* First come, first served: two layers' lookups armed together finish in the order asked. */
    JobList *list = pool_list(pool, crew);
    Job **link = &list->head;
    while (*link) link = &(*link)->next;
    job->next = NULL;
    *link = job;
    job->listed = 1;
    atomic_fetch_add(&list->listed, 1);
    list_wake(list);
    pthread_mutex_unlock(&pool->lock);
    return 1;
}

/* Spin a while, then nap, longer each time (2 us doubling to 0.5 ms): the thread waited for may
 * have lost its CPU (a crew thread at SCHED_IDLE beside busy threads), and this one, at normal
 * priority, must not keep taking the CPU it needs.  Naps of 2 us without end cost the caller of a
 * prefill job more CPU than the crew that gathered it (tests/unit/test_prefill_crew.py). */
static void pause_briefly(int *spins) {
    if (++*spins < 2000) { cpu_relax(); return; }
    int doublings = *spins - 2000 < 8 ? *spins - 2000 : 8;
    struct timespec ts = {0, 2000L << doublings};
    nanosleep(&ts, NULL);
}

static int64_t chunk_blocks(const Job *job, int64_t chunk) {
    int64_t end = (chunk + 1) * job->chunk_blocks;
    return (end > job->nblocks ? job->nblocks : end) - chunk * job->chunk_blocks;
}

/* Gather alongside the workers until every block of `chunk` is in staging. */
static void job_wait_chunk(Job *job, int64_t chunk) {
    if (job->pool && job->pool->budget) {  /* node budget hook */
        budget_wait_chunk(job, chunk);
        return;
    }
    int64_t need = chunk_blocks(job, chunk);
    int spins = 0;
    while (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need)
        if (!take_block(job)) pause_briefly(&spins);
}

/* Take a job off its pool's list, if it is on it (the pool's lock is taken here). */
static void job_unlist(Job *job) {
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
static void job_finish(Job *job) {
    for (int64_t c = 0; c < job->nchunks; c++) job_wait_chunk(job, c);
    Pool *pool = job->pool;
    if (job->listed && pool != NULL) job_unlist(job);
    int spins = 0;
    while (atomic_load(&job->users)) pause_briefly(&spins);
    if (pool) atomic_fetch_add(&pool->jobs_run, 1);
}

static void job_plan(Job *job, int64_t n, int64_t nchunks) {
    job->n = n;
    job->block_rows = n <= 16384 ? 32 : 128;  /* enough blocks to share at decode sizes, few atomics later */
    job->nblocks = (n + job->block_rows - 1) / job->block_rows;
    if (nchunks < 1) nchunks = 1;
    if (nchunks > MAX_CHUNKS) nchunks = MAX_CHUNKS;
    if (nchunks > job->nblocks) nchunks = job->nblocks ? job->nblocks : 1;
    job->chunk_blocks = job->nblocks ? (job->nblocks + nchunks - 1) / nchunks : 1;
    job->nchunks = job->nblocks ? (job->nblocks + job->chunk_blocks - 1) / job->chunk_blocks : 0;
}

