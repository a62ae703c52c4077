"""spend.meter: per-call cost, reservation quanta and hang-up decisions, in virtual time."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.protocols.tap import Usage
from rutster.spend.meter import (
    CEILING_INPUT_TOKENS_PER_S,
    CEILING_OUTPUT_TOKENS_PER_S,
    CONTINUE,
    DEFAULT_HANGUP_GUARD_MS,
    EXPECTED_BRAIN_MICROS_PER_MINUTE,
    MAX_MODELS_PER_CALL,
    REALTIME_CONTEXT_WINDOW_TOKENS,
    REALTIME_MAX_OUTPUT_TOKENS,
    CallCaps,
    CallMeter,
    Continue,
    End,
    Extend,
    MeterDecision,
    MeterSnapshot,
    QuantumPolicy,
    UsageCeiling,
)
from rutster.spend.money import MAX_MICROS
from rutster.spend.prices import (
    MAX_TOKEN_COUNT,
    BrainRates,
    PriceTable,
    TelephonyRate,
    TokenTotals,
    UnknownPrice,
)

PRICES = PriceTable.default()
T0 = 1_700_000_000_000  # unix ms: any origin works
HOUR_S = 3_600
TWILIO_IN = 12_500  # default twilio inbound, micros per started minute


#: A ceiling no test report reaches (for tests of everything but the ceiling).
NO_CEILING = UsageCeiling(
    input_burst=MAX_TOKEN_COUNT, input_per_s=0, output_burst=MAX_TOKEN_COUNT, output_per_s=0
)


def meter(
    *,
    provider: str = "twilio",
    direction: str = "inbound",
    max_duration_s: int = HOUR_S,
    max_cost: int = 10_000_000,
    policy: QuantumPolicy | None = None,
    prices: PriceTable = PRICES,
    usage_ceiling: UsageCeiling | None = None,
) -> CallMeter:
    return CallMeter(
        prices,
        provider=provider,
        direction=direction,
        started_ms=T0,
        caps=CallCaps(max_duration_s=max_duration_s, max_cost_micros=max_cost),
        quantum=policy,
        usage_ceiling=usage_ceiling,
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
    with pytest.raises(UnknownPrice, match="bandwidth"):
        meter(provider="bandwidth")
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


def test_refused_extension_ends_when_the_brain_overspends_the_reservation() -> None:
    m = meter()
    m.on_reserved(m.first_quantum)
    m.on_usage("gpt-realtime", audio_out(44_800), T0 + 30_000)
    assert isinstance(m.decide(T0 + 30_000), Extend)
    m.on_extension_refused()
    m.on_usage("gpt-realtime", audio_out(12_800), T0 + 31_000)  # cost 70_100 == reserved
    assert m.decide(T0 + 31_000) == CONTINUE  # spending exactly the reservation is allowed
    m.on_usage("gpt-realtime", audio_out(64), T0 + 32_000)  # one token more
    assert m.decide(T0 + 32_000) == End("budget_exhausted")
    # Settled at the reservation; the token beyond it is the over_reservation anomaly.
    m.stop(T0 + 33_000)
    assert m.cost_ms(T0 + 33_000) == 70_164
    assert m.settlement(T0 + 33_000) == 70_100
    over = m.over_reservation(T0 + 33_000)
    assert over is not None and over.kind == "over_reservation"
    assert (over.cost, over.reserved, over.excess_micros) == (70_164, 70_100, 64)
    assert over.payload() == {
        "kind": "over_reservation",
        "elapsed_ms": 33_000,
        "cost": 70_164,
        "reserved": 70_100,
        "excess_micros": 64,
    }


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


def test_a_cap_of_exactly_one_increment_runs_that_whole_increment() -> None:
    # max cost 0.0125 USD: one started minute of Twilio inbound (0.0085 + 0.004 streams).
    m = meter(max_cost=TWILIO_IN)
    assert m.first_quantum == TWILIO_IN
    m.on_reserved(m.first_quantum)
    tick = 0
    while m.decide(T0 + tick) == CONTINUE:
        tick += 1_000
    # Ended at the first tick from which the guard reaches into the second minute
    # (59 s: 58 s + 2 s is still the first minute), not at 1 s.
    assert tick == 60_000 - DEFAULT_HANGUP_GUARD_MS + 1_000
    assert m.decide(T0 + tick) == End("budget_exhausted")
    m.stop(T0 + 60_000)  # the hang-up lands within the paid minute
    assert m.settlement(T0 + 60_000) == TWILIO_IN  # settled at the cap
    assert m.over_reservation(T0 + 60_000) is None


@pytest.mark.parametrize("minutes", [1, 2, 5])
def test_a_cap_of_whole_increments_pays_for_all_of_them(minutes: int) -> None:
    m = meter(max_cost=minutes * TWILIO_IN)
    m.on_reserved(m.first_quantum)
    tick = 0
    while True:
        decision = m.decide(T0 + tick)
        if isinstance(decision, Extend):
            m.on_reserved(m.reserved + decision.amount)
        elif decision != CONTINUE:
            break
        tick += 1_000
    assert decision == End("budget_exhausted")
    assert tick == minutes * 60_000 - DEFAULT_HANGUP_GUARD_MS + 1_000
    assert m.settlement(T0 + minutes * 60_000) == minutes * TWILIO_IN == m.reserved


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


# --- the usage ceiling ---------------------------------------------------------------------


def test_usage_ceiling_defaults_are_the_documented_derivation() -> None:
    # gpt-realtime: 32,000-token context re-billed at most once a second; 4,096 output
    # tokens a response; assistant audio 1 token / 50 ms with a 4x margin.
    assert REALTIME_CONTEXT_WINDOW_TOKENS == 32_000
    assert REALTIME_MAX_OUTPUT_TOKENS == 4_096
    assert CEILING_INPUT_TOKENS_PER_S == 32_000
    assert CEILING_OUTPUT_TOKENS_PER_S == 4 * 20
    ceiling = UsageCeiling()
    assert ceiling.input_tokens(0) == 32_000
    assert ceiling.input_tokens(1_500) == 32_000 + 48_000
    assert ceiling.output_tokens(0) == 4_096
    assert ceiling.output_tokens(60_001) == 4_096 + 4_801  # ceil(80 x 60.001)
    assert ceiling.input_tokens(-5) == 32_000
    assert UsageCeiling(input_burst=1, input_per_s=MAX_TOKEN_COUNT).input_tokens(10**6) == (
        MAX_TOKEN_COUNT
    )
    with pytest.raises(ValueError, match="output_per_s"):
        UsageCeiling(output_per_s=-1)


def test_plausible_usage_is_billed_as_reported() -> None:
    m = meter()
    # A whole context and a whole response at once, before any call time.
    report = TokenTotals(input_audio=30_000, input_text=2_000, cached_input=31_000)
    assert m.on_usage("gpt-realtime", report + TokenTotals(output_audio=4_096), T0) is None
    assert m.clamped_usage == 0 and m.clamped_micros == 0
    assert m.tokens["gpt-realtime"] == report + TokenTotals(output_audio=4_096)


def test_a_report_of_a_billion_tokens_is_clamped_billed_to_the_ceiling_and_flagged() -> None:
    """The operator's finding: 10**9 audio tokens billed 32,000 USD on a 5 USD call."""
    m = meter(max_cost=5_000_000)
    m.on_reserved(m.first_quantum)
    assert m.decide(T0 + 10_000) == CONTINUE
    anomaly = m.on_tap_usage(Usage(model="gpt-realtime", input_audio_tokens=10**9), T0 + 10_000)
    allowed = 32_000 + 10 * 32_000  # burst + 10 s of call
    assert anomaly is not None and anomaly.kind == "over_ceiling"
    assert anomaly.allowed == TokenTotals(input_audio=allowed)
    assert anomaly.reported == TokenTotals(input_audio=10**9)
    assert anomaly.excess_micros == (10**9 - allowed) * 32  # $32/1M audio in
    assert anomaly.payload() == {
        "kind": "over_ceiling",
        "elapsed_ms": 10_000,
        "reported_input_tokens": 10**9,
        "allowed_input_tokens": allowed,
        "excess_input_tokens": 10**9 - allowed,
        "reported_output_tokens": 0,
        "allowed_output_tokens": 0,
        "excess_output_tokens": 0,
        "excess_micros": (10**9 - allowed) * 32,
    }
    assert (m.clamped_usage, m.clamped_micros) == (1, anomaly.excess_micros)
    # Not free: the ceiling's worth is billed ...
    assert m.brain_cost == allowed * 32
    # ... but the call never settles above its reservation (nor its cap).
    assert m.decide(T0 + 10_000) == End("budget_exhausted")
    m.stop(T0 + 11_000)
    assert m.settlement(T0 + 11_000) == m.reserved == m.first_quantum
    over = m.over_reservation(T0 + 11_000)
    assert over is not None and over.excess_micros == m.cost_ms(T0 + 11_000) - m.reserved


@pytest.mark.parametrize("count", [2**63 - 1, 2**63, 2**64 + 7, 10**4000])
def test_counts_past_64_bits_never_raise_and_are_clamped(count: int) -> None:
    m = meter(max_cost=5_000_000)
    m.on_reserved(m.first_quantum)
    usage = Usage(
        model="gpt-realtime",
        input_audio_tokens=count,
        output_audio_tokens=count,
        input_text_tokens=count,
        output_text_tokens=count,
        cached_input_tokens=count,
    )
    anomaly = m.on_tap_usage(usage, T0 + 1_000)
    assert anomaly is not None and anomaly.kind == "over_ceiling"
    assert anomaly.reported.output_audio == MAX_TOKEN_COUNT  # saturated, not refused
    assert anomaly.allowed == TokenTotals(
        input_audio=64_000, cached_input=64_000, output_audio=4_176
    )  # the dearer classes first; cached within what was kept
    assert anomaly.excess_micros == MAX_MICROS
    payload = anomaly.payload()
    assert payload["excess_output_tokens"] == 2 * MAX_TOKEN_COUNT - 4_176
    assert m.on_tap_usage(usage, T0 + 1_000) is not None  # the ceiling is used up
    assert m.clamped_usage == 2 and m.clamped_micros == MAX_MICROS
    assert m.brain_cost == 64_000 * 400_000 // 1_000_000 + 4_176 * 64
    m.stop(T0 + 2_000)
    assert m.settlement(T0 + 2_000) <= m.reserved <= m.caps.max_cost_micros


def test_negative_counts_of_a_hand_built_usage_read_as_zero() -> None:
    m = meter()
    assert m.on_tap_usage(Usage(input_audio_tokens=-5, output_text_tokens=3), T0) is None
    assert m.tokens[None] == TokenTotals(output_text=3)


def test_the_ceiling_is_cumulative_over_reports_and_models_and_grows_with_call_time() -> None:
    m = meter()
    assert m.on_usage("gpt-realtime", TokenTotals(output_audio=4_000), T0) is None
    # A second model does not get an allowance of its own.
    anomaly = m.on_usage("gpt-realtime-mini", TokenTotals(output_audio=200), T0)
    assert anomaly is not None and anomaly.allowed == TokenTotals(output_audio=96)
    assert anomaly.excess_micros == 104 * 20  # $20/1M mini audio out
    # Each second of call adds 80 output tokens.
    assert m.on_usage("gpt-realtime", TokenTotals(output_audio=80), T0 + 1_000) is None
    clamped = m.on_usage("gpt-realtime", TokenTotals(output_audio=81), T0 + 2_000)
    assert clamped is not None and clamped.allowed == TokenTotals(output_audio=80)
    # Call time stops with the call: a late report only gets what the call carried.
    m.stop(T0 + 3_000)
    late = m.on_usage("gpt-realtime", TokenTotals(output_audio=500), T0 + 600_000)
    assert late is not None and late.allowed == TokenTotals(output_audio=80)
    assert late.elapsed_ms == 3_000
    # Input has its own room, untouched by all of that.
    assert m.on_usage(None, TokenTotals(input_text=32_000), T0 + 600_000) is None


def test_a_clamp_keeps_the_dearer_class_first() -> None:
    m = meter()
    report = TokenTotals(input_text=30_000, input_audio=30_000, output_text=4_000, output_audio=100)
    anomaly = m.on_usage("gpt-realtime", report, T0)
    assert anomaly is not None
    # gpt-realtime: audio in $32 > text in $4, audio out $64 > text out $16.
    assert anomaly.allowed == TokenTotals(
        input_audio=30_000, input_text=2_000, output_audio=100, output_text=3_996
    )
    cheap_audio = PriceTable(
        telephony=dict(PRICES.telephony),
        brains={"odd": BrainRates(10, 1, 5, 1, 10, 5)},  # text dearer than audio
    )
    odd = meter(prices=cheap_audio)
    anomaly = odd.on_usage("odd", report, T0)
    assert anomaly is not None
    assert anomaly.allowed == TokenTotals(
        input_text=30_000, input_audio=2_000, output_text=4_000, output_audio=96
    )


def test_late_usage_after_the_hang_up_settles_at_the_reservation() -> None:
    m = meter(max_cost=5_000_000)
    m.on_reserved(m.first_quantum)
    assert m.decide(T0 + 30_000) == CONTINUE
    m.stop(T0 + 30_000)
    assert m.over_reservation(T0 + 30_000) is None
    # response.done after the hang-up: plausible (within the ceiling), but above what
    # was reserved, and there is no tick left to reserve more.
    assert m.on_usage("gpt-realtime", audio_out(64_000), T0 + 31_000) is None
    assert m.cost_ms(T0 + 31_000) == TWILIO_IN + 64_000
    assert m.settlement(T0 + 31_000) == m.reserved == 70_100
    over = m.over_reservation(T0 + 31_000)
    assert over is not None
    assert (over.cost, over.reserved, over.excess_micros) == (76_500, 70_100, 6_400)


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
        usage_ceiling=NO_CEILING,  # the ceiling has its own properties below
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
            else:  # never too early: the reservation (<= max cost) is about to be passed
                assert elapsed < max_duration_s * 1_000
                assert projected > m.reserved
            continue
        # Never too late (spending exactly the cap or the reservation is allowed).
        assert elapsed < max_duration_s * 1_000
        assert cost <= max_cost
        if refused:
            assert cost <= m.reserved
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
    # Budget deadline: the last instant from which a guard more stays within the paid
    # increments (all of them: reaching the cap exactly is allowed).
    deadline = affordable * inc_ms - guard_ms

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


_COUNT = st.one_of(
    st.none(),
    st.integers(0, 5_000),
    st.integers(0, 10**7),
    st.sampled_from([10**9, 2**63 - 1, 2**63, 2**64, 10**30]),
)
_TAP_USAGE = st.builds(
    Usage,
    model=st.sampled_from(["gpt-realtime", "gpt-realtime-mini", "other", None]),
    input_audio_tokens=_COUNT,
    output_audio_tokens=_COUNT,
    input_text_tokens=_COUNT,
    output_text_tokens=_COUNT,
    cached_input_tokens=_COUNT,
)


@settings(max_examples=200, deadline=None)
@given(
    max_cost=st.integers(0, 6_000_000),
    steps=st.lists(
        st.one_of(st.tuples(st.just("tick"), st.integers(0, 20_000)), _TAP_USAGE),
        min_size=1,
        max_size=30,
    ),
    grant=st.booleans(),
    stop_after=st.integers(0, 30),
)
def test_no_report_makes_a_call_settle_above_its_reservation_or_cap(
    max_cost: int, steps: list[tuple[str, int] | Usage], grant: bool, stop_after: int
) -> None:
    """Any reports, however large, at any time (after the hang-up too): nothing raises,
    billed tokens stay within the ceiling, and the settlement within reservation and cap."""
    m = meter(max_cost=max_cost)
    m.on_reserved(m.first_quantum)
    ceiling = m.usage_ceiling
    now = T0
    for i, step in enumerate(steps):
        if i == stop_after:
            m.stop(now)
        if isinstance(step, Usage):
            before = m.brain_cost
            anomaly = m.on_tap_usage(step, now)
            if anomaly is not None:
                assert anomaly.kind == "over_ceiling"
                assert 0 <= anomaly.excess_micros <= MAX_MICROS
                assert anomaly.allowed != anomaly.reported
            assert m.brain_cost >= before  # a clamped report is not free
        else:
            now += step[1]
        decision = m.decide(now)
        if isinstance(decision, Extend):
            if grant:
                m.on_reserved(m.reserved + decision.amount)
            else:
                m.on_extension_refused()
        elapsed = m.elapsed_ms(now)
        billed = list(m.tokens.values())
        assert sum(t.input_tokens for t in billed) <= ceiling.input_tokens(elapsed)
        assert sum(t.output_tokens for t in billed) <= ceiling.output_tokens(elapsed)
        settled = m.settlement(now)
        assert 0 <= settled <= m.reserved <= max_cost
        over = m.over_reservation(now)
        assert (over is None) == (m.cost_ms(now) <= m.reserved)
        if over is not None:
            assert settled + over.excess_micros == m.cost_ms(now)
