/* GatherPool, the Python object of a gather pool (pool_type.c): what the staged slots' objects need of it. */
#ifndef ENGRAM_ENGINE_POOL_TYPE_H
#define ENGRAM_ENGINE_POOL_TYPE_H
#include "common.h"
#include "pool.h"

typedef struct {
    PyObject_HEAD
    Pool *pool;
    int caller_gathers;            /* the calling thread is one of `threads` (host functions, CPU gathers) */
} PoolObject;

extern PyTypeObject PoolType;

/* 0 where the pool may be used from this process; else -1 with NotAttachedError set (closed, or forked). */
int check_pool(Pool *pool);

#endif
