/* Launching the staged dequant kernel from C by its CUfunction handle (included by _host_gather.c).
 *
 * Triton's own launcher binds arguments per call and asks the driver about every pointer
 * (cuPointerGetAttribute): ~8.5 us of the engine thread's time per lookup on the H200 machine.
 * This launches the compiled kernel with one cuLaunchKernel instead.  It passes exactly two
 * pointers, one int32 and up to three null pointers (the scratch parameters recent Triton
 * versions append), so kernels/dequant_staged.py uses it only where cuFuncGetParamInfo shows
 * that layout and the kernel asks no scratch memory, and proves it bit for bit first.
 */

/* The sizes of the kernel's parameters, in order; None where the driver cannot say. */
static PyObject *kernel_param_sizes(PyObject *module, PyObject *arg) {
    unsigned long long function = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred() || load_cuda()) return NULL;
    if (!cu.func_get_param_info) Py_RETURN_NONE;
    PyObject *sizes = PyList_New(0);
    for (size_t i = 0; sizes && i < 16; i++) {
        size_t offset = 0, size = 0;
        if (cu.func_get_param_info((void *)(uintptr_t)function, i, &offset, &size) != 0) break;
        PyObject *value = PyLong_FromSize_t(size);
        if (!value || PyList_Append(sizes, value)) Py_CLEAR(sizes);
        Py_XDECREF(value);
    }
    return sizes;
}

static PyObject *launch_kernel(PyObject *module, PyObject *args) {
    unsigned long long function, a, b, stream;
    unsigned int grid, threads, shared;
    int n, nulls;
    if (!PyArg_ParseTuple(args, "KIIIKKiiK", &function, &grid, &threads, &shared, &a, &b, &n, &nulls, &stream))
        return NULL;
    if (nulls < 0 || nulls > 3) {
        PyErr_Format(PyExc_ValueError, "launch_kernel passes 0 to 3 null parameters, not %d", nulls);
        return NULL;
    }
    unsigned long long none = 0;
    void *params[6] = {&a, &b, &n, &none, &none, &none};
    if (cu_failed(cu.launch_kernel((void *)(uintptr_t)function, grid, 1, 1, threads, 1, 1, shared,
                                   (CUstream)(uintptr_t)stream, params, NULL),
                  "cuLaunchKernel of the staged dequant"))
        return NULL;
    Py_RETURN_NONE;
}
