/* Whether the current context's device answers stream memory operations (signal_support.c). */
#ifndef ENGRAM_ENGINE_SIGNAL_SUPPORT_H
#define ENGRAM_ENGINE_SIGNAL_SUPPORT_H
#include "common.h"

PyObject *stream_signal_support(PyObject *module, PyObject *unused);  /* a module function */

#endif
