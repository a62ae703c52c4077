"""Telnyx media streaming (TeXML ``<Connect><Stream>``) as an ingress provider.

The sans-I/O pieces are in ``trunk/telnyx/`` (stream codec, Ed25519 signatures,
TeXML); this module is the gateway adapter of the registry
(``gateway/providers/__init__.py``):

- ``POST /telnyx/voice``: the number's TeXML application's voice URL. The body's
  Ed25519 signature is checked when ``TELNYX_PUBLIC_KEY`` is set, the call is
  admitted through the spend gate, and the answer is TeXML ``<Connect><Stream>``
  back to ``/telnyx/stream`` carrying the call context and a per-call stream token
  (``<Reject>`` or ``<Say>`` when the gate refused the call). The token binds the
  webhook's ``CallControlId``, which the stream's ``start`` must carry.
- ``/telnyx/stream`` (the media WebSocket, served by ``gateway/media_socket.py``):
  Telnyx does not sign the upgrade (docs/PROVIDERS.md §2.5); the stream token
  proves the call. Where Telnyx puts the ``<Parameter>``s on the socket is not
  documented (§7 item 4), so the same parameters also ride on the stream URL's
  query string, and the codec takes either.

Hang-up and transfer go through Telnyx's Call Control API on the stream's
``call_control_id`` when ``TELNYX_API_KEY`` is set (``trunk/telnyx/call_control.py``);
without it, ending the call closes the media socket (Telnyx then runs out of TeXML
and hangs up) and there is no transfer. ``POST /v1/calls`` places Telnyx calls
through the TeXML application ``TELNYX_CONNECTION_ID`` names: Telnyx fetches
``/telnyx/voice?rutster_call=<id>`` once the callee answers.

Settings (read from the gateway's environment, ``GatewayConfig.env``):
``TELNYX_PUBLIC_KEY`` (or ``TELNYX_PUBLIC_KEY_FILE``), the account's base64
Ed25519 public key from the Mission Control portal; ``TELNYX_API_KEY`` (or
``_FILE``) for call control, and ``TELNYX_API_BASE_URL``. Unset, Telnyx webhooks are
refused on a gateway that checks signatures (``TWILIO_AUTH_TOKEN`` set), and taken
unchecked only in dev mode, which the gateway warns about at startup.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.websockets import WebSocket

from rutster.base.env_values import ConfigError, env_http_url, read_secret
from rutster.base.stream_token import PARAM_TOKEN
from rutster.gateway.admission import (
    PLACED_CALL_ANSWER_WAIT_S,
    QUERY_BRAIN,
    QUERY_CALL,
    REASON_UNKNOWN_PLACED_CALL,
    REFUSAL_SAY_TEXT,
    Refused,
    admit_call,
    answered_placed_call,
    grant_stream,
    hang_up_quietly,
    inbound_brain,
    webhook_admission,
)
from rutster.gateway.call import Call
from rutster.gateway.config import public_http_url, public_ws_url
from rutster.gateway.ingress_provider import (
    CPAAS_STAND_IN_RATES,
    DialFailed,
    MediaLeg,
    ProviderCapabilities,
    StreamParams,
)
from rutster.gateway.media_session import StreamEnded, release_if_never_connected
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.state import GatewayState
from rutster.gateway.text_stream_leg import PARAM_TAP_URL, TextMediaLeg, custom_stream_params
from rutster.gateway.webhook_forms import read_form
from rutster.protocols.call_control import CallControlFailure
from rutster.protocols.ingress import StreamStarted
from rutster.spend.store import CallRecord
from rutster.trunk.telnyx.call_control import TELNYX_API_BASE_URL, TelnyxCallControl
from rutster.trunk.telnyx.codec import (
    PARAM_DIRECTION,
    PROVIDER,
    FrameHeld,
    TelnyxStreamCodec,
    TelnyxStreamError,
    sniff_telnyx_stream,
)
from rutster.trunk.telnyx.signature import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TelnyxSignatureVerifier,
)
from rutster.trunk.telnyx.texml import (
    connect_stream_texml,
    reject_texml,
    say_hangup_texml,
)
from rutster.trunk.xml_documents import xml_can_carry

log = logging.getLogger(__name__)

#: Its endpoints.
VOICE_PATH = "/telnyx/voice"
MEDIA_PATH = "/telnyx/stream"
#: The environment variables of this provider: the account's Ed25519 public key
#: (base64), its Call Control API key, and the API's base URL (tests: a local fake).
ENV_PUBLIC_KEY = "TELNYX_PUBLIC_KEY"
ENV_API_KEY = "TELNYX_API_KEY"
ENV_API_BASE_URL = "TELNYX_API_BASE_URL"
#: The TeXML application (its connection id) outbound calls are placed through.
ENV_CONNECTION_ID = "TELNYX_CONNECTION_ID"
#: TeXML webhook fields (Twilio-style names, docs/PROVIDERS.md §2.1): the call's Call
#: Control id, which the stream's ``start.call_control_id`` repeats and the stream
#: token binds; and who placed the call.
FIELD_CALL_CONTROL_ID = "CallControlId"
FIELD_FROM = "From"
FIELD_TO = "To"
FIELD_DIRECTION = "Direction"
#: Longest ``CallControlId`` accepted (Telnyx's are ``v3:`` + ~60 URL-safe characters,
#: docs/PROVIDERS.md §2.3 example; 128 leaves margin and bounds what reaches the token).
MAX_CALL_CONTROL_ID_CHARS = 128
#: The ``direction`` parameter of a call the REST API placed (Twilio's ``Direction`` value).
OUTBOUND_API = "outbound-api"
#: Metrics labels of this provider's webhooks and stream.
SOURCE_WEBHOOK = "telnyx_webhook"


@dataclass(frozen=True, slots=True)
class TelnyxSettings:
    """This provider's settings, read from the gateway's environment."""

    #: Checks webhook signatures (None: ``TELNYX_PUBLIC_KEY`` unset).
    verifier: TelnyxSignatureVerifier | None
    #: Call Control API key (None: ``TELNYX_API_KEY`` unset, no REST call control).
    api_key: str | None = field(default=None, repr=False)
    api_base_url: str = TELNYX_API_BASE_URL
    #: The TeXML application outbound calls use (None: ``TELNYX_CONNECTION_ID`` unset).
    connection_id: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TelnyxSettings:
        """Raises :class:`ConfigError` for a key that is not a base64 Ed25519 public key
        or an API base URL that is not http(s)."""
        key = read_secret(env, ENV_PUBLIC_KEY)
        try:
            verifier = None if key is None else TelnyxSignatureVerifier(key)
        except ValueError as exc:
            raise ConfigError(f"{ENV_PUBLIC_KEY}: {exc}") from None
        base = env_http_url(env, ENV_API_BASE_URL, TELNYX_API_BASE_URL)
        return cls(
            verifier=verifier,
            api_key=read_secret(env, ENV_API_KEY),
            api_base_url=base,
            connection_id=env.get(ENV_CONNECTION_ID, "").strip() or None,
        )


@dataclass
class TelnyxAppState:
    """What this provider keeps per app (``GatewayState.provider_state["telnyx"]``)."""

    settings: TelnyxSettings
    call_control: TelnyxCallControl | None = None


def telnyx_state(state: GatewayState) -> TelnyxAppState:
    """This app's Telnyx settings and REST client (read once, at startup)."""
    kept = state.provider_state.get(PROVIDER)
    if not isinstance(kept, TelnyxAppState):
        kept = TelnyxAppState(TelnyxSettings.from_env(state.config.env))
        state.provider_state[PROVIDER] = kept
    return kept


def _stream_url(state: GatewayState, parameters: Mapping[str, str]) -> str:
    """The media socket's URL with the stream's parameters in its query string."""
    return public_ws_url(state.config.public_url, MEDIA_PATH) + "?" + urlencode(parameters)


async def telnyx_voice(request: Request) -> Response:
    """The TeXML voice webhook: answer ``<Connect><Stream>`` to ``/telnyx/stream``."""
    state: GatewayState = request.app.state.gateway
    config = state.config
    metrics = state.metrics
    form = await read_form(request, metrics, SOURCE_WEBHOOK)
    if isinstance(form, Response):
        return form
    verifier = telnyx_state(state).settings.verifier
    if verifier is None and config.signatures_enforced:
        # A secured gateway (Twilio's token set) must not leave this door unlocked:
        # without the Telnyx key nothing proves a webhook came from Telnyx.
        metrics.signature_failures.labels("telnyx_voice").inc()
        log.warning("Telnyx voice webhook refused: %s is not set", ENV_PUBLIC_KEY)
        return PlainTextResponse(f"Telnyx webhooks need {ENV_PUBLIC_KEY} on this gateway", 403)
    if verifier is not None:
        verdict = verifier.verify(
            form.body,
            request.headers.get(SIGNATURE_HEADER),
            request.headers.get(TIMESTAMP_HEADER),
            now_s=time.time(),
        )
        if not verdict.ok:
            metrics.signature_failures.labels("telnyx_voice").inc()
            log.warning("Telnyx voice webhook refused: signature %s", verdict.reason)
            return PlainTextResponse("invalid signature", 403)
    fields = dict(form.fields)
    call_control_id = fields.get(FIELD_CALL_CONTROL_ID, "")
    if not call_control_id or len(call_control_id) > MAX_CALL_CONTROL_ID_CHARS:
        metrics.bad_messages.labels(SOURCE_WEBHOOK, "bad_call_control_id").inc()
        return PlainTextResponse(f"missing or malformed {FIELD_CALL_CONTROL_ID}", 400)
    for party in (FIELD_FROM, FIELD_TO, FIELD_DIRECTION, FIELD_CALL_CONTROL_ID):
        if not xml_can_carry(fields.get(party, "")):
            metrics.bad_messages.labels(SOURCE_WEBHOOK, "bad_party").inc()
            return PlainTextResponse(f"{party} holds a character XML cannot carry", 400)
    to = fields.get(FIELD_TO, "")
    placed = request.query_params.get(QUERY_CALL)
    if placed is not None:
        found = await answered_placed_call(state, placed, call_control_id)
        if isinstance(found, Refused):
            if found.reason == REASON_UNKNOWN_PLACED_CALL:
                metrics.bad_messages.labels(SOURCE_WEBHOOK, "unknown_placed_call").inc()
            return _refusal(state)
        context, tap_url = found
    else:
        chosen = inbound_brain(state, request.query_params.get(QUERY_BRAIN), to)
        if chosen is None:
            return PlainTextResponse("brain URL not allowed", 403)
        tap_url = chosen
    if not config.tap_allowlist.allows(tap_url):  # a placed call's brain, checked again
        metrics.tap_url_rejections.inc()
        return PlainTextResponse("brain URL not allowed", 403)
    if placed is None:
        wanted = webhook_admission(
            state,
            provider=PROVIDER,
            provider_call_id=call_control_id,
            from_=fields.get(FIELD_FROM, ""),
            to=to,
            direction=fields.get(FIELD_DIRECTION, ""),
            tap_url=tap_url,
        )
        admitted = await admit_call(state, wanted)
        if isinstance(admitted, Refused):
            return _refusal(state)
        context = admitted
    grant = grant_stream(state, context, stream_call_id=call_control_id, tap_url=tap_url)
    direction = OUTBOUND_API if placed is not None else fields.get(FIELD_DIRECTION, "inbound")
    parameters = {
        PARAM_DIRECTION: direction,
        PARAM_TAP_URL: tap_url,
        PARAM_SPEND: grant.spend_text,
        PARAM_TOKEN: grant.token,
    }
    texml = connect_stream_texml(_stream_url(state, parameters), parameters)
    return Response(texml, media_type="text/xml")


def _refusal(state: GatewayState) -> Response:
    kind = state.config.spend.refusal_response
    if kind == "say":
        texml = say_hangup_texml(REFUSAL_SAY_TEXT)
    else:
        texml = reject_texml("busy" if kind == "busy" else "rejected")
    return Response(texml, media_type="text/xml")


class TelnyxMediaLeg(TextMediaLeg):
    """One ``/telnyx/stream`` socket: held frames and Telnyx's ``error`` messages are
    provider messages handled here."""

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        self._telnyx = TelnyxStreamCodec(url_parameters=dict(websocket.query_params))
        super().__init__(websocket, self._telnyx, telnyx_state(state).call_control)
        self._metrics = state.metrics

    async def on_message(self, message: object, call: Call | None) -> StreamEnded | None:
        """A frame held for reordering (nothing to do yet), or Telnyx's ``error``."""
        if isinstance(message, TelnyxStreamError):
            self._metrics.bad_messages.labels(PROVIDER, "provider_error").inc()
            log.warning("Telnyx stream error %s (%s)", message.code, message.title)
        elif not isinstance(message, FrameHeld):
            log.debug("Telnyx media: ignored %s", type(message).__name__)
        return None

    def detach(self, context: SpendContext) -> None:
        """Reordering losses go to the log."""
        if self._telnyx.frames_skipped:
            log.info(
                "Telnyx stream %s: %d media frames lost (gaps skipped), %d reordered",
                self._telnyx.stream_id,
                self._telnyx.frames_skipped,
                self._telnyx.frames_reordered,
            )


class TelnyxProvider:
    """Telnyx media streaming through a TeXML application (inbound calls)."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="stops playback and flushes Telnyx's queue; the marks queued behind it come "
        "back (docs/PROVIDERS.md §2.4)",
        wire_format="PCMU 8 kHz (RTP payloads), base64 in JSON text frames; media may arrive "
        "out of order and is put back in order by chunk",
        dials_sip_uris=False,
        outbound=True,
    )
    #: Not checked against its price list: the stand-in (gateway/ingress_provider.py).
    default_rates = CPAAS_STAND_IN_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The TeXML voice webhook."""
        return [Route(VOICE_PATH, telnyx_voice, methods=["POST"])]

    async def startup(self, state: GatewayState) -> None:
        """Read the settings now (a bad one stops the gateway at once); open the REST
        client when ``TELNYX_API_KEY`` is set."""
        kept = telnyx_state(state)
        settings = kept.settings
        if settings.verifier is None and not state.config.signatures_enforced:
            # The gateway's DEV MODE warning is Twilio's; this door is Telnyx's own.
            log.warning(
                "DEV MODE: %s is not set, so /telnyx/voice takes UNSIGNED webhooks. Set it "
                "(the Telnyx portal's public key) before exposing this gateway.",
                ENV_PUBLIC_KEY,
            )
        if settings.api_key is not None:
            kept.call_control = TelnyxCallControl(settings.api_key, base_url=settings.api_base_url)

    async def shutdown(self, state: GatewayState) -> None:
        """Close the REST client :meth:`startup` opened."""
        kept = telnyx_state(state)
        if kept.call_control is not None:
            await kept.call_control.aclose()
            kept.call_control = None

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """Telnyx signs no upgrade: the stream token in the parameters proves the call."""
        return None

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """A fresh codec, given the socket URL's parameters, and its edge."""
        return TelnyxMediaLeg(websocket, state)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The parameters our TeXML gave the stream (URL query or ``<Parameter>``s)."""
        return custom_stream_params(started, state)

    def sniff(self, first_message: str | bytes) -> bool:
        """Telnyx's ``connected`` (a version, no protocol) or ``start`` (``stream_id``)."""
        return sniff_telnyx_stream(first_message)

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Placing calls needs the API key and the TeXML application's connection id."""
        kept = telnyx_state(state)
        if kept.call_control is None or kept.settings.connection_id is None:
            return (
                f"outbound Telnyx calls need {ENV_API_KEY} and {ENV_CONNECTION_ID} on the gateway"
            )
        return None

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Place the call through the TeXML application; Telnyx fetches our voice URL
        (``?rutster_call=``) once it is answered. Held while it rings; cancelled and
        settled at zero if no answer comes within :data:`PLACED_CALL_ANSWER_WAIT_S`."""
        kept = telnyx_state(state)
        control, connection_id = kept.call_control, kept.settings.connection_id
        if control is None or connection_id is None:
            raise DialFailed("Telnyx call control is not configured")
        query = urlencode({QUERY_CALL: context.call_id})
        url = public_http_url(state.config.public_url, VOICE_PATH) + "?" + query
        try:
            call_control_id = await control.create_texml_call(
                connection_id, to=to, from_=from_, url=url
            )
        except CallControlFailure as exc:
            log.warning("call %s: Telnyx refused to place it (%s)", context.call_id, exc.reason)
            raise DialFailed(f"Telnyx did not place the call ({exc.reason})") from None
        give_up = functools.partial(hang_up_quietly, control, context.call_id, call_control_id)
        state.watch_media_connect(
            context.call_id,
            release_if_never_connected(
                state,
                context.call_id,
                PLACED_CALL_ANSWER_WAIT_S,
                reason="no_answer",
                give_up=give_up,
            ),
        )
        return call_control_id

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Hang up a placed call (ringing or answered); one already over is fine."""
        control = telnyx_state(state).call_control
        call_control_id = record["provider_call_id"]
        if not call_control_id or control is None:
            return
        try:
            await control.hang_up(call_control_id)
        except CallControlFailure as exc:
            if exc.reason != "already_ended":
                raise
