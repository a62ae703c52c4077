"""The polyphase resampler: its response, its delay, and streaming that equals one shot.

Every test runs twice: on the compiled product (media/_kernels.c) and on numpy's.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from rutster.media import polyphase
from rutster.media.compiled import KERNELS
from rutster.media.g711 import PcmLengthError
from rutster.media.polyphase import (
    STOPBAND_ATTENUATION_DB,
    PolyphaseResampler,
    kaiser_lowpass,
    supports,
)
from rutster.tools.twilio_simulator import read_wav_8k
from tests.conftest import SPEECH_WAV

RATE_PAIRS = [(8000, 24000), (24000, 8000), (16000, 24000), (24000, 16000), (48000, 24000)]
IRREGULAR_CHUNKS = [37, 160, 3, 211, 0, 1, 480, 999, 64]


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def product(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which product the resamplers built in a test run."""
    if request.param == "numpy":
        monkeypatch.setattr(polyphase, "KERNELS", None)
    else:
        assert KERNELS is not None, "the compiled kernels were not built (pip install -e .)"
    return str(request.param)


def _tone(rate: int, hz: float, seconds: float = 1.0, amplitude: float = 10_000.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * math.pi * hz * t)).astype("<i2").tobytes()


def _run(resampler: PolyphaseResampler, pcm: bytes, sizes: list[int]) -> npt.NDArray[np.float64]:
    out, pos = [], 0
    for size in itertools.cycle(sizes):
        if pos >= len(pcm):
            break
        out.append(resampler.process(pcm[pos : pos + 2 * size]))
        pos += 2 * size
    return np.frombuffer(b"".join(out), dtype="<i2").astype(np.float64)


def _level_db(y: npt.NDArray[np.float64], amplitude: float = 10_000.0) -> float:
    rms = float(np.sqrt(np.mean(y**2)))
    return 20 * math.log10(max(rms, 1e-9) / (amplitude / math.sqrt(2)))


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_passband_is_flat_to_seven_eighths_of_the_lower_nyquist(
    in_rate: int, out_rate: int
) -> None:
    nyquist = min(in_rate, out_rate) / 2
    for fraction in (0.05, 0.25, 0.5, 0.75, 0.85):
        y = _run(PolyphaseResampler(in_rate, out_rate), _tone(in_rate, fraction * nyquist), [160])
        assert abs(_level_db(y[out_rate // 10 :])) < 0.05, fraction


@pytest.mark.parametrize(("in_rate", "out_rate"), [(24000, 8000), (24000, 16000), (48000, 24000)])
def test_what_would_alias_is_80_db_down(in_rate: int, out_rate: int) -> None:
    # A tone above the stopband edge folds into the passband when decimated: it must not.
    for hz in np.linspace(1.15 * out_rate / 2, 0.95 * in_rate / 2, 5):
        y = _run(PolyphaseResampler(in_rate, out_rate), _tone(in_rate, hz), [480])
        assert _level_db(y[out_rate // 10 :]) < -STOPBAND_ATTENUATION_DB + 3, hz


@pytest.mark.parametrize(("in_rate", "out_rate"), [(8000, 24000), (16000, 24000)])
def test_images_are_80_db_down(in_rate: int, out_rate: int) -> None:
    y = _run(PolyphaseResampler(in_rate, out_rate), _tone(in_rate, 0.75 * in_rate / 2), [160])
    y = y[out_rate // 10 :]
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1 / out_rate)
    tone = spectrum[np.argmin(np.abs(freqs - 0.75 * in_rate / 2))]
    images = spectrum[freqs > 1.125 * in_rate / 2].max()
    assert 20 * math.log10(tone / images) > STOPBAND_ATTENUATION_DB


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_streamed_in_any_chunks_equals_one_shot(in_rate: int, out_rate: int) -> None:
    pcm = _tone(in_rate, 440) + _tone(in_rate, 1000, 0.5)
    one_shot = _run(PolyphaseResampler(in_rate, out_rate), pcm, [len(pcm) // 2])
    twenty_ms = _run(PolyphaseResampler(in_rate, out_rate), pcm, [in_rate // 50])
    irregular = _run(PolyphaseResampler(in_rate, out_rate), pcm, IRREGULAR_CHUNKS)
    assert len(one_shot) == len(pcm) // 2 * out_rate // in_rate
    assert np.abs(one_shot - twenty_ms).max() <= 1  # float32 sums in another order
    n = len(irregular)  # the last under-a-period samples wait for more input
    assert len(one_shot) - n < out_rate // in_rate + 1
    assert np.abs(one_shot[:n] - irregular).max() <= 1  # float32 sums in another order


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_twenty_ms_in_is_twenty_ms_out_from_the_first_chunk(in_rate: int, out_rate: int) -> None:
    resampler = PolyphaseResampler(in_rate, out_rate)
    chunk = _tone(in_rate, 300, 0.02)
    assert [len(resampler.process(chunk)) for _ in range(10)] == [2 * out_rate // 50] * 10


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_delay_is_a_whole_number_of_samples_at_both_rates(in_rate: int, out_rate: int) -> None:
    resampler = PolyphaseResampler(in_rate, out_rate)
    assert resampler.delay_ms < 3.0
    for rate in (in_rate, out_rate):
        samples = resampler.delay_ms * rate / 1000
        assert samples == pytest.approx(round(samples))
    # A click comes out where the delay says (its peak: a symmetric filter).
    x = np.zeros(in_rate // 10, dtype="<i2")
    x[in_rate // 20] = 20_000
    y = _run(resampler, x.tobytes(), [in_rate // 50])
    peak_ms = float(np.argmax(y)) / out_rate * 1000
    assert peak_ms == pytest.approx(50 + resampler.delay_ms, abs=1000 / out_rate)


def test_flush_returns_what_the_filter_owes_and_starts_afresh() -> None:
    resampler = PolyphaseResampler(8000, 24000)
    pcm = _tone(8000, 700, 0.1)
    body = resampler.process(pcm)
    tail = resampler.flush()
    assert len(tail) // 2 == round(resampler.delay_ms * 24)
    assert len(body + tail) // 2 == 3 * len(pcm) // 2 + len(tail) // 2
    again = resampler.process(pcm)
    assert again == body


def test_reset_forgets_the_stream() -> None:
    resampler = PolyphaseResampler(24000, 8000)
    resampler.process(_tone(24000, 1000, 0.02))
    resampler.reset()
    assert resampler.process(bytes(960)) == bytes(320)


def test_full_scale_input_saturates_instead_of_wrapping() -> None:
    square = np.tile(np.array([32767] * 20 + [-32768] * 20, dtype="<i2"), 200)
    y = _run(PolyphaseResampler(8000, 24000), square.tobytes(), [160])
    assert y.max() == 32767
    assert y.min() == -32768


def test_agrees_with_soxr_on_speech_band_audio() -> None:
    # Band-limited audio through both, aligned by the known delays: the same signal.
    pcm = (
        np.frombuffer(_tone(8000, 440, amplitude=6000), dtype="<i2")
        + np.frombuffer(_tone(8000, 2500, amplitude=6000), dtype="<i2")
    ).tobytes()
    ours = _run(PolyphaseResampler(8000, 24000), pcm, [160])
    theirs = soxr.resample(np.frombuffer(pcm, dtype="<i2").astype(np.float64), 8000, 24000)
    shift = round(PolyphaseResampler(8000, 24000).delay_ms * 24)
    a, b = ours[shift + 2400 : -2400], theirs[2400 : len(ours) - shift - 2400]
    error = a - b
    assert 10 * math.log10(np.mean(b**2) / np.mean(error**2)) > 60  # dB


def test_rates_it_does_not_take() -> None:
    assert supports(8000, 24000) and supports(48000, 24000) and supports(12000, 8000)
    assert not supports(44100, 24000)
    assert not supports(0, 8000)
    with pytest.raises(ValueError, match="no polyphase filter"):
        PolyphaseResampler(44100, 24000)
    with pytest.raises(PcmLengthError):
        PolyphaseResampler(8000, 24000).process(b"\x00")
    with pytest.raises(ValueError, match="band edges"):
        kaiser_lowpass(8000, 3000, 2000, 80)


def test_the_filter_has_unit_gain_and_linear_phase() -> None:
    h = kaiser_lowpass(24000, 3500, 4500, 80, delay_step=3)
    assert len(h) % 2 == 1
    assert ((len(h) - 1) // 2) % 3 == 0
    assert h.sum() == pytest.approx(1.0)
    assert np.allclose(h, h[::-1])


@pytest.mark.parametrize(("in_rate", "out_rate"), [*RATE_PAIRS, (24000, 48000)])
def test_compiled_and_numpy_products_agree_within_one_pcm_step(
    in_rate: int, out_rate: int, product: str
) -> None:
    """The C kernel sums in double, numpy's matrix product in float32: on 30 s of
    recorded speech at every rate pair the two may differ by one PCM step, rarely."""
    if product == "numpy":
        pytest.skip("compares the two products; run once")
    speech = read_wav_8k(SPEECH_WAV)
    if in_rate != 8000:
        speech = PolyphaseResampler(8000, in_rate).process(speech)
    chunk = in_rate // 50
    outputs = []
    for compiled in (True, False):
        resampler = PolyphaseResampler(in_rate, out_rate)
        resampler.compiled = compiled
        outputs.append(_run(resampler, speech, [chunk, chunk, 37, chunk]))
    difference = np.abs(outputs[0] - outputs[1])
    assert len(outputs[0]) > 20 * out_rate
    assert difference.max() <= 1
    assert np.count_nonzero(difference) < len(difference) / 10_000


def test_the_compiled_product_refuses_bad_arguments(product: str) -> None:
    if product == "numpy":
        pytest.skip("the compiled kernel's own checks")
    assert KERNELS is not None
    x = np.zeros(50, np.float32)
    coefficients = np.zeros((10, 3), np.float32)
    assert KERNELS.polyphase_pcm16(x, coefficients, 10, 3, 1, 41) == bytes(41 * 3 * 2)
    with pytest.raises(ValueError, match="width"):
        KERNELS.polyphase_pcm16(x, coefficients, 10, 3, 1, 42)  # reads past x
    with pytest.raises(ValueError, match="width"):
        KERNELS.polyphase_pcm16(x, coefficients, 11, 3, 1, 1)  # coefficients are 10 x 3
    with pytest.raises(ValueError, match="width"):
        KERNELS.polyphase_pcm16(x, coefficients, 10, 3, 0, 1)
    with pytest.raises(TypeError, match="float32"):
        KERNELS.polyphase_pcm16(x.astype(np.float64), coefficients, 10, 3, 1, 1)
    with pytest.raises(TypeError, match="6 arguments"):
        KERNELS.polyphase_pcm16(x, coefficients, 10, 3, 1)
    with pytest.raises(TypeError):
        KERNELS.polyphase_pcm16(x, coefficients, 10, 3, 1, "1")
    loud = np.full(50, 1e9, np.float32)
    ones = np.ones((10, 3), np.float32)
    clipped = np.frombuffer(KERNELS.polyphase_pcm16(loud, ones, 10, 3, 1, 2), "<i2")
    assert (clipped == 32767).all()
    assert (np.frombuffer(KERNELS.polyphase_pcm16(-loud, ones, 10, 3, 1, 2), "<i2") == -32768).all()
