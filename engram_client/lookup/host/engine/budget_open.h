/* Opening the node budget in this process and letting it go (budget_open.c). */
#ifndef ENGRAM_ENGINE_BUDGET_OPEN_H
#define ENGRAM_ENGINE_BUDGET_OPEN_H
#include "common.h"
#include "budget.h"

/* Map the budget behind fd and claim a slot; NULL with a Python error set (the GIL held). */
NodeBudget *nb_open(int fd_in, int group, int tokens, int slots, int small_rows);
void nb_unref(NodeBudget *b);

#endif
