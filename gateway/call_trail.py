"""A call's trail: the content-free record of its events, in order (a bus subscriber).

Receipts of tool calls, turn decisions, barge-ins, state changes and the
call's start and end: whatever the call's :class:`~gateway.event_bus.EventBus`
carries, already sanitized there. The trail keeps the newest
:data:`MAX_TRAIL_EVENTS` and logs receipts; it can be kept, logged and shown
without leaking what was said.
"""

from __future__ import annotations

import logging
from collections import deque

from rutster.gateway.event_bus import CallEvent

log = logging.getLogger(__name__)

#: Events kept per call; a runaway call keeps its newest. Seed decision: a
#: ten-minute call with a turn every few seconds and its state changes fits.
MAX_TRAIL_EVENTS = 2_000
#: Stages whose events are also logged at INFO (the rest are DEBUG: the reflex
#: loop changes state several times a turn).
LOGGED_STAGES = frozenset({"call", "tool", "brain"})
#: Event types logged at WARNING: a brain's usage clamped as implausible (or a cost
#: settled at the reservation) is something an operator should look at.
WARNING_TYPES = frozenset({"usage_anomaly"})


class CallTrail:
    """The bounded, ordered trail of one call; subscribe :meth:`on_event` to its bus."""

    def __init__(self, session_id: str, *, max_events: int = MAX_TRAIL_EVENTS) -> None:
        self.session_id = session_id
        self._events: deque[CallEvent] = deque(maxlen=max_events)
        self.dropped = 0

    def on_event(self, event: CallEvent) -> None:
        """Keep ``event`` (dropping the oldest beyond the bound) and log receipts."""
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)
        if event.type in WARNING_TYPES:
            level = logging.WARNING
        elif event.stage in LOGGED_STAGES:
            level = logging.INFO
        else:
            level = logging.DEBUG
        log.log(
            level,
            "call %s %s.%s %s",
            self.session_id,
            event.stage,
            event.type,
            " ".join(f"{k}={v}" for k, v in event.payload.items()),
        )

    @property
    def events(self) -> tuple[CallEvent, ...]:
        """Every kept event, oldest first."""
        return tuple(self._events)

    def of_type(self, type_: str) -> list[CallEvent]:
        """The kept events of one type, oldest first."""
        return [e for e in self._events if e.type == type_]
