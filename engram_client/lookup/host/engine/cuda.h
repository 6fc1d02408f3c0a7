/* The CUDA driver API the host-gather path needs, opened with dlopen at first GPU use: no link-time
 * dependency on CUDA, and the CPU gather never loads it.  The stream memory operations are optional:
 * a driver without them (older than CUDA 11.7) keeps the host functions (signal.c says how the two
 * signal).
 */
#ifndef ENGRAM_ENGINE_CUDA_H
#define ENGRAM_ENGINE_CUDA_H
#include "common.h"

typedef int CUresult;
typedef void *CUstream;
typedef void *CUcontext;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *);

typedef struct {
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
} CudaApi;

extern CudaApi cu;                 /* filled by load_cuda(); read only after it returned 0 */

int load_cuda(void);               /* 0, or -1 with a Python error set (the GIL held) */
int cu_failed(CUresult rc, const char *what);  /* 0 for success, else -1 with a Python error set */

#endif
