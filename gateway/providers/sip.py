"""SIP legs from the worker pool as an ingress provider: control channel, media leg, dialling.

The sans-I/O pieces are in ``trunk/sip/`` (the worker wire contract
``trunk/sip/wire.py``, the worker links); the workers themselves terminate SIP
with pjsua2 (docs/SIP.md). This module is the gateway adapter of the registry
(``gateway/providers/__init__.py``):

- ``/sip/workers`` (WebSocket, one per worker process, ``Authorization: Bearer
  <RUTSTER_SIP_SECRET>``): the worker says ``hello``, asks admission for each
  INVITE it accepted at the SIP level (``invite`` → ``admit``/``refuse``) and
  reports the outcome of calls the gateway asked it to dial (``dial`` →
  ``dial_result``).
- ``/sip/stream`` (WebSocket, one per answered call, served by
  ``gateway/media_socket.py``): the internal media contract, parsed into the
  same ingress events as a Twilio stream; the worker's ``control_result``
  messages answer this leg's hang-ups and transfers.
- Call control: the brain's ``hangup``/``transfer`` tools and API hang-ups on
  SIP calls travel down the call's media socket to its worker, which sends BYE
  or REFER and reports back (:class:`~trunk.sip.worker_links.SipCallControl`).
- Outbound calls for ``POST /v1/calls``: a ``dial`` order to a connected worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
from collections.abc import Sequence

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from rutster.base.ws_close import CLOSE_POLICY_VIOLATION
from rutster.gateway.admission import REASON_DRAINING, Refused, admit_call, grant_stream
from rutster.gateway.call import Call
from rutster.gateway.control_channel import ControlOutcome, ControlReply, ControlRequest
from rutster.gateway.ingress_provider import (
    NO_RATES,
    DialFailed,
    MediaLeg,
    ProviderCapabilities,
    StreamParams,
)
from rutster.gateway.media_session import StreamEnded
from rutster.gateway.media_socket import refuse
from rutster.gateway.overload_guard import REASON_NODE_FULL, REASON_NODE_OVERLOADED
from rutster.gateway.spend_context import BadSpendContext, SpendContext
from rutster.gateway.state import GatewayState
from rutster.protocols.call_control import ProviderCallControl
from rutster.protocols.ingress import StreamStarted
from rutster.protocols.tap import SessionEndReason
from rutster.spend.gate import AdmissionRequest
from rutster.spend.store import CallRecord, StoreUnavailable
from rutster.trunk.sip.wire import (
    PARAM_SPEND,
    PARAM_TAP_URL,
    PARAM_TOKEN,
    PROVIDER,
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
    sniff_sip_stream,
)
from rutster.trunk.sip.worker_links import CONTROL_RESULT_TIMEOUT_S, SipEdge, SipWorkerLink

log = logging.getLogger(__name__)

#: Its endpoints.
WORKERS_PATH = "/sip/workers"
MEDIA_PATH = "/sip/stream"
#: SIP answers to a refused admission (RFC 3261 §21): 486 Busy Here for
#: ``RUTSTER_REFUSAL_RESPONSE=busy``, 603 Decline otherwise (there is no spoken
#: refusal on SIP before answering), 503 when Redis could not be asked.
SIP_BUSY = 486
SIP_DECLINE = 603
SIP_UNAVAILABLE = 503
#: Refusal reasons that mean "ask again later" (or elsewhere) rather than "no": Redis
#: unreachable, this node full, overloaded or draining (the trunk tries its next route).
RETRYABLE_REFUSALS = frozenset(
    {"store_unavailable", REASON_DRAINING, REASON_NODE_FULL, REASON_NODE_OVERLOADED}
)
#: A worker's id: short, safe for logs and metrics labels.
WORKER_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: Ring time for calls the API places over SIP: as for Twilio's Timeout (30 s).
SIP_RING_TIMEOUT_S = 30


#: ``provider_call_id`` of a SIP call the API placed: the worker that dials it
#: (``sip-worker:<worker>``), and the node it is attached to when that is another
#: node than the one the API request reached (``sip-worker:<worker>@<node>``).
SIP_CALL_PREFIX = "sip-worker:"
#: Control operations (gateway/control_channel.py) a node answers for the others: dial
#: through one of its workers, cancel such a dial.
OP_SIP_DIAL = "sip_dial"
OP_SIP_CANCEL = "sip_cancel"
#: The node-directory field carrying a node's free SIP worker capacity.
INFO_SIP_FREE = "sip_free"


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
    to_user = sip_user(invite.to)
    tap_url = config.tap_url_by_number.get(to_user) or config.tap_url
    admitted = await admit_call(
        state,
        AdmissionRequest(
            tenant=config.spend.tenant_for_number(to_user),
            provider=PROVIDER,
            direction="inbound",
            caller=sip_user(invite.from_),
            to=to_user,
            brain=tap_url,
            provider_call_id=invite.sip_call_id[:64],
        ),
    )
    if isinstance(admitted, Refused):
        if admitted.reason in RETRYABLE_REFUSALS:
            code = SIP_UNAVAILABLE
        else:
            code = SIP_BUSY if config.spend.refusal_response == "busy" else SIP_DECLINE
        log.info("SIP call refused by the spend gate: %s (SIP %d)", admitted.reason, code)
        await link.send(encode_control(Refuse(invite.ref, code, admitted.reason)))
        return
    call_id = admitted.call_id
    grant = grant_stream(state, admitted, stream_call_id=call_id, tap_url=tap_url)
    if not await link.send(
        encode_control(Admit(invite.ref, call_id, tap_url, grant.spend_text, grant.token))
    ):
        log.warning("call %s: SIP worker left before its admission was sent", call_id)


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


# ---- /sip/stream -----------------------------------------------------------------------------


class SipMediaLeg:
    """One ``/sip/stream`` socket: audio in binary frames, and ``control_result``
    messages that answer the hang-ups and transfers sent down it."""

    binary_frames = True

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        self._codec = SipMediaCodec()
        self._edge = SipEdge(websocket, self._codec)
        self._state = state

    @property
    def edge(self) -> SipEdge:
        """Encodes commands for the worker (audio frames, marks, clear, BYE, REFER)."""
        return self._edge

    def decode(self, frame: str | bytes) -> object:
        """A media event, or a ``ControlResult``."""
        return self._codec.receive(frame)

    @property
    def call_control(self) -> ProviderCallControl | None:
        """BYE and REFER through the worker, over this socket."""
        return self._state.sip_call_control

    def attach(self, context: SpendContext) -> None:
        """Route this call's hang-ups and transfers over this socket."""
        self._state.sip_call_control.attach(context.call_id, self._edge)

    async def on_message(self, message: object, call: Call | None) -> StreamEnded | None:
        """A worker's ``control_result``: wake whoever asked; once the leg is gone (BYE or
        REFER done) wait for the asker to end the call with its own reason, rather than
        read on, so no close of the socket races it."""
        metrics = self._state.metrics
        if not isinstance(message, ControlResult):
            metrics.bad_messages.labels(PROVIDER, "unexpected_message").inc()
            return None
        if not self._edge.resolve(message):
            metrics.bad_messages.labels(PROVIDER, "unexpected_control_result").inc()
            return None
        if not message.ok or call is None:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CONTROL_RESULT_TIMEOUT_S):
                await call.ended.wait()
        if call.ended.is_set():
            return StreamEnded(call.end_reason or SessionEndReason.HANGUP_TOOL)
        return None

    def detach(self, context: SpendContext) -> None:
        """The call is over: its call control has no socket any more."""
        self._state.sip_call_control.detach(context.call_id)

    def stream_ended(self) -> None:
        """Fail any hang-up or transfer still waiting for the worker's answer."""
        self._edge.abandon()


class SipProvider:
    """SIP legs terminated by the pjsua2 worker pool (docs/SIP.md)."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="the worker drops its queued playout at once (trunk/sip/leg_playout.py)",
        wire_format="audio/L16;rate=16000 in binary frames, JSON text events",
        dials_sip_uris=True,
        outbound=True,
    )
    #: Its rates are in the built-in price table (spend/prices.py).
    default_rates = NO_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The workers' control channel."""
        return [WebSocketRoute(WORKERS_PATH, sip_workers)]

    async def startup(self, state: GatewayState) -> None:
        """Workers connect to :data:`WORKERS_PATH` themselves. Register what other nodes
        may ask of this one (dial or cancel through its workers) and what it tells them
        (its free worker capacity, in the node directory)."""

        async def remote_dial(request: ControlRequest) -> ControlReply:
            return await _dial_for_another_node(state, request)

        async def remote_cancel(request: ControlRequest) -> ControlReply:
            return await _cancel_for_another_node(state, request)

        state.control_handlers[OP_SIP_DIAL] = remote_dial
        state.control_handlers[OP_SIP_CANCEL] = remote_cancel
        state.node_info[INFO_SIP_FREE] = lambda: str(_free_here(state))

    async def shutdown(self, state: GatewayState) -> None:
        """Nothing to close: the workers' sockets close with the server."""

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """Only workers holding ``RUTSTER_SIP_SECRET`` open media sockets."""
        if _bearer_ok(websocket, state.config.sip_secret):
            return None
        state.metrics.bad_messages.labels(PROVIDER, "unauthorized").inc()
        return "unauthorized"

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """A fresh codec and edge for one socket."""
        return SipMediaLeg(websocket, state)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The ``start`` fields the worker copied from the ``admit``/``dial`` it was given."""
        params = started.custom_parameters
        return StreamParams(
            tap_url=params.get(PARAM_TAP_URL, ""),
            spend_text=params.get(PARAM_SPEND, ""),
            token=params.get(PARAM_TOKEN),
        )

    def sniff(self, first_message: str | bytes) -> bool:
        """The worker's ``start`` (its ``sip_call_id`` field is SIP's alone)."""
        return sniff_sip_stream(first_message)

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        """Placing calls needs a worker with room, on this node or another one."""
        if len(state.sip_workers) > 0 or _nodes_with_room(state):
            return None
        return "outbound SIP calls need a SIP worker connected to a gateway"

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        """Hand the admitted call to the least-loaded worker of this node, else to a
        node whose workers have room (through the control channel); the worker rings
        for :data:`SIP_RING_TIMEOUT_S` and reports back to the node it is attached to."""
        placed = await _dial_here(state, context, to=to, from_=from_, tap_url=tap_url)
        if placed is not None:
            return placed
        channel = state.control_channel
        args = {"to": to, "from": from_, "tap_url": tap_url, "spend_text": context.encode()}
        for node in _nodes_with_room(state):
            if channel is None:
                break
            try:
                reply = await channel.request(node, OP_SIP_DIAL, context.call_id, args=args)
            except StoreUnavailable:
                break
            if reply.outcome is ControlOutcome.DONE:
                log.info("call %s: dialled through a SIP worker of node %s", context.call_id, node)
                return reply.value
            log.info("call %s: node %s did not dial (%s)", context.call_id, node, reply.outcome)
        raise DialFailed("no SIP worker could take the call")

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        """Ask the dialling worker to CANCEL (best effort: it may have just answered),
        through the node it is attached to."""
        sid = record["provider_call_id"]
        if not sid.startswith(SIP_CALL_PREFIX):
            return
        worker, _, node = sid.removeprefix(SIP_CALL_PREFIX).partition("@")
        if node and node != state.config.spend.node_id:
            if state.control_channel is not None:
                with contextlib.suppress(StoreUnavailable, ValueError):
                    await state.control_channel.request(
                        node, OP_SIP_CANCEL, record["id"], args={"worker": worker}
                    )
            return
        await _cancel_here(state, worker, record["id"])


def _free_here(state: GatewayState) -> int:
    """Calls this node's workers can still take."""
    return sum(max(0, link.free) for link in state.sip_workers.links())


def _nodes_with_room(state: GatewayState) -> list[str]:
    """Other live nodes whose workers had room at their last beat, the roomiest first."""
    gate = state.spend_gate
    if gate is None:
        return []
    room: list[tuple[int, str]] = []
    for node, info in gate.cluster.items():
        try:
            free = int(info.get(INFO_SIP_FREE, "0"))
        except ValueError:
            continue
        if free > 0:
            room.append((free, node))
    return [node for _, node in sorted(room, reverse=True)]


async def _dial_here(
    state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
) -> str | None:
    """Dial through one of this node's workers; None when none has room."""
    link = state.sip_workers.pick()
    if link is None:
        return None
    call_id = context.call_id
    grant = grant_stream(
        state,
        context,
        stream_call_id=call_id,
        tap_url=tap_url,
        connect_within_s=SIP_RING_TIMEOUT_S + state.config.spend.media_connect_timeout_s,
    )
    link.dialling.add(call_id)
    dial = Dial(call_id, to, from_, tap_url, grant.spend_text, grant.token, SIP_RING_TIMEOUT_S)
    if not await link.send(encode_control(dial)):
        link.dialling.discard(call_id)
        return None
    return f"{SIP_CALL_PREFIX}{link.worker_id}"


async def _cancel_here(state: GatewayState, worker: str, call_id: str) -> None:
    link = state.sip_workers.get(worker)
    if link is not None:
        await link.send(encode_control(CancelDial(call_id)))


async def _dial_for_another_node(state: GatewayState, request: ControlRequest) -> ControlReply:
    """Another node admitted a call and asks this one to dial it through a worker."""
    args = request.args
    try:
        context = SpendContext.decode(args.get("spend_text"))
    except BadSpendContext:
        return ControlReply(ControlOutcome.FAILED, "bad call context")
    tap_url = args.get("tap_url", "")
    if context.call_id != request.call_id or not state.config.tap_allowlist.allows(tap_url):
        return ControlReply(ControlOutcome.FAILED, "call context or brain refused")
    placed = await _dial_here(
        state, context, to=args.get("to", ""), from_=args.get("from", ""), tap_url=tap_url
    )
    if placed is None:
        return ControlReply(ControlOutcome.NOT_HERE, "no SIP worker with room")
    return ControlReply(ControlOutcome.DONE, f"{placed}@{state.config.spend.node_id}")


async def _cancel_for_another_node(state: GatewayState, request: ControlRequest) -> ControlReply:
    """Another node cancels a call this one dialled for it."""
    await _cancel_here(state, request.args.get("worker", ""), request.call_id)
    return ControlReply(ControlOutcome.DONE)
