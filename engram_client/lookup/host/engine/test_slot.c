/* SignalTestSlot: a signalled slot in plain memory, whose stream the caller plays.
 *
 * The machines that run the test suite have no GPU, yet the protocol between the workers and a
 * stream (signal.c) and the pool's life with signals registered (close, fork, exit) are
 * CPU code.  This type is a StagedJob without CUDA: prepare() does what enqueue() does before it
 * touches the stream, and the test, acting as the stream, writes ARMED into the word (or calls
 * start_now(), as an eager call with host ids does), waits for the word to reach each chunk and
 * reads the chunk's rows from staging.  Nothing but the buffers differs from a StagedJob's path.
 *
 * Owns: nothing beyond its slot.  May call: what a StagedJob calls (staged_type.h, staged.h, the signal
 * set, signal.c's signal_start_now).  Must never: touch CUDA (the machines that run it have none), or be called without the GIL.
 */
#include "test_slot.h"
#include "pool_type.h"
#include "signal_set.h"
#include "staged_type.h"

typedef struct {
    PyObject_HEAD
    StagedState *state;
} SignalTestSlotObject;

static void *zeroed_lines(size_t nbytes) {
    void *ptr = NULL;
    if (posix_memalign(&ptr, 64, nbytes ? nbytes : 1)) return NULL;
    memset(ptr, 0, nbytes);
    return ptr;
}

static int test_slot_init(SignalTestSlotObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"pool", "capacity", "row_bytes", "graph", NULL};
    PoolObject *pool;
    long long capacity, row_bytes;
    int graph = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!LL|p", names, &PoolType, &pool, &capacity, &row_bytes, &graph))
        return -1;
    if (capacity < 1 || row_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "a slot needs a positive capacity and row size, got %lld rows of %lld B",
                     capacity, row_bytes);
        return -1;
    }
    if (self->state || !pool->pool || check_pool(pool->pool)) return -1;
    StagedState *state = calloc(1, sizeof(StagedState));
    if (!state) {
        PyErr_NoMemory();
        return -1;
    }
    state->simulated = 1, state->signalled = 1, state->graph = graph;
    state->capacity = capacity, state->row_bytes = row_bytes;
    state->ids_buf = zeroed_lines(ids_bytes(capacity) + 64);
    state->staging = zeroed_lines((size_t)(capacity * row_bytes));
    if (!state->ids_buf || !state->staging) {
        staged_free(state);
        PyErr_NoMemory();
        return -1;
    }
    return staged_adopt((StagedJobObject *)self, pool->pool, state);
}

static void test_slot_dealloc(SignalTestSlotObject *self) {
    staged_dealloc((StagedJobObject *)self);  /* the same rules: a graph's or a running slot is leaked */
}

static PyObject *test_slot_prepare(SignalTestSlotObject *self, PyObject *args) {
    unsigned long long table, ids, counter;
    long long row_lo, row_hi, n, nchunks;
    int where, ids64, skip_marked = 0;  /* skip_marked: ids the HBM cache holds are SKIP_ID (lookup/cache/row_cache.py) */
    if (!PyArg_ParseTuple(args, "KLLKipLKL|p", &table, &row_lo, &row_hi, &ids, &where, &ids64, &n, &counter, &nchunks,
                          &skip_marked))
        return NULL;
    StagedState *state = self->state;
    if (!state || check_pool(state->job.pool)) return NULL;
    if (n < 1 || n > state->capacity || row_hi <= row_lo || (where != IDS_ON_HOST && where != IDS_IN_PLACE)) {
        PyErr_Format(PyExc_ValueError, "cannot stage %lld ids (capacity %lld) from rows [%lld, %lld), ids at %d",
                     n, state->capacity, row_lo, row_hi, where);
        return NULL;
    }
    if (!state->graph && atomic_load(&state->in_flight)) {
        PyErr_SetString(err_class(), "this staging slot is still in use by an earlier lookup");
        return NULL;
    }
    int64_t bad = staged_prepare(state, table, row_lo, row_hi, ids, where, ids64, n, counter, nchunks, skip_marked);
    if (bad) return PyLong_FromLongLong(bad);
    if (!state->graph) atomic_fetch_add(&state->in_flight, 1);
    staged_announce(state);  /* as an enqueue does before it touches the stream */
    return PyLong_FromLong(0);
}

static PyObject *test_slot_start_now(SignalTestSlotObject *self, PyObject *unused) {
    if (!self->state || check_pool(self->state->job.pool)) return NULL;
    signal_start_now(&self->state->signal);
    Py_RETURN_NONE;
}

/* What a worker of the last run does when it was descheduled inside signal_publish until the stream
 * passed its last wait and armed the next replay: publish from the job as it is, its run still
 * active (so no claim starts the armed replay meanwhile), then leave, ending the run.  The word it
 * left behind: ARMED where it published nothing into the replay. */
static PyObject *test_slot_publish_late(SignalTestSlotObject *self, PyObject *unused) {
    StagedState *state = self->state;
    if (!state || check_pool(state->job.pool)) return NULL;
    Signal *sig = &state->signal;
    int ended = 0;
    if (!atomic_compare_exchange_strong(&sig->active, &ended, 1)) {
        PyErr_SetString(PyExc_RuntimeError, "the last run has not ended: wait for active == 0 first");
        return NULL;
    }
    __atomic_store_n(sig->word, SIGNAL_ARMED, __ATOMIC_SEQ_CST);  /* the stream arms the next replay */
    signal_publish(&state->job);
    uint32_t left = __atomic_load_n(sig->word, __ATOMIC_SEQ_CST);
    atomic_store(&sig->active, 0);  /* the late worker leaves: whoever comes first claims the replay */
    signal_try_claim(sig);
    return PyLong_FromUnsignedLong(left);
}

/* A poller's borrow of `active` (a claim that then found the word no longer ARMED, signal_try_claim)
 * let go `hold_us` after an eager start began: the thread that plays that poller. */
typedef struct {
    Signal *sig;
    long hold_us;
} Borrow;

static void *borrow_lets_go(void *arg) {
    Borrow *borrow = arg;
    struct timespec ts = {borrow->hold_us / 1000000, (borrow->hold_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    atomic_store(&borrow->sig->active, 0);  /* what signal_try_claim does when its word CAS fails */
    return NULL;
}

static PyObject *test_slot_start_now_beside_a_borrow(SignalTestSlotObject *self, PyObject *arg) {
    long hold_us = PyLong_AsLong(arg);
    if (hold_us < 0 || hold_us > 1000000) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "hold_us: 0 .. 1,000,000");
        return NULL;
    }
    if (!self->state || check_pool(self->state->job.pool)) return NULL;
    Borrow borrow = {&self->state->signal, hold_us};
    atomic_store(&borrow.sig->active, 1);  /* the poller's borrow */
    pthread_t poller;
    if (pthread_create(&poller, NULL, borrow_lets_go, &borrow)) return PyErr_SetFromErrno(PyExc_OSError);
    signal_start_now(borrow.sig);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(poller, NULL);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *test_slot_disarm(SignalTestSlotObject *self, PyObject *unused) {
    return staged_disarm((StagedJobObject *)self, unused);
}

#define TEST_SLOT_GETTER(name, expr) \
    static PyObject *test_slot_get_##name(SignalTestSlotObject *self, void *unused) { \
        StagedState *state = self->state; \
        return PyLong_FromLongLong(state ? (long long)(expr) : 0); }
TEST_SLOT_GETTER(word_address, (uintptr_t)state->signal.word)
TEST_SLOT_GETTER(staging_address, (uintptr_t)state->staging)
TEST_SLOT_GETTER(nchunks, state->job.nchunks)
TEST_SLOT_GETTER(chunk_rows, state->job.chunk_blocks * state->job.block_rows)
TEST_SLOT_GETTER(in_flight, atomic_load(&state->in_flight))
TEST_SLOT_GETTER(active, atomic_load(&state->signal.active))
TEST_SLOT_GETTER(bad, atomic_load(&state->job.bad))
#undef TEST_SLOT_GETTER

static PyMethodDef test_slot_methods[] = {
    {"prepare", (PyCFunction)test_slot_prepare, METH_VARARGS,
     "prepare(table, row_lo, row_hi, ids, where, ids64, n, counter, chunks) -> host ids out of range.\n"
     "What enqueue() does before it touches the stream; where: 0 ids copied now, 2 read at every run."},
    {"start_now", (PyCFunction)test_slot_start_now, METH_NOARGS, "Start the prepared run at once (eager host ids)."},
    {"disarm", (PyCFunction)test_slot_disarm, METH_NOARGS, "Later runs zero their rows and never read the table."},
    {"start_now_beside_a_borrow", (PyCFunction)test_slot_start_now_beside_a_borrow, METH_O,
     "start_now() while a poller holds the slot's `active` for hold_us more microseconds (its lost claim)."},
    {"publish_late", (PyCFunction)test_slot_publish_late, METH_NOARGS,
     "Arm the next replay, then publish as a worker of the ended run descheduled until then would: the word left."},
    {NULL}};

static PyGetSetDef test_slot_getset[] = {
    {"word_address", (getter)test_slot_get_word_address, NULL, "address of the signal word (uint32)", NULL},
    {"staging_address", (getter)test_slot_get_staging_address, NULL, "address of the staged rows", NULL},
    {"nchunks", (getter)test_slot_get_nchunks, NULL, "chunks of the prepared run", NULL},
    {"chunk_rows", (getter)test_slot_get_chunk_rows, NULL, "rows per chunk (the last may be shorter)", NULL},
    {"in_flight", (getter)test_slot_get_in_flight, NULL, "eager runs prepared and not ended", NULL},
    {"active", (getter)test_slot_get_active, NULL, "whether a run is claimed and not ended", NULL},
    {"bad", (getter)test_slot_get_bad, NULL, "ids out of range in the last run", NULL},
    {NULL}};

PyTypeObject SignalTestSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engram_client.lookup.host._host_gather.SignalTestSlot",
    .tp_basicsize = sizeof(SignalTestSlotObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SignalTestSlot(pool, capacity, row_bytes, graph=False): a signalled slot whose stream the caller plays",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)test_slot_init,
    .tp_dealloc = (destructor)test_slot_dealloc,
    .tp_methods = test_slot_methods,
    .tp_getset = test_slot_getset,
};
