"""The echo gate's compiled kernels against their numpy reference (media/echo_kernels.py)."""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rutster.media import compiled, echo_kernels, line_echo
from rutster.media.echo_gate import EchoVerdict
from rutster.media.line_echo import normalised_xcorr, normalised_xcorr_peak
from rutster.media.resample import StreamResampler
from rutster.tools.realtime_mock_voice import synthesize_reply
from rutster.tools.twilio_simulator import read_wav_8k
from tests.conftest import SPEECH_WAV
from tests.support.engine_rig import (
    RATE,
    InterruptingCaller,
    Interruption,
    ReflexRig,
    ScriptedBrain,
)

#: The echo gate's envelope floor and digital silence (media/echo_gate.py, endpointing.py).
FLOOR = -70.0
SILENCE = -100.0


def _compiled() -> ModuleType:
    """The C module; the suite's build must have made it (a C compiler is on every
    machine the suite runs on, and a silent fallback would leave the C untested)."""
    try:
        from rutster.media import _kernels
    except ImportError as exc:  # pragma: no cover - a broken build
        pytest.fail(f"the compiled echo kernels were not built: {exc} (pip install -e . again)")
    return _kernels


def test_the_compiled_kernels_are_built_and_in_use() -> None:
    kernels = _compiled()
    assert compiled.KERNELS is kernels
    for name in ("prove_lags", "pre_emphasis", "ncc_peak"):
        assert getattr(echo_kernels, name) is getattr(kernels, name)


levels = st.floats(min_value=-110.0, max_value=0.0, allow_nan=False)
erls = st.floats(min_value=-math.inf, max_value=60.0, allow_nan=False)


@st.composite
def _proof_cases(draw: st.DrawFn) -> tuple[Any, ...]:
    spread = draw(st.integers(0, 3))
    lags = draw(st.integers(1, 40))
    size = lags + 2 * spread
    window = np.array(draw(st.lists(levels, min_size=size, max_size=size)))
    # Envelope slots are often exactly the floor (nothing played there).
    window[np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)))] = FLOOR
    proof = np.array(draw(st.lists(erls, min_size=lags, max_size=lags)))
    lag_erl = np.array(
        draw(st.lists(st.floats(-10.0, 60.0, allow_nan=False), min_size=lags, max_size=lags))
    )
    level = draw(levels)
    max_erl = draw(st.floats(0.0, 60.0))
    min_erl = draw(st.floats(0.0, max_erl))
    return (
        window,
        proof,
        lag_erl,
        spread,
        level,
        draw(st.floats(0.0, 6.0)),
        max_erl,
        min_erl,
        draw(st.floats(0.0, 1.0)),
        FLOOR,
        SILENCE,
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.booleans()),
    )


@settings(max_examples=400, deadline=None)
@given(_proof_cases())
def test_prove_lags_in_c_is_numpy_bit_for_bit(case: tuple[Any, ...]) -> None:
    compiled = _compiled().prove_lags
    window, proof, lag_erl, *rest = case
    assert isinstance(proof, np.ndarray) and isinstance(lag_erl, np.ndarray)
    c_proof, c_erl = proof.copy(), lag_erl.copy()
    expected = echo_kernels.prove_lags_numpy(window, proof, lag_erl, *rest)
    got = compiled(window, c_proof, c_erl, *rest)
    assert got == expected
    assert type(got[0]) is float and type(got[1]) is bool
    assert np.array_equal(c_proof, proof) and np.array_equal(c_erl, lag_erl)


def test_prove_lags_refuses_what_is_not_its_arrays() -> None:
    compiled = _compiled().prove_lags
    ok: list[npt.NDArray[np.float64]] = [np.zeros(7), np.zeros(5), np.zeros(5)]
    scalars = (1, -30.0, 3.0, 40.0, 6.0, 0.2, FLOOR, SILENCE, True, True, False)
    with pytest.raises(TypeError, match="14 arguments"):
        compiled(*ok)
    with pytest.raises(TypeError, match="float64"):
        compiled(np.zeros(7, np.float32), ok[1], ok[2], *scalars)
    with pytest.raises(TypeError):
        compiled(ok[0], ok[1].copy().reshape(5, 1), ok[2], *scalars)
    readonly = ok[1].copy()
    readonly.setflags(write=False)
    with pytest.raises((TypeError, BufferError, ValueError)):
        compiled(ok[0], readonly, ok[2], *scalars)
    with pytest.raises(ValueError, match="len"):
        compiled(np.zeros(6), ok[1], ok[2], *scalars)
    with pytest.raises(ValueError, match="len"):
        compiled(ok[0], ok[1], np.zeros(4), *scalars)
    with pytest.raises(TypeError):
        compiled(ok[0], ok[1], ok[2], "1", *scalars[1:])
    with pytest.raises(TypeError):
        compiled(b"\0" * 56, ok[1], ok[2], *scalars)
    # The arrays a refused call was given are as they were.
    assert not ok[1].any() and not ok[2].any()


@st.composite
def _correlations(draw: st.DrawFn) -> tuple[Any, ...]:
    """A render, a capture cut from it (or not), both with silent stretches."""
    n_c = draw(st.integers(1, 64))
    n_r = draw(st.integers(n_c, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    render = rng.standard_normal(n_r) * draw(st.sampled_from([1e-3, 1.0, 3000.0]))
    silent = draw(st.integers(0, n_r))
    render[silent : silent + draw(st.integers(0, n_r))] = 0.0
    at = draw(st.integers(0, n_r - n_c))
    capture = render[at : at + n_c] * 0.5 + rng.standard_normal(n_c) * draw(
        st.sampled_from([0.0, 0.1, 1000.0])
    )
    if draw(st.booleans()):
        capture = np.round(capture)  # PCM-like values tie more often
    # The gate's share (line_echo._MIN_RENDER_SHARE) and a large one.
    return render, capture, draw(st.sampled_from([1e-6, 0.5]))


@settings(max_examples=400, deadline=None)
@given(_correlations())
def test_pre_emphasis_and_ncc_peak_in_c_are_numpy_bit_for_bit(case: tuple[Any, ...]) -> None:
    compiled = _compiled()
    render, capture, min_share = case
    r_numpy, r_c = np.empty(len(render)), np.empty(len(render))
    c_numpy, c_c = np.empty(len(capture)), np.empty(len(capture))
    echo_kernels.pre_emphasis_numpy(render, r_numpy, 0.9)
    compiled.pre_emphasis(render, r_c, 0.9)
    echo_kernels.pre_emphasis_numpy(capture, c_numpy, 0.9)
    compiled.pre_emphasis(capture, c_c, 0.9)
    assert np.array_equal(r_c, r_numpy) and np.array_equal(c_c, c_numpy)
    corr = np.correlate(r_numpy, c_numpy, "valid")
    c_energy = float(c_numpy @ c_numpy)
    assume(c_energy > 0.0)  # a silent capture is never searched (line_echo._correlation)
    expected = echo_kernels.ncc_peak_numpy(corr, r_numpy, len(capture), c_energy, min_share)
    got = compiled.ncc_peak(corr, r_numpy, len(capture), c_energy, min_share)
    assert got == expected or (math.isnan(got[0]) and math.isnan(expected[0]))
    assert got[1] == expected[1]
    assert type(got[0]) is float and type(got[1]) is int


def test_the_peak_search_is_the_whole_correlations_argmax() -> None:
    rng = np.random.default_rng(3)
    render = rng.standard_normal(2_000) * 3000.0
    render[500:900] = 0.0
    capture = render[1_200:1_520] * 0.3 + rng.standard_normal(320) * 30.0
    ncc = normalised_xcorr(render, capture)
    peak = normalised_xcorr_peak(render, capture)
    assert peak == (float(ncc.max()), int(ncc.argmax()))
    assert peak[1] == 1_200 and peak[0] > 0.9
    assert normalised_xcorr_peak(render, np.zeros(320)) == (0.0, 0)  # silence matches nothing
    assert normalised_xcorr_peak(render[:100], capture) is None  # no offset at all


def test_the_correlation_kernels_refuse_what_is_not_their_arrays() -> None:
    compiled = _compiled()
    x = np.arange(8.0)
    with pytest.raises(ValueError, match="apart"):
        compiled.pre_emphasis(x, x, 0.9)  # in place would read what it wrote
    with pytest.raises(ValueError, match="apart"):
        compiled.pre_emphasis(x, np.empty(7), 0.9)
    with pytest.raises(TypeError):
        compiled.pre_emphasis(x.astype(np.float32), np.empty(8), 0.9)
    with pytest.raises(TypeError, match="3 arguments"):
        compiled.pre_emphasis(x, np.empty(8))
    corr = np.zeros(5)
    with pytest.raises(ValueError, match="n_c"):
        compiled.ncc_peak(corr, x, 9, 1.0, 0.0)  # capture longer than the render
    with pytest.raises(ValueError, match="n_c"):
        compiled.ncc_peak(np.zeros(4), x, 4, 1.0, 0.0)  # corr shorter than the offsets
    with pytest.raises(TypeError, match="5 arguments"):
        compiled.ncc_peak(corr, x, 4)
    with pytest.raises(TypeError):
        compiled.ncc_peak(corr, x, 4.5, 1.0, 0.0)


def _call() -> ReflexRig:
    """A 10 dB echo at 200 ms and a caller interrupting the assistant's answers six times
    (the shipped recording, cut in pieces of 0.5-2 s)."""
    pcm = read_wav_8k(SPEECH_WAV)
    pieces = []
    at = 0.0
    for seconds in (0.6, 1.2, 0.8, 2.0, 0.5, 1.5, 1.0):
        chunk = pcm[int(at * 8000) * 2 : int((at + seconds) * 8000) * 2]
        up = StreamResampler(8_000, RATE)
        pieces.append(up.process(chunk) + up.flush())
        at += seconds
    reply = synthesize_reply(4_000)
    rig = ReflexRig(
        seconds=40.0,
        echo_delay_ms=200.0,
        echo_loss_db=10.0,
        brain=ScriptedBrain([reply], think_ms=300.0),
        caller=InterruptingCaller(
            [Interruption(p, 600.0) for p in pieces[1:]],
            recovery=pieces[0],
            done_after_ms=3_000.0,
        ),
    )
    rig.say(reply, "reply_0", at_s=0.2)
    return rig


def test_a_call_judged_with_the_c_kernels_is_judged_as_with_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = _compiled()
    runs: list[tuple[list[EchoVerdict], list[float]]] = []
    for kernels in (compiled, None):
        for name in ("prove_lags", "pre_emphasis", "ncc_peak"):
            twin = getattr(echo_kernels, f"{name}_numpy")
            monkeypatch.setattr(
                echo_kernels, name, twin if kernels is None else getattr(kernels, name)
            )
        # The line canceller's step (lec_frame) or numpy's.
        monkeypatch.setattr(line_echo, "KERNELS", kernels)
        rig = _call()
        rig.run()
        runs.append((rig.verdicts, rig.clears_ms))
    (c_verdicts, c_clears), (np_verdicts, np_clears) = runs
    assert len(c_verdicts) > 1_500 and c_clears  # a whole call, interrupted
    assert any(v.delay_ms is not None for v in c_verdicts)  # the echo was found
    assert c_verdicts == np_verdicts
    assert c_clears == np_clears


# ---- the line canceller's kernels (media/line_echo.py) --------------------------------

#: How far the line canceller's step may lie from numpy, relative to the sums' scale:
#: the C sums in index order, numpy's dot products in its BLAS kernel's order (measured
#: ~1e-15 of the scale; numpy on this CPU and with OpenBLAS's Haswell kernel differ as much).
LEC_TOLERANCE = 1e-9


def _lec_case(seed: int, taps: int = 64, n: int = 160) -> tuple[npt.NDArray[np.float64], ...]:
    rng = np.random.default_rng(seed)
    seg = rng.standard_normal(n + taps - 1) * 3000.0
    w = rng.standard_normal(taps) * 0.1
    x = rng.standard_normal(n) * 1000.0 + np.convolve(seg, w, "valid")
    r = rng.standard_normal(taps) * 1e6
    p = rng.standard_normal(taps) * 1e6
    return seg, w, x, r, p


@pytest.mark.parametrize(("seed", "taps", "n"), [(1, 64, 160), (2, 64, 160), (3, 5, 7), (4, 1, 3)])
def test_the_line_cancellers_step_in_c_is_numpy_within_rounding(
    seed: int, taps: int, n: int
) -> None:
    kernels = _compiled()
    seg, w, x, r, p = _lec_case(seed, taps, n)
    forget = 0.98
    r_c, p_c, residual_c = r.copy(), p.copy(), np.empty(n)
    energies = kernels.lec_frame(seg, w, x, r_c, p_c, forget, residual_c)
    echo = np.convolve(seg, w, "valid")
    residual = x - echo
    r_np = r * forget + np.correlate(seg, seg[taps - 1 :], "valid")[::-1]
    p_np = p * forget + np.correlate(seg, x, "valid")[::-1]
    scale = float(np.abs(seg).max()) ** 2 * n
    np.testing.assert_allclose(residual_c, residual, rtol=0, atol=LEC_TOLERANCE * scale)
    np.testing.assert_allclose(r_c, r_np, rtol=0, atol=LEC_TOLERANCE * scale)
    np.testing.assert_allclose(p_c, p_np, rtol=0, atol=LEC_TOLERANCE * scale)
    expected = (float(x @ x), float(residual @ residual), float(echo @ echo))
    np.testing.assert_allclose(energies, expected, rtol=LEC_TOLERANCE)


def _index_order_step(
    seg: npt.NDArray[np.float64],
    w: npt.NDArray[np.float64],
    x: npt.NDArray[np.float64],
    r: npt.NDArray[np.float64],
    p: npt.NDArray[np.float64],
    forget: float,
) -> tuple[list[float], list[float], list[float], tuple[float, float, float]]:
    """The step in plain Python floats: each sum in index order, every product rounded."""
    taps, n = len(w), len(x)
    s, c, y = seg.tolist(), w.tolist(), x.tolist()
    residual: list[float] = []
    x_energy = residual_energy = echo_energy = 0.0
    for i in range(n):
        echo = 0.0
        for j in range(taps):
            echo += s[i + j] * c[taps - 1 - j]
        left = y[i] - echo
        residual.append(left)
        x_energy += y[i] * y[i]
        residual_energy += left * left
        echo_energy += echo * echo
    now = taps - 1
    r_out: list[float] = []
    p_out: list[float] = []
    for k in range(taps):
        rk = pk = 0.0
        for m in range(n):
            rk += s[now - k + m] * s[now + m]
            pk += s[now - k + m] * y[m]
        r_out.append(float(r[k]) * forget + rk)
        p_out.append(float(p[k]) * forget + pk)
    return residual, r_out, p_out, (x_energy, residual_energy, echo_energy)


@pytest.mark.parametrize(
    ("seed", "taps", "n"), [(1, 64, 160), (2, 64, 161), (3, 5, 7), (4, 1, 3), (5, 9, 13), (6, 3, 8)]
)
def test_the_line_cancellers_step_in_c_sums_in_index_order_bit_for_bit(
    seed: int, taps: int, n: int
) -> None:
    # Whatever vector width the CPU gives the kernel (its lanes are independent sums),
    # every figure is Python's own double arithmetic in index order, to the last bit:
    # the kernel's results do not depend on the CPU.
    kernels = _compiled()
    seg, w, x, r, p = _lec_case(seed, taps, n)
    r_c, p_c, residual_c = r.copy(), p.copy(), np.empty(n)
    energies = kernels.lec_frame(seg, w, x, r_c, p_c, 0.98, residual_c)
    residual, r_py, p_py, energies_py = _index_order_step(seg, w, x, r, p, 0.98)
    assert residual_c.tolist() == residual
    assert r_c.tolist() == r_py
    assert p_c.tolist() == p_py
    assert tuple(energies) == energies_py


def test_the_line_canceller_kernels_refuse_what_is_not_their_arrays() -> None:
    kernels = _compiled()
    seg, w, x, r, p = _lec_case(6)
    residual = np.empty(len(x))
    with pytest.raises(ValueError, match="len\\(seg\\) == len\\(x\\) \\+ len\\(w\\) - 1"):
        kernels.lec_frame(seg[:-1], w, x, r, p, 0.98, residual)
    with pytest.raises(ValueError, match="len\\(residual\\) == len\\(x\\)"):
        kernels.lec_frame(seg, w, x, r, p, 0.98, residual[:-1])
    with pytest.raises(TypeError, match="1-D contiguous float64"):
        kernels.lec_frame(seg.astype(np.float32), w, x, r, p, 0.98, residual)
    read_only = r.copy()
    read_only.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        kernels.lec_frame(seg, w, x, read_only, p, 0.98, residual)
    with pytest.raises(TypeError, match="takes 7 arguments"):
        kernels.lec_frame(seg, w, x, r, p, 0.98)
    with pytest.raises(ValueError, match="len\\(r\\) == len\\(p\\) == len\\(w\\)"):
        kernels.lec_frame(seg, w, x, r, p[:-1], 0.98, residual)
    # An output sharing memory with another array would give wrong sums, not an error.
    with pytest.raises(ValueError, match="must not share memory"):
        kernels.lec_frame(seg, w, x, r, p, 0.98, x)
    with pytest.raises(ValueError, match="must not share memory"):
        kernels.lec_frame(seg, w, x, r, r, 0.98, residual)
    shared = np.zeros(len(seg) + len(r))
    with pytest.raises(ValueError, match="must not share memory"):
        kernels.lec_frame(shared[: len(seg)], w, x, shared[len(seg) - 1 : -1], p, 0.98, residual)
    # Inputs may share memory: they are only read.
    reads = np.concatenate([seg, x])
    kernels.lec_frame(reads[: len(seg)], w, reads[len(seg) :], r.copy(), p.copy(), 0.98, residual)
