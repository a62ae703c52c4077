"""When canonical frames leave for the caller: real time with a bounded lead.

The pacer models the provider's playback queue: ``queued_until`` is the time
at which the provider will have played everything sent so far. A frame may be
sent while that keeps the queue at most ``lead_ms`` ahead of now, so the
caller hears the assistant at real time and a barge-in has at most ``lead_ms``
of audio already out of the core's hands. Time is always passed in (ms, any
monotonic origin); the pacer reads no clock.

**Late audio is bridged.** When the provider's queue is about to run dry and
nothing is buffered, the pacer sends :data:`BRIDGE_FRAMES` whole frames of
silence (tagged with the item playing), once until audio comes again, so that
audio a little late joins the queue behind them instead of finding it dry: the
caller hears whole frames of silence, which the pacer wins back whole in the
item's next pause, where a queue run dry leaves a fraction of a frame and a new
start allowance on top.

**Delay is won back.** Whenever the caller heard silence inside an item that
the brain did not put there (the provider's queue ran dry because audio came
late, the priming wait after it, the padding of a partial frame, a bridge, the
queue run dry before a bridge this loop sent late; however short), everything
after it plays that much later. The pacer counts that silence as *delay debt*
for the item and pays it back by shedding whole frames of the same item that
are silent (a pause in speech), so a stall costs one short gap instead of a
latency step for the rest of the call. Shed frames are reported in
:attr:`Pacer.last_shed` (not sent) so the played-ms ledger still advances over
them.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from rutster.media.formats import FRAME_MS
from rutster.media.playout import PlayoutBuffer, PlayoutFrame

__all__ = [
    "BRIDGE_FRAMES",
    "BRIDGE_LEAD_MS",
    "DEFAULT_LEAD_MS",
    "DEFAULT_START_MS",
    "MAX_DELAY_DEBT_MS",
    "PAD_LEAD_MS",
    "SHED_SILENCE_RMS",
    "Pacer",
    "PacerState",
]

#: Most audio queued at the provider ahead of real time (seed decision; the issue
#: sets the default at <= 60 ms): three frames absorb socket and event-loop
#: jitter while bounding what the caller still hears after a barge-in.
DEFAULT_LEAD_MS = 60.0
#: Jitter allowance before playout starts: wait for this much audio, or this long,
#: so a brain's first chunks arriving unevenly do not starve the first frames. Audio
#: that arrives at exactly real time (the echo brain, a caller's own voice relayed)
#: keeps this less one frame queued at the provider for the whole call, so it is
#: also the cushion against the path's jitter. Measured (three echo calls at once,
#: 8 s, two bursty CPU loads on the 2-core dev VM, 24 calls per arm, 2026-12-05):
#: at 40 ms the queue held 3-23 ms at p1 when a frame arrived and 7 of 24 calls
#: had a bridge or gap spoil a window; at 60 ms 21-34 ms and none, for a round
#: trip of 47-54 ms instead of 27-48 ms. Was 40 ms (seed decision).
DEFAULT_START_MS = 60.0
#: Float slack in time comparisons (ms) so that a poll at exactly the time
#: next_poll_ms() returned makes progress despite rounding of clock readings.
TIME_EPSILON_MS = 1e-6
#: A frame this quiet (RMS of s16 samples, -35 dBFS) may be shed to win back delay:
#: a pause in speech, where dropping 20 ms is not heard. Measured: the pauses of the
#: project's recorded fixture (a real phone-quality recording) sit at -47 to -40
#: dBFS (tests/fixtures/audio/caller_speech_8k.wav); -35 dBFS let the e2e echo calls shed
#: a 40 ms step within about a second (-40 dBFS: often not within 2 s). Seed decision.
SHED_SILENCE_RMS = 584.0
#: Most added delay remembered for shedding (seed decision): a brain seconds late
#: mid-reply is won back over its next pauses, and a bounded number keeps one
#: pathological stall from eating every pause of a long reply.
MAX_DELAY_DEBT_MS = 2000.0
#: Less than a frame owed is cut from a silent frame's head when at least this many
#: samples are owed (1 ms at 24 kHz): a 3 ms residue is a step a correlation sees.
MIN_PARTIAL_SHED_SAMPLES = 24
#: A frame may be shed with nothing buffered behind it if the provider's queue still
#: holds the lead less one frame, less this slack (ms): the frame had to wait for
#: room, so it was excess; after the shed the queue keeps two frames of cushion for
#: the next real-time frame. Seed decision (a quarter frame of clock jitter).
SHED_QUEUE_SLACK_MS = 5.0
#: A poll this late past the provider's queue end (ms) counts as an underrun (the
#: ``underruns`` and ``underrun_ms`` counters): a quarter frame, above the 1-2 ms an
#: event loop's timer may wake late (uvloop counts whole milliseconds). Seed decision.
#: Any lateness past the queue's end is owed, however short: measured at 50 echo
#: calls on one core (2026-12-07, docs/BENCHMARKS.md), ~20 holes a call of 1-5 ms,
#: left unowed, made a lasting step of +40-70 ms in each call's heard delay.
LATE_POLL_MIN_MS = 5.0
#: Silent frames sent at once to keep the provider's queue from running dry while the
#: brain's audio is late (40 ms): what the outbound resampler's drain used to add when
#: it released soxr's 25 ms tail with silence. Measured: it keeps the e2e echo calls'
#: delay flat through a brain's restart, where a queue left to run dry lost fractions
#: of a frame that stayed (tests/test_e2e_processes.py); one frame at a time left the
#: queue 10 ms from the next bridge at every real-time frame. Seed decision.
BRIDGE_FRAMES = 2
#: A bridge frame leaves when the provider's queue holds this little (ms) and nothing
#: is buffered: early enough to reach the provider before it runs dry, late enough
#: that a brain merely a little late (echo: one frame at a time) is rarely bridged.
#: The drain's lead, kept (seed decision).
BRIDGE_LEAD_MS = 10.0
#: A partial frame (the tail of an item, or audio left unaligned by a partial shed)
#: is padded and sent when the provider's queue holds this little (ms), not at the
#: moment it runs dry: the driver's timer may wake a millisecond or two late
#: (uvloop's timers count whole milliseconds, gateway/call.py MIN_PACER_WAIT_S), and
#: a frame sent at the dry moment then reached the provider after a 1-2 ms hole
#: (measured: the hostile campaign's honest calls, tests/test_hostile_campaign.py).
#: A bridge's lead, for the same reason; audio completing the frame later than this
#: starts the next frame.
PAD_LEAD_MS = BRIDGE_LEAD_MS


class PacerState(StrEnum):
    """Playout state of one call's outbound audio."""

    IDLE = "idle"  # nothing buffered, nothing playing
    PRIMING = "priming"  # audio buffered, waiting for the start threshold
    PLAYING = "playing"  # frames are leaving at real time
    STARVED = "starved"  # was playing; buffer empty and the provider queue ran dry


class Pacer:
    """Release frames from a :class:`PlayoutBuffer` at real time with a bounded lead.

    The glue calls :meth:`poll` whenever audio was pushed and at the time
    :meth:`next_poll_ms` returns, and sends the returned frames in order.
    """

    __slots__ = (
        "_arrived_at",
        "_bridge_frames",
        "_bridged",
        "_bridges",
        "_buffer",
        "_debt_item",
        "_debt_ms",
        "_dry_ms",
        "_frame_ms",
        "_frame_samples",
        "_frames_sent",
        "_last_item",
        "_lead_ms",
        "_max_lead_ms",
        "_pending_debt_item",
        "_pending_debt_ms",
        "_primed_at",
        "_queued_until",
        "_resume_item",
        "_shed_ms",
        "_silence_item",
        "_silence_ms",
        "_silent_frame",
        "_start_ms",
        "_starved_at",
        "_starved_item",
        "_state",
        "_underrun_ms",
        "_underruns",
        "_was_empty",
        "last_shed",
    )

    def __init__(
        self,
        buffer: PlayoutBuffer,
        *,
        lead_ms: float = DEFAULT_LEAD_MS,
        start_ms: float = DEFAULT_START_MS,
        frame_ms: int = FRAME_MS,
        bridge_frames: int = BRIDGE_FRAMES,
    ) -> None:
        if frame_ms <= 0 or lead_ms < 0 or start_ms < 0 or bridge_frames < 0:
            raise ValueError(
                "frame_ms must be positive; lead_ms, start_ms and bridge_frames not negative"
            )
        if buffer.frame_samples * 1000 != frame_ms * buffer.sample_rate:
            raise ValueError(
                f"frame_ms={frame_ms} does not match the buffer's frames of "
                f"{buffer.frame_samples} samples at {buffer.sample_rate} Hz"
            )
        self._buffer = buffer
        self._lead_ms = float(lead_ms)
        self._start_ms = float(start_ms)
        self._frame_ms = float(frame_ms)
        # A lead below one frame would never let a frame out.
        self._max_lead_ms = max(self._lead_ms, self._frame_ms)
        self._frame_samples = buffer.frame_samples
        self._state = PacerState.IDLE
        self._queued_until = float("-inf")
        self._primed_at = 0.0
        self._starved_at = 0.0
        self._starved_item: str | None = None
        self._frames_sent = 0
        # Item of the last frame sent (None: none since the last clear or halt).
        self._last_item: str | None = None
        self._underruns = 0
        self._underrun_ms = 0.0
        self._debt_ms = 0.0
        self._debt_item: str | None = None
        self._pending_debt_ms = 0.0
        self._pending_debt_item: str | None = None
        self._resume_item: str | None = None
        self._shed_ms = 0.0
        # Silence sent while the buffer was empty (a padded frame): it
        # delays the item only by as much as it was still playing when audio came back.
        self._silence_ms = 0.0
        self._silence_item: str | None = None
        # Of that silence, how much the caller heard as the provider's queue run dry
        # before a late bridge (an underrun once the item goes on).
        self._dry_ms = 0.0
        self._was_empty = True
        self._arrived_at = 0.0
        # Bridge frames sent at once; whether they were since the last frame of
        # audio; how many in all.
        self._bridge_frames = bridge_frames
        self._bridged = False
        self._bridges = 0
        self._silent_frame = bytes(buffer.frame_samples * 2)
        #: Frames the last :meth:`poll` shed (popped, not to be sent), oldest first.
        self.last_shed: list[PlayoutFrame] = []

    # ---- read-only state -----------------------------------------------------

    @property
    def state(self) -> PacerState:
        """Current playout state."""
        return self._state

    @property
    def frames_sent(self) -> int:
        """Frames of audio released by :meth:`poll` since creation (bridges apart)."""
        return self._frames_sent

    @property
    def underruns(self) -> int:
        """Times an item's audio ran dry mid-item and then resumed."""
        return self._underruns

    @property
    def underrun_ms(self) -> float:
        """Total silence, in ms, the caller heard inside items because audio came late."""
        return self._underrun_ms

    @property
    def bridges(self) -> int:
        """Silent frames sent to keep the provider's queue from running dry."""
        return self._bridges

    @property
    def delay_debt_ms(self) -> float:
        """Silence inserted into the current item and not yet won back (ms)."""
        return self._debt_ms

    @property
    def shed_ms(self) -> float:
        """Total ms of silent frames shed to win back delay since creation."""
        return self._shed_ms

    @property
    def queued_until_ms(self) -> float:
        """When the provider will have played everything sent so far (-inf: nothing yet)."""
        return self._queued_until

    def lead_ms_now(self, now_ms: float) -> float:
        """How far ahead of ``now_ms`` the provider's queue reaches (0 when dry)."""
        return max(0.0, self._queued_until - now_ms)

    # ---- operations ----------------------------------------------------------

    def poll(self, now_ms: float) -> list[PlayoutFrame]:
        """Advance to ``now_ms``; return the frames to send now, in order."""
        buffer = self._buffer
        state = self._state
        if self.last_shed:
            self.last_shed = []
        if self._was_empty and buffer.buffered_samples:
            self._audio_arrived(now_ms)
        if state is PacerState.IDLE or state is PacerState.STARVED:
            if not buffer.buffered_samples:
                return []
            if (
                state is PacerState.STARVED
                and self._starved_item is not None
                and buffer.next_item == self._starved_item
            ):
                # Same item resumed after the provider ran dry: the caller heard a gap.
                self._underruns += 1
                self._underrun_ms += max(0.0, now_ms - self._starved_at)
                self._resume_item = self._starved_item
            self._starved_item = None
            state = self._state = PacerState.PRIMING
            self._primed_at = now_ms
        if state is PacerState.PRIMING:
            if not buffer.buffered_samples:  # emptied behind our back (buffer.clear())
                self._state = PacerState.IDLE
                return []
            if not self._start_met(now_ms):
                return []
            self._state = PacerState.PLAYING
            if self._resume_item is not None:
                # The caller heard silence from the queue running dry until now: the
                # rest of the item plays that much later than the brain's timeline.
                self._owe(now_ms - self._starved_at, self._resume_item)
                self._resume_item = None
            # Nothing from before this talk spurt is still playing at the provider.
            self._queued_until = max(self._queued_until, now_ms)
        frames: list[PlayoutFrame] = []
        frame_ms = self._frame_ms
        max_lead = self._max_lead_ms
        frame_samples = self._frame_samples
        late_ms = now_ms - self._queued_until
        if late_ms > TIME_EPSILON_MS and buffer.buffered_samples:
            # Polled after the provider's queue ran dry with audio still waiting here
            # (this loop was late: a stall, a descheduled process): the caller heard
            # that silence inside the item, so the rest of it plays that much later.
            # Owed however short (a loaded loop's many 1-5 ms holes add up to a
            # lasting step); counted as an underrun from LATE_POLL_MIN_MS.
            item = buffer.next_item
            if item is not None and item == self._last_item:
                if late_ms > LATE_POLL_MIN_MS:
                    self._underruns += 1
                    self._underrun_ms += late_ms
                self._owe(late_ms, item)
        while True:
            base = max(self._queued_until, now_ms)
            if base - now_ms + frame_ms > max_lead + TIME_EPSILON_MS:
                break
            buffered = buffer.buffered_samples
            if buffered >= frame_samples:
                frame = buffer.pop_frame()
            elif buffered and self._queued_until - now_ms < frame_ms:
                # Only a partial frame and the provider runs dry before the next
                # frame time: send it padded so a response's tail is not stuck.
                frame = buffer.pop_frame(pad=True)
            elif self._bridge_due(now_ms):
                # Nothing buffered and the provider about to run dry: frames of
                # silence inside the item, owed and won back like any other.
                dry_ms = now_ms - self._queued_until
                if dry_ms > TIME_EPSILON_MS:
                    # This loop was late (a stall) and the queue had already run dry:
                    # the caller heard that silence before the bridge's, inside the
                    # item, so it is owed like the bridge (a lasting step otherwise),
                    # however short; an underrun from LATE_POLL_MIN_MS.
                    self._sent_silence(dry_ms, self._last_item)
                    if dry_ms > LATE_POLL_MIN_MS:
                        self._dry_ms += dry_ms
                room = int((max_lead - (base - now_ms) + TIME_EPSILON_MS) // frame_ms)
                count = min(self._bridge_frames, room)
                self._queued_until = base
                for _ in range(count):
                    frames.append(PlayoutFrame(self._silent_frame, self._last_item, 0))
                    self._queued_until += frame_ms
                    self._sent_silence(frame_ms, self._last_item)
                self._bridged = True
                self._bridges += count
                continue
            else:
                break
            if frame is None:  # pragma: no cover - guarded by buffered_samples above
                break
            if self._settle_debt(frame, base - now_ms):
                continue
            self._queued_until = base + frame_ms
            self._last_item = frame.item
            self._bridged = False
            self._frames_sent += 1
            frames.append(frame)
            if frame.audio_samples < frame_samples:
                # Padded (the buffer is now empty): silence ends the provider's queue.
                self._sent_silence(
                    frame_ms * (1.0 - frame.audio_samples / frame_samples), frame.item
                )
        if not buffer.buffered_samples:
            self._was_empty = True
        if not buffer.buffered_samples and self._queued_until <= now_ms:
            self._state = PacerState.STARVED
            self._starved_item = buffer.current_item
            self._starved_at = self._queued_until
        return frames

    def next_poll_ms(self, now_ms: float) -> float | None:
        """When :meth:`poll` should next run absent new audio (``None``: wait for audio).

        Never earlier than ``now_ms``. In IDLE or STARVED with audio already
        buffered (pushed but not polled yet) that is ``now_ms``.
        """
        state = self._state
        buffer = self._buffer
        if state is PacerState.IDLE or state is PacerState.STARVED:
            return now_ms if buffer.buffered_samples else None
        if state is PacerState.PRIMING:
            if not buffer.buffered_samples or self._start_met(now_ms):
                return now_ms
            return max(now_ms, self._primed_at + self._start_ms)
        if buffer.buffered_samples >= self._frame_samples:
            when = self._queued_until + self._frame_ms - self._max_lead_ms
        elif not buffer.buffered_samples and self._may_bridge():
            when = self._queued_until - BRIDGE_LEAD_MS
        elif buffer.buffered_samples:
            # A partial frame is padded and sent while the provider still holds a little.
            when = self._queued_until - PAD_LEAD_MS
        else:
            # An empty buffer is declared starved once the provider's queue has run dry.
            when = self._queued_until
        return max(now_ms, when)

    def clear(self, now_ms: float) -> int:
        """Barge-in or ``audio_clear``: drop unplayed audio; return the ms discarded.

        The provider's queue is assumed cleared too, and no underrun is
        counted for the interrupted item.
        """
        discarded_ms = self._buffer.clear()
        self._queued_until = now_ms
        self._state = PacerState.IDLE
        self._starved_item = None
        self._last_item = None
        self._bridged = False
        self._forget_debt()
        return discarded_ms

    def halt(self, now_ms: float) -> None:
        """Barge-in pause: the provider's queue was cleared, but keep what is buffered.

        Playout starts again (with the usual start allowance) at the next
        :meth:`poll` after the glue resumes polling; no underrun is counted.
        """
        self._queued_until = now_ms
        self._state = PacerState.IDLE
        self._starved_item = None
        self._resume_item = None
        self._last_item = None
        self._bridged = False

    # ---- internals -----------------------------------------------------------

    def _may_bridge(self) -> bool:
        """Whether bridge frames may follow what was sent last (see BRIDGE_FRAMES).

        Only inside a tagged item: silence in untagged audio could never be won back.
        """
        return (
            self._state is PacerState.PLAYING
            and self._last_item is not None
            and self._bridge_frames > 0
            and not self._bridged
            # Room for a frame at the provider once its queue is down to the bridge lead.
            and self._max_lead_ms - BRIDGE_LEAD_MS + TIME_EPSILON_MS >= self._frame_ms
        )

    def _bridge_due(self, now_ms: float) -> bool:
        """Nothing buffered, and the provider's queue about to run dry: bridge it."""
        return (
            not self._buffer.buffered_samples
            and self._may_bridge()
            and self._queued_until - now_ms <= BRIDGE_LEAD_MS + TIME_EPSILON_MS
        )

    def _owe(self, ms: float, item: str | None) -> None:
        """``ms`` of silence went out inside ``item``: owed once ``item`` goes on."""
        if item is None or ms <= 0:
            return
        if self._pending_debt_item != item:
            self._pending_debt_ms = 0.0
            self._pending_debt_item = item
        self._pending_debt_ms += ms

    def _sent_silence(self, ms: float, item: str | None) -> None:
        """``ms`` of silence inside ``item`` ends the provider's queue (buffer empty)."""
        if item is None:
            return
        if self._silence_item != item:
            self._silence_ms = 0.0
            self._dry_ms = 0.0
            self._silence_item = item
        self._silence_ms += ms

    def _audio_arrived(self, now_ms: float) -> None:
        """Audio is buffered again after the buffer ran empty at ``now_ms``."""
        self._was_empty = False
        self._arrived_at = now_ms
        if self._silence_ms:
            # The silence delayed the item by its whole length: had it not been sent,
            # the provider's queue would have run dry that much earlier (an underrun,
            # counted from the queue's end).
            self._owe(self._silence_ms, self._silence_item)
            if self._dry_ms and self._buffer.next_item == self._silence_item:
                # The same item goes on after its queue ran dry: a gap it heard.
                self._underruns += 1
                self._underrun_ms += self._dry_ms
            self._silence_ms = 0.0
            self._dry_ms = 0.0
            self._silence_item = None

    def _forget_debt(self) -> None:
        self._silence_ms = 0.0
        self._dry_ms = 0.0
        self._silence_item = None
        self._debt_ms = 0.0
        self._debt_item = None
        self._pending_debt_ms = 0.0
        self._pending_debt_item = None
        self._resume_item = None

    def _settle_debt(self, frame: PlayoutFrame, queued_ms: float) -> bool:
        """Book ``frame`` against the delay debt; True when it is shed (not sent)."""
        item = frame.item
        if item != self._debt_item:  # a new item is a new timeline: nothing owed
            self._debt_item = item
            self._debt_ms = 0.0
        if self._pending_debt_ms:
            if item is not None and item == self._pending_debt_item:
                self._debt_ms = min(MAX_DELAY_DEBT_MS, self._debt_ms + self._pending_debt_ms)
            self._pending_debt_ms = 0.0
            self._pending_debt_item = None
        frame_ms = self._frame_ms
        if frame.audio_samples < self._frame_samples:
            return False  # padded: its silence is booked once it is queued
        # The provider's queue holds the lead less a frame: a shed cannot starve it.
        queue_full = queued_ms >= self._max_lead_ms - frame_ms - SHED_QUEUE_SLACK_MS
        if self._debt_ms + TIME_EPSILON_MS < frame_ms:
            return self._shed_part(frame, queue_full)
        if not self._buffer.buffered_samples and not queue_full:
            # Nothing waits behind this frame and it did not wait for room: the delay
            # is not held here (the brain is simply later now); shedding would starve.
            return False
        if not _is_silent(frame.pcm):
            return False
        self._debt_ms -= frame_ms
        self._shed_ms += frame_ms
        self.last_shed.append(frame)
        return True

    def _shed_part(self, frame: PlayoutFrame, queue_full: bool) -> bool:
        """Less than a frame owed: cut that much from the head of a silent ``frame``
        when audio waits behind it to fill the frame again, or the provider's queue
        holds enough for it to arrive in time; True when cut."""
        per_ms = self._frame_samples / self._frame_ms
        cut = int(self._debt_ms * per_ms)
        if cut < MIN_PARTIAL_SHED_SAMPLES:
            return False
        if self._buffer.buffered_samples < cut and not queue_full:
            return False
        if not _is_silent(frame.pcm):
            return False
        rest = self._frame_samples - cut
        self._buffer.requeue([PlayoutFrame(frame.pcm[2 * cut :], frame.item, rest)])
        self._debt_ms = max(0.0, self._debt_ms - cut / per_ms)
        self._shed_ms += cut / per_ms
        self.last_shed.append(PlayoutFrame(frame.pcm[: 2 * cut], frame.item, cut))
        return True

    def _start_met(self, now_ms: float) -> bool:
        start = self._start_ms
        return (
            self._buffer.buffered_ms >= start or now_ms - self._primed_at + TIME_EPSILON_MS >= start
        )


def _is_silent(pcm: bytes) -> bool:
    """True when a frame of s16le is a pause (RMS at or below :data:`SHED_SILENCE_RMS`)."""
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    return bool(samples.size) and float(np.sqrt(np.mean(samples * samples))) <= SHED_SILENCE_RMS
