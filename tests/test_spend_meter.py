"""spend.meter: per-call cost, reservation quanta and hang-up decisions, in virtual time."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brains.tap import Usage
from spend.meter import (
    CONTINUE,
    DEFAULT_HANGUP_GUARD_MS,
    EXPECTED_BRAIN_MICROS_PER_MINUTE,
    MAX_MODELS_PER_CALL,
    CallCaps,
    CallMeter,
    Continue,
    End,
    Extend,
    MeterDecision,
    MeterSnapshot,
    QuantumPolicy,
)
from spend.prices import PriceTable, TelephonyRate, TokenTotals, UnknownPrice

PRICES = PriceTable.default()
T0 = 1_700_000_000_000  # unix ms: any origin works
HOUR_S = 3_600
TWILIO_IN = 12_500  # default twilio inbound, micros per started minute


def meter(
    *,
    provider: str = "twilio",
    direction: str = "inbound",
    max_duration_s: int = HOUR_S,
    max_cost: int = 10_000_000,
    policy: QuantumPolicy | None = None,
    prices: PriceTable = PRICES,
) -> CallMeter:
    return CallMeter(
        prices,
        provider=provider,
        direction=direction,
        started_ms=T0,
        caps=CallCaps(max_duration_s=max_duration_s, max_cost_micros=max_cost),
        quantum=policy,
    )


def audio_out(micros: int) -> TokenTotals:
    """Output audio tokens worth ``micros`` at gpt-realtime's $64/1M (64 micros a token)."""
    assert micros % 64 == 0
    return TokenTotals(output_audio=micros // 64)


# --- sizes ----------------------------------------------------------------------------------


def test_expected_brain_spend_per_minute_is_the_documented_derivation() -> None:
    # 600 audio-in tokens at $32/1M + 600 audio-out tokens at $64/1M.
    assert EXPECTED_BRAIN_MICROS_PER_MINUTE == 19_200 + 38_400
    assert (
        PRICES.brain_cost("gpt-realtime", TokenTotals(input_audio=600, output_audio=600))
        == EXPECTED_BRAIN_MICROS_PER_MINUTE
    )


def test_quantum_low_water_and_first_quantum() -> None:
    m = meter()
    assert m.quantum == TWILIO_IN + 57_600
    assert m.low_water == -(-m.quantum // 4)  # 25 %, rounded up
    assert m.first_quantum == m.quantum
    assert meter(provider="sip").quantum == 4_000 + 57_600
    assert meter(direction="outbound").quantum == 18_000 + 57_600
    assert meter(max_cost=50_000).first_quantum == 50_000
    policy = QuantumPolicy(telephony_s=30, brain_micros_per_minute=1_001)
    assert meter(policy=policy).quantum == TWILIO_IN + 501  # a started minute; ceil(1001 / 2)
    assert meter(provider="sip", policy=policy).quantum == 2_000 + 501


def test_unknown_prices_fail_at_construction() -> None:
    with pytest.raises(UnknownPrice, match="telnyx"):
        meter(provider="telnyx")
    no_brains = PriceTable(telephony={("twilio", "*"): TelephonyRate(1, 60)})
    with pytest.raises(UnknownPrice, match="brain"):
        meter(prices=no_brains)
    with pytest.raises(ValueError, match="direction"):
        meter(direction="both")


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError, match="max_duration_s"):
        CallCaps(max_duration_s=0, max_cost_micros=1)
    with pytest.raises(ValueError, match="max_cost_micros"):
        CallCaps(max_duration_s=1, max_cost_micros=-1)
    with pytest.raises(TypeError, match="max_cost_micros"):
        CallCaps(max_duration_s=1, max_cost_micros=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Fraction"):
        QuantumPolicy(low_water_fraction=0.25)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="low_water_fraction"):
        QuantumPolicy(low_water_fraction=Fraction(0))
    with pytest.raises(ValueError, match="low_water_fraction"):
        QuantumPolicy(low_water_fraction=Fraction(3, 2))
    with pytest.raises(ValueError, match="telephony_s"):
        QuantumPolicy(telephony_s=0)
    with pytest.raises(ValueError, match="hangup_guard_ms"):
        QuantumPolicy(hangup_guard_ms=-1)
    m = meter()
    with pytest.raises(TypeError, match="now_ms"):
        m.decide(T0 + 0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tokens"):
        m.on_usage("gpt-realtime", Usage(), T0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model"):
        m.on_usage(5, TokenTotals(), T0)  # type: ignore[arg-type]


# --- decisions ------------------------------------------------------------------------------


def test_extends_below_low_water_once_until_the_store_answers() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    assert m.decide(T0) == CONTINUE
    t = T0 + 10_000
    m.on_usage("gpt-realtime", audio_out(40_000), t)
    # headroom = 70_100 - (12_500 + 40_000) = 17_600 >= low water 17_525
    assert m.cost_ms(t) == 52_500
    assert m.decide(t) == CONTINUE
    m.on_usage("gpt-realtime", audio_out(128), t)  # headroom 17_472 < 17_525
    assert m.decide(t) == Extend(m.quantum)
    assert m.extension_pending
    assert m.decide(t + 1_000) == CONTINUE  # no second Extend while the first is in flight
    m.on_reserved(2 * m.quantum)
    assert not m.extension_pending
    assert m.reserved == 140_200
    assert m.decide(t + 2_000) == CONTINUE


def test_extend_covers_an_overrun_on_top_of_a_quantum() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.on_usage("gpt-realtime", audio_out(100_032), T0 + 5_000)
    projected = TWILIO_IN + 100_032
    assert m.decide(T0 + 5_000) == Extend(m.quantum + projected - m.first_quantum)


def test_extend_is_capped_by_max_cost_then_the_call_ends_at_the_cap() -> None:
    m = meter(max_cost=100_000)
    m.on_reserved(m.first_quantum)
    m.on_usage(None, audio_out(57_600), T0 + 1_000)  # headroom 0 < low water
    assert m.decide(T0 + 1_000) == Extend(100_000 - 70_100)
    m.on_reserved(100_000)
    assert m.decide(T0 + 2_000) == CONTINUE  # 70_100 spent, 100_000 reserved, no room left
    m.on_usage(None, audio_out(17_344), T0 + 3_000)  # cost 87_444; +2 s still the same minute
    assert m.decide(T0 + 3_000) == CONTINUE
    m.on_usage(None, audio_out(12_544), T0 + 4_000)  # cost 99_988
    assert m.decide(T0 + 4_000) == CONTINUE
    m.on_usage(None, audio_out(64), T0 + 5_000)  # cost 100_052 >= max cost
    assert m.decide(T0 + 5_000) == End("budget_exhausted")


def test_refused_extension_lives_on_the_reservation_then_ends() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.on_usage("gpt-realtime", audio_out(44_800), T0 + 30_000)  # cost 57_300, headroom 12_800
    assert isinstance(m.decide(T0 + 30_000), Extend)
    m.on_extension_refused()
    assert m.extension_refused
    assert m.decide(T0 + 31_000) == CONTINUE
    m.on_usage("gpt-realtime", audio_out(12_736), T0 + 40_000)  # cost 70_036 < 70_100
    assert m.decide(T0 + 40_000) == CONTINUE
    # The next minute would start within the guard: hang up before it is billed.
    assert m.decide(T0 + 58_001) == End("budget_exhausted")
    assert m.settlement(T0 + 58_001) == 70_036
    # Sticky, whatever happens next.
    m.on_reserved(10_000_000)
    assert m.decide(T0 + 59_000) == End("budget_exhausted")
    assert m.ended == End("budget_exhausted")


def test_refused_extension_ends_when_the_brain_spends_the_reservation() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.on_usage("gpt-realtime", audio_out(44_800), T0 + 30_000)
    assert isinstance(m.decide(T0 + 30_000), Extend)
    m.on_extension_refused()
    m.on_usage("gpt-realtime", audio_out(12_800), T0 + 31_000)  # cost 70_100 == reserved
    assert m.decide(T0 + 31_000) == End("budget_exhausted")


def test_failed_extension_is_asked_again() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.on_usage("gpt-realtime", audio_out(44_800), T0 + 30_000)
    first = m.decide(T0 + 30_000)
    assert isinstance(first, Extend)
    m.on_extension_failed()
    assert not m.extension_refused
    assert m.decide(T0 + 31_000) == first


def test_max_duration_ends_at_the_first_tick_at_or_after_it_and_wins_ties() -> None:
    m = meter(max_duration_s=90, max_cost=10_000_000)
    m.on_reserved(m.first_quantum)
    assert m.decide(T0 + 89_999) == CONTINUE
    assert m.decide(T0 + 90_000) == End("max_duration")
    tie = meter(max_duration_s=60, max_cost=20_000)
    tie.on_reserved(20_000)
    tie.on_usage(None, audio_out(19_200), T0)  # cost >= max cost as well
    assert tie.decide(T0 + 60_000) == End("max_duration")


def test_telephony_only_budget_end_leaves_the_guard_before_the_next_minute() -> None:
    # Two whole minutes (25_000) fit in 30_000, a third (37_500) does not.
    m = meter(max_cost=30_000)
    m.on_reserved(m.first_quantum)  # 30_000: the cap
    decisions: list[tuple[int, MeterDecision]] = []
    for elapsed in range(0, 200_000, 1_000):
        decision = m.decide(T0 + elapsed)
        if decision != CONTINUE:
            decisions.append((elapsed, decision))
            break
    assert decisions == [(119_000, End("budget_exhausted"))]  # 119 s + 2 s guard > 120 s
    assert m.settlement(T0 + 119_000 + DEFAULT_HANGUP_GUARD_MS - 1_000) == 25_000


def test_unaffordable_or_zero_budget_ends_at_once() -> None:
    assert meter(max_cost=0).decide(T0) == End("budget_exhausted")
    short = meter(max_cost=TWILIO_IN - 1)  # not even one started minute
    short.on_reserved(short.first_quantum)
    assert short.decide(T0) == End("budget_exhausted")
    assert short.settlement(T0) == 0


def test_stop_freezes_telephony_but_late_usage_still_counts() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.stop(T0 + 61_000)
    m.stop(T0 + 500_000)  # the first stop wins
    assert m.stopped_ms == T0 + 61_000
    assert m.elapsed_ms(T0 + 600_000) == 61_000
    assert m.telephony_cost(T0 + 600_000) == 2 * TWILIO_IN
    m.on_usage("gpt-realtime", audio_out(6_400), T0 + 601_000)  # response.done after hang-up
    assert m.settlement(T0 + 602_000) == 2 * TWILIO_IN + 6_400
    assert m.decide(T0 + 602_000) == CONTINUE  # nothing to reserve or end for a stopped call


def test_time_never_runs_backwards() -> None:
    m = meter()
    assert m.cost_ms(T0 + 61_000) == 2 * TWILIO_IN
    assert m.cost_ms(T0 + 1_000) == 2 * TWILIO_IN
    assert m.elapsed_ms(T0 - 50_000) == 61_000
    early = meter()
    assert early.elapsed_ms(T0 - 1_000) == 0


def test_on_reserved_ignores_stale_totals_and_refuses_impossible_ones() -> None:
    m = meter(max_cost=100_000)
    m.on_reserved(70_000)
    m.on_reserved(50_000)  # a late answer to an older request
    assert m.reserved == 70_000
    with pytest.raises(ValueError, match="exceeds the call's max cost"):
        m.on_reserved(100_001)
    with pytest.raises(ValueError, match=">= 0"):
        m.on_reserved(-1)


# --- brain usage ----------------------------------------------------------------------------


def test_usage_is_cumulative_per_model_with_one_ceil() -> None:
    m = meter()
    mini_text = TokenTotals(input_text=1)  # 0.6 micros at gpt-realtime-mini
    for i in range(3):
        m.on_usage("gpt-realtime-mini", mini_text, T0 + i)
    assert m.brain_cost == 2  # ceil(1.8), not 3 x ceil(0.6)
    m.on_tap_usage(Usage(model="gpt-realtime", input_audio_tokens=10), T0 + 5)
    m.on_tap_usage(Usage(model=None, output_text_tokens=1), T0 + 6)
    assert m.brain_cost == 2 + 320 + 16
    assert m.tokens["gpt-realtime-mini"] == TokenTotals(input_text=3)
    assert m.tokens[None] == TokenTotals(output_text=1)
    assert m.cost_ms(T0 + 6) == TWILIO_IN + 338


def test_cached_tokens_beyond_the_input_are_counted_and_billed() -> None:
    m = meter()
    m.on_tap_usage(Usage(model="gpt-realtime", input_audio_tokens=5, cached_input_tokens=1_005), T0)
    assert m.malformed_usage == 1
    assert m.tokens["gpt-realtime"] == TokenTotals(
        input_audio=5, input_text=1_000, cached_input=1_005
    )
    # 1005 cached tokens at $0.40/1M = 402 micros; 5 audio tokens are taken as cached too.
    assert m.brain_cost == 402
    # A later honest report never lowers the figure; cumulatively, the dearest split
    # consistent with the counts is billed: 1005 cached out of the 1010 text tokens,
    # so 5 text ($4/1M) and 5 audio ($32/1M) tokens are uncached.
    m.on_tap_usage(Usage(model="gpt-realtime", input_text_tokens=10), T0 + 1)
    assert m.brain_cost == 402 + 5 * 4 + 5 * 32


def test_model_names_beyond_the_cap_are_billed_at_the_default_rates() -> None:
    m = meter()
    for i in range(MAX_MODELS_PER_CALL + 3):
        m.on_usage(f"model-{i}", TokenTotals(output_audio=1), T0)
    assert len(m.tokens) == MAX_MODELS_PER_CALL + 1
    assert m.tokens[None] == TokenTotals(output_audio=3)
    assert m.brain_cost == (MAX_MODELS_PER_CALL + 3) * 64


def test_snapshot() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.on_usage("gpt-realtime", audio_out(640), T0 + 100)
    assert m.snapshot(T0 + 61_000) == MeterSnapshot(
        elapsed_ms=61_000,
        cost=2 * TWILIO_IN + 640,
        reserved=m.first_quantum,
        telephony_cost=2 * TWILIO_IN,
        brain_cost=640,
    )


# --- properties -----------------------------------------------------------------------------

_USAGE = st.builds(
    lambda text, cached, audio, out_a, out_t: TokenTotals(
        input_text=text + cached, input_audio=audio, cached_input=cached,
        output_audio=out_a, output_text=out_t,
    ),
    st.integers(0, 2_000),
    st.integers(0, 2_000),
    st.integers(0, 2_000),
    st.integers(0, 3_000),
    st.integers(0, 500),
)  # fmt: skip
_STEP = st.one_of(
    st.tuples(st.just("tick"), st.integers(0, 30_000)),
    st.tuples(st.just("usage"), st.sampled_from(["gpt-realtime", "gpt-realtime-mini", None])),
)
_ANSWER = st.sampled_from(["grant", "grant", "grant", "refuse", "fail", "later"])


@settings(max_examples=150, deadline=None)
@given(
    provider=st.sampled_from([("twilio", "inbound"), ("twilio", "outbound"), ("sip", "inbound")]),
    max_duration_s=st.integers(1, 900),
    max_cost=st.integers(0, 400_000),
    guard_ms=st.integers(0, 5_000),
    fraction=st.fractions(min_value=Fraction(1, 100), max_value=1),
    data=st.data(),
)
def test_gate_simulation_invariants(
    provider: tuple[str, str],
    max_duration_s: int,
    max_cost: int,
    guard_ms: int,
    fraction: Fraction,
    data: st.DataObject,
) -> None:
    """Random ticks, usage and store answers: the money invariants always hold."""
    policy = QuantumPolicy(low_water_fraction=fraction, hangup_guard_ms=guard_ms)
    m = meter(
        provider=provider[0],
        direction=provider[1],
        max_duration_s=max_duration_s,
        max_cost=max_cost,
        policy=policy,
    )
    rate = PRICES.telephony_rate(*provider)
    m.on_reserved(m.first_quantum)
    now = T0
    last_cost = 0
    totals: dict[str | None, TokenTotals] = {}
    in_flight: int | None = None
    ended: End | None = None
    refused = False
    for kind, value in data.draw(st.lists(_STEP, min_size=1, max_size=40)):
        if kind == "tick":
            assert isinstance(value, int)
            now += value
        else:
            assert not isinstance(value, int)
            delta = data.draw(_USAGE)
            m.on_usage(value, delta, now)
            totals[value] = totals.get(value, TokenTotals()) + delta
        decision = m.decide(now)
        cost = m.cost_ms(now)
        elapsed = now - T0
        brain = sum(PRICES.brain_cost(k, v) for k, v in totals.items())
        # Rounding exact: one ceil per model over cumulative totals, telephony by increments.
        assert m.brain_cost == brain
        assert cost == rate.cost(elapsed) + brain
        assert cost >= last_cost
        last_cost = cost
        assert 0 <= m.reserved <= max_cost
        if ended is not None:
            assert decision == ended
            continue
        if isinstance(decision, End):
            ended = decision
            projected = rate.cost(elapsed + guard_ms) + brain
            if decision.reason == "max_duration":
                assert elapsed >= max_duration_s * 1_000
            else:  # never too early: the reservation (<= max cost) is spent or about to be
                assert elapsed < max_duration_s * 1_000
                assert cost >= m.reserved or projected > m.reserved
            continue
        # Never too late.
        assert elapsed < max_duration_s * 1_000
        assert cost < max_cost
        if refused:
            assert cost < m.reserved
        if isinstance(decision, Extend):
            assert in_flight is None, "a second Extend while one is in flight"
            assert 0 < decision.amount <= max_cost - m.reserved
            in_flight = decision.amount
        if in_flight is not None:
            answer = data.draw(_ANSWER)
            if answer == "grant":
                m.on_reserved(m.reserved + in_flight)
                in_flight = None
            elif answer == "refuse":
                m.on_extension_refused()
                refused = True
                in_flight = None
            elif answer == "fail":
                m.on_extension_failed()
                in_flight = None
        assert m.reserved <= max_cost


@settings(max_examples=150, deadline=None)
@given(
    rate_per_minute=st.integers(1, 50_000),
    increment_s=st.sampled_from([1, 6, 30, 60]),
    max_cost=st.integers(0, 150_000),
    max_duration_s=st.integers(1, 600),
    tick_ms=st.integers(500, 5_000),
    guard_ms=st.integers(0, 5_000),
    started_ms=st.integers(0, 10**13),
)
def test_telephony_only_end_comes_at_the_right_tick(
    rate_per_minute: int,
    increment_s: int,
    max_cost: int,
    max_duration_s: int,
    tick_ms: int,
    guard_ms: int,
    started_ms: int,
) -> None:
    """End comes at the first tick past the analytic deadline, and the money fits."""
    prices = PriceTable(
        telephony={("p", "*"): TelephonyRate(rate_per_minute, increment_s)},
        brains=PRICES.brains,
    )
    m = CallMeter(
        prices,
        provider="p",
        direction="outbound",
        started_ms=started_ms,
        caps=CallCaps(max_duration_s, max_cost),
        quantum=QuantumPolicy(hangup_guard_ms=guard_ms),
    )
    inc_ms = increment_s * 1_000
    duration_ms = max_duration_s * 1_000
    # Whole increments the budget pays for: ceil(n * inc * rate / 60) <= max_cost.
    affordable = (max_cost * 60) // (increment_s * rate_per_minute)
    # Increments after which the cost has reached the cap: ceil(n * inc * rate / 60) >= max_cost
    # from n > (max_cost - 1) * 60 / (inc * rate) on.
    reached_after = ((max_cost - 1) * 60) // (increment_s * rate_per_minute)
    # Budget deadline: the last instant from which a guard more stays within the paid
    # increments, and before the cost reaches the cap.
    deadline = min(affordable * inc_ms - guard_ms, reached_after * inc_ms)

    tick = 0
    while True:
        elapsed = tick * tick_ms
        decision = m.decide(started_ms + elapsed)
        if isinstance(decision, End):
            break
        assert isinstance(decision, Continue | Extend)
        if isinstance(decision, Extend):
            m.on_reserved(m.reserved + decision.amount)
        tick += 1
    # No earlier tick was past either limit ...
    assert tick == 0 or (elapsed - tick_ms < duration_ms and elapsed - tick_ms <= deadline)
    # ... and this one is past the one it names (max duration wins a tie).
    if decision.reason == "max_duration":
        assert elapsed >= duration_ms
    else:
        assert elapsed < duration_ms
        assert elapsed > deadline
    # Hung up a guard after the last tick that went on (tick <= guard: before the next
    # tick's hang-up lands), the telephony bill stays within the cap.
    if tick >= 1 and tick_ms <= guard_ms:
        assert m.settlement(started_ms + elapsed - tick_ms + guard_ms) <= max_cost
    assert m.reserved <= max_cost
