"""The per-leg playout queue of the SIP worker (sans-I/O, no locks).

Audio from the gateway (L16, 16 kHz, mono) is pushed in any even length; the
pjsua media clock pulls exactly one 20 ms frame per tick. Marks ride in the
byte stream: a mark is reported by the pull that takes the last byte queued
before it, so "mark" means "everything sent before it has been played".
The caller (``trunk.sip.ua``) serialises access with its own lock.
"""

from __future__ import annotations

from collections import deque

__all__ = [
    "DEFAULT_FRAME_BYTES",
    "DEFAULT_MAX_MS",
    "FRAME_MS",
    "MAX_PENDING_MARKS",
    "LegPlayout",
]

#: One pjsua port frame: 16 kHz * 20 ms * 2 bytes (the media-WebSocket contract
#: in the issue 6 design: L16 mono 16 kHz, 20 ms = 320 samples = 640 bytes).
DEFAULT_FRAME_BYTES = 640
#: Duration of one frame (pjsua ptime, issue 6 design).
FRAME_MS = 20
#: Queue bound: the same 30 s the core's playout buffer allows
#: (media.playout.DEFAULT_MAX_MS, seed decision of issue 3); the gateway paces
#: audio in real time, so this only absorbs bursts.
DEFAULT_MAX_MS = 30_000
#: Marks kept while their audio is unplayed (seed decision): a gateway sends
#: one per brain response; a flood of marks cannot grow memory past this.
MAX_PENDING_MARKS = 1_024
#: s16le sample width: pushes are cut to whole samples.
_SAMPLE_WIDTH = 2


class LegPlayout:
    """A bounded FIFO of PCM segments that pops fixed frames and reports marks.

    Segments are kept as pushed in a deque with a read offset into the oldest,
    so a pull touches only the segments one frame spans. Positions are byte
    counters since creation: a mark remembers the ``pushed`` counter at the
    time it was queued and is due once ``pulled`` reaches it.
    """

    __slots__ = (
        "_frame_bytes",
        "_head_offset",
        "_marks",
        "_max_bytes",
        "_pulled",
        "_pushed",
        "_segments",
        "_silence",
        "dropped_bytes",
        "dropped_marks",
    )

    def __init__(
        self, frame_bytes: int = DEFAULT_FRAME_BYTES, max_ms: int = DEFAULT_MAX_MS
    ) -> None:
        if frame_bytes <= 0 or frame_bytes % _SAMPLE_WIDTH:
            raise ValueError(f"frame_bytes must be a positive even number, got {frame_bytes}")
        if max_ms < FRAME_MS:
            raise ValueError(f"max_ms must be at least one frame ({FRAME_MS} ms), got {max_ms}")
        self._frame_bytes = frame_bytes
        # Whole samples only, at least one frame.
        bytes_per_ms = frame_bytes / FRAME_MS
        max_bytes = int(max_ms * bytes_per_ms)
        self._max_bytes = max(frame_bytes, max_bytes - max_bytes % _SAMPLE_WIDTH)
        self._silence = bytes(frame_bytes)
        self._segments: deque[bytes] = deque()
        self._head_offset = 0
        self._pushed = 0
        self._pulled = 0
        self._marks: deque[tuple[int, str]] = deque()
        #: Totals of what was refused (bound, odd byte, mark flood), for metrics.
        self.dropped_bytes = 0
        self.dropped_marks = 0

    @property
    def frame_bytes(self) -> int:
        """Size of one pulled frame in bytes."""
        return self._frame_bytes

    @property
    def max_bytes(self) -> int:
        """The queue bound in bytes."""
        return self._max_bytes

    @property
    def queued_bytes(self) -> int:
        """Audio bytes waiting to be pulled."""
        return self._pushed - self._pulled

    @property
    def pending_marks(self) -> int:
        """Marks not yet reported."""
        return len(self._marks)

    def push(self, pcm: bytes) -> int:
        """Queue audio; return how many bytes were dropped (over the bound, odd byte)."""
        size = len(pcm)
        room = self._max_bytes - self.queued_bytes
        keep = min(size, room)
        keep -= keep % _SAMPLE_WIDTH
        if keep > 0:
            self._segments.append(bytes(pcm[:keep]) if keep < size else bytes(pcm))
            self._pushed += keep
        dropped = size - keep
        self.dropped_bytes += dropped
        return dropped

    def mark(self, name: str) -> None:
        """Queue a mark after the audio pushed so far (dropped and counted past the cap)."""
        if len(self._marks) >= MAX_PENDING_MARKS:
            self.dropped_marks += 1
            return
        self._marks.append((self._pushed, name))

    def clear(self) -> None:
        """Drop all queued audio and all pending marks."""
        self._segments.clear()
        self._head_offset = 0
        self._pulled = self._pushed
        self._marks.clear()

    def pull(self) -> tuple[bytes, tuple[str, ...]]:
        """Pop one frame (silence-padded) and the marks whose audio is now fully pulled."""
        want = self._frame_bytes
        parts: list[bytes] = []
        got = 0
        segments = self._segments
        while got < want and segments:
            head = segments[0]
            start = self._head_offset
            take = min(want - got, len(head) - start)
            if start == 0 and take == len(head):
                parts.append(head)
            else:
                parts.append(head[start : start + take])
            got += take
            if start + take == len(head):
                segments.popleft()
                self._head_offset = 0
            else:
                self._head_offset = start + take
        self._pulled += got
        if got == want and len(parts) == 1:
            frame = parts[0]
        elif got == 0:
            frame = self._silence
        else:
            parts.append(self._silence[: want - got])
            frame = b"".join(parts)
        names: tuple[str, ...] = ()
        marks = self._marks
        if marks and marks[0][0] <= self._pulled:
            due: list[str] = []
            while marks and marks[0][0] <= self._pulled:
                due.append(marks.popleft()[1])
            names = tuple(due)
        return frame, names
