"""The echo gate's per-frame kernels: compiled C where it was built, numpy otherwise.

A loaded gateway pays numpy's cost per call (~1-4 µs) on every one of the few dozen
small array steps the echo gate (:mod:`media.echo_gate`) takes per 20 ms caller frame,
so those steps cost far more than their arithmetic. The steps that run on every frame
are kept here twice: as numpy (the reference, and what runs where no C compiler was
found when the package was built) and as the same loops in C (``media/_kernels.c``,
built by ``pip install`` as an optional extension: :mod:`media.compiled`). The two give
the same results, bit for bit: the C loops take the same IEEE operations in the same order, and
``tests/test_media_echo_kernels.py`` holds them to each other.

Measured (bench/call_profile.py --timers, 20 echo calls on one core of the project's
2-core VM, 2026-12-07): :func:`prove_lags` in numpy took 36-43 µs of the echo gate's
128-150 µs per caller frame, and the waveform test's normalisation and search
(:func:`ncc_peak`, :func:`pre_emphasis`) about a third of that test's ~250 µs.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from rutster.media.compiled import KERNELS

__all__ = [
    "ncc_numpy",
    "ncc_peak",
    "ncc_peak_numpy",
    "pre_emphasis",
    "pre_emphasis_numpy",
    "prove_lags",
    "prove_lags_numpy",
]

_ITEM = np.dtype(np.float64).itemsize


def prove_lags_numpy(
    window: npt.NDArray[np.float64],
    proof: npt.NDArray[np.float64],
    lag_erl: npt.NDArray[np.float64],
    spread: int,
    level: float,
    wobble: float,
    max_erl: float,
    min_erl: float,
    rise: float,
    floor: float,
    silence: float,
    bound_on: bool,
    allowed: bool,
    clean: bool,
    /,
) -> tuple[float, bool]:
    """One frame's step of the echo gate's per-lag ERL proofs (``EchoGate._prove_lags``).

    ``window`` is the render envelope over the lag range and ``spread`` slots either
    side (``len(proof) + 2 * spread`` levels, dBFS; lag ``k`` of ``proof`` reads
    ``window[k : k + 2 * spread + 1]``). When ``bound_on``, each lag's proven bound
    ``proof`` rises to (quietest render within the spread - ``level`` - ``wobble``),
    at most ``max_erl``, where that render is over ``floor``; ``lag_erl`` then steps
    towards max(``proof``, ``min_erl``) by at most ``rise``. Both arrays change in
    place. Returns the loudest echo any lag allows (the loudest render within a lag's
    spread less the weakest ``lag_erl`` within it; ``silence`` unless ``allowed``) and
    whether every lag is now proven to ``max_erl`` (``clean``: nothing can change
    any more). Nothing changes when no render in ``window`` is over ``floor``.
    """
    lags = len(proof)
    peak = float(window.max())
    if peak <= floor:
        return silence, clean  # nothing played over the lag range: nothing to prove
    if clean:
        # Every lag proven to the most any ERL may be (bounds only rise): nothing
        # here can change, and the echo allowed is the loudest render less that.
        return (peak - max_erl if allowed else silence), clean
    # Row j is the window shifted by j: the quietest and loudest over the spread
    # in two reductions (a loop of minimum/maximum cost ~3x as much).
    shifted: npt.NDArray[np.float64] = np.ndarray(
        (2 * spread + 1, lags), np.float64, window, 0, (_ITEM, _ITEM)
    )
    quietest = shifted.min(axis=0)
    if bound_on:
        bound = np.where(quietest > floor, quietest - level - wobble, -math.inf)
        np.maximum(proof, np.minimum(bound, max_erl), out=proof)
    target = np.maximum(proof, min_erl)
    np.minimum(target, lag_erl + rise, out=lag_erl)
    clean = float(lag_erl.min()) >= max_erl
    if not allowed:
        return silence, clean
    loudest = shifted.max(axis=0)
    # The weakest ERL within the spread of each lag (the echo may sit between).
    weakest = lag_erl.copy()
    for shift in range(1, spread + 1):
        np.minimum(weakest[shift:], lag_erl[:-shift], out=weakest[shift:])
        np.minimum(weakest[:-shift], lag_erl[shift:], out=weakest[:-shift])
    return float((loudest - weakest).max()), clean


def pre_emphasis_numpy(
    x: npt.NDArray[np.float64], out: npt.NDArray[np.float64], coefficient: float, /
) -> None:
    """``out[i] = x[i] - coefficient * x[i - 1]`` (``x[-1]`` taken as 0): the first
    difference that keeps the low-frequency bulk two voices share from correlating them."""
    np.subtract(x, coefficient * np.concatenate(([0.0], x[:-1])), out=out)


def ncc_peak_numpy(
    corr: npt.NDArray[np.float64],
    r: npt.NDArray[np.float64],
    n_c: int,
    c_energy: float,
    min_share: float,
    /,
) -> tuple[float, int]:
    """The best normalised cross-correlation and its offset (the first of equals).

    ``corr[k]`` is the raw correlation of a capture of ``n_c`` samples and energy
    ``c_energy`` with ``r[k : k + n_c]``, for every offset ``k`` the render ``r``
    allows (``len(r) - n_c + 1``, at least 1). Each is divided by the root of the two
    energies; an offset whose render energy is at most ``c_energy * min_share``
    scores 0 (the FFT's rounding over a vanishing energy must not pass for a match).
    """
    ncc = ncc_numpy(corr, r, n_c, c_energy, min_share)
    best = int(ncc.argmax())
    return float(ncc[best]), best


def ncc_numpy(
    corr: npt.NDArray[np.float64],
    r: npt.NDArray[np.float64],
    n_c: int,
    c_energy: float,
    min_share: float,
) -> npt.NDArray[np.float64]:
    """The normalised cross-correlation at every offset (:func:`ncc_peak_numpy`'s scores)."""
    valid = len(r) - n_c + 1
    squares = np.concatenate(([0.0], np.cumsum(r * r)))
    r_energy = squares[n_c:] - squares[:valid]
    floor = c_energy * min_share
    ncc: npt.NDArray[np.float64] = np.where(
        r_energy > floor, corr[:valid] / np.sqrt(np.maximum(r_energy, floor) * c_energy), 0.0
    )
    return ncc


# What the echo gate calls: the C kernels when built (media.compiled), else their twins.
if KERNELS is None:
    prove_lags = prove_lags_numpy
    pre_emphasis = pre_emphasis_numpy
    ncc_peak = ncc_peak_numpy
else:
    prove_lags = KERNELS.prove_lags
    pre_emphasis = KERNELS.pre_emphasis
    ncc_peak = KERNELS.ncc_peak
