"""Pacer: real-time release with a bounded lead, on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from rutster.media.formats import CANONICAL_FRAME_BYTES, CANONICAL_FRAME_SAMPLES, FRAME_MS
from rutster.media.pacer import (
    BRIDGE_FRAMES,
    BRIDGE_LEAD_MS,
    DEFAULT_LEAD_MS,
    DEFAULT_START_MS,
    LATE_POLL_MIN_MS,
    PAD_LEAD_MS,
    Pacer,
    PacerState,
)
from rutster.media.playout import PlayoutBuffer, PlayoutFrame

FRAME = bytes(CANONICAL_FRAME_BYTES)


def _audio(ms: float) -> bytes:
    return bytes(2 * int(ms * 24))


def _voice(ms: float) -> bytes:
    """Loud audio (a square wave at about -20 dBFS): never shed."""
    return (b"\xb8\x0b\x48\xf4" * int(ms * 12))[: 2 * int(ms * 24)]


#: The start allowance these scenarios' timings are written for (the default until
#: 2026-12-05); the default itself is held by test_default_start_allowance.
SCENARIO_START_MS = 40.0


@dataclass
class Call:
    """Drives a pacer the way the glue does: poll on new audio and at next_poll_ms().

    Without bridge frames unless asked (``bridge_frames``): most tests here hold
    the rules for a queue that runs dry; the bridge has its own tests at the end.
    """

    buffer: PlayoutBuffer = field(default_factory=PlayoutBuffer)
    lead_ms: float = DEFAULT_LEAD_MS
    start_ms: float = SCENARIO_START_MS
    bridge_frames: int = 0
    now: float = 0.0
    sent: list[tuple[float, PlayoutFrame]] = field(default_factory=list)
    max_lead_seen: float = 0.0

    def __post_init__(self) -> None:
        self.pacer = Pacer(
            self.buffer,
            lead_ms=self.lead_ms,
            start_ms=self.start_ms,
            bridge_frames=self.bridge_frames,
        )

    def state(self) -> PacerState:
        # A call, not the property: keeps mypy from narrowing it across polls.
        return self.pacer.state

    def poll(self, now: float) -> list[PlayoutFrame]:
        assert now >= self.now
        self.now = now
        frames = self.pacer.poll(now)
        self.sent.extend((now, frame) for frame in frames)
        lead = self.pacer.lead_ms_now(now)
        self.max_lead_seen = max(self.max_lead_seen, lead)
        assert lead <= max(self.lead_ms, FRAME_MS) + 1e-6
        return frames

    def push(self, now: float, pcm: bytes, item: str | None) -> list[PlayoutFrame]:
        self.buffer.push(pcm, item)
        return self.poll(now)

    def run_until(
        self, end: float, arrivals: Sequence[tuple[float, bytes, str | None]] = ()
    ) -> None:
        pending = sorted(arrivals, key=lambda a: a[0])
        for _ in range(100_000):
            wake = self.pacer.next_poll_ms(self.now)
            if wake is not None:
                assert wake >= self.now
            candidates = [t for t in (wake, pending[0][0] if pending else None) if t is not None]
            if not candidates or min(candidates) > end:
                self.now = end
                return
            t = min(candidates)
            if pending and pending[0][0] == t:
                _, pcm, item = pending.pop(0)
                self.push(t, pcm, item)
            else:
                before = (self.pacer.state, self.pacer.frames_sent, self.pacer.bridges)
                self.poll(t)
                # A poll at the requested time must make progress (no busy loop).
                assert (self.pacer.state, self.pacer.frames_sent, self.pacer.bridges) != before
        raise AssertionError("pacer did not settle")

    def frames_by(self, t: float) -> int:
        return sum(1 for when, _ in self.sent if when <= t)


def test_defaults() -> None:
    pacer = Pacer(PlayoutBuffer())
    assert DEFAULT_LEAD_MS <= 60
    assert pacer.state is PacerState.IDLE
    assert pacer.next_poll_ms(5.0) is None
    assert pacer.poll(5.0) == []
    assert pacer.lead_ms_now(5.0) == 0
    assert (pacer.frames_sent, pacer.underruns, pacer.underrun_ms) == (0, 0, 0.0)


def test_steady_arrival_never_leads_more_than_lead_ms() -> None:
    call = Call()
    arrivals = [(1000.0 + 20.0 * i, FRAME, "a") for i in range(200)]
    call.run_until(6000.0, arrivals)
    assert call.pacer.frames_sent == 200
    assert call.max_lead_seen <= DEFAULT_LEAD_MS
    # Real time: the n-th frame never leaves before its slot minus the lead.
    first = call.sent[0][0]
    for n, (when, _) in enumerate(call.sent):
        assert first + n * FRAME_MS - DEFAULT_LEAD_MS <= when
    assert call.state() is PacerState.STARVED
    assert call.pacer.underruns == 0


def test_jittery_arrival_is_smoothed() -> None:
    call = Call()
    # Frames arrive in pairs every 40 ms (same average rate, 20 ms of jitter).
    arrivals = [(40.0 * (i // 2), FRAME, "a") for i in range(100)]
    call.run_until(3000.0, arrivals)
    assert call.pacer.frames_sent == 100
    assert call.pacer.underruns == 0


def test_burst_comes_out_at_real_time() -> None:
    call = Call()
    call.push(0.0, _audio(2000), "a")
    assert call.state() is PacerState.PLAYING  # 2 s >= start threshold
    assert len(call.sent) == 3  # the lead: 60 ms
    call.run_until(2000.0)
    for t in range(0, 2001, 5):
        # At most lead_ms ahead of real time at every instant.
        assert call.frames_by(t) * FRAME_MS <= t + DEFAULT_LEAD_MS
    assert call.frames_by(1940.0) == 100
    assert call.frames_by(1919.0) == 98
    assert call.max_lead_seen == DEFAULT_LEAD_MS
    assert call.buffer.buffered_samples == 0


def test_default_start_allowance() -> None:
    # A pacer built without a start allowance waits DEFAULT_START_MS for the first frame.
    buffer = PlayoutBuffer()
    pacer = Pacer(buffer)
    buffer.push(FRAME, "a")
    assert pacer.poll(0.0) == []
    assert pacer.next_poll_ms(0.0) == DEFAULT_START_MS
    assert len(pacer.poll(DEFAULT_START_MS)) == 1


def test_start_threshold_by_amount_or_time() -> None:
    call = Call()
    assert call.push(0.0, FRAME, "a") == []  # 20 ms < 40 ms
    assert call.state() is PacerState.PRIMING
    assert call.pacer.next_poll_ms(0.0) == SCENARIO_START_MS
    assert call.poll(39.0) == []
    assert len(call.poll(40.0)) == 1  # waited long enough
    assert call.state() is PacerState.PLAYING

    call = Call()
    assert call.push(0.0, FRAME, "a") == []
    assert len(call.push(10.0, FRAME, "a")) == 2  # 40 ms buffered
    assert call.pacer.next_poll_ms(10.0) == 50.0  # empty: the starvation check


def test_padded_tail() -> None:
    call = Call()
    call.push(0.0, _audio(500 / 24), "a")  # 500 samples: one frame and 20 samples
    call.run_until(40.0)
    assert [f.audio_samples for _, f in call.sent] == [480]
    # 20 samples left; the provider has 20 ms queued: wait for more audio...
    assert call.pacer.next_poll_ms(40.0) == 60.0 - PAD_LEAD_MS
    call.run_until(59.0 - PAD_LEAD_MS)
    assert len(call.sent) == 1
    # ...until the queue holds only the pad lead, then send the tail padded.
    call.run_until(60.0 - PAD_LEAD_MS)
    tail = call.sent[-1][1]
    assert tail.audio_samples == 20
    assert len(tail.pcm) == CANONICAL_FRAME_BYTES
    assert call.state() is PacerState.PLAYING
    call.run_until(200.0)
    assert call.state() is PacerState.STARVED
    assert call.pacer.next_poll_ms(200.0) is None


def test_a_late_wake_still_sends_the_padded_tail_before_the_queue_runs_dry() -> None:
    # The driver's timer may fire a millisecond or two late (uvloop counts whole ms):
    # the tail must still reach the provider while its queue holds audio.
    buffer = PlayoutBuffer()
    pacer = Pacer(buffer, start_ms=SCENARIO_START_MS)
    buffer.push(_audio(500 / 24), "a")  # one frame and 20 samples
    assert pacer.poll(0.0) == []  # priming: less than the start allowance
    assert [f.audio_samples for f in pacer.poll(SCENARIO_START_MS)] == [480]
    deadline = pacer.next_poll_ms(SCENARIO_START_MS)
    assert deadline is not None
    late = deadline + PAD_LEAD_MS / 2
    queue_end = pacer.queued_until_ms
    assert [f.audio_samples for f in pacer.poll(late)] == [20]
    assert late < queue_end  # the provider never ran dry: no hole before the tail
    assert pacer.underruns == 0


def test_partial_frame_is_completed_when_audio_arrives_in_time() -> None:
    call = Call()
    call.push(0.0, _audio(40) + bytes(2 * 100), "a")
    call.run_until(25.0, [(25.0, bytes(2 * 380), "a")])
    assert all(f.audio_samples == CANONICAL_FRAME_SAMPLES for _, f in call.sent)
    assert call.pacer.frames_sent == 3


def test_underrun_counted_for_a_mid_item_gap() -> None:
    call = Call()
    call.push(0.0, _voice(100), "a")
    call.run_until(120.0)
    assert call.state() is PacerState.STARVED  # provider ran dry at 100 ms
    call.push(150.0, _voice(100), "a")
    assert call.pacer.underruns == 1
    assert call.pacer.underrun_ms == 50.0
    assert call.state() is PacerState.PLAYING  # 100 ms >= start threshold
    call.run_until(400.0)
    assert call.pacer.frames_sent == 10  # loud audio is never shed
    assert call.pacer.delay_debt_ms == 50.0  # the rest of "a" plays 50 ms late: owed


def test_a_late_burst_is_won_back_in_its_next_pause() -> None:
    call = Call()
    call.push(0.0, _voice(100), "a")
    call.run_until(120.0)
    # 50 ms late, then the backlog at once: voice, a 60 ms pause, voice.
    call.push(150.0, _voice(20) + _audio(60) + _voice(100), "a")
    call.run_until(600.0)
    assert call.pacer.shed_ms == 50.0  # two whole silent frames and 10 ms of a third
    assert call.pacer.delay_debt_ms == 0.0
    voice = b"".join(f.pcm[: 2 * f.audio_samples] for _, f in call.sent[5:])
    assert voice == _voice(20) + _audio(10) + _voice(100)  # every voice sample was sent


def test_a_late_poll_with_audio_waiting_is_owed_and_won_back() -> None:
    """This loop itself was late (a stall): the provider ran dry with audio here."""
    call = Call()
    call.push(0.0, _voice(60) + _audio(100) + _voice(100), "a")
    call.run_until(20.0)
    assert call.pacer.queued_until_ms == 80.0  # four frames out, the lead is full
    call.poll(150.0)  # descheduled from 20 to 150 ms: the caller heard 70 ms of silence
    assert call.pacer.underruns == 1
    assert call.pacer.underrun_ms == 70.0
    call.run_until(600.0)
    assert call.pacer.shed_ms == 70.0  # three silent frames and 10 ms cut from a fourth
    assert call.pacer.delay_debt_ms == 0.0
    voice = b"".join(f.pcm[: 2 * f.audio_samples] for _, f in call.sent)
    assert voice == _voice(60) + _audio(30) + _voice(100)  # every voice sample was sent


def test_loud_audio_is_never_shed() -> None:
    call = Call()
    call.push(0.0, _voice(100), "a")
    call.run_until(120.0)
    call.push(150.0, _voice(400), "a")
    call.run_until(800.0)
    assert call.pacer.shed_ms == 0.0
    assert call.pacer.delay_debt_ms == 50.0  # owed until a pause comes


def test_nothing_is_shed_when_the_delay_is_not_held_here() -> None:
    """A brain that is simply later now: its audio comes in real time, nothing waits."""
    call = Call()
    call.push(0.0, _voice(100), "a")
    call.run_until(120.0)
    arrivals = [(150.0 + 20 * k, _audio(20), "a") for k in range(20)]
    call.run_until(600.0, arrivals)
    # Only the start allowance (150 -> 170 ms) held audio here; that is won back ...
    assert call.pacer.shed_ms == 20.0
    # ... and the 50 ms the brain itself is late stays owed, never shed into a gap.
    assert call.pacer.delay_debt_ms == 50.0
    assert call.pacer.underruns == 1


def test_debt_belongs_to_its_item_and_a_clear_forgets_it() -> None:
    call = Call()
    call.push(0.0, _voice(100), "a")
    call.run_until(120.0)
    call.push(150.0, _audio(200), "b")  # a new item after a gap: nothing owed, nothing shed
    call.run_until(500.0)
    assert call.pacer.shed_ms == 0.0
    call.push(500.0, _voice(100), "c")
    call.run_until(700.0)
    call.push(750.0, _voice(60), "c")  # late: owed ...
    assert call.pacer.delay_debt_ms == 150.0
    call.pacer.clear(760.0)  # ... until a barge-in cuts the item
    assert call.pacer.delay_debt_ms == 0.0
    call.push(800.0, _audio(200), "c")
    call.run_until(1100.0)
    assert call.pacer.shed_ms == 0.0


@pytest.mark.parametrize(("first", "second"), [("a", "b"), (None, None), ("a", None)])
def test_no_underrun_between_items_or_without_items(first: str | None, second: str | None) -> None:
    call = Call()
    call.push(0.0, _audio(100), first)
    call.run_until(120.0)
    assert call.state() is PacerState.STARVED
    call.push(150.0, _audio(100), second)
    assert call.pacer.underruns == 0
    assert call.pacer.underrun_ms == 0.0


def test_clear_is_a_barge_in() -> None:
    call = Call()
    call.push(0.0, _audio(1000), "a")
    call.run_until(100.0)
    sent_before = call.pacer.frames_sent
    assert call.pacer.lead_ms_now(100.0) == 60.0
    assert call.pacer.clear(100.0) == 1000 - sent_before * FRAME_MS
    assert call.state() is PacerState.IDLE
    assert call.pacer.lead_ms_now(100.0) == 0
    assert call.pacer.next_poll_ms(100.0) is None
    assert call.buffer.played_ms("a") == sent_before * FRAME_MS
    # The same item resuming after a clear is not an underrun.
    call.push(300.0, _audio(100), "a")
    assert call.pacer.underruns == 0
    assert call.state() is PacerState.PLAYING


def test_next_poll_is_never_in_the_past() -> None:
    call = Call()
    call.push(0.0, _audio(20), "a")
    assert call.pacer.next_poll_ms(500.0) == 500.0
    call.buffer.clear()  # emptied behind the pacer's back while priming
    assert call.pacer.poll(600.0) == []
    assert call.state() is PacerState.IDLE


def test_unrounded_clock_readings_make_progress() -> None:
    # Real clocks give arbitrary floats; a poll at next_poll_ms() must still send.
    call = Call()
    call.now = 1234.567891
    call.push(call.now, _audio(1000), "a")
    call.run_until(call.now + 1000.0)
    assert call.pacer.frames_sent == 50


def test_frame_size_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError):
        Pacer(PlayoutBuffer(frame_samples=160))
    with pytest.raises(ValueError):
        Pacer(PlayoutBuffer(), lead_ms=-1)


# ---- bridge frames ---------------------------------------------------------------


def test_audio_a_little_late_is_bridged_not_starved() -> None:
    # An echo stream, one frame every 20 ms; one frame comes 30 ms late. The queue
    # is about to run dry: frames of silence keep it going, the late frame joins
    # behind them, nothing ran dry (no underrun, no new start allowance).
    call = Call(bridge_frames=BRIDGE_FRAMES)
    times = [20.0 * i for i in range(10)] + [200.0 + 30.0 + 20.0 * i for i in range(40)]
    arrivals = [(t, _voice(20), "a") for t in times]
    call.run_until(1020.0, arrivals)  # the stream's last frame arrives at 1010 ms
    assert call.pacer.bridges == BRIDGE_FRAMES
    assert call.pacer.underruns == 0
    bridge = [frame for _, frame in call.sent if frame.audio_samples == 0]
    assert [(f.item, f.pcm) for f in bridge] == [("a", FRAME)] * BRIDGE_FRAMES
    assert call.pacer.frames_sent == 50  # every frame of audio, the bridges apart
    assert call.pacer.delay_debt_ms == 20.0 * BRIDGE_FRAMES  # owed (voice: never shed)
    assert call.max_lead_seen <= DEFAULT_LEAD_MS


def test_a_bridge_is_won_back_in_the_next_pause() -> None:
    call = Call(bridge_frames=BRIDGE_FRAMES)
    arrivals = [(20.0 * i, _voice(20), "a") for i in range(10)]
    arrivals += [(230.0 + 20.0 * i, _voice(20), "a") for i in range(10)]
    # A pause, and the brain's audio arrives in a burst (as a reply's does).
    arrivals += [(440.0, _audio(100), "a"), (440.0, _voice(200), "a")]
    call.run_until(700.0, arrivals)  # before the end of the item (bridged too)
    assert call.pacer.bridges == BRIDGE_FRAMES
    assert call.pacer.shed_ms == 20.0 * BRIDGE_FRAMES
    assert call.pacer.delay_debt_ms == 0.0


def test_bridges_stop_after_their_limit_then_the_queue_runs_dry() -> None:
    call = Call(bridge_frames=BRIDGE_FRAMES)
    call.push(0.0, _voice(100), "a")
    call.run_until(300.0)
    assert call.pacer.bridges == BRIDGE_FRAMES
    assert call.state() is PacerState.STARVED
    # The last frame of audio ends at 100 ms (three left at once, then one every 20
    # ms); the bridges left BRIDGE_LEAD_MS before.
    sent_at = [when for when, frame in call.sent if frame.audio_samples == 0]
    assert sent_at == [pytest.approx(100.0 - BRIDGE_LEAD_MS)] * BRIDGE_FRAMES
    call.push(400.0, _voice(40), "a")  # the same item, late beyond the bridges
    assert call.pacer.underruns == 1


def test_untagged_audio_is_never_bridged() -> None:
    call = Call(bridge_frames=BRIDGE_FRAMES)
    call.push(0.0, _voice(100), None)
    call.run_until(300.0)
    assert call.pacer.bridges == 0


def test_bridges_keep_within_the_lead() -> None:
    call = Call(bridge_frames=BRIDGE_FRAMES, lead_ms=30.0)
    call.push(0.0, _voice(100), "a")
    call.run_until(300.0)
    assert call.pacer.bridges == 1  # room for one frame only
    short = Call(bridge_frames=BRIDGE_FRAMES, lead_ms=20.0)
    short.push(0.0, _voice(100), "a")
    short.run_until(300.0)
    assert short.pacer.bridges == 0  # no room at all


def test_a_clear_ends_bridging() -> None:
    call = Call(bridge_frames=BRIDGE_FRAMES)
    call.push(0.0, _voice(100), "a")
    call.run_until(60.0)
    call.pacer.halt(60.0)
    call.run_until(300.0)
    assert call.pacer.bridges == 0


def test_a_late_poll_that_bridges_owes_the_dry_queue_too() -> None:
    """This loop was descheduled with nothing buffered (the brain's audio waited on
    the same stall): the provider ran dry before the bridge left. Both silences are
    owed and won back; before, only the bridge's was, and the dry part stayed as a
    latency step for the rest of the call (seen on a loaded 2-core VM: +51/+65 ms)."""
    call = Call(bridge_frames=BRIDGE_FRAMES)
    call.run_until(190.0, [(20.0 * i, _voice(20), "a") for i in range(10)])
    dry_from = call.pacer.queued_until_ms
    stalled_to = dry_from + 65.0
    call.poll(stalled_to)  # late, nothing buffered: the bridge leaves now
    assert call.pacer.bridges == BRIDGE_FRAMES
    # The brain's audio held up by the same stall arrives at once: a pause, then voice.
    call.run_until(900.0, [(stalled_to + 5.0, _audio(200) + _voice(100), "a")])
    assert call.pacer.underruns == 1
    assert call.pacer.underrun_ms == pytest.approx(65.0)
    assert call.pacer.shed_ms == pytest.approx(65.0 + 20.0 * BRIDGE_FRAMES)
    assert call.pacer.delay_debt_ms == 0.0
    voice = b"".join(f.pcm[: 2 * f.audio_samples] for _, f in call.sent)
    assert voice.endswith(_voice(100))  # every voice sample was sent


@pytest.mark.parametrize("late_ms", [1.0, 3.0, LATE_POLL_MIN_MS])
def test_short_holes_are_owed_though_not_counted_as_underruns(late_ms: float) -> None:
    """A loaded loop leaves many holes of a few ms (measured at 50 echo calls on one
    core: ~20 a call of 1-5 ms). Each is silence the caller heard inside the item, so
    each is owed; unowed, they added up to a lasting step (+40-70 ms a call). Under
    LATE_POLL_MIN_MS they are not counted as underruns (timer grain, not a stall)."""
    call = Call()
    call.push(0.0, _voice(60) + _audio(100) + _voice(100), "a")
    call.run_until(20.0)
    call.poll(call.pacer.queued_until_ms + late_ms)  # the queue ran dry late_ms ago
    assert call.pacer.underruns == 0
    call.run_until(600.0)
    assert call.pacer.shed_ms == pytest.approx(late_ms)
    assert call.pacer.delay_debt_ms == pytest.approx(0.0)


def test_a_short_dry_spell_before_a_bridge_is_owed() -> None:
    """The same for a bridge sent a few ms after the queue ran dry."""
    call = Call(bridge_frames=BRIDGE_FRAMES)
    call.run_until(190.0, [(20.0 * i, _voice(20), "a") for i in range(10)])
    late = call.pacer.queued_until_ms + 3.0
    call.poll(late)
    assert call.pacer.bridges == BRIDGE_FRAMES
    call.run_until(900.0, [(late + 5.0, _audio(200) + _voice(100), "a")])
    assert call.pacer.underruns == 0
    assert call.pacer.shed_ms == pytest.approx(3.0 + 20.0 * BRIDGE_FRAMES)
    assert call.pacer.delay_debt_ms == pytest.approx(0.0)
