/* The engine's process-wide facts: the exception classes the C raises and the count of forks.
 *
 * Owns: error_class and detached_class (written by set_error_classes, module.c, with the GIL held),
 * fork_generation (bumped in a forked child, read by every unit that refuses to run its parent's
 * threads or locks).  May call: nothing of the engine.  Must never: touch the classes off the GIL.
 */
#include "common.h"

PyObject *error_class;
PyObject *detached_class;
atomic_long fork_generation;

void after_fork_in_child(void) { atomic_fetch_add(&fork_generation, 1); }

PyObject *err_class(void) { return error_class ? error_class : PyExc_RuntimeError; }
