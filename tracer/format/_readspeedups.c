/*
 * tracer.format._readspeedups: the trace readers' hot path in C.
 *
 * Why: most packets of a trace repeat an earlier packet byte for byte apart
 * from their timestamp (a plan-polling slice, a wave's end, a counter's
 * frequent value): the tokenizer caches their decoding (a template, see
 * tracer/format/_tokenizer.py) and replays it. In Python that is ~2.5 us a
 * packet (the framing loop, the cache lookup, the clock conversion, the
 * event tuple), most of a big trace's reading time; here it is a fraction.
 *
 * What: replay_run(reader, data, pos, file_offset, in_bundle) reads the
 * records of `data` from `pos` while each one is a replay the Python code
 * would do the same way: a complete record whose bytes apart from its
 * timestamp are a current template, on the trace clock or a sequence-scoped
 * clock whose anchor the reader has cached, giving an int64 timestamp. It
 * appends the very event (or counter sample) tuples _Tokenizer.replay would,
 * advances the sequence's running clock and the reader's packet_index and
 * event_count, and returns the position of the first record it does not
 * take (that record untouched: Python reads it). Runs of empty records are
 * skipped as the framing loop skips them. The Python code stays the one
 * definition; tests/format/test_readspeedups.py checks both read the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KIND_COUNTER 4

static PyObject *s_templates, *s_events, *s_counters, *s_packet_index, *s_event_count;
static PyObject *s_generation, *s_seq, *s_clock, *s_kind, *s_uuid, *s_name, *s_category;
static PyObject *s_value, *s_args, *s_snapshot, *s_running, *s_anchor, *s_anchor_epoch;
static PyObject *s_trace_clock, *s_global_snapshots;
static PyObject *empty_tuple;

/* Read an attribute as int64; 0 with *ok = 0 if it is missing or not an int64. */
static int64_t
attr_i64(PyObject *obj, PyObject *name, int *ok)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        *ok = 0;
        return 0;
    }
    int overflow = 0;
    long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
    if (!PyLong_Check(v) || overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *ok = 0;
    }
    Py_DECREF(v);
    return (int64_t)x;
}

/* A dict item as int64 (borrowed lookup); *ok = 0 if missing or not an int64. */
static int64_t
item_i64(PyObject *v, int *ok)
{
    int overflow = 0;
    if (v == NULL || !PyLong_Check(v)) {
        *ok = 0;
        return 0;
    }
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *ok = 0;
    }
    return (int64_t)x;
}

/*
 * Replay one record if it can be: returns 1 (done, state advanced), 0 (not
 * taken: nothing changed), -1 (a Python error).
 */
static int
replay_one(PyObject *templates, PyObject *events, PyObject *counters, const unsigned char *d,
           Py_ssize_t q, Py_ssize_t stop, Py_ssize_t length, int64_t n_global,
           int64_t trace_clock, PyObject *where, int64_t *event_count)
{
    /* The key: the record's bytes apart from its timestamp field (tag 0x40), as
     * _framing._Framer.read_records computes it. */
    uint64_t raw = 0;
    Py_ssize_t k0 = -1, k1 = -1;
    if (length > 2 && d[q] == 0x40) {
        Py_ssize_t j = q + 1;
        int shift = 0;
        while (j < stop && shift < 64) {
            unsigned char byte = d[j++];
            raw |= (uint64_t)(byte & 0x7F) << shift;
            if (byte < 0x80) {
                k0 = j;
                k1 = stop;
                break;
            }
            shift += 7;
        }
    }
    else if (length > 3 && d[stop - 1] < 0x80) {
        unsigned char last = d[stop - 1];
        unsigned char byte = d[stop - 2];
        if (byte == 0x40) {
            raw = last;
            k0 = q;
            k1 = stop - 2;
        }
        else if (byte >= 0x80) {
            raw = ((uint64_t)last << 7) | (byte & 0x7F);
            Py_ssize_t j = stop - 3;
            while (j > q && d[j] >= 0x80 && stop - j <= 10) {
                raw = (raw << 7) | (d[j] & 0x7F);
                j--;
            }
            if (d[j] == 0x40) {
                k0 = q;
                k1 = j;
            }
        }
    }
    if (k0 < 0)
        return 0;
    PyObject *key = PyBytes_FromStringAndSize((const char *)d + k0, k1 - k0);
    if (key == NULL)
        return -1;
    PyObject *template = PyDict_GetItemWithError(templates, key); /* borrowed */
    Py_DECREF(key);
    if (template == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(template);
    int result = 0, ok = 1;
    PyObject *seq = NULL, *snapshot = NULL, *running = NULL, *clock_obj = NULL;
    PyObject *anchor_obj = NULL, *kind_obj = NULL, *uuid = NULL, *item = NULL;
    seq = PyObject_GetAttr(template, s_seq);
    if (seq == NULL)
        goto error;
    int64_t generation = attr_i64(template, s_generation, &ok);
    int64_t seq_generation = attr_i64(seq, s_generation, &ok);
    int64_t clock = attr_i64(template, s_clock, &ok);
    if (!ok || generation != seq_generation)
        goto done;
    int64_t ts;
    if (clock == 0 || clock == trace_clock) { /* timestamps already in trace time */
        if (raw > (uint64_t)INT64_MAX)
            goto done;
        ts = (int64_t)raw;
        goto taken;
    }
    int64_t anchor_epoch = attr_i64(seq, s_anchor_epoch, &ok);
    if (!ok || anchor_epoch != n_global || clock < 64 || clock >= 128)
        goto done;
    anchor_obj = PyObject_GetAttr(seq, s_anchor);
    snapshot = PyObject_GetAttr(seq, s_snapshot);
    running = PyObject_GetAttr(seq, s_running);
    clock_obj = PyObject_GetAttr(template, s_clock);
    if (anchor_obj == NULL || snapshot == NULL || running == NULL || clock_obj == NULL)
        goto error;
    if (anchor_obj == Py_None || !PyDict_CheckExact(snapshot) || !PyDict_CheckExact(running))
        goto done;
    int64_t anchor = item_i64(anchor_obj, &ok);
    PyObject *entry = PyDict_GetItemWithError(snapshot, clock_obj); /* borrowed */
    if (entry == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto done;
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
        goto done;
    int64_t base_ns = item_i64(PyTuple_GET_ITEM(entry, 0), &ok);
    int64_t multiplier = item_i64(PyTuple_GET_ITEM(entry, 1), &ok);
    int incremental = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 2));
    if (!ok || incremental < 0 || raw > (uint64_t)INT64_MAX)
        goto done;
    int64_t value;
    if (__builtin_mul_overflow((int64_t)raw, multiplier, &value))
        goto done;
    if (incremental) {
        int64_t previous = item_i64(PyDict_GetItemWithError(running, clock_obj), &ok);
        if (PyErr_Occurred())
            goto error;
        if (!ok || __builtin_add_overflow(previous, value, &value))
            goto done;
    }
    if (__builtin_add_overflow(anchor, value, &ts) || __builtin_sub_overflow(ts, base_ns, &ts))
        goto done; /* out of int64: Python's path says so (a problem) */
    /* Taken: from here on, state changes. */
    if (incremental) {
        PyObject *v = PyLong_FromLongLong(value);
        if (v == NULL || PyDict_SetItem(running, clock_obj, v) < 0) {
            Py_XDECREF(v);
            goto error;
        }
        Py_DECREF(v);
    }
taken:;
    PyObject *ts_obj = PyLong_FromLongLong(ts);
    if (ts_obj == NULL)
        goto error;
    kind_obj = PyObject_GetAttr(template, s_kind);
    uuid = PyObject_GetAttr(template, s_uuid);
    if (kind_obj == NULL || uuid == NULL) {
        Py_DECREF(ts_obj);
        goto error;
    }
    int64_t kind = item_i64(kind_obj, &ok);
    if (kind == KIND_COUNTER) {
        PyObject *value_obj = PyObject_GetAttr(template, s_value);
        if (value_obj == NULL) {
            Py_DECREF(ts_obj);
            goto error;
        }
        item = PyTuple_Pack(3, ts_obj, uuid, value_obj);
        Py_DECREF(value_obj);
        Py_DECREF(ts_obj);
        if (item == NULL || PyList_Append(counters, item) < 0)
            goto error;
    }
    else {
        PyObject *name = PyObject_GetAttr(template, s_name);
        PyObject *category = PyObject_GetAttr(template, s_category);
        PyObject *args = PyObject_GetAttr(template, s_args);
        PyObject *index = PyLong_FromLongLong(*event_count);
        PyObject *own_args = NULL;
        if (args != NULL && args != Py_None)
            own_args = PyDict_Copy(args); /* each event owns its args */
        else if (args != NULL)
            own_args = Py_NewRef(Py_None);
        if (name != NULL && category != NULL && own_args != NULL && index != NULL)
            item = PyTuple_Pack(10, ts_obj, index, kind_obj, uuid, name, category, own_args,
                                empty_tuple, empty_tuple, where);
        Py_XDECREF(name);
        Py_XDECREF(category);
        Py_XDECREF(args);
        Py_XDECREF(own_args);
        Py_XDECREF(index);
        Py_DECREF(ts_obj);
        if (item == NULL || PyList_Append(events, item) < 0)
            goto error;
        *event_count += 1;
    }
    result = 1;
    goto done;
error:
    result = -1;
done:
    Py_XDECREF(item);
    Py_XDECREF(uuid);
    Py_XDECREF(kind_obj);
    Py_XDECREF(clock_obj);
    Py_XDECREF(anchor_obj);
    Py_XDECREF(running);
    Py_XDECREF(snapshot);
    Py_XDECREF(seq);
    Py_DECREF(template);
    return result;
}

static PyObject *
replay_run(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    (void)module;
    if (argc != 5) {
        PyErr_SetString(PyExc_TypeError, "replay_run takes 5 arguments");
        return NULL;
    }
    PyObject *reader = argv[0], *data = argv[1];
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "replay_run: data must be bytes");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(argv[2]);
    Py_ssize_t file_offset = PyLong_AsSsize_t(argv[3]);
    int in_bundle = PyObject_IsTrue(argv[4]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data);
    PyObject *templates = NULL, *events = NULL, *counters = NULL, *result = NULL;
    PyObject *snapshots = NULL;
    int ok = 1;
    int64_t packet_index = attr_i64(reader, s_packet_index, &ok);
    int64_t event_count = attr_i64(reader, s_event_count, &ok);
    int64_t trace_clock = attr_i64(reader, s_trace_clock, &ok);
    int64_t n_global = 0;
    Py_ssize_t start = pos;
    snapshots = PyObject_GetAttr(reader, s_global_snapshots);
    if (snapshots == NULL)
        goto finish;
    n_global = PyObject_Length(snapshots);
    if (n_global < 0)
        goto finish;
    templates = PyObject_GetAttr(reader, s_templates);
    events = PyObject_GetAttr(reader, s_events);
    counters = PyObject_GetAttr(reader, s_counters);
    if (templates == NULL || events == NULL || counters == NULL)
        goto finish;
    if (!ok || !PyDict_CheckExact(templates) || !PyList_CheckExact(events) ||
        !PyList_CheckExact(counters))
        goto answer; /* nothing taken */
    while (pos < end) {
        if (d[pos] != 0x0A || (!in_bundle && file_offset + pos == 0))
            break; /* damage, or the file's first record (Python checks it is a trace) */
        if (pos + 1 < end && d[pos + 1] == 0x00) { /* empty records: no-ops */
            while (pos + 1 < end && d[pos] == 0x0A && d[pos + 1] == 0x00) {
                pos += 2;
                packet_index++;
            }
            continue;
        }
        Py_ssize_t q = pos + 1;
        uint64_t length = 0;
        int shift = 0, complete = 0;
        while (q < end && shift < 70) {
            unsigned char byte = d[q++];
            length |= shift < 64 ? (uint64_t)(byte & 0x7F) << shift : 0;
            if (byte < 0x80) {
                complete = 1;
                break;
            }
            shift += 7;
        }
        if (!complete || shift >= 63 || length > (uint64_t)(end - q))
            break; /* a cut, damage, or a record past the chunk: Python's */
        Py_ssize_t stop = q + (Py_ssize_t)length;
        PyObject *where = in_bundle
            ? Py_BuildValue("(Lnn)", (long long)packet_index, file_offset, pos)
            : Py_BuildValue("(LnO)", (long long)packet_index, file_offset + pos, Py_None);
        if (where == NULL)
            goto finish;
        int taken = replay_one(templates, events, counters, d, q, stop, (Py_ssize_t)length,
                               n_global, trace_clock, where, &event_count);
        Py_DECREF(where);
        if (taken < 0)
            goto finish;
        if (!taken)
            break;
        packet_index++;
        pos = stop;
    }
answer:
    if (pos != start) {
        PyObject *pi = PyLong_FromLongLong(packet_index);
        PyObject *ec = PyLong_FromLongLong(event_count);
        int failed = pi == NULL || ec == NULL || PyObject_SetAttr(reader, s_packet_index, pi) < 0 ||
                     PyObject_SetAttr(reader, s_event_count, ec) < 0;
        Py_XDECREF(pi);
        Py_XDECREF(ec);
        if (failed)
            goto finish;
    }
    result = PyLong_FromSsize_t(pos);
finish:
    Py_XDECREF(snapshots);
    Py_XDECREF(templates);
    Py_XDECREF(events);
    Py_XDECREF(counters);
    return result;
}

static PyMethodDef methods[] = {
    {"replay_run", (PyCFunction)(void (*)(void))replay_run, METH_FASTCALL,
     "replay_run(reader, data, pos, file_offset, in_bundle) -> pos: replay cached packet "
     "decodings from data[pos:] while it can (see _Framer.fast_forward)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef readspeedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracer.format._readspeedups",
    .m_doc = "The trace readers' hot path in C (optional: they work without it).",
    .m_size = -1,
    .m_methods = methods,
};

#define INTERN(var, text)                                                                   \
    do {                                                                                    \
        var = PyUnicode_InternFromString(text);                                             \
        if (var == NULL)                                                                    \
            return NULL;                                                                    \
    } while (0)

PyMODINIT_FUNC
PyInit__readspeedups(void)
{
    INTERN(s_templates, "templates");
    INTERN(s_events, "events");
    INTERN(s_counters, "counters");
    INTERN(s_packet_index, "packet_index");
    INTERN(s_event_count, "event_count");
    INTERN(s_generation, "generation");
    INTERN(s_seq, "seq");
    INTERN(s_clock, "clock");
    INTERN(s_kind, "kind");
    INTERN(s_uuid, "uuid");
    INTERN(s_name, "name");
    INTERN(s_category, "category");
    INTERN(s_value, "value");
    INTERN(s_args, "args");
    INTERN(s_snapshot, "snapshot");
    INTERN(s_running, "running");
    INTERN(s_anchor, "anchor");
    INTERN(s_anchor_epoch, "anchor_epoch");
    INTERN(s_trace_clock, "trace_clock");
    INTERN(s_global_snapshots, "global_snapshots");
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL)
        return NULL;
    return PyModule_Create(&readspeedups_module);
}
