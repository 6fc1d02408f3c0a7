/* Loading libcuda.so.1 and naming its errors.
 *
 * Owns: the table of driver entry points (cu) and the lock that fills it once.  May call: nothing of
 * the engine but common.h.  Must never: link against CUDA (the module builds and runs without it),
 * or be called without the GIL (its failures raise Python errors).
 */
#include "cuda.h"

CudaApi cu;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;

int load_cuda(void) {
    if (cu.loaded) return 0;
    pthread_mutex_lock(&cu_lock);
    if (!cu.loaded) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            pthread_mutex_unlock(&cu_lock);
            PyErr_Format(err_class(), "cannot open libcuda.so.1 for the host-gather path: %s", dlerror());
            return -1;
        }
#define SYM(field, name) if (!(*(void **)&cu.field = dlsym(lib, name))) { \
            pthread_mutex_unlock(&cu_lock); \
            PyErr_Format(err_class(), "libcuda.so.1 has no %s (driver too old for the host-gather path)", name); \
            return -1; }
        SYM(launch_host_func, "cuLaunchHostFunc")
        SYM(memcpy_dtoh, "cuMemcpyDtoHAsync_v2")
        SYM(memcpy_htod, "cuMemcpyHtoDAsync_v2")
        SYM(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode")
        SYM(mem_host_alloc, "cuMemHostAlloc")
        SYM(mem_free_host, "cuMemFreeHost")
        SYM(get_error_name, "cuGetErrorName")
        SYM(ctx_get_current, "cuCtxGetCurrent")
        SYM(ctx_set_current, "cuCtxSetCurrent")
        SYM(stream_get_ctx, "cuStreamGetCtx")
        SYM(stream_is_capturing, "cuStreamIsCapturing")
        SYM(stream_wait_event, "cuStreamWaitEvent")
        SYM(event_create, "cuEventCreate")
        SYM(event_destroy, "cuEventDestroy_v2")
        SYM(event_record, "cuEventRecord")
        SYM(event_query, "cuEventQuery")
        SYM(mem_host_get_device_pointer, "cuMemHostGetDevicePointer_v2")
        SYM(ctx_get_device, "cuCtxGetDevice")
        SYM(device_get_attribute, "cuDeviceGetAttribute")
        SYM(driver_get_version, "cuDriverGetVersion")
        SYM(stream_synchronize, "cuStreamSynchronize")
        SYM(stream_create, "cuStreamCreate")
        SYM(stream_destroy, "cuStreamDestroy_v2")
#undef SYM
        /* The _v2 memory operations need no module parameter (CUDA 11.7+); the unsuffixed ones are
         * the legacy API, enabled only with NVreg_EnableStreamMemOPs=1, so they are not a fallback. */
        *(void **)&cu.stream_write_value32 = dlsym(lib, "cuStreamWriteValue32_v2");
        *(void **)&cu.stream_wait_value32 = dlsym(lib, "cuStreamWaitValue32_v2");
        cu.loaded = 1;
    }
    pthread_mutex_unlock(&cu_lock);
    return 0;
}

int cu_failed(CUresult rc, const char *what) {
    if (rc == 0) return 0;
    const char *name = "unknown error";
    if (cu.get_error_name) cu.get_error_name(rc, &name);
    PyErr_Format(err_class(), "%s failed: %s (%d)", what, name, rc);
    return -1;
}

