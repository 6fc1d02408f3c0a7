/* StagedJob, the Python object of a staged slot (staged_type.c); SignalTestSlot shares its rules. */
#ifndef ENGRAM_ENGINE_STAGED_TYPE_H
#define ENGRAM_ENGINE_STAGED_TYPE_H
#include "common.h"
#include "staged.h"

typedef struct {
    PyObject_HEAD
    StagedState *state;
} StagedJobObject;

extern PyTypeObject StagedJobType;

int staged_adopt(StagedJobObject *self, Pool *pool, StagedState *state);  /* signal word, registration, pool held */
void staged_dealloc(StagedJobObject *self);  /* a graph's or a running slot is leaked */
PyObject *staged_disarm(StagedJobObject *self, PyObject *unused);

#endif
