/* Taking a token of the node budget and giving it back (budget_tokens.c). */
#ifndef ENGRAM_ENGINE_BUDGET_TOKENS_H
#define ENGRAM_ENGINE_BUDGET_TOKENS_H
#include "common.h"
#include "budget.h"

int nb_try(NodeBudget *b, int small, int uncontended_only);  /* one attempt: a token, or NB_NONE */
/* Wait (bounded) for a token; NB_NONE once `needed(arg)` says the work is gone, NB_OVERDRAFT or
 * NB_STAND_IN as budget.h says. */
int nb_acquire(NodeBudget *b, int small, int (*needed)(void *), void *arg);
void nb_release(NodeBudget *b, int t, int yielded);
int nb_should_yield(NodeBudget *b, int t, int small, int64_t blocks);  /* at a block boundary: 0, 1 or 2 */
void nb_crew_hold(NodeBudget *b, int t, int delta);

/* Called by a crew thread holding a token: it runs (see nb_stalled_crew). */
static inline void nb_crew_seen(NodeBudget *b) {
    int64_t now = now_ns();
    if (now - atomic_load_explicit(&b->s->crew_seen_at, memory_order_relaxed) > NB_CREW_SEEN_NS)
        atomic_store(&b->s->crew_seen_at, now);
}

#endif
