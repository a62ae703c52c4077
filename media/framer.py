"""Cut a PCM16 (s16le) byte stream into fixed-size frames, carrying the remainder."""

from __future__ import annotations

from rutster.media.formats import CANONICAL_FRAME_SAMPLES, SAMPLE_WIDTH

__all__ = ["Framer"]


class Framer:
    """Turn arbitrary PCM16 chunks into frames of exactly ``frame_samples`` samples.

    Whatever does not fill a frame, including a dangling odd byte, is kept and
    prepended to the next push, so the concatenated frames always equal a
    prefix of the concatenated input.
    """

    __slots__ = ("_frame_bytes", "_frame_samples", "_rest")

    def __init__(self, frame_samples: int = CANONICAL_FRAME_SAMPLES) -> None:
        if frame_samples <= 0:
            raise ValueError(f"frame_samples must be positive, got {frame_samples}")
        self._frame_samples = frame_samples
        self._frame_bytes = frame_samples * SAMPLE_WIDTH
        self._rest = b""

    @property
    def frame_samples(self) -> int:
        """Samples per frame."""
        return self._frame_samples

    @property
    def pending_samples(self) -> int:
        """Whole samples held back waiting for the rest of a frame."""
        return len(self._rest) // SAMPLE_WIDTH

    def push(self, pcm: bytes) -> list[bytes]:
        """Add a chunk; return every frame it completes, oldest first."""
        size = self._frame_bytes
        buf = self._rest + pcm if self._rest else pcm
        length = len(buf)
        if length == size:  # the common case: one 20 ms chunk in, one frame out
            self._rest = b""
            return [bytes(buf)]
        end = length - length % size
        self._rest = bytes(buf[end:])
        return [buf[i : i + size] for i in range(0, end, size)]

    def reset(self) -> int:
        """Drop the held-back remainder; return how many whole samples were dropped."""
        dropped = self.pending_samples
        self._rest = b""
        return dropped
