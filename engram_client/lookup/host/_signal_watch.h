/* Watching the stream signals: the idle worker that polls the words, and the thread that answers
 * a stopped pool's signals (included by _stream_signal.h, whose comment draws the protocol and
 * says how the watcher spins, naps and predicts).
 */

/* ---- watching ----------------------------------------------------------------------------------------- */

static void nap_ns(int64_t ns) {
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    nanosleep(&ts, NULL);
}

/* Called by an idle worker with pool->lock held, instead of sleeping: 1 if it watched (lock held again). */
static int signals_watch(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    int none = 0;
    if (set == NULL || !atomic_load(&set->count) || !atomic_compare_exchange_strong(&set->watcher, &none, 1))
        return 0;
    pthread_mutex_unlock(&pool->lock);
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  /* naps of tens of microseconds, not the default 50 us more */
#endif
    int64_t woken_for = 0;         /* the expected burst the pool was last woken for */
    while (!atomic_load(&pool->stop) && !atomic_load(&pool->lists[WORKERS].listed) && atomic_load(&set->count)) {
        if (set_claim_any(set)) break;
        int64_t now = now_ns(), since = now - atomic_load(&set->last_seen_ns);
        if (since < signal_tuning.spin_ns) {
            for (int i = 0; i < 32; i++) cpu_relax();
            continue;
        }
        int64_t nap = since / 64, period = atomic_load(&set->period_ns), burst = atomic_load(&set->burst_ns);
        if (signal_tuning.predict && period && now - burst < 4 * period) {
            int64_t lead = period / 32 < 30000 ? 30000 : period / 32 > 300000 ? 300000 : period / 32;
            int64_t expect = burst + period;
            while (expect + lead < now) expect += period;
            if (now >= expect - lead) {  /* inside the window: everyone polls, awake */
                if (woken_for != expect) {
                    atomic_store(&pool->spin_until, expect + lead);
                    pthread_mutex_lock(&pool->lock);
                    list_wake(&pool->lists[WORKERS]);
                    pthread_mutex_unlock(&pool->lock);
                    woken_for = expect;
                }
                for (int i = 0; i < 32; i++) cpu_relax();
                continue;
            }
            if (nap > expect - lead - now) nap = expect - lead - now;  /* wake up for the window */
        }
        nap_ns(nap < signal_tuning.poll_min_ns ? signal_tuning.poll_min_ns
               : nap > signal_tuning.poll_max_ns ? signal_tuning.poll_max_ns : nap);
    }
    atomic_store(&set->watcher, 0);
    pthread_mutex_lock(&pool->lock);
    return 1;
}

/* ---- a stopped pool's signals -------------------------------------------------------------------------- */

static void *janitor_main(void *unused) {
    pthread_setname_np(pthread_self(), "engram-signals");
    while (!atomic_load(&signal_gate_closed)) {
        set_claim_any(&orphans);  /* a claim gathers (or zeroes) the rows on this thread */
        nap_ns(signal_tuning.poll_max_ns);
    }
    atomic_store(&janitor_running, 0);
    return NULL;
}

/* The pool's workers are joined: finish any run they left, and hand the signals to the janitor. */
static void signals_orphan(Pool *pool) {
    SignalSet *set = atomic_load(&pool->signals);
    if (set == NULL) return;
    pthread_mutex_lock(&set->lock);
    Signal *sig;
    while ((sig = atomic_load(&set->head))) {
        set_remove_locked(set, sig);
        if (atomic_load(&sig->active)) signal_run_here(sig->job);  /* claimed, but no worker finished it */
        set_add(&orphans, sig);
    }
    pthread_mutex_unlock(&set->lock);
    int idle = 0;
    if (atomic_load(&orphans.count) && atomic_compare_exchange_strong(&janitor_running, &idle, 1)) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, janitor_main, NULL) != 0) atomic_store(&janitor_running, 0);
        pthread_attr_destroy(&attr);
    }
}

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
