/* The Example encoder of convert/example.py in C: a batch of fixed-shape rows
 * serialized as tf.train.Example messages, byte for byte what the numpy path
 * there writes (and TensorFlow's protobuf with deterministic=True).
 *
 * encode(columns, rows) -> (data, lengths)
 *   columns: a sequence of (key, kind, n, values), in the map order the caller
 *     chose (convert.example._map_key_order):
 *       key    bytes, the feature's name as UTF-8;
 *       kind   0 float32: values a C-contiguous buffer of rows * n little-endian floats,
 *              1 int64:   values a C-contiguous buffer of rows * n native int64s,
 *              2 bytes:   values a list of rows bytes objects (one value per row; n ignored);
 *   data: bytearray, every Example back to back;
 *   lengths: bytearray of rows native int64s, each Example's size.
 *
 * Wire format (see convert/example.py): Example = 0x0a len Features; Features =
 * entries `0x0a len (0x0a len key 0x12 len Feature)`; Feature = `tag len body`
 * (tag 0x12 float_list, 0x1a int64_list, 0x0a bytes_list); body = `0x0a len
 * payload` (packed floats, packed varints, or one bytes value), nothing for a
 * float32 or int64 column of n == 0.
 *
 * Two passes over the batch: the sizes (every length prefix is a varint of the
 * size of what follows it), then the bytes. A float32 entry, and an int64 entry
 * without values, is the same in every row but its floats: its other bytes are
 * made once. Raises ValueError or TypeError on arguments that do not match this
 * contract; the numpy path is the definition (tests/test_convert_example_c.py
 * compares them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { K_FLOAT32 = 0, K_INT64 = 1, K_BYTES = 2 };

typedef struct {
    int kind;
    Py_ssize_t n;
    Py_buffer view; /* float32 and int64 */
    int has_view;
    PyObject *items; /* bytes: a tuple of the list's values, owned (no later change of the list reaches it) */
    int fixed_size;  /* the entry's size is the same in every row */
    /* fixed_size: the whole entry but the floats. Otherwise `0x0a varint(klen) key 0x12`,
     * the part between the entry's own prefix and the Feature's size. */
    uint8_t *fixed;
    Py_ssize_t fixed_len;
} Column;

/* Bytes of a varint by the value's count of leading zero bits. */
static const uint8_t VARINT_LEN[65] = {10, 9, 9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 7, 7, 7, 7, 7, 7, 7,
                                       6, 6, 6, 6, 6, 6, 6, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4,
                                       3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1};

static inline int varint_len(uint64_t v) { return VARINT_LEN[__builtin_clzll(v | 1)]; }

static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* memcpy for the short copies here (keys, entry heads, a few floats): fixed-size
 * moves the compiler inlines, where a call per copy would cost more than the copy. */
static inline void copy(uint8_t *d, const uint8_t *s, size_t n)
{
    if (n >= 16) {
        if (n > 32) {
            memcpy(d, s, n);
            return;
        }
        memcpy(d, s, 16);
        memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(d, s, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        memcpy(d, s, 4);
        memcpy(d + n - 4, s + n - 4, 4);
    } else if (n) {
        d[0] = s[0];
        d[n / 2] = s[n / 2];
        d[n - 1] = s[n - 1];
    }
}

/* A size with its one-byte tag and varint prefix: `tag varint(len) <len bytes>`. */
static inline uint64_t framed(uint64_t len) { return 1 + (uint64_t)varint_len(len) + len; }

static const uint8_t FEATURE_TAG[] = {0x12, 0x1a, 0x0a}; /* float_list, int64_list, bytes_list */

/* What a varying entry's body holds in row r: the int64 varints' size, or the bytes
 * value's length. The body is `0x0a varint(payload) <payload>`, framed(payload). */
static inline uint64_t payload_len(const Column *c, Py_ssize_t r)
{
    if (c->kind == K_BYTES)
        return (uint64_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(c->items, r));
    const int64_t *v = (const int64_t *)c->view.buf + r * c->n;
    uint64_t payload = 0;
    for (Py_ssize_t j = 0; j < c->n; j++)
        payload += (uint64_t)varint_len((uint64_t)v[j]);
    return payload;
}

/* The size of a varying entry's entry_body, given its payload's. */
static inline uint64_t entry_body_len(const Column *c, uint64_t payload)
{
    uint64_t feature = framed(framed(payload));
    return (uint64_t)c->fixed_len + (uint64_t)varint_len(feature) + feature;
}

static inline uint8_t *put_entry(uint8_t *p, const Column *c, Py_ssize_t r, uint64_t payload)
{
    copy(p, c->fixed, (size_t)c->fixed_len);
    p += c->fixed_len;
    if (c->fixed_size) {
        if (c->kind == K_FLOAT32 && c->n) {
            size_t len = 4 * (size_t)c->n;
            copy(p, (const uint8_t *)c->view.buf + (size_t)r * len, len);
            p += len;
        }
        return p;
    }
    /* The entry's own prefix went before the fixed part (put_column). */
    uint64_t body = framed(payload);
    p = put_varint(p, framed(body));
    *p++ = FEATURE_TAG[c->kind];
    p = put_varint(p, body);
    *p++ = 0x0a;
    p = put_varint(p, payload);
    if (c->kind == K_BYTES) {
        PyObject *b = PyTuple_GET_ITEM(c->items, r);
        copy(p, (const uint8_t *)PyBytes_AS_STRING(b), (size_t)payload);
        return p + payload;
    }
    const int64_t *v = (const int64_t *)c->view.buf + r * c->n;
    for (Py_ssize_t j = 0; j < c->n; j++)
        p = put_varint(p, (uint64_t)v[j]);
    return p;
}

/* The entry of column c in row r: `0x0a varint(entry_body)` first when it varies. */
static inline uint8_t *put_column(uint8_t *p, const Column *c, Py_ssize_t r, uint64_t payload)
{
    if (!c->fixed_size) {
        *p++ = 0x0a;
        p = put_varint(p, entry_body_len(c, payload));
    }
    return put_entry(p, c, r, payload);
}

/* Makes c->fixed for key `key` (klen bytes); -1 with an exception set. */
static int make_fixed(Column *c, const uint8_t *key, Py_ssize_t klen)
{
    /* At most: 0x0a + 10 + (0x0a + 10 + key + 0x12) + 10 + tag + 10 + 0x0a + 10. */
    if (klen > PY_SSIZE_T_MAX - 64) {
        PyErr_SetString(PyExc_ValueError, "a feature name is too long");
        return -1;
    }
    c->fixed = PyMem_Malloc((size_t)klen + 64);
    if (c->fixed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* A fixed-size entry's body: `0x0a varint(4n) <floats>`, nothing without values. */
    uint64_t body = c->n ? framed(4 * (uint64_t)c->n) : 0, feature = framed(body);
    uint8_t *p = c->fixed;
    if (c->fixed_size) { /* entry_body: `0x0a varint(klen) key 0x12`, then the Feature framed */
        *p++ = 0x0a;
        p = put_varint(p, framed((uint64_t)klen) + 1 + (uint64_t)varint_len(feature) + feature);
    }
    *p++ = 0x0a;
    p = put_varint(p, (uint64_t)klen);
    memcpy(p, key, (size_t)klen);
    p += klen;
    *p++ = 0x12;
    if (c->fixed_size) {
        p = put_varint(p, feature);
        *p++ = FEATURE_TAG[c->kind];
        p = put_varint(p, body);
        if (c->n) {
            *p++ = 0x0a;
            p = put_varint(p, 4 * (uint64_t)c->n);
        }
    }
    c->fixed_len = p - c->fixed;
    return 0;
}

/* Fills c from a (key, kind, n, values) tuple; -1 with an exception set. */
static int parse_column(PyObject *item, Py_ssize_t rows, Column *c)
{
    PyObject *key, *values;
    Py_ssize_t n;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "O!inO", &PyBytes_Type, &key, &c->kind, &n, &values)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a column is a (key, kind, n, values) tuple");
        return -1;
    }
    c->n = n;
    if (c->kind == K_BYTES) {
        if (!PyList_Check(values) || PyList_GET_SIZE(values) != rows) {
            PyErr_SetString(PyExc_ValueError, "a bytes column is a list of one bytes value per row");
            return -1;
        }
        c->items = PyList_AsTuple(values);
        if (c->items == NULL)
            return -1;
        for (Py_ssize_t r = 0; r < rows; r++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(c->items, r))) {
                PyErr_SetString(PyExc_TypeError, "a bytes column holds bytes objects only");
                return -1;
            }
    } else if (c->kind == K_FLOAT32 || c->kind == K_INT64) {
        Py_ssize_t width = c->kind == K_FLOAT32 ? 4 : 8;
        if (n < 0 || (n > 0 && rows > PY_SSIZE_T_MAX / width / n) || n > PY_SSIZE_T_MAX / 16) {
            PyErr_SetString(PyExc_ValueError, "a column's value count is out of range");
            return -1;
        }
        if (PyObject_GetBuffer(values, &c->view, PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        c->has_view = 1;
        if (c->view.len != rows * n * width) {
            PyErr_Format(PyExc_ValueError, "a column of %zd x %zd values of %zd bytes has %zd bytes",
                         rows, n, width, c->view.len);
            return -1;
        }
        c->fixed_size = c->kind == K_FLOAT32 || n == 0;
    } else {
        PyErr_Format(PyExc_ValueError, "unknown column kind %d", c->kind);
        return -1;
    }
    return make_fixed(c, (const uint8_t *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
}

static void release(Column *cols, Py_ssize_t k)
{
    for (Py_ssize_t i = 0; i < k; i++) {
        if (cols[i].has_view)
            PyBuffer_Release(&cols[i].view);
        Py_XDECREF(cols[i].items);
        PyMem_Free(cols[i].fixed);
    }
    PyMem_Free(cols);
}

static inline uint64_t fixed_entry_len(const Column *c)
{
    return (uint64_t)c->fixed_len + (c->kind == K_FLOAT32 ? 4 * (uint64_t)c->n : 0);
}

static PyObject *encode(PyObject *self, PyObject *args)
{
    PyObject *columns, *seq, *data = NULL, *lengths = NULL, *result = NULL;
    Py_ssize_t rows;
    uint64_t *payloads = NULL;
    if (!PyArg_ParseTuple(args, "On:encode", &columns, &rows))
        return NULL;
    if (rows < 0 || rows > PY_SSIZE_T_MAX / 8) {
        PyErr_SetString(PyExc_ValueError, "rows out of range");
        return NULL;
    }
    seq = PySequence_Fast(columns, "columns must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    Column *cols = PyMem_Calloc(k ? (size_t)k : 1, sizeof(Column));
    if (cols == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t varying = 0;
    uint64_t fixed = 0; /* the Features size of the fixed-size entries */
    for (Py_ssize_t i = 0; i < k; i++) {
        if (parse_column(PySequence_Fast_GET_ITEM(seq, i), rows, &cols[i]) < 0)
            goto done;
        if (cols[i].fixed_size)
            fixed += fixed_entry_len(&cols[i]);
        else
            varying++;
    }

    /* Pass 1: each Example's size (lengths holds its Features' size until pass 2), each
     * varying entry's payload size, the total. Every size is far below 2**63: the inputs
     * are in memory, and each prefix adds at most 11 bytes per column and row. */
    if (varying && (size_t)rows > SIZE_MAX / sizeof(uint64_t) / (size_t)varying) {
        PyErr_NoMemory();
        goto done;
    }
    payloads = PyMem_Malloc(varying ? (size_t)rows * (size_t)varying * sizeof(uint64_t) : 1);
    lengths = PyByteArray_FromStringAndSize(NULL, rows * 8);
    if (payloads == NULL || lengths == NULL) {
        if (payloads == NULL)
            PyErr_NoMemory();
        goto done;
    }
    int64_t *lens = (int64_t *)PyByteArray_AS_STRING(lengths);
    uint64_t total = 0, *pl = payloads;
    for (Py_ssize_t r = 0; r < rows; r++) {
        uint64_t features = fixed;
        for (Py_ssize_t i = 0; i < k; i++)
            if (!cols[i].fixed_size) {
                uint64_t payload = *pl++ = payload_len(&cols[i], r);
                features += framed(entry_body_len(&cols[i], payload));
            }
        lens[r] = (int64_t)features;
        total += framed(features);
    }
    if (total > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the batch's Examples are too large");
        goto done;
    }
    data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (data == NULL)
        goto done;

    /* Pass 2: the bytes. */
    uint8_t *p = (uint8_t *)PyByteArray_AS_STRING(data);
    pl = payloads;
    for (Py_ssize_t r = 0; r < rows; r++) {
        uint64_t features = (uint64_t)lens[r];
        *p++ = 0x0a;
        p = put_varint(p, features);
        for (Py_ssize_t i = 0; i < k; i++)
            p = put_column(p, &cols[i], r, cols[i].fixed_size ? 0 : *pl++);
        lens[r] = (int64_t)framed(features);
    }
    if (p != (uint8_t *)PyByteArray_AS_STRING(data) + total) {
        PyErr_SetString(PyExc_SystemError, "convert._example: the sizes and the bytes written disagree");
        goto done;
    }
    result = PyTuple_Pack(2, data, lengths);
done:
    release(cols, k);
    PyMem_Free(payloads);
    Py_DECREF(seq);
    Py_XDECREF(lengths);
    Py_XDECREF(data);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS,
     "encode(columns, rows) -> (data, lengths): rows tf.train.Examples (see convert/_example.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "convert._example", NULL, -1, methods};

PyMODINIT_FUNC PyInit__example(void) { return PyModule_Create(&module); }
