/* StagedJob: one reusable lookup slot of the host-gather path (included by _host_gather.c).
 *
 * It owns pinned ids and staging buffers of `capacity` rows and two CUDA events, and enqueues a
 * gather job on a CUDA stream (see the diagram at the top of _host_gather.c): `fork` orders the
 * job after the caller's stream, `done` (recorded by finish(), after the dequant kernel) is what
 * the caller's stream waits on (join) and what strict mode polls (query).  Doing these in C keeps
 * torch's event objects off the per-call path.
 *
 * Two ways to hand the job between the stream and the workers, chosen per slot (signalled=):
 * stream memory operations on the slot's word (_stream_signal.h; the default where the driver
 * has them), or host functions (host_step below; the fallback).  Either way the workers receive
 * pointers into the slot, so the slot must outlive every enqueued run: while a run is in flight,
 * or once a graph captured it, dropping the object leaks the slot instead of freeing it.
 * disarm() (the client's close) makes any later run of a captured graph zero its rows and never
 * read the table again.
 */

typedef struct StagedState StagedState;
typedef struct {
    StagedState *state;
    int64_t chunk;
} Step;

struct StagedState {
    Job job;
    Step steps[MAX_CHUNKS];        /* host-function slots */
    Signal signal;                 /* signalled slots: signal.word is in ids_buf's last line */
    atomic_int in_flight;          /* eager runs enqueued and not finished */
    int graph;                     /* captured into a graph: may run again at any time */
    int signalled;
    int simulated;                 /* SignalTestSlot: plain memory, no CUDA (_signal_test_slot.h) */
    int64_t capacity, row_bytes;
    uint8_t *ids_buf, *staging;    /* pinned */
    CUdeviceptr word_dev;          /* the signal word as the device sees it */
    CUevent fork, done;
};

/* The signal word sits in its own cache line after the ids, so polling it never shares a line. */
static size_t ids_bytes(int64_t capacity) { return ((size_t)capacity * 8 + 63) / 64 * 64; }

typedef struct {
    PyObject_HEAD
    StagedState *state;
} StagedJobObject;

enum { IDS_ON_HOST = 0, IDS_ON_DEVICE = 1, IDS_IN_PLACE = 2 };

static void host_step(void *arg) {
    Step *step = arg;
    Job *job = &step->state->job;
    if (step->chunk == 0) job_start(job);
    job_wait_chunk(job, step->chunk);
    if (step->chunk == job->nchunks - 1) {
        job_finish(job);
        if (!step->state->graph) atomic_fetch_sub(&step->state->in_flight, 1);
    }
}

/* Allocate pinned memory, also while the caller's stream captures a graph (allowed in relaxed mode). */
static void *pinned_alloc(size_t nbytes) {
    void *ptr = NULL;
    /* DEVICEMAP: the device addresses the signal word in it (cuMemHostGetDevicePointer) */
    CUresult rc = cu.mem_host_alloc(&ptr, nbytes ? nbytes : 1, 0x1 | 0x2 /* PORTABLE | DEVICEMAP */);
    if (cu_failed(rc, "cuMemHostAlloc of lookup staging")) return NULL;
    return ptr;
}

static void staged_free(StagedState *state) {  /* may fail at exit once the context is gone: nothing to do */
    if (state->simulated) {
        free(state->ids_buf);
        free(state->staging);
        free(state);
        return;
    }
    if (state->ids_buf) cu.mem_free_host(state->ids_buf);
    if (state->staging) cu.mem_free_host(state->staging);
    if (state->fork) cu.event_destroy(state->fork);
    if (state->done) cu.event_destroy(state->done);
    free(state);
}

/* Buffers and events (and where the device sees the signal word), allowed while the caller's
 * stream captures a graph (in relaxed mode). */
static int staged_alloc(StagedState *state, int signalled) {
    int mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED */
    cu.exchange_capture_mode(&mode);
    int ok = (state->ids_buf = pinned_alloc(ids_bytes(state->capacity) + 64)) &&
             (state->staging = pinned_alloc((size_t)(state->capacity * state->row_bytes))) &&
             !cu_failed(cu.event_create(&state->fork, 0x2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate") &&
             !cu_failed(cu.event_create(&state->done, 0x2), "cuEventCreate") &&
             (!signalled || !cu_failed(cu.mem_host_get_device_pointer(&state->word_dev, state->ids_buf +
                                                                      ids_bytes(state->capacity), 0),
                                       "cuMemHostGetDevicePointer of the lookup's signal word"));
    cu.exchange_capture_mode(&mode);
    return ok ? 0 : -1;
}

static int staged_init(StagedJobObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"pool", "capacity", "row_bytes", "graph", "signalled", NULL};
    PoolObject *pool;
    long long capacity, row_bytes;
    int graph = 0, signalled = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!LL|pp", names, &PoolType, &pool, &capacity, &row_bytes,
                                     &graph, &signalled))
        return -1;
    if (capacity < 1 || row_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "a staged job needs a positive capacity and row size, got %lld rows of %lld B",
                     capacity, row_bytes);
        return -1;
    }
    if (self->state || !pool->pool || check_pool(pool->pool) || load_cuda()) return -1;
    if (signalled && (!cu.stream_write_value32 || !cu.stream_wait_value32)) {
        PyErr_SetString(err_class(), "libcuda.so.1 has no cuStreamWaitValue32_v2 / cuStreamWriteValue32_v2 "
                                     "(a driver older than CUDA 11.7): use host functions");
        return -1;
    }
    StagedState *state = calloc(1, sizeof(StagedState));
    if (!state) {
        PyErr_NoMemory();
        return -1;
    }
    state->capacity = capacity, state->row_bytes = row_bytes, state->graph = graph;
    if (staged_alloc(state, signalled)) {
        staged_free(state);
        return -1;
    }
    for (int c = 0; c < MAX_CHUNKS; c++) state->steps[c] = (Step){state, c};
    state->job.pool = pool->pool;
    if (signalled) {
        uint32_t *word = (uint32_t *)(state->ids_buf + ids_bytes(capacity));
        *word = SIGNAL_IDLE;
        state->signalled = 1;
        state->signal.word = word;
        state->signal.job = &state->job;
        state->signal.in_flight = graph ? NULL : &state->in_flight;
        state->job.signal = &state->signal;
        if (signal_register(pool->pool, &state->signal)) {
            staged_free(state);
            PyErr_NoMemory();
            return -1;
        }
    }
    atomic_fetch_add(&pool->pool->refs, 1);
    self->state = state;
    return 0;
}

static void staged_dealloc(StagedJobObject *self) {
    StagedState *state = self->state;
    if (state && !state->graph && atomic_load(&state->in_flight) == 0) {
        if (state->signalled) signal_unregister(&state->signal);
        pool_unref(state->job.pool);
        staged_free(state);
    }
    self->state = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#include "_staged_enqueue.h"

static PyObject *staged_finish(StagedJobObject *self, PyObject *arg) {
    unsigned long long stream = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred() || !self->state) return NULL;
    if (cu_failed(cu.event_record(self->state->done, (CUstream)(uintptr_t)stream), "cuEventRecord of a lookup's end"))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *staged_fork(StagedJobObject *self, PyObject *args) {
    unsigned long long caller, stream;
    if (!PyArg_ParseTuple(args, "KK", &caller, &stream)) return NULL;
    if (!self->state) {
        PyErr_SetString(err_class(), "this staging slot is closed");
        return NULL;
    }
    if (enqueue_fork(self->state, (CUstream)(uintptr_t)caller, (CUstream)(uintptr_t)stream)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *staged_join(StagedJobObject *self, PyObject *arg) {
    unsigned long long stream = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred() || !self->state) return NULL;
    if (cu_failed(cu.stream_wait_event((CUstream)(uintptr_t)stream, self->state->done, 0),
                  "cuStreamWaitEvent for a lookup's end"))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *staged_query(StagedJobObject *self, PyObject *unused) {
    if (!self->state) Py_RETURN_TRUE;
    CUresult rc = cu.event_query(self->state->done);
    if (rc == 600 /* CUDA_ERROR_NOT_READY */) Py_RETURN_FALSE;
    if (cu_failed(rc, "cuEventQuery of a lookup's end")) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *staged_disarm(StagedJobObject *self, PyObject *unused) {
    if (self->state) {
        self->state->job.table = NULL;
        self->state->job.bad_total = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *staged_get_capacity(StagedJobObject *self, void *unused) {
    return PyLong_FromLongLong(self->state ? self->state->capacity : 0);
}

static PyObject *staged_get_in_flight(StagedJobObject *self, void *unused) {
    return PyBool_FromLong(self->state && atomic_load(&self->state->in_flight) > 0);
}

static PyObject *staged_get_signalled(StagedJobObject *self, void *unused) {
    return PyBool_FromLong(self->state && self->state->signalled);
}

static PyObject *staged_get_bad(StagedJobObject *self, void *unused) {
    return PyLong_FromLongLong(self->state ? atomic_load(&self->state->job.bad) : 0);
}

static PyMethodDef staged_methods[] = {
    {"enqueue", (PyCFunction)staged_enqueue, METH_VARARGS,
     "enqueue(caller, stream, table, row_lo, row_hi, ids, where, ids64, n, device_staging, counter, chunks)\n"
     "-> host ids out of range (then nothing was enqueued).  Orders the job after `caller`.\n"
     "where: 0 ids on the host (copied now), 1 on the device, 2 host memory read at run time (graphs)."},
    {"disarm", (PyCFunction)staged_disarm, METH_NOARGS, "Later runs zero their rows and never read the table."},
    {"fork", (PyCFunction)staged_fork, METH_VARARGS,
     "fork(caller, stream): order stream's next work after caller's work so far (the slot's fork event)."},
    {"finish", (PyCFunction)staged_finish, METH_O, "finish(stream): record the end of the lookup on stream."},
    {"join", (PyCFunction)staged_join, METH_O, "join(stream): make stream wait for the lookup's end."},
    {"query", (PyCFunction)staged_query, METH_NOARGS, "Whether the lookup's end has been reached."},
    {NULL}};

static PyGetSetDef staged_getset[] = {
    {"capacity", (getter)staged_get_capacity, NULL, "rows this slot can stage", NULL},
    {"in_flight", (getter)staged_get_in_flight, NULL, "whether an enqueued run has not finished", NULL},
    {"bad", (getter)staged_get_bad, NULL, "ids out of range in the last finished run", NULL},
    {"signalled", (getter)staged_get_signalled, NULL, "whether stream memory operations signal this slot's runs "
     "(else host functions)", NULL},
    {NULL}};

static PyTypeObject StagedJobType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engram_client.lookup.host._host_gather.StagedJob",
    .tp_basicsize = sizeof(StagedJobObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StagedJob(pool, capacity, row_bytes, graph=False, signalled=False): pinned staging for one lookup\n"
              "at a time; signalled: handed between stream and workers by stream memory operations",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)staged_init,
    .tp_dealloc = (destructor)staged_dealloc,
    .tp_methods = staged_methods,
    .tp_getset = staged_getset,
};
