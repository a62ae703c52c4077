"""Faults of an unauthenticated peer: counted and logged as one line, never a traceback.

Two ways a peer's fault reached the log as a traceback (issue 14, finding 8):

- an HTTP client that disconnects mid-body raises Starlette's
  ``ClientDisconnect`` out of the route that reads the body (a ~40-line
  "Exception in ASGI application");
- a WebSocket text frame that is not UTF-8 is caught inside uvicorn, which
  closes 1007 (RFC 6455 §8.1) and logs the ``UnicodeDecodeError`` with its
  traceback.

Nothing is wrong with the gateway in either case, and an attacker can cause
either at will: :class:`ClientDisconnectGuard` and
:class:`InvalidUtf8LogFilter` turn each into a count in
``rutster_bad_messages_total`` and one log line.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

#: uvicorn's logger for protocol errors (uvicorn.config.LOGGING_CONFIG).
UVICORN_ERROR_LOGGER = "uvicorn.error"


class ClientDisconnectGuard:
    """ASGI middleware: an HTTP client gone mid-request ends the request quietly.

    Nothing can be answered to a client that has gone, so nothing is sent;
    the disconnect is counted as ``bad_messages{http, client_disconnect}``.
    WebSocket and lifespan scopes pass straight through.
    """

    def __init__(self, app: ASGIApp, *, bad_messages: Counter) -> None:
        self.app = app
        self._counter = bad_messages.labels("http", "client_disconnect")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            self._counter.inc()
            log.info("%s %s: the client disconnected mid-request", scope["method"], scope["path"])


class InvalidUtf8LogFilter(logging.Filter):
    """On uvicorn's error logger: a non-UTF-8 WebSocket frame is one line and a count.

    uvicorn has already closed the socket 1007; the record keeps its message
    and loses its traceback, and ``bad_messages{websocket, bad_utf8}`` counts it.
    """

    def __init__(self, bad_messages: Counter) -> None:
        super().__init__()
        self._counter = bad_messages.labels("websocket", "bad_utf8")

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info and isinstance(info[1], UnicodeDecodeError):
            self._counter.inc()
            record.exc_info = None
            record.exc_text = None
            record.msg = f"{record.getMessage()} (closed 1007)"
            record.args = None
            # The peer's fault, not the gateway's: a warning, as other bad input is.
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
