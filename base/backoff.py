"""The brain-reconnect backoff schedule (sans-I/O)."""

from __future__ import annotations

from collections.abc import Sequence

#: Delays between reconnect attempts, in seconds, then the last one repeated:
#: 250 ms, 500 ms, 1 s, 2 s, then every 5 s (TAP_PROTOCOL.md, "Lost brain connection").
TAP_RECONNECT_DELAYS_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0)


class Backoff:
    """Yields the delay before each retry; ``reset()`` after a success."""

    def __init__(self, delays: Sequence[float] = TAP_RECONNECT_DELAYS_S) -> None:
        if not delays:
            raise ValueError("backoff needs at least one delay")
        self._delays = tuple(delays)
        self._attempt = 0

    @property
    def attempt(self) -> int:
        """Failed attempts since the last reset."""
        return self._attempt

    def next_delay(self) -> float:
        """The delay to wait before the next attempt (bounded by the last entry)."""
        delay = self._delays[min(self._attempt, len(self._delays) - 1)]
        self._attempt += 1
        return delay

    def reset(self) -> None:
        """Forget past failures (call after a successful connection)."""
        self._attempt = 0
