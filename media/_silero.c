/* Silero VAD v6's 8 kHz network, one 32 ms window at a time (media/silero_kernel.py).
 *
 * Why by hand: onnxruntime runs this model in ~70 us a window on the dev VM, but the
 * network is ~0.38 M multiply-adds (an STFT as a 128-tap convolution, four small 1-D
 * convolutions, one LSTM cell step, a 1x1 convolution): most of onnxruntime's time is
 * its per-node dispatch and the model's If node, not arithmetic. tract (0.23, the other
 * small-model runtime on PyPI) cannot load the model (it fails on that If node). Here the
 * same network runs in ~24 us, with AVX2 multiply-adds on eight outputs at a time.
 *
 * The graph is the else-branch (sample rate != 16000) of silero_vad_op18_ifless.onnx,
 * written out node by node in forward() below; the weights are that model's
 * ``model_8k.*`` initializers, packed by media/silero_kernel.py in the layout this file
 * reads (``packed_size()`` floats; each weight matrix with its outputs in blocks of 8,
 * [output / 8][input][8]). Its probabilities are onnxruntime's within ~1e-6
 * (tests/test_media_silero_kernel.py), not bit for bit: sums run in another order.
 *
 * Built only where the compiler targets x86-64 with AVX2 and FMA (checked at import,
 * ``SUPPORTED``) or another architecture (generic vector code); elsewhere, and where it
 * was not built, media/vad.py runs the model in onnxruntime.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* Shapes of silero_vad_op18_ifless.onnx's 8 kHz branch. */
#define WINDOW 288 /* input: 32 samples of context + a 256-sample window */
#define REFLECT 32 /* Pad node: reflect padding on the right */
#define PADDED (WINDOW + REFLECT)
#define NFFT 128                            /* STFT Conv: 128 taps, stride 64 */
#define HOP 64
#define FRAMES ((PADDED - NFFT) / HOP + 1) /* 4 */
#define BINS 65                            /* 130 filters: 65 real, 65 imaginary */
#define HIDDEN 128
#define GATES (4 * HIDDEN) /* LSTM gates i, f, g, o */
#define BLOCK 32           /* outputs a matrix pass computes at once (four vectors) */
#define ROUND_BLOCK(n) (((n) + BLOCK - 1) / BLOCK * BLOCK)
#define SPEC_ROWS ROUND_BLOCK(2 * BINS) /* 160: the STFT's filters, zero rows added */
#define MAX_CHANNELS 128

/* One encoder Conv (kernel 3, padding 1) and its ReLU. */
typedef struct {
    int channels, outputs, stride, steps_in, steps_out;
} conv_t;
#define CONV(C, O, S, T) {C, O, S, T, ((T) + 2 - 3) / (S) + 1}
static const conv_t ENCODER[4] = {
    CONV(BINS, 128, 1, FRAMES), CONV(128, 64, 2, 4), CONV(64, 64, 2, 2), CONV(64, 128, 1, 1)};
/* matvec() computes BLOCK outputs at a time: every layer's outputs are a multiple. */
_Static_assert(SPEC_ROWS % BLOCK == 0 && GATES % BLOCK == 0 && 64 % BLOCK == 0,
               "layer outputs must be multiples of BLOCK");

static Py_ssize_t
packed_floats(void)
{
    Py_ssize_t n = (Py_ssize_t)SPEC_ROWS * NFFT;
    for (int i = 0; i < 4; i++) {
        n += (Py_ssize_t)ENCODER[i].outputs * (ENCODER[i].channels * 3 + 1);
    }
    n += 2 * (Py_ssize_t)GATES * HIDDEN + 2 * GATES; /* w_ih, w_hh, b_ih, b_hh */
    n += HIDDEN + 8;                                  /* decoder weight, bias (padded) */
    return n;
}

typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KERNEL_TARGET __attribute__((target("avx2,fma")))
#else
#define KERNEL_TARGET
#endif

KERNEL_TARGET static inline __attribute__((always_inline)) v8f
load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

KERNEL_TARGET static inline __attribute__((always_inline)) v8f
splat8(float x)
{
    v8f v = {x, x, x, x, x, x, x, x};
    return v;
}

KERNEL_TARGET static inline __attribute__((always_inline)) void
store4(float *out, v8f a0, v8f a1, v8f a2, v8f a3)
{
    memcpy(out, &a0, sizeof a0);
    memcpy(out + 8, &a1, sizeof a1);
    memcpy(out + 16, &a2, sizeof a2);
    memcpy(out + 24, &a3, sizeof a3);
}

/* out[t][o] = bias[o] + sum_k w[o][k] * in[t][k] for t < steps and o < outputs (a
 * multiple of BLOCK), w blocked as [o / 8][k][8]. Thirty-two outputs at a time, for two
 * steps at once where two remain: eight independent sums hide the multiply-add's
 * latency, and each weight is loaded once for both steps. */
KERNEL_TARGET static inline __attribute__((always_inline)) void
matvec(const float *restrict w, const float *restrict bias, int inputs, int outputs,
       const float *restrict in, int in_stride, int steps, float *restrict out, int out_stride)
{
    const size_t blk = 8 * (size_t)inputs;
    int t = 0;
    for (; t + 2 <= steps; t += 2) {
        const float *restrict x = in + t * in_stride;
        const float *restrict y = x + in_stride;
        for (int o = 0; o < outputs; o += BLOCK) {
            const float *restrict wo = w + (size_t)o * inputs;
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            for (int k = 0; k < inputs; k++) {
                v8f xk = splat8(x[k]), yk = splat8(y[k]);
                v8f w0 = load8(wo + 8 * k), w1 = load8(wo + blk + 8 * k);
                v8f w2 = load8(wo + 2 * blk + 8 * k), w3 = load8(wo + 3 * blk + 8 * k);
                a0 += w0 * xk;
                a1 += w1 * xk;
                a2 += w2 * xk;
                a3 += w3 * xk;
                b0 += w0 * yk;
                b1 += w1 * yk;
                b2 += w2 * yk;
                b3 += w3 * yk;
            }
            if (bias != NULL) {
                v8f c0 = load8(bias + o), c1 = load8(bias + o + 8);
                v8f c2 = load8(bias + o + 16), c3 = load8(bias + o + 24);
                a0 += c0, a1 += c1, a2 += c2, a3 += c3;
                b0 += c0, b1 += c1, b2 += c2, b3 += c3;
            }
            store4(out + t * out_stride + o, a0, a1, a2, a3);
            store4(out + (t + 1) * out_stride + o, b0, b1, b2, b3);
        }
    }
    for (; t < steps; t++) {
        const float *restrict x = in + t * in_stride;
        for (int o = 0; o < outputs; o += BLOCK) {
            const float *restrict wo = w + (size_t)o * inputs;
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int k = 0; k < inputs; k++) {
                v8f xk = splat8(x[k]);
                a0 += load8(wo + 8 * k) * xk;
                a1 += load8(wo + blk + 8 * k) * xk;
                a2 += load8(wo + 2 * blk + 8 * k) * xk;
                a3 += load8(wo + 3 * blk + 8 * k) * xk;
            }
            if (bias != NULL) {
                a0 += load8(bias + o);
                a1 += load8(bias + o + 8);
                a2 += load8(bias + o + 16);
                a3 += load8(bias + o + 24);
            }
            store4(out + t * out_stride + o, a0, a1, a2, a3);
        }
    }
}

KERNEL_TARGET static inline float
sigmoid(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

/* One window: the speech probability; ``state`` ([h | c], 2 x 128) is read and replaced. */
KERNEL_TARGET static float
forward(const float *w, const float *window, float *state)
{
    /* Pad (reflect, 32 on the right), then the STFT's Conv: [frame][filter]. */
    float padded[PADDED];
    memcpy(padded, window, sizeof(float) * WINDOW);
    for (int j = 0; j < REFLECT; j++) {
        padded[WINDOW + j] = window[WINDOW - 2 - j];
    }
    float spec[FRAMES * SPEC_ROWS];
    matvec(w, NULL, NFFT, SPEC_ROWS, padded, HOP, FRAMES, spec, SPEC_ROWS);
    w += (size_t)SPEC_ROWS * NFFT;
    /* Magnitude (Pow, Pow, Add, Sqrt): [bin][frame]. */
    float x[MAX_CHANNELS * FRAMES];
    for (int f = 0; f < BINS; f++) {
        for (int t = 0; t < FRAMES; t++) {
            float re = spec[t * SPEC_ROWS + f], im = spec[t * SPEC_ROWS + BINS + f];
            x[f * FRAMES + t] = sqrtf(re * re + im * im);
        }
    }
    /* The encoder: each Conv as one matrix pass over its [step][channel * 3 + tap]
     * columns, then ReLU back into x as [channel][step]. */
    float columns[FRAMES * MAX_CHANNELS * 3];
    float y[FRAMES * MAX_CHANNELS];
    for (int l = 0; l < 4; l++) {
        const conv_t *c = &ENCODER[l];
        const int taps = c->channels * 3;
        for (int t = 0; t < c->steps_out; t++) {
            float *row = columns + t * taps;
            for (int ch = 0; ch < c->channels; ch++) {
                for (int k = 0; k < 3; k++) {
                    int s = t * c->stride + k - 1;
                    row[ch * 3 + k] = (s >= 0 && s < c->steps_in) ? x[ch * c->steps_in + s] : 0.0f;
                }
            }
        }
        matvec(w, w + (size_t)c->outputs * taps, taps, c->outputs, columns, taps, c->steps_out, y,
               c->outputs);
        w += (size_t)c->outputs * (taps + 1);
        for (int o = 0; o < c->outputs; o++) {
            for (int t = 0; t < c->steps_out; t++) {
                float v = y[t * c->outputs + o];
                x[o * c->steps_out + t] = v > 0.0f ? v : 0.0f;
            }
        }
    }
    /* The last Conv leaves one step: x is the LSTM cell's input (Gather, step 0). */
    const float *w_ih = w, *w_hh = w + (size_t)GATES * HIDDEN;
    const float *b_ih = w + 2 * (size_t)GATES * HIDDEN, *b_hh = b_ih + GATES;
    const float *dec_w = b_hh + GATES, *dec_b = dec_w + HIDDEN;
    float *h = state, *cell = state + HIDDEN;
    float from_h[GATES], from_x[GATES]; /* the two Gemm nodes, then their Add */
    matvec(w_hh, b_hh, HIDDEN, GATES, h, 0, 1, from_h, 0);
    matvec(w_ih, b_ih, HIDDEN, GATES, x, 0, 1, from_x, 0);
    float h_new[HIDDEN];
    for (int j = 0; j < HIDDEN; j++) {
        float gi = from_h[j] + from_x[j];
        float gf = from_h[HIDDEN + j] + from_x[HIDDEN + j];
        float gg = from_h[2 * HIDDEN + j] + from_x[2 * HIDDEN + j];
        float go = from_h[3 * HIDDEN + j] + from_x[3 * HIDDEN + j];
        float c_new = sigmoid(gf) * cell[j] + sigmoid(gi) * tanhf(gg);
        cell[j] = c_new;
        h_new[j] = sigmoid(go) * tanhf(c_new);
    }
    memcpy(h, h_new, sizeof h_new);
    /* Decoder: ReLU, a 1x1 Conv to one channel, Sigmoid (the mean over one step). */
    float z = 0.0f;
    for (int j = 0; j < HIDDEN; j++) {
        z += dec_w[j] * (h_new[j] > 0.0f ? h_new[j] : 0.0f);
    }
    return sigmoid(z + dec_b[0]);
}

static int
get_floats(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t n, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    if (view->itemsize != (Py_ssize_t)sizeof(float) || view->format == NULL ||
        strcmp(view->format, "f") != 0 || view->len != n * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "%s must be %zd contiguous float32 values", name, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(window_probability_doc,
"window_probability(weights, window, state) -> float\n\n"
"Silero's 8 kHz network on one ``window`` (288 float32: 32 of context, then 256 new\n"
"samples): the speech probability. ``state`` (256 float32, the LSTM's h then c) is\n"
"replaced by the next state; ``weights`` are ``packed_floats()`` float32 packed by\n"
"media/silero_kernel.py.");

static PyObject *
window_probability(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "window_probability takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer wv, xv, sv;
    if (get_floats(args[0], &wv, 0, packed_floats(), "weights") < 0) {
        return NULL;
    }
    if (get_floats(args[1], &xv, 0, WINDOW, "window") < 0) {
        PyBuffer_Release(&wv);
        return NULL;
    }
    if (get_floats(args[2], &sv, 1, 2 * HIDDEN, "state") < 0) {
        PyBuffer_Release(&wv);
        PyBuffer_Release(&xv);
        return NULL;
    }
    float p = forward((const float *)wv.buf, (const float *)xv.buf, (float *)sv.buf);
    PyBuffer_Release(&wv);
    PyBuffer_Release(&xv);
    PyBuffer_Release(&sv);
    return PyFloat_FromDouble((double)p);
}

static PyObject *
packed_floats_py(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromSsize_t(packed_floats());
}

static PyMethodDef methods[] = {
    {"window_probability", (PyCFunction)(void (*)(void))window_probability, METH_FASTCALL,
     window_probability_doc},
    {"packed_floats", packed_floats_py, METH_NOARGS,
     "packed_floats() -> int\n\nFloat32 values window_probability's weights hold."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "rutster.media._silero",
    "Silero VAD v6's 8 kHz network, compiled (media/silero_kernel.py).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__silero(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    int supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    int supported = 1;
#endif
    /* Whether forward() may run on this CPU (it was compiled for AVX2 and FMA). */
    if (PyModule_AddObjectRef(m, "SUPPORTED", supported ? Py_True : Py_False) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
