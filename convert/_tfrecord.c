/* TFRecord framing of convert/tfrecord.py in C: the same bytes as its Python path.
 *
 * frame(data, starts, lengths) -> bytes
 *   data: a C-contiguous byte buffer; starts, lengths: C-contiguous buffers of as
 *   many native int64s, record i being data[starts[i] : starts[i] + lengths[i]].
 *   Returns every record framed, in order:
 *     uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
 *   (little-endian). Raises ValueError for a record outside data.
 * take(data, starts, lengths) -> bytes
 *   The same records back to back, unframed (a gather by index).
 * crc32c(data, portable=False) -> int
 *   CRC-32C (Castagnoli) of a byte buffer; portable: the table path even where
 *   the CPU has a CRC instruction (for the tests).
 *
 * Why by hand: google-crc32c, which the Python path calls, has no call for many
 * records; one Python call per record cost more than the CRC. CRC-32C is the
 * SSE 4.2 crc32 instruction where the CPU has it, else slicing-by-8 tables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define POLY 0x82F63B78u /* CRC-32C, reflected */
#define MASK_DELTA 0xA282EAD8u

static uint32_t table[8][256];

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_portable(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        c ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        c = table[7][c & 0xff] ^ table[6][(c >> 8) & 0xff] ^ table[5][(c >> 16) & 0xff] ^ table[4][c >> 24] ^
            table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW 1
__attribute__((target("sse4.2"))) static uint32_t crc_hw(const uint8_t *p, size_t n)
{
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8); /* little-endian, as the instruction expects */
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#else
#define HAVE_HW 0
static uint32_t crc_hw(const uint8_t *p, size_t n) { return crc_portable(p, n); }
#endif

static int use_hw;

static inline uint32_t crc32c(const uint8_t *p, size_t n) { return use_hw ? crc_hw(p, n) : crc_portable(p, n); }

static inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + MASK_DELTA; }

static inline uint8_t *put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static int int64_view(PyObject *obj, Py_buffer *view, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != 8 || view->len % 8) {
        PyErr_Format(PyExc_ValueError, "%s must be a buffer of int64s", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* frame() (framed set) and take(): the records of data at (starts, lengths), in order,
 * each with its TFRecord frame around it or as it is. */
static PyObject *records(PyObject *args, const char *format, int framed)
{
    PyObject *data_obj, *starts_obj, *lengths_obj, *out = NULL;
    Py_buffer data, starts, lengths;
    if (!PyArg_ParseTuple(args, format, &data_obj, &starts_obj, &lengths_obj))
        return NULL;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (int64_view(starts_obj, &starts, "starts") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (int64_view(lengths_obj, &lengths, "lengths") < 0) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&starts);
        return NULL;
    }
    Py_ssize_t n = starts.len / 8;
    const int64_t *s = starts.buf, *l = lengths.buf;
    uint64_t total = 0;
    if (lengths.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "starts and lengths differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || l[i] < 0 || s[i] > data.len || l[i] > data.len - s[i]) {
            PyErr_Format(PyExc_ValueError, "record %zd (%lld bytes at %lld) is outside the %zd bytes of data", i,
                         (long long)l[i], (long long)s[i], data.len);
            goto done;
        }
        total += (uint64_t)l[i] + (framed ? 16 : 0); /* each below 2**63, and n below 2**60: no overflow */
    }
    if (total > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the records are too large together");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *d = data.buf;
    Py_BEGIN_ALLOW_THREADS /* the buffers are held, the output not yet shared */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *head = p;
        if (framed) {
            p = put_le(p, (uint64_t)l[i], 8);
            p = put_le(p, masked(crc32c(head, 8)), 4);
        }
        memcpy(p, d + s[i], (size_t)l[i]);
        p += l[i];
        if (framed)
            p = put_le(p, masked(crc32c(d + s[i], (size_t)l[i])), 4);
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    return out;
}

static PyObject *frame(PyObject *self, PyObject *args) { return records(args, "OOO:frame", 1); }

static PyObject *take(PyObject *self, PyObject *args) { return records(args, "OOO:take", 0); }

static PyObject *crc32c_py(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"data", "portable", NULL};
    Py_buffer data;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|p:crc32c", kw, &data, &portable))
        return NULL;
    uint32_t c = portable ? crc_portable(data.buf, (size_t)data.len) : crc32c(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"frame", frame, METH_VARARGS, "frame(data, starts, lengths) -> bytes: TFRecord frames (see convert/_tfrecord.c)."},
    {"take", take, METH_VARARGS, "take(data, starts, lengths) -> bytes: the records back to back (see convert/_tfrecord.c)."},
    {"crc32c", (PyCFunction)(void (*)(void))crc32c_py, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, portable=False) -> int: CRC-32C of data."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "convert._tfrecord", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tfrecord(void)
{
    make_table();
#if HAVE_HW
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "HARDWARE", use_hw) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
