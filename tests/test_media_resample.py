"""Streaming resampler: chunked output equals one-shot soxr, with no edge clicks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from rutster.media.g711 import PcmLengthError
from rutster.media.resample import DEFAULT_QUALITY, StreamResampler

RATE_PAIRS = [(8000, 24000), (24000, 8000), (16000, 24000)]
IRREGULAR_CHUNKS = [37, 160, 3, 211, 0, 1, 480, 999, 64]

Int16Array = npt.NDArray[np.int16]


def _two_tones(rate: int, seconds: float = 1.0) -> Int16Array:
    t = np.arange(int(rate * seconds)) / rate
    x = 9000 * np.sin(2 * math.pi * 440 * t) + 7000 * np.sin(2 * math.pi * 1000 * t)
    tones: Int16Array = x.astype(np.int16)
    return tones


def _stream(resampler: StreamResampler, x: Int16Array, sizes: list[int]) -> Int16Array:
    pcm = x.tobytes()
    out = []
    pos = 0
    for size in itertools.cycle(sizes):
        if pos >= len(pcm):
            break
        out.append(resampler.process(pcm[pos : pos + 2 * size]))
        pos += 2 * size
    out.append(resampler.flush())
    return np.frombuffer(b"".join(out), dtype=np.int16)


def _best_lag(a: Int16Array, b: Int16Array, max_lag: int = 16) -> int:
    n = min(len(a), len(b)) - 2 * max_lag
    af = a.astype(np.float64)
    bf = b.astype(np.float64)
    scores = {
        lag: float(np.dot(af[max_lag : max_lag + n], bf[max_lag + lag : max_lag + lag + n]))
        for lag in range(-max_lag, max_lag + 1)
    }
    return max(scores, key=lambda lag: scores[lag])


def _max_second_difference(x: Int16Array) -> float:
    return float(np.max(np.abs(np.diff(x.astype(np.float64), n=2))))


def _one_shot(x: Int16Array, in_rate: int, out_rate: int, steady: bool) -> Int16Array:
    """The whole signal through one soxr call of the same engine (the reference)."""
    if steady:
        stream = soxr.ResampleStream(
            in_rate, out_rate, 1, dtype="float32", quality=DEFAULT_QUALITY, vr=True
        )
        y = stream.resample_chunk(x.astype(np.float32), last=True)
    else:
        y = soxr.resample(x.astype(np.float32), in_rate, out_rate, quality=DEFAULT_QUALITY)
    reference: Int16Array = np.clip(np.rint(y), -32768, 32767).astype(np.int16)
    return reference


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("chunking", ["20ms", "irregular"])
@pytest.mark.parametrize("steady", [True, False], ids=["steady", "block"])
def test_streamed_equals_one_shot(in_rate: int, out_rate: int, chunking: str, steady: bool) -> None:
    x = _two_tones(in_rate)
    sizes = [in_rate // 50] if chunking == "20ms" else IRREGULAR_CHUNKS
    streamed = _stream(StreamResampler(in_rate, out_rate, steady=steady), x, sizes)
    reference = _one_shot(x, in_rate, out_rate, steady)

    assert _best_lag(reference, streamed) == 0
    assert abs(len(streamed) - len(reference)) <= 1
    n = min(len(streamed), len(reference))
    diff = np.abs(streamed[:n].astype(np.int32) - reference[:n].astype(np.int32))
    assert int(diff.max()) <= 1  # float rounding only
    # No clicks at chunk edges: the curvature of the streamed output is that of the one-shot.
    assert _max_second_difference(streamed) <= _max_second_difference(reference) + 4
    if not steady:
        # And the plain int16 one-shot (dithered by libsoxr) agrees within dither.
        int16_one_shot = soxr.resample(x, in_rate, out_rate, quality=DEFAULT_QUALITY)
        assert len(int16_one_shot) == len(streamed)
        assert int(np.max(np.abs(int16_one_shot.astype(np.int32) - streamed))) <= 3


def test_steady_mode_emits_one_chunk_per_chunk() -> None:
    # Why calls use the steady engine: after a warm-up, each 20 ms in gives 20 ms out,
    # so 20 ms pacing survives resampling (the block engine emits ~60 ms bursts).
    for in_rate, out_rate in RATE_PAIRS:
        resampler = StreamResampler(in_rate, out_rate)
        sizes = [len(resampler.process(bytes(2 * in_rate // 50))) // 2 for _ in range(20)]
        assert sizes[3:] == [out_rate // 50] * 17, (in_rate, out_rate, sizes)
    block = StreamResampler(8000, 24000, steady=False)
    block_sizes = [len(block.process(bytes(320))) // 2 for _ in range(20)]
    assert block_sizes.count(0) > 5


def test_output_is_deterministic() -> None:
    # libsoxr dithers int16 output with a clock-based seed; ours must not vary.
    x = _two_tones(8000, 0.5)
    outputs = [_stream(StreamResampler(8000, 24000), x, IRREGULAR_CHUNKS) for _ in range(3)]
    assert all(np.array_equal(outputs[0], other) for other in outputs[1:])


def test_full_scale_input_saturates_instead_of_wrapping() -> None:
    square = np.tile(np.array([32767] * 20 + [-32768] * 20, dtype=np.int16), 200)
    out = _stream(StreamResampler(8000, 24000), square, [160])
    # Gibbs overshoot is clipped to the rails, never wrapped to the other sign.
    assert int(out.max()) == 32767
    assert int(out.min()) == -32768
    positive_half = out[3 * 20 * 100 + 10 : 3 * 20 * 100 + 50]
    assert np.all(positive_half > 0)


def test_edge_check_catches_stateless_chunking() -> None:
    # The second-difference check above can fail: resampling each 20 ms chunk on
    # its own (no carried state) leaves steps at the chunk edges.
    x = _two_tones(8000)
    naive = np.concatenate(
        [soxr.resample(x[i : i + 160], 8000, 24000) for i in range(0, len(x), 160)]
    )
    reference = soxr.resample(x, 8000, 24000)
    assert _max_second_difference(naive) > 2 * _max_second_difference(reference)


def test_output_length_tracks_the_rate_ratio() -> None:
    resampler = StreamResampler(8000, 24000)
    produced = 0
    for i in range(100):
        produced += len(resampler.process(bytes(320))) // 2
        # soxr holds back at most one DFT block plus the filter delay (~75 ms here).
        assert 0 <= (i + 1) * 480 - produced <= 24 * 80
    produced += len(resampler.flush()) // 2
    assert produced == 100 * 480


def test_flush_resets_for_a_new_stream() -> None:
    x = _two_tones(8000, 0.3)
    resampler = StreamResampler(8000, 24000)
    first = _stream(resampler, x, [160])
    second = _stream(resampler, x, [160])
    assert np.array_equal(first, second)


def test_reset_drops_pending_state() -> None:
    x = _two_tones(24000, 0.3)
    resampler = StreamResampler(24000, 8000)
    resampler.process(_two_tones(24000, 0.2)[::-1].copy().tobytes())
    resampler.reset()
    after_reset = _stream(resampler, x, [480])
    fresh = _stream(StreamResampler(24000, 8000), x, [480])
    assert np.array_equal(after_reset, fresh)


def test_empty_chunk_is_a_no_op() -> None:
    resampler = StreamResampler(8000, 24000)
    assert resampler.process(b"") == b""
    x = _two_tones(8000, 0.2)
    assert np.array_equal(
        _stream(resampler, x, [160, 0]), _stream(StreamResampler(8000, 24000), x, [160])
    )


def test_equal_rates_pass_through() -> None:
    resampler = StreamResampler(24000, 24000)
    pcm = _two_tones(24000, 0.05).tobytes()
    assert resampler.passthrough
    assert resampler.process(pcm) == pcm
    assert resampler.flush() == b""
    resampler.reset()


def test_odd_length_is_rejected() -> None:
    with pytest.raises(PcmLengthError):
        StreamResampler(8000, 24000).process(b"\x00\x00\x00")
    with pytest.raises(PcmLengthError):
        StreamResampler(8000, 8000).process(b"\x00")


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError):
        StreamResampler(0, 24000)
    with pytest.raises(ValueError):
        StreamResampler(8000, 24000, quality="best")
