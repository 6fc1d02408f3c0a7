/* Whether this device and driver can signal lookups with stream memory operations.
 *
 * The _v2 operations exist from CUDA 11.7 and need no module parameter; the device attributes say
 * what the driver claims (CAN_USE_STREAM_MEM_OPS_V1 and CAN_USE_STREAM_WAIT_VALUE_NOR_V1 describe
 * the legacy API, and are reported, not required).  What decides is a live round trip on a private
 * stream: the stream waits for a word the CPU writes, then writes another word the CPU reads, as a
 * lookup does.  A device that fails it keeps host functions, and host_signal.py says so once.
 *
 * Owns: the round trip's private stream and words.  May call: libcuda (cuda.h).  Must never: free
 * what a stuck stream may still write (it is left to the context), or wait without a bound (1 s).
 * It runs with the GIL held, released around the round trip.
 */
#include "signal_support.h"
#include "cuda.h"
#define ROUND_TRIP_TIMEOUT_NS 1000000000LL

static int device_attribute(int attribute, int device) {
    int value = -1;
    cu.device_get_attribute(&value, attribute, device);
    return value;
}

/* The live round trip: NULL on success, else why it failed (a static string). */
static const char *signal_round_trip(CUstream s, double *micros) {
    uint32_t *words = NULL;
    CUdeviceptr dev = 0;
    if (cu.mem_host_alloc((void **)&words, 128, 0x1 | 0x2) != 0) return "cuMemHostAlloc of two words failed";
    words[0] = 0, words[16] = 0;  /* one cache line each */
    if (cu.mem_host_get_device_pointer(&dev, words, 0) != 0) {
        cu.mem_free_host(words);
        return "cuMemHostGetDevicePointer failed";
    }
    if (cu.stream_wait_value32(s, dev, 1, 0x0) != 0 || cu.stream_write_value32(s, dev + 64, 7, 0x0) != 0) {
        cu.mem_free_host(words);
        return "cuStreamWaitValue32 / cuStreamWriteValue32 refused the call";
    }
    int64_t started = now_ns();
    __atomic_store_n(&words[0], 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&words[16], __ATOMIC_SEQ_CST) != 7) {
        if (now_ns() - started > ROUND_TRIP_TIMEOUT_NS)  /* the stream may be stuck: leak the words with it */
            return "the stream did not answer a CPU-written word within 1 s";
        cpu_relax();
    }
    *micros = (double)(now_ns() - started) / 1e3;
    cu.stream_synchronize(s);
    cu.mem_free_host(words);
    return NULL;
}

PyObject *stream_signal_support(PyObject *module, PyObject *unused) {
    if (load_cuda()) return NULL;
    CUcontext ctx = NULL;
    int device = -1, driver = 0;
    if (cu_failed(cu.ctx_get_current(&ctx), "cuCtxGetCurrent")) return NULL;
    if (ctx == NULL) {
        PyErr_SetString(err_class(), "stream_signal_support() needs the device's context current on this thread");
        return NULL;
    }
    if (cu_failed(cu.ctx_get_device(&device), "cuCtxGetDevice") ||
        cu_failed(cu.driver_get_version(&driver), "cuDriverGetVersion"))
        return NULL;
    const char *reason = NULL;
    double micros = -1;
    if (!cu.stream_write_value32 || !cu.stream_wait_value32) {
        reason = "libcuda.so.1 has no cuStreamWaitValue32_v2 / cuStreamWriteValue32_v2 (a driver older than CUDA 11.7)";
    } else {
        CUstream s = NULL;
        if (cu.stream_create(&s, 0x1 /* CU_STREAM_NON_BLOCKING */) != 0) {
            reason = "cuStreamCreate failed";
        } else {
            Py_BEGIN_ALLOW_THREADS
            reason = signal_round_trip(s, &micros);
            Py_END_ALLOW_THREADS
            if (reason == NULL) cu.stream_destroy(s);  /* one that may be stuck is left to the context */
        }
    }
    return Py_BuildValue("{s:O,s:s,s:i,s:i,s:i,s:i,s:i,s:d}", "supported", reason ? Py_False : Py_True,
                         "reason", reason ? reason : "", "device", device, "driver_version", driver,
                         "can_use_stream_mem_ops_v1", device_attribute(92, device),
                         "can_use_stream_wait_value_nor_v1", device_attribute(94, device),
                         "can_use_host_pointer_for_registered_mem", device_attribute(91, device),
                         "round_trip_us", micros);
}
