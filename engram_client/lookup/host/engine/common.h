/* What every unit of the host gather engine shares (libuv's uv-common.h plays this part): the system
 * headers, the engine's constants, the clock and the pause of a spinning thread, and two process-wide
 * facts that common.c owns: the exception classes the Python side handed over (set_error_classes) and
 * the count of forks this process has seen.
 *
 * The engine is built as one extension, engram_client.lookup.host._host_gather, from one .c per
 * subsystem; each .c has a .h that declares only what other units may call.  Layering, lowest first:
 *
 *     common, cuda, gather, pool, signal, signal_set, budget, budget_tokens, budget_open,
 *     budget_pool, crew, staged, budget_type, pool_type, staged_type, test_slot, signal_support, module
 *
 * A file includes only headers of its own layer or below (tests/unit/test_import_graph.py checks it), so
 * no two units call each other.  Where a lower unit must reach a higher one, it declares a small
 * interface that the higher one fills: the pool runs a node budget's loops through PoolBudgetOps, and
 * reaches its stream signals (a block staged, a run ended, a poll, a watch) through PoolSignalOps
 * (both in pool.h).
 *
 * Every system header is included here, before the engine's symbols are made hidden: the units call
 * each other across files now, and a name such as job_start must never bind to another library's.
 */
#ifndef ENGRAM_ENGINE_COMMON_H
#define ENGRAM_ENGINE_COMMON_H

#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#pragma GCC visibility push(hidden)  /* PyInit__host_gather alone stays visible (PyMODINIT_FUNC says so) */

#define MAX_CHUNKS 8
#define PREFETCH_ROWS 16          /* rows prefetched ahead of the copy, per thread */
#define IDLE_SPIN_NS 50000        /* a worker polls for new jobs this long after its last one, then sleeps */
#define PREWAKE_NS 150000         /* an enqueue wakes the workers to poll this long for its host function */

/* The project's exception classes (set_error_classes) and a count of forks seen by this process. */
extern PyObject *error_class;      /* engram_client's EngramError, set by set_error_classes() */
extern PyObject *detached_class;   /* NotAttachedError: a closed pool, a forked child */
extern atomic_long fork_generation;

void after_fork_in_child(void);
PyObject *err_class(void);         /* the GIL held */

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

#endif
