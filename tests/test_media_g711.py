"""G.711 μ-law/A-law and L16 codecs."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np
import pytest

from rutster.media import g711
from rutster.media.formats import Encoding
from rutster.media.g711 import PcmLengthError


def _pcm(*samples: int) -> bytes:
    return struct.pack(f"<{len(samples)}h", *samples)


def _samples(pcm: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(pcm) // 2}h", pcm))


def _sine(freq: float, rate: int, seconds: float, amplitude: float) -> bytes:
    n = int(rate * seconds)
    t = np.arange(n) / rate
    return (amplitude * np.sin(2 * math.pi * freq * t)).astype("<i2").tobytes()


def test_ulaw_known_code_points() -> None:
    # ITU-T G.711: 0xFF and 0x7F are +0 and -0; 0x80/0x00 are the extremes (±8031 << 2).
    assert _samples(g711.ulaw_decode(bytes([0xFF, 0x7F, 0x80, 0x00]))) == [0, 0, 32124, -32124]
    assert g711.ulaw_encode(_pcm(0, 32767, -32768)) == bytes([0xFF, 0x80, 0x00])


def test_alaw_known_code_points() -> None:
    # ITU-T G.711: 0xD5/0x55 are the smallest positive/negative steps (±8 in 16-bit),
    # 0xAA/0x2A the extremes (±4032 << 3).
    assert _samples(g711.alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A]))) == [8, -8, 32256, -32256]
    assert g711.alaw_encode(_pcm(0, 32767, -32768)) == bytes([0xD5, 0xAA, 0x2A])


def test_decode_is_one_sample_per_byte_and_little_endian() -> None:
    pcm = g711.ulaw_decode(bytes([0x80]))
    assert pcm == (32124).to_bytes(2, "little", signed=True)
    assert len(g711.alaw_decode(bytes(range(256)))) == 512


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)],
    ids=["mulaw", "alaw"],
)
def test_round_trip_error_is_bounded_on_a_sine(
    encode: Callable[[bytes], bytes], decode: Callable[[bytes], bytes]
) -> None:
    pcm = _sine(1000, 8000, 0.5, 30000) + _sine(440, 8000, 0.5, 300)
    back = decode(encode(pcm))
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    y = np.frombuffer(back, dtype="<i2").astype(np.float64)
    err = np.abs(x - y)
    # Logarithmic quantiser: the error is a small fraction of the magnitude
    # (half a step; steps are at most 1/16 of the segment base) plus the finest step.
    assert np.all(err <= np.abs(x) / 30 + 16)
    snr_db = 10 * math.log10(float(np.sum(x**2) / np.sum(err**2)))
    assert snr_db > 35  # G.711 gives about 38 dB on a loud sine


def test_l16_is_a_passthrough() -> None:
    pcm = _pcm(1, -2, 32767, -32768)
    assert g711.l16_decode(pcm) == pcm
    assert g711.l16_encode(pcm) == pcm
    assert g711.l16_decode(b"") == b""


@pytest.mark.parametrize(
    "func", [g711.l16_decode, g711.l16_encode, g711.ulaw_encode, g711.alaw_encode]
)
def test_odd_length_pcm_is_rejected_with_a_reason(func: Callable[[bytes], bytes]) -> None:
    with pytest.raises(PcmLengthError) as excinfo:
        func(b"\x00\x01\x02")
    assert isinstance(excinfo.value, ValueError)
    assert excinfo.value.reason == "odd_pcm_length"
    assert excinfo.value.length == 3


def test_g711_decoders_accept_any_length() -> None:
    assert g711.ulaw_decode(b"") == b""
    assert len(g711.ulaw_decode(b"\xff" * 37)) == 74


@pytest.mark.parametrize("encoding", list(Encoding))
def test_dispatch_matches_the_specific_codec(encoding: Encoding) -> None:
    pcm = _sine(700, 8000, 0.1, 12000)
    specific_encode = {
        Encoding.MULAW: g711.ulaw_encode,
        Encoding.ALAW: g711.alaw_encode,
        Encoding.L16: g711.l16_encode,
    }[encoding]
    specific_decode = {
        Encoding.MULAW: g711.ulaw_decode,
        Encoding.ALAW: g711.alaw_decode,
        Encoding.L16: g711.l16_decode,
    }[encoding]
    wire = g711.encode(pcm, encoding)
    assert wire == specific_encode(pcm)
    assert g711.decode(wire, encoding) == specific_decode(wire)
