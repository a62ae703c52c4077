"""What the reflex loop hears (media/narrowband.py): the wire's audio as 8 kHz frames."""

from __future__ import annotations

import numpy as np
import pytest

from rutster.media.formats import NARROWBAND_FRAME_BYTES, NARROWBAND_FRAME_SAMPLES
from rutster.media.g711 import PcmLengthError
from rutster.media.narrowband import NarrowbandTap


def _tone(hz: float, rate: int, seconds: float, amplitude: float = 8000.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def _push_in_chunks(tap: NarrowbandTap, pcm: bytes, chunk: int) -> np.ndarray:
    frames = [f for i in range(0, len(pcm), chunk) for f in tap.push(pcm[i : i + chunk])]
    assert all(len(f) == NARROWBAND_FRAME_BYTES for f in frames)
    return np.frombuffer(b"".join(frames), dtype="<i2").astype(np.float64)


def _level_db(x: np.ndarray, amplitude: float = 8000.0) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(x**2)) / (amplitude / np.sqrt(2))))


def test_8k_is_framing_only() -> None:
    pcm = np.arange(-500, 500, dtype="<i2").tobytes()  # 1000 samples
    tap = NarrowbandTap(8_000)
    out = _push_in_chunks(tap, pcm, 222)  # odd-sized chunks of whole samples
    assert len(out) == 1000 // NARROWBAND_FRAME_SAMPLES * NARROWBAND_FRAME_SAMPLES
    assert np.array_equal(out, np.arange(-500, -500 + len(out)))


@pytest.mark.parametrize("rate", [16_000, 24_000, 48_000])
def test_the_telephone_band_passes_whole_across_chunk_edges(rate: int) -> None:
    tap = NarrowbandTap(rate)
    out = _push_in_chunks(tap, _tone(1_000.0, rate, 0.5), 2 * 333)[NARROWBAND_FRAME_SAMPLES:]
    assert abs(_level_db(out)) <= 0.5
    # No seams: a 1 kHz tone at 8 kHz moves by at most 2 sin(pi/8) of its peak a sample.
    assert float(np.max(np.abs(np.diff(out)))) <= 8000 * 2 * np.sin(np.pi / 8) * 1.05


@pytest.mark.parametrize(("rate", "hz"), [(16_000, 5_000.0), (24_000, 6_000.0), (24_000, 11_000.0)])
def test_what_the_line_cannot_carry_does_not_fold_into_the_band(rate: int, hz: float) -> None:
    out = _push_in_chunks(NarrowbandTap(rate), _tone(hz, rate, 0.5), 640)
    assert _level_db(out[NARROWBAND_FRAME_SAMPLES:]) <= -40.0


def test_the_delay_is_under_a_millisecond() -> None:
    rate = 24_000
    click = np.zeros(rate // 10)
    click[1200] = 20000.0  # at 50 ms
    out = _push_in_chunks(NarrowbandTap(rate), click.astype("<i2").tobytes(), 960)
    assert abs(int(np.argmax(np.abs(out))) - 400) <= 8  # 8 kHz samples: 1 ms


def test_other_rates_go_through_the_resampler() -> None:
    out = _push_in_chunks(NarrowbandTap(11_025), _tone(1_000.0, 11_025, 1.0), 882)
    assert len(out) >= 7_000 and abs(_level_db(out[2_000:])) <= 1.0


def test_odd_bytes_and_bad_rates_are_refused() -> None:
    tap = NarrowbandTap(16_000)
    with pytest.raises(PcmLengthError):
        tap.push(b"\x00\x01\x02")
    assert tap.push(bytes(640)) == [bytes(NARROWBAND_FRAME_BYTES)]
    with pytest.raises(ValueError):
        NarrowbandTap(0)


def test_reset_forgets_the_partial_frame() -> None:
    tap = NarrowbandTap(8_000)
    assert tap.push(bytes(200)) == []
    tap.reset()
    assert tap.push(bytes(300)) == []
    assert len(tap.push(bytes(20))) == 1
