/* A staged slot: one reusable lookup slot of the host-gather path, and what it enqueues on a stream.
 *
 * It owns pinned ids and staging buffers of `capacity` rows and two CUDA events, and enqueues a
 * gather job on a CUDA stream (see the diagram in staged.c): `fork` orders the
 * job after the caller's stream, `done` (recorded by finish(), after the dequant kernel) is what
 * the caller's stream waits on (join) and what strict mode polls (query).  Doing these in C keeps
 * torch's event objects off the per-call path.
 *
 * Two ways to hand the job between the stream and the workers, chosen per slot (signalled=):
 * stream memory operations on the slot's word (signal.c; the default where the driver
 * has them), or host functions (host_step, staged.c; the fallback).  Either way the workers receive
 * pointers into the slot, so the slot must outlive every enqueued run: while a run is in flight,
 * or once a graph captured it, dropping the object leaks the slot instead of freeing it.
 * disarm() (the client's close) makes any later run of a captured graph zero its rows and never
 * read the table again.
 */
#ifndef ENGRAM_ENGINE_STAGED_H
#define ENGRAM_ENGINE_STAGED_H
#include "common.h"
#include "cuda.h"
#include "gather.h"
#include "signal.h"

typedef struct StagedState StagedState;
typedef struct {
    StagedState *state;
    int64_t chunk;
} Step;

struct StagedState {
    Job job;
    Step steps[MAX_CHUNKS];        /* host-function slots */
    Signal signal;                 /* signalled slots: signal.word is in ids_buf's last line */
    atomic_int in_flight;          /* eager runs enqueued and not finished */
    int graph;                     /* captured into a graph: may run again at any time */
    int signalled;
    int simulated;                 /* SignalTestSlot: plain memory, no CUDA (test_slot.c) */
    int64_t capacity, row_bytes;
    uint8_t *ids_buf, *staging;    /* pinned */
    CUdeviceptr word_dev;          /* the signal word as the device sees it */
    CUevent fork, done;
};

/* The signal word sits in its own cache line after the ids, so polling it never shares a line. */
static inline size_t ids_bytes(int64_t capacity) { return ((size_t)capacity * 8 + 63) / 64 * 64; }

enum { IDS_ON_HOST = 0, IDS_ON_DEVICE = 1, IDS_IN_PLACE = 2 };

/* With the GIL held (a failure raises): 0, or -1 with a Python error set. */
int staged_alloc(StagedState *state, int signalled);
void staged_free(StagedState *state);
/* The job's fields for one run (host ids copied and counted on the way): the ids out of range, or 0. */
int64_t staged_prepare(StagedState *state, uint64_t table, int64_t row_lo, int64_t row_hi, uint64_t ids,
                       int where, int ids64, int64_t n, uint64_t counter, int64_t nchunks, int skip_marked);
void staged_announce(StagedState *state);
int enqueue_host_functions(StagedState *state, CUstream s, uint64_t device_staging);
int enqueue_chunk_copies(StagedState *state, CUstream s, uint64_t device_staging);
int enqueue_fork(StagedState *state, CUstream caller, CUstream s);

#endif
