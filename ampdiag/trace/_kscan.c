/* A scanner for runs of Kineto trace events: the fast reader's optional compiled core.
 *
 * Scanner(groups).feed(run) parses a JSON array of trace events (the runs the fast reader
 * cuts, see ampdiag/trace/fastread.py) and appends, for each complete ("X") event, its
 * fields to column buffers, routed by category exactly as ampdiag.trace.builder does:
 * GPU activities (g_*), launch calls with a correlation id (l_*), host events (h_*).
 * Names and pids are interned here; state() returns what ColumnBuilder.state() returns, so
 * the Python side absorbs it unchanged.
 *
 * It accepts exactly what the msgspec path accepts and raises ValueError at anything else
 * (the caller then reads the file with the msgspec or the standard-library path): a "ph"
 * outside the Chrome trace phases, a complete event without a string name/cat or a finite
 * ts / non-negative dur, a non-integer stream/correlation, a float or escaped pid, a cat
 * with an escape, invalid JSON. Bytes are not checked for UTF-8 here (the caller does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 512

/* ---- growable buffers ---------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *d = PyMem_Realloc(b->data, cap);
    if (!d) { PyErr_NoMemory(); return -1; }
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline int put_f64(Buf *b, double v) {
    if (buf_reserve(b, 8) < 0) return -1;
    memcpy(b->data + b->len, &v, 8);
    b->len += 8;
    return 0;
}

static inline int put_i64(Buf *b, int64_t v) {
    if (buf_reserve(b, 8) < 0) return -1;
    memcpy(b->data + b->len, &v, 8);
    b->len += 8;
    return 0;
}

/* ---- interning of byte strings -------------------------------------------------------- */

typedef struct {
    Buf arena;          /* the bytes of every distinct key, one after another */
    Py_ssize_t *start;  /* per id: offset in arena */
    Py_ssize_t *size;   /* per id: length */
    char *escaped;      /* per id: holds JSON escapes (the caller decodes it) */
    Py_ssize_t n, cap;  /* ids */
    Py_ssize_t *slots;  /* open addressing: id + 1, 0 = empty */
    Py_ssize_t nslots;
} Table;

static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ULL; }
    return h;
}

static int table_grow(Table *t) {
    Py_ssize_t nslots = t->nslots ? t->nslots * 2 : 1024;
    Py_ssize_t *slots = PyMem_Calloc(nslots, sizeof(Py_ssize_t));
    if (!slots) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t id = 0; id < t->n; id++) {
        uint64_t h = hash_bytes(t->arena.data + t->start[id], t->size[id]);
        Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)(nslots - 1));
        while (slots[i]) i = (i + 1) & (nslots - 1);
        slots[i] = id + 1;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->nslots = nslots;
    return 0;
}

/* The id of key p[0:n] (escaped: whether it holds a backslash), adding it when new. */
static Py_ssize_t table_id(Table *t, const char *p, Py_ssize_t n, int escaped) {
    if ((t->n + 1) * 2 > t->nslots && table_grow(t) < 0) return -1;
    uint64_t h = hash_bytes(p, n);
    Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)(t->nslots - 1));
    while (t->slots[i]) {
        Py_ssize_t id = t->slots[i] - 1;
        if (t->size[id] == n && memcmp(t->arena.data + t->start[id], p, n) == 0) return id;
        i = (i + 1) & (t->nslots - 1);
    }
    if (t->n == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 256;
        Py_ssize_t *s = PyMem_Realloc(t->start, cap * sizeof(Py_ssize_t));
        if (!s) { PyErr_NoMemory(); return -1; }
        t->start = s;
        Py_ssize_t *z = PyMem_Realloc(t->size, cap * sizeof(Py_ssize_t));
        if (!z) { PyErr_NoMemory(); return -1; }
        t->size = z;
        char *e = PyMem_Realloc(t->escaped, cap);
        if (!e) { PyErr_NoMemory(); return -1; }
        t->escaped = e;
        t->cap = cap;
    }
    if (buf_reserve(&t->arena, n) < 0) return -1;
    memcpy(t->arena.data + t->arena.len, p, n);
    t->start[t->n] = t->arena.len;
    t->size[t->n] = n;
    t->escaped[t->n] = (char)escaped;
    t->arena.len += n;
    t->slots[i] = t->n + 1;
    return t->n++;
}

static void table_free(Table *t) {
    PyMem_Free(t->arena.data);
    PyMem_Free(t->start);
    PyMem_Free(t->size);
    PyMem_Free(t->escaped);
    PyMem_Free(t->slots);
    memset(t, 0, sizeof(*t));
}

/* ---- the scanner object ---------------------------------------------------------------- */

enum { G_TS, G_DUR, G_STREAM, G_CORR, G_NAME, G_KIND, L_CORR, L_TS, L_DUR, L_NAME,
       H_TS, H_DUR, H_NAME, H_PID, H_KIND, NCOLS };
static const char *COLUMN_NAMES[NCOLS] = {
    "g_ts", "g_dur", "g_stream", "g_corr", "g_name", "g_kind", "l_corr", "l_ts", "l_dur",
    "l_name", "h_ts", "h_dur", "h_name", "h_pid", "h_kind"};

/* group codes (given by the caller per category): */
enum { GROUP_KERNEL = 0, GROUP_MEMCPY = 1, GROUP_MEMSET = 2, GROUP_LAUNCH = 3, GROUP_OP = 4,
       GROUP_ANNOTATION = 5, GROUP_OTHER = 6 };

typedef struct {
    PyObject_HEAD
    PyObject *groups;   /* dict: category (bytes) -> group code (int) */
    Table names, pids, cats;
    int *cat_group;     /* per cat id */
    Py_ssize_t cat_group_cap;
    Buf cols[NCOLS];
    Py_ssize_t events;
} Scanner;

typedef struct {
    const char *p, *end;
} Cursor;

static int fail(const char *what) {
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

/* A string at c->p (the opening quote): its content [*s, *s + *n), escaped if any '\'. */
static int parse_string(Cursor *c, const char **s, Py_ssize_t *n, int *escaped) {
    if (c->p >= c->end || *c->p != '"') return fail("expected a string");
    const char *p = ++c->p;
    int esc = 0;
    while (p < c->end) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"') {
            *s = c->p;
            *n = p - c->p;
            *escaped = esc;
            c->p = p + 1;
            return 0;
        }
        if (ch == '\\') {
            esc = 1;
            if (p + 1 >= c->end) break;
            char e = p[1];
            if (e == 'u') {
                if (p + 6 > c->end) break;
                for (int k = 2; k < 6; k++)
                    if (!isxdigit((unsigned char)p[k])) return fail("bad \\u escape");
                p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return fail("bad escape");
            p += 2;
            continue;
        }
        if (ch < 0x20) return fail("control character in a string");
        p++;
    }
    return fail("unterminated string");
}

/* A number token at c->p: [*s, *s + *n); integer = no fraction or exponent. */
static int parse_number(Cursor *c, const char **s, Py_ssize_t *n, int *integer) {
    const char *p = c->p, *start = p;
    if (p < c->end && *p == '-') p++;
    if (p >= c->end) return fail("bad number");
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < c->end && *p >= '0' && *p <= '9') p++; }
    else return fail("bad number");
    int isint = 1;
    if (p < c->end && *p == '.') {
        isint = 0;
        p++;
        if (p >= c->end || *p < '0' || *p > '9') return fail("bad number");
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        isint = 0;
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        if (p >= c->end || *p < '0' || *p > '9') return fail("bad number");
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    *s = start;
    *n = p - start;
    *integer = isint;
    c->p = p;
    return 0;
}

static int to_double(const char *s, Py_ssize_t n, int integer, double *out) {
    if (integer && n <= 16) {  /* |v| < 10^16 fits a double's 53 bits exactly: no rounding */
        int neg = s[0] == '-';
        int64_t v = 0;
        for (Py_ssize_t i = neg; i < n; i++) v = v * 10 + (s[i] - '0');
        if (v < (1LL << 53)) {
            *out = neg ? -(double)v : (double)v;
            return 0;
        }
    }
    char tmp[64];
    if (n >= (Py_ssize_t)sizeof(tmp)) return fail("number too long");
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *endp;
    double v = PyOS_string_to_double(tmp, &endp, NULL);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    if (endp != tmp + n) return fail("bad number");
    *out = v;
    return 0;
}

static int to_int64(const char *s, Py_ssize_t n, int64_t *out) {
    int neg = 0;
    Py_ssize_t i = 0;
    if (i < n && s[i] == '-') { neg = 1; i++; }
    uint64_t v = 0;
    for (; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return fail("integer out of range");
        v = v * 10 + d;
    }
    if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)
        return fail("integer out of range");
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* An object key and its ':' (escaped: whether the key holds a backslash). */
static int parse_key(Cursor *c, const char **k, Py_ssize_t *kn, int *escaped) {
    if (parse_string(c, k, kn, escaped) < 0) return -1;
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':') return fail("expected ':'");
    c->p++;
    skip_ws(c);
    return 0;
}

static int skip_value(Cursor *c, int depth);

static int skip_container(Cursor *c, int depth, char close) {
    if (depth > MAX_DEPTH) return fail("nested too deeply");
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) { c->p++; return 0; }
    for (;;) {
        if (close == '}') {
            const char *s; Py_ssize_t n; int e;
            if (parse_key(c, &s, &n, &e) < 0) return -1;
        }
        if (skip_value(c, depth + 1) < 0) return -1;
        skip_ws(c);
        if (c->p >= c->end) return fail("unterminated container");
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (*c->p == close) { c->p++; return 0; }
        return fail("expected ',' or the container's end");
    }
}

static int skip_value(Cursor *c, int depth) {
    if (c->p >= c->end) return fail("expected a value");
    char ch = *c->p;
    if (ch == '"') { const char *s; Py_ssize_t n; int e; return parse_string(c, &s, &n, &e); }
    if (ch == '{') return skip_container(c, depth, '}');
    if (ch == '[') return skip_container(c, depth, ']');
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        const char *s; Py_ssize_t n; int i;
        return parse_number(c, &s, &n, &i);
    }
    static const char *lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t m = strlen(lits[k]);
        if ((size_t)(c->end - c->p) >= m && memcmp(c->p, lits[k], m) == 0) { c->p += m; return 0; }
    }
    return fail("unexpected value");
}

static inline int key_is(const char *s, Py_ssize_t n, const char *lit) {
    return (Py_ssize_t)strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* args: {"stream": int, "correlation": int, ...}, null allowed. */
static int parse_args(Cursor *c, int64_t *stream, int64_t *corr) {
    if (c->p < c->end && *c->p == 'n') return skip_value(c, 1);
    if (c->p >= c->end || *c->p != '{') return fail("args is not an object");
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; return 0; }
    for (;;) {
        const char *k; Py_ssize_t kn; int ke;
        if (parse_key(c, &k, &kn, &ke) < 0) return -1;
        int64_t *target = NULL;
        if (ke) return fail("escaped key");
        if (key_is(k, kn, "stream")) target = stream;
        else if (key_is(k, kn, "correlation")) target = corr;
        if (target) {
            const char *s; Py_ssize_t n; int isint;
            if (c->p >= c->end || !(*c->p == '-' || (*c->p >= '0' && *c->p <= '9')))
                return fail("not an integer");
            if (parse_number(c, &s, &n, &isint) < 0) return -1;
            if (!isint) return fail("not an integer");
            if (to_int64(s, n, target) < 0) return -1;
        } else if (skip_value(c, 2) < 0) {
            return -1;
        }
        skip_ws(c);
        if (c->p >= c->end) return fail("unterminated args");
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (*c->p == '}') { c->p++; return 0; }
        return fail("expected ',' or '}'");
    }
}

static const char *PHASES = "BEiICbnestfPONDMVvRc()TSpF";

static int cat_group(Scanner *self, Py_ssize_t id) {
    if (id >= self->cat_group_cap) {
        Py_ssize_t cap = self->cat_group_cap ? self->cat_group_cap * 2 : 64;
        while (cap <= id) cap *= 2;
        int *g = PyMem_Realloc(self->cat_group, cap * sizeof(int));
        if (!g) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = self->cat_group_cap; i < cap; i++) g[i] = -1;
        self->cat_group = g;
        self->cat_group_cap = cap;
    }
    if (self->cat_group[id] < 0) {
        PyObject *key = PyBytes_FromStringAndSize(
            self->cats.arena.data + self->cats.start[id], self->cats.size[id]);
        if (!key) return -1;
        PyObject *got = PyDict_GetItemWithError(self->groups, key);
        Py_DECREF(key);
        if (!got && PyErr_Occurred()) return -1;
        long g = got ? PyLong_AsLong(got) : GROUP_OTHER;
        if (g == -1 && PyErr_Occurred()) return -1;
        self->cat_group[id] = (int)g;
    }
    return self->cat_group[id];
}

static int parse_event(Scanner *self, Cursor *c) {
    if (c->p >= c->end || *c->p != '{') return fail("an event is not an object");
    c->p++;
    skip_ws(c);
    const char *ph = NULL, *name = NULL, *cat = NULL;
    Py_ssize_t phn = 0, namen = 0, catn = 0;
    int name_esc = 0, has_ts = 0, has_dur = 0;
    double ts = 0, dur = 0;
    const char *pid = "null";
    Py_ssize_t pidn = 4;
    int64_t stream = -1, corr = -1;
    /* Fields are parsed as met; a non-"X" event's fields are validated only by skipping. */
    if (c->p < c->end && *c->p == '}') return fail("an event without ph");
    for (;;) {
        const char *k; Py_ssize_t kn; int ke;
        if (parse_key(c, &k, &kn, &ke) < 0) return -1;
        if (ke) {
            /* msgspec matches an escaped key to its field ("n\u0061me" is name): refuse */
            return fail("escaped key");
        } else if (key_is(k, kn, "ph")) {
            int e;
            if (parse_string(c, &ph, &phn, &e) < 0) return -1;
            if (e) return fail("escaped ph");
        } else if (key_is(k, kn, "name")) {
            if (c->p >= c->end || *c->p != '"') { name = NULL; if (skip_value(c, 1) < 0) return -1; namen = -1; }
            else if (parse_string(c, &name, &namen, &name_esc) < 0) return -1;
        } else if (key_is(k, kn, "cat")) {
            int e = 0;
            if (c->p >= c->end || *c->p != '"') { cat = NULL; if (skip_value(c, 1) < 0) return -1; catn = -1; }
            else {
                if (parse_string(c, &cat, &catn, &e) < 0) return -1;
                if (e) return fail("escaped cat");
            }
        } else if (key_is(k, kn, "ts") || key_is(k, kn, "dur")) {
            int is_ts = kn == 2;
            const char *s; Py_ssize_t n; int isint; double v;
            if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
                if (parse_number(c, &s, &n, &isint) < 0) return -1;
                if (to_double(s, n, isint, &v) < 0) return -1;
                if (is_ts) { ts = v; has_ts = 1; } else { dur = v; has_dur = 1; }
            } else {
                if (skip_value(c, 1) < 0) return -1;
                if (is_ts) has_ts = -1; else has_dur = -1;  /* not a number */
            }
        } else if (key_is(k, kn, "pid")) {
            if (c->p < c->end && *c->p == '"') {
                int e;
                if (parse_string(c, &pid, &pidn, &e) < 0) return -1;
                if (e) { pid = NULL; }
            } else if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
                int isint;
                if (parse_number(c, &pid, &pidn, &isint) < 0) return -1;
                if (!isint) pid = NULL;
            } else if (c->p + 4 <= c->end && memcmp(c->p, "null", 4) == 0) {
                c->p += 4;
                pid = "null";
                pidn = 4;
            } else {
                if (skip_value(c, 1) < 0) return -1;
                pid = NULL;
            }
        } else if (key_is(k, kn, "args")) {
            stream = -1;
            corr = -1;
            const char *mark = c->p;
            if (parse_args(c, &stream, &corr) < 0) {
                /* A non-"X" event's args may hold anything: skip them instead. */
                PyErr_Clear();
                c->p = mark;
                if (skip_value(c, 1) < 0) return -1;
                stream = corr = INT64_MIN;  /* invalid if this turns out to be "X" */
            }
        } else if (skip_value(c, 1) < 0) {
            return -1;
        }
        skip_ws(c);
        if (c->p >= c->end) return fail("unterminated event");
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (*c->p == '}') { c->p++; break; }
        return fail("expected ',' or '}'");
    }
    self->events++;
    if (!ph) return fail("an event without ph");
    if (!(phn == 1 && ph[0] == 'X')) {
        if (phn == 1 && strchr(PHASES, ph[0]) && ph[0]) return 0;
        return fail("unknown phase");
    }
    /* a complete event: the msgspec path's rules */
    if (!name || namen < 0 || !cat || catn < 0) return fail("X event without name or cat");
    if (has_ts != 1 || has_dur != 1) return fail("X event without numeric ts or dur");
    if (!(fabs(ts) <= 1e300) || !(dur >= 0.0 && dur <= 1e300)) return fail("ts or dur out of range");
    if (!pid) return fail("pid is not an int, a string or null");
    if (stream == INT64_MIN || corr == INT64_MIN) return fail("bad args");
    Py_ssize_t cid = table_id(&self->cats, cat, catn, 0);
    if (cid < 0) return -1;
    int group = cat_group(self, cid);
    if (group < 0) return -1;
    Py_ssize_t nid = table_id(&self->names, name, namen, name_esc);
    if (nid < 0) return -1;
    Buf *col = self->cols;
    if (group <= GROUP_MEMSET) {
        if (put_f64(&col[G_TS], ts) < 0 || put_f64(&col[G_DUR], dur) < 0 ||
            put_i64(&col[G_STREAM], stream) < 0 || put_i64(&col[G_CORR], corr) < 0 ||
            put_i64(&col[G_NAME], nid) < 0 || put_i64(&col[G_KIND], group) < 0)
            return -1;
    } else if (group == GROUP_LAUNCH) {
        if (corr < 0) return 0;
        if (put_i64(&col[L_CORR], corr) < 0 || put_f64(&col[L_TS], ts) < 0 ||
            put_f64(&col[L_DUR], dur) < 0 || put_i64(&col[L_NAME], nid) < 0)
            return -1;
    } else {
        Py_ssize_t pidid = table_id(&self->pids, pid, pidn, 0);
        if (pidid < 0) return -1;
        int kind = group == GROUP_OP ? 0 : group == GROUP_ANNOTATION ? 1 : 2;
        if (put_f64(&col[H_TS], ts) < 0 || put_f64(&col[H_DUR], dur) < 0 ||
            put_i64(&col[H_NAME], nid) < 0 || put_i64(&col[H_PID], pidid) < 0 ||
            put_i64(&col[H_KIND], kind) < 0)
            return -1;
    }
    return 0;
}

static PyObject *Scanner_feed(Scanner *self, PyObject *arg) {
    if (!self->groups) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner() was not initialised");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Cursor c = {(const char *)view.buf, (const char *)view.buf + view.len};
    int rc = 0;
    Py_ssize_t events = self->events;
    Py_ssize_t lens[NCOLS];
    for (int i = 0; i < NCOLS; i++) lens[i] = self->cols[i].len;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '[') rc = fail("expected '['");
    if (rc == 0) {
        c.p++;
        skip_ws(&c);
        if (c.p < c.end && *c.p == ']') c.p++;
        else {
            for (;;) {
                if ((rc = parse_event(self, &c)) < 0) break;
                skip_ws(&c);
                if (c.p < c.end && *c.p == ',') { c.p++; skip_ws(&c); continue; }
                if (c.p < c.end && *c.p == ']') { c.p++; break; }
                rc = fail("expected ',' or ']'");
                break;
            }
        }
    }
    if (rc == 0) {
        skip_ws(&c);
        if (c.p != c.end) rc = fail("data after the events");
    }
    PyBuffer_Release(&view);
    if (rc < 0) {  /* leave nothing of a run that failed */
        self->events = events;
        for (int i = 0; i < NCOLS; i++) self->cols[i].len = lens[i];
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *table_list(Table *t, int with_escapes) {
    PyObject *out = PyList_New(t->n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(t->arena.data + t->start[i], t->size[i], "strict");
        if (!s) { Py_DECREF(out); return NULL; }
        if (with_escapes && t->escaped[i]) {  /* a tuple: the caller decodes the escapes */
            PyObject *tup = Py_BuildValue("(N)", s);
            if (!tup) { Py_DECREF(out); return NULL; }
            s = tup;
        }
        PyList_SET_ITEM(out, i, s);
    }
    return out;
}

/* (events, names, pids, columns): names a list of str, or 1-tuples (str with its JSON
   escapes still in) the caller decodes; pids the pid texts; columns name -> bytes. */
static PyObject *Scanner_state(Scanner *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *names = table_list(&self->names, 1);
    if (!names) return NULL;
    PyObject *pids = table_list(&self->pids, 0);
    if (!pids) { Py_DECREF(names); return NULL; }
    PyObject *cols = PyDict_New();
    if (!cols) { Py_DECREF(names); Py_DECREF(pids); return NULL; }
    for (int i = 0; i < NCOLS; i++) {
        if (!self->cols[i].len) continue;
        PyObject *b = PyBytes_FromStringAndSize(self->cols[i].data, self->cols[i].len);
        if (!b || PyDict_SetItemString(cols, COLUMN_NAMES[i], b) < 0) {
            Py_XDECREF(b); Py_DECREF(names); Py_DECREF(pids); Py_DECREF(cols);
            return NULL;
        }
        Py_DECREF(b);
    }
    return Py_BuildValue("(nNNN)", self->events, names, pids, cols);
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    PyObject *groups;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &groups)) return -1;
    Py_INCREF(groups);
    Py_XSETREF(self->groups, groups);
    return 0;
}

static void Scanner_dealloc(Scanner *self) {
    Py_XDECREF(self->groups);
    table_free(&self->names);
    table_free(&self->pids);
    table_free(&self->cats);
    PyMem_Free(self->cat_group);
    for (int i = 0; i < NCOLS; i++) PyMem_Free(self->cols[i].data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Scanner_methods[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_O,
     "Appends the columns of a JSON array of trace events; ValueError at anything odd."},
    {"state", (PyCFunction)Scanner_state, METH_NOARGS,
     "(events, names, pids, columns) read so far."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ampdiag.trace._kscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_doc = "Scanner(groups): columns of Kineto trace events (groups: category bytes -> code).",
};

static struct PyModuleDef kscan_module = {
    PyModuleDef_HEAD_INIT, "_kscan", "Compiled scanner of Kineto trace events.", -1, NULL};

PyMODINIT_FUNC PyInit__kscan(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&kscan_module);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
