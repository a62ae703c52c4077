"""The ``CallEdge`` of the media streams that carry JSON text frames (Twilio, Telnyx, Plivo).

Each provider's sans-I/O codec renders a core command as one text frame; this edge
sends it on the provider's socket and closes the socket when the call ends (the
provider then runs out of instructions and hangs up). A socket already gone turns
sends into no-ops, never errors for the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from rutster.base.ws_close import CLOSE_NORMAL, MAX_CLOSE_REASON_CHARS
from rutster.protocols.ingress import IngressCommand


class TextStreamEdge:
    """Sends core commands, encoded by ``encode``, as text frames on ``websocket``."""

    def __init__(self, websocket: WebSocket, encode: Callable[[IngressCommand], str]) -> None:
        self._ws = websocket
        self._encode = encode
        self.closed = False

    async def send(self, command: IngressCommand) -> None:
        """Encode and send; a socket that is already gone makes this a no-op."""
        if self.closed:
            return
        try:
            await self._ws.send_text(self._encode(command))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True

    async def close(self, reason: str) -> None:
        """Close the media socket (normal closure, ``reason`` shortened to fit)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._ws.close(CLOSE_NORMAL, reason[:MAX_CLOSE_REASON_CHARS])
