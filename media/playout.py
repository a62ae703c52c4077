"""The bounded playout buffer for assistant audio, owned by the core.

The brain's ``audio_out`` chunks go in (any length, tagged with the item they
belong to); canonical frames come out, one per pacer tick. A brain that floods
gets its oldest unplayed audio dropped and counted, never unbounded memory.
Per item, the buffer counts what has actually been popped for playout, which
is what barge-in reports as ``played_ms``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from rutster.media.formats import (
    CANONICAL_FRAME_SAMPLES,
    CANONICAL_SAMPLE_RATE,
    SAMPLE_WIDTH,
    samples_to_ms,
)
from rutster.media.g711 import PcmLengthError

__all__ = ["DEFAULT_MAX_MS", "MAX_TRACKED_ITEMS", "PlayoutBuffer", "PlayoutFrame"]

#: Capacity of the playout buffer (seed decision from the issue): long enough
#: for a brain that sends a whole answer faster than real time, short enough
#: that a flood costs at most 1.4 MB per call (30 s of 24 kHz PCM16).
DEFAULT_MAX_MS = 30_000
#: How many items' played counters are kept (seed decision): far more than the
#: items one answer spans, and a hostile brain inventing an item per chunk
#: cannot grow memory past it. The oldest-played items are forgotten first.
MAX_TRACKED_ITEMS = 256


@dataclass(frozen=True, slots=True)
class PlayoutFrame:
    """One frame popped for playout.

    ``pcm`` is exactly one frame of s16le; its first ``audio_samples`` samples
    are real audio and the rest is zero padding. ``item`` is the item of the
    last real sample in it (``None`` for untagged audio).
    """

    pcm: bytes
    item: str | None
    audio_samples: int


class PlayoutBuffer:
    """A bounded FIFO of PCM16 audio segments that pops whole frames.

    Segments are kept as pushed (no copy) in a deque with a read offset into
    the oldest one, so a pop touches at most the few segments a frame spans.
    """

    __slots__ = (
        "_buffered_bytes",
        "_capacity_bytes",
        "_current_item",
        "_dropped_samples",
        "_frame_bytes",
        "_frame_samples",
        "_head_offset",
        "_max_ms",
        "_overflow_events",
        "_played",
        "_sample_rate",
        "_segments",
        "_zeros",
    )

    def __init__(
        self,
        max_ms: int = DEFAULT_MAX_MS,
        sample_rate: int = CANONICAL_SAMPLE_RATE,
        frame_samples: int = CANONICAL_FRAME_SAMPLES,
    ) -> None:
        if sample_rate <= 0 or frame_samples <= 0:
            raise ValueError("sample_rate and frame_samples must be positive")
        capacity_samples = max_ms * sample_rate // 1000
        if capacity_samples < frame_samples:
            raise ValueError(f"max_ms={max_ms} holds less than one frame of {frame_samples}")
        self._max_ms = max_ms
        self._sample_rate = sample_rate
        self._frame_samples = frame_samples
        self._frame_bytes = frame_samples * SAMPLE_WIDTH
        self._capacity_bytes = capacity_samples * SAMPLE_WIDTH
        self._zeros = bytes(self._frame_bytes)
        self._segments: deque[tuple[bytes, str | None]] = deque()
        self._head_offset = 0  # bytes of the oldest segment already popped or dropped
        self._buffered_bytes = 0
        self._dropped_samples = 0
        self._overflow_events = 0
        self._current_item: str | None = None
        self._played: OrderedDict[str, int] = OrderedDict()  # item -> samples popped

    # ---- configuration -------------------------------------------------------

    @property
    def max_ms(self) -> int:
        """Capacity in milliseconds."""
        return self._max_ms

    @property
    def sample_rate(self) -> int:
        """Sample rate of the buffered audio in Hz."""
        return self._sample_rate

    @property
    def frame_samples(self) -> int:
        """Samples per popped frame."""
        return self._frame_samples

    # ---- state ---------------------------------------------------------------

    @property
    def buffered_samples(self) -> int:
        """Unplayed samples in the buffer."""
        return self._buffered_bytes // SAMPLE_WIDTH

    @property
    def buffered_ms(self) -> int:
        """Unplayed audio in whole milliseconds (rounded down)."""
        return samples_to_ms(self._buffered_bytes // SAMPLE_WIDTH, self._sample_rate)

    @property
    def dropped_samples(self) -> int:
        """Samples dropped by overflow since creation."""
        return self._dropped_samples

    @property
    def overflow_events(self) -> int:
        """Pushes that had to drop audio to fit."""
        return self._overflow_events

    @property
    def current_item(self) -> str | None:
        """Item of the most recently popped real sample (``None`` before any)."""
        return self._current_item

    @property
    def next_item(self) -> str | None:
        """Item of the oldest unplayed sample (``None`` when empty or untagged)."""
        return self._segments[0][1] if self._segments else None

    def played_ms(self, item: str) -> int:
        """Milliseconds of ``item`` popped for playout so far (0 if unknown or forgotten)."""
        return samples_to_ms(self._played.get(item, 0), self._sample_rate)

    # ---- operations ----------------------------------------------------------

    def push(self, pcm: bytes, item: str | None) -> int:
        """Append s16le audio for ``item``; return samples dropped to make room.

        On overflow the oldest unplayed audio goes first; a push larger than
        the whole capacity keeps only its newest part.
        """
        length = len(pcm)
        if length & 1:
            raise PcmLengthError(length)
        if not length:
            return 0
        dropped = 0
        capacity = self._capacity_bytes
        if length > capacity:
            dropped = length - capacity
            pcm = pcm[dropped:]
            length = capacity
        excess = self._buffered_bytes + length - capacity
        if excess > 0:
            self._discard_oldest(excess)
            dropped += excess
        self._segments.append((pcm, item))
        self._buffered_bytes += length
        if dropped:
            samples = dropped // SAMPLE_WIDTH
            self._dropped_samples += samples
            self._overflow_events += 1
            return samples
        return 0

    def pop_frame(self, pad: bool = False) -> PlayoutFrame | None:
        """Pop exactly one frame.

        With fewer than a frame buffered, return ``None`` unless ``pad`` is
        set, in which case the remainder is zero-padded (still ``None`` when
        the buffer is empty).
        """
        size = self._frame_bytes
        buffered = self._buffered_bytes
        if buffered < size and (not pad or not buffered):
            return None
        segments = self._segments
        need = min(size, buffered)
        taken = need
        offset = self._head_offset
        pieces: list[bytes | memoryview] = []
        item: str | None = None
        while need:
            segment, item = segments[0]
            available = len(segment) - offset
            if available <= need:
                pieces.append(segment if not offset else memoryview(segment)[offset:])
                segments.popleft()
                self._count_played(item, available)
                need -= available
                offset = 0
            else:
                pieces.append(memoryview(segment)[offset : offset + need])
                self._count_played(item, need)
                offset += need
                need = 0
        self._head_offset = offset
        self._buffered_bytes = buffered - taken
        self._current_item = item
        if taken < size:
            pieces.append(self._zeros[: size - taken])
        pcm = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return PlayoutFrame(bytes(pcm), item, taken // SAMPLE_WIDTH)

    def requeue(self, frames: Sequence[PlayoutFrame]) -> int:
        """Put popped ``frames`` back at the head, oldest first; return samples requeued.

        For a paused barge-in: the provider's ``clear`` discarded audio the
        caller never heard, so it goes back in front of what is still
        buffered, and no longer counts as played for its item. Only the
        frames' real audio is requeued (padding is not). If the buffer would
        overflow, the oldest requeued audio is dropped (counted).
        """
        pieces = [(f.pcm[: f.audio_samples * SAMPLE_WIDTH], f.item) for f in frames]
        pieces = [(pcm, item) for pcm, item in pieces if pcm]
        if not pieces:
            return 0
        total = sum(len(pcm) for pcm, _ in pieces)
        room = self._capacity_bytes - self._buffered_bytes
        if total > room:
            drop = total - room
            self._dropped_samples += drop // SAMPLE_WIDTH
            self._overflow_events += 1
            while drop and pieces:
                pcm, item = pieces[0]
                if len(pcm) <= drop:
                    drop -= len(pcm)
                    pieces.pop(0)
                else:
                    pieces[0] = (pcm[drop:], item)
                    drop = 0
        segments = self._segments
        if self._head_offset:
            head, head_item = segments[0]
            segments[0] = (head[self._head_offset :], head_item)
            self._head_offset = 0
        requeued = 0
        for pcm, item in reversed(pieces):
            segments.appendleft((pcm, item))
            self._buffered_bytes += len(pcm)
            requeued += len(pcm) // SAMPLE_WIDTH
            if item is not None and item in self._played:
                self._played[item] = max(0, self._played[item] - len(pcm) // SAMPLE_WIDTH)
        return requeued

    def clear(self) -> int:
        """Drop all unplayed audio; return the milliseconds discarded (rounded down)."""
        discarded_ms = self.buffered_ms
        self._segments.clear()
        self._head_offset = 0
        self._buffered_bytes = 0
        return discarded_ms

    # ---- internals -----------------------------------------------------------

    def _discard_oldest(self, nbytes: int) -> None:
        """Drop ``nbytes`` (even, at most what is buffered) from the head."""
        segments = self._segments
        offset = self._head_offset
        self._buffered_bytes -= nbytes
        while nbytes:
            available = len(segments[0][0]) - offset
            if available <= nbytes:
                segments.popleft()
                nbytes -= available
                offset = 0
            else:
                offset += nbytes
                nbytes = 0
        self._head_offset = offset

    def _count_played(self, item: str | None, nbytes: int) -> None:
        if item is None:
            return
        played = self._played
        if item in played:
            played[item] += nbytes // SAMPLE_WIDTH
            played.move_to_end(item)  # most recently played is evicted last
        else:
            played[item] = nbytes // SAMPLE_WIDTH
            if len(played) > MAX_TRACKED_ITEMS:
                played.popitem(last=False)
