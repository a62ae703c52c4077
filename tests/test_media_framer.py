"""Framer: fixed-size frames out of arbitrary chunks, remainder carried."""

from __future__ import annotations

import random

import pytest

from rutster.media.formats import CANONICAL_FRAME_BYTES, CANONICAL_FRAME_SAMPLES
from rutster.media.framer import Framer


@pytest.mark.parametrize("seed", range(5))
def test_random_chunking_yields_the_input_prefix(seed: int) -> None:
    rng = random.Random(seed)
    framer = Framer()
    pushed = bytearray()
    frames: list[bytes] = []
    for _ in range(300):
        size = rng.choice([0, 1, 2, 3, rng.randrange(0, 3000), CANONICAL_FRAME_BYTES])
        chunk = rng.randbytes(size)
        pushed += chunk
        out = framer.push(chunk)
        assert all(len(frame) == CANONICAL_FRAME_BYTES for frame in out)
        frames.extend(out)
        whole = len(pushed) // CANONICAL_FRAME_BYTES * CANONICAL_FRAME_BYTES
        assert b"".join(frames) == bytes(pushed[:whole])
        assert framer.pending_samples == (len(pushed) - whole) // 2
    assert all(type(frame) is bytes for frame in frames)


def test_dangling_odd_byte_is_carried() -> None:
    framer = Framer(frame_samples=2)
    assert framer.push(b"\x01") == []
    assert framer.pending_samples == 0
    assert framer.push(b"\x02\x03") == []
    assert framer.pending_samples == 1
    assert framer.push(b"\x04\x05") == [b"\x01\x02\x03\x04"]
    assert framer.pending_samples == 0  # one odd byte (b"\x05") left
    assert framer.push(b"\x06\x07\x08\x09") == [b"\x05\x06\x07\x08"]


def test_exact_frames_pass_through() -> None:
    framer = Framer()
    frame = bytes(range(256)) * 3 + bytes(CANONICAL_FRAME_BYTES - 768)
    assert framer.push(frame) == [frame]
    assert framer.push(frame + frame) == [frame, frame]
    assert framer.pending_samples == 0


def test_reset_reports_discarded_samples() -> None:
    framer = Framer()
    framer.push(bytes(2 * 100 + 1))
    assert framer.pending_samples == 100
    assert framer.reset() == 100
    assert framer.pending_samples == 0
    assert framer.push(bytes(CANONICAL_FRAME_BYTES)) == [bytes(CANONICAL_FRAME_BYTES)]


def test_custom_frame_size() -> None:
    framer = Framer(frame_samples=160)
    assert framer.frame_samples == 160
    assert [len(f) for f in framer.push(bytes(1000))] == [320, 320, 320]
    assert framer.pending_samples == 20
    assert Framer().frame_samples == CANONICAL_FRAME_SAMPLES


def test_bad_frame_size_is_rejected() -> None:
    with pytest.raises(ValueError):
        Framer(frame_samples=0)
