"""A brain's listening socket for the core's tap connections.

Every Python brain listens the same way: one WebSocket path (others get 404),
frames bounded by the tap's :data:`~protocols.tap.MAX_MESSAGE_BYTES`, no
permessage-deflate, port 0 allowed for tests. :class:`TapListener` is that
part; the brains supply the per-connection handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from rutster.brains.bind import ws_url
from rutster.protocols.tap import MAX_MESSAGE_BYTES


class TapListener:
    """Listens on one path and hands each tap connection to ``handler``."""

    def __init__(
        self, path: str, handler: Callable[[ServerConnection], Awaitable[None]], *, label: str
    ) -> None:
        self.path = path
        self._handler = handler
        self._label = label
        self._server: Server | None = None
        self._host = ""
        self._port = 0

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._server is not None

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0: the OS picks one; see :attr:`url`)."""
        if self._server is not None:
            raise RuntimeError(f"{self._label} already started")
        self._server = await serve(
            self._handler,
            host,
            port,
            max_size=MAX_MESSAGE_BYTES,
            # base64 PCM gains little from permessage-deflate and costs CPU
            # on the hot path; the peers are on a LAN or the same host.
            compression=None,
            process_request=self._reject_other_paths,
        )
        self._host = host
        self._port = int(next(iter(self._server.sockets)).getsockname()[1])

    @property
    def url(self) -> str:
        """The URL the core dials, e.g. ``ws://127.0.0.1:8081/echo``."""
        if self._server is None:
            raise RuntimeError(f"{self._label} not started")
        return ws_url(self._host, self._port, self.path)

    async def stop(self) -> None:
        """Close every connection and stop listening (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def _reject_other_paths(
        self, connection: ServerConnection, request: Request
    ) -> Response | None:
        if urlsplit(request.path).path != self.path:
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        return None
