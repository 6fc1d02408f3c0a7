/* How the gather fetches and writes rows (included by _gather_block.h; the Job it reads is _gather_job.h's).
 *
 * Rows are random, so every row costs a TLB miss and a few cache misses: software prefetch keeps
 * rows in flight, and its settings, with the kind of store that writes staging, are what
 * benchmarks/host_overlap.py sweeps (docs/BENCHMARKS.md, "The host-gather path").
 */
#include "_gather_job.h"

/* Set by set_tuning(), read once per block.  Software prefetch: whole rows `near` rows ahead of the copy; with `far` > near,
 * also the first line of the row `far` ahead, which starts its page walk early (on 4 KiB pages
 * every random row misses the TLB); `hint` is the locality (0: non-temporal .. 3: every cache
 * level; 3 measured ~5% faster than 0 on the H200 machine, and unlike 0 it leaves rows in the
 * shared cache for calls that repeat them).  `streaming`: write staging with non-temporal stores (x86-64): the copy
 * engine reads it next, not this core, and plain stores would first read every staging line and
 * push table rows and page-table entries out of the last-level cache. */
static struct { int near, far, hint, streaming; } gather_tuning = {PREFETCH_ROWS, 0, 3, 0};

#if defined(__x86_64__)
#include <immintrin.h>
#define CAN_STREAM 1
/* dst, src and nbytes multiples of 8 (checked per block). */
static inline void copy_row_streaming(uint8_t *dst, const uint8_t *src, int64_t nbytes) {
    for (int64_t off = 0; off < nbytes; off += 8) {
        long long word;
        memcpy(&word, src + off, 8);
        _mm_stream_si64((long long *)(dst + off), word);
    }
}
#else
#define CAN_STREAM 0
#endif

static inline void prefetch_line(const uint8_t *p, int hint) {
    switch (hint) {  /* the hint must be a constant */
    case 0: __builtin_prefetch(p, 0, 0); break;
    case 1: __builtin_prefetch(p, 0, 1); break;
    case 2: __builtin_prefetch(p, 0, 2); break;
    default: __builtin_prefetch(p, 0, 3); break;
    }
}

static inline const uint8_t *row_address(const Job *job, int64_t i) {
    int64_t id = id_at(job, i);
    if (id < job->row_lo || id >= job->row_hi) return NULL;
    return job->table + (id - job->row_lo) * job->row_bytes;
}

static inline void prefetch_row(const Job *job, int64_t i, int hint) {
    const uint8_t *src = row_address(job, i);
    if (src == NULL) return;
    for (int64_t off = 0; off < job->row_bytes; off += 64) prefetch_line(src + off, hint);
    prefetch_line(src + job->row_bytes - 1, hint);
}

static inline void prefetch_first_line(const Job *job, int64_t i, int hint) {
    const uint8_t *src = row_address(job, i);
    if (src != NULL) prefetch_line(src, hint);
}

/* The module functions that set and read the tuning (_host_gather.c lists them). */
static PyObject *set_tuning(PyObject *module, PyObject *args) {
    int near, far, hint, streaming;
    if (!PyArg_ParseTuple(args, "iiip", &near, &far, &hint, &streaming)) return NULL;
    if (near < 0 || near > 256 || far < 0 || far > 1024 || (far && far <= near) || hint < 0 || hint > 3) {
        PyErr_Format(PyExc_ValueError, "prefetch of whole rows %d ahead, first lines %d ahead, hint %d: want "
                     "0 <= near <= 256, far 0 or in (near, 1024], hint 0 to 3", near, far, hint);
        return NULL;
    }
    gather_tuning.near = near, gather_tuning.far = far, gather_tuning.hint = hint;
    gather_tuning.streaming = streaming;
    Py_RETURN_NONE;
}

static PyObject *get_tuning(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(iiiO)", gather_tuning.near, gather_tuning.far, gather_tuning.hint,
                         gather_tuning.streaming ? Py_True : Py_False);
}
