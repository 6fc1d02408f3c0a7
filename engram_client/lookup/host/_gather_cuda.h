/* The CUDA driver API the host-gather path needs, opened with dlopen at first GPU use (included by
 * _host_gather.c): no link-time dependency on CUDA, and the CPU gather never loads it.  The stream
 * memory operations are optional: a driver without them (older than CUDA 11.7) keeps the host
 * functions (_stream_signal.h says how the two signal). */
typedef int CUresult;
typedef void *CUstream;
typedef void *CUcontext;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *);

static struct {
    int loaded;
    CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*exchange_capture_mode)(int *);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned int);
    CUresult (*mem_free_host)(void *);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*stream_get_ctx)(CUstream, CUcontext *);
    CUresult (*stream_is_capturing)(CUstream, int *);
    CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_destroy)(CUevent);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*mem_host_get_device_pointer)(CUdeviceptr *, void *, unsigned int);
    CUresult (*ctx_get_device)(int *);
    CUresult (*device_get_attribute)(int *, int, int);
    CUresult (*driver_get_version)(int *);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_create)(CUstream *, unsigned int);
    CUresult (*stream_destroy)(CUstream);
    /* optional (NULL where the driver lacks them) */
    CUresult (*stream_write_value32)(CUstream, CUdeviceptr, uint32_t, unsigned int);
    CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, uint32_t, unsigned int);
} cu;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;

static int load_cuda(void) {
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

static int cu_failed(CUresult rc, const char *what) {
    if (rc == 0) return 0;
    const char *name = "unknown error";
    if (cu.get_error_name) cu.get_error_name(rc, &name);
    PyErr_Format(err_class(), "%s failed: %s (%d)", what, name, rc);
    return -1;
}

