"""The one admission path: spend gate → call context → stream token → media-connect watch.

Every way a call arrives runs the same sequence, whatever its provider: a
Twilio voice webhook, a SIP worker's ``invite``, the REST API's ``POST
/v1/calls``. The provider adapter (``gateway/providers/``) turns its own
message into an :class:`~spend.gate.AdmissionRequest` and its answer (TwiML,
a SIP code, a JSON body) from what this returns; the counting, the logging,
the :class:`~gateway.spend_context.SpendContext` and the stream token are here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from rutster.base.stream_token import StreamTokenSigner
from rutster.gateway.media_session import release_if_never_connected
from rutster.gateway.spend_context import SpendContext
from rutster.gateway.state import GatewayState
from rutster.protocols.call_control import CallControlFailure, ProviderCallControl
from rutster.spend.gate import AdmissionRequest
from rutster.spend.store import StoreUnavailable

log = logging.getLogger(__name__)

#: Refusal reason of an answered placed call whose record is missing, finished or
#: someone else's (the provider called our webhook for a call we no longer hold).
REASON_UNKNOWN_PLACED_CALL = "unknown_placed_call"
#: Refusal reason when the record of a placed call could not be read (Redis down).
REASON_STORE_UNAVAILABLE = "store_unavailable"
#: Refusal reason of every admission on a node that is draining (gateway/drain.py).
REASON_DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Refused:
    """The call is not taken; ``reason`` is the spend gate's (or this module's) label."""

    reason: str


@dataclass(frozen=True, slots=True)
class StreamGrant:
    """What the provider hands to its media stream: the call context, its encoded
    form, and the per-call stream token binding them to the call and the brain."""

    context: SpendContext
    spend_text: str
    token: str


#: Longest caller or called party kept on an admission (the call record's bound).
MAX_PARTY_CHARS = 64
#: Query parameter of a provider's webhook URL selecting a brain for that number
#: (``https://gw/twilio/voice?brain=wss://...``); it must be on the allowlist.
QUERY_BRAIN = "brain"
#: What a refused caller hears with ``RUTSTER_REFUSAL_RESPONSE=say``.
REFUSAL_SAY_TEXT = "Sorry, this call cannot be taken right now. Goodbye."
#: Query parameter of a provider's webhook URL naming a call ``POST /v1/calls`` placed
#: (``?rutster_call=call_...``): its answer belongs to that admission.
QUERY_CALL = "rutster_call"
#: How long a placed call may ring, then wait for its answer webhook, before it is hung
#: up and settled at zero, where the provider's create call takes no ring timeout and
#: sends no final status we read (Telnyx's TeXML, Vonage). Seed decision: Twilio's
#: adapter allows 30 s of ringing plus a minute (gateway/providers/twilio.py).
PLACED_CALL_ANSWER_WAIT_S = 90.0


async def hang_up_quietly(
    control: ProviderCallControl, call_id: str, provider_call_id: str
) -> None:
    """Best effort: hang up a placed call that never connected, so it cannot be answered
    once its admission is released (a call already over is fine; other failures are
    logged)."""
    try:
        await control.hang_up(provider_call_id)
    except CallControlFailure as exc:
        if exc.reason != "already_ended":
            log.warning("call %s: could not cancel the unanswered call (%s)", call_id, exc.reason)


def inbound_brain(state: GatewayState, query_brain: str | None, to: str) -> str | None:
    """The brain of a call a webhook announced: the URL's ``?brain=``, else the called
    number's, else the default; None (counted) when it is not on the allowlist."""
    config = state.config
    tap_url = query_brain or config.tap_url_by_number.get(to) or config.tap_url
    if config.tap_allowlist.allows(tap_url):
        return tap_url
    state.metrics.tap_url_rejections.inc()
    log.warning("webhook refused: brain URL not on the allowlist")
    return None


def webhook_admission(
    state: GatewayState,
    *,
    provider: str,
    provider_call_id: str,
    from_: str,
    to: str,
    direction: str,
    tap_url: str,
) -> AdmissionRequest:
    """The admission request of a call that reached a provider's webhook without the
    REST API placing it.

    ``direction`` is the provider's (``inbound``, Twilio's ``outbound-api``/``-dial``,
    Plivo's ``outbound``...): a call the operator placed outside our API is priced as
    outbound and belongs to the tenant of the number it comes from.
    """
    outbound = direction.startswith("outbound")
    own_number = from_ if outbound else to
    return AdmissionRequest(
        tenant=state.config.spend.tenant_for_number(own_number),
        provider=provider,
        direction="outbound" if outbound else "inbound",
        caller=from_[:MAX_PARTY_CHARS],
        to=to[:MAX_PARTY_CHARS],
        brain=tap_url,
        provider_call_id=provider_call_id,
    )


def note_node_refusal(state: GatewayState, request: AdmissionRequest, reason: str) -> bool:
    """Write a refusal the spend gate never saw to the dashboard's recent refusals, in
    the background (the caller's answer does not wait on Redis), a few a second at most
    (``RefusalNotes``); True when this one was written down. A flood of refusals is then
    counted whole in the metric, and costs the loop it protects no more than that."""
    store = state.spend_store
    if store is None or not state.refusal_notes.take(time.monotonic()):
        return False

    async def note() -> None:
        with contextlib.suppress(StoreUnavailable):
            await store.note_refusal(
                request.tenant,
                reason,
                caller=request.caller,
                call_id=request.call_id,
                now_ms=int(time.time() * 1000),
            )

    state.run_in_background(note(), name=f"refusal-note:{reason}")
    return True


async def admit_call(state: GatewayState, request: AdmissionRequest) -> SpendContext | Refused:
    """Ask the spend gate; count and log the outcome. A degraded admission (Redis down,
    fail-open) is admitted with ``context.degraded`` set."""
    gate = state.spend_gate
    assert gate is not None, "the spend gate starts with the app"
    metrics = state.metrics
    if state.draining:
        metrics.admissions.labels("refused", REASON_DRAINING).inc()
        log.info("%s %s call refused: this node is draining", request.provider, request.direction)
        note_node_refusal(state, request, REASON_DRAINING)
        return Refused(REASON_DRAINING)
    pending = state.admitting + len(state.media_watchers)
    reason = state.overload_guard.refusal(len(state.calls), pending)
    if reason is not None:
        metrics.admissions.labels("refused", reason).inc()
        if note_node_refusal(state, request, reason):  # logged as often as noted
            log.warning(
                "%s %s call refused: %s (%d live, %d admitted waiting for media; %s)",
                request.provider,
                request.direction,
                reason,
                len(state.calls),
                pending,
                state.overload_guard.reading(),
            )
        return Refused(reason)
    state.admitting += 1
    try:
        admission = await gate.admit(request)
    finally:
        state.admitting -= 1
    if not admission.admitted:
        metrics.admissions.labels("refused", admission.reason).inc()
        log.info(
            "%s %s call refused by the spend gate: %s",
            request.provider,
            request.direction,
            admission.reason,
        )
        return Refused(admission.reason)
    metrics.admissions.labels("admitted", "degraded" if admission.degraded else "ok").inc()
    return SpendContext(
        admission.call_id,
        request.tenant,
        request.direction,
        admission.caps.max_duration_s,
        admission.caps.max_cost_micros,
        admission.first_quantum,
        admission.degraded,
    )


def grant_stream(
    state: GatewayState,
    context: SpendContext,
    *,
    stream_call_id: str,
    tap_url: str,
    connect_within_s: float | None = None,
) -> StreamGrant:
    """Sign the stream token for an admitted call and hold its admission until its media
    stream connects (settled at zero after ``connect_within_s``, by default the spend
    settings' media-connect timeout). ``stream_call_id`` is the call id the stream's
    ``start`` will carry (Twilio's CallSid; the rutster call id on SIP)."""
    config = state.config
    spend_text = context.encode()
    token = StreamTokenSigner(config.stream_secret).issue(stream_call_id, tap_url, spend_text)
    within = config.spend.media_connect_timeout_s if connect_within_s is None else connect_within_s
    state.watch_media_connect(
        context.call_id, release_if_never_connected(state, context.call_id, within)
    )
    return StreamGrant(context, spend_text, token)


async def answered_placed_call(
    state: GatewayState, call_id: str, provider_call_id: str
) -> tuple[SpendContext, str] | Refused:
    """The admission and brain of a call ``POST /v1/calls`` placed, now answered; refused
    when the record is missing, not waiting for an answer, or names another provider call."""
    store = state.spend_store
    assert store is not None
    try:
        record = await store.get_call(call_id) if call_id.startswith("call_") else None
    except ValueError:
        record = None
    except StoreUnavailable:
        log.warning("placed call %s answered while Redis is unreachable; hanging up", call_id)
        return Refused(REASON_STORE_UNAVAILABLE)
    if (
        record is None
        or record["status"] != "admitted"
        or record["direction"] != "outbound"
        or record["provider_call_id"] not in ("", provider_call_id)
    ):
        log.warning("answer of an unknown or finished placed call; refusing it")
        return Refused(REASON_UNKNOWN_PLACED_CALL)
    context = SpendContext(
        call_id,
        record["tenant"],
        "outbound",
        record["max_duration_s"],
        record["max_cost"],
        record["reserved"],
    )
    return context, record["brain"]
