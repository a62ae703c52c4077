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

Hang-up goes through Plivo's REST API (``DELETE …/Call/{uuid}/``) when
``PLIVO_AUTH_ID`` and ``PLIVO_AUTH_TOKEN`` are set; otherwise closing the socket
ends the call (``keepCallAlive`` holds it only while the socket is open). Not yet:
transfer (Plivo redirects a call to a URL serving new XML) and outbound calls.

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
    QUERY_BRAIN,
    REFUSAL_SAY_TEXT,
    Refused,
    admit_call,
    grant_stream,
    inbound_brain,
    webhook_admission,
)
from rutster.gateway.config import public_http_url, public_ws_url
from rutster.gateway.ingress_provider import (
    CPAAS_STAND_IN_RATES,
    InboundOnly,
    MediaLeg,
    ProviderCapabilities,
    StreamParams,
)
from rutster.gateway.spend_context import PARAM_SPEND
from rutster.gateway.state import GatewayState
from rutster.gateway.text_stream_leg import PARAM_TAP_URL, TextMediaLeg, custom_stream_params
from rutster.gateway.webhook_forms import read_form
from rutster.protocols.ingress import StreamStarted
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
from rutster.trunk.plivo.xml import hangup_xml, speak_hangup_xml, stream_xml
from rutster.trunk.xml_documents import xml_can_carry

log = logging.getLogger(__name__)

#: Its endpoints.
ANSWER_PATH = "/plivo/answer"
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
#: Longest ``CallUUID`` accepted (a UUID is 36 characters; 64 leaves margin).
MAX_CALL_UUID_CHARS = 64
SOURCE_WEBHOOK = "plivo_webhook"


@dataclass(frozen=True, slots=True)
class PlivoSettings:
    """This provider's settings, read from the gateway's environment."""

    signature: PlivoSignatureV3 | None
    call_control: PlivoCallControl | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PlivoSettings:
        """Raises :class:`ConfigError` for an API base URL that is not http(s)."""
        token = read_secret(env, ENV_AUTH_TOKEN)
        auth_id = env.get(ENV_AUTH_ID, "").strip()
        base = env_http_url(env, ENV_API_BASE_URL, PLIVO_API_BASE_URL)
        control = None
        if token and auth_id:
            try:
                control = PlivoCallControl(auth_id, token, base_url=base)
            except PlivoCallControlError as exc:
                raise ConfigError(f"{ENV_AUTH_ID}: {exc}") from None
        return cls(signature=PlivoSignatureV3(token) if token else None, call_control=control)


def plivo_settings(state: GatewayState) -> PlivoSettings:
    """This app's Plivo settings and REST client (read once, at startup)."""
    kept = state.provider_state.get(PROVIDER)
    if not isinstance(kept, PlivoSettings):
        kept = PlivoSettings.from_env(state.config.env)
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
    signature = plivo_settings(state).signature
    if signature is None and config.signatures_enforced:
        metrics.signature_failures.labels("plivo_answer").inc()
        log.warning("Plivo answer webhook refused: %s is not set", ENV_AUTH_TOKEN)
        return PlainTextResponse(f"Plivo webhooks need {ENV_AUTH_TOKEN} on this gateway", 403)
    if signature is not None:
        url = public_http_url(config.public_url, ANSWER_PATH)
        if request.url.query:
            url += "?" + request.url.query
        params: dict[str, list[str]] = {}
        for name, value in form.fields:
            params.setdefault(name, []).append(value)
        headers = request.headers
        if not signature.validate(
            "POST", url, params, headers.get(NONCE_HEADER), headers.get(SIGNATURE_HEADER)
        ):
            metrics.signature_failures.labels("plivo_answer").inc()
            log.warning("Plivo answer webhook refused: invalid %s", SIGNATURE_HEADER)
            return PlainTextResponse("invalid signature", 403)
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
    tap_url = inbound_brain(state, request.query_params.get(QUERY_BRAIN), to)
    if tap_url is None:
        return PlainTextResponse("brain URL not allowed", 403)
    wanted = webhook_admission(
        state,
        provider=PROVIDER,
        provider_call_id=call_uuid,
        from_=fields.get(FIELD_FROM, ""),
        to=to,
        direction=fields.get(FIELD_DIRECTION, ""),
        tap_url=tap_url,
    )
    admitted = await admit_call(state, wanted)
    if isinstance(admitted, Refused):
        kind = config.spend.refusal_response
        if kind == "say":
            return Response(speak_hangup_xml(REFUSAL_SAY_TEXT), media_type="text/xml")
        return Response(hangup_xml("busy" if kind == "busy" else "rejected"), media_type="text/xml")
    grant = grant_stream(state, admitted, stream_call_id=call_uuid, tap_url=tap_url)
    parameters = {
        PARAM_FROM: fields.get(FIELD_FROM, ""),
        PARAM_TO: to,
        PARAM_DIRECTION: fields.get(FIELD_DIRECTION, "inbound"),
        PARAM_TAP_URL: tap_url,
        PARAM_SPEND: grant.spend_text,
        PARAM_TOKEN: grant.token,
    }
    url = public_ws_url(config.public_url, MEDIA_PATH) + "?" + urlencode(parameters)
    return Response(stream_xml(url), media_type="text/xml")


class PlivoProvider(InboundOnly):
    """Plivo audio streams through an application's answer URL (inbound calls)."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="clearAudio empties Plivo's queue (answered by clearedAudio); checkpoints "
        "whose audio never played do not come back (docs/PROVIDERS.md §4.4)",
        wire_format="audio/x-mulaw 8 kHz, base64 in JSON text frames (playAudio out)",
        dials_sip_uris=False,
        outbound=False,
    )
    #: Not checked against its price list: the stand-in (gateway/ingress_provider.py).
    default_rates = CPAAS_STAND_IN_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The answer webhook."""
        return [Route(ANSWER_PATH, plivo_answer, methods=["POST"])]

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
