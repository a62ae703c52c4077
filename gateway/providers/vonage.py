"""Vonage Voice API WebSockets (NCCO ``connect`` to a websocket) as an ingress provider.

The sans-I/O pieces are in ``trunk/vonage/`` (stream codec, JWTs, NCCO, REST
hang-up); this module is the gateway adapter of the registry
(``gateway/providers/__init__.py``):

- ``/vonage/answer``: the application's answer URL (GET by default, or POST with a
  JSON body, docs/PROVIDERS.md §3.1). With ``VONAGE_SIGNATURE_SECRET`` set, the
  request's JWT is checked (and its ``payload_hash`` against the body); the call is
  admitted through the spend gate and the answer is an NCCO ``connect`` to
  ``/vonage/stream``, L16 at 16 kHz, with ``authorization: vonage`` so that the
  handshake is signed too. The call context and stream token ride in the
  socket URL's query (``headers`` hold 512 bytes, §3.2); the ``call_uuid`` header
  names the call, and the stream token binds it.
- ``/vonage/events``: the application's event URL; events are checked and
  acknowledged (the call's end comes from its socket).
- ``/vonage/stream`` (served by ``gateway/media_socket.py``): the handshake's JWT
  is checked when the secret is set; audio arrives and leaves in binary frames.

Hang-up goes through the Voice API (``PUT /v1/calls/{uuid}``) when
``VONAGE_APPLICATION_ID`` and ``VONAGE_PRIVATE_KEY_FILE`` are set; otherwise
closing the socket ends the call. With them, ``POST /v1/calls`` places Vonage calls
(``POST /v1/calls`` of the Voice API, answer URL ``/vonage/answer?rutster_call=``).
Not yet: transfer.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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
from rutster.gateway.webhook_forms import MAX_WEBHOOK_BODY_BYTES, read_body
from rutster.protocols.call_control import CallControlFailure
from rutster.protocols.ingress import StreamStarted
from rutster.spend.store import CallRecord
from rutster.trunk.vonage.call_control import (
    VONAGE_API_BASE_URL,
    VonageCallControl,
    VonageCallControlError,
)
from rutster.trunk.vonage.codec import (
    CONTENT_TYPE,
    HEADER_CALL_UUID,
    PARAM_DIRECTION,
    PROVIDER,
    VonageStreamCodec,
    sniff_vonage_stream,
)
from rutster.trunk.vonage.ncco import connect_websocket_ncco, empty_ncco, talk_ncco
from rutster.trunk.vonage.signature import VonageJwt

log = logging.getLogger(__name__)

#: Its endpoints.
ANSWER_PATH = "/vonage/answer"
EVENTS_PATH = "/vonage/events"
MEDIA_PATH = "/vonage/stream"
#: Its environment variables.
ENV_SIGNATURE_SECRET = "VONAGE_SIGNATURE_SECRET"
ENV_APPLICATION_ID = "VONAGE_APPLICATION_ID"
ENV_PRIVATE_KEY_FILE = "VONAGE_PRIVATE_KEY_FILE"
ENV_API_BASE_URL = "VONAGE_API_BASE_URL"
#: Longest call ``uuid`` accepted (a UUID is 36 characters).
MAX_UUID_CHARS = 64
#: Longest party (``from``, ``to``) kept: E.164 or a SIP URI's user part.
MAX_PARTY_CHARS = 64
SOURCE_WEBHOOK = "vonage_webhook"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class VonageSettings:
    """This provider's settings, read from the gateway's environment."""

    jwt: VonageJwt | None
    call_control: VonageCallControl | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> VonageSettings:
        """Raises :class:`ConfigError` for a key file that cannot be read or a bad URL."""
        secret = read_secret(env, ENV_SIGNATURE_SECRET)
        application_id = env.get(ENV_APPLICATION_ID, "").strip()
        key_file = env.get(ENV_PRIVATE_KEY_FILE, "").strip()
        base = env_http_url(env, ENV_API_BASE_URL, VONAGE_API_BASE_URL)
        control = None
        if application_id and key_file:
            try:
                key = Path(key_file).read_text(encoding="utf-8")
                control = VonageCallControl(application_id, key, base_url=base)
            except OSError as exc:
                raise ConfigError(
                    f"{ENV_PRIVATE_KEY_FILE}: cannot read it: {exc.strerror}"
                ) from None
            except (UnicodeDecodeError, VonageCallControlError) as exc:
                raise ConfigError(f"{ENV_PRIVATE_KEY_FILE}: {exc}") from None
        return cls(jwt=VonageJwt(secret) if secret else None, call_control=control)


def vonage_settings(state: GatewayState) -> VonageSettings:
    """This app's Vonage settings and REST client (read once, at startup)."""
    kept = state.provider_state.get(PROVIDER)
    if not isinstance(kept, VonageSettings):
        kept = VonageSettings.from_env(state.config.env)
        state.provider_state[PROVIDER] = kept
    return kept


def _refused_by_signature(state: GatewayState, request: Request, body: bytes) -> Response | None:
    """The refusal of a webhook whose JWT does not hold up (None: it does)."""
    signer = vonage_settings(state).jwt
    if signer is None:
        if not state.config.signatures_enforced:
            return None
        state.metrics.signature_failures.labels("vonage_webhook").inc()
        log.warning("Vonage webhook refused: %s is not set", ENV_SIGNATURE_SECRET)
        return PlainTextResponse(f"Vonage webhooks need {ENV_SIGNATURE_SECRET} here", 403)
    verdict = signer.verify(request.headers.get("authorization"), body, now_s=time.time())
    if verdict.ok:
        return None
    state.metrics.signature_failures.labels("vonage_webhook").inc()
    log.warning("Vonage webhook refused: signature %s", verdict.reason)
    return PlainTextResponse("invalid signature", 403)


async def _webhook_fields(
    request: Request, state: GatewayState
) -> tuple[bytes, dict[str, str]] | Response:
    """The body as sent and the webhook's string fields (GET: the query; POST: JSON)."""
    body = await read_body(request, MAX_WEBHOOK_BODY_BYTES)
    if body is None:
        state.metrics.bad_messages.labels(SOURCE_WEBHOOK, "too_large").inc()
        return PlainTextResponse("request body too large", 413)
    if request.method == "GET":
        return body, dict(request.query_params)
    try:
        decoded = json.loads(body) if body else {}
    except (ValueError, RecursionError):
        decoded = None
    if not isinstance(decoded, dict):
        state.metrics.bad_messages.labels(SOURCE_WEBHOOK, "bad_body").inc()
        return PlainTextResponse("expected a JSON object", 400)
    return body, {k: v for k, v in decoded.items() if isinstance(v, str)}


async def vonage_answer(request: Request) -> Response:
    """The answer webhook: reply an NCCO ``connect`` to ``/vonage/stream``."""
    state: GatewayState = request.app.state.gateway
    config = state.config
    read = await _webhook_fields(request, state)
    if isinstance(read, Response):
        return read
    body, fields = read
    refused = _refused_by_signature(state, request, body)
    if refused is not None:
        return refused
    uuid = fields.get("uuid", "")
    if not uuid or len(uuid) > MAX_UUID_CHARS or not uuid.replace("-", "").isalnum():
        state.metrics.bad_messages.labels(SOURCE_WEBHOOK, "bad_uuid").inc()
        return PlainTextResponse("missing or malformed uuid", 400)
    from_, to = fields.get("from", "")[:MAX_PARTY_CHARS], fields.get("to", "")[:MAX_PARTY_CHARS]
    placed = request.query_params.get(QUERY_CALL)
    if placed is not None:
        # A call POST /v1/calls placed, now answered: its record names this uuid.
        found = await answered_placed_call(state, placed, uuid)
        if isinstance(found, Refused):
            if found.reason == REASON_UNKNOWN_PLACED_CALL:
                state.metrics.bad_messages.labels(SOURCE_WEBHOOK, "unknown_placed_call").inc()
            return Response(empty_ncco(), media_type=_JSON)
        context, tap_url = found
        direction = "outbound-api"
    else:
        chosen = inbound_brain(state, request.query_params.get(QUERY_BRAIN), to)
        if chosen is None:
            return PlainTextResponse("brain URL not allowed", 403)
        tap_url = chosen
        direction = fields.get("direction", "inbound")
        wanted = webhook_admission(
            state,
            provider=PROVIDER,
            provider_call_id=uuid,
            from_=from_,
            to=to,
            direction=direction,
            tap_url=tap_url,
        )
        admitted = await admit_call(state, wanted)
        if isinstance(admitted, Refused):
            if config.spend.refusal_response == "say":
                return Response(talk_ncco(REFUSAL_SAY_TEXT), media_type=_JSON)
            return Response(empty_ncco(), media_type=_JSON)
        context = admitted
    grant = grant_stream(state, context, stream_call_id=uuid, tap_url=tap_url)
    parameters = {
        "from": from_,
        "to": to,
        PARAM_DIRECTION: direction,
        PARAM_TAP_URL: tap_url,
        PARAM_SPEND: grant.spend_text,
        PARAM_TOKEN: grant.token,
    }
    uri = public_ws_url(config.public_url, MEDIA_PATH) + "?" + urlencode(parameters)
    ncco = connect_websocket_ncco(uri, {HEADER_CALL_UUID: uuid}, CONTENT_TYPE)
    return Response(ncco, media_type=_JSON)


async def vonage_events(request: Request) -> Response:
    """The event webhook: checked, then acknowledged (a call ends with its socket)."""
    state: GatewayState = request.app.state.gateway
    read = await _webhook_fields(request, state)
    if isinstance(read, Response):
        return read
    refused = _refused_by_signature(state, request, read[0])
    return refused if refused is not None else Response(status_code=204)


class VonageMediaLeg(TextMediaLeg):
    """One ``/vonage/stream`` socket: audio in binary frames, events in text ones."""

    binary_frames = True

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        self._vonage = VonageStreamCodec(url_parameters=dict(websocket.query_params))
        self._vonage_control = vonage_settings(state).call_control
        self._call_uuid: str | None = None
        super().__init__(websocket, self._vonage, self._vonage_control)

    def decode(self, frame: str | bytes) -> object:
        """Binary audio or a text event; the stream's start tells call control the call's
        number of ours (a transfer presents it as the caller ID)."""
        event = self._vonage.receive(frame)
        control = self._vonage_control
        if isinstance(event, StreamStarted) and control is not None:
            params = event.custom_parameters
            outbound = params.get(PARAM_DIRECTION, "").startswith("outbound")
            own = params.get("from" if outbound else "to", "")
            self._call_uuid = event.call.call_id
            control.remember_number(self._call_uuid, own)
        return event

    def detach(self, context: SpendContext) -> None:
        """The call is over: call control forgets its number."""
        if self._vonage_control is not None and self._call_uuid is not None:
            self._vonage_control.forget_number(self._call_uuid)


class VonageProvider:
    """Vonage Voice API websockets through an application's answer URL (inbound calls)."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="clear empties Vonage's queue, answered by websocket:cleared; the notify "
        "markers behind it are taken not to come back (docs/PROVIDERS.md §3.3)",
        wire_format="audio/l16;rate=16000 in binary 20 ms frames; JSON text events",
        dials_sip_uris=False,
        outbound=True,
    )
    #: Not checked against its price list: the stand-in (gateway/ingress_provider.py).
    default_rates = CPAAS_STAND_IN_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The answer and event webhooks."""
        return [
            Route(ANSWER_PATH, vonage_answer, methods=["GET", "POST"]),
            Route(EVENTS_PATH, vonage_events, methods=["GET", "POST"]),
        ]

    async def startup(self, state: GatewayState) -> None:
        """Read the settings now, so a bad one stops the gateway at once."""
        vonage_settings(state)

    async def shutdown(self, state: GatewayState) -> None:
        """Close the REST client."""
        control = vonage_settings(state).call_control
        if control is not None:
            await control.aclose()

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """The handshake's JWT (``authorization: vonage`` in our NCCO), when the secret
        is set; the stream token proves the call either way."""
        signer = vonage_settings(state).jwt
        if signer is None:
            return None
        verdict = signer.verify(websocket.headers.get("authorization"), None, now_s=time.time())
        if verdict.ok:
            return None
        state.metrics.signature_failures.labels("vonage_stream").inc()
        log.warning("Vonage media socket refused: signature %s", verdict.reason)
        return "invalid signature"

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """A fresh codec, given the socket URL's parameters."""
        return VonageMediaLeg(websocket, state)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The parameters our NCCO put on the socket URL."""
        return custom_stream_params(started, state)

    def sniff(self, first_message: str | bytes) -> bool:
        """Vonage's ``websocket:connected``."""
        return sniff_vonage_stream(first_message)

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Placing calls needs the application id and its private key."""
        if vonage_settings(state).call_control is None:
            return (
                f"outbound Vonage calls need {ENV_APPLICATION_ID} and {ENV_PRIVATE_KEY_FILE} "
                "on the gateway"
            )
        return None

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Place the call through the Voice API; Vonage fetches our answer URL
        (``?rutster_call=``) once it is answered. Held while it rings; hung up and
        settled at zero if no answer comes within :data:`PLACED_CALL_ANSWER_WAIT_S`."""
        control = vonage_settings(state).call_control
        if control is None:
            raise DialFailed("Vonage call control is not configured")
        public_url = state.config.public_url
        query = urlencode({QUERY_CALL: context.call_id})
        try:
            uuid = await control.create_call(
                to=to,
                from_=from_,
                answer_url=public_http_url(public_url, ANSWER_PATH) + "?" + query,
                event_url=public_http_url(public_url, EVENTS_PATH),
            )
        except CallControlFailure as exc:
            log.warning("call %s: Vonage refused to place it (%s)", context.call_id, exc.reason)
            raise DialFailed(f"Vonage did not place the call ({exc.reason})") from None
        give_up = functools.partial(hang_up_quietly, control, context.call_id, uuid)
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
        return uuid

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Hang up a placed call (ringing or answered); one already over is fine."""
        control = vonage_settings(state).call_control
        if control is None or not record["provider_call_id"]:
            return
        try:
            await control.hang_up(record["provider_call_id"])
        except CallControlFailure as exc:
            if exc.reason != "already_ended":
                raise
