/* The gather pool and its jobs: what the stream signals, the node budget, the prefill crew and the
 * Python objects may call of it, and the two interfaces through which it reaches them in turn.
 *
 * struct Pool is drawn here because the node budget's worker loop (budget_pool.c) and the crew
 * (crew.c) run on its lists and its lock; they are the pool's threads, run by its rules (pool.c).
 */
#ifndef ENGRAM_ENGINE_POOL_H
#define ENGRAM_ENGINE_POOL_H
#include "common.h"
#include "gather.h"

typedef struct SignalSet SignalSet;  /* signal.h */
struct NodeBudget;                   /* budget.h */

/* What a pool on a node budget asks of it (budget_pool.c fills it; the pool never reads a budget). */
typedef struct {
    void *(*worker_main)(Pool *pool, int crew);      /* a worker's loop (crew 1, 2: the crew's, its spares') */
    void (*wait_chunk)(Job *job, int64_t chunk);     /* the waiting thread's part, on tokens */
    void (*job_starting)(Pool *pool, const Job *job);  /* a job of the pool starts (no lock held) */
    int (*crew_takes)(Pool *pool, const Job *job);   /* whether a job being listed goes to the crew (lock held) */
    int (*workers_to_wake)(Pool *pool, const Job *job);  /* sleeping workers a job being listed, or (NULL) a
                                                            pre-wake, should wake (lock held) */
    void (*unref)(struct NodeBudget *budget);        /* the pool lets go of a budget */
    int (*spin_room)(Pool *pool);                    /* SPIN_*: what a thread holding no token may spin for */
} PoolBudgetOps;

/* What a pool asks of its stream signals (signal.c, signal_set.c fill it; the pool never reads a Signal). */
typedef struct {
    void (*publish)(Job *job);     /* a block of a signalled job is in staging: tell the stream */
    void (*run_closed)(Job *job);  /* the last worker left a signalled run with every block taken: end it */
    int (*poll)(Pool *pool);       /* claim an armed job: 1 if one was started (it is listed now) */
    int (*watch)(Pool *pool);      /* instead of sleeping (pool lock held): 1 if it watched (lock held again) */
    void (*orphan)(Pool *pool);    /* the workers are joined: someone else must answer the signals */
    void (*free)(Pool *pool);      /* the pool goes */
} PoolSignalOps;

/* Jobs with blocks left, first come first served, and the threads that serve them asleep on `wake`. */
typedef struct {
    Job *head;
    atomic_int listed;             /* jobs on it: read without the lock, as a hint */
    pthread_cond_t wake;
    int sleepers;
} JobList;

enum { WORKERS = 0, CREW = 1 };    /* Pool.lists: the workers', and the prefill crew's (crew.c) */

static inline void list_wake(JobList *list) {  /* pool lock held */
    if (list->sleepers) pthread_cond_broadcast(&list->wake);
}

static inline void list_wake_some(JobList *list, int n) {  /* pool lock held: n of its sleepers, or all */
    if (n >= list->sleepers) list_wake(list);
    else
        for (int i = 0; i < n; i++) pthread_cond_signal(&list->wake);
}

struct Pool {
    pthread_mutex_t lock;
    JobList lists[2];
    atomic_int stop;
    /* The prefill crew (crew.c): threads that take only the jobs of lists[CREW], at SCHED_IDLE
     * (--prefill-gathers idle) or at normal priority off the decode CPUs with spares at SCHED_IDLE on them. */
    atomic_int ncrew, crew_quit;
    int crew_started, crew_error, threads_asked, pinned, crew_idle;
    int crew_split, crew_spares;   /* decode CPUs the crew keeps off, and its spares on them */
    pthread_t *crew;               /* the crew, then its spares */
    cpu_set_t pin;                 /* where the workers (and the crew) run, if pinned */
    cpu_set_t decode_pin;          /* the decode CPUs among them, where the crew has spares */
    /* The workers' scheduling while the crew takes every prefill-size job, so they gather decode-size
     * jobs only (crew.c, workers_realtime): SCHED_FIFO at decode_rt_asked where the process may (0:
     * never); decode_rt the priority they run at now (0: SCHED_OTHER), decode_rt_error the errno of
     * the refusal that kept them from it. */
    int decode_rt_asked, decode_rt_error;
    atomic_int decode_rt;
    atomic_llong spin_until;       /* workers poll, awake, until then (pool_prewake) */
    int nthreads, started;
    long generation;               /* fork_generation when the workers started */
    pid_t pid;
    atomic_int refs;               /* the Python object and every StagedJob */
    atomic_llong jobs_run;
    atomic_llong wakes_in_part, left_asleep, prewakes_skipped;  /* what pool_wake_workers held back (wake_counts) */
    atomic_llong spare_blocks, spare_asides;  /* blocks the crew's spares gathered, and the times one woke (or
                                                 left a job) to find a rank decoding and went to sleep */
    RowCounts counts;              /* what its jobs' rows came to (gather_block) */
    pthread_t *threads;
    SignalSet *_Atomic signals;    /* the stream signals this pool answers; NULL until the first */
    const PoolSignalOps *signal_ops;    /* how to reach them (set before the workers start) */
    struct NodeBudget *_Atomic budget;  /* the node's gather budget, or NULL: this pool alone decides */
    const PoolBudgetOps *budget_ops;    /* how to gather on it (set with the first budget), or NULL */
    struct NodeBudget *retired[16];     /* budgets of earlier daemons, kept until the pool goes */
    int nretired;
};

static inline JobList *pool_list(Pool *pool, int crew) { return &pool->lists[crew ? CREW : WORKERS]; }

/* The stream-signal side of a pool: a claim of an armed job, a watch instead of sleeping. */
static inline int signals_poll(Pool *pool) {
    return atomic_load(&pool->signals) ? pool->signal_ops->poll(pool) : 0;
}

static inline int signals_watch(Pool *pool) {
    return atomic_load(&pool->signals) ? pool->signal_ops->watch(pool) : 0;
}

/* What a thread that holds no token (the signal watcher, signal_set.c) may spin for rather than nap:
 * anything where the pool alone decides; on a node budget, which counts only the threads that gather,
 * only the short window around an expected replay, and only while a token is unheld. */
enum { SPIN_NONE = 0, SPIN_WINDOW = 1, SPIN_ANY = 2 };

static inline int pool_spin_room(Pool *pool) {
    return atomic_load(&pool->budget) == NULL ? SPIN_ANY : pool->budget_ops->spin_room(pool);
}

/* The pool. */
void *worker_main(void *arg);
void pool_stop(Pool *pool);        /* stop and join the workers and the crew; hand the signals on */
void pool_unref(Pool *pool);
void pool_prewake(Pool *pool);
void pool_prewake_until(Pool *pool, int64_t until);  /* the signal watcher's predicted window */
void pool_wake_workers(Pool *pool, const Job *job);  /* lock held: as many as the budget says (all without one) */
int pool_usable(const Pool *pool);
void crew_join(Pool *pool);        /* call the crew off and join it (crew.c starts it) */
void pause_briefly(int *spins);

/* Its jobs. */
void job_plan(Job *job, int64_t n, int64_t nchunks);
int job_start(Job *job);
void job_wait_chunk(Job *job, int64_t chunk);
void job_finish(Job *job);
void job_unlist(Job *job);
Job *job_with_work_in(JobList *list);  /* lock held */
int job_join(Job *job);            /* lock held */
void job_leave(Job *job);
int take_block(Job *job);

/* Tests only: pauses that widen race windows (module.c's set_join_pause, set_leave_pause). */
extern _Atomic int64_t join_pause_ns, leave_pause_ns;

#endif
