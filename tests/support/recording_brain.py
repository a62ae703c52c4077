"""A loopback tap brain that echoes audio and records every core event: the e2e tests' brain.

Tests subclass :class:`RecordingBrain` to script answers (tool calls, usage, transfers)
and read what the core sent it with :meth:`RecordingBrain.of_type`.
"""

from __future__ import annotations

import contextlib
from typing import Self

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from rutster.protocols.tap import (
    AudioIn,
    AudioOut,
    Direction,
    Dtmf,
    FunctionCall,
    Hello,
    TapDecoder,
    TapEncoder,
    ToolsUpdate,
)
from rutster.protocols.tool_catalog import TRANSFER_TOOL


class RecordingBrain:
    """A loopback brain that echoes audio like the echo brain and records every core event.

    Subclasses change how it answers by overriding :meth:`respond`.
    """

    def __init__(self) -> None:
        self.events: list[object] = []
        self.url = ""
        self._server: Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await serve(self._handle, "127.0.0.1", 0, compression=None)
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/recording"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        encoder = TapEncoder(start_ms=0.0)
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                event = decoder.decode(message)
                self.events.append(event)
                # A reply fails once the core's close has arrived (it sends session_end,
                # then closes); the messages before the close are still to be read and
                # recorded, session_end among them: only the reply is given up.
                with contextlib.suppress(ConnectionClosed):
                    await self.respond(ws, encoder, event)

    async def respond(self, ws: ServerConnection, encoder: TapEncoder, event: object) -> None:
        """Answer one core event (here: echo audio back)."""
        if isinstance(event, AudioIn):
            await ws.send(encoder.encode(AudioOut(event.pcm, item="rec"), 0.0))

    def of_type(self, kind: type) -> list[object]:
        return [e for e in self.events if isinstance(e, kind)]


class TransferBrain(RecordingBrain):
    """Offers the transfer tool and transfers the caller to ``destination`` when they press 0."""

    def __init__(self) -> None:
        super().__init__()
        self.destination = ""

    async def respond(self, ws: ServerConnection, encoder: TapEncoder, event: object) -> None:
        if isinstance(event, Hello):
            await ws.send(encoder.encode(ToolsUpdate((TRANSFER_TOOL,)), 0.0))
        elif isinstance(event, Dtmf) and event.digit == "0":
            call = FunctionCall("xfer1", "transfer", {"destination": self.destination})
            await ws.send(encoder.encode(call, 0.0))
        else:
            await super().respond(ws, encoder, event)
