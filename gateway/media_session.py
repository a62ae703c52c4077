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

from brains.tap import SessionEndReason
from gateway.call import Call, CallEdge, monotonic_ms
from gateway.spend_context import SpendContext
from gateway.state import GatewayState
from spend.gate import Admission, AdmissionRequest, wall_ms
from spend.meter import CallCaps
from spend.store import StoreUnavailable
from trunk.call_control import ProviderCallControl
from trunk.events import IngressEvent, StreamStarted, StreamStopped

log = logging.getLogger(__name__)


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
) -> None:
    """Run the call until its stream stops or the call ends; always end and settle it."""
    config = state.config
    gate = state.spend_gate
    assert gate is not None, "the spend gate starts with the app"
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
    if state.spend_store is not None:
        try:
            await state.spend_store.update_call(
                context.call_id, status="active", answered_ms=wall_ms()
            )
        except StoreUnavailable:
            log.warning("call %s: Redis unreachable at answer; metering locally", call.call_id)
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


async def release_if_never_connected(state: GatewayState, call_id: str, delay_s: float) -> None:
    """Settle an admission at zero if its media stream never opened (on any process)."""
    await asyncio.sleep(delay_s)
    store, gate = state.spend_store, state.spend_gate
    assert store is not None and gate is not None
    try:
        record = await store.get_call(call_id)
        if record is not None and record["status"] == "admitted":
            log.warning("call %s: admitted but no media stream came; releasing it", call_id)
            await gate.settle_unanswered(call_id, "no_media")
    except StoreUnavailable:
        # Its lease runs out and any gateway's reaper settles it once Redis is back.
        log.warning("call %s: could not release an unconnected admission (Redis)", call_id)
