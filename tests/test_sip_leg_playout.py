"""LegPlayout: the per-leg playout queue of the SIP worker (sans-I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rutster.trunk.sip.leg_playout import DEFAULT_FRAME_BYTES, MAX_PENDING_MARKS, LegPlayout

FRAME = DEFAULT_FRAME_BYTES


def test_pull_on_empty_is_one_silent_frame() -> None:
    playout = LegPlayout()
    assert playout.pull() == (bytes(FRAME), ())


def test_short_audio_is_silence_padded_and_order_kept() -> None:
    playout = LegPlayout()
    assert playout.push(b"\x01\x02" * 100) == 0
    assert playout.push(b"\x03\x04" * 300) == 0
    first, _ = playout.pull()
    assert first == b"\x01\x02" * 100 + b"\x03\x04" * 220
    second, _ = playout.pull()
    assert second == b"\x03\x04" * 80 + bytes(FRAME - 160)
    assert playout.queued_bytes == 0


def test_mark_reported_by_the_pull_that_takes_its_last_byte() -> None:
    playout = LegPlayout()
    playout.push(bytes(FRAME + 2))
    playout.mark("a")
    assert playout.pull()[1] == ()
    assert playout.pull()[1] == ("a",)
    assert playout.pull()[1] == ()


def test_mark_on_empty_queue_reported_by_next_pull() -> None:
    playout = LegPlayout()
    playout.mark("now")
    playout.mark("also")
    assert playout.pull() == (bytes(FRAME), ("now", "also"))


def test_mark_exactly_on_frame_boundary() -> None:
    playout = LegPlayout()
    playout.push(bytes(FRAME))
    playout.mark("edge")
    assert playout.pull()[1] == ("edge",)


def test_clear_drops_audio_and_marks() -> None:
    playout = LegPlayout()
    playout.push(b"\x7f\x7f" * 1000)
    playout.mark("gone")
    playout.clear()
    assert playout.queued_bytes == 0 and playout.pending_marks == 0
    assert playout.pull() == (bytes(FRAME), ())
    playout.push(b"\x01\x00" * 10)
    playout.mark("new")
    frame, marks = playout.pull()
    assert frame.startswith(b"\x01\x00" * 10) and marks == ("new",)


def test_bound_drops_excess_and_counts_it() -> None:
    playout = LegPlayout(max_ms=100)  # 5 frames
    assert playout.max_bytes == 5 * FRAME
    assert playout.push(bytes(4 * FRAME)) == 0
    assert playout.push(bytes(2 * FRAME)) == FRAME
    assert playout.queued_bytes == 5 * FRAME
    assert playout.push(b"\x00\x00") == 2
    assert playout.dropped_bytes == FRAME + 2


def test_odd_byte_is_dropped_so_samples_stay_aligned() -> None:
    playout = LegPlayout()
    assert playout.push(b"\x01\x02\x03") == 1
    assert playout.queued_bytes == 2


def test_mark_flood_is_capped() -> None:
    playout = LegPlayout()
    for n in range(MAX_PENDING_MARKS + 5):
        playout.mark(str(n))
    assert playout.pending_marks == MAX_PENDING_MARKS
    assert playout.dropped_marks == 5


@pytest.mark.parametrize(("frame_bytes", "max_ms"), [(0, 1000), (641, 1000), (640, 10)])
def test_bad_construction_is_refused(frame_bytes: int, max_ms: int) -> None:
    with pytest.raises(ValueError):
        LegPlayout(frame_bytes=frame_bytes, max_ms=max_ms)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.binary(max_size=3000)),
        st.tuples(st.just("mark"), st.text(max_size=3)),
        st.tuples(st.just("pull"), st.none()),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=60,
)


@given(_ops)
def test_model_bytes_conserved_and_marks_in_order(ops: list[tuple[str, object]]) -> None:
    """Against a plain bytes model: exact frames, conservation, mark order and timing."""
    playout = LegPlayout(max_ms=200)
    model = b""
    marks: list[tuple[int, str]] = []  # (byte position in the model stream, name)
    position = 0  # bytes pulled from the model since the last clear offset
    pushed = dropped = 0
    reported: list[str] = []
    expected_reported: list[str] = []
    for op, arg in ops:
        if op == "push":
            assert isinstance(arg, bytes)
            got = playout.push(arg)
            keep = min(len(arg), playout.max_bytes - len(model))
            keep -= keep % 2
            assert got == len(arg) - keep
            model += arg[:keep]
            pushed += len(arg)
            dropped += got
        elif op == "mark":
            assert isinstance(arg, str)
            playout.mark(arg)
            marks.append((position + len(model), arg))
        elif op == "clear":
            playout.clear()
            position += len(model)
            model = b""
            marks.clear()
        else:
            frame, names = playout.pull()
            take = model[:FRAME]
            assert frame == take + bytes(FRAME - len(take))
            model = model[len(take) :]
            position += len(take)
            due = [name for pos, name in marks if pos <= position]
            marks = [(pos, name) for pos, name in marks if pos > position]
            assert list(names) == due
            reported.extend(names)
            expected_reported.extend(due)
        assert playout.queued_bytes == len(model)
    assert playout.dropped_bytes == dropped
    assert reported == expected_reported
