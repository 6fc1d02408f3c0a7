/* A stream signal: one staged slot's word in pinned memory, the run it starts, and the set of a pool's
 * signals (signal.c draws the protocol; signal_set.c keeps the sets and watches them).
 */
#ifndef ENGRAM_ENGINE_SIGNAL_H
#define ENGRAM_ENGINE_SIGNAL_H
#include "common.h"
#include "gather.h"
#include "pool.h"

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

static inline uint32_t word_load(const Signal *sig) { return __atomic_load_n(sig->word, __ATOMIC_SEQ_CST); }

void signal_publish(Job *job);         /* advance the word over the chunks now staged */
void signal_run_closed(Job *job);      /* its last worker left the run: end it, if still active */
void signal_run_here(Job *job);        /* gather a claimed run on this thread alone, then end it */
int signal_try_claim(Signal *sig);     /* ARMED -> IDLE for exactly one thread: 1 if this one started it */
void signal_start_now(Signal *sig);    /* an eager run whose ids are in pinned memory already */

#endif
