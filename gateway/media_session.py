"""One metered call on one media socket: what every ingress adapter runs once its stream is trusted.

Twilio's ``/twilio/stream`` and the SIP worker's ``/sip/stream`` differ in how
they parse frames and authenticate the socket; from the verified ``start`` on
they do the same thing: open the call's spend meter from the admission the
webhook (or the SIP worker's control channel) made, build the ``Call``, feed it
ingress events until the stream stops, then end, settle and forget it. That
shared part lives here so the core has one ingress path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rutster.gateway.call import Call, CallEdge, monotonic_ms
from rutster.gateway.spend_context import SpendContext
from rutster.gateway.state import GatewayState
from rutster.protocols.call_control import ProviderCallControl
from rutster.protocols.ingress import IngressEvent, StreamStarted, StreamStopped
from rutster.protocols.tap import SessionEndReason
from rutster.spend.gate import Admission, AdmissionRequest, wall_ms
from rutster.spend.meter import CallCaps
from rutster.spend.store import HEARTBEAT_INTERVAL_MS, StoreUnavailable

log = logging.getLogger(__name__)

#: How often an admitted call waiting for its stream has its lease renewed: as often as a
#: live call's heartbeat (spend/store.py ``HEARTBEAT_INTERVAL_MS``), well inside the lease.
HOLD_INTERVAL_S = HEARTBEAT_INTERVAL_MS / 1_000
#: End reason of an admission whose media stream never opened.
REASON_NO_MEDIA = "no_media"
#: Close reason for a media socket of a call the store already ended.
REASON_CALL_ENDED = "call already ended"


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The media socket is gone (or must be closed); the call ends with ``reason``."""

    reason: SessionEndReason


#: The adapter's reader: the next ingress event, or ``StreamEnded``. Bad frames are
#: the adapter's business (counted and dropped, or turned into ``StreamEnded``).
NextEvent = Callable[[], Awaitable[IngressEvent | StreamEnded]]


async def run_metered_call(
    state: GatewayState,
    *,
    started: StreamStarted,
    context: SpendContext,
    tap_url: str,
    edge: CallEdge,
    provider: str,
    call_control: ProviderCallControl | None,
    next_event: NextEvent,
    on_call: Callable[[Call], None] | None = None,
    connected: bool = False,
) -> None:
    """Run the call until its stream stops or the call ends; always end and settle it.

    ``connected``: the media socket already made the call active in the store
    (``SpendStore.connect``); if not (Redis was unreachable then), it is tried again
    here, best effort, and a call found settled meanwhile is ended at once.
    """
    config = state.config
    gate = state.spend_gate
    assert gate is not None, "the spend gate starts with the app"
    if not connected and not await _connect_late(state, context.call_id):
        # Settled as never connected while Redis was away: nobody pays for this call.
        log.warning("call %s: settled before its media connected; not started", context.call_id)
        await edge.close(REASON_CALL_ENDED)
        return
    spend = gate.open(
        Admission(
            context.call_id,
            True,
            "ok",
            CallCaps(context.max_duration_s, context.max_cost),
            context.first_quantum,
            context.degraded,
        ),
        AdmissionRequest(
            tenant=context.tenant,
            provider=provider,
            direction=context.direction,
            caller=started.call.from_,
            to=started.call.to,
            brain=tap_url,
        ),
        round(monotonic_ms()),
    )
    call = Call(
        started,
        tap_url=tap_url,
        config=config,
        metrics=state.metrics,
        edge=edge,
        call_control=call_control,
        spend=spend,
        goodbye_text=config.spend.goodbye_text,
    )
    state.add_call(call)
    state.media_connected(context.call_id)
    if on_call is not None:
        on_call(call)
    reason = SessionEndReason.CALLER_HANGUP
    try:
        await call.start()
        while not call.ended.is_set():
            event = await next_event()
            if isinstance(event, StreamEnded):
                reason = event.reason
                break
            await call.on_ingress(event)
            if isinstance(event, StreamStopped):
                break
    except asyncio.CancelledError:
        reason = SessionEndReason.SHUTDOWN
        raise
    finally:
        await call.end(reason)
        state.remove_call(call)
        await edge.close("call ended")


async def _connect_late(state: GatewayState, call_id: str) -> bool:
    """Make the call active now that its media runs; False only when the store says
    it ended before (settled as never connected): it must not run."""
    store = state.spend_store
    if store is None:
        return True
    try:
        connected = await store.connect(call_id, state.config.spend.node_id, wall_ms())
    except StoreUnavailable:
        log.warning("call %s: Redis unreachable at answer; metering locally", call_id)
        return True
    return connected.won or connected.status not in ("ended", "refused")


async def release_if_never_connected(
    state: GatewayState,
    call_id: str,
    delay_s: float,
    *,
    reason: str = REASON_NO_MEDIA,
    give_up: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Hold an admission while its media stream may still come, then settle it at zero if
    it never did (on any process).

    Until ``delay_s`` has passed the call's lease is renewed every
    :data:`HOLD_INTERVAL_S` (``SpendStore.hold``), so the reaper never charges a call that
    is still ringing or opening its stream its full reservation: nothing is billed before
    an answer. The wait ends early once the call is no longer "admitted" (its stream
    started on some node, or the provider's status callback settled it). At the deadline
    ``give_up`` runs first (e.g. cancel the provider's call, so it cannot be answered
    after its admission is gone), then the call is settled at zero with ``reason``.
    """
    store, gate = state.spend_store, state.spend_gate
    assert store is not None and gate is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + delay_s
    while (left := deadline - loop.time()) > 0:
        try:
            held = await store.hold(call_id, wall_ms(), lease_ms=gate.policy.lease_ms)
        except StoreUnavailable:
            log.debug("call %s: could not renew an unconnected admission (Redis)", call_id)
        else:
            if not held.held:
                return  # connected (here or on another node), or already settled
        await asyncio.sleep(min(HOLD_INTERVAL_S, left))
    try:
        record = await store.get_call(call_id)
        if record is not None and record["status"] == "admitted":
            log.warning("call %s: admitted but no media stream came; releasing it", call_id)
            if give_up is not None:
                await give_up()
            # Atomic against SpendStore.connect: a stream that started on another node
            # since the read above keeps its call (settle_unanswered returns False).
            if not await gate.settle_unanswered(call_id, reason):
                log.info("call %s: its media started meanwhile; not released", call_id)
    except StoreUnavailable:
        # Its lease runs out and any gateway's reaper settles it once Redis is back.
        log.warning("call %s: could not release an unconnected admission (Redis)", call_id)
