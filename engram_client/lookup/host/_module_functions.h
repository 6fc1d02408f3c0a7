/* The module's plain functions (included by _host_gather.c, after the CUDA loader): the error
 * classes the C code raises, the host-side range count of ids, and whether a stream is capturing. */

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
