/* engram_client.lookup.host._host_gather: gather table rows on CPU threads, and enqueue that gather on a CUDA stream.
 *
 * A GatherPool is a persistent set of pthreads (one pool per client).  A gather job copies the rows
 * named by ids (int32 or int64, read raw) from the read-only mapped rows [row_lo, row_hi) into
 * staging memory; an id outside that range is never used as an address: its staged row is zeroed
 * and counted, in the job and in a caller-owned int64 counter (atomically, so Python reads it
 * without any sync).  Work is split in blocks taken from an atomic counter.  Workers sleep on a
 * condition variable when idle, after a short spin.
 *
 * A StagedJob owns pinned ids and staging buffers and enqueues, on a CUDA stream, in stream order:
 *
 *     [ids on the GPU: copy to pinned ids] -> write ARMED -> wait(chunk 0 staged) -> copy chunk 0
 *     -> wait(chunk 1 staged) -> copy chunk 1 -> ...        (stream memory operations, _stream_signal.h)
 *     [ids ...] -> host fn(start, gather chunk 0) -> copy chunk 0 -> host fn(chunk 1) -> ...  (fallback)
 *
 * so the copy of one chunk overlaps the gather of the next, and nothing holds SMs.  The same calls
 * record graph nodes when the stream is capturing, and every replay gathers the ids then in the
 * input buffer.  libcuda is opened with dlopen at the first GPU use: the module builds and runs
 * without CUDA, and the CPU gather never needs it.
 *
 * Life cycle: close() (or deallocation) stops and joins the workers; signals registered then are
 * answered by one process-wide thread.  A child process after fork() refuses to use its parent's
 * pool (the threads are not there) and says so.  A StagedJob still in flight, or held by a captured
 * graph, when it is dropped is leaked rather than freed under a running gather.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNKS 8
#define PREFETCH_ROWS 16          /* rows prefetched ahead of the copy, per thread */
#define IDLE_SPIN_NS 50000        /* a worker polls for new jobs this long after its last one, then sleeps */
#define PREWAKE_NS 150000         /* an enqueue wakes the workers to poll this long for its host function */

/* The project's exception classes (set_error_classes) and a count of forks seen by this process. */
static PyObject *error_class;      /* engram_client's EngramError, set by set_error_classes() */
static PyObject *detached_class;   /* NotAttachedError: a closed pool, a forked child */
static atomic_long fork_generation;

static void after_fork_in_child(void) { atomic_fetch_add(&fork_generation, 1); }

static PyObject *err_class(void) { return error_class ? error_class : PyExc_RuntimeError; }

#include "_gather_cuda.h"
#include "_gather_pool.h"
#include "_stream_signal.h"
#include "_node_budget.h"
#include "_prefill_crew.h"

/* ---- GatherPool ----------------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    Pool *pool;
    int caller_gathers;            /* the calling thread is one of `threads` (host functions, CPU gathers) */
} PoolObject;

static int check_pool(Pool *pool) {
    if (pool->generation != atomic_load(&fork_generation) || pool->pid != getpid()) {
        PyErr_Format(detached_class ? detached_class : PyExc_RuntimeError,
                     "this gather pool was started in process %d; a forked child must create its own client",
                     (int)pool->pid);
        return -1;
    }
    if (atomic_load(&pool->stop)) {
        PyErr_SetString(detached_class ? detached_class : PyExc_RuntimeError, "the client's gather pool is closed");
        return -1;
    }
    return 0;
}

static void pool_stop(Pool *pool) {
    if (!pool->started || atomic_exchange(&pool->stop, 1)) return;
    if (pool->generation != atomic_load(&fork_generation)) return;  /* a child: the threads are not here */
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->lists[WORKERS].wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->nthreads; i++) pthread_join(pool->threads[i], NULL);
    crew_join(pool);
    signals_orphan(pool);  /* graphs replayed after close must still be answered */
}

#include "_node_budget_py.h"

static int pool_init(PoolObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"threads", "caller_gathers", "budget", "cpus", NULL};
    int threads, caller_gathers = 1;
    PyObject *budget = Py_None, *cpus = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|pOO", names, &threads, &caller_gathers, &budget, &cpus))
        return -1;
    if (threads < 1 || threads > 1024) {
        PyErr_Format(PyExc_ValueError, "gather_threads must be between 1 and 1024, got %d", threads);
        return -1;
    }
    cpu_set_t pin;  /* the workers' CPUs (the budget's, near the GPU): a hint, so a refusal is not an error */
    NodeBudget *nb = NULL;
    int pinned = nb_pool_options(budget, cpus, &nb, &pin);
    if (pinned < 0) return -1;
    if (self->pool) return 0;
    Pool *pool = calloc(1, sizeof(Pool));
    if (!pool || !(pool->threads = calloc((size_t)threads, sizeof(pthread_t)))) {
        free(pool);
        PyErr_NoMemory();
        return -1;
    }
    pthread_mutex_init(&pool->lock, NULL);
    for (int l = 0; l < 2; l++) pthread_cond_init(&pool->lists[l].wake, NULL);
    pool->threads_asked = threads, pool->pinned = pinned, pool->pin = pin;
    pool->generation = atomic_load(&fork_generation);
    pool->pid = getpid();
    atomic_store(&pool->refs, 1);
    if ((pool->budget = nb)) atomic_fetch_add(&nb->refs, 1);
    /* Where the caller gathers too (host functions, CPU gathers), threads - 1 workers give `threads`
     * gatherers; jobs started by stream signals have no such caller, so they get `threads` workers. */
    int workers = caller_gathers ? threads - 1 : threads;
    for (int i = 0; i < workers; i++) {
        if (pthread_create(&pool->threads[i], NULL, worker_main, pool) != 0) {
            pool->nthreads = i;
            pool->started = 1;
            pool_stop(pool);
            pool_unref(pool);
            PyErr_Format(err_class(), "could not start gather thread %d of %d", i + 1, workers);
            return -1;
        }
        pthread_setname_np(pool->threads[i], "engram-gather");  /* how tests and operators count them */
        if (pinned) pthread_setaffinity_np(pool->threads[i], sizeof pin, &pin);
        pool->nthreads = i + 1;
    }
    pool->started = 1;
    crew_start(pool);  /* where the budget asks for one; a refusal is reported (prefill_crew), not raised */
    self->pool = pool;
    self->caller_gathers = caller_gathers;
    return 0;
}

static void pool_dealloc(PoolObject *self) {
    if (self->pool) {
        Py_BEGIN_ALLOW_THREADS
        pool_stop(self->pool);
        Py_END_ALLOW_THREADS
        if (self->pool->generation == atomic_load(&fork_generation)) pool_unref(self->pool);
        /* in a forked child the lock may have been held by a thread that is not here: leak it */
        self->pool = NULL;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pool_close(PoolObject *self, PyObject *unused) {
    if (self->pool) {
        Py_BEGIN_ALLOW_THREADS
        pool_stop(self->pool);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *pool_gather(PoolObject *self, PyObject *args) {
    unsigned long long table, ids, out, counter;
    long long row_lo, row_hi, row_bytes, n;
    int ids64;
    if (!PyArg_ParseTuple(args, "KLLLKpLKK", &table, &row_lo, &row_hi, &row_bytes, &ids, &ids64, &n, &out, &counter))
        return NULL;
    if (!self->pool || check_pool(self->pool)) return NULL;
    if (n < 0 || row_bytes < 1 || row_hi < row_lo) {
        PyErr_Format(PyExc_ValueError, "gather of %lld rows of %lld bytes from rows [%lld, %lld) is not valid",
                     n, row_bytes, row_lo, row_hi);
        return NULL;
    }
    Job job;
    memset(&job, 0, sizeof job);
    job.table = (const uint8_t *)(uintptr_t)table;
    job.row_lo = row_lo, job.row_hi = row_hi, job.row_bytes = row_bytes;
    job.ids = (const void *)(uintptr_t)ids, job.ids64 = ids64;
    job.staging = (uint8_t *)(uintptr_t)out;
    job.bad_total = (int64_t *)(uintptr_t)counter;
    job.pool = self->pool;
    job_plan(&job, n, 1);
    Py_BEGIN_ALLOW_THREADS
    job_start(&job);
    job_finish(&job);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(atomic_load(&job.bad));
}

static PyObject *pool_get_threads(PoolObject *self, void *unused) {
    return PyLong_FromLong(self->pool ? self->pool->nthreads + self->caller_gathers : 0);
}

static PyObject *pool_get_closed(PoolObject *self, void *unused) {
    return PyBool_FromLong(!self->pool || !pool_usable(self->pool));
}

static PyObject *pool_get_caller_gathers(PoolObject *self, void *unused) {
    return PyBool_FromLong(self->caller_gathers);
}

static PyObject *pool_get_jobs_run(PoolObject *self, void *unused) {
    return PyLong_FromLongLong(self->pool ? atomic_load(&self->pool->jobs_run) : 0);
}

static PyObject *pool_get_cache_counts(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    return Py_BuildValue("(LLL)", pool ? (long long)atomic_load(&pool->cache_hits) : 0LL,
                         pool ? (long long)atomic_load(&pool->cache_misses) : 0LL,
                         pool ? (long long)atomic_load(&pool->rows_fetched) : 0LL);
}

static PyMethodDef pool_methods[] = {
    {"gather", (PyCFunction)pool_gather, METH_VARARGS,
     "gather(table, row_lo, row_hi, row_bytes, ids, ids64, n, out, counter) -> ids out of range.\n"
     "Addresses are ints; counter is the address of an int64 to add the bad count to, or 0."},
    {"close", (PyCFunction)pool_close, METH_NOARGS, "Stop and join the workers (idempotent)."},
    NB_POOL_METHODS
    {NULL}};

static PyGetSetDef pool_getset[] = {
    {"threads", (getter)pool_get_threads, NULL, "threads that gather, the caller's included", NULL},
    {"closed", (getter)pool_get_closed, NULL, "whether the workers are gone (closed, or a forked child)", NULL},
    {"jobs_run", (getter)pool_get_jobs_run, NULL, "jobs finished so far", NULL},
    {"cache_counts", (getter)pool_get_cache_counts, NULL,
     "(hits, misses, fetched): ids the HBM cache served and missed; rows read from the table", NULL},
    {"caller_gathers", (getter)pool_get_caller_gathers, NULL,
     "whether the calling thread is one of the gatherers (else: stream-signalled jobs)", NULL},
    {"budgeted", (getter)pool_get_budgeted, NULL, "whether it gathers on the node's budget", NULL},
    NB_POOL_GETSETS
    {NULL}};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engram_client.lookup.host._host_gather.GatherPool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GatherPool(threads, caller_gathers=True): persistent gather threads (with caller_gathers, the\n"
              "caller counts as one of them; jobs started by stream signals want caller_gathers=False)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};

#include "_host_gather_staged.h"
#include "_signal_support.h"
#include "_signal_test_slot.h"

#include "_module_functions.h"

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
     "(_stream_signal.h: spin, then naps of since/64 within [poll_min, poll_max]; predict the next burst)"},
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
