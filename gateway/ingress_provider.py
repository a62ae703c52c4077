"""The contract every way a call arrives implements: one ``IngressProvider`` per provider.

The gateway core knows no provider by name. What differs between Twilio Media
Streams, SIP legs from the workers and the providers to come is gathered in one
object per provider, listed once in the registry (``gateway/providers/__init__.py``):

- its HTTP and WebSocket endpoints other than the media socket (webhooks, a
  worker control channel), which turn what the provider says into an
  :class:`~spend.gate.AdmissionRequest` for the one admission path
  (``gateway/admission.py``);
- its media socket, served by the one handler ``gateway/media_socket.py``
  ``serve_media_socket``: the provider supplies how to authorise the upgrade,
  a sans-I/O stream codec (``decode`` of frames, an edge that encodes commands)
  and where the stream's ``start`` carries the brain URL, call context and
  stream token;
- its call control (hang up, transfer) and, for the REST API, how it places,
  cancels and describes an outbound call;
- its :class:`ProviderCapabilities`, a :meth:`IngressProvider.sniff` that
  recognises its first media message (auto-detection), and its price key.

Provider-specific, sans-I/O pieces (codecs, signatures, wire schemas) live in
``trunk/<provider>/``; the adapter implementing this contract lives in
``gateway/providers/<provider>.py`` because it owns ASGI handlers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from starlette.routing import BaseRoute
from starlette.websockets import WebSocket

from rutster.protocols.call_control import ProviderCallControl
from rutster.protocols.ingress import StreamStarted
from rutster.spend.prices import (
    TWILIO_BILLING_INCREMENT_S,
    TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE,
    TWILIO_US_INBOUND_MICROS_PER_MINUTE,
    TWILIO_US_OUTBOUND_MICROS_PER_MINUTE,
    TelephonyRate,
)

if TYPE_CHECKING:
    from rutster.gateway.call import Call, CallEdge
    from rutster.gateway.media_session import StreamEnded
    from rutster.gateway.spend_context import SpendContext
    from rutster.gateway.state import GatewayState
    from rutster.spend.store import CallRecord


#: Rates by direction (``inbound``, ``outbound`` or ``*``), per minute and increment.
Rates = Mapping[str, TelephonyRate]
#: No rates of a provider's own: its price is in the built-in table (``spend/prices.py``),
#: or in the operator's price file.
NO_RATES: Rates = MappingProxyType({})
#: The built-in price of a CPaaS whose price list was not checked: Twilio's US rates with
#: its Media Streams surcharge, per started minute (seed decision: a stand-in of the right
#: order, until the operator's price file, ``RUTSTER_PRICES_FILE``, gives theirs).
CPAAS_STAND_IN_RATES: Rates = MappingProxyType(
    {
        "inbound": TelephonyRate(
            TWILIO_US_INBOUND_MICROS_PER_MINUTE + TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE,
            TWILIO_BILLING_INCREMENT_S,
        ),
        "outbound": TelephonyRate(
            TWILIO_US_OUTBOUND_MICROS_PER_MINUTE + TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE,
            TWILIO_BILLING_INCREMENT_S,
        ),
    }
)


@dataclass(frozen=True, slots=True)
class ProviderCapabilities:
    """What a provider's media stream and call control can do (documentation and checks).

    ``playback_marks``: the provider echoes a mark once the audio before it has
    played (Twilio ``mark``; the SIP worker's ``mark``), so ``played_ms`` is
    known from the far end. ``clear``: what a ``clear`` command does there.
    ``wire_format``: the audio on the media socket. ``dials_sip_uris``: an
    outbound call's ``to`` may be a ``sip:`` URI, not only an E.164 number.
    ``outbound``: the REST API can place calls through it.
    """

    playback_marks: bool
    clear: str
    wire_format: str
    dials_sip_uris: bool
    outbound: bool


@dataclass(frozen=True, slots=True)
class StreamParams:
    """What a stream's verified ``start`` says about its call: read by the provider from
    its own message fields, checked by the one token check (``trusted_context``)."""

    tap_url: str
    spend_text: str
    token: str | None


class DialFailed(Exception):
    """The provider did not place an outbound call; the message is safe for API clients."""


class MediaLeg(Protocol):
    """One media socket as its provider speaks it, from accept to close."""

    @property
    def edge(self) -> CallEdge:
        """Sends the core's commands to the provider (and closes the socket)."""

    @property
    def binary_frames(self) -> bool:
        """True when binary frames carry audio; otherwise they are counted and dropped."""

    def decode(self, frame: str | bytes) -> object:
        """One frame in, one ingress event (or provider message) out; raises
        ``IngressProtocolError``/``UnknownIngressEvent`` as the codecs do."""

    @property
    def call_control(self) -> ProviderCallControl | None:
        """Hang-up and transfer for this call (None: closing the socket is all there is)."""

    def attach(self, context: SpendContext) -> None:
        """The stream is trusted and its call about to start."""

    async def on_message(self, message: object, call: Call | None) -> StreamEnded | None:
        """A decoded message that is not an ingress event; ``StreamEnded`` ends the call."""

    def detach(self, context: SpendContext) -> None:
        """The call is over (always called after :meth:`attach`)."""

    def stream_ended(self) -> None:
        """The socket closed or broke the protocol: fail what still waits on it."""


class IngressProvider(Protocol):
    """One way calls arrive (see the module docstring); a registry entry."""

    #: The provider's name: recorded on its calls, a metrics label, the REST API's
    #: ``provider`` value, and its price key (``spend/prices.py`` telephony table).
    name: str
    #: The media socket's path, served by ``gateway/media_socket.py``.
    media_path: str
    capabilities: ProviderCapabilities
    #: Its telephony rates in the built-in price table, by direction: how a provider
    #: brings its price with it. An operator's price file replaces them all.
    default_rates: Rates

    def routes(self) -> Sequence[BaseRoute]:
        """Its endpoints other than the media socket (webhooks, control channels)."""

    async def startup(self, state: GatewayState) -> None:
        """The app starts: open what the provider needs (a REST client, ...)."""

    async def shutdown(self, state: GatewayState) -> None:
        """The app stops, its calls already ended: close what :meth:`startup` opened."""

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """Check the media socket's upgrade: None, or why it is refused (policy close)."""

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """A new media leg on an accepted socket of ``state``'s app (a fresh codec)."""

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The brain URL, call context and stream token the ``start`` carries."""

    def sniff(self, first_message: str | bytes) -> bool:
        """True when ``first_message`` (a media socket's first frame) is this provider's."""

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Why the REST API cannot place a call through it now (None: it can)."""

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Place an admitted outbound call; its ``provider_call_id``. Raises
        :class:`DialFailed`. The provider also watches it until its media connects."""

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Cancel a placed call that has not connected (best effort for calls already
        gone); raises ``CallControlFailure`` when the provider refused."""


class InboundOnly:
    """For a provider that answers calls but does not place them yet: the REST API's
    outbound methods of :class:`IngressProvider`, refusing with a clear reason."""

    name: str

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Always: this provider's calls are not placed yet."""
        label = self.name.capitalize()
        return f"outbound {label} calls are not supported yet (rutster answers {label} calls)"

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Never reached (:meth:`outbound_unavailable` always refuses)."""
        raise DialFailed(f"outbound {self.name.capitalize()} calls are not supported yet")

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Nothing to cancel: no call of this provider is ever placed."""
