"""The gateway's side of the SIP workers: their control channel, their media sockets, call control.

- ``/sip/workers`` (WebSocket, one per worker process, ``Authorization: Bearer
  <RUTSTER_SIP_SECRET>``): the worker says ``hello``, asks admission for each
  INVITE it accepted at the SIP level (``invite`` → ``admit``/``refuse``) and
  reports the outcome of calls the gateway asked it to dial (``dial`` →
  ``dial_result``).
- ``/sip/stream`` (WebSocket, one per answered call): the internal media
  contract (``trunk/sip/wire.py``) — parsed into the same ingress events as a
  Twilio stream and run by the same metered-call path.
- :class:`SipCallControl`: the brain's ``hangup``/``transfer`` tools and API
  hang-ups on SIP calls travel down the call's media socket to its worker,
  which sends BYE or REFER and reports back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.websockets import WebSocket

from rutster.base.stream_token import StreamTokenSigner
from rutster.base.ws_close import CLOSE_POLICY_VIOLATION
from rutster.gateway.call import Call
from rutster.gateway.media_session import StreamEnded, release_if_never_connected, run_metered_call
from rutster.gateway.media_socket import (
    await_start,
    read_event,
    refuse,
    trusted_context,
)
from rutster.gateway.spend_context import SpendContext
from rutster.gateway.state import GatewayState
from rutster.protocols.ingress import (
    IngressEvent,
)
from rutster.protocols.tap import SessionEndReason
from rutster.spend.gate import AdmissionRequest
from rutster.trunk.sip.wire import (
    PARAM_SPEND,
    PARAM_TAP_URL,
    PARAM_TOKEN,
    Admit,
    CancelDial,
    ControlResult,
    Dial,
    DialResult,
    Hello,
    InviteRequest,
    LoadReport,
    Refuse,
    SipMediaCodec,
    WireError,
    encode_control,
    parse_control,
)
from rutster.trunk.sip.worker_links import CONTROL_RESULT_TIMEOUT_S, SipEdge, SipWorkerLink

log = logging.getLogger(__name__)

#: SIP answers to a refused admission (RFC 3261 §21): 486 Busy Here for
#: ``RUTSTER_REFUSAL_RESPONSE=busy``, 603 Decline otherwise (there is no spoken
#: refusal on SIP before answering), 503 when Redis could not be asked.
SIP_BUSY = 486
SIP_DECLINE = 603
SIP_UNAVAILABLE = 503
#: Refusal reasons that mean "ask again later" rather than "no".
RETRYABLE_REFUSALS = frozenset({"store_unavailable"})
#: A worker's id: short, safe for logs and metrics labels.
WORKER_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: Ring time for calls the API places over SIP: as for Twilio's Timeout (30 s).
SIP_RING_TIMEOUT_S = 30
#: Extra time after the ring timeout before a dialled call that never reported
#: back is released (the worker died mid-dial): the media-connect timeout's job.
DIAL_RELEASE_MARGIN_S = 10.0


def _state(holder: WebSocket) -> GatewayState:
    state: GatewayState = holder.app.state.gateway
    return state


def _bearer_ok(websocket: WebSocket, secret: str | None) -> bool:
    if secret is None:
        return False
    header = websocket.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), secret.encode()
    )


def sip_user(uri: str) -> str:
    """The user part of a SIP URI (``sip:+15551234567@host`` → ``+15551234567``), or the text."""
    text = uri.strip()
    if "<" in text and ">" in text:
        text = text[text.index("<") + 1 : text.index(">")]
    for scheme in ("sips:", "sip:", "tel:"):
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
            break
    user = text.split("@", 1)[0] if "@" in text else text
    return user.split(";", 1)[0][:64]


# ---- /sip/workers ---------------------------------------------------------------------------


async def sip_workers(websocket: WebSocket) -> None:
    """A SIP worker's control channel: admissions for its INVITEs, dial orders for it."""
    state = _state(websocket)
    metrics = state.metrics
    if not _bearer_ok(websocket, state.config.sip_secret):
        metrics.bad_messages.labels("sip_control", "unauthorized").inc()
        log.warning("SIP worker refused: missing or wrong RUTSTER_SIP_SECRET")
        await refuse(websocket, CLOSE_POLICY_VIOLATION, "unauthorized")
        return
    await websocket.accept()
    link: SipWorkerLink | None = None
    tasks: set[asyncio.Task[None]] = set()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            if text is None:
                metrics.bad_messages.labels("sip_control", "binary_frame").inc()
                continue
            try:
                parsed = parse_control(str(text))
            except WireError as exc:
                metrics.bad_messages.labels("sip_control", exc.reason).inc()
                log.debug("SIP control: dropped message: %s", exc)
                continue
            if isinstance(parsed, Hello):
                if not WORKER_ID_PATTERN.fullmatch(parsed.worker):
                    metrics.bad_messages.labels("sip_control", "bad_worker_id").inc()
                    continue
                if link is not None:
                    state.sip_workers.remove(link)
                link = SipWorkerLink(parsed.worker, parsed.sip_uri, parsed.capacity, websocket)
                state.sip_workers.add(link)
                log.info("SIP worker %s connected (%s)", parsed.worker, parsed.sip_uri)
            elif link is None:
                metrics.bad_messages.labels("sip_control", "before_hello").inc()
            elif isinstance(parsed, InviteRequest):
                # Admission waits on Redis; keep reading the channel meanwhile.
                task = asyncio.create_task(_admit_invite(state, link, parsed))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            elif isinstance(parsed, DialResult):
                await _on_dial_result(state, link, parsed)
            elif isinstance(parsed, LoadReport):
                link.active = parsed.active
            else:
                metrics.bad_messages.labels("sip_control", "unexpected_type").inc()
    finally:
        for task in tasks:
            task.cancel()
        if link is not None:
            state.sip_workers.remove(link)
            log.info("SIP worker %s disconnected", link.worker_id)


async def _admit_invite(state: GatewayState, link: SipWorkerLink, invite: InviteRequest) -> None:
    """Ask the spend gate about one inbound SIP call and answer the worker."""
    config = state.config
    gate = state.spend_gate
    assert gate is not None, "the spend gate starts with the app"
    to_user = sip_user(invite.to)
    tap_url = config.tap_url_by_number.get(to_user) or config.tap_url
    tenant = config.spend.tenant_for_number(to_user)
    admission = await gate.admit(
        AdmissionRequest(
            tenant=tenant,
            provider="sip",
            direction="inbound",
            caller=sip_user(invite.from_),
            to=to_user,
            brain=tap_url,
            provider_call_id=invite.sip_call_id[:64],
        )
    )
    if not admission.admitted:
        state.metrics.admissions.labels("refused", admission.reason).inc()
        if admission.reason in RETRYABLE_REFUSALS:
            code = SIP_UNAVAILABLE
        else:
            code = SIP_BUSY if config.spend.refusal_response == "busy" else SIP_DECLINE
        log.info("SIP call refused by the spend gate: %s (SIP %d)", admission.reason, code)
        await link.send(encode_control(Refuse(invite.ref, code, admission.reason)))
        return
    state.metrics.admissions.labels("admitted", "degraded" if admission.degraded else "ok").inc()
    context = SpendContext(
        admission.call_id,
        tenant,
        "inbound",
        admission.caps.max_duration_s,
        admission.caps.max_cost_micros,
        admission.first_quantum,
        admission.degraded,
    )
    spend = context.encode()
    token = StreamTokenSigner(config.stream_secret).issue(admission.call_id, tap_url, spend)
    state.watch_media_connect(
        admission.call_id,
        release_if_never_connected(state, admission.call_id, config.spend.media_connect_timeout_s),
    )
    if not await link.send(
        encode_control(Admit(invite.ref, admission.call_id, tap_url, spend, token))
    ):
        log.warning("call %s: SIP worker left before its admission was sent", admission.call_id)


async def _on_dial_result(state: GatewayState, link: SipWorkerLink, result: DialResult) -> None:
    link.dialling.discard(result.call_id)
    if result.outcome == "answered":
        return
    gate, store = state.spend_gate, state.spend_store
    assert gate is not None and store is not None
    log.info("SIP call %s not connected: SIP %d %s", result.call_id, result.sip_code, result.reason)
    with contextlib.suppress(Exception):
        record = await store.get_call(result.call_id)
        if record is not None and record["status"] == "admitted":
            await gate.settle_unanswered(result.call_id, result.reason or "failed")


@dataclass(frozen=True, slots=True)
class PlacedSipCall:
    """A dial order handed to a worker."""

    worker_id: str


async def dial_sip_call(
    state: GatewayState,
    *,
    call_id: str,
    to: str,
    from_: str,
    tap_url: str,
    context: SpendContext,
) -> PlacedSipCall | None:
    """Hand an admitted outbound call to a SIP worker; None when no worker can take it."""
    link = state.sip_workers.pick()
    if link is None:
        return None
    spend = context.encode()
    token = StreamTokenSigner(state.config.stream_secret).issue(call_id, tap_url, spend)
    link.dialling.add(call_id)
    sent = await link.send(
        encode_control(Dial(call_id, to, from_, tap_url, spend, token, SIP_RING_TIMEOUT_S))
    )
    if not sent:
        link.dialling.discard(call_id)
        return None
    state.watch_media_connect(
        call_id,
        release_if_never_connected(
            state, call_id, SIP_RING_TIMEOUT_S + state.config.spend.media_connect_timeout_s
        ),
    )
    return PlacedSipCall(link.worker_id)


async def cancel_sip_dial(state: GatewayState, worker_id: str, call_id: str) -> None:
    """Ask the worker to CANCEL a call it is still dialling (best effort)."""
    link = state.sip_workers.get(worker_id)
    if link is not None:
        await link.send(encode_control(CancelDial(call_id)))


# ---- /sip/stream -----------------------------------------------------------------------------


async def sip_stream(websocket: WebSocket) -> None:
    """One answered SIP call's media socket, opened by the worker that holds the leg."""
    state = _state(websocket)
    config = state.config
    metrics = state.metrics
    if not _bearer_ok(websocket, config.sip_secret):
        metrics.bad_messages.labels("sip", "unauthorized").inc()
        await refuse(websocket, CLOSE_POLICY_VIOLATION, "unauthorized")
        return
    await websocket.accept()
    codec = SipMediaCodec()
    started = await await_start(websocket, state, "sip", codec.receive, binary=True)
    if started is None:
        return
    params: Mapping[str, str] = started.custom_parameters
    tap_url = params.get(PARAM_TAP_URL, "")
    context = await trusted_context(
        websocket,
        state,
        "sip",
        call_id=started.call.call_id,
        tap_url=tap_url,
        spend_text=params.get(PARAM_SPEND, ""),
        token=params.get(PARAM_TOKEN),
    )
    if context is None:
        return
    edge = SipEdge(websocket, codec)
    live: list[Call] = []  # the call, once run_metered_call has built it
    control = state.sip_call_control
    control.attach(context.call_id, edge)

    async def next_event() -> IngressEvent | StreamEnded:
        while True:
            event: IngressEvent | ControlResult | StreamEnded = await read_event(
                websocket, state, "sip", codec.receive, binary=True, on_fatal=edge.close
            )
            if isinstance(event, StreamEnded):
                edge.abandon()
                return event
            if isinstance(event, ControlResult):
                if not edge.resolve(event):
                    metrics.bad_messages.labels("sip", "unexpected_control_result").inc()
                elif event.ok and live:
                    # The leg is gone (BYE/REFER done): whoever asked - the brain's tool
                    # or the API - ends the call now with its own reason. Wait for that
                    # rather than read on, so no close of the socket races it.
                    call = live[0]
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(CONTROL_RESULT_TIMEOUT_S):
                            await call.ended.wait()
                    if call.ended.is_set():
                        return StreamEnded(call.end_reason or SessionEndReason.HANGUP_TOOL)
                continue
            return event

    try:
        await run_metered_call(
            state,
            started=started,
            context=context,
            tap_url=tap_url,
            edge=edge,
            provider="sip",
            call_control=control,
            next_event=next_event,
            on_call=live.append,
        )
    finally:
        control.detach(context.call_id)
