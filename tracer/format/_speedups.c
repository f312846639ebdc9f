/*
 * tracer.format._speedups: the TraceWriter's hot path in C.
 *
 * Why: a Ray runner's dispatch loop writes ~20 events per task, each between
 * two of Ray's calls, so the writer's Python runs on cold CPU caches and costs
 * ~3-4 us an event there (~0.4 us in a tight loop). The same encoding in C is
 * a few hundred ns, cold or warm.
 *
 * What: an Encoder bound to one TraceWriter takes the common cases of
 * begin/end/instant/counter (a cached event, or one whose args the writer's
 * _fast_event would take) and writes the very bytes the Python writer would,
 * into the writer's own buffer, with the writer's own caches and interning
 * tables (the same dict and set objects). Everything else (a first
 * occurrence, an unusual value, a bad argument, a closed writer) goes to the
 * writer's Python method with the call's own arguments, before anything is
 * changed: the Python code stays the one definition of what an event is, and
 * the tests check that both write the same bytes.
 *
 * State shared with the Python writer: the delta chain ``_last`` (read from
 * and written to the writer's __dict__ at every event, so the Python paths
 * see it), the buffer (the same bytearray), the caches. The writer stops
 * the encoder when it closes; from then on every call goes to Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#define PACK8(x, p) _PyFloat_Pack8((x), (unsigned char *)(p), 1)
#else
#define PACK8(x, p) PyFloat_Pack8((x), (p), 1)
#endif

/* Mirrors tracer/format/writer.py and _wire.py. */
#define KIND_BEGIN 1
#define KIND_END 2
#define KIND_INSTANT 3
#define MAX_INTERNED_VALUE_LEN 256
#define SEEN_ONCE_LIMIT 8192
#define MAX_ARG_IID 16384
#define MAX_CACHED_DICT 8

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Scratch;

typedef struct {
    PyObject_HEAD
    PyObject *writer;
    PyObject *wdict;        /* writer.__dict__ */
    PyObject *buf;          /* writer._buf: a bytearray */
    PyObject *begin_cache;  /* dict: track -> {name or (name, category): frames} */
    PyObject *instant_cache;
    PyObject *end_frames;   /* dict: track -> frames or None */
    PyObject *counter_bodies;
    PyObject *counter_last;
    PyObject *heads;        /* dict: (kind, track, name, category) -> head bytes */
    PyObject *arg_names;
    PyObject *string_values;
    PyObject *seen_once;
    PyObject *seen_twice;
    PyObject *arg_cache;
    PyObject *clock;        /* writer._clock (returns units) */
    PyObject *seq;          /* writer._seq: bytes */
    PyObject *fb_begin;     /* the writer class's Python methods, for what C does not take */
    PyObject *fb_end;
    PyObject *fb_instant;
    PyObject *fb_counter;
    Py_ssize_t limit;
    Py_ssize_t intern_limit;
    long long unit;
    int realtime_clock;     /* the clock is time.time_ns (read directly) */
    long long last_read;    /* its latest reading, in units: readings never go back */
    int closed;
    /* Calls taken here (cached events, events with args) and handed to Python. */
    unsigned long long n_cached, n_args, n_python;
    /* While TraceWriter.in_time_order holds calls (tracer/format/_late.py): the list
     * they go to, the per-track latest timestamps (their sort keys), the Python
     * holders that take what this does not (begin, end, instant, counter), the
     * bound methods replayed, the writer's _write_held, and its limit. NULL: none. */
    PyObject *held;
    PyObject *held_keys;
    PyObject *holders;
    PyObject *bound;
    PyObject *write_held;
    PyObject *no_kwargs;
    Py_ssize_t max_held;
    /* Scratch space, reused from event to event: the TrackEvent, the strings it
     * defines, one annotation, the packet body. */
    Scratch event;
    Scratch defs;
    Scratch ann;
    Scratch body;
} Encoder;

static PyTypeObject EncoderType;

static PyObject *str_last;   /* "_last" */
static PyObject *str_late;   /* "_late": the late chain (tracer/format/_late.py) */
static PyObject *str_late_tag; /* "_late_tag": its clock id field, D0 03 <clock> */
static PyObject *str_dedupe; /* "dedupe" */
static PyObject *str_emit;   /* "_emit" */
static PyObject *str_flush;  /* "_flush_buffer" */
static PyObject *kw_track, *kw_name, *kw_ts, *kw_category, *kw_args, *kw_flows, *kw_tflows,
    *kw_value;

/* ------------------------------------------------------------------ bytes */

static inline int
vlen(uint64_t v)
{
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *
put_varint(char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

static int
scratch_reserve(Scratch *s, Py_ssize_t extra)
{
    if (s->len + extra <= s->cap)
        return 0;
    Py_ssize_t cap = s->cap ? s->cap : 256;
    while (cap < s->len + extra)
        cap *= 2;
    char *data = PyMem_Realloc(s->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->data = data;
    s->cap = cap;
    return 0;
}

static int
scratch_put(Scratch *s, const char *data, Py_ssize_t n)
{
    if (scratch_reserve(s, n) < 0)
        return -1;
    memcpy(s->data + s->len, data, (size_t)n);
    s->len += n;
    return 0;
}

static int
scratch_varint(Scratch *s, uint64_t v)
{
    if (scratch_reserve(s, 10) < 0)
        return -1;
    s->len = put_varint(s->data + s->len, v) - s->data;
    return 0;
}

/* ------------------------------------------------------------- the writer */

/* The writer's _last as a C value; 0 if it does not fit (then Python takes the event). */
static int
get_last(Encoder *self, long long *last)
{
    PyObject *obj = PyDict_GetItemWithError(self->wdict, str_last);
    if (obj == NULL || !PyLong_CheckExact(obj)) {
        if (PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    int overflow = 0;
    *last = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (*last == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int
set_last(Encoder *self, long long ts)
{
    PyObject *obj = PyLong_FromLongLong(ts);
    if (obj == NULL)
        return -1;
    int rc = PyDict_SetItem(self->wdict, str_last, obj);
    Py_DECREF(obj);
    return rc;
}

/* The late chain's last timestamp and clock id (_late, _late_tag), when it is
 * anchored and can take ``ts``; 0 otherwise (the event is then written absolute).
 * An int subclass counts as its value: the Python writer keeps the timestamp it was
 * given (a bool passes, as True is 1) and compares it as a number. Refusing it here
 * wrote absolute what the Python writer put on the late chain. */
static int
late_chain(Encoder *self, long long ts, long long *late, unsigned char *clock)
{
    PyObject *obj = PyDict_GetItemWithError(self->wdict, str_late);
    PyObject *tag = obj == NULL ? NULL : PyDict_GetItemWithError(self->wdict, str_late_tag);
    if (tag == NULL || !PyLong_Check(obj) || !PyBytes_CheckExact(tag)
        || PyBytes_GET_SIZE(tag) != 3) {
        if (PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    int overflow = 0;
    *late = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (*late == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (*late < 0 || ts < *late)
        return 0;
    *clock = (unsigned char)PyBytes_AS_STRING(tag)[2];
    return 1;
}

/* ``ts`` (ns, as given) in the writer's units; 0 when Python must take the call. */
static int
units_of(Encoder *self, PyObject *ts, long long *out)
{
    if (!PyLong_CheckExact(ts))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(ts, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < 0)
        return 0;
    *out = self->unit == 1 ? v : v / self->unit;
    return 1;
}

/* The clock's reading in units: 1, or 0 with *obj set (a reading C cannot take,
 * a new reference the caller hands to Python), or -1 on error. */
static int
read_clock(Encoder *self, long long *out, PyObject **obj)
{
    *obj = NULL;
    if (self->realtime_clock) {
        struct timespec t;
        if (clock_gettime(CLOCK_REALTIME, &t) == 0) {
            long long ns = (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
            long long v = self->unit == 1 ? ns : ns / self->unit;
            /* The wall clock stepped back (NTP, a VM resumed): the reading stays where
             * it was until the clock catches up, as writer._ForwardClock does for a
             * clock of Python's; a slice begun before the step then cannot end before
             * it began. */
            if (v < self->last_read)
                v = self->last_read;
            else
                self->last_read = v;
            *out = v;
            return 1;
        }
    }
    PyObject *value = PyObject_CallNoArgs(self->clock);
    if (value == NULL)
        return -1;
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && !(v == -1 && PyErr_Occurred()) && v >= 0) {
            Py_DECREF(value);
            *out = v;
            return 1;
        }
        PyErr_Clear();
    }
    *obj = value;
    return 0;
}

/* Append one timestamped packet ``0A len body [D0 03 06] 40 ts`` to the buffer
 * (the writer's _emit, for a ts that fits in int64 and is not negative). */
static int
emit(Encoder *self, long long ts, long long last, const char *body, Py_ssize_t body_len,
     const char *value, Py_ssize_t value_len)
{
    int absolute = ts < last;
    long long late = -1;
    unsigned char late_clock = 0;
    uint64_t stamp;
    if (absolute && late_chain(self, ts, &late, &late_clock)) {
        absolute = 0; /* behind the delta chain, not behind the late chain */
        stamp = (uint64_t)(ts - late);
    }
    else if (absolute) {
        if (self->unit != 1 && ts > (long long)(UINT64_MAX / (uint64_t)self->unit)) {
            PyErr_SetString(PyExc_OverflowError, "timestamp out of range");
            return -1; /* the callers hand such readings to Python first */
        }
        stamp = (uint64_t)ts * (uint64_t)self->unit;
    }
    else {
        stamp = (uint64_t)(ts - last);
    }
    Py_ssize_t inner = body_len + value_len + (absolute || late_clock ? 3 : 0) + 1 + vlen(stamp);
    Py_ssize_t total = 1 + vlen((uint64_t)inner) + inner;
    PyObject *buf = self->buf;
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, old + total) < 0)
        return -1;
    char *p = PyByteArray_AS_STRING(buf) + old;
    *p++ = 0x0a;
    p = put_varint(p, (uint64_t)inner);
    memcpy(p, body, (size_t)body_len);
    p += body_len;
    if (value_len) {
        memcpy(p, value, (size_t)value_len);
        p += value_len;
    }
    if (absolute || late_clock) {
        *p++ = (char)0xd0;
        *p++ = 0x03;
        *p++ = late_clock ? (char)late_clock : 0x06;
    }
    *p++ = 0x40;
    put_varint(p, stamp);
    if (late_clock) {
        PyObject *obj = PyLong_FromLongLong(ts);
        if (obj == NULL)
            return -1;
        int rc = PyDict_SetItem(self->wdict, str_late, obj);
        Py_DECREF(obj);
        return rc;
    }
    if (!absolute && set_last(self, ts) < 0)
        return -1;
    return 0;
}

static int
maybe_flush(Encoder *self)
{
    if (PyByteArray_GET_SIZE(self->buf) < self->limit)
        return 0;
    PyObject *r = PyObject_CallMethodNoArgs(self->writer, str_flush);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ``fb(first, *args, **kwargs)`` with a call's own arguments. */
static PyObject *
call_python(PyObject *fb, PyObject *first, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *small[12];
    PyObject **stack = small;
    if (1 + nargs + nkw > 12) {
        stack = PyMem_Malloc(sizeof(PyObject *) * (size_t)(1 + nargs + nkw));
        if (stack == NULL)
            return PyErr_NoMemory();
    }
    stack[0] = first;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        stack[1 + i] = args[i];
    PyObject *r = PyObject_Vectorcall(fb, stack, 1 + nargs, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return r;
}

/* The writer's Python method ``fb`` with this call's own arguments. */
static PyObject *
fallback(Encoder *self, PyObject *fb, PyObject *const *args, Py_ssize_t nargs,
         PyObject *kwnames)
{
    if (self->writer == NULL) { /* never bound (its __init__ failed), or cleared by the GC */
        PyErr_SetString(PyExc_RuntimeError, "Encoder is not bound to a TraceWriter");
        return NULL;
    }
    self->n_python++;
    return call_python(fb, self->writer, args, nargs, kwnames);
}

/* Python's writer._emit(ts, body [+ value]) for a reading C cannot encode. */
static PyObject *
python_emit(Encoder *self, PyObject *ts, const char *body, Py_ssize_t body_len,
            const char *value, Py_ssize_t value_len)
{
    PyObject *b = PyBytes_FromStringAndSize(NULL, body_len + value_len);
    if (b == NULL)
        return NULL;
    memcpy(PyBytes_AS_STRING(b), body, (size_t)body_len);
    if (value_len)
        memcpy(PyBytes_AS_STRING(b) + body_len, value, (size_t)value_len);
    PyObject *r = PyObject_CallMethodObjArgs(self->writer, str_emit, ts, b, NULL);
    Py_DECREF(b);
    return r;
}

/* ---------------------------------------------------------------- parsing */

/* Match positional args and keywords to ``names`` (the first ``npos`` may be
 * positional). 1: parsed; 0: a call Python must take (unknown or repeated
 * keyword, too many positionals, a required one missing). */
static int
parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **names, int n,
      int npos, int nrequired, PyObject **out)
{
    if (nargs > npos)
        return 0;
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            int found = -1;
            for (int i = 0; i < n; i++) {
                if (key == names[i]) {
                    found = i;
                    break;
                }
            }
            if (found < 0) {
                for (int i = 0; i < n; i++) {
                    int eq = PyUnicode_Compare(key, names[i]);
                    if (eq == -1 && PyErr_Occurred()) {
                        PyErr_Clear();
                        return 0;
                    }
                    if (eq == 0) {
                        found = i;
                        break;
                    }
                }
            }
            if (found < 0 || out[found] != NULL)
                return 0;
            out[found] = args[nargs + k];
        }
    }
    for (int i = 0; i < nrequired; i++)
        if (out[i] == NULL)
            return 0;
    for (int i = 0; i < n; i++)
        if (out[i] == NULL)
            out[i] = Py_None;
    return 1;
}

/* ------------------------------------------------------------------- args */

/* Flow ids of an exact list or tuple, each as Python's _check_flow takes it:
 * 1 if all are, 0 if Python must take the call (it raises or iterates). */
static int
flows_ok(PyObject *flows)
{
    if (flows == Py_None)
        return 1;
    if (!PyList_CheckExact(flows) && !PyTuple_CheckExact(flows))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(flows);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PySequence_Fast_GET_ITEM(flows, i);
        if (!PyLong_CheckExact(f))
            return 0;
        unsigned long long v = PyLong_AsUnsignedLongLong(f);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (v == 0)
            return 0;
    }
    return 1;
}

static int
put_flows(Scratch *s, PyObject *flows, unsigned char t0, unsigned char t1)
{
    if (flows == Py_None)
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(flows);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PySequence_Fast_GET_ITEM(flows, i);
        unsigned long long v = PyLong_CheckExact(f) ? PyLong_AsUnsignedLongLong(f) : 0;
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (v == 0) { /* changed since flows_ok: only Python code in between could */
            PyErr_SetString(PyExc_RuntimeError, "flow ids changed while encoding");
            return -1;
        }
        if (scratch_reserve(s, 10) < 0)
            return -1;
        char *p = s->data + s->len;
        *p++ = (char)t0;
        *p++ = (char)t1;
        for (int b = 0; b < 8; b++)
            *p++ = (char)((v >> (8 * b)) & 0xFF);
        s->len += 10;
    }
    return 0;
}

/* _arg_cache_key(key, value) for a dict value: a new reference, Py_None when
 * the dict is not one the cache holds, NULL on error. */
static PyObject *
dict_cache_key(PyObject *key, PyObject *value)
{
    Py_ssize_t n = PyDict_GET_SIZE(value);
    if (n > MAX_CACHED_DICT)
        Py_RETURN_NONE;
    PyObject *items = PyTuple_New(n);
    if (items == NULL)
        return NULL;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    while (PyDict_Next(value, &pos, &k, &v)) {
        PyTypeObject *cls = Py_TYPE(v);
        if (i >= n || !PyUnicode_CheckExact(k)
            || !(cls == &PyUnicode_Type || cls == &PyLong_Type || cls == &PyFloat_Type
                 || cls == &PyBool_Type)
            || (cls == &PyFloat_Type && PyFloat_AS_DOUBLE(v) == 0.0)) {
            Py_DECREF(items);
            Py_RETURN_NONE;
        }
        PyObject *entry = PyTuple_Pack(3, k, (PyObject *)cls, v);
        if (entry == NULL) {
            Py_DECREF(items);
            return NULL;
        }
        PyTuple_SET_ITEM(items, i, entry);
        i++;
    }
    if (i != n) { /* changed while iterated: Python's concern */
        Py_DECREF(items);
        Py_RETURN_NONE;
    }
    PyObject *ckey = PyTuple_Pack(3, key, (PyObject *)&PyDict_Type, items);
    Py_DECREF(items);
    return ckey;
}

/* The cached annotation of a dict value: a borrowed reference, or NULL with no
 * error when there is none, NULL with an error on error. */
static PyObject *
cached_dict_annotation(Encoder *self, PyObject *key, PyObject *value)
{
    PyObject *ckey = dict_cache_key(key, value);
    if (ckey == NULL)
        return NULL;
    if (ckey == Py_None) {
        Py_DECREF(ckey);
        return NULL;
    }
    PyObject *cached = PyDict_GetItemWithError(self->arg_cache, ckey);
    Py_DECREF(ckey);
    if (cached != NULL && !PyBytes_CheckExact(cached))
        return NULL;
    return cached;
}

/* The arg name's iid if the fast path may use it, else 0 (or -1 on error). */
static long
arg_iid(Encoder *self, PyObject *key)
{
    PyObject *iid = PyDict_GetItemWithError(self->arg_names, key);
    if (iid == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyLong_CheckExact(iid))
        return 0;
    long v = PyLong_AsLong(iid);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return (v >= 1 && v < MAX_ARG_IID) ? v : 0;
}

/* Whether _fast_event would take these args (no side effects): 1 yes, 0 no, -1 error. */
static int
arg_ok(Encoder *self, PyObject *key, PyObject *value);

static int
args_ok(Encoder *self, PyObject *args)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(args, &pos, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value);
        int ok = arg_ok(self, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (ok <= 0)
            return ok;
    }
    return 1;
}

static int
arg_ok(Encoder *self, PyObject *key, PyObject *value)
{
    long iid = arg_iid(self, key);
    if (iid <= 0)
        return (int)iid;
    PyTypeObject *cls = Py_TYPE(value);
    if (cls == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow)
            return 0;
        if (v == -1 && PyErr_Occurred())
            return -1;
        return 1;
    }
    if (cls == &PyUnicode_Type || cls == &PyFloat_Type || cls == &PyBool_Type)
        return 1;
    if (cls == &PyDict_Type) {
        PyObject *cached = cached_dict_annotation(self, key, value);
        if (cached == NULL)
            return PyErr_Occurred() ? -1 : 0;
        return 1;
    }
    return 0;
}

/* The writer's _string_value: a string annotation value, interned from its third use. */
static int
put_string_value(Encoder *self, Scratch *ann, PyObject *value)
{
    PyObject *iid = PyDict_GetItemWithError(self->string_values, value);
    if (iid == NULL && PyErr_Occurred())
        return -1;
    if (iid != NULL) {
        unsigned long long v = PyLong_AsUnsignedLongLong(iid);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (scratch_put(ann, "\x88\x01", 2) < 0)
            return -1;
        return scratch_varint(ann, v);
    }
    Py_ssize_t chars = PyUnicode_GET_LENGTH(value);
    int intern = 0;
    if (chars <= MAX_INTERNED_VALUE_LEN
        && PyDict_GET_SIZE(self->string_values) < self->intern_limit) {
        int twice = PySet_Contains(self->seen_twice, value);
        if (twice < 0)
            return -1;
        if (twice) {
            intern = 1;
        }
        else {
            int once = PySet_Contains(self->seen_once, value);
            if (once < 0)
                return -1;
            PyObject *seen = once ? self->seen_twice : self->seen_once;
            if (PySet_GET_SIZE(seen) >= SEEN_ONCE_LIMIT && PySet_Clear(seen) < 0)
                return -1;
            if (PySet_Add(seen, value) < 0)
                return -1;
        }
    }
    PyObject *encoded = PyUnicode_AsEncodedString(value, "utf-8", "surrogatepass");
    if (encoded == NULL)
        return -1;
    const char *data = PyBytes_AS_STRING(encoded);
    Py_ssize_t len = PyBytes_GET_SIZE(encoded);
    int rc = 0;
    if (intern) {
        Py_ssize_t next = PyDict_GET_SIZE(self->string_values) + 1;
        PyObject *new_iid = PyLong_FromSsize_t(next);
        if (new_iid == NULL || PyDict_SetItem(self->string_values, value, new_iid) < 0) {
            Py_XDECREF(new_iid);
            Py_DECREF(encoded);
            return -1;
        }
        Py_DECREF(new_iid);
        /* InternedData.debug_annotation_string_values (29): {iid, str} */
        Py_ssize_t inner = 1 + vlen((uint64_t)next) + 1 + vlen((uint64_t)len) + len;
        Scratch *d = &self->defs;
        if (scratch_put(d, "\xea\x01", 2) < 0 || scratch_varint(d, (uint64_t)inner) < 0
            || scratch_put(d, "\x08", 1) < 0 || scratch_varint(d, (uint64_t)next) < 0
            || scratch_put(d, "\x12", 1) < 0 || scratch_varint(d, (uint64_t)len) < 0
            || scratch_put(d, data, len) < 0)
            rc = -1;
        else if (scratch_put(ann, "\x88\x01", 2) < 0 || scratch_varint(ann, (uint64_t)next) < 0)
            rc = -1;
    }
    else if (scratch_put(ann, "\x32", 1) < 0 || scratch_varint(ann, (uint64_t)len) < 0
             || scratch_put(ann, data, len) < 0) {
        rc = -1;
    }
    Py_DECREF(encoded);
    return rc;
}

/* Encode one arg (checked by arg_ok) onto self->event; ``ann`` is scratch space. */
static int
put_arg(Encoder *self, Scratch *ann, PyObject *key, PyObject *value)
{
    PyTypeObject *cls = Py_TYPE(value);
    long iid = arg_iid(self, key);
    if (iid <= 0) { /* cannot happen after args_ok, unless a __eq__ changed things */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "annotation names changed while encoding");
        return -1;
    }
    if (cls == &PyDict_Type) {
        PyObject *cached = cached_dict_annotation(self, key, value);
        if (cached == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "annotation cache changed while encoding");
            return -1;
        }
        return scratch_put(&self->event, PyBytes_AS_STRING(cached), PyBytes_GET_SIZE(cached));
    }
    ann->len = 0;
    char head[4];
    char *h = head;
    *h++ = 0x08;
    h = put_varint(h, (uint64_t)iid);
    if (scratch_put(ann, head, h - head) < 0)
        return -1;
    if (cls == &PyLong_Type) {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (scratch_put(ann, "\x20", 1) < 0 || scratch_varint(ann, (uint64_t)v) < 0)
            return -1;
    }
    else if (cls == &PyUnicode_Type) {
        if (put_string_value(self, ann, value) < 0)
            return -1;
    }
    else if (cls == &PyFloat_Type) {
        char d[9];
        d[0] = 0x29;
        if (PACK8(PyFloat_AS_DOUBLE(value), d + 1) < 0 || scratch_put(ann, d, 9) < 0)
            return -1;
    }
    else if (cls == &PyBool_Type) {
        if (scratch_put(ann, value == Py_True ? "\x10\x01" : "\x10\x00", 2) < 0)
            return -1;
    }
    else {
        PyErr_SetString(PyExc_RuntimeError, "annotation changed while encoding");
        return -1;
    }
    if (scratch_put(&self->event, "\x22", 1) < 0
        || scratch_varint(&self->event, (uint64_t)ann->len) < 0
        || scratch_put(&self->event, ann->data, ann->len) < 0)
        return -1;
    return 0;
}

/* Encode the args (already checked by args_ok) onto self->event, string
 * definitions onto self->defs. */
static int
put_args(Encoder *self, PyObject *args)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int rc = 0;
    while (rc == 0 && PyDict_Next(args, &pos, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value);
        rc = put_arg(self, &self->ann, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
    }
    return rc;
}

/* ----------------------------------------------------------------- events */

/* An event with args, as _event + _fast_event take it. Returns a new reference
 * (Py_None) when written, NULL on error, or sets *to_python when Python must
 * take the call (nothing was changed). */
static PyObject *
args_event(Encoder *self, int kind, PyObject *track, PyObject *name, PyObject *ts,
           PyObject *category, PyObject *args, PyObject *flows, PyObject *tflows,
           int *to_python)
{
    *to_python = 1;
    PyObject *kind_obj = PyLong_FromLong(kind);
    if (kind_obj == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(4, kind_obj, track, name, category);
    Py_DECREF(kind_obj);
    if (key == NULL)
        return NULL;
    PyObject *head = PyDict_GetItemWithError(self->heads, key);
    Py_DECREF(key);
    if (head == NULL) {
        if (PyErr_Occurred())
            PyErr_Clear(); /* e.g. an unhashable track: Python says what is wrong */
        return NULL;
    }
    if (!PyBytes_CheckExact(head))
        return NULL;
    long long when = 0;
    if (ts != Py_None && !units_of(self, ts, &when))
        return NULL;
    if (!flows_ok(flows) || !flows_ok(tflows))
        return NULL;
    int ok = args_ok(self, args);
    if (ok < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (!ok)
        return NULL;
    long long last;
    if (!get_last(self, &last))
        return NULL;
    if (self->unit != 1 && when > (long long)(UINT64_MAX / (uint64_t)self->unit))
        return NULL;
    *to_python = 0;
    self->n_args++;
    Py_INCREF(head); /* the encoding below may run Python code (hashes of string values) */
    PyObject *clock_obj = NULL;
    if (ts == Py_None) {
        int got = read_clock(self, &when, &clock_obj);
        if (got < 0) {
            Py_DECREF(head);
            return NULL;
        }
        if (got == 1 && self->unit != 1 && when > (long long)(UINT64_MAX / (uint64_t)self->unit)) {
            got = 0;
            clock_obj = PyLong_FromLongLong(when);
            if (clock_obj == NULL) {
                Py_DECREF(head);
                return NULL;
            }
        }
        (void)got;
    }
    Scratch *e = &self->event;
    self->event.len = 0;
    self->defs.len = 0;
    int rc = scratch_put(e, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
    Py_DECREF(head);
    if (rc == 0)
        rc = put_flows(e, flows, 0xf9, 0x02);
    if (rc == 0)
        rc = put_flows(e, tflows, 0x81, 0x03);
    if (rc == 0)
        rc = put_args(self, args);
    if (rc < 0) {
        Py_XDECREF(clock_obj);
        return NULL;
    }
    /* body = seq 5A len(event) event [62 len(defs) defs] */
    Py_ssize_t seq_len = PyBytes_GET_SIZE(self->seq);
    Py_ssize_t body_len = seq_len + 1 + vlen((uint64_t)e->len) + e->len;
    if (self->defs.len)
        body_len += 1 + vlen((uint64_t)self->defs.len) + self->defs.len;
    Scratch *body = &self->body;
    body->len = 0;
    if (scratch_reserve(body, body_len) < 0) {
        Py_XDECREF(clock_obj);
        return NULL;
    }
    char *p = body->data;
    memcpy(p, PyBytes_AS_STRING(self->seq), (size_t)seq_len);
    p += seq_len;
    *p++ = 0x5a;
    p = put_varint(p, (uint64_t)e->len);
    memcpy(p, e->data, (size_t)e->len);
    p += e->len;
    if (self->defs.len) {
        *p++ = 0x62;
        p = put_varint(p, (uint64_t)self->defs.len);
        memcpy(p, self->defs.data, (size_t)self->defs.len);
        p += self->defs.len;
    }
    body->len = p - body->data;
    if (clock_obj == NULL && !get_last(self, &last)) {
        PyErr_SetString(PyExc_RuntimeError, "the writer's delta chain changed while encoding");
        return NULL;
    }
    PyObject *result = NULL;
    if (clock_obj != NULL) {
        result = python_emit(self, clock_obj, body->data, body->len, NULL, 0);
        Py_DECREF(clock_obj);
        if (result == NULL)
            return NULL;
        Py_DECREF(result);
    }
    else if (emit(self, when, last, body->data, body->len, NULL, 0) != 0) {
        return NULL;
    }
    if (maybe_flush(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A cached event (no args): frames[3] is its body. */
static PyObject *
cached_event(Encoder *self, PyObject *frames, PyObject *ts, const char *value,
             Py_ssize_t value_len, int *to_python)
{
    *to_python = 1;
    if (!PyTuple_CheckExact(frames) || PyTuple_GET_SIZE(frames) != 4)
        return NULL;
    PyObject *body = PyTuple_GET_ITEM(frames, 3);
    if (!PyBytes_CheckExact(body))
        return NULL;
    long long when = 0, last;
    if (ts != Py_None && !units_of(self, ts, &when))
        return NULL;
    if (!get_last(self, &last))
        return NULL;
    *to_python = 0;
    self->n_cached++;
    Py_INCREF(body);
    PyObject *clock_obj = NULL;
    if (ts == Py_None) {
        int got = read_clock(self, &when, &clock_obj);
        if (got < 0) {
            Py_DECREF(body);
            return NULL;
        }
        if (!self->realtime_clock && clock_obj == NULL && !get_last(self, &last)) {
            /* a clock of Python's ran: it may have written events */
            Py_DECREF(body);
            PyErr_SetString(PyExc_RuntimeError, "the writer's delta chain changed");
            return NULL;
        }
    }
    if (clock_obj == NULL && when < last && self->unit != 1
        && when > (long long)(UINT64_MAX / (uint64_t)self->unit)) {
        clock_obj = PyLong_FromLongLong(when);
        if (clock_obj == NULL) {
            Py_DECREF(body);
            return NULL;
        }
    }
    int rc;
    if (clock_obj != NULL) {
        /* A reading the fast path cannot encode: Python's _emit (it raises for a
         * timestamp that is not an int, as Python's hot path would). */
        PyObject *r = python_emit(self, clock_obj, PyBytes_AS_STRING(body),
                                  PyBytes_GET_SIZE(body), value, value_len);
        Py_DECREF(clock_obj);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    else {
        rc = emit(self, when, last, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), value,
                  value_len);
    }
    Py_DECREF(body);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
is_empty(PyObject *obj)
{
    /* None, or an empty exact dict/list/tuple: what the Python methods treat as "none". */
    if (obj == Py_None)
        return 1;
    if (PyDict_CheckExact(obj))
        return PyDict_GET_SIZE(obj) == 0;
    if (PyList_CheckExact(obj))
        return PyList_GET_SIZE(obj) == 0;
    if (PyTuple_CheckExact(obj))
        return PyTuple_GET_SIZE(obj) == 0;
    return -1; /* something else: Python decides */
}

static PyObject *
named_event(Encoder *self, int kind, PyObject *cache, PyObject *fb, PyObject *const *args,
            Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *names[7] = {kw_track, kw_name, kw_ts, kw_category, kw_args, kw_flows, kw_tflows};
    PyObject *a[7];
    if (self->closed || !parse(args, nargs, kwnames, names, 7, 3, 2, a))
        return fallback(self, fb, args, nargs, kwnames);
    PyObject *track = a[0], *name = a[1], *ts = a[2], *category = a[3];
    int no_args = is_empty(a[4]), no_flows = is_empty(a[5]), no_tflows = is_empty(a[6]);
    if (no_args < 0 || no_flows < 0 || no_tflows < 0)
        return fallback(self, fb, args, nargs, kwnames);
    int to_python;
    PyObject *r;
    if (!(no_args && no_flows && no_tflows)) {
        if (!PyDict_CheckExact(a[4]) || !PyUnicode_CheckExact(name)
            || !(category == Py_None || PyUnicode_CheckExact(category)))
            return fallback(self, fb, args, nargs, kwnames);
        r = args_event(self, kind, track, name, ts, category, a[4],
                       no_flows ? Py_None : a[5], no_tflows ? Py_None : a[6], &to_python);
    }
    else {
        PyObject *per_track = PyDict_GetItemWithError(cache, track);
        if (per_track == NULL || !PyDict_CheckExact(per_track)) {
            PyErr_Clear();
            return fallback(self, fb, args, nargs, kwnames);
        }
        PyObject *frames;
        if (category == Py_None) {
            frames = PyDict_GetItemWithError(per_track, name);
        }
        else {
            PyObject *key = PyTuple_Pack(2, name, category);
            if (key == NULL)
                return NULL;
            frames = PyDict_GetItemWithError(per_track, key);
            Py_DECREF(key);
        }
        if (frames == NULL) {
            PyErr_Clear();
            return fallback(self, fb, args, nargs, kwnames);
        }
        r = cached_event(self, frames, ts, NULL, 0, &to_python);
        if (r != NULL && maybe_flush(self) < 0) {
            Py_DECREF(r);
            return NULL;
        }
    }
    if (r == NULL && to_python && !PyErr_Occurred())
        return fallback(self, fb, args, nargs, kwnames);
    return r;
}

/* ------------------------------------------------------------ held calls */

/* A call made while in_time_order holds: appended to the held list as the Python
 * holders in _late.py would, as (sort key, ts, bound method, args, kwargs), or
 * handed to the Python holder (`which`: 0 begin, 1 end, 2 instant, 3 counter) for
 * anything but positional (track, name or value, ts) with ts an int >= 0. */
/* The Python holder takes the call. Nothing is held by C meanwhile: what the holder
 * writes at once (a call on an unhashable track) goes to the writer, not back here. */
static PyObject *
delegate(Encoder *self, int which, PyObject *const *args, Py_ssize_t nargs,
         PyObject *kwnames)
{
    PyObject *holder = Py_NewRef(PyTuple_GET_ITEM(self->holders, which));
    PyObject *held = self->held;
    self->held = NULL;
    PyObject *r = PyObject_Vectorcall(holder, args, nargs, kwnames);
    self->held = held;
    Py_DECREF(holder);
    return r;
}

static PyObject *
hold_call(Encoder *self, int which, PyObject *const *args, Py_ssize_t nargs,
          PyObject *kwnames)
{
    Py_ssize_t ts_pos = which == 1 ? 1 : 2;
    if (nargs != ts_pos + 1 || !PyLong_CheckExact(args[ts_pos]))
        return delegate(self, which, args, nargs, kwnames);
    if (kwnames != NULL) { /* one given twice: the holder's call raises, as Python's would */
        PyObject *given[4] = {kw_track, kw_name, kw_value, kw_ts};
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++)
            for (int g = 0; g < 4; g++)
                if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, k), given[g]) == 0)
                    return delegate(self, which, args, nargs, kwnames);
    }
    PyObject *track = args[0], *ts = args[ts_pos];
    int overflow = 0;
    long long when = PyLong_AsLongLongAndOverflow(ts, &overflow);
    if (overflow || when < 0) {
        if (PyErr_Occurred())
            return NULL;
        return delegate(self, which, args, nargs, kwnames); /* it says what is wrong */
    }
    PyObject *method = PyTuple_GET_ITEM(self->bound, which);
    PyObject *last = PyDict_GetItemWithError(self->held_keys, track);
    long long last_v = -1;
    if (last == NULL) {
        if (PyErr_Occurred()) {
            /* An unhashable track: the writer says what is wrong, now (not held). */
            PyErr_Clear();
            PyObject *held = self->held;
            self->held = NULL;
            PyObject *r = PyObject_Vectorcall(method, args, nargs, kwnames);
            self->held = held;
            return r;
        }
    }
    else {
        /* The Python holders may have keyed the track by a timestamp past a long long. */
        if (!PyLong_CheckExact(last))
            return delegate(self, which, args, nargs, kwnames);
        last_v = PyLong_AsLongLongAndOverflow(last, &overflow);
        if (overflow || (last_v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return delegate(self, which, args, nargs, kwnames);
        }
    }
    PyObject *key = last;
    if (last_v <= when) {
        if (PyDict_SetItem(self->held_keys, track, ts) < 0)
            return NULL;
        key = ts;
    }
    PyObject *positional = PyTuple_New(nargs);
    if (positional == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(positional, i, Py_NewRef(args[i]));
    PyObject *kw;
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        kw = Py_NewRef(self->no_kwargs);
    }
    else {
        kw = PyDict_New();
        if (kw == NULL) {
            Py_DECREF(positional);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) < 0) {
                Py_DECREF(kw);
                Py_DECREF(positional);
                return NULL;
            }
        }
    }
    PyObject *call = PyTuple_Pack(5, key, ts, method, positional, kw);
    Py_DECREF(positional);
    Py_DECREF(kw);
    if (call == NULL)
        return NULL;
    /* Out of the cycle collector's sight: a held call lives until the batch is written,
     * through collections that each walked it, and was carried into older generations
     * (in a level-1 Ray run, 1-2 full collections of the driver's whole heap per 2000
     * tasks, 17-32 us a task; 0-1 and 0-16 untracked). The list frees them; what they
     * refer to is referred to elsewhere too. */
    PyObject_GC_UnTrack(call);
    PyObject_GC_UnTrack(positional);
    if (kw != self->no_kwargs)
        PyObject_GC_UnTrack(kw);
    int rc = PyList_Append(self->held, call);
    Py_DECREF(call);
    if (rc < 0)
        return NULL;
    if (PyList_GET_SIZE(self->held) >= self->max_held) { /* memory stays bounded */
        PyObject *held = Py_NewRef(self->held);
        PyObject *r = PyObject_CallOneArg(self->write_held, held);
        Py_DECREF(held);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* Encoder.hold(held, keys, holders, write_held, max_held): calls are held from now. */
static PyObject *
Encoder_hold(Encoder *self, PyObject *args)
{
    PyObject *held, *keys, *holders, *write_held;
    Py_ssize_t max_held;
    if (!PyArg_ParseTuple(args, "O!O!O!On", &PyList_Type, &held, &PyDict_Type, &keys,
                          &PyTuple_Type, &holders, &write_held, &max_held))
        return NULL;
    if (PyTuple_GET_SIZE(holders) != 4 || max_held < 1) {
        PyErr_SetString(PyExc_ValueError, "hold(): four holders and a positive limit");
        return NULL;
    }
    const char *names[4] = {"begin", "end", "instant", "counter"};
    PyObject *bound = PyTuple_New(4);
    if (bound == NULL)
        return NULL;
    for (int i = 0; i < 4; i++) {
        PyObject *m = PyObject_GetAttrString((PyObject *)self, names[i]);
        if (m == NULL) {
            Py_DECREF(bound);
            return NULL;
        }
        PyTuple_SET_ITEM(bound, i, m);
    }
    if (self->no_kwargs == NULL) {
        self->no_kwargs = PyDict_New();
        if (self->no_kwargs == NULL) {
            Py_DECREF(bound);
            return NULL;
        }
    }
    Py_XSETREF(self->bound, bound);
    Py_XSETREF(self->held, Py_NewRef(held));
    Py_XSETREF(self->held_keys, Py_NewRef(keys));
    Py_XSETREF(self->holders, Py_NewRef(holders));
    Py_XSETREF(self->write_held, Py_NewRef(write_held));
    self->max_held = max_held;
    Py_RETURN_NONE;
}

/* Encoder.unhold(): calls are written again as they come. */
static PyObject *
Encoder_unhold(Encoder *self, PyObject *Py_UNUSED(ignored))
{
    Py_CLEAR(self->held);
    Py_CLEAR(self->held_keys);
    Py_CLEAR(self->holders);
    Py_CLEAR(self->bound);
    Py_CLEAR(self->write_held);
    Py_RETURN_NONE;
}

/* Encoder.replay(calls): each held call (key, ts, method, args, kwargs) made, in order,
 * with nothing held meanwhile; the first that raises stops it (the rest are dropped). */
static PyObject *
Encoder_replay(Encoder *self, PyObject *calls)
{
    if (!PyList_CheckExact(calls)) {
        PyErr_SetString(PyExc_TypeError, "replay() takes a list");
        return NULL;
    }
    PyObject *held = self->held; /* the limit's write, in the middle of a block */
    self->held = NULL;
    PyObject *result = Py_None;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++) {
        PyObject *call = PyList_GET_ITEM(calls, i);
        if (!PyTuple_CheckExact(call) || PyTuple_GET_SIZE(call) != 5
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(call, 3))) {
            PyErr_SetString(PyExc_TypeError, "replay(): not a held call");
            result = NULL;
            break;
        }
        Py_INCREF(call);
        PyObject *kw = PyTuple_GET_ITEM(call, 4);
        PyObject *r = PyObject_Call(PyTuple_GET_ITEM(call, 2), PyTuple_GET_ITEM(call, 3),
                                    PyDict_Check(kw) && PyDict_GET_SIZE(kw) ? kw : NULL);
        Py_DECREF(call);
        if (r == NULL) {
            result = NULL;
            break;
        }
        Py_DECREF(r);
    }
    self->held = held;
    return result == NULL ? NULL : Py_NewRef(Py_None);
}

static PyObject *
Encoder_begin(Encoder *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->held != NULL)
        return hold_call(self, 0, args, nargs, kwnames);
    return named_event(self, KIND_BEGIN, self->begin_cache, self->fb_begin, args, nargs, kwnames);
}

static PyObject *
Encoder_instant(Encoder *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->held != NULL)
        return hold_call(self, 2, args, nargs, kwnames);
    return named_event(self, KIND_INSTANT, self->instant_cache, self->fb_instant, args, nargs,
                       kwnames);
}

static PyObject *
Encoder_end(Encoder *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->held != NULL)
        return hold_call(self, 1, args, nargs, kwnames);
    PyObject *names[4] = {kw_track, kw_ts, kw_args, kw_flows};
    PyObject *a[4];
    if (self->closed || !parse(args, nargs, kwnames, names, 4, 2, 1, a))
        return fallback(self, self->fb_end, args, nargs, kwnames);
    PyObject *track = a[0], *ts = a[1];
    int no_args = is_empty(a[2]), no_flows = is_empty(a[3]);
    if (no_args < 0 || no_flows < 0)
        return fallback(self, self->fb_end, args, nargs, kwnames);
    int to_python;
    PyObject *r;
    if (!(no_args && no_flows)) {
        if (!PyDict_CheckExact(a[2]))
            return fallback(self, self->fb_end, args, nargs, kwnames);
        r = args_event(self, KIND_END, track, Py_None, ts, Py_None, a[2],
                       no_flows ? Py_None : a[3], Py_None, &to_python);
    }
    else {
        PyObject *frames = PyDict_GetItemWithError(self->end_frames, track);
        if (frames == NULL || frames == Py_None) {
            PyErr_Clear();
            return fallback(self, self->fb_end, args, nargs, kwnames);
        }
        r = cached_event(self, frames, ts, NULL, 0, &to_python);
        if (r != NULL && maybe_flush(self) < 0) {
            Py_DECREF(r);
            return NULL;
        }
    }
    if (r == NULL && to_python && !PyErr_Occurred())
        return fallback(self, self->fb_end, args, nargs, kwnames);
    return r;
}

static PyObject *
Encoder_counter(Encoder *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->held != NULL)
        return hold_call(self, 3, args, nargs, kwnames);
    PyObject *names[3] = {kw_track, kw_value, kw_ts};
    PyObject *a[3];
    if (self->closed || !parse(args, nargs, kwnames, names, 3, 3, 2, a))
        return fallback(self, self->fb_counter, args, nargs, kwnames);
    PyObject *track = a[0], *value = a[1], *ts = a[2];
    PyObject *bodies = PyDict_GetItemWithError(self->counter_bodies, track);
    if (bodies == NULL || !PyTuple_CheckExact(bodies) || PyTuple_GET_SIZE(bodies) != 11) {
        PyErr_Clear();
        return fallback(self, self->fb_counter, args, nargs, kwnames);
    }
    char encoded[10];
    Py_ssize_t n;
    PyObject *frames;
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return fallback(self, self->fb_counter, args, nargs, kwnames);
        }
        n = put_varint(encoded, (uint64_t)v) - encoded;
        frames = PyTuple_GET_ITEM(bodies, n);
    }
    else if (PyFloat_CheckExact(value)) {
        if (PACK8(PyFloat_AS_DOUBLE(value), encoded) < 0)
            return NULL;
        n = 8;
        frames = PyTuple_GET_ITEM(bodies, 0);
    }
    else {
        return fallback(self, self->fb_counter, args, nargs, kwnames);
    }
    long long when, last;
    if ((ts != Py_None && !units_of(self, ts, &when)) || !get_last(self, &last))
        return fallback(self, self->fb_counter, args, nargs, kwnames);
    PyObject *dedupe_obj = PyObject_GetAttr(track, str_dedupe);
    if (dedupe_obj == NULL) {
        PyErr_Clear();
        return fallback(self, self->fb_counter, args, nargs, kwnames);
    }
    int dedupe = PyObject_IsTrue(dedupe_obj);
    Py_DECREF(dedupe_obj);
    if (dedupe < 0)
        return NULL;
    if (dedupe) {
        PyObject *previous = PyDict_GetItemWithError(self->counter_last, track);
        if (previous == NULL && PyErr_Occurred())
            return NULL;
        if (previous != NULL) {
            /* Python's ==, not identity: a NaN is never equal to the last NaN. */
            Py_INCREF(previous);
            PyObject *eq = PyObject_RichCompare(previous, value, Py_EQ);
            Py_DECREF(previous);
            if (eq == NULL)
                return NULL;
            int same = PyObject_IsTrue(eq);
            Py_DECREF(eq);
            if (same < 0)
                return NULL;
            if (same)
                Py_RETURN_NONE;
        }
    }
    int to_python;
    PyObject *r = cached_event(self, frames, ts, encoded, n, &to_python);
    if (r == NULL) {
        if (to_python && !PyErr_Occurred())
            return fallback(self, self->fb_counter, args, nargs, kwnames);
        return NULL;
    }
    if (dedupe && PyDict_SetItem(self->counter_last, track, value) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    if (maybe_flush(self) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

/* The writer's clock in units, as its events read it (with a realtime clock,
 * what writer._clock becomes: one reading, never going back, for both). */
static PyObject *
Encoder_clock(Encoder *self, PyObject *Py_UNUSED(ignored))
{
    long long when;
    PyObject *obj;
    int got = read_clock(self, &when, &obj);
    if (got < 0)
        return NULL;
    if (got == 0)
        return obj; /* a reading C does not take: as the clock gave it */
    return PyLong_FromLongLong(when);
}

static PyObject *
Encoder_stats(Encoder *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{sKsKsK}", "cached", self->n_cached, "args", self->n_args, "python",
                         self->n_python);
}

static PyObject *
Encoder_stop(Encoder *self, PyObject *Py_UNUSED(ignored))
{
    self->closed = 1;
    Py_RETURN_NONE;
}

/* -------------------------------------------------------- counter sequences */

/* CounterSequence.sample, in C: one COUNTER event for the tracks whose value
 * changed, on the sequence's own clock (see CounterSequence in writer.py). */
typedef struct {
    PyObject_HEAD
    PyObject *sequence;  /* the CounterSequence */
    PyObject *sdict;     /* its __dict__: _last_units and samples_written live there */
    Encoder *encoder;    /* its writer's encoder: the buffer, and whether it closed */
    PyObject *last;      /* list: the last value written per track */
    PyObject *uuids;     /* list of bytes: varint uuid per track */
    PyObject *extra_uuids;
    PyObject *seq;       /* bytes: trusted_packet_sequence_id field */
    PyObject *fallback;  /* CounterSequence.sample (the Python function) */
    long long unit;
    unsigned long long n_fast, n_python;
} Sequence;

static PyObject *str_last_units, *str_samples_written;

static PyObject *
sequence_fallback(Sequence *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    self->n_python++;
    return call_python(self->fallback, self->sequence, args, nargs, kwnames);
}

static PyObject *
Sequence_sample(Sequence *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->sequence == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Sequence is not bound to a CounterSequence");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(self->uuids);
    Encoder *enc = self->encoder;
    if (kwnames != NULL || enc->closed || nargs != 1 + n || n > 9 || PyList_GET_SIZE(self->last) != n)
        goto python;
    PyObject *ts = args[0];
    long long when;
    if (!PyLong_CheckExact(ts))
        goto python;
    {
        int overflow = 0;
        when = PyLong_AsLongLongAndOverflow(ts, &overflow);
        if (overflow || (when == -1 && PyErr_Occurred()) || when < 0) {
            PyErr_Clear();
            goto python;
        }
    }
    PyObject *units_obj = PyDict_GetItemWithError(self->sdict, str_last_units);
    if (units_obj == NULL || !PyLong_CheckExact(units_obj)) { /* None: the setup packet is Python's */
        PyErr_Clear();
        goto python;
    }
    long long last_units = PyLong_AsLongLong(units_obj);
    if (last_units == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        goto python;
    }
    int changed[9];
    long long values[9];
    int nchanged = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = args[1 + i];
        if (value == Py_None)
            continue;
        if (!PyLong_CheckExact(value))
            goto python;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            goto python;
        }
        PyObject *previous = PyList_GET_ITEM(self->last, i);
        if (previous != Py_None) {
            if (!PyLong_CheckExact(previous))
                goto python;
            long long p = PyLong_AsLongLongAndOverflow(previous, &overflow);
            if (!overflow && !(p == -1 && PyErr_Occurred()) && p == v)
                continue;
            PyErr_Clear();
        }
        changed[nchanged] = (int)i;
        values[nchanged] = v;
        nchanged++;
    }
    if (nchanged == 0) {
        self->n_fast++;
        Py_RETURN_NONE;
    }
    self->n_fast++;
    /* event: 48 04 [58 uuid] F0 01 v0 [F8 01 uuid ...] [60 v ...] */
    char event[16 + 9 * 24];
    char *p = event;
    int first = changed[0];
    *p++ = 0x48;
    *p++ = 0x04;
    if (first != 0) {
        PyObject *u = PyList_GET_ITEM(self->uuids, first);
        if (!PyBytes_CheckExact(u) || PyBytes_GET_SIZE(u) > 10)
            goto python;
        *p++ = 0x58;
        memcpy(p, PyBytes_AS_STRING(u), (size_t)PyBytes_GET_SIZE(u));
        p += PyBytes_GET_SIZE(u);
    }
    *p++ = (char)0xf0;
    *p++ = 0x01;
    p = put_varint(p, (uint64_t)values[0]);
    int rest = nchanged - 1;
    if (rest && (first != 0 || changed[nchanged - 1] != rest)) {
        for (int k = 1; k < nchanged; k++) {
            PyObject *u = PyList_GET_ITEM(self->extra_uuids, changed[k]);
            if (!PyBytes_CheckExact(u) || PyBytes_GET_SIZE(u) > 12)
                goto python;
            memcpy(p, PyBytes_AS_STRING(u), (size_t)PyBytes_GET_SIZE(u));
            p += PyBytes_GET_SIZE(u);
        }
    }
    for (int k = 1; k < nchanged; k++) {
        *p++ = 0x60;
        p = put_varint(p, (uint64_t)values[k]);
    }
    Py_ssize_t event_len = p - event;
    long long units = when / self->unit;
    int absolute = units < last_units;
    uint64_t stamp = absolute ? (uint64_t)when : (uint64_t)(units - last_units);
    Py_ssize_t seq_len = PyBytes_GET_SIZE(self->seq);
    Py_ssize_t inner = seq_len + 1 + vlen((uint64_t)event_len) + event_len + (absolute ? 3 : 0)
                       + 1 + vlen(stamp);
    Py_ssize_t total = 1 + vlen((uint64_t)inner) + inner;
    PyObject *buf = enc->buf;
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, old + total) < 0)
        return NULL;
    char *q = PyByteArray_AS_STRING(buf) + old;
    *q++ = 0x0a;
    q = put_varint(q, (uint64_t)inner);
    memcpy(q, PyBytes_AS_STRING(self->seq), (size_t)seq_len);
    q += seq_len;
    *q++ = 0x5a;
    q = put_varint(q, (uint64_t)event_len);
    memcpy(q, event, (size_t)event_len);
    q += event_len;
    if (absolute) {
        *q++ = (char)0xd0;
        *q++ = 0x03;
        *q++ = 0x06;
    }
    *q++ = 0x40;
    put_varint(q, stamp);
    if (!absolute) {
        PyObject *u = PyLong_FromLongLong(units);
        if (u == NULL || PyDict_SetItem(self->sdict, str_last_units, u) < 0) {
            Py_XDECREF(u);
            return NULL;
        }
        Py_DECREF(u);
    }
    for (int k = 0; k < nchanged; k++) {
        PyObject *value = args[1 + changed[k]];
        Py_INCREF(value);
        if (PyList_SetItem(self->last, changed[k], value) < 0)
            return NULL;
    }
    PyObject *written = PyDict_GetItemWithError(self->sdict, str_samples_written);
    if (written != NULL) {
        PyObject *more = PyLong_FromLongLong(PyLong_AsLongLong(written) + nchanged);
        if (more == NULL || PyDict_SetItem(self->sdict, str_samples_written, more) < 0) {
            Py_XDECREF(more);
            return NULL;
        }
        Py_DECREF(more);
    }
    else if (PyErr_Occurred()) {
        return NULL;
    }
    if (maybe_flush(enc) < 0)
        return NULL;
    Py_RETURN_NONE;
python:
    return sequence_fallback(self, args, nargs, kwnames);
}

static int
Sequence_init(Sequence *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sequence", "encoder", NULL};
    PyObject *sequence, *encoder;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &sequence, &encoder))
        return -1;
    if (!PyObject_TypeCheck(encoder, &EncoderType) || ((Encoder *)encoder)->writer == NULL) {
        PyErr_SetString(PyExc_TypeError, "encoder must be a bound Encoder");
        return -1;
    }
    PyObject *sdict = PyObject_GenericGetDict(sequence, NULL);
    if (sdict == NULL)
        return -1;
    PyObject *last = PyObject_GetAttrString(sequence, "_last");
    PyObject *uuids = PyObject_GetAttrString(sequence, "_uuids");
    PyObject *extra = PyObject_GetAttrString(sequence, "_extra_uuids");
    PyObject *seq = PyObject_GetAttrString(sequence, "_seq");
    PyObject *unit = PyObject_GetAttrString(sequence, "time_unit_ns");
    PyObject *fb = PyObject_GetAttrString((PyObject *)Py_TYPE(sequence), "sample");
    if (last == NULL || uuids == NULL || extra == NULL || seq == NULL || unit == NULL || fb == NULL
        || !PyList_CheckExact(last) || !PyList_CheckExact(uuids) || !PyList_CheckExact(extra)
        || !PyBytes_CheckExact(seq)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "not a CounterSequence this encoder knows");
        goto error;
    }
    self->unit = PyLong_AsLongLong(unit);
    if (self->unit < 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "time_unit_ns must be positive");
        goto error;
    }
    Py_DECREF(unit);
    Py_XSETREF(self->sequence, Py_NewRef(sequence));
    Py_XSETREF(self->sdict, sdict);
    Py_XSETREF(self->encoder, (Encoder *)Py_NewRef(encoder));
    Py_XSETREF(self->last, last);
    Py_XSETREF(self->uuids, uuids);
    Py_XSETREF(self->extra_uuids, extra);
    Py_XSETREF(self->seq, seq);
    Py_XSETREF(self->fallback, fb);
    return 0;
error:
    Py_DECREF(sdict);
    Py_XDECREF(last);
    Py_XDECREF(uuids);
    Py_XDECREF(extra);
    Py_XDECREF(seq);
    Py_XDECREF(unit);
    Py_XDECREF(fb);
    return -1;
}

static int
Sequence_traverse(Sequence *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sequence);
    Py_VISIT(self->sdict);
    Py_VISIT(self->encoder);
    Py_VISIT(self->last);
    Py_VISIT(self->uuids);
    Py_VISIT(self->extra_uuids);
    Py_VISIT(self->seq);
    Py_VISIT(self->fallback);
    return 0;
}

static int
Sequence_clear(Sequence *self)
{
    Py_CLEAR(self->sequence);
    Py_CLEAR(self->sdict);
    Py_CLEAR(self->encoder);
    Py_CLEAR(self->last);
    Py_CLEAR(self->uuids);
    Py_CLEAR(self->extra_uuids);
    Py_CLEAR(self->seq);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
Sequence_dealloc(Sequence *self)
{
    PyObject_GC_UnTrack(self);
    Sequence_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Sequence_stats(Sequence *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{sKsK}", "fast", self->n_fast, "python", self->n_python);
}

static PyMethodDef Sequence_methods[] = {
    {"sample", (PyCFunction)(void (*)(void))Sequence_sample, METH_FASTCALL | METH_KEYWORDS,
     "CounterSequence.sample, in C (see tracer.format.writer)."},
    {"stats", (PyCFunction)Sequence_stats, METH_NOARGS,
     "How many samples were taken here and handed to Python."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SequenceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.format._speedups.Sequence",
    .tp_doc = "CounterSequence.sample of one counter sequence, in C.",
    .tp_basicsize = sizeof(Sequence),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sequence_init,
    .tp_dealloc = (destructor)Sequence_dealloc,
    .tp_traverse = (traverseproc)Sequence_traverse,
    .tp_clear = (inquiry)Sequence_clear,
    .tp_methods = Sequence_methods,
};

/* ------------------------------------------------------------- lifecycle */

static PyObject *
attr(PyObject *obj, const char *name)
{
    return PyObject_GetAttrString(obj, name);
}

static int
Encoder_init(Encoder *self, PyObject *args, PyObject *kwds)
{
    PyObject *writer;
    static char *kwlist[] = {"writer", "realtime_clock", NULL};
    int realtime = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p", kwlist, &writer, &realtime))
        return -1;
    PyObject *wdict = PyObject_GenericGetDict(writer, NULL);
    if (wdict == NULL)
        return -1;
    PyObject *type = (PyObject *)Py_TYPE(writer);
    struct {
        PyObject **slot;
        PyObject *from;
        const char *name;
    } fields[] = {
        {&self->buf, writer, "_buf"},
        {&self->begin_cache, writer, "_begin_cache"},
        {&self->instant_cache, writer, "_instant_cache"},
        {&self->end_frames, writer, "_end_frames"},
        {&self->counter_bodies, writer, "_counter_bodies"},
        {&self->counter_last, writer, "_counter_last"},
        {&self->heads, writer, "_heads"},
        {&self->arg_names, writer, "_arg_names"},
        {&self->string_values, writer, "_string_values"},
        {&self->seen_once, writer, "_seen_once"},
        {&self->seen_twice, writer, "_seen_twice"},
        {&self->arg_cache, writer, "_arg_cache"},
        {&self->clock, writer, "_clock"},
        {&self->seq, writer, "_seq"},
        {&self->fb_begin, type, "begin"},
        {&self->fb_end, type, "end"},
        {&self->fb_instant, type, "instant"},
        {&self->fb_counter, type, "counter"},
    };
    PyObject *limit = NULL, *intern_limit = NULL, *unit = NULL;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        PyObject *value = attr(fields[i].from, fields[i].name);
        if (value == NULL)
            goto error;
        Py_XSETREF(*fields[i].slot, value);
    }
    if (!PyByteArray_CheckExact(self->buf) || !PyBytes_CheckExact(self->seq)
        || !PyDict_CheckExact(self->begin_cache) || !PyDict_CheckExact(self->instant_cache)
        || !PyDict_CheckExact(self->end_frames) || !PyDict_CheckExact(self->counter_bodies)
        || !PyDict_CheckExact(self->counter_last) || !PyDict_CheckExact(self->heads)
        || !PyDict_CheckExact(self->arg_names) || !PyDict_CheckExact(self->string_values)
        || !PySet_CheckExact(self->seen_once) || !PySet_CheckExact(self->seen_twice)
        || !PyDict_CheckExact(self->arg_cache)) {
        PyErr_SetString(PyExc_TypeError, "not a TraceWriter this encoder knows");
        goto error;
    }
    limit = attr(writer, "_limit");
    intern_limit = attr(writer, "_intern_limit");
    unit = attr(writer, "time_unit_ns");
    if (limit == NULL || intern_limit == NULL || unit == NULL)
        goto error;
    {
        PyObject *last = attr(writer, "_last"); /* the trace's start, in units */
        if (last == NULL)
            goto error;
        self->last_read = PyLong_AsLongLong(last);
        Py_DECREF(last);
        if (self->last_read == -1 && PyErr_Occurred())
            goto error;
    }
    self->limit = PyLong_AsSsize_t(limit);
    self->intern_limit = PyLong_AsSsize_t(intern_limit);
    self->unit = PyLong_AsLongLong(unit);
    if (PyErr_Occurred())
        goto error;
    if (self->unit < 1) {
        PyErr_SetString(PyExc_ValueError, "time_unit_ns must be positive");
        goto error;
    }
    Py_DECREF(limit);
    Py_DECREF(intern_limit);
    Py_DECREF(unit);
    Py_XSETREF(self->writer, Py_NewRef(writer));
    Py_XSETREF(self->wdict, wdict);
    self->realtime_clock = realtime;
    self->closed = 0;
    return 0;
error:
    Py_XDECREF(limit);
    Py_XDECREF(intern_limit);
    Py_XDECREF(unit);
    Py_DECREF(wdict);
    return -1;
}

static int
Encoder_traverse(Encoder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->writer);
    Py_VISIT(self->wdict);
    Py_VISIT(self->buf);
    Py_VISIT(self->begin_cache);
    Py_VISIT(self->instant_cache);
    Py_VISIT(self->end_frames);
    Py_VISIT(self->counter_bodies);
    Py_VISIT(self->counter_last);
    Py_VISIT(self->heads);
    Py_VISIT(self->arg_names);
    Py_VISIT(self->string_values);
    Py_VISIT(self->seen_once);
    Py_VISIT(self->seen_twice);
    Py_VISIT(self->arg_cache);
    Py_VISIT(self->clock);
    Py_VISIT(self->seq);
    Py_VISIT(self->fb_begin);
    Py_VISIT(self->fb_end);
    Py_VISIT(self->fb_instant);
    Py_VISIT(self->fb_counter);
    Py_VISIT(self->held);
    Py_VISIT(self->held_keys);
    Py_VISIT(self->holders);
    Py_VISIT(self->bound);
    Py_VISIT(self->write_held);
    Py_VISIT(self->no_kwargs);
    return 0;
}

static int
Encoder_clear(Encoder *self)
{
    self->closed = 1;
    Py_CLEAR(self->writer);
    Py_CLEAR(self->wdict);
    Py_CLEAR(self->buf);
    Py_CLEAR(self->begin_cache);
    Py_CLEAR(self->instant_cache);
    Py_CLEAR(self->end_frames);
    Py_CLEAR(self->counter_bodies);
    Py_CLEAR(self->counter_last);
    Py_CLEAR(self->heads);
    Py_CLEAR(self->arg_names);
    Py_CLEAR(self->string_values);
    Py_CLEAR(self->seen_once);
    Py_CLEAR(self->seen_twice);
    Py_CLEAR(self->arg_cache);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->seq);
    Py_CLEAR(self->fb_begin);
    Py_CLEAR(self->fb_end);
    Py_CLEAR(self->fb_instant);
    Py_CLEAR(self->fb_counter);
    Py_CLEAR(self->held);
    Py_CLEAR(self->held_keys);
    Py_CLEAR(self->holders);
    Py_CLEAR(self->bound);
    Py_CLEAR(self->write_held);
    Py_CLEAR(self->no_kwargs);
    return 0;
}

static void
Encoder_dealloc(Encoder *self)
{
    PyObject_GC_UnTrack(self);
    Encoder_clear(self);
    PyMem_Free(self->event.data);
    PyMem_Free(self->defs.data);
    PyMem_Free(self->ann.data);
    PyMem_Free(self->body.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Encoder *self = (Encoder *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->closed = 1; /* until __init__ succeeds: every call goes to Python */
    return (PyObject *)self;
}

static PyMethodDef Encoder_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))Encoder_begin, METH_FASTCALL | METH_KEYWORDS,
     "TraceWriter.begin, in C (see tracer.format.writer)."},
    {"end", (PyCFunction)(void (*)(void))Encoder_end, METH_FASTCALL | METH_KEYWORDS,
     "TraceWriter.end, in C (see tracer.format.writer)."},
    {"instant", (PyCFunction)(void (*)(void))Encoder_instant, METH_FASTCALL | METH_KEYWORDS,
     "TraceWriter.instant, in C (see tracer.format.writer)."},
    {"counter", (PyCFunction)(void (*)(void))Encoder_counter, METH_FASTCALL | METH_KEYWORDS,
     "TraceWriter.counter, in C (see tracer.format.writer)."},
    {"clock", (PyCFunction)Encoder_clock, METH_NOARGS,
     "The writer's clock, in its time unit (a realtime one never goes back)."},
    {"stats", (PyCFunction)Encoder_stats, METH_NOARGS,
     "How many calls were taken here (cached events, events with args) and handed to Python."},
    {"hold", (PyCFunction)Encoder_hold, METH_VARARGS,
     "hold(held, keys, holders, write_held, max_held): hold calls (TraceWriter.in_time_order)."},
    {"unhold", (PyCFunction)Encoder_unhold, METH_NOARGS, "Stop holding calls."},
    {"replay", (PyCFunction)Encoder_replay, METH_O,
     "replay(calls): make held calls in order, holding none meanwhile."},
    {"stop", (PyCFunction)Encoder_stop, METH_NOARGS,
     "From now on every call goes to the writer's Python methods (the writer closed)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.format._speedups.Encoder",
    .tp_doc = "The hot path of one TraceWriter, in C; see the module's source for why.",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Encoder_new,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_traverse = (traverseproc)Encoder_traverse,
    .tp_clear = (inquiry)Encoder_clear,
    .tp_methods = Encoder_methods,
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracer.format._speedups",
    .m_doc = "The TraceWriter's hot path in C (optional: the writer works without it).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&EncoderType) < 0 || PyType_Ready(&SequenceType) < 0)
        return NULL;
    struct {
        PyObject **slot;
        const char *text;
    } strings[] = {
        {&str_last, "_last"}, {&str_late, "_late"}, {&str_late_tag, "_late_tag"},
        {&str_dedupe, "dedupe"}, {&str_emit, "_emit"},
        {&str_flush, "_flush_buffer"}, {&kw_track, "track"}, {&kw_name, "name"},
        {&kw_ts, "ts"}, {&kw_category, "category"}, {&kw_args, "args"},
        {&kw_flows, "flows"}, {&kw_tflows, "terminating_flows"}, {&kw_value, "value"},
        {&str_last_units, "_last_units"}, {&str_samples_written, "samples_written"},
    };
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        if (*strings[i].slot == NULL) {
            *strings[i].slot = PyUnicode_InternFromString(strings[i].text);
            if (*strings[i].slot == NULL)
                return NULL;
        }
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SequenceType);
    if (PyModule_AddObject(m, "Sequence", (PyObject *)&SequenceType) < 0) {
        Py_DECREF(&SequenceType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
