/* The CPU n-gram hash of engram_client.hashing, in one pass over the tokens.
 *
 * hash_rows(tokens, starts, history, token_map, pad_id, multipliers, primes, offsets,
 *           max_ngram, heads_per_order, out) -> int
 *
 * tokens: int32 or int64 token ids [T]; starts: int64 [S], where each packed sequence
 * begins (starts[0] == 0, increasing; checked by the caller); history: None or int64
 * [S, max_ngram - 1], each sequence's previous tokens, oldest first, -1 where the
 * sequence had none; token_map: int32 [V]; multipliers: int64 [L, max_ngram]; primes and
 * offsets: int64 [L, (max_ngram - 1) * heads_per_order]; out: int32 or int64
 * [T, L, (max_ngram - 1) * heads_per_order], written in place.
 *
 * Returns -1 when every token id was in [0, V), else the index of the first one that was
 * not (in tokens, or T + index into history); nothing is written then.  The modulo uses a
 * precomputed reciprocal (Barrett): a hardware 64-bit division per head would cost more
 * than the whole rest of the hash.  Runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_NGRAM 32

typedef struct { Py_buffer view; int held; } Buffer;

static int get_buffer(PyObject *obj, Buffer *buf, int writable, const char *name, Py_ssize_t itemsize_a,
                      Py_ssize_t itemsize_b) {
    buf->held = 0;
    if (PyObject_GetBuffer(obj, &buf->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)))
        return -1;
    buf->held = 1;
    if (buf->view.itemsize != itemsize_a && buf->view.itemsize != itemsize_b) {
        PyErr_Format(PyExc_TypeError, "%s: item size %zd is not supported", name, buf->view.itemsize);
        return -1;
    }
    return 0;
}

static void release(Buffer *buf) {
    if (buf->held) PyBuffer_Release(&buf->view);
    buf->held = 0;
}

static inline int64_t token_at(const void *data, int wide, Py_ssize_t i) {
    return wide ? ((const int64_t *)data)[i] : (int64_t)((const int32_t *)data)[i];
}

static inline uint64_t mod_barrett(uint64_t n, uint64_t d, uint64_t m) {
    uint64_t q = (uint64_t)(((unsigned __int128)n * m) >> 64);
    uint64_t r = n - q * d;
    /* q is floor(n/d) or one less (n < 2^63), so one correction; branch-free, since which of
     * the two it is does not follow any pattern a predictor could learn. */
    return r >= d ? r - d : r;
}

static Py_ssize_t hash_all(const void *tokens, int wide, Py_ssize_t T, const int64_t *starts, Py_ssize_t S,
                           const int64_t *history, const int32_t *map, int64_t V, int64_t pad,
                           const int64_t *mult, const int64_t *primes, const int64_t *offsets, int M, int H,
                           Py_ssize_t L, void *out, int out_wide) {
    const Py_ssize_t heads = (Py_ssize_t)(M - 1) * H, row = L * heads;
    for (Py_ssize_t t = 0; t < T; t++) {
        int64_t id = token_at(tokens, wide, t);
        if (id < 0 || id >= V) return t;
    }
    if (history != NULL)
        for (Py_ssize_t i = 0; i < S * (M - 1); i++)
            if (history[i] < -1 || history[i] >= V) return T + i;
    uint64_t *magic = malloc(sizeof(uint64_t) * (size_t)(L * heads > 0 ? L * heads : 1));
    if (magic == NULL) return -2;
    for (Py_ssize_t i = 0; i < L * heads; i++) magic[i] = UINT64_MAX / (uint64_t)primes[i];
    int64_t x[MAX_NGRAM];
    for (Py_ssize_t s = 0; s < S; s++) {
        Py_ssize_t begin = (Py_ssize_t)starts[s], end = s + 1 < S ? (Py_ssize_t)starts[s + 1] : T;
        for (Py_ssize_t t = begin; t < end; t++) {
            Py_ssize_t pos = t - begin;
            for (int k = 0; k < M; k++) {
                if (pos >= k) {
                    x[k] = map[token_at(tokens, wide, t - k)];
                } else if (history != NULL) {
                    int64_t h = history[s * (M - 1) + (M - 1) + pos - k];
                    x[k] = h < 0 ? pad : map[h];
                } else {
                    x[k] = pad;
                }
            }
            for (Py_ssize_t l = 0; l < L; l++) {
                const int64_t *ml = mult + l * M;
                const int64_t *pl = primes + l * heads, *ol = offsets + l * heads;
                const uint64_t *gl = magic + l * heads;
                uint64_t mix = (uint64_t)(x[0] * ml[0]);
                Py_ssize_t base = t * row + l * heads;
                for (int k = 1; k < M; k++) {
                    mix ^= (uint64_t)(x[k] * ml[k]);
                    Py_ssize_t col = (Py_ssize_t)(k - 1) * H;
                    for (int h = 0; h < H; h++) {
                        int64_t r = (int64_t)mod_barrett(mix, (uint64_t)pl[col + h], gl[col + h]) + ol[col + h];
                        if (out_wide) ((int64_t *)out)[base + col + h] = r;
                        else ((int32_t *)out)[base + col + h] = (int32_t)r;
                    }
                }
            }
        }
    }
    free(magic);
    return -1;
}

static PyObject *hash_rows(PyObject *self, PyObject *args) {
    PyObject *o_tokens, *o_starts, *o_history, *o_map, *o_mult, *o_primes, *o_offsets, *o_out;
    long long pad;
    int M, H;
    if (!PyArg_ParseTuple(args, "OOOOLOOOiiO", &o_tokens, &o_starts, &o_history, &o_map, &pad, &o_mult, &o_primes,
                          &o_offsets, &M, &H, &o_out))
        return NULL;
    Buffer tokens, starts, history, map, mult, primes, offsets, out;
    Buffer *all[] = {&tokens, &starts, &history, &map, &mult, &primes, &offsets, &out};
    for (int i = 0; i < 8; i++) all[i]->held = 0;
    PyObject *result = NULL;
    if (M < 2 || M > MAX_NGRAM || H < 1) {
        PyErr_Format(PyExc_ValueError, "max_ngram %d or heads per order %d out of range", M, H);
        goto done;
    }
    if (get_buffer(o_tokens, &tokens, 0, "tokens", 4, 8) || get_buffer(o_starts, &starts, 0, "starts", 8, 8) ||
        get_buffer(o_map, &map, 0, "token_map", 4, 4) || get_buffer(o_mult, &mult, 0, "multipliers", 8, 8) ||
        get_buffer(o_primes, &primes, 0, "primes", 8, 8) || get_buffer(o_offsets, &offsets, 0, "offsets", 8, 8) ||
        get_buffer(o_out, &out, 1, "out", 4, 8))
        goto done;
    if (o_history != Py_None && get_buffer(o_history, &history, 0, "history", 8, 8)) goto done;
    Py_ssize_t T = tokens.view.len / tokens.view.itemsize, S = starts.view.len / 8;
    Py_ssize_t L = mult.view.len / 8 / M, heads = (Py_ssize_t)(M - 1) * H;
    if (mult.view.len != L * M * 8 || primes.view.len != L * heads * 8 || offsets.view.len != L * heads * 8 ||
        out.view.len != T * L * heads * out.view.itemsize || (T > 0 && S < 1) ||
        (history.held && history.view.len != S * (M - 1) * 8)) {
        PyErr_SetString(PyExc_ValueError, "hash_rows: buffer sizes disagree");
        goto done;
    }
    for (Py_ssize_t i = 0; i < L * heads; i++)
        if (((int64_t *)primes.view.buf)[i] < 2) {
            PyErr_SetString(PyExc_ValueError, "hash_rows: a head size is below 2");
            goto done;
        }
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = hash_all(tokens.view.buf, tokens.view.itemsize == 8, T, starts.view.buf, S,
                   history.held ? history.view.buf : NULL, map.view.buf, map.view.len / 4, pad, mult.view.buf,
                   primes.view.buf, offsets.view.buf, M, H, L, out.view.buf, out.view.itemsize == 8);
    Py_END_ALLOW_THREADS
    if (bad == -2) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < 8; i++) release(all[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"hash_rows", hash_rows, METH_VARARGS, "Hash packed token sequences into Engram row ids (see the C source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ngram_hash", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ngram_hash(void) { return PyModule_Create(&module); }
