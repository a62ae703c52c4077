"""The spend gate: admission, per-call reservations and settlement, and the failure policy.

The asyncio glue between the sans-I/O :class:`~spend.meter.CallMeter` and the
Redis :class:`~spend.store.SpendStore`:

- :meth:`SpendGate.admit` works out the call's caps (the tightest of what the
  request asks, the tenant's limits and the gateway's ceilings), and reserves
  the first quantum in one atomic script that checks every limit. Redis down:
  refused (``store_unavailable``) unless the operator chose to admit anyway.
- :class:`CallSpend` runs beside a live call: :meth:`CallSpend.tick` extends the
  reservation before it runs out and says when the call must end
  (``budget_exhausted`` / ``max_duration``); :meth:`CallSpend.settle` records
  the actual cost and releases the rest.
- Redis down mid-call: the call goes on on what it already holds (no new money
  can be reserved without Redis); its settlement goes to the local
  :class:`~spend.journal.SpendJournal` and is replayed, exactly once, when Redis
  is back (:meth:`SpendGate.replay_journal`, run by :meth:`SpendGate.maintain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from rutster.spend.journal import SpendJournal
from rutster.spend.limits import TenantLimits, tightest
from rutster.spend.meter import (
    CallCaps,
    CallMeter,
    End,
    Extend,
    MeterSnapshot,
    QuantumPolicy,
    UsageAnomaly,
)
from rutster.spend.money import Micros
from rutster.spend.prices import PriceTable, UsageReport
from rutster.spend.store import (
    DEFAULT_LEASE_MS,
    HEARTBEAT_INTERVAL_MS,
    NODE_BEAT_INTERVAL_MS,
    AdmitRequest,
    SpendStore,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

#: A call's lease in the active sets (the store's default: six missed heartbeats):
#: if its gateway stops renewing it, the reaper settles the call at its full reservation.
LEASE_MS = DEFAULT_LEASE_MS
#: How often a live call renews its lease and publishes its running cost.
HEARTBEAT_MS = HEARTBEAT_INTERVAL_MS
#: How often a live call's meter is consulted. Seed decision: the hang-up guard
#: (``spend.meter.DEFAULT_HANGUP_GUARD_MS``, 2 s) must be longer than this.
TICK_MS = 1_000
#: How often each gateway replays its journal and reaps calls whose gateway died.
MAINTENANCE_S = 5.0
#: Ceiling on a call's length when neither the request nor the tenant sets one.
#: Seed decision: an hour is longer than any agent call we expect; a stuck call
#: must not run for a day.
DEFAULT_CALL_MAX_DURATION_S = 3_600
#: Ceiling on a call's cost when neither the request nor the tenant sets one:
#: 5 USD. Seed decision: ~1 h of gpt-realtime audio at the expected rate.
DEFAULT_CALL_MAX_COST_MICROS = 5_000_000
#: Calls reaped per maintenance round (bounds the script's run time).
REAP_BATCH = 100
#: Refusal reason when Redis cannot be asked and the policy is to refuse.
REASON_STORE_UNAVAILABLE = "store_unavailable"
#: Refusal reason when no price is configured for the call's provider/direction.
REASON_NO_PRICE = "no_price"
#: Settlement reason journalled for an admission whose answer Redis never gave.
REASON_ADMIT_UNCONFIRMED = "admit_unconfirmed"


def wall_ms() -> int:
    """Unix time in ms (what the store's windows and records use)."""
    return time.time_ns() // 1_000_000


def new_call_id() -> str:
    """A public call id: ``call_`` + 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """How the gate behaves (from the gateway's configuration)."""

    #: Limits of a tenant that has none stored (written on its first admission).
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    max_call_duration_s: int = DEFAULT_CALL_MAX_DURATION_S
    max_call_cost: Micros = DEFAULT_CALL_MAX_COST_MICROS
    #: Redis unreachable at admission: False (default) refuses the call, True admits
    #: it on a local reservation that is journalled and replayed later.
    admit_when_store_down: bool = False
    quantum: QuantumPolicy = field(default_factory=QuantumPolicy)
    lease_ms: int = LEASE_MS
    heartbeat_ms: int = HEARTBEAT_MS
    tick_ms: int = TICK_MS


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """A call asking to start. ``max_*`` are the request's own caps (None = no ask)."""

    tenant: str
    provider: str
    direction: str
    caller: str
    to: str
    brain: str
    campaign: str = ""
    max_duration_s: int | None = None
    max_cost: Micros | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    provider_call_id: str = ""
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class Admission:
    """The gate's answer: admitted or refused (with why), and the call's caps."""

    call_id: str
    admitted: bool
    reason: str
    caps: CallCaps
    first_quantum: Micros
    #: Admitted while Redis was down (fail-open policy): journalled, not yet in Redis.
    degraded: bool = False


class SpendGate:
    """Admits calls and hands out one :class:`CallSpend` per admitted call."""

    def __init__(
        self,
        store: SpendStore,
        prices: PriceTable,
        journal: SpendJournal,
        *,
        policy: GatePolicy | None = None,
        node: str = "",
        clock_wall_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.store = store
        self.prices = prices
        self.journal = journal
        self.policy = policy or GatePolicy()
        self.node = node
        self._wall_ms = clock_wall_ms
        #: Redis failures met while admitting, metering or settling (a gateway metric).
        self.store_errors = 0
        #: Calls of dead nodes this gateway settled (lua/orphans.lua).
        self.orphans_settled = 0
        #: The other live nodes and what they told at their last beat (refreshed every
        #: beat by :meth:`keep_node_alive`).
        self.cluster: dict[str, dict[str, str]] = {}

    async def tenant_limits(self, tenant: str) -> TenantLimits:
        """``tenant``'s stored limits; the defaults are stored first if it has none."""
        return await self.store.ensure_tenant_limits(tenant, self.policy.default_limits)

    def caps_for(self, request: AdmissionRequest, limits: TenantLimits) -> CallCaps:
        """The call's effective caps: the tightest of request, tenant and gateway ceilings."""
        policy = self.policy
        duration = tightest(
            request.max_duration_s or 0, limits.max_call_duration_s, policy.max_call_duration_s
        )
        cost = tightest(request.max_cost or 0, limits.max_call_cost, policy.max_call_cost)
        return CallCaps(max_duration_s=duration, max_cost_micros=cost)

    async def admit(self, request: AdmissionRequest) -> Admission:
        """Check every limit and reserve the first quantum, atomically (one script)."""
        call_id = request.call_id or new_call_id()
        now = self._wall_ms()
        try:
            rate = self.prices.telephony_rate(request.provider, request.direction)
        except LookupError:
            log.warning(
                "call refused: no price for provider %s %s", request.provider, request.direction
            )
            return self._refusal(call_id, REASON_NO_PRICE, CallCaps(1, 0), 0)
        try:
            limits = await self.tenant_limits(request.tenant)
        except StoreUnavailable as exc:
            return await self._store_down_admission(
                call_id, request, self.policy.default_limits, rate.cost(0), exc, sent=False
            )
        caps = self.caps_for(request, limits)
        quantum = min(self.policy.quantum.quantum_micros(rate), caps.max_cost_micros)
        admit = self._admit_request(call_id, request, caps, quantum, now)
        try:
            result = await self.store.admit(admit)
        except StoreUnavailable as exc:
            return await self._store_down_admission(
                call_id, request, limits, quantum, exc, sent=True
            )
        if not result.admitted:
            return self._refusal(call_id, result.reason, caps, quantum)
        return Admission(call_id, True, "ok", caps, quantum)

    def _admit_request(
        self,
        call_id: str,
        request: AdmissionRequest,
        caps: CallCaps,
        quantum: Micros,
        now: int,
        *,
        force: bool = False,
    ) -> AdmitRequest:
        return AdmitRequest(
            call_id=call_id,
            tenant=request.tenant,
            now_ms=now,
            quantum=quantum,
            lease_ms=self.policy.lease_ms,
            caller=request.caller,
            campaign=request.campaign,
            provider=request.provider,
            direction=request.direction,
            to=request.to,
            brain=request.brain,
            node=self.node,
            max_cost=caps.max_cost_micros,
            max_duration_s=caps.max_duration_s,
            provider_call_id=request.provider_call_id,
            metadata=dict(request.metadata),
            # The abuse gate counts callers; an outbound call's "caller" is the
            # tenant's own number, which campaign limits cover instead.
            check_caller=request.direction == "inbound",
            force=force,
        )

    def _refusal(self, call_id: str, reason: str, caps: CallCaps, quantum: Micros) -> Admission:
        return Admission(call_id, False, reason, caps, quantum)

    async def _store_down_admission(
        self,
        call_id: str,
        request: AdmissionRequest,
        limits: TenantLimits,
        quantum: Micros,
        cause: StoreUnavailable,
        *,
        sent: bool,
    ) -> Admission:
        """Redis failed during admission (``cause``). ``sent``: the admit script may have run."""
        self.store_errors += 1
        caps = self.caps_for(request, limits)
        rate = self.prices.telephony_rate(request.provider, request.direction)
        quantum = quantum or min(self.policy.quantum.quantum_micros(rate), caps.max_cost_micros)
        now = self._wall_ms()
        if not self.policy.admit_when_store_down:
            log.warning("call refused (fail-closed policy): %s", cause)
            if sent:
                # Redis may have applied the admission before the connection broke:
                # release whatever it reserved once it is back (a no-op if it did not).
                await self.journal.record_settle(call_id, 1, 0, now, REASON_ADMIT_UNCONFIRMED)
            return self._refusal(call_id, REASON_STORE_UNAVAILABLE, caps, quantum)
        log.warning(
            "call %s admitted WITHOUT the spend store (fail-open policy): it runs on one "
            "quantum and is recorded when Redis is back",
            call_id,
        )
        await self.journal.record_admit(
            self._admit_request(call_id, request, caps, quantum, now, force=True)
        )
        return Admission(call_id, True, "ok", caps, quantum, degraded=True)

    def open(self, admission: Admission, request: AdmissionRequest, started_ms: int) -> CallSpend:
        """Start metering an admitted call whose billing starts at ``started_ms`` (monotonic)."""
        meter = CallMeter(
            self.prices,
            provider=request.provider,
            direction=request.direction,
            started_ms=started_ms,
            caps=admission.caps,
            quantum=self.policy.quantum,
        )
        meter.on_reserved(admission.first_quantum)
        return CallSpend(
            self, admission.call_id, request.tenant, meter, degraded=admission.degraded
        )

    async def settle_unanswered(self, call_id: str, reason: str) -> bool:
        """Settle a call that never connected (no answer, busy, failed, no media in
        time) at zero; False when its media did start after all (on any node: the
        check is atomic with ``SpendStore.connect``) and it was left alone. Redis
        unreachable: journalled, with the same condition on replay (True)."""
        now = self._wall_ms()
        try:
            settled = await self.store.settle(call_id, 1, 0, now, reason, unconnected_only=True)
        except StoreUnavailable:
            self.store_errors += 1
            await self.journal.record_unconnected_settle(call_id, now, reason)
            log.warning("call %s: Redis unreachable; its zero settlement journalled", call_id)
            return True
        return settled.status != "connected"

    async def _settle(self, call_id: str, *, seq: int, actual: Micros, reason: str) -> bool:
        """Settle in Redis, or journal the settlement; True if Redis took it now."""
        now = self._wall_ms()
        try:
            await self.store.settle(call_id, seq, actual, now, reason)
        except StoreUnavailable:
            self.store_errors += 1
            await self.journal.record_settle(call_id, seq, actual, now, reason)
            log.warning(
                "call %s: Redis unreachable at settlement; %d micros journalled locally for replay",
                call_id,
                actual,
            )
            return False
        return True

    async def replay_journal(self) -> int:
        """Apply journalled records to Redis (idempotent); how many were applied."""
        if not self.journal.pending():
            return 0
        report = await self.journal.replay(self.store)
        if report.applied or report.replayed:
            log.info(
                "spend journal: %d record(s) replayed into Redis (%d already there, "
                "%d still pending)",
                report.applied,
                report.replayed,
                report.remaining,
            )
        return report.applied

    async def join_cluster(self) -> None:
        """At startup: settle what a previous life of this node id left active (this
        process holds no call yet), then beat into the node directory."""
        now = self._wall_ms()
        report = await self.store.settle_orphans(now, restarted_node=self.node)
        self._count_orphans(report.settled, "its previous run")
        await self.store.node_beat(self.node, now)

    async def keep_node_alive(self, info: Callable[[], Mapping[str, str]] | None = None) -> None:
        """Forever: beat into the node directory (with ``info()``, what this node tells
        the others), read the other live nodes' (:attr:`cluster`), and settle the live
        calls of nodes that stopped beating (any node may; the script is safe to race)."""
        while True:
            with contextlib.suppress(StoreUnavailable):
                now = self._wall_ms()
                await self.store.node_beat(self.node, now, info() if info is not None else None)
                live = await self.store.live_nodes(now)
                self.cluster = {n: i for n, i in live.items() if n != self.node}
                report = await self.store.settle_orphans(now)
                self._count_orphans(report.settled, "dead nodes")
            await asyncio.sleep(NODE_BEAT_INTERVAL_MS / 1_000)

    async def leave_cluster(self) -> None:
        """At a clean stop, its calls over: out of the node directory."""
        with contextlib.suppress(StoreUnavailable):
            await self.store.node_leave(self.node)

    def _count_orphans(self, settled: int, whose: str) -> None:
        if settled:
            self.orphans_settled += settled
            log.warning(
                "settled %d call(s) left active by %s from their last reported cost "
                "(end reason node_lost)",
                settled,
                whose,
            )

    async def maintain(self) -> None:
        """Forever: replay the journal and reap calls whose gateway died."""
        while True:
            await asyncio.sleep(MAINTENANCE_S)
            with contextlib.suppress(StoreUnavailable):
                await self.replay_journal()
                reaped = await self.store.reap(self._wall_ms(), REAP_BATCH)
                if reaped:
                    log.warning(
                        "reaped %d call(s) whose gateway stopped renewing them; settled at "
                        "their full reservation",
                        reaped,
                    )


#: Event published (stage "spend") for each :class:`~spend.meter.UsageAnomaly` of a call;
#: its payload is :meth:`~spend.meter.UsageAnomaly.payload` (the anomaly's ``kind`` and counts).
EVENT_USAGE_ANOMALY = "usage_anomaly"

#: ``publish(type, payload)``: how a call's spend events reach its event bus.
Publish: TypeAlias = Callable[[str, Mapping[str, int | str]], None]


class CallSpend:
    """One live call's spend: extends its reservation, ends it when money runs out, settles.

    Brain usage is billed up to the meter's ceiling and the settlement is never
    above the reservation; each clamp is published as a ``usage_anomaly`` event
    (:data:`EVENT_USAGE_ANOMALY`) and counted in ``anomalies``.
    """

    def __init__(
        self, gate: SpendGate, call_id: str, tenant: str, meter: CallMeter, *, degraded: bool
    ) -> None:
        self.gate = gate
        self.call_id = call_id
        self.tenant = tenant
        self.meter = meter
        #: True while Redis could not be reached for this call (it runs on what it holds).
        self.degraded = degraded
        self._seq = 0
        self._last_heartbeat_ms: int | None = None
        self._settled = False
        self.extensions = 0
        self.refusals = 0
        #: Usage anomalies met (over_ceiling reports, an over_reservation settlement).
        self.anomalies = 0

    def on_usage(
        self, usage: UsageReport, now_ms: int, publish: Publish | None = None
    ) -> UsageAnomaly | None:
        """A brain ``usage`` event: add its tokens to the running cost (up to the ceiling).

        An implausible report is clamped, never refused: its anomaly is returned and
        published.
        """
        anomaly = self.meter.on_tap_usage(usage, now_ms)
        self._record(anomaly, publish)
        return anomaly

    def _record(self, anomaly: UsageAnomaly | None, publish: Publish | None) -> None:
        if anomaly is None:
            return
        self.anomalies += 1
        if publish is not None:
            publish(EVENT_USAGE_ANOMALY, anomaly.payload())

    def snapshot(self, now_ms: int) -> MeterSnapshot:
        """Cost and reservation now (for receipts and the dashboard)."""
        return self.meter.snapshot(now_ms)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def tick(self, now_ms: int, publish: Publish | None = None) -> End | None:
        """Consult the meter: extend the reservation, renew the lease, or say the call must end.

        The running cost given to the store is what would be settled now (at most the
        reservation), so a reaper that settles this call never charges more.
        """
        decision = self.meter.decide(now_ms)
        if isinstance(decision, End):
            return decision
        gate = self.gate
        if isinstance(decision, Extend):
            cost = self.meter.cost_ms(now_ms)
            try:
                result = await gate.store.extend(
                    self.call_id,
                    self._next_seq(),
                    decision.amount,
                    gate._wall_ms(),
                    self.meter.settlement(now_ms),
                    lease_ms=gate.policy.lease_ms,
                )
            except StoreUnavailable:
                gate.store_errors += 1
                self.degraded = True
                self.meter.on_extension_failed()
                return None
            self.degraded = False
            self._last_heartbeat_ms = now_ms
            if result.granted:
                self.extensions += 1
                self.meter.on_reserved(result.reserved_total)
            else:
                self.refusals += 1
                self.meter.on_extension_refused()
            if publish is not None:
                publish(
                    "spend_extension" if result.granted else "spend_extension_refused",
                    {
                        "amount": decision.amount,
                        "reserved": self.meter.reserved,
                        "cost": cost,
                        "reason": result.reason,
                    },
                )
            return None
        last = self._last_heartbeat_ms
        if last is None or now_ms - last >= gate.policy.heartbeat_ms:
            self._last_heartbeat_ms = now_ms
            seq, at, cost = self._next_seq(), gate._wall_ms(), self.meter.settlement(now_ms)
            try:
                await gate.store.heartbeat(
                    self.call_id, seq, at, cost, lease_ms=gate.policy.lease_ms
                )
                self.degraded = False
            except StoreUnavailable:
                gate.store_errors += 1
                self.degraded = True
                # So a reaper that settles this call meanwhile charges at least this.
                await gate.journal.record_heartbeat(self.call_id, seq, at, cost)
        return None

    async def settle(self, now_ms: int, reason: str, publish: Publish | None = None) -> Micros:
        """Stop the meter and settle the actual cost (journalled if Redis is down). Once.

        The amount is the meter's cost, but never more than the reservation (nor so the
        cap); cost above it is published as an ``over_reservation`` anomaly.
        """
        self.meter.stop(now_ms)
        actual = self.meter.settlement(now_ms)
        if self._settled:
            return actual
        self._settled = True
        self._record(self.meter.over_reservation(now_ms), publish)
        await self.gate._settle(self.call_id, seq=self._next_seq(), actual=actual, reason=reason)
        return actual
