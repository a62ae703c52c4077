/* Compiled per-frame kernels of the media path: the echo gate's (media/echo_gate.py,
 * chosen in media/echo_kernels.py), the line echo canceller's (media/line_echo.py) and
 * the polyphase resampler's (media/polyphase.py).
 *
 * Why by hand: each call's media runs a few dozen numpy operations per 20 ms frame on
 * small arrays, and numpy's cost per call (~1-4 us, more inside a loaded gateway) is
 * most of it; no library offers these loops. The echo gate's kernels are the exact
 * loops of the numpy code they replace (same operations in the same order on IEEE
 * doubles, so the same results); the resampler's sums in double where numpy summed in
 * float32 (its output within one PCM step of numpy's); the line canceller's step sums
 * in index order where numpy's dot products sum in the order of the BLAS kernel picked
 * for the CPU (so within ~1e-11 relative of numpy's, as numpy on one CPU is of numpy on
 * another; its solve stays numpy's). Where this module is not built the numpy code runs
 * instead. Plain C on the buffer protocol: no numpy headers,
 * nothing to build but a C compiler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* A C-contiguous 1-D buffer of doubles; writable when asked. */
static int
get_doubles(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    if (view->ndim != 1 || view->itemsize != sizeof(double) || view->format == NULL ||
        strcmp(view->format, "d") != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D contiguous float64 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int
get_double(PyObject *obj, double *out)
{
    *out = PyFloat_AsDouble(obj);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

PyDoc_STRVAR(prove_lags_doc,
"prove_lags(window, proof, lag_erl, spread, level, wobble, max_erl, min_erl, rise,\n"
"           floor, silence, bound_on, allowed, clean) -> (echo, clean)\n\n"
"media/echo_kernels.py prove_lags_numpy in C, the same steps in the same order:\n"
"raise each lag's proven ERL bound from a frame at ``level`` and step ``lag_erl``\n"
"towards it (both updated in place); returns the loudest echo any lag allows\n"
"(``silence`` unless ``allowed``) and whether every lag is proven clean.");

static PyObject *
prove_lags(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 14) {
        PyErr_Format(PyExc_TypeError, "prove_lags takes 14 arguments, got %zd", nargs);
        return NULL;
    }
    double level, wobble, max_erl, min_erl, rise, floor_db, silence;
    Py_ssize_t spread = PyLong_AsSsize_t(args[3]);
    if (spread == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (get_double(args[4], &level) || get_double(args[5], &wobble) ||
        get_double(args[6], &max_erl) || get_double(args[7], &min_erl) ||
        get_double(args[8], &rise) || get_double(args[9], &floor_db) ||
        get_double(args[10], &silence)) {
        return NULL;
    }
    int bound_on = PyObject_IsTrue(args[11]);
    int allowed = PyObject_IsTrue(args[12]);
    int clean = PyObject_IsTrue(args[13]);
    if (bound_on < 0 || allowed < 0 || clean < 0) {
        return NULL;
    }
    Py_buffer wv, pv, ev;
    if (get_doubles(args[0], &wv, 0, "window") < 0) {
        return NULL;
    }
    if (get_doubles(args[1], &pv, 1, "proof") < 0) {
        PyBuffer_Release(&wv);
        return NULL;
    }
    if (get_doubles(args[2], &ev, 1, "lag_erl") < 0) {
        PyBuffer_Release(&wv);
        PyBuffer_Release(&pv);
        return NULL;
    }
    const double *window = (const double *)wv.buf;
    double *proof = (double *)pv.buf;
    double *lag_erl = (double *)ev.buf;
    Py_ssize_t lags = pv.shape[0];
    Py_ssize_t span = 2 * spread + 1;
    double echo = silence;
    if (spread < 0 || lags < 1 || ev.shape[0] != lags || wv.shape[0] != lags + 2 * spread) {
        PyErr_SetString(PyExc_ValueError,
                        "need len(lag_erl) == len(proof) >= 1 and len(window) == lags + 2 * spread");
        goto fail;
    }

    /* peak = window.max(); nothing played over the lag range: nothing to prove. */
    double peak = window[0];
    for (Py_ssize_t i = 1; i < wv.shape[0]; i++) {
        if (window[i] > peak) {
            peak = window[i];
        }
    }
    if (peak <= floor_db) {
        goto done;
    }
    if (clean) {
        if (allowed) {
            echo = peak - max_erl;
        }
        goto done;
    }
    /* quietest = shifted.min(axis=0); bound = where(quietest > floor,
     * quietest - level - wobble, -inf); proof = maximum(proof, minimum(bound, max_erl));
     * lag_erl = minimum(maximum(proof, min_erl), lag_erl + rise). */
    int all_clean = 1;
    for (Py_ssize_t j = 0; j < lags; j++) {
        if (bound_on) {
            double quietest = window[j];
            for (Py_ssize_t k = 1; k < span; k++) {
                if (window[j + k] < quietest) {
                    quietest = window[j + k];
                }
            }
            double bound = quietest > floor_db ? quietest - level - wobble : -INFINITY;
            if (max_erl < bound) {
                bound = max_erl;
            }
            if (bound > proof[j]) {
                proof[j] = bound;
            }
        }
        double target = proof[j] > min_erl ? proof[j] : min_erl;
        double raised = lag_erl[j] + rise;
        lag_erl[j] = raised < target ? raised : target;
        if (!(lag_erl[j] >= max_erl)) {
            all_clean = 0;
        }
    }
    clean = all_clean;
    if (allowed) {
        /* max over lags of (loudest render within the spread - weakest ERL within it). */
        double best = -INFINITY;
        for (Py_ssize_t j = 0; j < lags; j++) {
            double loudest = window[j];
            for (Py_ssize_t k = 1; k < span; k++) {
                if (window[j + k] > loudest) {
                    loudest = window[j + k];
                }
            }
            Py_ssize_t lo = j - spread < 0 ? 0 : j - spread;
            Py_ssize_t hi = j + spread >= lags ? lags - 1 : j + spread;
            double weakest = lag_erl[lo];
            for (Py_ssize_t k = lo + 1; k <= hi; k++) {
                if (lag_erl[k] < weakest) {
                    weakest = lag_erl[k];
                }
            }
            double allows = loudest - weakest;
            if (allows > best) {
                best = allows;
            }
        }
        echo = best;
    }
done:
    PyBuffer_Release(&wv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&ev);
    return Py_BuildValue("(dO)", echo, clean ? Py_True : Py_False);
fail:
    PyBuffer_Release(&wv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&ev);
    return NULL;
}

PyDoc_STRVAR(pre_emphasis_doc,
"pre_emphasis(x, out, coefficient) -> None\n\n"
"media/echo_kernels.py pre_emphasis_numpy in C: out[i] = x[i] - coefficient * x[i - 1],\n"
"x[-1] taken as 0 (``out`` may not overlap ``x``).");

static PyObject *
pre_emphasis(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "pre_emphasis takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    double coefficient;
    if (get_double(args[2], &coefficient)) {
        return NULL;
    }
    Py_buffer xv, ov;
    if (get_doubles(args[0], &xv, 0, "x") < 0) {
        return NULL;
    }
    if (get_doubles(args[1], &ov, 1, "out") < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    const double *x = (const double *)xv.buf;
    double *out = (double *)ov.buf;
    Py_ssize_t n = xv.shape[0];
    const char *lo_x = (const char *)xv.buf, *hi_x = lo_x + xv.len;
    const char *lo_o = (const char *)ov.buf, *hi_o = lo_o + ov.len;
    if (ov.shape[0] != n || (n > 0 && lo_o < hi_x && lo_x < hi_o)) {
        PyErr_SetString(PyExc_ValueError, "out must be as long as x and apart from it");
        PyBuffer_Release(&xv);
        PyBuffer_Release(&ov);
        return NULL;
    }
    double previous = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double scaled = coefficient * previous;
        out[i] = x[i] - scaled;
        previous = x[i];
    }
    PyBuffer_Release(&xv);
    PyBuffer_Release(&ov);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ncc_peak_doc,
"ncc_peak(corr, r, n_c, c_energy, min_share) -> (best, offset)\n\n"
"media/echo_kernels.py ncc_peak_numpy in C: the best normalised cross-correlation\n"
"over every offset the render ``r`` allows a capture of ``n_c`` samples, and its\n"
"offset (the first of equals). The render energies are numpy's cumsum, summed in the\n"
"same order.");

static PyObject *
ncc_peak(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "ncc_peak takes 5 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t n_c = PyLong_AsSsize_t(args[2]);
    if (n_c == -1 && PyErr_Occurred()) {
        return NULL;
    }
    double c_energy, min_share;
    if (get_double(args[3], &c_energy) || get_double(args[4], &min_share)) {
        return NULL;
    }
    Py_buffer cv, rv;
    if (get_doubles(args[0], &cv, 0, "corr") < 0) {
        return NULL;
    }
    if (get_doubles(args[1], &rv, 0, "r") < 0) {
        PyBuffer_Release(&cv);
        return NULL;
    }
    const double *corr = (const double *)cv.buf;
    const double *r = (const double *)rv.buf;
    Py_ssize_t valid = rv.shape[0] - n_c + 1;
    if (n_c < 0 || valid < 1 || cv.shape[0] < valid) {
        PyErr_SetString(PyExc_ValueError,
                        "need 0 <= n_c <= len(r) and len(corr) >= len(r) - n_c + 1");
        PyBuffer_Release(&cv);
        PyBuffer_Release(&rv);
        return NULL;
    }
    double floor_energy = c_energy * min_share;
    /* upper = squares[k + n_c], lower = squares[k]: numpy's cumsum of r * r, the same
     * sums in the same order, each run from 0. */
    double upper = 0.0;
    for (Py_ssize_t i = 0; i < n_c; i++) {
        double square = r[i] * r[i];
        upper += square;
    }
    double lower = 0.0;
    double best = 0.0;
    Py_ssize_t best_at = -1;
    for (Py_ssize_t k = 0; k < valid; k++) {
        if (k > 0) {
            double leaving = r[k - 1] * r[k - 1];
            lower += leaving;
            double entering = r[k + n_c - 1] * r[k + n_c - 1];
            upper += entering;
        }
        double energy = upper - lower;
        double score = 0.0;
        if (energy > floor_energy) {
            double product = energy * c_energy;
            score = corr[k] / sqrt(product);
        }
        /* numpy's argmax: the first maximum, the first NaN counting as one. */
        if (best_at < 0 || (best == best && (score != score || score > best))) {
            best = score;
            best_at = k;
        }
    }
    PyBuffer_Release(&cv);
    PyBuffer_Release(&rv);
    return Py_BuildValue("(dn)", best, best_at);
}

/* A C-contiguous buffer of floats (any shape), read only. */
static int
get_floats(PyObject *obj, Py_buffer *view, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (view->itemsize != sizeof(float) || view->format == NULL ||
        strcmp(view->format, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous float32 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(polyphase_pcm16_doc,
"polyphase_pcm16(x, coefficients, width, up, down, periods) -> bytes\n\n"
"media/polyphase.py PolyphaseResampler's product of the input's sliding windows with\n"
"the filter's phases, rounded (half to even) and saturated to s16le: output sample\n"
"p * up + r is the sum over j < width of x[p * down + j] * coefficients[j, r],\n"
"summed in double.");

static PyObject *
polyphase_pcm16(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "polyphase_pcm16 takes 6 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[2]);
    Py_ssize_t up = PyLong_AsSsize_t(args[3]);
    Py_ssize_t down = PyLong_AsSsize_t(args[4]);
    Py_ssize_t periods = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer xv, cv;
    if (get_floats(args[0], &xv, "x") < 0) {
        return NULL;
    }
    if (get_floats(args[1], &cv, "coefficients") < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    Py_ssize_t n_x = xv.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t n_c = cv.len / (Py_ssize_t)sizeof(float);
    if (width < 1 || up < 1 || down < 1 || periods < 0 || n_c != width * up ||
        (periods > 0 && (periods - 1) * down + width > n_x) ||
        periods > PY_SSIZE_T_MAX / 2 / up) {
        PyErr_SetString(PyExc_ValueError,
                        "need coefficients of width * up and x of (periods - 1) * down + width");
        PyBuffer_Release(&xv);
        PyBuffer_Release(&cv);
        return NULL;
    }
    /* The input as doubles, split into its `down` phases, so that the sums vectorise
     * across outputs: output p of a phase sums x[p * down + j] over j in order (the
     * same order for every output, every build), and x[p * down + j] is
     * phase[j % down][p + j / down], contiguous in p. */
    Py_ssize_t per_phase = n_x / down + 1;
    double *split = PyMem_Malloc((size_t)(down * per_phase + periods) * sizeof(double));
    PyObject *out = split == NULL ? NULL : PyBytes_FromStringAndSize(NULL, periods * up * 2);
    if (out == NULL) {
        PyMem_Free(split);
        PyBuffer_Release(&xv);
        PyBuffer_Release(&cv);
        return split == NULL ? PyErr_NoMemory() : NULL;
    }
    const float *x = (const float *)xv.buf;
    const float *coefficients = (const float *)cv.buf;
    for (Py_ssize_t k = 0; k < down; k++) {
        double *phase = split + k * per_phase;
        for (Py_ssize_t i = 0; i * down + k < n_x; i++) {
            phase[i] = (double)x[i * down + k];
        }
    }
    double *restrict acc = split + down * per_phase;
    unsigned char *pcm = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t r = 0; r < up; r++) {
        for (Py_ssize_t p = 0; p < periods; p++) {
            acc[p] = 0.0;
        }
        for (Py_ssize_t j = 0; j < width; j++) {
            const double *restrict in = split + (j % down) * per_phase + j / down;
            double c = (double)coefficients[j * up + r];
            for (Py_ssize_t p = 0; p < periods; p++) {
                double term = in[p] * c;
                acc[p] += term;
            }
        }
        for (Py_ssize_t p = 0; p < periods; p++) {
            double rounded = nearbyint(acc[p]);
            if (rounded > 32767.0) {
                rounded = 32767.0;
            }
            else if (!(rounded >= -32768.0)) {
                rounded = -32768.0;
            }
            uint16_t sample = (uint16_t)(int16_t)rounded;
            unsigned char *at = pcm + 2 * (p * up + r);
            at[0] = (unsigned char)(sample & 0xFF);
            at[1] = (unsigned char)(sample >> 8);
        }
    }
    PyMem_Free(split);
    PyBuffer_Release(&xv);
    PyBuffer_Release(&cv);
    return out;
}

/* ---- the line echo canceller's step (media/line_echo.py) ------------------------------
 *
 * Every sum runs in index order, one multiply and one add (each rounded) per term, as
 * the plain loop of the tails below; vector lanes hold independent sums (four outputs,
 * or four lags), so the vector code gives the tails' results bit for bit and none of
 * this depends on the CPU (numpy's dot products, which this replaces, sum in whichever
 * order the BLAS kernel chosen for the CPU at run time uses). */

typedef double v4d __attribute__((vector_size(32)));

#if defined(__GNUC__) && !defined(__clang__)
/* GCC warns that returning a 256-bit vector without AVX changes the ABI; these helpers
 * are always inlined, so no call ever passes one. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

static inline __attribute__((always_inline)) v4d
load4(const double *src)
{
    v4d v;
    memcpy(&v, src, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void
lec_step_body(const double *seg, const double *w, const double *x, double *r, double *p,
              double forget, double *residual, Py_ssize_t taps, Py_ssize_t n,
              double energies[3])
{
    double x_energy = 0.0, residual_energy = 0.0, echo_energy = 0.0;
    double echoes[8];
    Py_ssize_t i = 0;
    /* np.convolve(seg, w, "valid")[i] = sum over j of seg[i + j] * w[taps - 1 - j];
     * eight outputs a pass, two vectors of four. */
    for (; i + 8 <= n; i += 8) {
        v4d e0 = {0.0, 0.0, 0.0, 0.0}, e1 = {0.0, 0.0, 0.0, 0.0};
        for (Py_ssize_t j = 0; j < taps; j++) {
            double c = w[taps - 1 - j];
            v4d cv = {c, c, c, c};
            v4d t0 = load4(seg + i + j) * cv;
            v4d t1 = load4(seg + i + j + 4) * cv;
            e0 = e0 + t0;
            e1 = e1 + t1;
        }
        memcpy(echoes, &e0, sizeof e0);
        memcpy(echoes + 4, &e1, sizeof e1);
        for (int m = 0; m < 8; m++) {
            double left = x[i + m] - echoes[m];
            residual[i + m] = left;
            double xx = x[i + m] * x[i + m], rr = left * left, ee = echoes[m] * echoes[m];
            x_energy += xx;
            residual_energy += rr;
            echo_energy += ee;
        }
    }
    for (; i < n; i++) {
        double echo = 0.0;
        for (Py_ssize_t j = 0; j < taps; j++) {
            double term = seg[i + j] * w[taps - 1 - j];
            echo += term;
        }
        double left = x[i] - echo;
        residual[i] = left;
        double xx = x[i] * x[i], rr = left * left, ee = echo * echo;
        x_energy += xx;
        residual_energy += rr;
        echo_energy += ee;
    }
    /* Lag k reads the render k samples earlier: r[k] pairs seg[taps - 1 - k + m] with
     * seg[taps - 1 + m], p[k] with x[m]. Four lags a pass: lane 3 - l holds lag k + l. */
    const double *now = seg + (taps - 1);
    Py_ssize_t k = 0;
    for (; k + 4 <= taps; k += 4) {
        v4d rv = {0.0, 0.0, 0.0, 0.0}, pv = {0.0, 0.0, 0.0, 0.0};
        const double *early = now - k - 3;
        for (Py_ssize_t m = 0; m < n; m++) {
            v4d a = load4(early + m);
            v4d v = {now[m], now[m], now[m], now[m]};
            v4d xm = {x[m], x[m], x[m], x[m]};
            v4d q = a * v;
            v4d b = a * xm;
            rv = rv + q;
            pv = pv + b;
        }
        double rs[4], ps[4];
        memcpy(rs, &rv, sizeof rv);
        memcpy(ps, &pv, sizeof pv);
        for (int l = 0; l < 4; l++) {
            double aged_r = r[k + l] * forget, aged_p = p[k + l] * forget;
            r[k + l] = aged_r + rs[3 - l];
            p[k + l] = aged_p + ps[3 - l];
        }
    }
    for (; k < taps; k++) {
        const double *early = now - k;
        double rk = 0.0, pk = 0.0;
        for (Py_ssize_t m = 0; m < n; m++) {
            double a = early[m] * now[m], b = early[m] * x[m];
            rk += a;
            pk += b;
        }
        double aged_r = r[k] * forget, aged_p = p[k] * forget;
        r[k] = aged_r + rk;
        p[k] = aged_p + pk;
    }
    energies[0] = x_energy;
    energies[1] = residual_energy;
    energies[2] = echo_energy;
}

static void
lec_step_plain(const double *seg, const double *w, const double *x, double *r, double *p,
               double forget, double *residual, Py_ssize_t taps, Py_ssize_t n,
               double energies[3])
{
    lec_step_body(seg, w, x, r, p, forget, residual, taps, n, energies);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same code on 256-bit vectors where the CPU has AVX2 (without FMA: each product
 * is rounded before it is added, as in the plain code). */
__attribute__((target("avx2"))) static void
lec_step_avx2(const double *seg, const double *w, const double *x, double *r, double *p,
              double forget, double *residual, Py_ssize_t taps, Py_ssize_t n,
              double energies[3])
{
    lec_step_body(seg, w, x, r, p, forget, residual, taps, n, energies);
}
#endif

static void
lec_step(const double *seg, const double *w, const double *x, double *r, double *p,
         double forget, double *residual, Py_ssize_t taps, Py_ssize_t n, double energies[3])
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx2")) {
        lec_step_avx2(seg, w, x, r, p, forget, residual, taps, n, energies);
        return;
    }
#endif
    lec_step_plain(seg, w, x, r, p, forget, residual, taps, n, energies);
}

/* Whether any two of the buffers, at least one of them written, share a byte. */
static int
any_overlap(const Py_buffer *views, const int *written, int count)
{
    for (int i = 0; i < count; i++) {
        for (int j = i + 1; j < count; j++) {
            if (!written[i] && !written[j]) {
                continue;
            }
            const char *a = (const char *)views[i].buf, *b = (const char *)views[j].buf;
            if (views[i].len > 0 && views[j].len > 0 && a < b + views[j].len &&
                b < a + views[i].len) {
                return 1;
            }
        }
    }
    return 0;
}

PyDoc_STRVAR(lec_frame_doc,
"lec_frame(seg, w, x, r, p, forget, residual) -> (x_energy, residual_energy, echo_energy)\n\n"
"media/line_echo.py LineEchoCanceller.capture's filter step: the echo estimate (``w``\n"
"convolved with the render ``seg``, len(x) + len(w) - 1 samples), ``residual = x -\n"
"echo`` (written), and ``r`` and ``p`` (the normal equations' correlations) aged by\n"
"``forget`` and updated in place; returns the three frames' energies. Every sum runs\n"
"in index order, so the results are the same on every CPU; numpy's correlations and\n"
"energies are BLAS dot products, summed in the order of the CPU's BLAS kernel (within\n"
"~1e-11 relative of these). ``r``, ``p`` and ``residual`` must share no memory with\n"
"another argument (ValueError).");

static PyObject *
lec_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "lec_frame takes 7 arguments, got %zd", nargs);
        return NULL;
    }
    double forget;
    if (get_double(args[5], &forget) < 0) {
        return NULL;
    }
    Py_buffer views[6];
    const char *names[6] = {"seg", "w", "x", "r", "p", "residual"};
    const int writable[6] = {0, 0, 0, 1, 1, 1};
    const int slots[6] = {0, 1, 2, 3, 4, 6};
    int got = 0;
    for (; got < 6; got++) {
        if (get_doubles(args[slots[got]], &views[got], writable[got], names[got]) < 0) {
            break;
        }
    }
    PyObject *result = NULL;
    if (got == 6) {
        const double *seg = (const double *)views[0].buf;
        const double *w = (const double *)views[1].buf;
        const double *x = (const double *)views[2].buf;
        double *r = (double *)views[3].buf;
        double *p = (double *)views[4].buf;
        double *residual = (double *)views[5].buf;
        Py_ssize_t taps = views[1].shape[0], n = views[2].shape[0];
        if (taps < 1 || views[0].shape[0] != n + taps - 1 || views[3].shape[0] != taps ||
            views[4].shape[0] != taps || views[5].shape[0] != n) {
            PyErr_SetString(PyExc_ValueError,
                            "need len(seg) == len(x) + len(w) - 1, len(r) == len(p) == "
                            "len(w) >= 1 and len(residual) == len(x)");
        }
        else if (any_overlap(views, writable, 6)) {
            /* The step reads its inputs after writing its outputs: shared memory would
             * give wrong sums, not an error. */
            PyErr_SetString(PyExc_ValueError,
                            "lec_frame's arrays must not share memory (r, p and residual "
                            "are written while seg, w and x are read)");
        }
        else {
            double energies[3];
            lec_step(seg, w, x, r, p, forget, residual, taps, n, energies);
            result = Py_BuildValue("(ddd)", energies[0], energies[1], energies[2]);
        }
    }
    for (int i = 0; i < got; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"prove_lags", (PyCFunction)(void (*)(void))prove_lags, METH_FASTCALL, prove_lags_doc},
    {"pre_emphasis", (PyCFunction)(void (*)(void))pre_emphasis, METH_FASTCALL, pre_emphasis_doc},
    {"ncc_peak", (PyCFunction)(void (*)(void))ncc_peak, METH_FASTCALL, ncc_peak_doc},
    {"polyphase_pcm16", (PyCFunction)(void (*)(void))polyphase_pcm16, METH_FASTCALL,
     polyphase_pcm16_doc},
    {"lec_frame", (PyCFunction)(void (*)(void))lec_frame, METH_FASTCALL, lec_frame_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "rutster.media._kernels",
    "Compiled per-frame kernels of the media path (media/echo_kernels.py, media/line_echo.py, "
    "media/polyphase.py).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__kernels(void)
{
    return PyModule_Create(&module);
}
