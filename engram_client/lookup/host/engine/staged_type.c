/* StagedJob, the Python object of a staged slot (staged.h draws the slot, staged.c enqueues its runs).
 *
 * It owns a slot and two CUDA events, and enqueues a gather job on a CUDA stream: `fork` orders the
 * job after the caller's stream, `done` (recorded by finish(), after the dequant kernel) is what the
 * caller's stream waits on (join) and what strict mode polls (query).  Doing these in C keeps torch's
 * event objects off the per-call path.
 *
 * Owns: the object's reference to its slot and its pool.  May call: staged.c, the signal set
 * (register, unregister), signal.c (signal_start_now), the pool (pool.h), GatherPool (pool_type.h),
 * libcuda (cuda.h).  Must never:
 * free a slot that is in flight or held by a captured graph (it is leaked instead), or be called
 * without the GIL.
 */
#include "staged_type.h"
#include "pool_type.h"
#include "signal_set.h"

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
    state->signalled = signalled;
    return staged_adopt(self, pool->pool, state);
}

/* Give `state` (its buffers allocated) to `self` on `pool`: a signalled one gets its word, after the
 * ids, and joins the pool's signals; the pool is held until the slot goes.  -1 (state freed) if the
 * signal set cannot grow. */
int staged_adopt(StagedJobObject *self, Pool *pool, StagedState *state) {
    state->job.pool = pool;
    if (state->signalled) {
        state->signal.word = (uint32_t *)(state->ids_buf + ids_bytes(state->capacity));
        *state->signal.word = SIGNAL_IDLE;
        state->signal.job = &state->job;
        state->signal.in_flight = state->graph ? NULL : &state->in_flight;
        state->job.signal = &state->signal;
        if (signal_register(pool, &state->signal)) {
            staged_free(state);
            PyErr_NoMemory();
            return -1;
        }
    }
    atomic_fetch_add(&pool->refs, 1);
    self->state = state;
    return 0;
}

void staged_dealloc(StagedJobObject *self) {
    StagedState *state = self->state;
    if (state && !state->graph && atomic_load(&state->in_flight) == 0) {
        if (state->signalled) signal_unregister(&state->signal);
        pool_unref(state->job.pool);
        staged_free(state);
    }
    self->state = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *staged_enqueue(StagedJobObject *self, PyObject *args) {
    unsigned long long caller, stream, table, ids, device_staging, counter;
    long long row_lo, row_hi, n, nchunks;
    int where, ids64, skip_marked = 0;
    if (!PyArg_ParseTuple(args, "KKKLLKipLKKL|p", &caller, &stream, &table, &row_lo, &row_hi, &ids, &where, &ids64,
                          &n, &device_staging, &counter, &nchunks, &skip_marked))
        return NULL;
    StagedState *state = self->state;
    if (!state || check_pool(state->job.pool)) return NULL;
    if (n < 1 || n > state->capacity || row_hi <= row_lo || where < IDS_ON_HOST || where > IDS_IN_PLACE) {
        PyErr_Format(PyExc_ValueError, "cannot stage %lld ids (capacity %lld) from rows [%lld, %lld), ids at %d",
                     n, state->capacity, row_lo, row_hi, where);
        return NULL;
    }
    if (!state->graph && atomic_load(&state->in_flight)) {
        PyErr_SetString(err_class(), "this staging slot is still in use by an earlier lookup");
        return NULL;
    }
    CUstream s = (CUstream)(uintptr_t)stream, from = (CUstream)(uintptr_t)caller;
    CUcontext ctx = NULL;
    if (cu_failed(cu.ctx_get_current(&ctx), "cuCtxGetCurrent")) return NULL;
    if (ctx == NULL) {  /* a thread that never touched CUDA: use the stream's context */
        if (cu_failed(cu.stream_get_ctx(s, &ctx), "cuStreamGetCtx") ||
            cu_failed(cu.ctx_set_current(ctx), "cuCtxSetCurrent"))
            return NULL;
    }
    if (skip_marked && (where != IDS_ON_DEVICE || !ids64)) {
        PyErr_SetString(PyExc_ValueError, "ids marked by the HBM cache come from the device, as int64");
        return NULL;
    }
    int64_t bad = staged_prepare(state, table, row_lo, row_hi, ids, where, ids64, n, counter, nchunks, skip_marked);
    if (bad) return PyLong_FromLongLong(bad);
    const size_t id_bytes = ids64 ? 8 : 4;
    /* Ids already in pinned memory and staging the stream has finished copying (the slot's last
     * lookup is done): gather now, while the stream may still be busy with earlier work.  The
     * fork then only has to precede the dequant, which writes memory the caller's stream allocated. */
    const int now = state->signalled && where == IDS_ON_HOST && cu.event_query(state->done) == 0;
    if (!state->graph) atomic_fetch_add(&state->in_flight, 1);
    if (now) {
        signal_start_now(&state->signal);
        if (enqueue_chunk_copies(state, s, device_staging) || enqueue_fork(state, from, s)) return NULL;
        return PyLong_FromLong(0);
    }
    staged_announce(state);
    if (enqueue_fork(state, from, s)) return NULL;
    if (where == IDS_ON_DEVICE &&
        cu_failed(cu.memcpy_dtoh(state->ids_buf, (CUdeviceptr)ids, (size_t)n * id_bytes, s),
                  "copy of the ids to pinned memory (cuMemcpyDtoHAsync)"))
        return NULL;
    if (!state->signalled) return enqueue_host_functions(state, s, device_staging) ? NULL : PyLong_FromLong(0);
    /* The write carries a memory barrier: the ids' copy is visible before a worker sees ARMED. */
    if (cu_failed(cu.stream_write_value32(s, state->word_dev, SIGNAL_ARMED, 0x0 /* DEFAULT */),
                  "cuStreamWriteValue32 that starts the row gather") ||
        enqueue_chunk_copies(state, s, device_staging))
        return NULL;  /* in_flight stays raised: the slot is never reused or freed */
    return PyLong_FromLong(0);
}

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

PyObject *staged_disarm(StagedJobObject *self, PyObject *unused) {
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

PyTypeObject StagedJobType = {
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
