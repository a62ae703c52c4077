"""A call's event bus: every decision the core makes about a call, as a sanitized event.

The reflex loop publishes its state transitions and turn decisions, the tool
registry its receipts, the call its start and end. Subscribers (the trail of
receipts, the Prometheus metrics, later the spend gate) turn them into what
they need. Payloads are flat scalars, with strings cut short: labels, ids,
counts and durations. Never audio, transcripts, tool arguments or secrets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

log = logging.getLogger(__name__)

#: Longest string value kept in a payload: labels, ids and reasons, not content.
MAX_VALUE_CHARS = 64

#: A payload value: scalars only, so nothing nested can smuggle content in.
EventValue: TypeAlias = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One event: which call, when (ms since it started), which stage, what, and labels."""

    session_id: str
    at_ms: int
    stage: str
    type: str
    payload: Mapping[str, EventValue]


#: A subscriber: called synchronously, in subscription order, for every event.
Subscriber: TypeAlias = Callable[[CallEvent], None]


class EventBus:
    """Per-call publish/subscribe, synchronous and in order (no I/O, no tasks)."""

    def __init__(self, session_id: str, *, clock_ms: Callable[[], float]) -> None:
        self.session_id = session_id
        self._clock_ms = clock_ms
        self._start_ms = clock_ms()
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        """Add a subscriber for every later event."""
        self._subscribers.append(subscriber)

    def publish(
        self, stage: str, type_: str, payload: Mapping[str, EventValue] | None = None
    ) -> CallEvent:
        """Sanitize and deliver one event; a failing subscriber is logged, never fatal."""
        clean = {
            key: value[:MAX_VALUE_CHARS] if isinstance(value, str) else value
            for key, value in (payload or {}).items()
            if isinstance(value, str | int | float | bool) or value is None
        }
        event = CallEvent(
            self.session_id, round(self._clock_ms() - self._start_ms), stage, type_, clean
        )
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:  # a metrics bug must not take a call down
                log.exception("call %s: event subscriber failed on %s", self.session_id, type_)
        return event
