"""How much caller audio one call may deliver: real time plus a bounded burst (sans-I/O).

A provider sends a call's audio in real time, ~20 ms a message (Twilio,
Telnyx, Plivo: 160 μ-law bytes; Vonage and SIP: one 20 ms frame). Every
millisecond of it costs the gateway the per-frame work of the engine (two
resamplers, the echo gate, the VAD: ~200 µs a 20 ms frame). A peer that sends
more than real time, or one 64 KiB message holding 8 s of audio, takes that
work from every other call on the event loop: one such message held the loop
~200 ms (issue 14, finding 1). :class:`CallerAudioBudget` is a token bucket in
milliseconds of audio: it refills at real time, holds at most
:data:`CALLER_AUDIO_BURST_MS`, and a message that does not fit is refused
whole (the driver counts it), so no call costs more than its own real time
plus one burst.
"""

from __future__ import annotations

import math

__all__ = ["CALLER_AUDIO_BURST_MS", "CallerAudioBudget"]

#: Audio a call may deliver ahead of real time (ms): what a provider releases at
#: once after its network held the stream back. Seed decision: a one-second
#: hold is a long one on a live call, and its audio is stale by then; the
#: largest legitimate single message is a provider's 20 ms frame.
CALLER_AUDIO_BURST_MS = 1_000.0


class CallerAudioBudget:
    """Admits caller audio at real time plus a burst of ``burst_ms``; time is an argument."""

    __slots__ = ("_at_ms", "_burst_ms", "_tokens_ms", "refused", "refused_ms")

    def __init__(self, burst_ms: float = CALLER_AUDIO_BURST_MS) -> None:
        if not (math.isfinite(burst_ms) and burst_ms > 0):
            raise ValueError(f"burst_ms must be a positive number, got {burst_ms!r}")
        self._burst_ms = burst_ms
        self._tokens_ms = burst_ms
        self._at_ms: float | None = None
        #: Messages refused, and the audio they held (ms).
        self.refused = 0
        self.refused_ms = 0.0

    def admit(self, duration_ms: float, now_ms: float) -> bool:
        """Whether a message of ``duration_ms`` of audio arriving at ``now_ms`` may be processed."""
        last = self._at_ms
        if last is not None and now_ms > last:
            self._tokens_ms = min(self._burst_ms, self._tokens_ms + (now_ms - last))
        if last is None or now_ms > last:
            self._at_ms = now_ms
        if duration_ms <= self._tokens_ms:
            self._tokens_ms -= duration_ms
            return True
        self.refused += 1
        self.refused_ms += duration_ms
        return False
