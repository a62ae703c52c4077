"""PlayedLedger: what the caller has heard, from frames sent and mark echoes; requeue on pause."""

from __future__ import annotations

from rutster.media.pacer import Pacer
from rutster.media.played_ledger import PlayedLedger
from rutster.media.playout import PlayoutBuffer, PlayoutFrame

FRAME = 480


def frame(item: str | None, value: int = 1, samples: int = FRAME) -> PlayoutFrame:
    pcm = value.to_bytes(2, "little", signed=True) * samples + b"\x00\x00" * (FRAME - samples)
    return PlayoutFrame(pcm, item, samples)


def test_frames_play_back_to_back_from_when_they_arrive() -> None:
    ledger = PlayedLedger()
    for _ in range(3):  # sent together at t=0 (60 ms lead): play 0-20, 20-40, 40-60
        ledger.sent(frame("a"), 0.0)
    assert ledger.played_ms("a", 0.0) == 0
    assert ledger.played_ms("a", 30.0) == 30
    assert ledger.played_ms("a", 100.0) == 60
    assert [len(ledger.unplayed(30.0))] == [2]  # the playing frame counts as unplayed
    assert not ledger.idle(59.0) and ledger.idle(60.0)


def test_a_gap_restarts_the_timeline_at_the_next_send() -> None:
    ledger = PlayedLedger()
    ledger.sent(frame("a"), 0.0)
    ledger.sent(frame("b"), 100.0)  # provider ran dry 20..100
    assert ledger.played_ms("b", 110.0) == 10
    assert ledger.played_ms("a", 110.0) == 20


def test_a_late_mark_shifts_what_was_heard() -> None:
    ledger = PlayedLedger()
    for _ in range(5):
        ledger.sent(frame("a"), 0.0)
    # The mark after frame 1 (index 1, predicted to finish at 40 ms) came back at 70 ms:
    # the provider runs 30 ms behind our prediction.
    ledger.mark_played(1, 70.0)
    assert ledger.played_ms("a", 70.0) == 40
    assert ledger.played_ms("a", 90.0) == 60
    ledger.mark_played(2, 50.0)  # earlier than predicted now: impossible, ignored
    assert ledger.played_ms("a", 90.0) == 60
    assert ledger.marks_applied == 1


def test_items_are_counted_separately() -> None:
    ledger = PlayedLedger()
    ledger.sent(frame("a"), 0.0)
    ledger.sent(frame("a", samples=240), 0.0)  # a's last 10 ms
    ledger.sent(frame("b"), 0.0)
    assert ledger.played_ms("a", 100.0) == 30
    assert ledger.played_ms("b", 100.0) == 20
    assert ledger.played_ms("b", 50.0) == 10
    assert ledger.played_ms("nope", 100.0) == 0


def test_provider_clear_returns_the_unheard_frames_and_forgets_them() -> None:
    ledger = PlayedLedger()
    frames = [frame("a", value=n) for n in range(4)]
    for f in frames:
        ledger.sent(f, 0.0)
    dropped = ledger.provider_cleared(30.0)
    assert dropped == frames[1:]  # frame 1 was half played: it is replayed
    assert ledger.idle(30.0)
    assert ledger.played_ms("a", 1000.0) == 20
    ledger.sent(frame("a"), 30.0)
    assert ledger.played_ms("a", 40.0) == 30


def test_requeue_puts_frames_back_in_order_before_buffered_audio() -> None:
    buffer = PlayoutBuffer(max_ms=1000)
    buffer.push(b"\x01\x00" * (FRAME * 3), "a")
    popped = [buffer.pop_frame() for _ in range(2)]
    assert buffer.played_ms("a") == 40
    assert all(p is not None for p in popped)
    requeued = buffer.requeue([p for p in popped if p is not None])
    assert requeued == 2 * FRAME
    assert buffer.played_ms("a") == 0
    assert buffer.buffered_samples == 3 * FRAME


def test_requeue_after_a_partial_read_keeps_sample_order() -> None:
    buffer = PlayoutBuffer(max_ms=1000)
    pcm = b"".join(n.to_bytes(2, "little") for n in range(FRAME * 2 + 100))
    buffer.push(pcm, "a")
    first = buffer.pop_frame()
    assert first is not None
    buffer.requeue([first])
    out = b""
    while (f := buffer.pop_frame(pad=True)) is not None:
        out += f.pcm[: f.audio_samples * 2]
    assert out == pcm


def test_requeue_into_a_full_buffer_drops_the_oldest_requeued_audio() -> None:
    buffer = PlayoutBuffer(max_ms=40)  # two frames
    buffer.push(b"\x01\x00" * FRAME * 2, "a")
    one = buffer.pop_frame()
    buffer.push(b"\x02\x00" * FRAME, "a")
    assert one is not None
    assert buffer.requeue([one]) == 0
    assert buffer.dropped_samples == FRAME


def test_pacer_halt_keeps_the_buffer_and_restarts_the_provider_queue() -> None:
    buffer = PlayoutBuffer()
    pacer = Pacer(buffer, lead_ms=60, start_ms=40)
    buffer.push(b"\x00\x00" * FRAME * 10, "a")
    assert len(pacer.poll(0.0)) == 3
    pacer.halt(10.0)
    assert buffer.buffered_samples == 7 * FRAME
    assert pacer.lead_ms_now(10.0) == 0  # the provider's queue was cleared
    # 140 ms buffered meets the start allowance at once: a full lead goes out again.
    assert len(pacer.poll(10.0)) == 3
    assert pacer.underruns == 0
