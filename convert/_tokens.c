/* convert._tokens: a text column's token indexes, computed in C.
 *
 * The same tokens as convert.records.tokenize (and TensorFlow's serving
 * layer): on the UTF-8 bytes of each value, the maximal runs of
 * [0-9A-Za-z_\x80-\xff], after mapping A-Z to a-z when lower-casing. Each
 * token is looked up in a hash table of UTF-8 bytes -> index that mirrors the
 * caller's Python dict (str -> index): a token makes a str object only the
 * first time the table sees it, when it is also looked up in the dict and
 * added to it with index len(dict) - 1 if absent (the dict's __missing__
 * rule in convert/prepare.py). Known tokens cost a hash and a compare, no
 * Python object.
 *
 * Written by hand because no library on the package registries tokenizes into
 * a growing vocabulary without a Python object per token. The table's hash is
 * CPython's own randomized str hash (SipHash), so crafted text cannot flood
 * it. convert/prepare.py falls back to its Python path when this module is
 * missing (no C compiler at install, or a staged wheel on a worker of another
 * platform, pipelines/staging.py);
 * tests/test_convert_tokens.py checks both paths give the same output.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* CPython's randomized bytes hash (the str hash of ASCII text): public from 3.14 on. */
#if PY_VERSION_HEX >= 0x030E0000
#define HASH_BYTES Py_HashBuffer
#else
#define HASH_BYTES _Py_HashBytes
#endif

typedef struct {
    Py_hash_t hash;
    Py_ssize_t off;  /* into the arena */
    Py_ssize_t len;  /* -1: empty slot */
    int32_t index;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;  /* slots - 1, a power of two minus one */
    size_t used;
    char *arena;
    size_t arena_len, arena_cap;
} TokenTable;

/* 1 for the bytes of a token: ASCII letters, digits, '_' and every non-ASCII byte. */
static unsigned char WORD[256];

static void init_word(void) {
    for (int c = 0; c < 256; c++)
        WORD[c] = (c >= 0x80) || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static int table_alloc(TokenTable *t, size_t n) {
    Slot *s = PyMem_Malloc(n * sizeof(Slot));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) s[i].len = -1;
    t->slots = s;
    t->mask = n - 1;
    return 0;
}

static int table_grow(TokenTable *t) {
    Slot *old = t->slots;
    size_t n = t->mask + 1;
    if (table_alloc(t, n * 2) < 0) {
        t->slots = old;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (old[i].len < 0) continue;
        size_t j = (size_t)old[i].hash & t->mask;
        while (t->slots[j].len >= 0) j = (j + 1) & t->mask;
        t->slots[j] = old[i];
    }
    PyMem_Free(old);
    return 0;
}

static int arena_put(TokenTable *t, const char *p, Py_ssize_t len, Py_ssize_t *off) {
    if (t->arena_len + (size_t)len > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 4096;
        while (cap < t->arena_len + (size_t)len) cap *= 2;
        char *a = PyMem_Realloc(t->arena, cap);
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->arena = a;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, p, (size_t)len);
    *off = (Py_ssize_t)t->arena_len;
    t->arena_len += (size_t)len;
    return 0;
}

/* The dict's index of the token (added as len(dict) - 1 when absent), -1 with an error set on failure. */
static long dict_index(PyObject *index, const char *p, Py_ssize_t len) {
    PyObject *key = PyUnicode_DecodeUTF8(p, len, "strict");
    if (key == NULL) return -1;
    long i;
    PyObject *found = PyDict_GetItemWithError(index, key);  /* borrowed */
    if (found != NULL) {
        i = PyLong_AsLong(found);
    } else if (PyErr_Occurred()) {
        i = -1;
    } else {
        i = (long)PyDict_Size(index) - 1;
        PyObject *v = PyLong_FromLong(i);
        if (v == NULL || PyDict_SetItem(index, key, v) < 0) i = -1;
        Py_XDECREF(v);
    }
    Py_DECREF(key);
    if (i != -1 && (i < 0 || i > INT32_MAX)) {
        PyErr_SetString(PyExc_OverflowError, "token index out of int32 range");
        return -1;
    }
    return i;
}

/* The token's index; -1 with an error set on failure (no token maps to -1: the dict's -1 is its sentinel, "\x00"). */
static long lookup(TokenTable *t, PyObject *index, const char *p, Py_ssize_t len) {
    Py_hash_t h = HASH_BYTES(p, len);
    size_t j = (size_t)h & t->mask;
    for (;;) {
        Slot *s = &t->slots[j];
        if (s->len < 0) break;
        if (s->hash == h && s->len == len && memcmp(t->arena + s->off, p, (size_t)len) == 0) return s->index;
        j = (j + 1) & t->mask;
    }
    long i = dict_index(index, p, len);
    if (i == -1) return -1;
    Py_ssize_t off;
    if (arena_put(t, p, len, &off) < 0) return -1;
    Slot *s = &t->slots[j];
    s->hash = h;
    s->off = off;
    s->len = len;
    s->index = (int32_t)i;
    if (++t->used * 2 > t->mask + 1 && table_grow(t) < 0) return -1;
    return i;
}

static int TokenTable_init(TokenTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":TokenTable", kwlist)) return -1;
    if (self->slots != NULL) return 0;
    return table_alloc(self, 1024);
}

static void TokenTable_dealloc(TokenTable *self) {
    PyMem_Free(self->slots);
    PyMem_Free(self->arena);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(codes_doc,
"codes(index, values, lower) -> (codes, counts) | None\n\n"
"The tokens of every value of ``values`` (a list of str and None) as their\n"
"indexes in ``index`` (a dict, str -> int; a token it lacks is added at\n"
"len(index) - 1): ``codes``, int32 bytes, flat in row order, and ``counts``,\n"
"int64 bytes, the tokens per value (0 for None). ``lower`` maps A-Z to a-z\n"
"first. None, with nothing looked up, when a value is not a str or None or\n"
"has no UTF-8 form (a lone surrogate): the caller's Python path decides.\n"
"The same table must always be used with the same dict.");

static PyObject *TokenTable_codes(TokenTable *self, PyObject *args) {
    PyObject *index, *values;
    int lower;
    if (!PyArg_ParseTuple(args, "O!O!p:codes", &PyDict_Type, &index, &PyList_Type, &values, &lower)) return NULL;
    if (self->slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "TokenTable not initialized");
        return NULL;
    }
    Py_ssize_t b = PyList_GET_SIZE(values);
    /* Pass 1: every value a str (with a UTF-8 form) or None; a bound on the tokens. */
    size_t bound = 0, longest = 0;
    for (Py_ssize_t r = 0; r < b; r++) {
        PyObject *v = PyList_GET_ITEM(values, r);
        if (v == Py_None) continue;
        if (!PyUnicode_CheckExact(v)) Py_RETURN_NONE;
        Py_ssize_t n;
        if (PyUnicode_AsUTF8AndSize(v, &n) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        bound += ((size_t)n + 1) / 2;
        if ((size_t)n > longest) longest = (size_t)n;
    }
    PyObject *codes = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(bound * sizeof(int32_t)));
    PyObject *counts = PyByteArray_FromStringAndSize(NULL, b * (Py_ssize_t)sizeof(int64_t));
    char *lowered = lower ? PyMem_Malloc(longest + 1) : NULL;
    if (codes == NULL || counts == NULL) goto fail;
    if (lower && lowered == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int32_t *out = (int32_t *)PyByteArray_AS_STRING(codes);
    int64_t *per_row = (int64_t *)PyByteArray_AS_STRING(counts);
    size_t k = 0;
    /* Pass 2: tokens, looked up. */
    for (Py_ssize_t r = 0; r < b; r++) {
        PyObject *v = PyList_GET_ITEM(values, r);
        size_t k0 = k;
        if (v != Py_None) {
            Py_ssize_t n;
            const char *s = PyUnicode_AsUTF8AndSize(v, &n);  /* cached by pass 1 */
            if (s == NULL) goto fail;
            if (lower) {
                for (Py_ssize_t i = 0; i < n; i++) {
                    char c = s[i];
                    lowered[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
                }
                s = lowered;
            }
            Py_ssize_t i = 0;
            while (i < n) {
                while (i < n && !WORD[(unsigned char)s[i]]) i++;
                Py_ssize_t start = i;
                while (i < n && WORD[(unsigned char)s[i]]) i++;
                if (i > start) {
                    long id = lookup(self, index, s + start, i - start);
                    if (id == -1) goto fail;
                    out[k++] = (int32_t)id;
                }
            }
        }
        per_row[r] = (int64_t)(k - k0);
    }
    PyMem_Free(lowered);
    if (PyByteArray_Resize(codes, (Py_ssize_t)(k * sizeof(int32_t))) < 0) {
        Py_DECREF(codes);
        Py_DECREF(counts);
        return NULL;
    }
    return Py_BuildValue("(NN)", codes, counts);
fail:
    PyMem_Free(lowered);
    Py_XDECREF(codes);
    Py_XDECREF(counts);
    return NULL;
}

static PyObject *TokenTable_size(TokenTable *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSize_t(self->used);
}

static PyMethodDef TokenTable_methods[] = {
    {"codes", (PyCFunction)TokenTable_codes, METH_VARARGS, codes_doc},
    {"size", (PyCFunction)TokenTable_size, METH_NOARGS, "The number of distinct tokens the table holds."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TokenTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "convert._tokens.TokenTable",
    .tp_doc = PyDoc_STR("UTF-8 token -> index, mirroring one Python dict (see codes)."),
    .tp_basicsize = sizeof(TokenTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TokenTable_init,
    .tp_dealloc = (destructor)TokenTable_dealloc,
    .tp_methods = TokenTable_methods,
};

static struct PyModuleDef tokens_module = {
    PyModuleDef_HEAD_INIT, "convert._tokens", "A text column's token indexes, in C (see convert/prepare.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__tokens(void) {
    init_word();
    if (PyType_Ready(&TokenTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&tokens_module);
    if (m == NULL) return NULL;
    Py_INCREF(&TokenTableType);
    if (PyModule_AddObject(m, "TokenTable", (PyObject *)&TokenTableType) < 0) {
        Py_DECREF(&TokenTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
