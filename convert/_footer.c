/* The encryption-marker walk of convert/parquet_footer.py in C: the same answer
 * as its Python path (``_encryption_fields``) on every input.
 *
 * encryption_fields(footer) -> bool
 *   footer: a C-contiguous byte buffer holding a Thrift compact FileMetaData.
 *   True when, walking it in order, a field header of FileMetaData fields 8/9
 *   or of a row group's ColumnChunk fields 8/9 is met before anything the walk
 *   cannot read; False otherwise (no marker, or a footer that is not Thrift
 *   compact as expected: pyarrow refuses that one by itself).
 *
 * Why in C: the walk visits every value of the footer, and a wide file's footer
 * holds millions; the reader walks it before pyarrow may touch a column chunk.
 * Every read is bounds-checked: the footer is untrusted input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_DEPTH 64 /* as _MAX_STRUCT_DEPTH */
#define FAR ((int64_t)1 << 41) /* a field id no delta within a footer brings back to 1..9 */
#define BAD (-1)

enum { OTHER, FILE_, ROW_GROUP, COLUMN };

typedef struct {
    int is_struct;
    int64_t field;  /* the last field id (structs) */
    uint64_t left;  /* items left (lists) */
    int kind;       /* the items' kind (lists) */
    int role;
} frame_t;

typedef struct {
    const uint8_t *buf;
    Py_ssize_t len;
} in_t;

/* A varint at *pos as _varint reads it: BAD past the end or over 11 bytes; *big set when over 64 bits. */
static int varint(const in_t *in, Py_ssize_t *pos, uint64_t *out, int *big)
{
    uint64_t v = 0;
    int shift = 0;
    *big = 0;
    for (;;) {
        if (*pos >= in->len)
            return BAD;
        uint8_t b = in->buf[(*pos)++];
        if (shift < 64) {
            uint64_t part = (uint64_t)(b & 0x7F);
            v |= part << shift;
            if (shift > 57 && (part >> (64 - shift)))
                *big = 1;
        } else if (b & 0x7F) {
            *big = 1;
        }
        if (b < 0x80) {
            *out = v;
            return 0;
        }
        shift += 7;
        if (shift > 70)
            return BAD;
    }
}

/* As _skip: the position after one value of kind ``kind`` at pos, or BAD. */
static Py_ssize_t skip(const in_t *in, Py_ssize_t pos, int kind, int depth)
{
    uint64_t n;
    int big;
    if (kind == 1 || kind == 2)
        return pos;
    if (kind == 3)
        return pos + 1;
    if (kind >= 4 && kind <= 6) {
        if (varint(in, &pos, &n, &big) < 0)
            return BAD;
        return pos;
    }
    if (kind == 7)
        return pos + 8;
    if (kind == 8) {
        if (varint(in, &pos, &n, &big) < 0)
            return BAD;
        if (big || n > (uint64_t)(in->len - pos))
            return in->len + 1; /* past the end: the caller refuses it */
        return pos + (Py_ssize_t)n;
    }
    if (depth > MAX_DEPTH)
        return BAD;
    if (kind == 9 || kind == 10) {
        if (pos >= in->len)
            return BAD;
        uint8_t head = in->buf[pos++];
        int elem = head & 0x0F;
        n = head >> 4;
        big = 0;
        if (n == 15 && varint(in, &pos, &n, &big) < 0)
            return BAD;
        if (big)
            n = UINT64_MAX;
        elem = (elem == 1 || elem == 2) ? 3 : elem;
        for (uint64_t i = 0; i < n; i++) {
            pos = skip(in, pos, elem, depth + 1);
            if (pos < 0 || pos > in->len)
                return BAD;
        }
        return pos;
    }
    if (kind == 11) {
        if (varint(in, &pos, &n, &big) < 0)
            return BAD;
        if (n == 0 && !big)
            return pos;
        if (big)
            n = UINT64_MAX;
        if (pos >= in->len)
            return BAD;
        uint8_t kv = in->buf[pos++];
        int kt = kv >> 4, vt = kv & 0x0F;
        kt = (kt == 1 || kt == 2) ? 3 : kt;
        vt = (vt == 1 || vt == 2) ? 3 : vt;
        for (uint64_t i = 0; i < n; i++) {
            pos = skip(in, pos, kt, depth + 1);
            if (pos < 0 || pos > in->len)
                return BAD; /* whatever the value's kind, the walk stops there */
            pos = skip(in, pos, vt, depth + 1);
            if (pos < 0 || pos > in->len)
                return BAD;
        }
        return pos;
    }
    if (kind == 12) {
        for (;;) {
            if (pos >= in->len)
                return BAD;
            uint8_t byte = in->buf[pos++];
            if (byte == 0)
                return pos;
            if (!(byte >> 4) && varint(in, &pos, &n, &big) < 0)
                return BAD;
            pos = skip(in, pos, byte & 0x0F, depth + 1);
            if (pos < 0)
                return BAD;
        }
    }
    return BAD;
}

/* 1: a marker; 0: none; BAD: the walk stopped first (both read as "no marker"). */
static int walk(const in_t *in)
{
    frame_t stack[MAX_DEPTH + 2];
    int sp = 1;
    Py_ssize_t pos = 0;
    uint64_t n;
    int big;
    stack[0] = (frame_t){1, 0, 0, 0, FILE_};
    while (sp) {
        frame_t *fr = &stack[sp - 1];
        int kind, role;
        if (fr->is_struct) {
            if (pos >= in->len)
                return BAD;
            uint8_t byte = in->buf[pos++];
            if (byte == 0) {
                sp--;
                continue;
            }
            kind = byte & 0x0F;
            if (byte >> 4) {
                fr->field += byte >> 4;
            } else {
                if (varint(in, &pos, &n, &big) < 0)
                    return BAD;
                int64_t id = (int64_t)(n >> 1) ^ -(int64_t)(n & 1);
                fr->field = (big || id > FAR || id < -FAR) ? FAR : id;
            }
            if ((fr->role == FILE_ || fr->role == COLUMN) && (fr->field == 8 || fr->field == 9))
                return 1;
            role = (fr->role == FILE_ && fr->field == 4) ? ROW_GROUP
                 : (fr->role == ROW_GROUP && fr->field == 1) ? COLUMN : OTHER;
        } else {
            if (!fr->left) {
                sp--;
                continue;
            }
            fr->left--;
            kind = fr->kind;
            role = fr->role;
        }
        if (kind <= 2)
            continue;
        if (kind == 3) {
            pos += 1;
        } else if (kind <= 6) {
            do {
                if (pos >= in->len)
                    return BAD;
            } while (in->buf[pos++] & 0x80);
        } else if (kind == 7) {
            pos += 8;
        } else if (kind == 8) {
            if (varint(in, &pos, &n, &big) < 0)
                return BAD;
            if (big || n > (uint64_t)(in->len - pos))
                return BAD;
            pos += (Py_ssize_t)n;
        } else if (kind == 12) {
            if (sp > MAX_DEPTH)
                return BAD;
            stack[sp++] = (frame_t){1, 0, 0, 0, fr->is_struct ? OTHER : role};
        } else if (kind == 9 || kind == 10) {
            if (pos >= in->len)
                return BAD;
            uint8_t head = in->buf[pos++];
            int elem = head & 0x0F;
            n = head >> 4;
            big = 0;
            if (n == 15 && varint(in, &pos, &n, &big) < 0)
                return BAD;
            if (big || sp > MAX_DEPTH || n > (uint64_t)in->len)
                return BAD;
            stack[sp++] = (frame_t){0, 0, n, (elem == 1 || elem == 2) ? 3 : elem, role};
        } else if (kind == 11) {
            pos = skip(in, pos, kind, sp);
            if (pos < 0)
                return BAD;
        } else {
            return BAD;
        }
        if (pos > in->len)
            return BAD;
    }
    return 0;
}

static PyObject *encryption_fields(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    in_t in = {(const uint8_t *)view.buf, view.len};
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = walk(&in);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(r == 1);
}

static PyMethodDef methods[] = {
    {"encryption_fields", encryption_fields, METH_O, "Whether a Thrift compact FileMetaData marks encryption."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_footer", NULL, -1, methods};

PyMODINIT_FUNC PyInit__footer(void)
{
    return PyModule_Create(&module);
}
