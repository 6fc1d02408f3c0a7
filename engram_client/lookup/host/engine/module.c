/* engram_client.lookup.host._host_gather: gather table rows on CPU threads, and enqueue that gather on a CUDA stream.
 *
 * A GatherPool is a persistent set of pthreads (one pool per client).  A gather job copies the rows
 * named by ids (int32 or int64, read raw) from the read-only mapped rows [row_lo, row_hi) into
 * staging memory; an id outside that range is never used as an address: its staged row is zeroed
 * and counted, in the job and in a caller-owned int64 counter (atomically, so Python reads it
 * without any sync).  Work is split in blocks taken from an atomic counter.  Workers sleep on a
 * condition variable when idle, after a short spin.
 *
 * A StagedJob enqueues that gather on a CUDA stream, in stream order: staged.c draws the sequence.
 *
 * Life cycle: close() (or deallocation) stops and joins the workers; signals registered then are
 * answered by one process-wide thread.  A child process after fork() refuses to use its parent's
 * pool (the threads are not there) and says so.  A StagedJob still in flight, or held by a captured
 * graph, when it is dropped is leaked rather than freed under a running gather.
 *
 * This file is the module: its plain functions and its types' registration.  The engine's units are
 * laid out in common.h.  Owns: the module's function table.  May call: any unit.  Must never: be
 * called without the GIL.
 */
#include "module.h"
#include "budget_type.h"
#include "cuda.h"
#include "pool.h"
#include "pool_type.h"
#include "signal_set.h"
#include "signal_support.h"
#include "staged_type.h"
#include "test_slot.h"

static PyObject *set_error_classes(PyObject *module, PyObject *args) {
    PyObject *base, *detached;
    if (!PyArg_ParseTuple(args, "OO", &base, &detached)) return NULL;
    Py_XSETREF(error_class, Py_NewRef(base));
    Py_XSETREF(detached_class, Py_NewRef(detached));
    Py_RETURN_NONE;
}

/* Ids from the host are checked before anything is enqueued, so their error is raised at once. */
static PyObject *count_outside(PyObject *module, PyObject *args) {
    unsigned long long ids;
    long long n, lo, hi;
    int ids64;
    if (!PyArg_ParseTuple(args, "KpLLL", &ids, &ids64, &n, &lo, &hi)) return NULL;
    long long bad = 0;
    if (ids64) {
        const int64_t *p = (const int64_t *)(uintptr_t)ids;
        for (long long i = 0; i < n; i++) bad += (p[i] < lo) | (p[i] >= hi);
    } else {
        const int32_t *p = (const int32_t *)(uintptr_t)ids;
        for (long long i = 0; i < n; i++) bad += ((int64_t)p[i] < lo) | ((int64_t)p[i] >= hi);
    }
    return PyLong_FromLongLong(bad);
}

static PyObject *stream_capturing(PyObject *module, PyObject *arg) {
    unsigned long long stream = PyLong_AsUnsignedLongLong(arg);
    int status = 0;
    if (PyErr_Occurred() || load_cuda() ||
        cu_failed(cu.stream_is_capturing((CUstream)(uintptr_t)stream, &status), "cuStreamIsCapturing"))
        return NULL;
    return PyBool_FromLong(status == 1 /* CU_STREAM_CAPTURE_STATUS_ACTIVE */);
}

/* Setting and reading the row copy's tuning (gather.c). */
static PyObject *set_tuning(PyObject *module, PyObject *args) {
    int near, far, hint, streaming;
    if (!PyArg_ParseTuple(args, "iiip", &near, &far, &hint, &streaming)) return NULL;
    if (near < 0 || near > 256 || far < 0 || far > 1024 || (far && far <= near) || hint < 0 || hint > 3) {
        PyErr_Format(PyExc_ValueError, "prefetch of whole rows %d ahead, first lines %d ahead, hint %d: want "
                     "0 <= near <= 256, far 0 or in (near, 1024], hint 0 to 3", near, far, hint);
        return NULL;
    }
    gather_tuning.near = near, gather_tuning.far = far, gather_tuning.hint = hint;
    gather_tuning.streaming = streaming;
    Py_RETURN_NONE;
}

static PyObject *get_tuning(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(iiiO)", gather_tuning.near, gather_tuning.far, gather_tuning.hint,
                         gather_tuning.streaming ? Py_True : Py_False);
}

/* Setting and reading how the watcher polls (signal_set.c). */
static PyObject *set_signal_tuning(PyObject *module, PyObject *args) {
    long long spin, poll_min, poll_max;
    int predict = 1;
    if (!PyArg_ParseTuple(args, "LLL|p", &spin, &poll_min, &poll_max, &predict)) return NULL;
    if (spin < 0 || poll_min < 1000 || poll_max < poll_min || poll_max > 100000000) {
        PyErr_Format(PyExc_ValueError, "signal watching: spin %lld ns, naps %lld..%lld ns: want spin >= 0 and "
                     "1 us <= poll_min <= poll_max <= 100 ms", spin, poll_min, poll_max);
        return NULL;
    }
    signal_tuning.spin_ns = spin, signal_tuning.poll_min_ns = poll_min, signal_tuning.poll_max_ns = poll_max;
    signal_tuning.predict = predict;
    Py_RETURN_NONE;
}

static PyObject *get_signal_tuning(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(LLLO)", (long long)signal_tuning.spin_ns, (long long)signal_tuning.poll_min_ns,
                         (long long)signal_tuning.poll_max_ns, signal_tuning.predict ? Py_True : Py_False);
}

/* The tests' pauses (set_leave_pause, set_join_pause): 0..10 ms. */
static PyObject *set_test_pause(PyObject *arg, _Atomic int64_t *pause, const char *what) {
    long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred()) return NULL;
    if (ns < 0 || ns > 10000000) {
        PyErr_Format(PyExc_ValueError, "a %s pause of %lld ns: want 0..10,000,000 (tests only)", what, ns);
        return NULL;
    }
    atomic_store(pause, ns);
    Py_RETURN_NONE;
}

static PyObject *set_leave_pause(PyObject *self, PyObject *arg) { return set_test_pause(arg, &leave_pause_ns, "leave"); }
static PyObject *set_join_pause(PyObject *self, PyObject *arg) { return set_test_pause(arg, &join_pause_ns, "join"); }

static PyMethodDef module_methods[] = {
    {"stream_capturing", stream_capturing, METH_O, "stream_capturing(stream) -> whether it is capturing a graph"},
    {"set_error_classes", set_error_classes, METH_VARARGS, "set_error_classes(base, detached)"},
    {"set_leave_pause", set_leave_pause, METH_O,
     "set_leave_pause(ns): tests only: workers pause ns after leaving a job (0: never; the default)"},
    {"set_join_pause", set_join_pause, METH_O,
     "set_join_pause(ns): tests only: workers pause ns, the pool's lock held, between finding a job and joining it"},
    {"set_tuning", set_tuning, METH_VARARGS,
     "set_tuning(near, far, hint, streaming): prefetch whole rows `near` ahead, first lines `far` ahead\n"
     "(0: off), locality hint 0-3; write staging with non-temporal stores (x86-64)"},
    {"get_tuning", get_tuning, METH_NOARGS, "get_tuning() -> (near, far, hint, streaming)"},
    {"set_signal_tuning", set_signal_tuning, METH_VARARGS,
     "set_signal_tuning(spin_ns, poll_min_ns, poll_max_ns, predict=True): how the watcher polls stream signals\n"
     "(signal.c: spin, then naps of since/64 within [poll_min, poll_max]; predict the next burst;\n"
     "a pool on the node's budget spins only in the predicted windows)"},
    {"get_signal_tuning", get_signal_tuning, METH_NOARGS,
     "get_signal_tuning() -> (spin_ns, poll_min_ns, poll_max_ns, predict)"},
    {"stream_signal_support", stream_signal_support, METH_NOARGS,
     "stream_signal_support() -> dict: whether the current context's device answers stream memory operations"},
    {"count_outside", count_outside, METH_VARARGS,
     "count_outside(ids, ids64, n, lo, hi) -> how many of n ids at address ids are outside [lo, hi)"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_host_gather",
                                        "Row gathers on CPU threads, enqueued on CUDA streams.", -1,
                                        module_methods};

PyMODINIT_FUNC PyInit__host_gather(void) {
    if (PyType_Ready(&PoolType) < 0 || PyType_Ready(&StagedJobType) < 0 || PyType_Ready(&SignalTestSlotType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (!module) return NULL;
    static int atfork_done;
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, after_fork_in_child);
        atfork_done = 1;
    }
    if (PyModule_AddObjectRef(module, "GatherPool", (PyObject *)&PoolType) < 0 ||
        PyModule_AddObjectRef(module, "StagedJob", (PyObject *)&StagedJobType) < 0 ||
        PyModule_AddObjectRef(module, "SignalTestSlot", (PyObject *)&SignalTestSlotType) < 0 ||
        nb_add_to_module(module) < 0 ||
        PyModule_AddIntConstant(module, "MAX_CHUNKS", MAX_CHUNKS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
