/* GatherPool, the Python object of a gather pool: starting it (on the node's budget, pinned to its
 * CPUs, with a prefill crew where the budget asks), a synchronous gather, closing, and its counters.
 *
 * Owns: the object's reference to its pool, and the wiring of a pool to the units above it: a pool
 * is given pool_signal_ops, and pool_budget_ops where it starts on a budget.  May call: the pool
 * (pool.h), the crew, the signal set, budget_pool.c (pool_budget_ops), the budget's Python object.
 * Must never: be called without the
 * GIL, or hold it while it waits for gather threads (it releases it around every wait and join).
 */
#include "pool_type.h"
#include "budget_pool.h"
#include "budget_type.h"
#include "crew.h"
#include "signal_set.h"

int check_pool(Pool *pool) {
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

/* The workers' CPUs from a Python sequence (None: not pinned); 1 if any, 0 if none, -1 raised. */
static int nb_parse_cpus(PyObject *cpus, cpu_set_t *pin) {
    CPU_ZERO(pin);
    if (cpus == Py_None) return 0;
    PyObject *seq = PySequence_Fast(cpus, "cpus must be a sequence of CPU numbers");
    if (!seq) return -1;
    int any = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long cpu = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (cpu < 0 || cpu >= CPU_SETSIZE) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "CPU %ld is out of range", cpu);
            return -1;
        }
        CPU_SET((int)cpu, pin);
        any = 1;
    }
    Py_DECREF(seq);
    return any;
}

/* A new daemon's budget: tokens are taken from it from now on; the old one is kept (tokens held
 * on it go back to it) until the pool goes. */
static PyObject *pool_set_budget(PoolObject *self, PyObject *arg) {
    if (!self->pool || check_pool(self->pool)) return NULL;
    Pool *pool = self->pool;
    if (!PyObject_TypeCheck(arg, &NodeBudgetType) || !((NodeBudgetObject *)arg)->b) {
        PyErr_SetString(PyExc_TypeError, "set_budget needs an open NodeBudget");
        return NULL;
    }
    if (!pool->budget || pool->nretired == 16) Py_RETURN_FALSE;  /* a pool alone stays alone; rebinds are rare */
    NodeBudget *b = ((NodeBudgetObject *)arg)->b;
    atomic_fetch_add(&b->refs, 1);
    pool->retired[pool->nretired++] = atomic_exchange(&pool->budget, b);
    Py_BEGIN_ALLOW_THREADS
    crew_start(pool);  /* a new daemon that asks for a prefill crew; one that does not leaves it idle */
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

/* (threads at SCHED_IDLE serving prefill-size jobs, errno of the refusal that kept them from starting or 0) */
static PyObject *pool_get_prefill_crew(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    return Py_BuildValue("(ii)", pool ? atomic_load(&pool->ncrew) : 0, pool ? pool->crew_error : 0);
}

/* (SCHED_FIFO priority the workers run at, 0: SCHED_OTHER; errno of the refusal that kept them from it, or 0) */
static PyObject *pool_get_decode_priority(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    return Py_BuildValue("(ii)", pool ? atomic_load(&pool->decode_rt) : 0, pool ? pool->decode_rt_error : 0);
}

static PyObject *pool_get_prefill_spares(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    PyObject *cpus = PyList_New(0);
    for (int c = 0; cpus && pool && pool->crew_split && c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &pool->decode_pin)) {
            PyObject *n = PyLong_FromLong(c);
            if (!n || PyList_Append(cpus, n) < 0) Py_CLEAR(cpus);
            Py_XDECREF(n);
        }
    return cpus ? Py_BuildValue("(iN)", pool ? pool->crew_spares : 0, cpus) : NULL;
}

static PyObject *pool_get_budgeted(PoolObject *self, void *unused) {
    return PyBool_FromLong(self->pool && self->pool->budget);
}

/* GatherPool's budget and cpus arguments: the budget (or NULL) and the CPUs to pin to; as nb_parse_cpus. */
static int nb_pool_options(PyObject *budget, PyObject *cpus, NodeBudget **out, cpu_set_t *pin) {
    if (budget != Py_None && (!PyObject_TypeCheck(budget, &NodeBudgetType) || !((NodeBudgetObject *)budget)->b)) {
        PyErr_SetString(PyExc_TypeError, "budget must be an open NodeBudget or None");
        return -1;
    }
    *out = budget == Py_None ? NULL : ((NodeBudgetObject *)budget)->b;
    return nb_parse_cpus(cpus, pin);
}

static int pool_init(PoolObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"threads", "caller_gathers", "budget", "cpus", "decode_priority", NULL};
    int threads, caller_gathers = 1, decode_priority = 0;
    PyObject *budget = Py_None, *cpus = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|pOOi", names, &threads, &caller_gathers, &budget, &cpus,
                                     &decode_priority))
        return -1;
    if (threads < 1 || threads > 1024) {
        PyErr_Format(PyExc_ValueError, "gather_threads must be between 1 and 1024, got %d", threads);
        return -1;
    }
    if (decode_priority < 0 || decode_priority > sched_get_priority_max(SCHED_FIFO)) {
        PyErr_Format(PyExc_ValueError, "decode_priority must be 0 (SCHED_OTHER) or a SCHED_FIFO priority of 1 to %d, "
                     "got %d", sched_get_priority_max(SCHED_FIFO), decode_priority);
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
    pthread_condattr_t monotonic;  /* timed waits on the lists (a spare's, budget_pool.c) ignore wall-clock steps */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    for (int l = 0; l < 2; l++) pthread_cond_init(&pool->lists[l].wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
    pool->threads_asked = threads, pool->pinned = pinned, pool->pin = pin, pool->decode_rt_asked = decode_priority;
    pool->generation = atomic_load(&fork_generation);
    pool->pid = getpid();
    atomic_store(&pool->refs, 1);
    pool->signal_ops = &pool_signal_ops;  /* how the pool reaches stream signals registered on it */
    if ((pool->budget = nb)) {
        atomic_fetch_add(&nb->refs, 1);
        pool->budget_ops = &pool_budget_ops;  /* the budget's worker loop and waiter replace the pool's */
    }
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

static PyObject *pool_prewake_now(PoolObject *self, PyObject *unused) {  /* tests only */
    if (self->pool && pool_usable(self->pool)) pool_prewake(self->pool);
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

static PyObject *pool_get_wake_counts(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    return Py_BuildValue("(LLL)", pool ? (long long)atomic_load(&pool->wakes_in_part) : 0LL,
                         pool ? (long long)atomic_load(&pool->left_asleep) : 0LL,
                         pool ? (long long)atomic_load(&pool->prewakes_skipped) : 0LL);
}

static PyObject *pool_get_spare_counts(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    return Py_BuildValue("(LL)", pool ? (long long)atomic_load(&pool->spare_blocks) : 0LL,
                         pool ? (long long)atomic_load(&pool->spare_asides) : 0LL);
}

static PyObject *pool_get_cache_counts(PoolObject *self, void *unused) {
    Pool *pool = self->pool;
    return Py_BuildValue("(LLL)", pool ? (long long)atomic_load(&pool->counts.cache_hits) : 0LL,
                         pool ? (long long)atomic_load(&pool->counts.cache_misses) : 0LL,
                         pool ? (long long)atomic_load(&pool->counts.rows_fetched) : 0LL);
}

static PyMethodDef pool_methods[] = {
    {"gather", (PyCFunction)pool_gather, METH_VARARGS,
     "gather(table, row_lo, row_hi, row_bytes, ids, ids64, n, out, counter) -> ids out of range.\n"
     "Addresses are ints; counter is the address of an int64 to add the bad count to, or 0."},
    {"close", (PyCFunction)pool_close, METH_NOARGS, "Stop and join the workers (idempotent)."},
    {"prewake", (PyCFunction)pool_prewake_now, METH_NOARGS,
     "Tests only: what an eager enqueue does before its host function runs (wake the workers to poll)."},
    {"set_budget", (PyCFunction)pool_set_budget, METH_O,
     "set_budget(budget) -> whether the pool now draws on it (a pool started on a budget only)."},
    {NULL}};

static PyGetSetDef pool_getset[] = {
    {"threads", (getter)pool_get_threads, NULL, "threads that gather, the caller's included", NULL},
    {"closed", (getter)pool_get_closed, NULL, "whether the workers are gone (closed, or a forked child)", NULL},
    {"jobs_run", (getter)pool_get_jobs_run, NULL, "jobs finished so far", NULL},
    {"wake_counts", (getter)pool_get_wake_counts, NULL,
     "(listings, left asleep, pre-wakes): decode-size jobs listed that woke only some sleeping workers, the workers "
     "they left asleep, and pre-wakes that woke nobody (on a budget others want tokens of)", NULL},
    {"spare_counts", (getter)pool_get_spare_counts, NULL,
     "(blocks, stood aside): blocks the prefill crew's spares gathered, and the times one woke for prefill work "
     "(or left a job) to find a rank of its group decoding, and slept instead (--decode-spares quiet)", NULL},
    {"cache_counts", (getter)pool_get_cache_counts, NULL,
     "(hits, misses, fetched): ids the HBM cache served and missed; rows read from the table", NULL},
    {"caller_gathers", (getter)pool_get_caller_gathers, NULL,
     "whether the calling thread is one of the gatherers (else: stream-signalled jobs)", NULL},
    {"budgeted", (getter)pool_get_budgeted, NULL, "whether it gathers on the node's budget", NULL},
    {"prefill_crew", (getter)pool_get_prefill_crew, NULL,
     "(threads, errno): the crew that gathers prefill-size jobs (at SCHED_IDLE, or off the decode CPUs), and why it did not start (0: it did or was not asked)", NULL},
    {"decode_priority", (getter)pool_get_decode_priority, NULL,
     "(priority, errno): the SCHED_FIFO priority the workers gather decode-size jobs at while a crew takes the prefill-size ones (0: SCHED_OTHER), and why they could not (0: they did or were not asked)", NULL},
    {"prefill_spares", (getter)pool_get_prefill_spares, NULL,
     "(threads, CPUs): the crew's spares at SCHED_IDLE on the decode CPUs, and the decode CPUs it keeps off (empty: none)", NULL},
    {NULL}};

PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engram_client.lookup.host._host_gather.GatherPool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GatherPool(threads, caller_gathers=True, budget=None, cpus=None, decode_priority=0): persistent\n"
              "gather threads (with caller_gathers, the caller counts as one of them; jobs started by stream\n"
              "signals want caller_gathers=False), on a node budget and pinned to cpus where given, the workers at\n"
              "SCHED_FIFO decode_priority while a prefill crew runs (0: never)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};
