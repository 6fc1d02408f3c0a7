/* A gather pool on the node budget (budget_pool.c): the hooks a pool started on a budget is given. */
#ifndef ENGRAM_ENGINE_BUDGET_POOL_H
#define ENGRAM_ENGINE_BUDGET_POOL_H
#include "common.h"
#include "budget.h"
#include "pool.h"

extern const PoolBudgetOps pool_budget_ops;

/* The worker loop of a pool on a budget: its workers (crew 0), its prefill crew (1), the crew's spares (2). */
void *budget_worker_main(Pool *pool, int crew);

#endif
