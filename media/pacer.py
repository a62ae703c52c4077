"""When canonical frames leave for the caller: real time with a bounded lead.

The pacer models the provider's playback queue: ``queued_until`` is the time
at which the provider will have played everything sent so far. A frame may be
sent while that keeps the queue at most ``lead_ms`` ahead of now, so the
caller hears the assistant at real time and a barge-in has at most ``lead_ms``
of audio already out of the core's hands. Time is always passed in (ms, any
monotonic origin); the pacer reads no clock.
"""

from __future__ import annotations

from enum import StrEnum

from media.formats import FRAME_MS
from media.playout import PlayoutBuffer, PlayoutFrame

__all__ = ["DEFAULT_LEAD_MS", "DEFAULT_START_MS", "Pacer", "PacerState"]

#: Most audio queued at the provider ahead of real time (seed decision; the issue
#: sets the default at <= 60 ms): three frames absorb socket and event-loop
#: jitter while bounding what the caller still hears after a barge-in.
DEFAULT_LEAD_MS = 60.0
#: Jitter allowance before playout starts (seed decision): wait for this much
#: audio, or this long, so a brain's first chunks arriving unevenly do not
#: starve the first frames.
DEFAULT_START_MS = 40.0
#: Float slack in time comparisons (ms) so that a poll at exactly the time
#: next_poll_ms() returned makes progress despite rounding of clock readings.
TIME_EPSILON_MS = 1e-6


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
        "_buffer",
        "_frame_ms",
        "_frame_samples",
        "_frames_sent",
        "_lead_ms",
        "_max_lead_ms",
        "_primed_at",
        "_queued_until",
        "_start_ms",
        "_starved_at",
        "_starved_item",
        "_state",
        "_underrun_ms",
        "_underruns",
    )

    def __init__(
        self,
        buffer: PlayoutBuffer,
        *,
        lead_ms: float = DEFAULT_LEAD_MS,
        start_ms: float = DEFAULT_START_MS,
        frame_ms: int = FRAME_MS,
    ) -> None:
        if frame_ms <= 0 or lead_ms < 0 or start_ms < 0:
            raise ValueError("frame_ms must be positive; lead_ms and start_ms not negative")
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
        self._underruns = 0
        self._underrun_ms = 0.0

    # ---- read-only state -----------------------------------------------------

    @property
    def state(self) -> PacerState:
        """Current playout state."""
        return self._state

    @property
    def frames_sent(self) -> int:
        """Frames released by :meth:`poll` since creation."""
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
            # Nothing from before this talk spurt is still playing at the provider.
            self._queued_until = max(self._queued_until, now_ms)
        frames: list[PlayoutFrame] = []
        frame_ms = self._frame_ms
        max_lead = self._max_lead_ms
        frame_samples = self._frame_samples
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
            else:
                break
            if frame is None:  # pragma: no cover - guarded by buffered_samples above
                break
            self._queued_until = base + frame_ms
            frames.append(frame)
        self._frames_sent += len(frames)
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
        else:
            # A partial frame is padded, and an empty buffer declared starved,
            # once the provider queue is about to run dry.
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
        return discarded_ms

    def extend(self, now_ms: float, ms: float) -> None:
        """The provider was sent ``ms`` of audio that did not come from the buffer
        (the outbound resampler's tail): its queue reaches that much further."""
        self._queued_until = max(self._queued_until, now_ms) + ms

    def halt(self, now_ms: float) -> None:
        """Barge-in pause: the provider's queue was cleared, but keep what is buffered.

        Playout starts again (with the usual start allowance) at the next
        :meth:`poll` after the glue resumes polling; no underrun is counted.
        """
        self._queued_until = now_ms
        self._state = PacerState.IDLE
        self._starved_item = None

    # ---- internals -----------------------------------------------------------

    def _start_met(self, now_ms: float) -> bool:
        start = self._start_ms
        return (
            self._buffer.buffered_ms >= start or now_ms - self._primed_at + TIME_EPSILON_MS >= start
        )
