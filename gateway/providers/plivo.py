"""Plivo audio streams (``<Stream bidirectional="true">``) as an ingress provider.

The sans-I/O pieces are in ``trunk/plivo/`` (stream codec, signature V3, XML,
REST hang-up); this module is the gateway adapter of the registry
(``gateway/providers/__init__.py``):

- ``POST /plivo/answer``: the number's application's answer URL. The V3 signature
  is checked with ``PLIVO_AUTH_TOKEN``, the call admitted through the spend gate,
  and the answer is Plivo XML ``<Stream>`` back to ``/plivo/stream`` (``<Hangup
  reason>`` or ``<Speak>`` when the gate refused the call). Plivo passes nothing of
  ours to the socket but its URL (``extraHeaders`` holds 512 alphanumeric bytes,
  §4.2), so the call context and stream token ride in the stream URL's query
  string; the token binds the webhook's ``CallUUID``, which ``start.callId``
  repeats.
- ``/plivo/stream`` (the media WebSocket, served by ``gateway/media_socket.py``):
  the upgrade is not signed (§4.5); the stream token proves the call.

With ``PLIVO_AUTH_ID`` and ``PLIVO_AUTH_TOKEN`` set, Plivo's REST API hangs calls up
(``DELETE …/Call/{uuid}/``), transfers them (the caller's leg is sent to
``/plivo/transfer?to=``, which answers a ``<Dial>`` of an allowlisted destination) and
places them for ``POST /v1/calls`` (answered on ``/plivo/answer?rutster_call=``);
otherwise closing the socket ends the call (``keepCallAlive`` holds it only while the
socket is open) and there is no transfer.

Settings (read from the gateway's environment, ``GatewayConfig.env``):
``PLIVO_AUTH_TOKEN`` (or ``_FILE``) verifies the webhooks; unset, they are refused
on a gateway that checks signatures and taken unchecked only in dev mode.
``PLIVO_AUTH_ID`` and ``PLIVO_API_BASE_URL`` for the REST API.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    inbound_brain,
    webhook_admission,
)
from rutster.gateway.config import public_http_url, public_ws_url
from rutster.gateway.ingress_provider import (
    CPAAS_STAND_IN_RATES,
    DialFailed,
    MediaLeg,
    ProviderCapabilities,
    StreamParams,
)
from rutster.gateway.media_session import release_if_never_connected
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.state import GatewayState
from rutster.gateway.text_stream_leg import PARAM_TAP_URL, TextMediaLeg, custom_stream_params
from rutster.gateway.webhook_forms import WebhookForm, read_form
from rutster.protocols.call_control import CallControlFailure
from rutster.protocols.ingress import StreamStarted
from rutster.spend.store import CallRecord
from rutster.trunk.plivo.call_control import (
    PLIVO_API_BASE_URL,
    PlivoCallControl,
    PlivoCallControlError,
)
from rutster.trunk.plivo.codec import (
    PARAM_DIRECTION,
    PARAM_FROM,
    PARAM_TO,
    PROVIDER,
    PlivoStreamCodec,
    sniff_plivo_stream,
)
from rutster.trunk.plivo.signature import NONCE_HEADER, SIGNATURE_HEADER, PlivoSignatureV3
from rutster.trunk.plivo.xml import dial_xml, hangup_xml, speak_hangup_xml, stream_xml
from rutster.trunk.rest_call_control import callable_destination
from rutster.trunk.xml_documents import xml_can_carry

log = logging.getLogger(__name__)

#: Its endpoints.
ANSWER_PATH = "/plivo/answer"
#: Where Plivo fetches the ``<Dial>`` of a transfer (``?to=``).
TRANSFER_PATH = "/plivo/transfer"
MEDIA_PATH = "/plivo/stream"
#: Its environment variables: the auth token (signatures and REST), the auth id (REST),
#: the REST API's base URL (tests: a local fake).
ENV_AUTH_TOKEN = "PLIVO_AUTH_TOKEN"
ENV_AUTH_ID = "PLIVO_AUTH_ID"
ENV_API_BASE_URL = "PLIVO_API_BASE_URL"
#: Answer webhook fields (docs/PROVIDERS.md §4.1).
FIELD_CALL_UUID = "CallUUID"
FIELD_FROM = "From"
FIELD_TO = "To"
FIELD_DIRECTION = "Direction"
#: The request that placed an outbound call (our ``POST /v1/calls`` record names it):
#: ``RequestUUID``, or ``ALegRequestUUID`` (§4.1).
FIELD_REQUEST_UUID = "RequestUUID"
FIELD_A_LEG_REQUEST_UUID = "ALegRequestUUID"
#: Longest ``CallUUID`` accepted (a UUID is 36 characters; 64 leaves margin).
MAX_CALL_UUID_CHARS = 64
SOURCE_WEBHOOK = "plivo_webhook"


@dataclass(frozen=True, slots=True)
class PlivoSettings:
    """This provider's settings, read from the gateway's environment."""

    signature: PlivoSignatureV3 | None
    call_control: PlivoCallControl | None

    @classmethod
    def from_env(cls, env: Mapping[str, str], public_url: str) -> PlivoSettings:
        """Raises :class:`ConfigError` for an API base URL that is not http(s).
        ``public_url``: the gateway's, for the transfer XML's URL."""
        token = read_secret(env, ENV_AUTH_TOKEN)
        auth_id = env.get(ENV_AUTH_ID, "").strip()
        base = env_http_url(env, ENV_API_BASE_URL, PLIVO_API_BASE_URL)
        transfer_base = public_http_url(public_url, TRANSFER_PATH)
        control = None
        if token and auth_id:
            try:
                control = PlivoCallControl(
                    auth_id,
                    token,
                    base_url=base,
                    transfer_url=lambda to: transfer_base + "?" + urlencode({"to": to}),
                )
            except PlivoCallControlError as exc:
                raise ConfigError(f"{ENV_AUTH_ID}: {exc}") from None
        return cls(signature=PlivoSignatureV3(token) if token else None, call_control=control)


def plivo_settings(state: GatewayState) -> PlivoSettings:
    """This app's Plivo settings and REST client (read once, at startup)."""
    kept = state.provider_state.get(PROVIDER)
    if not isinstance(kept, PlivoSettings):
        kept = PlivoSettings.from_env(state.config.env, state.config.public_url)
        state.provider_state[PROVIDER] = kept
    return kept


async def plivo_answer(request: Request) -> Response:
    """The answer webhook: reply ``<Stream>`` to ``/plivo/stream``."""
    state: GatewayState = request.app.state.gateway
    config = state.config
    metrics = state.metrics
    form = await read_form(request, metrics, SOURCE_WEBHOOK)
    if isinstance(form, Response):
        return form
    refused = _refused_by_signature(state, request, form, ANSWER_PATH)
    if refused is not None:
        return refused
    fields = dict(form.fields)
    call_uuid = fields.get(FIELD_CALL_UUID, "")
    if not call_uuid or len(call_uuid) > MAX_CALL_UUID_CHARS:
        metrics.bad_messages.labels(SOURCE_WEBHOOK, "bad_call_uuid").inc()
        return PlainTextResponse(f"missing or malformed {FIELD_CALL_UUID}", 400)
    for party in (FIELD_FROM, FIELD_TO, FIELD_DIRECTION):
        if not xml_can_carry(fields.get(party, "")):
            metrics.bad_messages.labels(SOURCE_WEBHOOK, "bad_party").inc()
            return PlainTextResponse(f"{party} holds a character XML cannot carry", 400)
    to = fields.get(FIELD_TO, "")
    placed = request.query_params.get(QUERY_CALL)
    if placed is not None:
        # A call POST /v1/calls placed: its record names the request that placed it.
        request_uuid = fields.get(FIELD_REQUEST_UUID) or fields.get(FIELD_A_LEG_REQUEST_UUID, "")
        found = await answered_placed_call(state, placed, request_uuid)
        if isinstance(found, Refused):
            if found.reason == REASON_UNKNOWN_PLACED_CALL:
                metrics.bad_messages.labels(SOURCE_WEBHOOK, "unknown_placed_call").inc()
            return _refusal(state)
        context, tap_url = found
        direction = "outbound"
    else:
        chosen = inbound_brain(state, request.query_params.get(QUERY_BRAIN), to)
        if chosen is None:
            return PlainTextResponse("brain URL not allowed", 403)
        tap_url = chosen
        direction = fields.get(FIELD_DIRECTION, "inbound")
        wanted = webhook_admission(
            state,
            provider=PROVIDER,
            provider_call_id=call_uuid,
            from_=fields.get(FIELD_FROM, ""),
            to=to,
            direction=direction,
            tap_url=tap_url,
        )
        admitted = await admit_call(state, wanted)
        if isinstance(admitted, Refused):
            return _refusal(state)
        context = admitted
    grant = grant_stream(state, context, stream_call_id=call_uuid, tap_url=tap_url)
    parameters = {
        PARAM_FROM: fields.get(FIELD_FROM, ""),
        PARAM_TO: to,
        PARAM_DIRECTION: direction,
        PARAM_TAP_URL: tap_url,
        PARAM_SPEND: grant.spend_text,
        PARAM_TOKEN: grant.token,
    }
    url = public_ws_url(config.public_url, MEDIA_PATH) + "?" + urlencode(parameters)
    return Response(stream_xml(url), media_type="text/xml")


def _refusal(state: GatewayState) -> Response:
    kind = state.config.spend.refusal_response
    if kind == "say":
        return Response(speak_hangup_xml(REFUSAL_SAY_TEXT), media_type="text/xml")
    return Response(hangup_xml("busy" if kind == "busy" else "rejected"), media_type="text/xml")


def _refused_by_signature(
    state: GatewayState, request: Request, form: WebhookForm, path: str
) -> Response | None:
    """The refusal of a webhook whose V3 signature does not hold up (None: it does)."""
    metrics = state.metrics
    signature = plivo_settings(state).signature
    if signature is None:
        if not state.config.signatures_enforced:
            return None
        metrics.signature_failures.labels("plivo_webhook").inc()
        log.warning("Plivo webhook refused: %s is not set", ENV_AUTH_TOKEN)
        return PlainTextResponse(f"Plivo webhooks need {ENV_AUTH_TOKEN} on this gateway", 403)
    url = public_http_url(state.config.public_url, path)
    if request.url.query:
        url += "?" + request.url.query
    params: dict[str, list[str]] = {}
    for name, value in form.fields:
        params.setdefault(name, []).append(value)
    headers = request.headers
    if signature.validate(
        "POST", url, params, headers.get(NONCE_HEADER), headers.get(SIGNATURE_HEADER)
    ):
        return None
    metrics.signature_failures.labels("plivo_webhook").inc()
    log.warning("Plivo webhook refused: invalid %s", SIGNATURE_HEADER)
    return PlainTextResponse("invalid signature", 403)


async def plivo_transfer(request: Request) -> Response:
    """The XML a transfer sends the caller to: ``<Dial>`` the ``to`` of the URL, if the
    operator's transfer allowlist takes it (Plivo fetches this, signed, on our request)."""
    state: GatewayState = request.app.state.gateway
    form = await read_form(request, state.metrics, SOURCE_WEBHOOK)
    if isinstance(form, Response):
        return form
    refused = _refused_by_signature(state, request, form, TRANSFER_PATH)
    if refused is not None:
        return refused
    destination = request.query_params.get("to", "")
    allowed = state.config.transfer_allowlist.allows(destination)
    if not (allowed and callable_destination(destination)):
        state.metrics.bad_messages.labels(SOURCE_WEBHOOK, "transfer_not_allowed").inc()
        return PlainTextResponse("that destination is not on the transfer allowlist", 403)
    return Response(dial_xml(destination), media_type="text/xml")


class PlivoProvider:
    """Plivo audio streams through an application's answer URL (inbound calls)."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="clearAudio empties Plivo's queue (answered by clearedAudio); checkpoints "
        "whose audio never played do not come back (docs/PROVIDERS.md §4.4)",
        wire_format="audio/x-mulaw 8 kHz, base64 in JSON text frames (playAudio out)",
        dials_sip_uris=False,
        outbound=True,
    )
    #: Not checked against its price list: the stand-in (gateway/ingress_provider.py).
    default_rates = CPAAS_STAND_IN_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The answer webhook."""
        return [
            Route(ANSWER_PATH, plivo_answer, methods=["POST"]),
            Route(TRANSFER_PATH, plivo_transfer, methods=["POST"]),
        ]

    async def startup(self, state: GatewayState) -> None:
        """Read the settings now, so a bad one stops the gateway at once."""
        plivo_settings(state)

    async def shutdown(self, state: GatewayState) -> None:
        """Close the REST client."""
        control = plivo_settings(state).call_control
        if control is not None:
            await control.aclose()

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """Plivo signs no upgrade: the stream token in the URL proves the call."""
        return None

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """A fresh codec, given the socket URL's parameters (``clearedAudio`` is a
        provider message the core needs nothing from)."""
        codec = PlivoStreamCodec(url_parameters=dict(websocket.query_params))
        return TextMediaLeg(websocket, codec, plivo_settings(state).call_control)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The parameters our answer put on the stream URL."""
        return custom_stream_params(started, state)

    def sniff(self, first_message: str | bytes) -> bool:
        """Plivo's ``start`` (``start.callId`` and ``start.streamId``)."""
        return sniff_plivo_stream(first_message)

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Placing calls needs the auth id and token."""
        if plivo_settings(state).call_control is None:
            return f"outbound Plivo calls need {ENV_AUTH_ID} and {ENV_AUTH_TOKEN} on the gateway"
        return None

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Place the call over REST; Plivo POSTs our answer URL (``?rutster_call=``) once
        it is answered. Returns the ``request_uuid``. Held while it rings; settled at zero
        if no answer comes within :data:`PLACED_CALL_ANSWER_WAIT_S` (an answer after that
        is refused: the record is settled)."""
        control = plivo_settings(state).call_control
        if control is None:
            raise DialFailed("Plivo call control is not configured")
        query = urlencode({QUERY_CALL: context.call_id})
        answer_url = public_http_url(state.config.public_url, ANSWER_PATH) + "?" + query
        try:
            request_uuid = await control.create_call(to=to, from_=from_, answer_url=answer_url)
        except CallControlFailure as exc:
            log.warning("call %s: Plivo refused to place it (%s)", context.call_id, exc.reason)
            raise DialFailed(f"Plivo did not place the call ({exc.reason})") from None
        state.watch_media_connect(
            context.call_id,
            release_if_never_connected(
                state, context.call_id, PLACED_CALL_ANSWER_WAIT_S, reason="no_answer"
            ),
        )
        return request_uuid

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Nothing to send: a ringing Plivo call is known by its request, which the REST
        API used here does not cancel; its answer, if any, is refused (the record is
        settled)."""
