/* NodeBudget, the Python object of this process's slot in the node's gather budget: opening it as
 * the daemon announced it, and what tests and the client read of it (stats, the group, the grant log).
 *
 * Owns: the object's reference to its budget.  May call: budget.c, budget_open.c.  Must never: be
 * called without the GIL, or believe the header over what the daemon announced (only the decode
 * tokens are read from it, where no announcement came).
 */
#include "budget_type.h"
#include "budget_open.h"

static int budget_init(NodeBudgetObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"fd", "group", "tokens", "slots", "small_rows", "decode", NULL};
    int fd, group, tokens, slots, small_rows = 0, decode = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiii|ii", names, &fd, &group, &tokens, &slots, &small_rows,
                                     &decode))
        return -1;
    if (self->b) return 0;
    self->b = nb_open(fd, group, tokens, slots, small_rows);
    if (!self->b) return -1;
    /* The decode tokens as the daemon announced them (the header is memory every rank may write, so
     * it is read only where no announcement came), once: at least one token stays for prefill. */
    uint32_t kept = decode >= 0 ? (uint32_t)decode : ((const NbHeader *)self->b->map)->decode[group];
    self->b->decode = kept < (uint32_t)tokens ? (int)kept : tokens - 1;
    return 0;
}

static void budget_dealloc(NodeBudgetObject *self) {
    if (self->b) nb_unref(self->b);
    self->b = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NB_ITEM(dict, key, value) do { PyObject *v_ = (value); \
        if (!v_ || PyDict_SetItemString(dict, key, v_) < 0) { Py_XDECREF(v_); Py_DECREF(dict); return NULL; } \
        Py_DECREF(v_); } while (0)

static PyObject *budget_stats(NodeBudgetObject *self, PyObject *unused) {
    NodeBudget *b = self->b;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    NbSlot *s = b->s;
    NB_ITEM(d, "slot", PyLong_FromLong(b->slot));
    NB_ITEM(d, "group", PyLong_FromLong(b->group));
    NB_ITEM(d, "tokens", PyLong_FromLong(b->tokens));
    NB_ITEM(d, "decode_tokens", PyLong_FromLong(b->decode));
    NB_ITEM(d, "held", PyLong_FromLong(atomic_load(&s->held)));
    NB_ITEM(d, "rows", PyLong_FromUnsignedLongLong(atomic_load(&s->rows)));
    NB_ITEM(d, "wait_s", PyFloat_FromDouble((double)atomic_load(&s->wait_ns) * 1e-9));
    NB_ITEM(d, "acquired", PyLong_FromUnsignedLongLong(atomic_load(&s->acquired)));
    NB_ITEM(d, "yields", PyLong_FromUnsignedLongLong(atomic_load(&s->yields)));
    NB_ITEM(d, "overdraft", PyLong_FromUnsignedLongLong(atomic_load(&s->overdraft)));
    NB_ITEM(d, "stand_ins", PyLong_FromUnsignedLongLong(atomic_load(&s->stand_ins)));
    NB_ITEM(d, "lock_takeovers", PyLong_FromUnsignedLongLong(atomic_load(&b->glock_breaks)));
    NB_ITEM(d, "small_waits", PyLong_FromUnsignedLongLong(atomic_load(&s->small_waits)));
    NB_ITEM(d, "small_wait_blocks_max", PyLong_FromUnsignedLongLong(atomic_load(&s->small_wait_blocks_max)));
    return d;
}

/* The group as every rank sees it, and how many of its token bytes the kernel says are locked. */
static PyObject *budget_group_state(NodeBudgetObject *self, PyObject *unused) {
    NodeBudget *b = self->b;
    NbGroup *g = b->g;
    int locked = 0;
    for (int t = 0; t < b->tokens; t++)  /* our own locks do not conflict with our descriptor: counted apart */
        locked += (atomic_load(&b->mine[t / 64]) >> (t % 64) & 1) ||
                  (b->fd >= 0 && nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, NB_TOKEN_LOCK(b->group, t)) != F_UNLCK);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    NB_ITEM(d, "held", PyLong_FromLong(nb_held_total(b)));
    NB_ITEM(d, "locked", PyLong_FromLong(locked));
    NB_ITEM(d, "want_mask", PyLong_FromUnsignedLongLong(atomic_load(&g->want_mask)));
    NB_ITEM(d, "small_mask", PyLong_FromUnsignedLongLong(atomic_load(&g->small_mask)));
    NB_ITEM(d, "holding_mask", PyLong_FromUnsignedLongLong(atomic_load(&g->holding_mask)));
    NB_ITEM(d, "gathering", PyLong_FromLong(atomic_load(&g->gathering)));
    NB_ITEM(d, "peak", PyLong_FromLong(atomic_load(&g->peak)));
    NB_ITEM(d, "grants", PyLong_FromUnsignedLongLong(atomic_load(&g->grants)));
    NB_ITEM(d, "big_blocks", PyLong_FromUnsignedLongLong(atomic_load(&g->big_blocks)));
    NB_ITEM(d, "sweeps", PyLong_FromUnsignedLongLong(atomic_load(&g->sweeps)));
    NB_ITEM(d, "breaks", PyLong_FromUnsignedLongLong(atomic_load(&g->breaks)));
    NB_ITEM(d, "decode_at", PyLong_FromLongLong(atomic_load(&g->decode_at)));
    NB_ITEM(d, "decoding", PyBool_FromLong(nb_decode_window_end(b, now_ns()) != 0));
    return d;
}

/* The grant log, oldest first: (seq, slot, token or -1, small, how, held_after, want_mask, small_mask). */
static PyObject *budget_grant_log(NodeBudgetObject *self, PyObject *unused) {
    NodeBudget *b = self->b;
    uint64_t last = atomic_load(&b->g->grants), first = last > NB_LOG ? last - NB_LOG + 1 : 1;
    PyObject *out = PyList_New(0);
    for (uint64_t seq = first; out && seq <= last; seq++) {
        NbGrant e = b->g->log[seq % NB_LOG];
        if (__atomic_load_n(&b->g->log[seq % NB_LOG].seq, __ATOMIC_ACQUIRE) != seq || e.seq != seq) continue;
        PyObject *item = Py_BuildValue("(KiiiiiKK)", (unsigned long long)seq, (int)e.slot,
                                       e.token == 0xFFFF ? -1 : (int)e.token, (int)e.small, (int)e.how,
                                       (int)e.held_after, (unsigned long long)e.want_mask,
                                       (unsigned long long)e.small_mask);
        if (!item || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

/* What the budget's system calls cost here, in ns per call (medians are for the caller to take). */
static PyObject *budget_syscall_costs(NodeBudgetObject *self, PyObject *arg) {
    NodeBudget *b = self->b;
    long n = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (n < 1 || b->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "syscall_costs(n) needs n >= 1 and an open budget");
        return NULL;
    }
    const off_t scratch = (off_t)3 << 30;
    int64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        nb_ofd(b->fd, F_OFD_SETLK, F_WRLCK, scratch);
        nb_ofd(b->fd, F_OFD_SETLK, F_UNLCK, scratch);
    }
    int64_t t1 = now_ns();
    for (long i = 0; i < n; i++) nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, scratch);
    int64_t t2 = now_ns();
    _Atomic uint32_t word = 0;
    for (long i = 0; i < n; i++) nb_futex(&word, FUTEX_WAKE, 1, 0);
    int64_t t3 = now_ns();
    for (long i = 0; i < n; i++) nb_gunlock(b, nb_glock(b));
    int64_t t4 = now_ns();
    return Py_BuildValue("{s:d,s:d,s:d,s:d}", "lock_and_unlock_ns", (double)(t1 - t0) / n,
                         "test_lock_ns", (double)(t2 - t1) / n, "futex_wake_ns", (double)(t3 - t2) / n,
                         "decision_lock_ns", (double)(t4 - t3) / n);
}

static PyObject *budget_get_slot(NodeBudgetObject *self, void *unused) { return PyLong_FromLong(self->b ? self->b->slot : -1); }
static PyObject *budget_get_group(NodeBudgetObject *self, void *unused) { return PyLong_FromLong(self->b ? self->b->group : -1); }
static PyObject *budget_get_tokens(NodeBudgetObject *self, void *unused) { return PyLong_FromLong(self->b ? self->b->tokens : 0); }
static PyObject *budget_get_small_rows(NodeBudgetObject *self, void *unused) {
    return PyLong_FromLong(self->b ? self->b->small_rows : 0);
}

static PyObject *budget_get_decode_tokens(NodeBudgetObject *self, void *unused) {
    return PyLong_FromLong(self->b ? self->b->decode : 0);
}

static PyObject *budget_get_quantum_ns(NodeBudgetObject *self, void *unused) {
    return PyLong_FromLongLong(self->b ? (long long)nb_quantum_ns(self->b) : 0LL);
}

static PyObject *budget_get_prefill_idle(NodeBudgetObject *self, void *unused) {
    return PyBool_FromLong(self->b && (self->b->flags & NB_FLAG_PREFILL_IDLE));
}

static PyObject *budget_get_spares_quiet(NodeBudgetObject *self, void *unused) {
    return PyBool_FromLong(self->b && (self->b->flags & NB_FLAG_SPARES_QUIET));
}

static PyObject *budget_require(NodeBudgetObject *self, PyCFunction fn, PyObject *arg) {
    if (!self->b) {
        PyErr_SetString(err_class(), "this NodeBudget was never opened");
        return NULL;
    }
    return fn((PyObject *)self, arg);
}
#define NB_METHOD(name) static PyObject *name##_checked(NodeBudgetObject *self, PyObject *arg) { \
        return budget_require(self, (PyCFunction)name, arg); }
NB_METHOD(budget_stats)
NB_METHOD(budget_group_state)
NB_METHOD(budget_grant_log)
NB_METHOD(budget_syscall_costs)

static PyMethodDef budget_methods[] = {
    {"stats", (PyCFunction)budget_stats_checked, METH_NOARGS, "This process's slot: held, rows, waits, yields, overdraft, stand-ins, decision locks taken over."},
    {"group_state", (PyCFunction)budget_group_state_checked, METH_NOARGS,
     "The group: tokens held (hints) and locked (the kernel), masks, gathering and its peak, grants."},
    {"grant_log", (PyCFunction)budget_grant_log_checked, METH_NOARGS,
     "The last grants, oldest first: (seq, slot, token, small, how, held_after, want_mask, small_mask)."},
    {"syscall_costs", (PyCFunction)budget_syscall_costs_checked, METH_O,
     "syscall_costs(n) -> ns per lock+unlock, test, futex wake, decision lock (n of each)."},
    {NULL}};

static PyGetSetDef budget_getset[] = {
    {"slot", (getter)budget_get_slot, NULL, "this process's slot in the budget", NULL},
    {"group", (getter)budget_get_group, NULL, "the group (NUMA node's CPUs) it draws on", NULL},
    {"tokens", (getter)budget_get_tokens, NULL, "tokens of that group", NULL},
    {"small_rows", (getter)budget_get_small_rows, NULL, "jobs of at most this many rows go first", NULL},
    {"decode_tokens", (getter)budget_get_decode_tokens, NULL,
     "of the group's tokens, those a prefill-size job never takes (the daemon's --decode-cpus)", NULL},
    {"quantum_ns", (getter)budget_get_quantum_ns, NULL,
     "how often the group rotates one token among waiting slots (ns): each token about once per 20 ms", NULL},
    {"prefill_idle", (getter)budget_get_prefill_idle, NULL,
     "whether the daemon asks for prefill-size jobs to be gathered at SCHED_IDLE (--prefill-gathers idle)", NULL},
    {"spares_quiet", (getter)budget_get_spares_quiet, NULL,
     "whether the crew's spares stand aside while a rank of the group decodes (--decode-spares quiet)", NULL},
    {NULL}};

PyTypeObject NodeBudgetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engram_client.lookup.host._host_gather.NodeBudget",
    .tp_basicsize = sizeof(NodeBudgetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NodeBudget(fd, group, tokens, slots, small_rows=0): this process's slot in the node's gather budget, "
              "as the daemon announced it (small_rows 0: the header's)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)budget_init,
    .tp_dealloc = (destructor)budget_dealloc,
    .tp_methods = budget_methods,
    .tp_getset = budget_getset,
};

int nb_add_to_module(PyObject *module) {
    return PyType_Ready(&NodeBudgetType) < 0 || PyModule_AddObjectRef(module, "NodeBudget", (PyObject *)&NodeBudgetType) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_VERSION", NB_VERSION) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_FILE_BYTES", NB_FILE_BYTES) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_MAX_SLOTS", NB_MAX_SLOTS) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_MAX_GROUPS", NB_MAX_GROUPS) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_MAX_TOKENS", NB_MAX_TOKENS) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_FLAG_PREFILL_IDLE", NB_FLAG_PREFILL_IDLE) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_FLAG_NO_SPARES", NB_FLAG_NO_SPARES) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_FLAG_SPARES_QUIET", NB_FLAG_SPARES_QUIET) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_GROUP_DECODE_AT", offsetof(NbGroup, decode_at)) < 0 ||
           PyModule_AddIntConstant(module, "BUDGET_DECODE_QUIET_NS", NB_DECODE_QUIET_NS) < 0 ? -1 : 0;
}
