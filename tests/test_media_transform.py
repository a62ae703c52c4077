"""Inbound/outbound media transforms on the speech fixture."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from rutster.media.formats import (
    CANONICAL_FRAME_BYTES,
    CANONICAL_FRAME_SAMPLES,
    TWILIO_MULAW_8K,
    Encoding,
    MediaFormat,
)
from rutster.media.g711 import PcmLengthError, alaw_encode, ulaw_decode, ulaw_encode
from rutster.media.resample import ResamplerEngine
from rutster.media.transform import InboundTransform, OutboundTransform, UnsupportedFormatError

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


def _best_lag_and_correlation(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], max_lag: int = 480
) -> tuple[int, float]:
    """The lag of ``b`` behind ``a`` (samples) that correlates best, and that correlation."""
    n = min(len(a), len(b)) - max_lag - 64
    best, best_lag = -1.0, 0
    for lag in range(-32, max_lag):
        x = a[32 : 32 + n]
        y = b[32 + lag : 32 + lag + n]
        c = float(np.corrcoef(x, y)[0, 1])
        if c > best:
            best, best_lag = c, lag
    return best_lag, best


def _round_trip(speech_mulaw: bytes, engine: ResamplerEngine) -> tuple[bytes, bytes]:
    inbound = InboundTransform(TWILIO_MULAW_8K, engine=engine)
    outbound = OutboundTransform(TWILIO_MULAW_8K, engine=engine)
    wire_out = bytearray()
    for i in range(0, len(speech_mulaw), 160):
        for frame in inbound.process(speech_mulaw[i : i + 160]):
            wire_out += outbound.process(frame)
    wire_out += outbound.flush()
    return speech_mulaw, bytes(wire_out)


def test_twenty_ms_mulaw_in_gives_one_canonical_frame_each(speech_mulaw: bytes) -> None:
    # The default engine (media.polyphase) holds no block: every 20 ms chunk in
    # completes exactly one canonical frame, from the first chunk on.
    inbound = InboundTransform(TWILIO_MULAW_8K)
    chunks = [speech_mulaw[i : i + 160] for i in range(0, len(speech_mulaw) // 160 * 160, 160)]
    for chunk in chunks:
        frames = inbound.process(chunk)
        assert [len(frame) for frame in frames] == [CANONICAL_FRAME_BYTES]


@pytest.mark.parametrize("engine", list(ResamplerEngine))
def test_twenty_ms_mulaw_in_gives_canonical_frames_over_time(
    speech_mulaw: bytes, engine: ResamplerEngine
) -> None:
    inbound = InboundTransform(TWILIO_MULAW_8K, engine=engine)
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
    assert n // 2 == len(audio) * 3  # 1 byte per sample at 8 kHz -> 3 samples at 24 kHz
    diff = np.abs(_as_float(a[:n]) - _as_float(b[:n]))
    assert diff.max() <= 1  # same stream, same output (float rounding aside)


def test_round_trip_8k_24k_8k_is_faithful_and_5_ms_late(speech_mulaw: bytes) -> None:
    sent_mulaw, wire_out = _round_trip(speech_mulaw, ResamplerEngine.POLYPHASE)
    sent = _as_float(ulaw_decode(sent_mulaw))
    received = _as_float(ulaw_decode(wire_out))
    # Exactly as long, plus the 2.625 ms the outbound flush gives of what its filter owes.
    assert len(received) == len(sent) + 21
    lag, correlation = _best_lag_and_correlation(sent, received)
    # Two 2.625 ms linear-phase filters: 42 samples at 8 kHz, and (no fractional
    # delay) sample-wise the same speech.
    assert lag == 42
    assert correlation >= 0.99


def _latency_ms(engine: ResamplerEngine, *, inbound: bool) -> float:
    """How late a sample leaves the transform: its position in the output stream
    behind its place in the input, plus how far the output stream is held back."""
    chunk = 160 if inbound else CANONICAL_FRAME_SAMPLES
    x = np.zeros(50 * chunk, dtype="<i2")
    start = 25 * chunk + chunk // 2
    x[start : start + 8] = [0, 8000, 16000, 24000, 24000, 16000, 8000, 0]
    produced: list[bytes] = []
    if inbound:
        transform_in = InboundTransform(TWILIO_MULAW_8K, engine=engine)
        mulaw = ulaw_encode(x.tobytes())
        for i in range(0, len(mulaw), chunk):
            produced += transform_in.process(mulaw[i : i + chunk])
        out_rate, in_rate = 24_000, 8_000
        y = _as_float(b"".join(produced))
    else:
        transform_out = OutboundTransform(TWILIO_MULAW_8K, engine=engine)
        for i in range(0, len(x), chunk):
            produced.append(transform_out.process(x[i : i + chunk].tobytes()))
        out_rate, in_rate = 8_000, 24_000
        y = _as_float(ulaw_decode(b"".join(produced)))
    aligned_ms = (float(np.argmax(y)) / out_rate - (start + 3.5) / in_rate) * 1000
    held_ms = (len(x) / in_rate - len(y) / out_rate) * 1000
    return aligned_ms + held_ms


@pytest.mark.parametrize("inbound", [True, False], ids=["inbound", "outbound"])
def test_default_engine_delays_a_ninth_of_what_soxr_does(inbound: bool) -> None:
    # The polyphase filter's 2.625 ms against soxr's steady engine (the peer engine):
    # measured 30 ms in (all of it held back) and 25 ms out (primed: all of it in
    # the output's alignment).
    polyphase = _latency_ms(ResamplerEngine.POLYPHASE, inbound=inbound)
    soxr_steady = _latency_ms(ResamplerEngine.SOXR_STEADY, inbound=inbound)
    assert 2.0 <= polyphase <= 3.0
    assert soxr_steady >= 9 * polyphase


def test_outbound_conserves_samples_and_flushes(speech_pcm: bytes) -> None:
    canonical = np.repeat(np.frombuffer(speech_pcm[:32000], dtype="<i2"), 3).tobytes()
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    out = b"".join(
        outbound.process(canonical[i : i + CANONICAL_FRAME_BYTES])
        for i in range(0, len(canonical), CANONICAL_FRAME_BYTES)
    )
    # Every 20 ms frame in gives exactly 20 ms out (160 μ-law bytes)...
    assert len(out) == 16000
    # ...with the newest 2.625 ms (21 samples at 8 kHz) still in the filter.
    assert len(outbound.flush()) == 21


def test_outbound_frames_are_exactly_twenty_ms_from_the_first() -> None:
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    tone = (8000 * np.sin(np.arange(480) / 3)).astype("<i2").tobytes()
    assert [len(outbound.process(tone)) for _ in range(50)] == [160] * 50
    primed = OutboundTransform(TWILIO_MULAW_8K, engine=ResamplerEngine.SOXR_STEADY)
    assert [len(primed.process(tone)) for _ in range(50)] == [160] * 50


def test_outbound_reset_drops_held_audio() -> None:
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    tone = (8000 * np.sin(np.arange(960) / 3)).astype("<i2").tobytes()
    outbound.process(tone)
    outbound.reset()
    # Nothing of the tone survives the reset: only silence remains.
    assert set(outbound.flush()) <= {0xFF, 0x7F}


def test_alaw_and_l16_legs() -> None:
    alaw = MediaFormat(Encoding.ALAW, 8000)
    inbound = InboundTransform(alaw)
    frames = [f for _ in range(10) for f in inbound.process(alaw_encode(bytes(320)))]
    assert len(frames) == 10
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
    assert len(frames16) == 10
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
