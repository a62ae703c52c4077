"""A brain can never make a call settle above its reservation or its cap.

Against a real (embedded) Redis store, driven with synthetic call time:

- a report of 10**9 tokens, or of 2**63, is clamped to the usage ceiling and
  flagged (``usage_anomaly``, kind ``over_ceiling``); the call settles at most at
  what it reserved, and the tenant's next call is admitted;
- cost above the reservation at settlement (usage reported after the last tick) is
  settled at the reservation and flagged (``over_reservation``);
- a ``max_call_cost`` of exactly one billing increment runs that whole increment,
  less the hang-up guard, then ends ``budget_exhausted``, settled at the cap.

And through a whole gateway call (Twilio simulator, loopback brain): the anomaly
is a receipt of the call and a metric.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from rutster.gateway.event_bus import CallEvent, EventValue
from rutster.gateway.metrics import GatewayMetrics
from rutster.protocols.tap import Hello, TapEncoder, Usage
from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.gate import (
    DEFAULT_CALL_MAX_COST_MICROS,
    EVENT_USAGE_ANOMALY,
    TICK_MS,
    AdmissionRequest,
    CallSpend,
    GatePolicy,
    SpendGate,
)
from rutster.spend.journal import SpendJournal
from rutster.spend.limits import TenantLimits
from rutster.spend.meter import DEFAULT_HANGUP_GUARD_MS, End
from rutster.spend.prices import PriceTable
from rutster.spend.store import SpendStore, SpendTotals, redis_client, time_buckets
from rutster.tools.twilio_simulator import TwilioSimulator
from tests.conftest import (
    TEST_AUTH_TOKEN,
    eventually,
    fast_spend_settings,
    gateway_config,
    serve_gateway,
)
from tests.support.recording_brain import RecordingBrain

#: 2025-12-01T12:00:00Z: the store's wall clock in these tests (windows, buckets).
NOW = 1_764_590_400_000
DAY, MONTH, _HOUR = time_buckets(NOW)
#: Built-in Twilio inbound: 0.0085 voice + 0.004 Media Streams per started minute.
TWILIO_IN = 12_500
#: Twilio inbound quantum: a minute of telephony + 57,600 expected brain micros.
QUANTUM = TWILIO_IN + 57_600
#: The tenant's day budget: room for one call at the 5 USD default cap and then some,
#: far below what the reports below would cost at face value (32,000 USD).
BUDGET_DAY = 6_000_000

Published = list[tuple[str, dict[str, int | str]]]


@pytest.fixture(scope="module")
def spend_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("usage-ceiling-redis")) as server:
        yield server


@pytest.fixture
async def store(spend_redis: EmbeddedRedis) -> AsyncIterator[SpendStore]:
    client = redis_client(spend_redis.url)
    yield SpendStore(client, f"ceil{secrets.token_hex(4)}")
    await client.aclose()


def make_gate(
    store: SpendStore, tmp_path: Path, *, max_call_cost: int = DEFAULT_CALL_MAX_COST_MICROS
) -> SpendGate:
    policy = GatePolicy(
        default_limits=TenantLimits(budget_day=BUDGET_DAY), max_call_cost=max_call_cost
    )
    return SpendGate(
        store,
        PriceTable.default(),
        SpendJournal(tmp_path / "journal.jsonl"),
        policy=policy,
        clock_wall_ms=lambda: NOW,
    )


def inbound(tenant: str = "acme") -> AdmissionRequest:
    return AdmissionRequest(
        tenant=tenant,
        provider="twilio",
        direction="inbound",
        caller="+15550001111",
        to="+15550002222",
        brain="realtime",
    )


async def open_call(gate: SpendGate) -> tuple[CallSpend, Published]:
    request = inbound()
    admission = await gate.admit(request)
    assert admission.admitted, admission.reason
    published: Published = []
    return gate.open(admission, request, started_ms=0), published


def recorder(published: Published) -> Any:
    def publish(type_: str, payload: Any) -> None:
        published.append((type_, dict(payload)))

    return publish


async def run_until(spend: CallSpend, until_ms: int, published: Published) -> End | None:
    """Tick every TICK_MS from 0 to ``until_ms``; the End, if one came (and when)."""
    for now in range(0, until_ms + 1, TICK_MS):
        end = await spend.tick(now, recorder(published))
        if end is not None:
            return end
    return None


async def day_spend(store: SpendStore) -> SpendTotals:
    return (await store.tenant_spend("acme", [DAY], [MONTH], []))["days"][DAY]


# --- the gate, against a real store ---------------------------------------------------------


@pytest.mark.parametrize("count", [10**9, 2**63])
async def test_an_absurd_report_cannot_settle_above_the_reservation_or_cap(
    store: SpendStore, tmp_path: Path, count: int
) -> None:
    """The operator's finding: 10**9 tokens settled 32,000 USD on a 5 USD call (and the
    tenant's next call was refused ``budget_day``); 2**63 raised and was not billed."""
    gate = make_gate(store, tmp_path)
    spend, published = await open_call(gate)
    assert spend.meter.reserved == QUANTUM
    assert await run_until(spend, 10_000, published) is None

    anomaly = spend.on_usage(
        Usage(model="gpt-realtime", input_audio_tokens=count), 10_000, recorder(published)
    )
    assert anomaly is not None and anomaly.kind == "over_ceiling"
    assert published[-1] == (EVENT_USAGE_ANOMALY, anomaly.payload())
    assert anomaly.payload()["reported_input_tokens"] == min(count, 2**63 - 1)
    # Billed up to the ceiling (32,000 + 10 s x 32,000 audio tokens at $32/1M: 11.264
    # USD), which is past the 5 USD cap: the call ends at the next tick.
    assert anomaly.payload()["allowed_input_tokens"] == 352_000
    assert spend.meter.brain_cost == 352_000 * 32
    assert await spend.tick(11_000, recorder(published)) == End("budget_exhausted")

    actual = await spend.settle(11_500, "budget_exhausted", recorder(published))
    assert actual == spend.meter.reserved == QUANTUM <= DEFAULT_CALL_MAX_COST_MICROS
    kinds = [p["kind"] for t, p in published if t == EVENT_USAGE_ANOMALY]
    assert kinds == ["over_ceiling", "over_reservation"]
    assert spend.anomalies == 2
    over = published[-1][1]
    assert over["reserved"] == QUANTUM and over["cost"] == TWILIO_IN + 352_000 * 32

    # The store holds the settlement; the tenant's day has spent at most that reservation.
    record = await store.get_call(spend.call_id)
    assert record is not None and record["spent"] == QUANTUM
    assert await day_spend(store) == {"spent": QUANTUM, "reserved": 0}
    # The tenant's later calls are unaffected.
    later = await gate.admit(inbound())
    assert later.admitted and later.reason == "ok"


async def test_a_clamped_report_within_the_cap_is_billed_within_the_reservation(
    store: SpendStore, tmp_path: Path
) -> None:
    """Not free: what the ceiling allows is billed, reserved first (the budget decides)."""
    gate = make_gate(store, tmp_path)
    spend, published = await open_call(gate)
    assert await run_until(spend, 1_000, published) is None
    anomaly = spend.on_usage(Usage(input_audio_tokens=10**9), 1_000, recorder(published))
    assert anomaly is not None and anomaly.payload()["allowed_input_tokens"] == 64_000
    cost = TWILIO_IN + 64_000 * 32  # 2.0605 USD: under the 5 USD cap
    assert spend.meter.cost_ms(1_000) == cost
    assert await spend.tick(2_000, recorder(published)) is None  # asks for more, gets it
    assert spend.extensions == 1 and spend.meter.reserved >= cost
    actual = await spend.settle(3_000, "caller_hangup", recorder(published))
    assert actual == cost <= spend.meter.reserved
    kinds = [p["kind"] for t, p in published if t == EVENT_USAGE_ANOMALY]
    assert kinds == ["over_ceiling"]
    assert await day_spend(store) == {"spent": cost, "reserved": 0}
    assert (await gate.admit(inbound())).admitted


async def test_cost_past_the_reservation_at_settlement_is_settled_at_the_reservation(
    store: SpendStore, tmp_path: Path
) -> None:
    gate = make_gate(store, tmp_path)
    spend, published = await open_call(gate)
    assert await run_until(spend, 30_000, published) is None
    # A plausible report that lands after the last tick: 1,000 audio-out tokens = 0.064 USD.
    assert spend.on_usage(Usage(output_audio_tokens=1_000), 30_500, recorder(published)) is None
    actual = await spend.settle(31_000, "caller_hangup", recorder(published))
    assert actual == QUANTUM
    assert published[-1] == (
        EVENT_USAGE_ANOMALY,
        {
            "kind": "over_reservation",
            "elapsed_ms": 31_000,
            "cost": TWILIO_IN + 64_000,
            "reserved": QUANTUM,
            "excess_micros": TWILIO_IN + 64_000 - QUANTUM,
        },
    )
    assert await day_spend(store) == {"spent": QUANTUM, "reserved": 0}


@pytest.mark.parametrize(
    ("max_call_cost", "minutes"),
    [
        (TWILIO_IN, 1),  # 0.0125 USD: exactly one inbound minute
        (20_000, 1),  # 0.02 USD: one minute and change
        (2 * TWILIO_IN, 2),  # exactly two
    ],
)
async def test_a_cap_of_whole_billing_increments_runs_all_of_them(
    store: SpendStore, tmp_path: Path, max_call_cost: int, minutes: int
) -> None:
    """With the cap at exactly one quantum the call used to end after ~1 s."""
    gate = make_gate(store, tmp_path, max_call_cost=max_call_cost)
    spend, published = await open_call(gate)
    assert spend.meter.reserved == min(max_call_cost, QUANTUM)
    ended_at = None
    for now in range(0, 4 * 60_000, TICK_MS):
        end = await spend.tick(now, recorder(published))
        if end is not None:
            assert end == End("budget_exhausted")
            ended_at = now
            break
    # Ticks run while the guard stays within the paid minutes; the first past that ends it.
    assert ended_at == minutes * 60_000 - DEFAULT_HANGUP_GUARD_MS + TICK_MS
    settled_at = minutes * 60_000  # the hang-up lands within the last paid minute
    actual = await spend.settle(settled_at, "budget_exhausted", recorder(published))
    assert actual == minutes * TWILIO_IN <= max_call_cost
    if max_call_cost == minutes * TWILIO_IN:
        assert actual == max_call_cost  # settled at the cap
    assert not [p for t, p in published if t == EVENT_USAGE_ANOMALY]
    assert await day_spend(store) == {"spent": actual, "reserved": 0}


# --- a whole call through the gateway -------------------------------------------------------


class AbsurdUsageBrain(RecordingBrain):
    """Echoes like the recording brain and reports 10**9 input audio tokens at the start."""

    async def respond(self, ws: ServerConnection, encoder: TapEncoder, event: object) -> None:
        if isinstance(event, Hello):
            usage = Usage(model="gpt-realtime", input_audio_tokens=10**9)
            await ws.send(encoder.encode(usage, 0.0))
        await super().respond(ws, encoder, event)


async def test_a_gateway_call_turns_an_absurd_report_into_a_receipt_and_a_metric(
    speech_pcm: bytes,
) -> None:
    # Fast prices: 10,000 micros per second of call, 10 s quanta (100,000 micros); a
    # 0.50 USD cap. The report is clamped to the 32,000-token burst (1.024 USD).
    settings = fast_spend_settings()
    settings = replace(settings, policy=replace(settings.policy, max_call_cost=500_000))
    async with AbsurdUsageBrain() as brain:
        config = gateway_config(brain.url, barge_in=False, spend=settings)
        async with serve_gateway(config) as gateway:
            simulator = TwilioSimulator(gateway.url, auth_token=TEST_AUTH_TOKEN)
            result = await simulator.place_call(speech_pcm[: 8000 * 2 * 3], tail_s=0.3)
            assert result is not None
            store = gateway.state.spend_store
            assert store is not None
            await eventually(lambda: not gateway.state.calls, timeout_s=5)
            await asyncio.sleep(0.1)
            (ended,) = await store.recent_ended(5)
            assert ended["reason"] == "budget_exhausted"
            call_id = ended["call"]
            record = await store.get_call(call_id)
            assert record is not None and record["spent"] is not None
            # Settled at what the call had reserved, never the clamped cost, nor 32,000 USD.
            assert int(ended["spent"]) == record["spent"] <= 500_000
            ledger = [e for e in await store.ledger(100) if e["call"] == call_id]
            reserved = max(int(e["reserved_total"]) for e in ledger if e["type"] != "settle")
            assert record["spent"] == reserved

            receipts = await store.receipts(call_id)
            anomalies = [r for r in receipts if r.get("type") == EVENT_USAGE_ANOMALY]
            assert [r["kind"] for r in anomalies] == ["over_ceiling", "over_reservation"]
            over_ceiling = anomalies[0]
            assert over_ceiling["stage"] == "spend"
            assert over_ceiling["reported_input_tokens"] == str(10**9)
            # The 32,000-token burst plus 32 tokens per ms of call carried when it came.
            allowed = 32_000 + 32 * int(over_ceiling["elapsed_ms"])
            assert int(over_ceiling["allowed_input_tokens"]) == allowed < 40_000
            assert int(over_ceiling["excess_micros"]) == (10**9 - allowed) * 32
            assert "model" not in over_ceiling  # content-free: kind, counts, micros

            assert gateway.metric("rutster_spend_usage_anomalies_total", kind="over_ceiling") == 1
            assert (
                gateway.metric("rutster_spend_usage_anomalies_total", kind="over_reservation") == 1
            )
            excess = sum(int(r["excess_micros"]) for r in anomalies)
            assert gateway.metric("rutster_spend_usage_excess_micros_total") == excess

            # The tenant's next call is admitted.
            again = await simulator.post_voice_webhook(
                "CA" + "9" * 32, from_="+15550007777", to="+15550008888"
            )
            assert "<Stream" in again.text


def test_the_metrics_count_the_anomaly_events() -> None:
    """What GatewayMetrics.on_call_event makes of the payloads CallSpend publishes."""
    metrics = GatewayMetrics()
    for kind, excess in (("over_ceiling", 31_998_976_000), ("over_reservation", 6_400)):
        payload: dict[str, EventValue] = {"kind": kind, "excess_micros": excess}
        metrics.on_call_event(CallEvent("ses_x", 0, "spend", EVENT_USAGE_ANOMALY, payload))
    registry = metrics.registry
    for kind in ("over_ceiling", "over_reservation"):
        assert registry.get_sample_value("rutster_spend_usage_anomalies_total", {"kind": kind}) == 1
    assert registry.get_sample_value("rutster_spend_usage_excess_micros_total") == (
        31_998_976_000 + 6_400
    )
