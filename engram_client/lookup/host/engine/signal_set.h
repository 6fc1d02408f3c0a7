/* A pool's stream signals: registering a slot's signal with its pool, and the interface through
 * which the pool reaches its signals (signal_set.c).
 */
#ifndef ENGRAM_ENGINE_SIGNAL_SET_H
#define ENGRAM_ENGINE_SIGNAL_SET_H
#include "common.h"
#include "pool.h"
#include "signal.h"

/* How the watcher polls (module.c's set_signal_tuning; docs/BENCHMARKS.md has the measures behind the defaults). */
typedef struct { int64_t spin_ns, poll_min_ns, poll_max_ns; int predict; } SignalTuning;
extern SignalTuning signal_tuning;

/* What a pool asks of its signals (pool.h): a pool answering stream signals is given this. */
extern const PoolSignalOps pool_signal_ops;

int signal_register(Pool *pool, Signal *sig);  /* 0, or -1: out of memory */
void signal_unregister(Signal *sig);           /* the slot is being freed: no thread looks at its word again */

#endif
