/*
 * tracer.ray._memray_reader: follows a live memray capture, task by task.
 *
 * Why: memray's public readers (FileReader, SocketReader) give a capture's
 * heap peak only once the capture has ended, and ending one (Tracker.__exit__)
 * then starting the next (Tracker.__enter__) costs ~8 ms each in a Ray worker:
 * memray patches, then restores, the relocation tables of every loaded
 * library, and Ray's are large. So level 2 keeps ONE tracker per worker
 * process, writing memray's ALL_ALLOCATIONS stream to a file, and this module
 * reads that stream as it grows: from the record after a task's start marker
 * to its end marker it does what memray's HighWatermarkFinder does over a
 * capture of its own (tracking/snapshot.cpp in memray), so a task's figures
 * are the ones a capture started and ended with the task would give.
 *
 * What it relies on: memray's stream format, header version 13 (memray
 * 1.20): the header layout of RecordWriter::writeHeaderCommon and the record
 * encodings of StreamingRecordWriter, read as RecordReader reads them. A
 * capture of any other version is refused (ValueError) and the caller falls
 * back to memray's public API; tracer.ray.memory_session also uses this
 * reader only with the memray release it was checked against (KNOWN_MEMRAY),
 * as a record's encoding may change without the header's version changing.
 * tests/ray/test_memory_reader.py checks every figure against memray's own
 * FileReader on the same captures. Why not FileReader itself on the live
 * capture: it reads from the start each time and tracks its own reading into
 * the capture (0.2 s for a worker's first task, seconds by the 5th; the
 * numbers and the decision: memory_session's docstring, benchmarks/README.md).
 *
 * Markers: the tracker writes an allocation's record in the allocating thread,
 * before malloc returns to the caller, so once marker_alloc() has returned,
 * every byte up to the end of its record is in the file (the FileSink writes
 * through a shared mapping; pread sees it). A marker is a malloc of an unusual
 * size at a live (hence unique) address; the reader stops right after it.
 *
 * Memory: the reader's own (its buffer, its tables) comes from the mmap system
 * call, which memray does not see, so reading a task's records while the task
 * runs adds nothing to them.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MEMRAY_MAGIC "memray"          /* 7 bytes with its NUL */
#define MEMRAY_HEADER_VERSION 13
#define MEMRAY_ALL_ALLOCATIONS 0

/* RecordType (memray records.h). */
#define T_FILLER 0
#define T_TRAILER 1
#define T_MEMORY_RECORD 2
#define T_NATIVE_TRACE_INDEX 5
#define T_MEMORY_MAP_START 6
#define T_SEGMENT_HEADER 7
#define T_SEGMENT 8
#define T_THREAD_RECORD 10
#define T_CONTEXT_SWITCH 12
#define T_CODE_OBJECT 14

/* hooks::Allocator (memray hooks.h). */
#define A_PYMALLOC_FREE 1
#define A_FREE 5
#define A_MALLOC 6
#define A_MMAP 14
#define A_MUNMAP 15
#define A_LAST 15

#define KIND_ALLOC 1
#define KIND_FREE 2
#define KIND_RANGED_ALLOC 3
#define KIND_RANGED_FREE 4

#define POINTER_CACHE 15

/* parse results */
#define P_OK 0
#define P_MORE 1 /* the record continues past the bytes read so far */
#define P_BAD 2  /* not a record memray 1.20 writes */

static int
allocator_kind(unsigned a)
{
    switch (a) {
        case A_PYMALLOC_FREE:
        case A_FREE:
            return KIND_FREE;
        case A_MMAP:
            return KIND_RANGED_ALLOC;
        case A_MUNMAP:
            return KIND_RANGED_FREE;
        default:
            return (a >= 1 && a <= A_LAST) ? KIND_ALLOC : 0;
    }
}

/* ------------------------------------------------------------ own memory */

/* The reader's own memory comes straight from the kernel (the mmap system call, not
 * through the libc functions memray patches), so that it never shows in the capture:
 * a task's figures are read while the task runs too (memory_session's drain), and must
 * not include the reader's tables. Each block starts with its mapped length. */
#define RAW_HEADER 16

static void *
raw_alloc(size_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t total = (size + RAW_HEADER + (size_t)page - 1) / (size_t)page * (size_t)page;
    void *p = (void *)syscall(SYS_mmap, NULL, total, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
    *(size_t *)p = total;
    return (char *)p + RAW_HEADER; /* zero-filled */
}

static void
raw_free(void *block)
{
    if (block != NULL) {
        char *p = (char *)block - RAW_HEADER;
        syscall(SYS_munmap, p, *(size_t *)p);
    }
}

static void *
raw_realloc(void *block, size_t size)
{
    if (block == NULL) {
        return raw_alloc(size);
    }
    size_t usable = *(size_t *)((char *)block - RAW_HEADER) - RAW_HEADER;
    if (size <= usable) {
        return block;
    }
    void *bigger = raw_alloc(size);
    if (bigger != NULL) {
        memcpy(bigger, block, usable);
        raw_free(block);
    }
    return bigger;
}

/* ------------------------------------------------------------------ tables */

/* The window's live allocations: address -> size, open addressing with linear
 * probing. A slot is in use when its generation is the table's: opening a window
 * (a task's start) empties the table by starting a new generation, whatever its size. */
typedef struct {
    uint64_t addr;
    uint64_t size;
    uint32_t gen; /* 0: never used, or removed */
} Slot;

typedef struct {
    Slot *slots;
    size_t cap; /* a power of two */
    size_t count;
    uint32_t gen;
} AddrMap;

#define FULL(m, s) ((s)->gen == (m)->gen)

static inline size_t
addr_hash(uint64_t addr, size_t mask)
{
    return (size_t)((addr >> 4) * 0x9E3779B97F4A7C15ULL >> 17) & mask;
}

static int
map_init(AddrMap *m, size_t cap)
{
    m->slots = raw_alloc(cap * sizeof(Slot)); /* zero-filled: generation 0 */
    if (m->slots == NULL) {
        return -1;
    }
    m->cap = cap;
    m->count = 0;
    m->gen = 1;
    return 0;
}

static void
map_clear(AddrMap *m)
{
    m->count = 0;
    if (++m->gen == 0) { /* after 2^32 windows: start over */
        memset(m->slots, 0, m->cap * sizeof(Slot));
        m->gen = 1;
    }
}

static Slot *
map_find(AddrMap *m, uint64_t addr)
{
    size_t mask = m->cap - 1;
    for (size_t i = addr_hash(addr, mask);; i = (i + 1) & mask) {
        Slot *s = &m->slots[i];
        if (!FULL(m, s)) {
            return NULL;
        }
        if (s->addr == addr) {
            return s;
        }
    }
}

static int
map_grow(AddrMap *m)
{
    AddrMap bigger;
    if (map_init(&bigger, m->cap * 2) < 0) {
        return -1;
    }
    size_t mask = bigger.cap - 1;
    for (size_t j = 0; j < m->cap; j++) {
        if (!FULL(m, &m->slots[j])) {
            continue;
        }
        size_t i = addr_hash(m->slots[j].addr, mask);
        while (FULL(&bigger, &bigger.slots[i])) {
            i = (i + 1) & mask;
        }
        bigger.slots[i] = m->slots[j];
        bigger.slots[i].gen = bigger.gen;
    }
    bigger.count = m->count;
    raw_free(m->slots);
    *m = bigger;
    return 0;
}

/* Insert or overwrite; returns 1 if the address was new, 0 if overwritten, -1 on no memory. */
static int
map_put(AddrMap *m, uint64_t addr, uint64_t size)
{
    if ((m->count + 1) * 2 > m->cap && map_grow(m) < 0) {
        return -1;
    }
    size_t mask = m->cap - 1;
    for (size_t i = addr_hash(addr, mask);; i = (i + 1) & mask) {
        Slot *s = &m->slots[i];
        if (!FULL(m, s)) {
            *s = (Slot){addr, size, m->gen};
            m->count++;
            return 1;
        }
        if (s->addr == addr) {
            s->size = size;
            return 0;
        }
    }
}

/* Remove a slot found by map_find (linear probing: shift the cluster back). */
static void
map_remove(AddrMap *m, Slot *s)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)(s - m->slots);
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!FULL(m, &m->slots[j])) {
            break;
        }
        size_t home = addr_hash(m->slots[j].addr, mask);
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].gen = 0;
    m->count--;
}

typedef struct {
    uint64_t begin, end;
} Interval;

typedef struct {
    uint64_t ms, heap, rss;
} Sample;

/* ------------------------------------------------------------------ reader */

typedef struct {
    PyObject_HEAD
    int fd;
    /* Buffer of file bytes: buf[pos..len) are unparsed bytes at file offset base + pos. */
    unsigned char *buf;
    size_t cap, len, pos;
    uint64_t base;
    /* Decoder state (must follow every record, inside a window or not). */
    uint64_t recent[POINTER_CACHE];
    uint64_t data_pointer; /* address >> 3 of the last cache miss */
    uint64_t tid;
    int native_traces;
    uint64_t data_start;    /* the first record's offset (after the header) */
    uint64_t released;      /* bytes before this offset were punched out of the file */
    int release_failed;     /* the file system cannot punch holes (errno) */
    int64_t start_time_ms;
    int header_pid;
    /* Window accounting: memray's HighWatermarkFinder over the window's records. */
    int window_open;
    AddrMap live;
    Interval *ranges;
    size_t n_ranges, cap_ranges;
    uint64_t current;       /* HighWatermarkFinder::d_current_memory */
    uint64_t peak;          /* ... its peak (>=: the last time it is reached) */
    uint64_t live_count;    /* allocations live now (map entries + ranges) */
    uint64_t count_at_peak; /* ... at the peak */
    size_t peak_after;      /* samples taken before the peak was (last) reached */
    uint64_t live_ranged;   /* bytes in ranges */
    uint64_t live_simple;   /* bytes in the map */
    uint64_t total_allocated, allocation_count;
    Sample *samples;
    size_t n_samples, cap_samples;
    /* Debug: when set, every decoded allocation is appended as (tid, address, size, allocator). */
    PyObject *collect;
    /* The error of a failed call, recorded without the GIL and raised with it (raise_error). */
    int in_use; /* advance() runs without the GIL: no other call may touch the reader */
    int err;
    int err_errno;
    uint64_t err_offset;
    unsigned err_token;
} Reader;

#define ERR_NOMEM 1
#define ERR_OS 2
#define ERR_BAD 3
#define ERR_PYTHON 4 /* a Python exception is already set (only with the GIL) */

static int
check_free(Reader *r)
{
    if (r->in_use) {
        PyErr_SetString(PyExc_RuntimeError, "the Reader is in use by another thread");
        return -1;
    }
    return 0;
}

static void
raise_error(Reader *r)
{
    switch (r->err) {
        case ERR_NOMEM:
            PyErr_NoMemory();
            break;
        case ERR_OS:
            errno = r->err_errno;
            PyErr_SetFromErrno(PyExc_OSError);
            break;
        case ERR_BAD:
            PyErr_Format(PyExc_ValueError,
                         "not a memray 1.20 record at offset %llu (token 0x%02x)",
                         (unsigned long long)r->err_offset, r->err_token);
            break;
        default:
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_RuntimeError, "the memray capture reader failed");
            }
    }
    r->err = 0;
}

static int
fill(Reader *r, size_t need)
{
    /* Make at least `need` bytes available at pos, reading more; 0 ok, 1 not there (yet), -1 error. */
    if (r->len - r->pos >= need) {
        return 0;
    }
    if (r->pos > 0) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->base += r->pos;
        r->len -= r->pos;
        r->pos = 0;
    }
    if (need > r->cap) {
        size_t cap = r->cap;
        while (cap < need) {
            cap *= 2;
        }
        unsigned char *bigger = raw_realloc(r->buf, cap);
        if (bigger == NULL) {
            r->err = ERR_NOMEM;
            return -1;
        }
        r->buf = bigger;
        r->cap = cap;
    }
    while (r->len < need) {
        ssize_t n = pread(r->fd, r->buf + r->len, r->cap - r->len, (off_t)(r->base + r->len));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            r->err = ERR_OS;
            r->err_errno = errno;
            return -1;
        }
        if (n == 0) {
            return 1;
        }
        r->len += (size_t)n;
    }
    return 0;
}

/* Decoding helpers on [p, end): advance *p or report P_MORE / P_BAD. */
static inline int
get_varint(const unsigned char **p, const unsigned char *end, uint64_t *out)
{
    uint64_t val = 0;
    int shift = 0;
    const unsigned char *q = *p;
    for (;;) {
        if (q >= end) {
            return P_MORE;
        }
        unsigned char b = *q++;
        val |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            break;
        }
        shift += 7;
        if (shift >= 64) {
            return P_BAD;
        }
    }
    *p = q;
    *out = val;
    return P_OK;
}

static inline int
get_svarint(const unsigned char **p, const unsigned char *end, int64_t *out)
{
    uint64_t z;
    int rc = get_varint(p, end, &z);
    if (rc == P_OK) {
        *out = (int64_t)((z >> 1) ^ (~(z & 1) + 1));
    }
    return rc;
}

static inline int
skip_bytes(const unsigned char **p, const unsigned char *end, size_t n)
{
    if ((size_t)(end - *p) < n) {
        return P_MORE;
    }
    *p += n;
    return P_OK;
}

static inline int
skip_string(const unsigned char **p, const unsigned char *end)
{
    const unsigned char *nul = memchr(*p, 0, (size_t)(end - *p));
    if (nul == NULL) {
        return P_MORE;
    }
    *p = nul + 1;
    return P_OK;
}

#define TRY(expr)                \
    do {                         \
        int rc_ = (expr);        \
        if (rc_ != P_OK) {       \
            return rc_;          \
        }                        \
    } while (0)

/* One decoded record: what the window needs, and the decoder state to commit. */
typedef struct {
    int type; /* T_*, or 128 for an allocation, or -1 for records with nothing to apply */
    int cache_miss;
    uint64_t data_pointer; /* on a cache miss */
    uint64_t address, size;
    unsigned allocator;
    uint64_t tid;
    uint64_t rss, ms;
} Rec;

static int
parse_record(Reader *r, const unsigned char *start, const unsigned char *end, Rec *rec,
             size_t *used)
{
    const unsigned char *p = start;
    if (p >= end) {
        return P_MORE;
    }
    unsigned char token = *p++;
    rec->type = -1;
    if (token & 0x80) { /* ALLOCATION: 0b1ppppaaa */
        unsigned cache_index = (token >> 3) & 0x0f;
        unsigned allocator = token & 7;
        rec->type = 128;
        rec->cache_miss = cache_index == 0x0f;
        if (rec->cache_miss) {
            int64_t delta;
            TRY(get_svarint(&p, end, &delta));
            rec->data_pointer = r->data_pointer + (uint64_t)delta;
            rec->address = rec->data_pointer << 3;
        }
        else if (cache_index < POINTER_CACHE) {
            rec->address = r->recent[cache_index];
        }
        else {
            return P_BAD;
        }
        if (allocator == 0) {
            TRY(skip_bytes(&p, end, 1));
            allocator = p[-1];
        }
        int kind = allocator_kind(allocator);
        if (kind == 0) {
            return P_BAD;
        }
        rec->allocator = allocator;
        if (r->native_traces && kind != KIND_FREE) {
            int64_t ignored;
            TRY(get_svarint(&p, end, &ignored));
        }
        rec->size = 0;
        if (kind != KIND_FREE) {
            TRY(get_varint(&p, end, &rec->size));
        }
    }
    else if (token & 0x40) { /* FRAME_PUSH: code object id, instruction offset */
        uint64_t ignored;
        int64_t signed_ignored;
        TRY(get_varint(&p, end, &ignored));
        TRY(get_svarint(&p, end, &signed_ignored));
    }
    else if (token & 0x20) { /* OBJECT_RECORD: 0b001ppppc */
        unsigned cache_index = (token >> 1) & 0x0f;
        rec->type = 32;
        rec->cache_miss = cache_index == 0x0f;
        if (rec->cache_miss) {
            int64_t delta;
            TRY(get_svarint(&p, end, &delta));
            rec->data_pointer = r->data_pointer + (uint64_t)delta;
            rec->address = rec->data_pointer << 3;
        }
        else if (cache_index >= POINTER_CACHE) {
            return P_BAD;
        }
        if (r->native_traces && (token & 1)) {
            int64_t ignored;
            TRY(get_svarint(&p, end, &ignored));
        }
    }
    else if (token & 0x10) { /* FRAME_POP: no body */
    }
    else {
        switch (token) {
            case T_MEMORY_RECORD: {
                rec->type = T_MEMORY_RECORD;
                TRY(get_varint(&p, end, &rec->rss));
                TRY(get_varint(&p, end, &rec->ms));
                break;
            }
            case T_CONTEXT_SWITCH: {
                rec->type = T_CONTEXT_SWITCH;
                TRY(skip_bytes(&p, end, sizeof(uint64_t)));
                memcpy(&rec->tid, p - sizeof(uint64_t), sizeof(uint64_t));
                break;
            }
            case T_CODE_OBJECT: {
                uint64_t id, linetable;
                int64_t firstlineno;
                TRY(get_varint(&p, end, &id));
                TRY(skip_string(&p, end));
                TRY(skip_string(&p, end));
                TRY(get_svarint(&p, end, &firstlineno));
                TRY(get_varint(&p, end, &linetable));
                if (linetable > ((uint64_t)1 << 30)) {
                    return P_BAD;
                }
                TRY(skip_bytes(&p, end, (size_t)linetable));
                break;
            }
            case T_NATIVE_TRACE_INDEX: {
                int64_t ip, index;
                TRY(get_svarint(&p, end, &ip));
                TRY(get_svarint(&p, end, &index));
                break;
            }
            case T_MEMORY_MAP_START:
                break;
            case T_SEGMENT_HEADER: {
                uint64_t n;
                TRY(skip_string(&p, end));
                TRY(get_varint(&p, end, &n));
                TRY(skip_bytes(&p, end, sizeof(uint64_t)));
                if (n > 1000000) {
                    return P_BAD;
                }
                for (uint64_t i = 0; i < n; i++) {
                    uint64_t memsz;
                    TRY(skip_bytes(&p, end, 1));
                    if (p[-1] != T_SEGMENT) {
                        return P_BAD;
                    }
                    TRY(skip_bytes(&p, end, sizeof(uint64_t)));
                    TRY(get_varint(&p, end, &memsz));
                }
                break;
            }
            case T_THREAD_RECORD:
                TRY(skip_string(&p, end));
                break;
            case T_TRAILER:
            case T_FILLER:
                /* The end of the capture, or of what has been written so far. */
                rec->type = token;
                break;
            default:
                return P_BAD;
        }
    }
    *used = (size_t)(p - start);
    return P_OK;
}

static void
cache_insert(Reader *r, uint64_t address)
{
    memmove(&r->recent[1], &r->recent[0], (POINTER_CACHE - 1) * sizeof(uint64_t));
    r->recent[0] = address;
}

static int
add_sample(Reader *r, uint64_t ms, uint64_t rss)
{
    if (r->n_samples == r->cap_samples) {
        size_t cap = r->cap_samples ? r->cap_samples * 2 : 64;
        Sample *bigger = raw_realloc(r->samples, cap * sizeof(Sample));
        if (bigger == NULL) {
            r->err = ERR_NOMEM;
            return -1;
        }
        r->samples = bigger;
        r->cap_samples = cap;
    }
    r->samples[r->n_samples++] = (Sample){ms, r->current, rss};
    return 0;
}

static inline void
update_peak(Reader *r)
{
    if (r->current >= r->peak) {
        r->peak = r->current;
        r->count_at_peak = r->live_count;
        r->peak_after = r->n_samples;
    }
}

static int
remove_range(Reader *r, uint64_t begin, uint64_t size)
{
    /* memray's IntervalTree::removeInterval: returns the bytes freed. */
    if (size == 0) {
        return 0;
    }
    uint64_t end = begin + size;
    size_t n = r->n_ranges;
    for (size_t i = 0; i < n; i++) {
        Interval iv = r->ranges[i];
        uint64_t lo = iv.begin > begin ? iv.begin : begin;
        uint64_t hi = iv.end < end ? iv.end : end;
        if (lo >= hi) {
            continue;
        }
        uint64_t freed = hi - lo;
        r->current -= freed;
        r->live_ranged -= freed;
        if (lo == iv.begin && hi == iv.end) {
            r->ranges[i].begin = r->ranges[i].end = 0; /* removed below */
        }
        else if (lo == iv.begin) {
            r->ranges[i].begin = hi;
        }
        else if (hi == iv.end) {
            r->ranges[i].end = lo;
        }
        else { /* split in two */
            if (r->n_ranges == r->cap_ranges) {
                size_t cap = r->cap_ranges ? r->cap_ranges * 2 : 16;
                Interval *bigger = raw_realloc(r->ranges, cap * sizeof(Interval));
                if (bigger == NULL) {
                    r->err = ERR_NOMEM;
                    return -1;
                }
                r->ranges = bigger;
                r->cap_ranges = cap;
            }
            r->ranges[i].end = lo;
            r->ranges[r->n_ranges++] = (Interval){hi, iv.end};
            r->live_count++;
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < r->n_ranges; i++) {
        if (r->ranges[i].begin == r->ranges[i].end) {
            r->live_count--;
            continue;
        }
        r->ranges[kept++] = r->ranges[i];
    }
    r->n_ranges = kept;
    return 0;
}

static int
account(Reader *r, const Rec *rec)
{
    if (rec->type == T_MEMORY_RECORD) {
        return add_sample(r, rec->ms + (uint64_t)r->start_time_ms, rec->rss);
    }
    switch (allocator_kind(rec->allocator)) {
        case KIND_ALLOC: {
            int fresh = map_put(&r->live, rec->address, rec->size);
            if (fresh < 0) {
                r->err = ERR_NOMEM;
                return -1;
            }
            /* Like memray: an address seen again without a free adds its new size. */
            r->current += rec->size;
            r->live_simple += rec->size;
            r->live_count += (uint64_t)fresh;
            r->total_allocated += rec->size;
            r->allocation_count++;
            break;
        }
        case KIND_FREE: {
            Slot *s = map_find(&r->live, rec->address);
            if (s != NULL) {
                r->current -= s->size;
                r->live_simple -= s->size;
                r->live_count--;
                map_remove(&r->live, s);
            }
            break;
        }
        case KIND_RANGED_ALLOC: {
            if (rec->size > 0) {
                if (r->n_ranges == r->cap_ranges) {
                    size_t cap = r->cap_ranges ? r->cap_ranges * 2 : 16;
                    Interval *bigger = raw_realloc(r->ranges, cap * sizeof(Interval));
                    if (bigger == NULL) {
                        r->err = ERR_NOMEM;
                        return -1;
                    }
                    r->ranges = bigger;
                    r->cap_ranges = cap;
                }
                r->ranges[r->n_ranges++] = (Interval){rec->address, rec->address + rec->size};
                r->live_count++;
                r->live_ranged += rec->size;
            }
            r->current += rec->size;
            r->total_allocated += rec->size;
            r->allocation_count++;
            break;
        }
        case KIND_RANGED_FREE:
            if (remove_range(r, rec->address, rec->size) < 0) {
                return -1;
            }
            break;
    }
    update_peak(r);
    return 0;
}

static void
reset_window(Reader *r)
{
    if (r->live.cap > ((size_t)1 << 20)) { /* > 24 MiB: back to the kernel */
        raw_free(r->live.slots);
        r->live.slots = NULL;
        map_init(&r->live, 1024);
    }
    else if (r->live.slots != NULL) {
        map_clear(&r->live);
    }
    r->n_ranges = 0;
    r->n_samples = 0;
    r->peak_after = 0;
    r->current = r->peak = r->live_count = r->count_at_peak = 0;
    r->live_ranged = r->live_simple = 0;
    r->total_allocated = r->allocation_count = 0;
}

/* Decode records until the marker (a MALLOC of `size` at `address`), or until the
 * written data ends. 1: found (consumed, not accounted); 0: not found; -1: error. */
static int
advance(Reader *r, uint64_t address, uint64_t size, int to_marker)
{
    /* Bytes read ahead past the last record may have been incomplete then: read them again. */
    r->len = r->pos;
    for (;;) {
        Rec rec;
        size_t used = 0;
        int rc = parse_record(r, r->buf + r->pos, r->buf + r->len, &rec, &used);
        while (rc == P_MORE) {
            int got = fill(r, r->len - r->pos + 1);
            if (got < 0) {
                return -1;
            }
            if (got > 0) {
                return 0; /* the record is not all there: nothing more was written */
            }
            rc = parse_record(r, r->buf + r->pos, r->buf + r->len, &rec, &used);
        }
        if (rc == P_BAD) {
            r->err = ERR_BAD;
            r->err_offset = r->base + r->pos;
            r->err_token = r->buf[r->pos];
            return -1;
        }
        if (rec.type == T_FILLER || rec.type == T_TRAILER) {
            return 0; /* not consumed: a later call reads on from here */
        }
        r->pos += used;
        switch (rec.type) {
            case 128:
            case 32:
                if (rec.cache_miss) {
                    r->data_pointer = rec.data_pointer;
                    cache_insert(r, rec.address);
                }
                break;
            case T_CONTEXT_SWITCH:
                r->tid = rec.tid;
                break;
            default:
                break;
        }
        if (rec.type == 128) {
            if (to_marker && rec.allocator == A_MALLOC && rec.address == address &&
                rec.size == size) {
                return 1;
            }
            if (r->collect != NULL) {
                PyObject *t = Py_BuildValue("(KKKI)", (unsigned long long)r->tid,
                                            (unsigned long long)rec.address,
                                            (unsigned long long)rec.size, rec.allocator);
                if (t == NULL || PyList_Append(r->collect, t) < 0) {
                    Py_XDECREF(t);
                    r->err = ERR_PYTHON;
                    return -1;
                }
                Py_DECREF(t);
            }
            if (r->window_open && account(r, &rec) < 0) {
                return -1;
            }
        }
        else if (rec.type == T_MEMORY_RECORD && r->window_open) {
            if (account(r, &rec) < 0) {
                return -1;
            }
        }
    }
}

static int
parse_header(Reader *r)
{
    /* magic[7], int version, int python_version, bool native_traces, u8 file_format,
     * TrackerStats {size_t, size_t, long long start_time, long long end_time},
     * command_line\0, int pid, unsigned long main_tid, size_t skipped, u8 allocator,
     * bool trace_python_allocators, bool track_object_lifetimes, libdest\0,
     * site_packages strings then "", sys_path strings then "". */
    size_t need = 7 + 4 + 4 + 1 + 1 + 32;
    for (;;) {
        int got = fill(r, need);
        if (got < 0) {
            raise_error(r);
            return -1;
        }
        if (got > 0) {
            PyErr_SetString(PyExc_ValueError, "the capture has no complete memray header");
            return -1;
        }
        const unsigned char *p = r->buf + r->pos, *end = r->buf + r->len;
        int32_t version, pid;
        int64_t start_time;
        if (memcmp(p, MEMRAY_MAGIC, 7) != 0) {
            PyErr_SetString(PyExc_ValueError, "not a memray capture");
            return -1;
        }
        memcpy(&version, p + 7, 4);
        if (version != MEMRAY_HEADER_VERSION) {
            PyErr_Format(PyExc_ValueError, "memray capture version %d (this reader knows %d)",
                         (int)version, MEMRAY_HEADER_VERSION);
            return -1;
        }
        if (p[16] != MEMRAY_ALL_ALLOCATIONS) {
            PyErr_SetString(PyExc_ValueError, "not an ALL_ALLOCATIONS capture");
            return -1;
        }
        int native = p[15] != 0;
        memcpy(&start_time, p + 17 + 16, 8);
        p += 17 + 32;
        if (skip_string(&p, end) != P_OK || skip_bytes(&p, end, 4 + 8 + 8 + 3) != P_OK) {
            need = r->len - r->pos + 4096;
            continue;
        }
        memcpy(&pid, p - (8 + 8 + 3) - 4, 4);
        int rc = skip_string(&p, end); /* libdest */
        for (int list = 0; list < 2 && rc == P_OK; list++) {
            for (;;) {
                const unsigned char *q = p;
                rc = skip_string(&p, end);
                if (rc != P_OK || p - q == 1) {
                    break; /* "" ends the list */
                }
            }
        }
        if (rc == P_MORE) {
            need = r->len - r->pos + 4096;
            continue;
        }
        r->native_traces = native;
        r->start_time_ms = start_time;
        r->header_pid = pid;
        r->pos = (size_t)(p - r->buf);
        r->data_start = r->base + r->pos;
        r->released = r->data_start;
        return 0;
    }
}

static int
Reader_init(Reader *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fd", NULL};
    int fd;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i", kwlist, &fd)) {
        return -1;
    }
    if (r->buf != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Reader already initialised");
        return -1;
    }
    r->fd = fd;
    r->cap = 1 << 16;
    r->buf = raw_alloc(r->cap);
    if (r->buf == NULL || map_init(&r->live, 1024) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return parse_header(r);
}

static void
Reader_dealloc(Reader *r)
{
    raw_free(r->buf);
    raw_free(r->live.slots);
    raw_free(r->ranges);
    raw_free(r->samples);
    Py_XDECREF(r->collect);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
Reader_advance(Reader *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"address", "size", "collect", NULL};
    unsigned long long address = 0, size = 0;
    PyObject *collect = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|KKO", kwlist, &address, &size, &collect)) {
        return NULL;
    }
    if (collect != Py_None && !PyList_Check(collect)) {
        PyErr_SetString(PyExc_TypeError, "collect must be a list or None");
        return NULL;
    }
    if (check_free(r) < 0) {
        return NULL;
    }
    int found;
    r->in_use = 1;
    if (collect == Py_None) {
        /* Parsing needs no Python: the task (or the watcher's) goes on meanwhile. */
        Py_BEGIN_ALLOW_THREADS
        found = advance(r, address, size, address != 0);
        Py_END_ALLOW_THREADS
    }
    else {
        Py_XSETREF(r->collect, Py_NewRef(collect));
        found = advance(r, address, size, address != 0);
        Py_CLEAR(r->collect);
    }
    r->in_use = 0;
    if (found < 0) {
        raise_error(r);
        return NULL;
    }
    return PyBool_FromLong(found);
}

static PyObject *
Reader_open_window(Reader *r, PyObject *Py_UNUSED(ignored))
{
    if (check_free(r) < 0) {
        return NULL;
    }
    reset_window(r);
    if (r->live.slots == NULL) {
        return PyErr_NoMemory();
    }
    r->window_open = 1;
    Py_RETURN_NONE;
}

static PyObject *
Reader_close_window(Reader *r, PyObject *Py_UNUSED(ignored))
{
    /* (peak, allocations at the peak, bytes live now, total allocated, allocations,
     *  [(ms, heap, rss), ...]) over the window, then the window is closed. */
    if (check_free(r) < 0) {
        return NULL;
    }
    PyObject *samples = PyList_New((Py_ssize_t)r->n_samples);
    if (samples == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < r->n_samples; i++) {
        Sample s = r->samples[i];
        PyObject *t = Py_BuildValue("(KKK)", (unsigned long long)s.ms,
                                    (unsigned long long)s.heap, (unsigned long long)s.rss);
        if (t == NULL) {
            Py_DECREF(samples);
            return NULL;
        }
        PyList_SET_ITEM(samples, (Py_ssize_t)i, t);
    }
    r->window_open = 0;
    return Py_BuildValue("(KKKKKN)", (unsigned long long)r->peak,
                         (unsigned long long)r->count_at_peak,
                         (unsigned long long)(r->live_simple + r->live_ranged),
                         (unsigned long long)r->total_allocated,
                         (unsigned long long)r->allocation_count, samples);
}

static PyObject *
Reader_release(Reader *r, PyObject *Py_UNUSED(ignored))
{
    /* Punch the whole pages read so far (after the header's) out of the file: the capture
     * then holds only what was not read yet. The writer never writes there again (it
     * appends; at its end it rewrites the header only). Returns the bytes released, or
     * -1 when the file system cannot (then the caller keeps the capture small otherwise). */
    if (check_free(r) < 0) {
        return NULL;
    }
    if (r->release_failed) {
        return PyLong_FromLong(-1);
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) {
        page = 4096;
    }
    uint64_t from = (r->released + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
    uint64_t to = (r->base + r->pos) / (uint64_t)page * (uint64_t)page;
    if (to <= from) {
        return PyLong_FromLong(0);
    }
    if (fallocate(r->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from,
                  (off_t)(to - from)) != 0) {
        r->release_failed = errno ? errno : -1;
        return PyLong_FromLong(-1);
    }
    r->released = to;
    return PyLong_FromUnsignedLongLong((unsigned long long)(to - from));
}

static PyObject *
Reader_get_offset(Reader *r, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong((unsigned long long)(r->base + r->pos));
}

static PyObject *
Reader_get_native_traces(Reader *r, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(r->native_traces);
}

static PyObject *
Reader_get_start_time_ms(Reader *r, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(r->start_time_ms);
}

static PyObject *
Reader_get_pid(Reader *r, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(r->header_pid);
}

static PyMethodDef Reader_methods[] = {
    {"advance", (PyCFunction)(void (*)(void))Reader_advance, METH_VARARGS | METH_KEYWORDS,
     "advance(address=0, size=0, collect=None) -> bool\n\n"
     "Read records until the marker (the MALLOC of size at address) is consumed, or,\n"
     "without a marker, until the written data ends. True if the marker was found."},
    {"release", (PyCFunction)Reader_release, METH_NOARGS,
     "release() -> int: punch the pages read so far out of the file; the bytes released,\n"
     "or -1 if the file system cannot."},
    {"open_window", (PyCFunction)Reader_open_window, METH_NOARGS,
     "Account every record read from now on, from zero (a task's start)."},
    {"close_window", (PyCFunction)Reader_close_window, METH_NOARGS,
     "close_window() -> (peak, allocations_at_peak, live_bytes, total_allocated,\n"
     "allocation_count, samples): the window's figures; the window is closed."},
    {NULL},
};

static PyObject *
Reader_get_peak_after(Reader *r, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(r->peak_after);
}

static PyGetSetDef Reader_getset[] = {
    {"offset", (getter)Reader_get_offset, NULL, "bytes of the capture read", NULL},
    {"native_traces", (getter)Reader_get_native_traces, NULL, "the capture has native frames",
     NULL},
    {"start_time_ms", (getter)Reader_get_start_time_ms, NULL, "the capture's start (epoch ms)",
     NULL},
    {"pid", (getter)Reader_get_pid, NULL, "the process the capture is of", NULL},
    {"peak_after", (getter)Reader_get_peak_after, NULL,
     "how many of the last window's samples were taken before its peak was (last) reached: "
     "the peak fell between those two samples (memray's 10 ms snapshots miss a short one)",
     NULL},
    {NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tracer.ray._memray_reader.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(fd): follows the live memray capture (ALL_ALLOCATIONS) open as fd.\n\n"
              "One thread at a time: advance() parses without the GIL, and a call from\n"
              "another thread meanwhile raises RuntimeError.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
};

/* ----------------------------------------------------------------- markers */

static PyObject *
marker_alloc(PyObject *Py_UNUSED(module), PyObject *arg)
{
    size_t size = PyLong_AsSize_t(arg);
    if (size == (size_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    /* volatile: the call must happen (a compiler may drop a malloc whose block is unused). */
    void *volatile block = malloc(size);
    if (block == NULL) {
        return PyErr_NoMemory();
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)block);
}

static PyObject *
marker_free(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long long address = PyLong_AsUnsignedLongLong(arg);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    free((void *)(uintptr_t)address);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"marker_alloc", marker_alloc, METH_O,
     "marker_alloc(size) -> address: malloc(size), recorded by an active memray tracker."},
    {"marker_free", marker_free, METH_O, "marker_free(address): free a marker_alloc block."},
    {NULL},
};

static struct PyModuleDef reader_module = {
    PyModuleDef_HEAD_INIT,
    "tracer.ray._memray_reader",
    "Follows a live memray capture task by task (see _memray_reader.c).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__memray_reader(void)
{
    if (PyType_Ready(&ReaderType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&reader_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "HEADER_VERSION", MEMRAY_HEADER_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
