"""Playout buffer: exact frames, bounded capacity, per-item played counters."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rutster.media.formats import CANONICAL_FRAME_BYTES, CANONICAL_FRAME_SAMPLES
from rutster.media.g711 import PcmLengthError
from rutster.media.playout import DEFAULT_MAX_MS, MAX_TRACKED_ITEMS, PlayoutBuffer, PlayoutFrame


def _ramp(start: int, count: int) -> bytes:
    """Samples start, start+1, ... (mod 2**16) so positions can be recognised."""
    return (np.arange(start, start + count) % 65536).astype("<u2").tobytes()


def _sample_values(pcm: bytes) -> list[int]:
    return [int(v) for v in np.frombuffer(pcm, dtype="<u2")]


def test_defaults() -> None:
    buffer = PlayoutBuffer()
    assert buffer.max_ms == DEFAULT_MAX_MS == 30_000
    assert buffer.sample_rate == 24_000
    assert buffer.frame_samples == CANONICAL_FRAME_SAMPLES
    assert buffer.pop_frame() is None
    assert buffer.pop_frame(pad=True) is None
    assert buffer.current_item is None
    assert buffer.next_item is None


def test_exact_frames_from_odd_sized_pushes() -> None:
    rng = random.Random(7)
    buffer = PlayoutBuffer()
    pushed = 0
    popped: list[bytes] = []
    for _ in range(400):
        count = rng.choice([1, 37, 211, 479, 481, rng.randrange(0, 2000)])
        assert buffer.push(_ramp(pushed, count), "item") == 0
        pushed += count
        while (frame := buffer.pop_frame()) is not None:
            assert len(frame.pcm) == CANONICAL_FRAME_BYTES
            assert frame.audio_samples == CANONICAL_FRAME_SAMPLES
            assert frame.item == "item"
            popped.append(frame.pcm)
        assert buffer.buffered_samples == pushed - len(popped) * CANONICAL_FRAME_SAMPLES
        assert buffer.buffered_samples < CANONICAL_FRAME_SAMPLES
    assert b"".join(popped) == _ramp(0, len(popped) * CANONICAL_FRAME_SAMPLES)


def test_odd_byte_length_is_rejected() -> None:
    buffer = PlayoutBuffer()
    with pytest.raises(PcmLengthError):
        buffer.push(b"\x00\x00\x00", "a")
    assert buffer.buffered_samples == 0
    assert buffer.push(b"", "a") == 0


def test_overflow_drops_oldest_and_counts() -> None:
    buffer = PlayoutBuffer(max_ms=100)  # 2400 samples
    assert buffer.push(_ramp(0, 2000), "a") == 0
    assert buffer.push(_ramp(2000, 1000), "b") == 600
    assert buffer.buffered_samples == 2400
    assert buffer.dropped_samples == 600
    assert buffer.overflow_events == 1
    frame = buffer.pop_frame()
    assert frame is not None
    assert _sample_values(frame.pcm) == list(range(600, 1080))
    assert buffer.push(_ramp(3000, 100), "c") == 0  # room again after the pop
    assert buffer.push(_ramp(3100, 480), "c") == 100
    assert buffer.dropped_samples == 700
    assert buffer.overflow_events == 2
    frame = buffer.pop_frame()
    assert frame is not None
    assert _sample_values(frame.pcm) == list(range(1180, 1660))
    assert buffer.played_ms("a") == 40  # dropped audio never counts as played


def test_push_bigger_than_capacity_keeps_its_newest_part() -> None:
    buffer = PlayoutBuffer(max_ms=40)  # 960 samples
    buffer.push(_ramp(0, 100), "old")
    assert buffer.push(_ramp(1000, 2000), "new") == 100 + 1040
    assert buffer.buffered_samples == 960
    assert buffer.next_item == "new"
    frames = [buffer.pop_frame(), buffer.pop_frame()]
    assert buffer.pop_frame(pad=True) is None
    pcm = b"".join(f.pcm for f in frames if f is not None)
    assert _sample_values(pcm) == list(range(2040, 3000))


def test_clear_reports_ms_rounded_down() -> None:
    buffer = PlayoutBuffer()
    buffer.push(bytes(2 * 1000), "a")  # 41.67 ms
    assert buffer.buffered_ms == 41
    assert buffer.clear() == 41
    assert buffer.buffered_samples == 0
    assert buffer.pop_frame(pad=True) is None
    assert buffer.clear() == 0
    # Still usable after a clear, including a partly consumed head segment.
    buffer.push(_ramp(0, 600), "b")
    buffer.pop_frame()
    buffer.clear()
    buffer.push(_ramp(5, 480), "c")
    frame = buffer.pop_frame()
    assert frame is not None and _sample_values(frame.pcm) == list(range(5, 485))


def test_played_ms_across_item_boundaries_and_padding() -> None:
    buffer = PlayoutBuffer()
    buffer.push(_ramp(0, 300), "a")
    buffer.push(_ramp(300, 500), "b")
    assert buffer.next_item == "a"
    frame = buffer.pop_frame()
    assert frame == PlayoutFrame(_ramp(0, 480), "b", 480)
    assert buffer.current_item == "b"
    assert buffer.played_ms("a") == 12  # 300 samples = 12.5 ms
    assert buffer.played_ms("b") == 7  # 180 samples = 7.5 ms
    assert buffer.pop_frame() is None  # 320 left: not a whole frame
    padded = buffer.pop_frame(pad=True)
    assert padded is not None
    assert padded.item == "b"
    assert padded.audio_samples == 320
    assert padded.pcm == _ramp(480, 320) + bytes(2 * 160)
    assert buffer.played_ms("b") == 20
    assert buffer.played_ms("unknown") == 0
    assert buffer.current_item == "b"


def test_untagged_audio() -> None:
    buffer = PlayoutBuffer()
    buffer.push(bytes(2 * 240), "a")
    buffer.push(bytes(2 * 480), None)
    frame = buffer.pop_frame()
    assert frame is not None and frame.item is None
    assert buffer.current_item is None
    assert buffer.played_ms("a") == 10


def test_item_table_is_bounded() -> None:
    buffer = PlayoutBuffer()
    items = [f"item-{i}" for i in range(MAX_TRACKED_ITEMS * 4)]
    for item in items:
        buffer.push(bytes(CANONICAL_FRAME_BYTES), item)
        assert buffer.pop_frame() is not None
    assert buffer.played_ms(items[0]) == 0  # forgotten
    assert buffer.played_ms(items[-MAX_TRACKED_ITEMS]) == 20  # still known
    assert buffer.played_ms(items[-MAX_TRACKED_ITEMS - 1]) == 0
    assert len(buffer._played) == MAX_TRACKED_ITEMS


def test_recently_played_item_is_kept_over_newer_silent_ones() -> None:
    buffer = PlayoutBuffer()
    buffer.push(bytes(2 * 10), "long")
    buffer.pop_frame(pad=True)
    for i in range(MAX_TRACKED_ITEMS - 1):
        buffer.push(bytes(2 * 10), f"short-{i}")
        buffer.pop_frame(pad=True)
    buffer.push(bytes(2 * 240), "long")  # "long" plays again: most recent now
    buffer.pop_frame(pad=True)
    buffer.push(bytes(2 * 10), "newcomer")
    buffer.pop_frame(pad=True)
    assert buffer.played_ms("long") == 10  # 250 samples
    assert buffer.played_ms("short-0") == 0  # the least recently played went


def test_many_small_segments_pop_in_order() -> None:
    buffer = PlayoutBuffer()
    for i in range(4800):
        buffer.push(_ramp(i, 1), str(i % 3))
    frames = []
    while (frame := buffer.pop_frame()) is not None:
        frames.append(frame)
    assert len(frames) == 10
    assert b"".join(f.pcm for f in frames) == _ramp(0, 4800)
    assert frames[-1].item == str(4799 % 3)


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError):
        PlayoutBuffer(max_ms=10)  # less than one 20 ms frame
    with pytest.raises(ValueError):
        PlayoutBuffer(sample_rate=0)
