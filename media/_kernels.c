/* Compiled per-frame kernels of the media path: the echo gate's (media/echo_gate.py,
 * chosen in media/echo_kernels.py) and the polyphase resampler's (media/polyphase.py).
 *
 * Why by hand: each call's media runs a few dozen numpy operations per 20 ms frame on
 * small arrays, and numpy's cost per call (~1-4 us, more inside a loaded gateway) is
 * most of it; no library offers these loops. The echo gate's kernels are the exact
 * loops of the numpy code they replace (same operations in the same order on IEEE
 * doubles, so the same results); the resampler's sums in double where numpy summed in
 * float32 (its output within one PCM step of numpy's). Where this module is not built
 * the numpy code runs instead. Plain C on the buffer protocol: no numpy headers,
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

static PyMethodDef methods[] = {
    {"prove_lags", (PyCFunction)(void (*)(void))prove_lags, METH_FASTCALL, prove_lags_doc},
    {"pre_emphasis", (PyCFunction)(void (*)(void))pre_emphasis, METH_FASTCALL, pre_emphasis_doc},
    {"ncc_peak", (PyCFunction)(void (*)(void))ncc_peak, METH_FASTCALL, ncc_peak_doc},
    {"polyphase_pcm16", (PyCFunction)(void (*)(void))polyphase_pcm16, METH_FASTCALL,
     polyphase_pcm16_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "rutster.media._kernels",
    "Compiled per-frame kernels of the media path (media/echo_kernels.py, media/polyphase.py).",
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
