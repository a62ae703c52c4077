"""A call's event trail: content-free records of what happened, in order.

Receipts of tool calls, turn decisions and the call's start and end go here:
tool names, statuses, reason labels, durations, counts. Never audio, never
transcripts or tool arguments, never secrets: a trail can be kept, logged
and shown without leaking what was said. The spend gate and the reflex loop
will publish into the same trail.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

log = logging.getLogger(__name__)

#: Events kept per call; a runaway call keeps its newest. Seed decision: a
#: ten-minute call with a turn every few seconds and a few tool calls fits.
MAX_TRAIL_EVENTS = 1_000
#: Longest string value kept in a payload: labels, ids and reasons, not content.
MAX_VALUE_CHARS = 64

#: A payload value: scalars only, so nothing nested can smuggle content in.
TrailValue: TypeAlias = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class TrailEvent:
    """One record: which call, when (ms since the call started), what, and labels."""

    session_id: str
    at_ms: int
    type: str
    payload: Mapping[str, TrailValue]


class CallTrail:
    """The bounded, ordered trail of one call."""

    def __init__(
        self,
        session_id: str,
        *,
        clock_ms: Callable[[], float],
        max_events: int = MAX_TRAIL_EVENTS,
    ) -> None:
        self.session_id = session_id
        self._clock_ms = clock_ms
        self._start_ms = clock_ms()
        self._events: deque[TrailEvent] = deque(maxlen=max_events)
        self.dropped = 0

    def record(self, type_: str, payload: Mapping[str, TrailValue] | None = None) -> TrailEvent:
        """Append an event; string values are cut to :data:`MAX_VALUE_CHARS`."""
        clean = {
            key: value[:MAX_VALUE_CHARS] if isinstance(value, str) else value
            for key, value in (payload or {}).items()
        }
        event = TrailEvent(self.session_id, round(self._clock_ms() - self._start_ms), type_, clean)
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)
        log.info(
            "call %s trail %s %s",
            self.session_id,
            type_,
            " ".join(f"{k}={v}" for k, v in clean.items()),
        )
        return event

    @property
    def events(self) -> tuple[TrailEvent, ...]:
        """Every kept event, oldest first."""
        return tuple(self._events)

    def of_type(self, type_: str) -> list[TrailEvent]:
        """The kept events of one type, oldest first."""
        return [e for e in self._events if e.type == type_]
