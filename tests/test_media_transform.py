"""Inbound/outbound media transforms on the speech fixture."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from media.formats import (
    CANONICAL_FRAME_BYTES,
    CANONICAL_FRAME_SAMPLES,
    TWILIO_MULAW_8K,
    Encoding,
    MediaFormat,
)
from media.g711 import PcmLengthError, alaw_encode, ulaw_decode, ulaw_encode
from media.transform import InboundTransform, OutboundTransform, UnsupportedFormatError

FIXTURE = Path(__file__).parent / "fixtures" / "audio" / "caller_speech_8k.wav"
# HQ soxr holds back at most one DFT block plus the filter delay: ~75 ms at 24 kHz.
MAX_RESAMPLER_BACKLOG_SAMPLES = 24 * 80


@pytest.fixture(scope="module")
def speech_pcm() -> bytes:
    with wave.open(str(FIXTURE), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 8000)
        return wav.readframes(wav.getnframes())


@pytest.fixture(scope="module")
def speech_mulaw(speech_pcm: bytes) -> bytes:
    return ulaw_encode(speech_pcm)


def _as_float(pcm: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def _best_correlation(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    # The outbound transform is primed with silence, so its output starts with the
    # resampler's latency (~25 ms at 8 kHz = 200 samples) as leading silence.
    n = min(len(a), len(b)) - 512
    best = -1.0
    for lag in range(-32, 480):
        x = a[32 : 32 + n]
        y = b[32 + lag : 32 + lag + n]
        best = max(best, float(np.corrcoef(x, y)[0, 1]))
    return best


def test_twenty_ms_mulaw_in_gives_canonical_frames_over_time(speech_mulaw: bytes) -> None:
    inbound = InboundTransform(TWILIO_MULAW_8K)
    total = 0
    chunks = [speech_mulaw[i : i + 160] for i in range(0, len(speech_mulaw), 160)]
    for n, chunk in enumerate(chunks, start=1):
        frames = inbound.process(chunk)
        assert all(len(frame) == CANONICAL_FRAME_BYTES for frame in frames)
        total += len(frames)
        # Frames keep flowing: never more than the resampler's block behind.
        behind = n * CANONICAL_FRAME_SAMPLES - total * CANONICAL_FRAME_SAMPLES
        assert 0 <= behind <= MAX_RESAMPLER_BACKLOG_SAMPLES + CANONICAL_FRAME_SAMPLES
    assert total >= len(chunks) - 4


def test_odd_length_mulaw_chunks_are_fine(speech_mulaw: bytes) -> None:
    regular = InboundTransform(TWILIO_MULAW_8K)
    irregular = InboundTransform(TWILIO_MULAW_8K)
    audio = speech_mulaw[:16000]
    a = b"".join(f for i in range(0, len(audio), 160) for f in regular.process(audio[i : i + 160]))
    b_frames: list[bytes] = []
    pos = 0
    for size in [37, 161, 1, 0, 333] * 200:
        b_frames += irregular.process(audio[pos : pos + size])
        pos += size
    assert pos >= len(audio)
    b = b"".join(b_frames)
    n = min(len(a), len(b))
    expected_samples = len(audio) * 3  # 1 byte per sample at 8 kHz -> 3 samples at 24 kHz
    assert n // 2 >= expected_samples - MAX_RESAMPLER_BACKLOG_SAMPLES - CANONICAL_FRAME_SAMPLES
    diff = np.abs(_as_float(a[:n]) - _as_float(b[:n]))
    assert diff.max() <= 1  # same stream, same output (float rounding aside)


def test_round_trip_8k_24k_8k_correlates(speech_mulaw: bytes) -> None:
    inbound = InboundTransform(TWILIO_MULAW_8K)
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    wire_out = bytearray()
    for i in range(0, len(speech_mulaw), 160):
        for frame in inbound.process(speech_mulaw[i : i + 160]):
            wire_out += outbound.process(frame)
    wire_out += outbound.flush()
    sent = _as_float(ulaw_decode(speech_mulaw))
    received = _as_float(ulaw_decode(bytes(wire_out)))
    assert abs(len(received) - len(sent)) <= MAX_RESAMPLER_BACKLOG_SAMPLES // 3
    # soxr's steady (variable-rate) engine delays by a fraction of a sample in each
    # direction (measured: -0.5 sample at 24 kHz in, +2.33 samples at 8 kHz out), so
    # the round trip is shifted by 1/6 of an 8 kHz sample: inaudible, but it caps
    # sample-wise correlation of wide-band speech near 0.95 (0.99996 with the block engine).
    assert _best_correlation(sent, received) >= 0.94


def test_outbound_conserves_samples_and_flushes(speech_pcm: bytes) -> None:
    canonical = np.repeat(np.frombuffer(speech_pcm[:32000], dtype="<i2"), 3).tobytes()
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    out = b"".join(
        outbound.process(canonical[i : i + CANONICAL_FRAME_BYTES])
        for i in range(0, len(canonical), CANONICAL_FRAME_BYTES)
    )
    # Primed: every 20 ms frame in gives exactly 20 ms out (160 μ-law bytes)...
    assert len(out) == 16000
    # ...the first ~25 ms being the primed silence, with the newest audio still held,
    tail = outbound.flush()
    assert 0 < len(tail) <= 240
    # ...which drain() would have released without ending the stream.
    again = OutboundTransform(TWILIO_MULAW_8K)
    for i in range(0, len(canonical), CANONICAL_FRAME_BYTES):
        again.process(canonical[i : i + CANONICAL_FRAME_BYTES])
    drained = again.drain()
    assert len(drained) == 320
    assert drained[: len(tail)] == tail[: len(drained)]


def test_outbound_frames_are_exactly_twenty_ms_from_the_first() -> None:
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    tone = (8000 * np.sin(np.arange(480) / 3)).astype("<i2").tobytes()
    assert [len(outbound.process(tone)) for _ in range(50)] == [160] * 50


def test_outbound_reset_drops_held_audio() -> None:
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    tone = (8000 * np.sin(np.arange(960) / 3)).astype("<i2").tobytes()
    outbound.process(tone)
    outbound.reset()
    # Nothing of the tone survives the reset: only primed silence remains.
    assert set(outbound.flush()) <= {0xFF, 0x7F}


def test_alaw_and_l16_legs() -> None:
    alaw = MediaFormat(Encoding.ALAW, 8000)
    inbound = InboundTransform(alaw)
    frames = [f for _ in range(10) for f in inbound.process(alaw_encode(bytes(320)))]
    assert len(frames) >= 6
    outbound = OutboundTransform(alaw)
    wire = b"".join(outbound.process(bytes(CANONICAL_FRAME_BYTES)) for _ in range(10))
    assert wire == b"\xd5" * 1600  # A-law silence, 200 ms at 8 kHz, exactly 20 ms per frame

    l16_24k = MediaFormat(Encoding.L16, 24000)
    passthrough = InboundTransform(l16_24k)
    assert passthrough.process(bytes(CANONICAL_FRAME_BYTES)) == [bytes(CANONICAL_FRAME_BYTES)]
    assert OutboundTransform(l16_24k).process(b"\x01\x00") == b"\x01\x00"

    l16_16k = MediaFormat(Encoding.L16, 16000)
    inbound16 = InboundTransform(l16_16k)
    frames16 = [f for _ in range(10) for f in inbound16.process(bytes(640))]
    assert 7 <= len(frames16) <= 10
    assert inbound16.wire_format == l16_16k


def test_odd_length_l16_payload_is_rejected_without_state_change() -> None:
    inbound = InboundTransform(MediaFormat(Encoding.L16, 24000))
    assert inbound.process(bytes(100)) == []
    with pytest.raises(PcmLengthError) as excinfo:
        inbound.process(bytes(101))
    assert excinfo.value.reason == "odd_pcm_length"
    assert inbound.process(bytes(CANONICAL_FRAME_BYTES - 100)) == [bytes(CANONICAL_FRAME_BYTES)]
    with pytest.raises(ValueError):
        OutboundTransform(TWILIO_MULAW_8K).process(b"\x00")


def test_unsupported_formats_are_rejected() -> None:
    with pytest.raises(UnsupportedFormatError) as excinfo:
        InboundTransform(MediaFormat(Encoding.MULAW, 8000, channels=2))
    assert excinfo.value.reason == "unsupported_media_format"
    with pytest.raises(UnsupportedFormatError):
        OutboundTransform(MediaFormat(Encoding.L16, 0))
