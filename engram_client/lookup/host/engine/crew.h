/* The prefill crew of a pool on the node budget (crew.c). */
#ifndef ENGRAM_ENGINE_CREW_H
#define ENGRAM_ENGINE_CREW_H
#include "common.h"
#include "pool.h"

/* Start the crew the pool's budget asks for (or none): 0, or an errno (kept in pool->crew_error). */
int crew_start(Pool *pool);

#endif
