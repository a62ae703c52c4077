"""What the caller has actually heard: the provider's playback timeline, per frame.

The pacer sends each 20 ms frame up to ``lead`` ms before it is due. The
provider plays frames back to back: a frame starts when it arrives or when the
previous one ends, whichever is later. :class:`PlayedLedger` replays that rule
for every frame sent, so at any instant it knows which frames have been heard.
``mark`` echoes correct it: Twilio echoes a mark when playback reaches it, so
a mark placed after frame N that comes back at T means frame N finished at T.
The later of the two wins, since a mark can only come back late, never early.

From that it answers two questions, both needed for a barge-in:

- :meth:`played_ms`: how much of an item the caller heard, for
  ``speech_started{played_ms}`` and OpenAI's ``audio_end_ms``;
- :meth:`unplayed`: the frames sent but not yet heard, which a provider
  ``clear`` throws away and a paused barge-in must put back.

No I/O; time comes in as ms. Bounded: it remembers :data:`HISTORY_FRAMES`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rutster.media.formats import FRAME_MS, samples_to_ms
from rutster.media.playout import PlayoutFrame

#: Frames remembered: 2 s. A mark comes back within the 60 ms send-ahead plus the
#: provider's round trip; a requeue needs only the frames still in flight.
HISTORY_FRAMES = 100


@dataclass(frozen=True, slots=True)
class SentFrame:
    """One frame as sent: its index, audio, item, and where the provider plays it."""

    index: int
    frame: PlayoutFrame
    item_end_samples: int
    play_start_ms: float
    play_end_ms: float


class PlayedLedger:
    """The provider's playback timeline, reconstructed from what was sent and marked."""

    def __init__(self, frame_ms: float = FRAME_MS, history: int = HISTORY_FRAMES) -> None:
        self._frame_ms = float(frame_ms)
        self._frames: deque[SentFrame] = deque(maxlen=history)
        self._item_samples: dict[str, int] = {}
        self._queue_end_ms = float("-inf")
        self._sent = 0
        self.marks_applied = 0

    @property
    def frames_sent(self) -> int:
        """Frames recorded since creation (the index of the next one)."""
        return self._sent

    def sent(self, frame: PlayoutFrame, now_ms: float) -> SentFrame:
        """Record ``frame`` sent at ``now_ms``; return its entry (index = frames before it)."""
        item = frame.item
        if item is not None:
            self._item_samples[item] = self._item_samples.get(item, 0) + frame.audio_samples
        start = max(now_ms, self._queue_end_ms)
        entry = SentFrame(
            index=self._sent,
            frame=frame,
            item_end_samples=self._item_samples.get(item, 0) if item is not None else 0,
            play_start_ms=start,
            play_end_ms=start + self._frame_ms,
        )
        self._queue_end_ms = entry.play_end_ms
        self._frames.append(entry)
        self._sent += 1
        return entry

    def skipped(self, frame: PlayoutFrame) -> None:
        """``frame`` was shed (a pause dropped to win back delay): its item moves on
        past it without it taking any time on the provider's timeline."""
        item = frame.item
        if item is not None:
            self._item_samples[item] = self._item_samples.get(item, 0) + frame.audio_samples

    def recent(self, count: int) -> list[SentFrame]:
        """The last ``count`` frames recorded (fewer if fewer are remembered), oldest first."""
        if count <= 0:
            return []
        frames = self._frames
        return [frames[i] for i in range(max(0, len(frames) - count), len(frames))]

    def mark_played(self, index: int, now_ms: float) -> None:
        """The provider echoed the mark placed after frame ``index`` at ``now_ms``.

        Frames from ``index`` on are re-timed if playback runs later than
        predicted; an echo earlier than predicted is ignored (it cannot be).
        """
        frames = self._frames
        if not frames:
            return
        # Indices are consecutive in the deque: the position is arithmetic, not a search.
        position = index - frames[0].index
        if not 0 <= position < len(frames):
            return
        late = now_ms - frames[position].play_end_ms
        if late <= 0:
            return
        self.marks_applied += 1
        for i in range(position, len(frames)):
            e = frames[i]
            frames[i] = SentFrame(
                e.index, e.frame, e.item_end_samples, e.play_start_ms + late, e.play_end_ms + late
            )
        self._queue_end_ms += late

    def played_ms(self, item: str, now_ms: float) -> int:
        """Milliseconds of ``item`` the caller has heard by ``now_ms`` (0 if none remembered)."""
        heard = 0.0
        for entry in reversed(self._frames):
            if entry.frame.item != item or entry.play_start_ms >= now_ms:
                continue
            before = entry.item_end_samples - entry.frame.audio_samples
            fraction = min(1.0, (now_ms - entry.play_start_ms) / self._frame_ms)
            heard = before + fraction * entry.frame.audio_samples
            break
        return samples_to_ms(int(heard))

    def unplayed(self, now_ms: float) -> list[PlayoutFrame]:
        """Frames sent but not finished playing by ``now_ms``, oldest first.

        The frame playing right now counts as unplayed: replaying up to 20 ms
        beats losing a syllable the caller only half heard.
        """
        return [e.frame for e in self._frames if e.play_end_ms > now_ms]

    def provider_cleared(self, now_ms: float) -> list[PlayoutFrame]:
        """The provider's queue was cleared at ``now_ms``: forget what it never played.

        Returns those frames (oldest first) so they can be requeued, and takes
        their audio off their items' heard totals.
        """
        dropped = self.unplayed(now_ms)
        while self._frames and self._frames[-1].play_end_ms > now_ms:
            entry = self._frames.pop()
            item = entry.frame.item
            if item is not None and item in self._item_samples:
                self._item_samples[item] -= entry.frame.audio_samples
        self._queue_end_ms = now_ms
        return dropped

    def idle(self, now_ms: float) -> bool:
        """True when everything sent has finished playing."""
        return self._queue_end_ms <= now_ms
