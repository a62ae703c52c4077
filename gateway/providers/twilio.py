"""Twilio Media Streams as an ingress provider: its webhooks, its media leg, its dialling.

The sans-I/O pieces are in ``trunk/twilio/`` (stream codec, signature, TwiML,
REST call control); this module is the gateway adapter of the registry
(``gateway/providers/__init__.py``):

- ``POST /twilio/voice`` (the number's voice webhook): check ``X-Twilio-Signature``,
  choose the brain, admit the call through the spend gate (inbound) or find the
  call placed through ``POST /v1/calls`` (``?rutster_call=``), then answer TwiML
  ``<Connect><Stream>`` carrying the call context and a per-call stream token —
  or ``<Reject>`` when the gate refused the call.
- ``/twilio/stream`` (the media WebSocket, served by ``gateway/media_socket.py``):
  the upgrade's signature is checked when present; the ``start``'s custom
  parameters carry the brain URL, call context and stream token.
- ``POST /twilio/status`` (status callbacks of calls we placed): a call that
  never connected (busy, no answer, failed, canceled) is settled at zero.
- Outbound calls for ``POST /v1/calls``: Twilio's REST ``Calls`` create, whose
  answer comes back to the voice webhook with ``?rutster_call=``.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.websockets import WebSocket

from rutster.gateway.admission import (
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
    NO_RATES,
    DialFailed,
    MediaLeg,
    ProviderCapabilities,
    StreamParams,
)
from rutster.gateway.media_session import release_if_never_connected
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.state import GatewayState
from rutster.gateway.text_stream_leg import PARAM_TAP_URL, TextMediaLeg, custom_stream_params
from rutster.gateway.webhook_forms import read_form
from rutster.protocols.call_control import CallControlFailure
from rutster.protocols.ingress import StreamStarted
from rutster.spend.store import CallRecord, StoreUnavailable
from rutster.trunk.twilio.call_control import TwilioCallControl
from rutster.trunk.twilio.codec import (
    PARAM_DIRECTION,
    PARAM_FROM,
    PARAM_TO,
    PARAM_TOKEN,
    PROVIDER,
    TwilioStreamCodec,
    sniff_twilio_stream,
)
from rutster.trunk.twilio.signature import SIGNATURE_HEADER, TwilioSignatureValidator
from rutster.trunk.twilio.twiml import (
    connect_stream_twiml,
    reject_twiml,
    say_hangup_twiml,
)
from rutster.trunk.xml_documents import xml_can_carry

log = logging.getLogger(__name__)

#: Its endpoints (the provider's name, ``PROVIDER``, is the codec's).
VOICE_PATH = "/twilio/voice"
STATUS_PATH = "/twilio/status"
MEDIA_PATH = "/twilio/stream"
#: Twilio CallSids: "CA" + 32 hex digits; we accept any short token of safe
#: characters so simulators and other Twilio-compatible providers also work.
CALL_SID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Twilio's final statuses of a call that never connected, and the end reason
#: recorded for each (twilio.com/docs/voice/api/call-resource#call-status-values).
UNCONNECTED_STATUSES = {
    "busy": "busy",
    "no-answer": "no_answer",
    "failed": "failed",
    "canceled": "canceled",
}


#: Let an outbound call ring this long before Twilio gives up (Twilio's own default is
#: 60 s; 30 s is what a person waits; seed decision).
RING_TIMEOUT_S = 30
#: How long after its ring timeout a placed call still waits for an answer or a final status
#: callback before it is cancelled and settled at zero. Seed decision: Twilio's ``Timeout``
#: counts from when ringing starts, after the call may have waited in the account's
#: calls-per-second queue; a minute covers that and the callback's delivery.
PLACED_CALL_STATUS_MARGIN_S = 60
#: Twilio's ``TimeLimit`` is our max duration plus this margin: a second line of
#: defence that only acts if our own enforcement failed.
TIME_LIMIT_MARGIN_S = 60


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _signed_url(base: str, query: str) -> str:
    return f"{base}?{query}" if query else base


async def twilio_voice(request: Request) -> Response:
    """The voice webhook: answer TwiML that forks the call's audio to ``/twilio/stream``."""
    state = _state(request)
    config = state.config
    metrics = state.metrics
    if request.method == "POST":
        form = await read_form(request, metrics, "twilio_webhook")
        if isinstance(form, Response):
            return form
        params = form.fields
    else:
        params = []
    if config.twilio_auth_token is not None:
        validator = TwilioSignatureValidator(config.twilio_auth_token)
        url = _signed_url(config.twilio_voice_url, request.url.query)
        if not validator.validate(url, params, request.headers.get(SIGNATURE_HEADER)):
            metrics.signature_failures.labels("voice").inc()
            log.warning("voice webhook refused: invalid %s", SIGNATURE_HEADER)
            return PlainTextResponse("invalid signature", 403)
    fields = dict(params) | (dict(request.query_params) if request.method == "GET" else {})
    call_sid = fields.get("CallSid", "")
    if not CALL_SID_PATTERN.fullmatch(call_sid):
        metrics.bad_messages.labels("twilio_webhook", "bad_call_sid").inc()
        return PlainTextResponse("missing or malformed CallSid", 400)
    for party in ("From", "To", "Direction"):
        # Echoed into the TwiML's <Parameter>s: refused before anything is admitted.
        if not xml_can_carry(fields.get(party, "")):
            metrics.bad_messages.labels("twilio_webhook", "bad_party").inc()
            return PlainTextResponse(f"{party} holds a character XML cannot carry", 400)
    to = fields.get("To", "")
    placed = request.query_params.get(QUERY_CALL)
    if placed is not None:
        found = await answered_placed_call(state, placed, call_sid)
        if isinstance(found, Refused):
            if found.reason == REASON_UNKNOWN_PLACED_CALL:
                metrics.bad_messages.labels("twilio_webhook", "unknown_placed_call").inc()
            return _refusal_twiml(state)
        context, tap_url = found
    else:
        chosen = inbound_brain(state, request.query_params.get(QUERY_BRAIN), to)
        if chosen is None:
            return PlainTextResponse("brain URL not allowed", 403)
        tap_url = chosen
    if not config.tap_allowlist.allows(tap_url):  # a placed call's brain, checked again
        metrics.tap_url_rejections.inc()
        log.warning("voice webhook refused: brain URL not on the allowlist")
        return PlainTextResponse("brain URL not allowed", 403)
    if placed is None:
        wanted = webhook_admission(
            state,
            provider=PROVIDER,
            provider_call_id=call_sid,
            from_=fields.get("From", ""),
            to=to,
            direction=fields.get("Direction", ""),
            tap_url=tap_url,
        )
        admitted = await admit_call(state, wanted)
        if isinstance(admitted, Refused):
            return _refusal_twiml(state)
        context = admitted
    grant = grant_stream(state, context, stream_call_id=call_sid, tap_url=tap_url)
    twiml = connect_stream_twiml(
        config.twilio_stream_url,
        {
            PARAM_FROM: fields.get("From", ""),
            PARAM_TO: to,
            PARAM_DIRECTION: fields.get("Direction", "inbound"),
            PARAM_TAP_URL: tap_url,
            PARAM_SPEND: grant.spend_text,
            PARAM_TOKEN: grant.token,
        },
    )
    return Response(twiml, media_type="text/xml")


def _refusal_twiml(state: GatewayState) -> Response:
    kind = state.config.spend.refusal_response
    if kind == "say":
        twiml = say_hangup_twiml(REFUSAL_SAY_TEXT)
    else:
        twiml = reject_twiml("busy" if kind == "busy" else "rejected")
    return Response(twiml, media_type="text/xml")


async def twilio_status(request: Request) -> Response:
    """Status callbacks of placed calls: settle the ones that never connected."""
    state = _state(request)
    config = state.config
    form = await read_form(request, state.metrics, "twilio_status")
    if isinstance(form, Response):
        return form
    params = form.fields
    if config.twilio_auth_token is not None:
        validator = TwilioSignatureValidator(config.twilio_auth_token)
        url = _signed_url(
            config.twilio_voice_url.removesuffix("/voice") + "/status", request.url.query
        )
        if not validator.validate(url, params, request.headers.get(SIGNATURE_HEADER)):
            state.metrics.signature_failures.labels("status").inc()
            return PlainTextResponse("invalid signature", 403)
    fields = dict(params)
    call_id = request.query_params.get(QUERY_CALL, "")
    status = fields.get("CallStatus", "")
    reason = UNCONNECTED_STATUSES.get(status)
    if status == "completed" and call_id not in state.calls_by_id:
        reason = "completed_unconnected"
    if reason is None or not call_id.startswith("call_"):
        return Response(status_code=204)
    store = state.spend_store
    gate = state.spend_gate
    assert store is not None and gate is not None
    try:
        record = await store.get_call(call_id)
        if record is not None and record["status"] == "admitted":
            await gate.settle_unanswered(call_id, reason)
            log.info("placed call %s ended before connecting: %s", call_id, status)
    except (StoreUnavailable, ValueError):
        return PlainTextResponse("try again", 503)
    return Response(status_code=204)


class TwilioMediaLeg(TextMediaLeg):
    """One ``/twilio/stream`` socket: its codec yields only ingress events; call control
    through Twilio's REST API when configured."""

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        super().__init__(websocket, TwilioStreamCodec(), state.twilio_call_control)


class TwilioProvider:
    """Twilio Media Streams (``<Connect><Stream>``) and Twilio's REST API for outbound calls."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="drops the audio Twilio has buffered, then echoes no marks for it "
        "(docs/PROVIDERS.md §1.3)",
        wire_format="audio/x-mulaw;rate=8000, 20 ms base64 in JSON text frames",
        dials_sip_uris=False,
        outbound=True,
    )
    #: Its rates are in the built-in price table (spend/prices.py).
    default_rates = NO_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The voice webhook and the status callback."""
        return [
            Route(VOICE_PATH, twilio_voice, methods=["GET", "POST"]),
            Route(STATUS_PATH, twilio_status, methods=["POST"]),
        ]

    async def startup(self, state: GatewayState) -> None:
        """Open Twilio REST call control when the account's credentials are configured."""
        config = state.config
        if config.twilio_account_sid is not None and config.twilio_auth_token is not None:
            state.twilio_call_control = TwilioCallControl(
                account_sid=config.twilio_account_sid,
                auth_token=config.twilio_auth_token,
                base_url=config.twilio_api_base_url,
            )

    async def shutdown(self, state: GatewayState) -> None:
        """Close the REST client :meth:`startup` opened."""
        control = state.twilio_call_control
        if isinstance(control, TwilioCallControl):
            await control.aclose()

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """Check ``X-Twilio-Signature`` on the upgrade when Twilio sent one (the stream
        token in ``start`` is what proves the call either way)."""
        config = state.config
        signature = websocket.headers.get(SIGNATURE_HEADER)
        if config.twilio_auth_token is None or signature is None:
            return None
        # Signed over the URL Twilio dialled: its own path, or the auto-detecting one.
        url = _signed_url(public_ws_url(config.public_url, websocket.url.path), websocket.url.query)
        if TwilioSignatureValidator(config.twilio_auth_token).validate(url, [], signature):
            return None
        state.metrics.signature_failures.labels("stream").inc()
        log.warning("media socket refused: invalid %s on upgrade", SIGNATURE_HEADER)
        return "invalid signature"

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """A fresh codec and edge for one socket."""
        return TwilioMediaLeg(websocket, state)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The ``<Parameter>``s our TwiML put on the ``<Stream>``."""
        return custom_stream_params(started, state)

    def sniff(self, first_message: str | bytes) -> bool:
        """Twilio's ``connected`` (protocol ``Call``) or ``start`` message."""
        return sniff_twilio_stream(first_message)

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Placing calls needs the account's REST credentials."""
        if isinstance(state.twilio_call_control, TwilioCallControl):
            return None
        return "outbound Twilio calls need TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN on the gateway"

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Create the call over REST; Twilio fetches our voice webhook once it is answered.

        Held (never reaped at its reservation) while it rings; settled by the status
        callback, or at zero if neither an answer nor a final status comes in time.
        """
        control = state.twilio_call_control
        if not isinstance(control, TwilioCallControl):
            raise DialFailed("Twilio call control is not configured")
        query = urlencode({QUERY_CALL: context.call_id})
        public_url = state.config.public_url
        try:
            created = await control.create_call(
                to=to,
                from_=from_,
                url=public_http_url(public_url, VOICE_PATH) + "?" + query,
                status_callback=public_http_url(public_url, STATUS_PATH) + "?" + query,
                timeout_s=RING_TIMEOUT_S,
                time_limit_s=context.max_duration_s + TIME_LIMIT_MARGIN_S,
            )
        except CallControlFailure as exc:
            log.warning("call %s: Twilio refused to place it (%s)", context.call_id, exc.reason)
            raise DialFailed(f"Twilio did not place the call ({exc.reason})") from None
        state.watch_media_connect(
            context.call_id,
            release_if_never_connected(
                state,
                context.call_id,
                RING_TIMEOUT_S + PLACED_CALL_STATUS_MARGIN_S,
                reason="no_answer",
                give_up=functools.partial(_cancel_ringing, control, context.call_id, created.sid),
            ),
        )
        return created.sid

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Cancel (or hang up, if answered meanwhile) a placed call; one already over is fine."""
        control = state.twilio_call_control
        sid = record["provider_call_id"]
        if not sid or not isinstance(control, TwilioCallControl):
            return
        try:
            await control.cancel_or_hang_up(sid)
        except CallControlFailure as exc:
            if exc.reason != "already_ended":
                raise


async def _cancel_ringing(control: TwilioCallControl, call_id: str, sid: str) -> None:
    """Best effort: cancel a placed call that neither connected nor reported how it ended,
    so it cannot be answered once its admission is released."""
    try:
        await control.cancel_or_hang_up(sid)
    except CallControlFailure as exc:
        log.warning("call %s: could not cancel the unanswered call (%s)", call_id, exc.reason)
