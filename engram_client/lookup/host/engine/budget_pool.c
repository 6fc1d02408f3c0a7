/* The node budget's hooks into the gather pool: a worker's loop and the waiting thread's part, both
 * gathering only on tokens (budget.h for the rules), and the rule that lists a job for the crew.
 *
 * Owns: pool_budget_ops, which a pool started on a budget is given (pool_type.c), so that the pool
 * runs these in place of its own loop and wait without knowing a budget.  May call: the pool (pool.h),
 * budget.c, budget_tokens.c, budget_open.c, gather.c (gather_block).  Must never: sleep on the pool's condition variable holding a token
 * (a holder lingers, polling, only while nobody else wants one), take more than the pool's lock for a
 * look while holding one, or touch Python objects (gather threads run it off the GIL).
 */
#include "budget_pool.h"
#include "budget_open.h"
#include "budget_tokens.h"

/* take_block with the budget's accounting: the gathering count (never above the tokens), rows,
 * blocks of prefill jobs, and a wake-up for a waiter whose chunk this block completed. */
static int budget_take_block(NodeBudget *b, Job *job, int counted, int small) {
    int64_t block = atomic_fetch_add(&job->next_block, 1);
    if (block >= job->nblocks) return 0;
    if (block == job->nblocks - 1 && atomic_load(&b->s->sleepers)) {
        /* The job's last block is handed out: our workers still waiting for a token for it may go. */
        atomic_fetch_add(&b->s->seq, 1);
        nb_futex(&b->s->seq, FUTEX_WAKE, INT32_MAX, 0);
    }
    if (counted) {
        int now = atomic_fetch_add(&b->g->gathering, 1) + 1, peak = atomic_load(&b->g->peak);
        while (now > peak && !atomic_compare_exchange_weak(&b->g->peak, &peak, now)) {}
    }
    gather_block(job, block);
    if (job->signal) job->pool->signal_ops->publish(job);  /* tell the stream which chunks it may copy (signal.c) */
    if (counted) atomic_fetch_sub(&b->g->gathering, 1);
    int64_t lo = block * job->block_rows;
    atomic_fetch_add_explicit(&b->s->rows, (uint64_t)(job->n - lo < job->block_rows ? job->n - lo : job->block_rows),
                              memory_order_relaxed);
    if (!small) atomic_fetch_add_explicit(&b->g->big_blocks, 1, memory_order_relaxed);
    int64_t chunk = block / job->chunk_blocks;
    atomic_thread_fence(memory_order_seq_cst);  /* the block's count before the sleeper check (see budget_wait_chunk) */
    if (atomic_load(&b->done_sleepers) && atomic_load(&job->chunk_done[chunk]) >= chunk_blocks(job, chunk)) {
        atomic_fetch_add(&b->done_seq, 1);
        nb_futex((_Atomic uint32_t *)&b->done_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, 0);
    }
    return 1;
}

static int pool_has_work_in(Pool *pool, int crew) {  /* a listed job with blocks left (exhausted ones are unlisted) */
    JobList *list = pool_list(pool, crew);
    if (!atomic_load(&list->listed) || atomic_load(&pool->stop)) return 0;
    pthread_mutex_lock(&pool->lock);
    int work = job_with_work_in(list) != NULL;
    pthread_mutex_unlock(&pool->lock);
    return work;
}

static int nb_pool_has_work(void *arg) { return pool_has_work_in(arg, 0); }
static int nb_crew_has_work(void *arg) { return pool_has_work_in(arg, 1); }

static int nb_job_has_blocks(void *arg) {
    Job *job = arg;
    return atomic_load(&job->next_block) < job->nblocks;
}

static inline int thread_quits(Pool *pool, int crew) {  /* the pool closes, or (crew) the crew is called off */
    return atomic_load(&pool->stop) || (crew && atomic_load(&pool->crew_quit));
}

/* Whether a spare of --decode-spares quiet must leave prefill work alone: a rank of the group started
 * a decode-size job in the last NB_DECODE_QUIET_NS.  A spare gathering beside a decode call holds its
 * CPU until the kernel preempts it, and shares a core with a decode worker where the decode CPUs are
 * hyperthreads; with none there a decode call's lone lookup kept its p90 at 1.65-2.12x its p90 alone
 * beside three prefilling ranks, against 2.1-6.2x with spares that gather whenever the CPU is free
 * (docs/history/benchmarks-2026-12.md, "The busy node: waking only the workers a token awaits").
 * The window outlasts a decode step, so they stay aside through a rank's whole decode, and come
 * back for a node that only prefills, where they add their CPUs to its rate.  A window shorter than
 * a step (2 ms) gave the neighbours of a decoding rank their rate back, but a decode call that came
 * while the spares gathered had a lone lookup's p90 at 3.3x its p90 alone against 1.41x (the same
 * history, "The spares' quiet window"). */
static int spare_stands_aside(const NodeBudget *b) {
    return (b->flags & NB_FLAG_SPARES_QUIET) && nb_decode_window_end(b, now_ns()) != 0;
}

/* The same at a block boundary of a spare that is gathering (so the group was not decoding when it
 * looked): only a new decode_at can change that, so the clock is read only when one appears. */
static int spare_stands_aside_now(const NodeBudget *b, int64_t *decode_seen) {
    int64_t at = atomic_load_explicit(&b->g->decode_at, memory_order_relaxed);
    if (at == *decode_seen) return 0;
    *decode_seen = at;
    return spare_stands_aside(b);
}

/* A spare that stands aside sleeps on its list until the group's decode window closes (the latest
 * stamp's, read now: NB_DECODE_QUIET_NS at most), a new prefill job is listed, or the crew is called
 * off.  Its condition variable waits on CLOCK_MONOTONIC (pool_type.c), the clock of the stamps. */
static void spare_sleep(Pool *pool, const NodeBudget *b, JobList *list) {
    int64_t now = now_ns(), end = nb_decode_window_end(b, now), wake = end ? end : now;
    struct timespec until = {wake / 1000000000, wake % 1000000000};
    atomic_fetch_add(&pool->spare_asides, 1);
    pthread_mutex_lock(&pool->lock);
    if (!thread_quits(pool, 2)) {
        list->sleepers++;
        pthread_cond_timedwait(&list->wake, &pool->lock, &until);
        list->sleepers--;
    }
    pthread_mutex_unlock(&pool->lock);
}

static void worker_release(NodeBudget *b, int tok, int yielded, int crew) {
    if (crew) nb_crew_hold(b, tok, -1);
    nb_release(b, tok, yielded);
}

/* The worker loop of a pool on a budget (the hook in worker_main), of its prefill crew (crew 1) and of
 * the crew's spares (crew 2: no token, see crew.c).  A worker
 * without a token sleeps; it takes one when jobs are listed (or, to answer a pre-wake, when nobody
 * else wants one), gathers while it holds it, yields it at block boundaries when the budget says so,
 * and after its last job lingers, holding it, only while nobody else waits.  The crew serves its own
 * list, and neither answers pre-wakes nor watches stream signals (the workers do, for decode latency). */
void *budget_worker_main(Pool *pool, int crew) {
    NodeBudget *b = pool->budget;
    JobList *list = pool_list(pool, crew);
    int tok = NB_NONE;
    int64_t linger_until = 0, answered = 0, decode_seen = 0;
    while (!thread_quits(pool, crew)) {
        if (tok == NB_NONE) {
            b = atomic_load(&pool->budget);  /* a new daemon's budget (set_budget) from the next token on */
            pthread_mutex_lock(&pool->lock);
            while (!thread_quits(pool, crew) && !atomic_load(&list->listed)) {
                int64_t spin = atomic_load(&pool->spin_until);
                if (!crew && spin != answered && spin > now_ns()) break;
                /* A graph replay's job is announced by no host call: while stream signals are
                 * registered, one idle worker watches their words instead of sleeping (signal_set.c). */
                if (!crew && signals_watch(pool)) continue;
                list->sleepers++;
                pthread_cond_wait(&list->wake, &pool->lock);
                list->sleepers--;
            }
            int listed = atomic_load(&list->listed);
            int small = list->head == NULL || list->head->n <= b->small_rows;
            pthread_mutex_unlock(&pool->lock);
            if (thread_quits(pool, crew)) break;
            if (!listed && crew) continue;  /* its job was finished by others meanwhile */
            if (!listed) {  /* a pre-wake: be awake for the job, but only on a token nobody else wants */
                answered = atomic_load(&pool->spin_until);
                linger_until = answered;
                /* ...and not at SCHED_FIFO, where spinning keeps the CPU from every thread of normal
                 * priority (crew.c); such a worker takes the CPU at once when the job wakes it. */
                if (atomic_load(&pool->decode_rt) || (tok = nb_try(b, 1, 1)) == NB_NONE) continue;
            } else if (crew == 2) {
                decode_seen = atomic_load_explicit(&b->g->decode_at, memory_order_relaxed);
                if (spare_stands_aside(b)) {
                    spare_sleep(pool, b, list);
                    continue;
                }
                tok = NB_SPARE;  /* a spare gathers without a token, at SCHED_IDLE (crew.c) */
            } else if ((tok = nb_acquire(b, small, crew ? nb_crew_has_work : nb_pool_has_work, pool)) == NB_NONE) {
                continue;
            }
            if (crew) nb_crew_hold(b, tok, 1);
        }
        if (crew && tok >= 0) nb_crew_seen(b);
        if (atomic_load(&list->listed)) {
            pthread_mutex_lock(&pool->lock);
            Job *job = job_with_work_in(list);
            if (job && !job_join(job)) job = NULL;
            pthread_mutex_unlock(&pool->lock);
            if (job) {
                int small = job->n <= b->small_rows, yielded = 0, aside = 0;
                int64_t blocks = 0;
                while (budget_take_block(b, job, tok >= 0, small)) {
                    if (tok == NB_SPARE) atomic_fetch_add_explicit(&pool->spare_blocks, 1, memory_order_relaxed);
                    if (crew && tok >= 0) nb_crew_seen(b);
                    if ((yielded = nb_should_yield(b, tok, small, ++blocks))) break;
                    if (tok == NB_SPARE && (aside = spare_stands_aside_now(b, &decode_seen))) break;
                }
                job_leave(job);  /* the last worker off a signalled job ends its run (signal.c) */
                if (yielded || aside || tok == NB_STAND_IN) {  /* a stand-in is for one job */
                    worker_release(b, tok, yielded, crew);
                    tok = NB_NONE;
                }
                linger_until = now_ns() + IDLE_SPIN_NS;
                continue;
            }
        }
        int64_t now = now_ns(), spin = crew ? 0 : atomic_load(&pool->spin_until);
        if (tok >= 0 && (now < linger_until || now < spin) && !nb_others_wanting(b) && !atomic_load(&pool->decode_rt)) {
            if (!crew && signals_poll(pool)) continue;  /* a stream armed a job: it is listed now */
            for (int i = 0; i < 32; i++) cpu_relax();
            continue;
        }
        worker_release(b, tok, 0, crew);
        tok = NB_NONE;
    }
    if (tok != NB_NONE) worker_release(b, tok, 0, crew);
    return NULL;
}

/* The waiter's part on a budget (the hook in job_wait_chunk): it gathers only on a token it can
 * get at once (the pool's workers wait for theirs), and otherwise sleeps until a block completes
 * its chunk.  Where no worker will help (one thread, a closed pool, a one-block job that is never
 * listed) it waits for a token itself.  A job for the prefill crew it leaves to the crew, and it
 * sleeps at once: this thread is not at SCHED_IDLE, and a prefill call does not need the poll. */
static void budget_wait_chunk(Job *job, int64_t chunk) {
    Pool *pool = job->pool;
    NodeBudget *b = pool->budget;
    const int64_t need = chunk_blocks(job, chunk);
    const int small = job->n <= b->small_rows;
    int tok = NB_NONE, polled = 0;
    int64_t blocks = 0;
    while (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need) {
        /* No worker will help with a job that was never listed (one block), nor in a pool without them. */
        int crew = job->for_crew;
        int alone = (crew ? atomic_load(&pool->ncrew) == 0 : pool->nthreads == 0) || !pool_usable(pool) || !job->listed;
        /* Helping needs a free token: look before taking the group's lock (a hint; nb_try decides). */
        int may_help = alone || (!crew && (!nb_usable(b) || nb_held_total(b) < b->tokens));
        if (tok == NB_NONE && atomic_load(&job->next_block) < job->nblocks && may_help)
            tok = alone ? nb_acquire(b, small, nb_job_has_blocks, job) : nb_try(b, small, 0);
        if (tok != NB_NONE) {
            if (budget_take_block(b, job, tok >= 0, small)) {
                int why = nb_should_yield(b, tok, small, ++blocks);
                if (why) {
                    nb_release(b, tok, why);
                    tok = NB_NONE, blocks = 0;
                }
                continue;
            }
            nb_release(b, tok, 0);
            tok = NB_NONE;
        }
        /* Poll a little first, once per chunk: a wake-up through the kernel costs tens of
         * microseconds in a VM, as much as a decode-size call's gather.  Polling again after every
         * nap kept this thread on a core half the time, outside the budget, beside the threads
         * that hold its tokens (tests/unit/test_gather_budget_waiter.py). */
        if (!polled && !crew) {
            int64_t spin_until = now_ns() + NB_WAITER_SPIN_NS;
            while (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need && now_ns() < spin_until)
                for (int i = 0; i < 32; i++) cpu_relax();
            polled = 1;
        }
        if (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) >= need) break;
        uint32_t seen = atomic_load(&b->done_seq);
        atomic_fetch_add(&b->done_sleepers, 1);
        if (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need)
            nb_futex((_Atomic uint32_t *)&b->done_seq, FUTEX_WAIT_PRIVATE, seen, alone || crew ? NB_WAIT_NS : NB_WAITER_NAP_NS);
        atomic_fetch_sub(&b->done_sleepers, 1);
    }
    if (tok != NB_NONE) nb_release(b, tok, 0);
}

/* A job of the pool starts: a decode-size one is noted in the group (nb_note_decode), for the spares
 * of every rank in it.  Every one counts, the one-block jobs a caller gathers alone included, but
 * those of a pool whose workers run at SCHED_FIFO (crew.c): they take a spare's CPU the moment
 * they wake, so the spares need not stand aside for them, and the prefilling ranks keep the decode
 * CPUs while such ranks decode (quiet spares stood aside for whole decode phases, the neighbours
 * keeping 0.71-0.94x of their rate meanwhile: docs/history/benchmarks-2026-12.md). */
static void job_starting(Pool *pool, const Job *job) {
    NodeBudget *b = atomic_load(&pool->budget);
    if (b != NULL && nb_usable(b) && job->n <= b->small_rows && !atomic_load(&pool->decode_rt))
        nb_note_decode(b, now_ns());
}

/* Whether `job` (being listed; pool lock held) goes to the crew (crew.c says why). */
static int crew_takes(Pool *pool, const Job *job) {
    NodeBudget *b = atomic_load(&pool->budget);
    return b && atomic_load(&pool->ncrew) > 0 && job->n > b->small_rows &&
           ((b->flags & NB_FLAG_PREFILL_IDLE) || (pool->crew_split && b->decode > 0));
}

/* How many sleeping workers a decode-size job being listed wakes (pool lock held): while other
 * slots of the group want tokens, as many as there are tokens free, else all.  A worker woken for
 * no token registers, sleeps on its slot's futex and is woken again when the job's last block goes
 * out; beside three prefilling ranks, a rank's fifteen woken workers stood runnable on the few idle
 * decode CPUs behind the three or four that held tokens (5-22 ms summed in a lone 6,144-row call's
 * slowest cases: docs/history/benchmarks-2026-12.md, "The busy node: four decode CPUs, and decode
 * workers on them").  A prefill-size job wakes all (they wait for tokens as they free up, for the
 * node's rate), and so does any job where nobody else wants a token (a rank alone is as before).
 * A pre-wake (job NULL) is answered only on a token nobody else wants: with others wanting it
 * wakes nobody, where it used to wake every worker to find none. */
static int workers_to_wake(Pool *pool, const Job *job) {
    NodeBudget *b = atomic_load(&pool->budget);
    if (b == NULL || !nb_usable(b)) return INT_MAX;
    if (!nb_others_wanting(b)) return INT_MAX;
    if (job == NULL) return 0;
    if (job->n > b->small_rows) return INT_MAX;
    int free = b->tokens - nb_held_total(b);
    return free > 1 ? free : 1;  /* one at least: it waits for a token, and the job's own thread may help */
}

/* What the watcher may spin for (pool.h's pool_spin_room; no lock: hints, read as it spins).  A
 * watcher at SCHED_FIFO (crew.c) never spins: spinning, it would keep its CPU from every thread of
 * normal priority there, the engine's own included, for the whole window; it naps between polls. */
static int spin_room(Pool *pool) {
    NodeBudget *b = atomic_load(&pool->budget);
    if (atomic_load(&pool->decode_rt)) return SPIN_NONE;
    if (!nb_usable(b)) return SPIN_ANY;
    return nb_held_total(b) < b->tokens ? SPIN_WINDOW : SPIN_NONE;
}

const PoolBudgetOps pool_budget_ops = {
    .worker_main = budget_worker_main, .wait_chunk = budget_wait_chunk, .job_starting = job_starting,
    .crew_takes = crew_takes, .workers_to_wake = workers_to_wake, .unref = nb_unref, .spin_room = spin_room,
};
