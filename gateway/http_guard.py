"""Slow or hoarding HTTP clients: read deadlines and a per-source connection cap.

uvicorn arms a timer only between two requests of a kept-alive connection
(``timeout_keep_alive``). A connection that sends half a request line, or
its headers a byte at a time, is held for ever: 150 of 150 such connections
were still open after 30 s, and 240 of them used up a 256-descriptor limit
until every honest webhook was reset (issue 14, finding 2, "slowloris").

:func:`guarded_http_protocol` builds uvicorn's httptools protocol with:

- a **header deadline**: the request line and headers must be complete within
  :data:`HEADER_TIMEOUT_S` of the connection (or of the previous response);
- a **body deadline**: the body within :data:`BODY_TIMEOUT_S` of the headers;
- a **per-source cap**: at most ``max_per_source`` connections from one IP
  address in the HTTP phase (a WebSocket, once upgraded, no longer counts:
  a provider's media sockets are bounded by the calls the spend gate admits).

Connections past a deadline or over the cap are closed, counted in
:class:`HttpGuardStats`, and logged at most once a minute per reason.
uvicorn's protocol has no hooks for this, so the class overrides the parser
callbacks it already has (uvicorn 0.30+ ``httptools_impl``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

#: Time for a whole request line and headers (s). Seed decision: a webhook's
#: headers are ~1 KB and arrive in one packet; 10 s is generous for a slow
#: mobile link and bounds what one idle connection holds. (nginx's
#: ``client_header_timeout`` default is 60 s; Apache's mod_reqtimeout 20-40 s.)
HEADER_TIMEOUT_S = 10.0
#: Time for a request body after its headers (s): the largest the gateway
#: reads is 64 KiB (webhooks, REST). Seed decision, as for the headers.
BODY_TIMEOUT_S = 10.0
#: Connections one source IP may hold in the HTTP phase. Seed decision: far
#: more than one provider edge or API client keeps open, few enough that one
#: source cannot use up the descriptors. Behind a reverse proxy every
#: connection comes from the proxy: raise it there (RUTSTER_HTTP_MAX_PER_SOURCE).
DEFAULT_MAX_PER_SOURCE = 64
#: At most one log line per reason in this many seconds.
LOG_EVERY_S = 60.0


@dataclass
class HttpGuardStats:
    """What the guard refused or cut, by reason (``header_timeout``, ``body_timeout``,
    ``too_many_from_source``); ``open_by_source`` is live."""

    closed: Counter[str] = field(default_factory=Counter)
    open_by_source: Counter[str] = field(default_factory=Counter)
    #: Called with the reason of every close (the gateway's metric).
    on_close: Callable[[str], object] | None = None
    _logged_at: dict[str, float] = field(default_factory=dict)

    def count(self, reason: str, source: str) -> None:
        """One connection closed for ``reason``; logged at most once a LOG_EVERY_S."""
        self.closed[reason] += 1
        if self.on_close is not None:
            self.on_close(reason)
        now = time.monotonic()
        if now - self._logged_at.get(reason, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged_at[reason] = now
            log.warning(
                "HTTP: closed a connection from %s (%s; %d so far)",
                source,
                reason,
                self.closed[reason],
            )


def guarded_http_protocol(
    stats: HttpGuardStats,
    *,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    max_per_source: int = DEFAULT_MAX_PER_SOURCE,
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the deadlines and the cap (0: no cap)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _source: str | None = None

        def _arm(self, seconds: float, reason: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expired, reason)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self, reason: str) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                stats.count(reason, self._source or "?")
                self.transport.close()

        def _release_source(self) -> None:
            source, self._source = self._source, None
            if source is not None:
                stats.open_by_source[source] -= 1
                if stats.open_by_source[source] <= 0:
                    del stats.open_by_source[source]

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            source = self.client[0] if self.client else "?"
            if max_per_source and stats.open_by_source[source] >= max_per_source:
                stats.count("too_many_from_source", source)
                transport.close()
                return
            self._source = source
            stats.open_by_source[source] += 1
            self._arm(header_timeout_s, "header_timeout")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._release_source()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:  # the next request of a kept-alive connection
                self._arm(header_timeout_s, "header_timeout")

        def on_headers_complete(self) -> None:
            self._arm(body_timeout_s, "body_timeout")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            # The WebSocket protocol owns the connection from here (with its own pings).
            self._disarm()
            self._release_source()
            super().handle_websocket_upgrade()

    return GuardedHttpToolsProtocol
