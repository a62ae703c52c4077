"""A stand-in for the load balancer in front of several gateway nodes (tests only).

A TCP proxy on a loopback port that sends each connection to a node chosen from its
first bytes: HTTP requests (``POST`` webhooks, REST calls) to one node, WebSocket
upgrades (``GET``) to another. Every node's ``RUTSTER_PUBLIC_URL`` is the proxy's
URL, as behind a real balancer, so Twilio's signatures (made over the public URL)
verify on whichever node a request lands.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from rutster.tools.launcher import LOOPBACK

#: Bytes read to choose a node: the request method and a space.
_PEEK_BYTES = 5
#: Read size while relaying.
_CHUNK = 65_536


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


class SplitProxy:
    """Connections whose request starts with ``GET`` go to ``get_port``, others to
    ``other_port`` (both may be set after the proxy starts: they are read per
    connection)."""

    def __init__(self, *, get_port: int, other_port: int) -> None:
        self.get_port, self.other_port = get_port, other_port
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readexactly(_PEEK_BYTES)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        port = self.get_port if head.startswith(b"GET ") else self.other_port
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, port)
        except OSError:
            writer.close()
            return
        up_writer.write(head)
        await asyncio.gather(_relay(reader, up_writer), _relay(up_reader, writer))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SplitProxy]:
        """Listen on a free loopback port until the block ends."""
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
