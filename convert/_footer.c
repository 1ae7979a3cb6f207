/* The encryption-marker walk of convert/parquet_footer.py in C: the same answer
 * as its Python path (``_encryption_fields``) on every input.
 *
 * encryption_fields(footer) -> int
 *   footer: a C-contiguous byte buffer holding a Thrift compact FileMetaData.
 *   1 when, walking it in order as Thrift's C++ compact protocol and the code
 *   generated for parquet.thrift read it, a field header of FileMetaData fields
 *   8/9 or of a row group's ColumnChunk fields 8/9 is met; 0 when the walk ends
 *   the FileMetaData without one; -1 when it stops first (a footer it cannot
 *   read as Thrift would).
 *
 * Why in C: the walk visits every value of the footer, and a wide file's footer
 * holds millions; the reader walks it before pyarrow parses it.
 * Every read is bounds-checked: the footer is untrusted input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_DEPTH 64 /* as _MAX_STRUCT_DEPTH */
#define BAD (-1)

/* The structs read by their schema (as _OTHER, _FILE, ... in parquet_footer.py). */
enum { OTHER, FILE_, ROW_GROUP, COLUMN, COLUMN_META, SIZE_STATS, GEO_STATS };

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

/* As _varint: at most 10 bytes; *big set when the value needs more than 64 bits. */
static int varint(const in_t *in, Py_ssize_t *pos, uint64_t *out, int *big)
{
    uint64_t v = 0;
    int shift = 0;
    *big = 0;
    for (;;) {
        if (*pos >= in->len)
            return BAD;
        uint8_t b = in->buf[(*pos)++];
        uint64_t part = (uint64_t)(b & 0x7F);
        if (shift < 64) {
            v |= part << shift;
            if (shift > 57 && (part >> (64 - shift)))
                *big = 1;
        } else if (part) {
            *big = 1;
        }
        if (b < 0x80) {
            *out = v;
            return 0;
        }
        shift += 7;
        if (shift >= 70)
            return BAD;
    }
}

/* As _size: a varint below 2**31. */
static int size(const in_t *in, Py_ssize_t *pos, uint64_t *out)
{
    int big;
    if (varint(in, pos, out, &big) < 0 || big || *out >> 31)
        return BAD;
    return 0;
}

/* As _list_size: the item count of the list header at *pos (at most the buffer's length). */
static int list_size(const in_t *in, Py_ssize_t *pos, uint64_t *out, int *elem)
{
    if (*pos >= in->len)
        return BAD;
    uint8_t head = in->buf[(*pos)++];
    *elem = head & 0x0F;
    *out = head >> 4;
    if (*out == 15 && size(in, pos, out) < 0)
        return BAD;
    return *out > (uint64_t)in->len ? BAD : 0;
}

/* As _skip: the position after one value of kind ``kind`` at pos, or BAD. */
static Py_ssize_t skip(const in_t *in, Py_ssize_t pos, int kind, int depth)
{
    uint64_t n;
    int big, elem;
    if (kind == 1 || kind == 2)
        return pos;
    if (kind == 3)
        return pos + 1;
    if (kind >= 4 && kind <= 6)
        return varint(in, &pos, &n, &big) < 0 ? BAD : pos;
    if (kind == 7)
        return pos + 8;
    if (kind == 8) {
        if (size(in, &pos, &n) < 0)
            return BAD;
        return n > (uint64_t)(in->len - pos) ? in->len + 1 : pos + (Py_ssize_t)n; /* past the end: refused */
    }
    if (depth > MAX_DEPTH)
        return BAD;
    if (kind == 9 || kind == 10) {
        if (list_size(in, &pos, &n, &elem) < 0)
            return BAD;
        elem = (elem == 1 || elem == 2) ? 3 : elem;
        for (uint64_t i = 0; i < n; i++) {
            pos = skip(in, pos, elem, depth + 1);
            if (pos < 0 || pos > in->len)
                return BAD;
        }
        return pos;
    }
    if (kind == 11) {
        if (size(in, &pos, &n) < 0)
            return BAD;
        if (n == 0)
            return pos;
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
            if (!(byte & 0x0F))
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

static int is_marker(int role, int64_t field)
{
    return (role == FILE_ || role == COLUMN) && (field == 8 || field == 9);
}

/* As _LISTS: 1 and the items' kind and role when (role, field) is a list of the schema. */
static int schema_list(int role, int64_t field, int *kind, int *item_role)
{
    static const struct { int role, field, kind, item_role; } lists[] = {
        {FILE_, 2, 12, OTHER}, {FILE_, 4, 12, ROW_GROUP}, {FILE_, 5, 12, OTHER}, {FILE_, 7, 12, OTHER},
        {ROW_GROUP, 1, 12, COLUMN}, {ROW_GROUP, 4, 12, OTHER},
        {COLUMN_META, 2, 5, OTHER}, {COLUMN_META, 3, 8, OTHER}, {COLUMN_META, 8, 12, OTHER},
        {COLUMN_META, 13, 12, OTHER}, {SIZE_STATS, 2, 6, OTHER}, {SIZE_STATS, 3, 6, OTHER}, {GEO_STATS, 2, 5, OTHER},
    };
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
        if (lists[i].role == role && lists[i].field == field) {
            *kind = lists[i].kind;
            *item_role = lists[i].item_role;
            return 1;
        }
    return 0;
}

/* As _STRUCTS: the role of a struct field. */
static int struct_role(int role, int64_t field)
{
    if (role == COLUMN && field == 3)
        return COLUMN_META;
    if (role == COLUMN_META && field == 16)
        return SIZE_STATS;
    if (role == COLUMN_META && field == 17)
        return GEO_STATS;
    return OTHER;
}

static int walk(const in_t *in)
{
    frame_t stack[MAX_DEPTH + 2];
    int sp = 1;
    Py_ssize_t pos = 0;
    uint64_t n;
    int big, elem;
    stack[0] = (frame_t){1, 0, 0, 0, FILE_};
    while (sp) {
        frame_t *fr = &stack[sp - 1];
        int kind, role;
        if (fr->is_struct) {
            if (pos >= in->len)
                return BAD;
            uint8_t byte = in->buf[pos++];
            kind = byte & 0x0F;
            if (!kind) {
                sp--;
                continue;
            }
            int64_t fid;
            if (byte >> 4) {
                fid = fr->field + (byte >> 4);
            } else {
                if (varint(in, &pos, &n, &big) < 0 || big || n >> 32)
                    return BAD;
                fid = (int64_t)(n >> 1) ^ -(int64_t)(n & 1);
            }
            if (fid < -0x8000 || fid > 0x7FFF)
                return BAD;
            fr->field = fid;
            if (is_marker(fr->role, fid))
                return 1;
            role = kind == 12 ? struct_role(fr->role, fid) : OTHER;
            int item_kind, item_role;
            if (kind == 9 && schema_list(fr->role, fid, &item_kind, &item_role)) {
                if (list_size(in, &pos, &n, &elem) < 0 || sp > MAX_DEPTH)
                    return BAD;
                stack[sp++] = (frame_t){0, 0, n, item_kind, item_role};
                continue;
            }
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
            if (size(in, &pos, &n) < 0 || n > (uint64_t)(in->len - pos))
                return BAD;
            pos += (Py_ssize_t)n;
        } else if (kind == 12) {
            if (sp > MAX_DEPTH)
                return BAD;
            stack[sp++] = (frame_t){1, 0, 0, 0, role};
        } else if (kind == 9 || kind == 10) {
            if (list_size(in, &pos, &n, &elem) < 0 || sp > MAX_DEPTH || !elem)
                return BAD;
            stack[sp++] = (frame_t){0, 0, n, (elem == 1 || elem == 2) ? 3 : elem, OTHER};
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
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    in_t in = {(const uint8_t *)view.buf, view.len};
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = walk(&in);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromLong(r);
}

static PyMethodDef methods[] = {
    {"encryption_fields", encryption_fields, METH_O, "1: a Thrift compact FileMetaData marks encryption; 0: it does not; -1: unreadable."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_footer", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__footer(void)
{
    return PyModule_Create(&module);
}
