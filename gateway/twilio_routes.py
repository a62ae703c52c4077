"""Twilio's HTTP and WebSocket endpoints: thin Starlette handlers around the sans-I/O pieces.

- ``POST /twilio/voice`` (the number's voice webhook): check ``X-Twilio-Signature``,
  choose the brain, admit the call through the spend gate (inbound) or find the
  call placed through ``POST /v1/calls`` (``?rutster_call=``), then answer TwiML
  ``<Connect><Stream>`` carrying the call context and a per-call stream token —
  or ``<Reject>`` when the gate refused the call.
- ``/twilio/stream`` (the media WebSocket): check the upgrade's signature when
  present, read ``connected``/``start``, verify the stream token *before* any
  brain is dialled, then feed the metered ``Call`` until ``stop`` or close.
- ``POST /twilio/status`` (status callbacks of calls we placed): a call that
  never connected (busy, no answer, failed, canceled) is settled at zero.
"""

from __future__ import annotations

import contextlib
import logging
import re
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from rutster.base.stream_token import StreamTokenSigner
from rutster.base.ws_close import CLOSE_NORMAL, CLOSE_POLICY_VIOLATION, MAX_CLOSE_REASON_CHARS
from rutster.gateway.media_session import StreamEnded, release_if_never_connected, run_metered_call
from rutster.gateway.media_socket import (
    await_start,
    read_event,
    refuse,
    trusted_context,
)
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.state import GatewayState
from rutster.protocols.ingress import (
    IngressCommand,
    IngressEvent,
)
from rutster.spend.gate import AdmissionRequest
from rutster.spend.store import StoreUnavailable
from rutster.trunk.twilio.codec import (
    PARAM_DIRECTION,
    PARAM_FROM,
    PARAM_TO,
    PARAM_TOKEN,
    TwilioStreamCodec,
)
from rutster.trunk.twilio.signature import SIGNATURE_HEADER, TwilioSignatureValidator
from rutster.trunk.twilio.twiml import (
    connect_stream_twiml,
    reject_twiml,
    say_hangup_twiml,
    xml_can_carry,
)

log = logging.getLogger(__name__)

#: Custom parameter carrying the brain URL chosen at webhook time (bound into the token).
PARAM_TAP_URL = "tap_url"
#: Query parameter of the voice webhook URL selecting a brain for that number
#: (``https://gw/twilio/voice?brain=wss://...``); must be on the allowlist.
QUERY_BRAIN = "brain"
#: Largest webhook body accepted. Twilio's form posts are a few hundred bytes to
#: ~2 KB (docs/PROVIDERS.md §1.1 field list); 16 KiB leaves ample margin. It was 64 KiB
#: until 2026-12-05: percent-decoding that much costs the event loop 4-5 ms per
#: request, signed or not (measured, 2-core dev VM), about 1.2 ms at 16 KiB.
MAX_WEBHOOK_BODY_BYTES = 16 * 1024
#: Most form fields a webhook may carry. Twilio's voice and status webhooks send
#: about 30 (docs/PROVIDERS.md §1.1 field list), plus one ``SipHeader_*`` per custom SIP
#: header on SIP calls; 200 leaves ample margin. Without it a 64 KiB body of short
#: fields (~6,500-11,000) cost the event loop 23-40 ms to parse and check the
#: signature of (measured, 2-core dev VM, 2026-12-05): every call on the gateway
#: stalled that long per such request, signed or not. 199 fields cost 0.24 ms.
MAX_WEBHOOK_FIELDS = 200
#: Twilio CallSids: "CA" + 32 hex digits; we accept any short token of safe
#: characters so simulators and other Twilio-compatible providers also work.
CALL_SID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Query parameter of the voice-webhook and status-callback URLs naming a call
#: placed through ``POST /v1/calls``.
QUERY_CALL = "rutster_call"
#: What a refused caller hears with ``RUTSTER_REFUSAL_RESPONSE=say``.
REFUSAL_SAY_TEXT = "Sorry, this call cannot be taken right now. Goodbye."
#: Twilio's final statuses of a call that never connected, and the end reason
#: recorded for each (twilio.com/docs/voice/api/call-resource#call-status-values).
UNCONNECTED_STATUSES = {
    "busy": "busy",
    "no-answer": "no_answer",
    "failed": "failed",
    "canceled": "canceled",
}


def _state(holder: Request | WebSocket) -> GatewayState:
    state: GatewayState = holder.app.state.gateway
    return state


def _signed_url(base: str, query: str) -> str:
    return f"{base}?{query}" if query else base


def _too_many_fields(body: bytes) -> bool:
    """More than :data:`MAX_WEBHOOK_FIELDS` fields, counted before anything is parsed."""
    return body.count(b"&") >= MAX_WEBHOOK_FIELDS


async def _read_body(request: Request, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def twilio_voice(request: Request) -> Response:
    """The voice webhook: answer TwiML that forks the call's audio to ``/twilio/stream``."""
    state = _state(request)
    config = state.config
    metrics = state.metrics
    if request.method == "POST":
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/x-www-form-urlencoded":
            metrics.bad_messages.labels("twilio_webhook", "bad_content_type").inc()
            return PlainTextResponse("expected application/x-www-form-urlencoded", 415)
        body = await _read_body(request, MAX_WEBHOOK_BODY_BYTES)
        if body is None:
            metrics.bad_messages.labels("twilio_webhook", "too_large").inc()
            return PlainTextResponse("request body too large", 413)
        if _too_many_fields(body):
            metrics.bad_messages.labels("twilio_webhook", "too_many_fields").inc()
            return PlainTextResponse(f"more than {MAX_WEBHOOK_FIELDS} form fields", 413)
        try:
            params = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
        except (UnicodeDecodeError, ValueError):
            metrics.bad_messages.labels("twilio_webhook", "bad_body").inc()
            return PlainTextResponse("malformed form body", 400)
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
        found = await _placed_call(state, placed, call_sid)
        if isinstance(found, Response):
            return found
        context, tap_url = found
    else:
        tap_url = (
            request.query_params.get(QUERY_BRAIN)
            or config.tap_url_by_number.get(to)
            or config.tap_url
        )
    if not config.tap_allowlist.allows(tap_url):
        metrics.tap_url_rejections.inc()
        log.warning("voice webhook refused: brain URL not on the allowlist")
        return PlainTextResponse("brain URL not allowed", 403)
    if placed is None:
        admitted = await _admit_inbound(state, call_sid, fields, to, tap_url)
        if isinstance(admitted, Response):
            return admitted
        context = admitted
    spend = context.encode()
    state.watch_media_connect(
        context.call_id,
        release_if_never_connected(state, context.call_id, config.spend.media_connect_timeout_s),
    )
    token = StreamTokenSigner(config.stream_secret).issue(call_sid, tap_url, spend)
    twiml = connect_stream_twiml(
        config.twilio_stream_url,
        {
            PARAM_FROM: fields.get("From", ""),
            PARAM_TO: to,
            PARAM_DIRECTION: fields.get("Direction", "inbound"),
            PARAM_TAP_URL: tap_url,
            PARAM_SPEND: spend,
            PARAM_TOKEN: token,
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


async def _admit_inbound(
    state: GatewayState, call_sid: str, fields: dict[str, str], to: str, tap_url: str
) -> SpendContext | Response:
    """Ask the spend gate (a call that reached our webhook without the API placing
    it); a refusal answers TwiML that turns the caller away."""
    gate = state.spend_gate
    assert gate is not None, "the spend gate starts with the app"
    # A call the operator placed outside our API (Direction=outbound-api/-dial) is
    # priced as outbound and belongs to the tenant of the number it comes from.
    direction = "outbound" if fields.get("Direction", "").startswith("outbound") else "inbound"
    own_number = fields.get("From", "") if direction == "outbound" else to
    tenant = state.config.spend.tenant_for_number(own_number)
    admission = await gate.admit(
        AdmissionRequest(
            tenant=tenant,
            provider="twilio",
            direction=direction,
            caller=fields.get("From", "")[:64],
            to=to[:64],
            brain=tap_url,
            provider_call_id=call_sid,
        )
    )
    if not admission.admitted:
        state.metrics.admissions.labels("refused", admission.reason).inc()
        log.info("inbound call %s refused by the spend gate: %s", call_sid, admission.reason)
        return _refusal_twiml(state)
    state.metrics.admissions.labels("admitted", "degraded" if admission.degraded else "ok").inc()
    return SpendContext(
        admission.call_id,
        tenant,
        direction,
        admission.caps.max_duration_s,
        admission.caps.max_cost_micros,
        admission.first_quantum,
        admission.degraded,
    )


async def _placed_call(
    state: GatewayState, call_id: str, call_sid: str
) -> tuple[SpendContext, str] | Response:
    """The call ``POST /v1/calls`` placed, now answered: its admission and brain."""
    store = state.spend_store
    assert store is not None
    try:
        record = await store.get_call(call_id) if call_id.startswith("call_") else None
    except ValueError:
        record = None
    except StoreUnavailable:
        log.warning("placed call %s answered while Redis is unreachable; hanging up", call_id)
        return _refusal_twiml(state)
    if (
        record is None
        or record["status"] != "admitted"
        or record["direction"] != "outbound"
        or record["provider_call_id"] not in ("", call_sid)
    ):
        state.metrics.bad_messages.labels("twilio_webhook", "unknown_placed_call").inc()
        log.warning("voice webhook for an unknown or finished placed call; rejecting")
        return _refusal_twiml(state)
    context = SpendContext(
        call_id,
        record["tenant"],
        "outbound",
        record["max_duration_s"],
        record["max_cost"],
        record["reserved"],
    )
    return context, record["brain"]


async def twilio_status(request: Request) -> Response:
    """Status callbacks of placed calls: settle the ones that never connected."""
    state = _state(request)
    config = state.config
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await _read_body(request, MAX_WEBHOOK_BODY_BYTES)
    if content_type != "application/x-www-form-urlencoded" or body is None:
        state.metrics.bad_messages.labels("twilio_status", "bad_body").inc()
        return PlainTextResponse("expected a form body", 400)
    if _too_many_fields(body):
        state.metrics.bad_messages.labels("twilio_status", "too_many_fields").inc()
        return PlainTextResponse(f"more than {MAX_WEBHOOK_FIELDS} form fields", 413)
    try:
        params = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        state.metrics.bad_messages.labels("twilio_status", "bad_body").inc()
        return PlainTextResponse("malformed form body", 400)
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


class TwilioEdge:
    """Sends core commands to Twilio over the media socket (the ``CallEdge`` for Twilio)."""

    def __init__(self, websocket: WebSocket, codec: TwilioStreamCodec) -> None:
        self._ws = websocket
        self._codec = codec
        self.closed = False

    async def send(self, command: IngressCommand) -> None:
        """Encode and send; a socket that is already gone makes this a no-op."""
        if self.closed:
            return
        try:
            await self._ws.send_text(self._codec.encode(command))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True

    async def close(self, reason: str) -> None:
        """Close the media socket; Twilio then continues the TwiML (none: the call ends)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._ws.close(CLOSE_NORMAL, reason[:MAX_CLOSE_REASON_CHARS])


async def twilio_stream(websocket: WebSocket) -> None:
    """The media WebSocket Twilio opens for ``<Connect><Stream>``."""
    state = _state(websocket)
    config = state.config
    metrics = state.metrics
    signature = websocket.headers.get(SIGNATURE_HEADER)
    if config.twilio_auth_token is not None and signature is not None:
        url = _signed_url(config.twilio_stream_url, websocket.url.query)
        if not TwilioSignatureValidator(config.twilio_auth_token).validate(url, [], signature):
            metrics.signature_failures.labels("stream").inc()
            log.warning("media socket refused: invalid %s on upgrade", SIGNATURE_HEADER)
            await refuse(websocket, CLOSE_POLICY_VIOLATION, "invalid signature")
            return
    await websocket.accept()
    codec = TwilioStreamCodec()
    started = await await_start(websocket, state, "twilio", codec.receive, binary=False)
    if started is None:
        return
    params = started.custom_parameters
    tap_url = params.get(PARAM_TAP_URL) or config.tap_url
    context = await trusted_context(
        websocket,
        state,
        "twilio",
        call_id=started.call.call_id,
        tap_url=tap_url,
        spend_text=params.get(PARAM_SPEND, ""),
        token=params.get(PARAM_TOKEN),
    )
    if context is None:
        return
    edge = TwilioEdge(websocket, codec)

    async def next_event() -> IngressEvent | StreamEnded:
        event: IngressEvent | StreamEnded = await read_event(
            websocket, state, "twilio", codec.receive, binary=False, on_fatal=edge.close
        )
        return event

    await run_metered_call(
        state,
        started=started,
        context=context,
        tap_url=tap_url,
        edge=edge,
        provider="twilio",
        call_control=state.twilio_call_control,
        next_event=next_event,
    )
