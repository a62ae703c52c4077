"""The media leg of the streams that carry JSON text frames (Twilio, Telnyx, Plivo, Vonage).

Those providers differ in their codecs (``trunk/<provider>/codec.py``), not in how a
leg runs: frames decoded by the codec (text only, unless the provider sends audio
in binary frames: Vonage); each core command encoded as one frame, text or binary
(Vonage's audio), and sent (:class:`TextStreamEdge`, which closes the socket when
the call ends: the provider then runs out of instructions and hangs up); the
stream's parameters (brain URL, spend context, stream token) read from the
custom parameters the provider's answer gave it (:func:`custom_stream_params`).
A provider with messages of its own subclasses :class:`TextMediaLeg`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from rutster.base.stream_token import PARAM_TOKEN
from rutster.base.ws_close import CLOSE_NORMAL, MAX_CLOSE_REASON_CHARS
from rutster.gateway.call import Call
from rutster.gateway.ingress_provider import StreamParams
from rutster.gateway.media_session import StreamEnded
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.state import GatewayState
from rutster.protocols.call_control import ProviderCallControl
from rutster.protocols.ingress import IngressCommand, StreamStarted

#: The stream parameter carrying the brain URL chosen at webhook time (bound into the
#: stream token), under this name on every text-frame provider.
PARAM_TAP_URL = "tap_url"


class TextStreamCodec(Protocol):
    """A provider's sans-I/O stream codec, as a text leg drives it."""

    def receive(self, text: str, /) -> object:
        """One text frame in, an ingress event (or a provider message) out."""

    def encode(self, command: IngressCommand) -> str | bytes:
        """One core command as a text frame (or a binary one: Vonage's audio)."""


class TextStreamEdge:
    """Sends core commands, encoded by ``encode``, as frames on ``websocket``."""

    def __init__(
        self, websocket: WebSocket, encode: Callable[[IngressCommand], str | bytes]
    ) -> None:
        self._ws = websocket
        self._encode = encode
        self.closed = False

    async def send(self, command: IngressCommand) -> None:
        """Encode and send; a socket that is already gone makes this a no-op."""
        if self.closed:
            return
        frame = self._encode(command)
        try:
            if isinstance(frame, bytes):
                await self._ws.send_bytes(frame)
            else:
                await self._ws.send_text(frame)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True

    async def close(self, reason: str) -> None:
        """Close the media socket (normal closure, ``reason`` shortened to fit)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._ws.close(CLOSE_NORMAL, reason[:MAX_CLOSE_REASON_CHARS])


class TextMediaLeg:
    """One text-frame media socket (``MediaLeg``): ``codec`` parses and renders,
    ``call_control`` hangs up and transfers (None: closing the socket is all)."""

    binary_frames = False

    def __init__(
        self,
        websocket: WebSocket,
        codec: TextStreamCodec,
        call_control: ProviderCallControl | None,
    ) -> None:
        self._codec = codec
        self._edge = TextStreamEdge(websocket, codec.encode)
        self._call_control = call_control

    @property
    def edge(self) -> TextStreamEdge:
        """Encodes commands with the codec and sends them."""
        return self._edge

    def decode(self, frame: str | bytes) -> object:
        """Text frames only: the socket reader drops binary ones for this leg (a leg
        that takes them, Vonage's, overrides this)."""
        assert isinstance(frame, str)
        return self._codec.receive(frame)

    @property
    def call_control(self) -> ProviderCallControl | None:
        """The provider's REST call control, when configured."""
        return self._call_control

    def attach(self, context: SpendContext) -> None:
        """Nothing to register."""

    async def on_message(self, message: object, call: Call | None) -> StreamEnded | None:
        """A provider message the core needs nothing from."""
        return None

    def detach(self, context: SpendContext) -> None:
        """Nothing to unregister."""

    def stream_ended(self) -> None:
        """Nothing waits on the socket."""


def custom_stream_params(started: StreamStarted, state: GatewayState) -> StreamParams:
    """The stream's brain URL, spend context and token, from its custom parameters."""
    params = started.custom_parameters
    return StreamParams(
        tap_url=params.get(PARAM_TAP_URL) or state.config.tap_url,
        spend_text=params.get(PARAM_SPEND, ""),
        token=params.get(PARAM_TOKEN),
    )
