/* The CUDA driver API the host-gather path needs, opened with dlopen at first GPU use (included by
 * _host_gather.c): no link-time dependency on CUDA, and the CPU gather never loads it. */
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
#undef SYM
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

