"""spend.prices: telephony and brain rates, exact costs, the price file."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.protocols.tap import Usage
from rutster.spend.prices import (
    GPT_REALTIME_MINI_RATES,
    GPT_REALTIME_RATES,
    MAX_TOKEN_COUNT,
    BrainRates,
    PriceFileError,
    PriceTable,
    TelephonyRate,
    TokenTotals,
    UnknownPrice,
)

DEFAULT = PriceTable.default()


# --- telephony ------------------------------------------------------------------------------


def test_default_telephony_rates_include_the_media_streams_surcharge() -> None:
    # $0.0085 voice + $0.004 Media Streams; $0.014 + $0.004 (twilio.com US pricing).
    assert DEFAULT.telephony_rate("twilio", "inbound") == TelephonyRate(12_500, 60)
    assert DEFAULT.telephony_rate("twilio", "outbound") == TelephonyRate(18_000, 60)
    assert DEFAULT.telephony_rate("sip", "inbound") == TelephonyRate(4_000, 1)
    assert DEFAULT.telephony_rate("sip", "outbound") == TelephonyRate(4_000, 1)


@pytest.mark.parametrize(
    ("provider", "direction", "elapsed_ms", "micros"),
    [
        ("twilio", "inbound", 0, 0),
        ("twilio", "inbound", 1, 12_500),  # a started minute is a whole minute
        ("twilio", "inbound", 60_000, 12_500),
        ("twilio", "inbound", 60_001, 25_000),
        ("twilio", "outbound", 90_000, 36_000),
        ("sip", "inbound", 1, 67),  # 4000/60 = 66.67 -> ceil
        ("sip", "inbound", 1_000, 67),
        ("sip", "inbound", 1_001, 134),  # ceil(2 * 4000 / 60) = ceil(133.33)
        ("sip", "outbound", 3_000, 200),  # one ceil over the whole, not per second (201)
        ("sip", "outbound", 60_000, 4_000),
    ],
)
def test_telephony_cost_rounds_up_to_whole_increments(
    provider: str, direction: str, elapsed_ms: int, micros: int
) -> None:
    assert DEFAULT.telephony_cost(provider, direction, elapsed_ms) == micros


def test_telephony_lookup_falls_back_to_any_direction_then_fails() -> None:
    table = PriceTable(
        telephony={
            ("acme", "*"): TelephonyRate(1_000, 6),
            ("acme", "outbound"): TelephonyRate(2_000, 6),
        },
        brains={"m": GPT_REALTIME_MINI_RATES},
    )
    assert table.telephony_rate("acme", "inbound") == TelephonyRate(1_000, 6)
    assert table.telephony_rate("acme", "outbound") == TelephonyRate(2_000, 6)
    with pytest.raises(UnknownPrice, match="'nope'"):
        table.telephony_rate("nope", "inbound")
    with pytest.raises(UnknownPrice) as excinfo:
        DEFAULT.telephony_cost("bandwidth", "outbound", 1_000)
    assert str(excinfo.value) == "no telephony rate for provider 'bandwidth' (outbound)"


def test_telephony_rejects_bad_direction_and_elapsed() -> None:
    with pytest.raises(ValueError, match="direction"):
        DEFAULT.telephony_rate("twilio", "*")
    with pytest.raises(ValueError, match=">= 0"):
        DEFAULT.telephony_cost("twilio", "inbound", -1)
    with pytest.raises(TypeError, match="int"):
        DEFAULT.telephony_cost("twilio", "inbound", 1.5)  # type: ignore[arg-type]


def test_rate_objects_validate_their_fields() -> None:
    with pytest.raises(ValueError, match="billing_increment_s"):
        TelephonyRate(1_000, 0)
    with pytest.raises(ValueError, match="micros_per_minute"):
        TelephonyRate(-1, 60)
    with pytest.raises(TypeError, match="audio_in"):
        BrainRates(1, 1, 1.5, 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="direction"):
        PriceTable(telephony={("x", "up"): TelephonyRate(1, 1)})
    with pytest.raises(TypeError, match="TelephonyRate"):
        PriceTable(telephony={("x", "inbound"): 5})  # type: ignore[dict-item]


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(min_value=0, max_value=10_000_000),
    increment_s=st.integers(min_value=1, max_value=3_600),
    elapsed_ms=st.integers(min_value=0, max_value=10 * 86_400_000),
)
def test_telephony_cost_is_exact_ceiling_of_started_increments(
    rate: int, increment_s: int, elapsed_ms: int
) -> None:
    r = TelephonyRate(rate, increment_s)
    increments = -(-Fraction(elapsed_ms, increment_s * 1000) // 1)
    exact = increments * increment_s * Fraction(rate, 60)
    cost = r.cost(elapsed_ms)
    assert cost - 1 < exact <= cost
    assert r.cost(elapsed_ms + 1) >= cost


# --- brains ---------------------------------------------------------------------------------


def test_brain_cost_exact_small_cases() -> None:
    rt = GPT_REALTIME_RATES
    assert DEFAULT.brain_cost("gpt-realtime", TokenTotals()) == 0
    assert DEFAULT.brain_cost("gpt-realtime", TokenTotals(input_audio=1)) == 32
    assert DEFAULT.brain_cost("gpt-realtime", TokenTotals(output_audio=1)) == 64
    assert DEFAULT.brain_cost("gpt-realtime", TokenTotals(input_text=1)) == 4
    assert DEFAULT.brain_cost("gpt-realtime", TokenTotals(output_text=1)) == 16
    # 3 cached text tokens at $0.40/1M = 1.2 micros -> 2 (one ceil).
    assert DEFAULT.brain_cost("gpt-realtime", TokenTotals(input_text=3, cached_input=3)) == 2
    # A realistic response: 600 audio in, 1200 audio out.
    assert (
        DEFAULT.brain_cost("gpt-realtime", TokenTotals(input_audio=600, output_audio=1200))
        == (600 * rt.audio_in + 1200 * rt.audio_out) // 1_000_000
    )


def test_cached_tokens_come_out_of_text_first_and_pay_the_dearer_cached_rate() -> None:
    tokens = TokenTotals(input_text=100, input_audio=100, cached_input=150)
    # 100 cached from text, 50 from audio; 50 audio uncached at $32/1M; 150 cached at $0.40/1M.
    assert DEFAULT.brain_cost("gpt-realtime", tokens) == (50 * 32_000_000 + 150 * 400_000) // 10**6
    # mini: cached audio ($0.30) is dearer than cached text ($0.06): all 150 pay $0.30.
    assert DEFAULT.brain_cost("gpt-realtime-mini", tokens) == -(
        -(50 * 10_000_000 + 150 * 300_000) // 10**6
    )


def test_cached_tokens_come_out_of_the_cheaper_class_when_text_is_dearer() -> None:
    rates = BrainRates(
        text_in=50_000_000,
        cached_text_in=1_000_000,
        audio_in=10_000_000,
        cached_audio_in=1_000_000,
        text_out=0,
        audio_out=0,
    )
    table = PriceTable(telephony={}, brains={"odd": rates})
    tokens = TokenTotals(input_text=10, input_audio=10, cached_input=10)
    assert table.brain_cost("odd", tokens) == 10 * 50 + 10 * 1  # audio taken as cached


def test_cumulative_totals_are_rounded_once() -> None:
    one = TokenTotals(input_text=1)
    total = TokenTotals()
    per_event = 0
    for _ in range(3):
        total += one
        per_event += DEFAULT.brain_cost("gpt-realtime-mini", one)
    assert per_event == 3  # 0.6 micros -> 1, three times
    assert DEFAULT.brain_cost("gpt-realtime-mini", total) == 2  # 1.8 -> 2


@pytest.mark.parametrize(
    ("model", "rates"),
    [
        ("gpt-realtime", GPT_REALTIME_RATES),
        ("gpt-realtime-mini", GPT_REALTIME_MINI_RATES),
        ("gpt-realtime-2025-08-28", GPT_REALTIME_RATES),
        ("gpt-realtime-mini-2025-10-06", GPT_REALTIME_MINI_RATES),
        ("gpt-realtime-miniature", GPT_REALTIME_RATES),  # unknown: the dearest
        ("gpt-realtime-mini-preview", GPT_REALTIME_RATES),  # not a dated snapshot
        ("claude-voice", GPT_REALTIME_RATES),
        ("", GPT_REALTIME_RATES),
        (None, GPT_REALTIME_RATES),
    ],
)
def test_brain_rates_lookup(model: str | None, rates: BrainRates) -> None:
    assert DEFAULT.brain_rates(model) == rates


def test_any_model_entry_is_the_element_wise_maximum_when_not_given() -> None:
    a = BrainRates(1, 10, 100, 1, 1000, 5)
    b = BrainRates(2, 5, 50, 2, 10, 50)
    table = PriceTable(telephony={}, brains={"a": a, "b": b})
    assert table.brain_rates("zzz") == BrainRates(2, 10, 100, 2, 1000, 50)
    assert table.brain_rates(None) == table.brains["*"]


def test_table_without_brains_refuses_brain_lookups() -> None:
    table = PriceTable(telephony={("x", "*"): TelephonyRate(1, 1)})
    with pytest.raises(UnknownPrice, match="no brain rates"):
        table.brain_rates("gpt-realtime")


def test_token_totals_from_usage_treats_none_as_zero() -> None:
    assert TokenTotals.from_usage(Usage()) == TokenTotals()
    usage = Usage(
        model="gpt-realtime",
        input_audio_tokens=1,
        output_audio_tokens=2,
        input_text_tokens=3,
        output_text_tokens=4,
        cached_input_tokens=None,
    )
    assert TokenTotals.from_usage(usage) == TokenTotals(
        input_audio=1, input_text=3, cached_input=0, output_audio=2, output_text=4
    )


@pytest.mark.parametrize("count", [2**63, 2**64, 10**4000])
def test_token_totals_from_usage_refuse_counts_past_64_bits(count: int) -> None:
    with pytest.raises(ValueError, match=f"output_audio must be <= {MAX_TOKEN_COUNT}"):
        TokenTotals.from_usage(Usage(output_audio_tokens=count))


def test_saturated_token_totals_never_raise() -> None:
    assert MAX_TOKEN_COUNT == 2**63 - 1
    usage = Usage(
        input_audio_tokens=2**63,
        output_audio_tokens=10**4000,
        input_text_tokens=-3,
        output_text_tokens=7,
        cached_input_tokens=None,
    )
    assert TokenTotals.saturated_from_usage(usage) == TokenTotals(
        input_audio=MAX_TOKEN_COUNT, output_audio=MAX_TOKEN_COUNT, output_text=7
    )
    honest = Usage(input_audio_tokens=1, input_text_tokens=2, cached_input_tokens=3)
    assert TokenTotals.saturated_from_usage(honest) == TokenTotals.from_usage(honest)
    weird = Usage(input_audio_tokens=True, output_text_tokens=1.5)  # type: ignore[arg-type]
    assert TokenTotals.saturated_from_usage(weird) == TokenTotals()
    totals = TokenTotals(input_audio=5, input_text=6, output_audio=7, output_text=8)
    assert (totals.input_tokens, totals.output_tokens) == (11, 15)


def test_token_totals_reject_negatives_and_non_ints() -> None:
    with pytest.raises(ValueError, match="input_audio must be >= 0"):
        TokenTotals.from_usage(Usage(input_audio_tokens=-1))
    with pytest.raises(ValueError, match="cached_input"):
        TokenTotals(cached_input=-5)
    with pytest.raises(TypeError, match="output_text"):
        TokenTotals(output_text=True)
    with pytest.raises(TypeError, match="input_text"):
        TokenTotals(input_text=1.0)  # type: ignore[arg-type]


def test_token_totals_add_and_cached_normalisation() -> None:
    a = TokenTotals(1, 2, 3, 4, 5)
    assert a + a == TokenTotals(2, 4, 6, 8, 10)
    bad = TokenTotals(input_audio=2, input_text=1, cached_input=10, output_audio=7)
    assert bad.cached_exceeds_input
    fixed = bad.with_cached_within_input()
    assert fixed == TokenTotals(input_audio=2, input_text=8, cached_input=10, output_audio=7)
    assert not fixed.cached_exceeds_input
    assert a.with_cached_within_input() is a


_EVENT = st.tuples(
    st.integers(0, 5_000),  # uncached text in
    st.integers(0, 5_000),  # cached text in
    st.integers(0, 5_000),  # uncached audio in
    st.integers(0, 5_000),  # cached audio in
    st.integers(0, 5_000),  # text out
    st.integers(0, 5_000),  # audio out
)


@settings(max_examples=200, deadline=None)
@given(
    model=st.sampled_from(["gpt-realtime", "gpt-realtime-mini", None]),
    events=st.lists(_EVENT, max_size=8),
)
def test_cumulative_cost_never_under_charges_and_never_decreases(
    model: str | None, events: list[tuple[int, int, int, int, int, int]]
) -> None:
    """Whatever the hidden text/audio split of cached tokens, the meter's figure covers it."""
    rates = DEFAULT.brain_rates(model)
    totals = TokenTotals()
    true_cost = Fraction(0)
    last = 0
    for text, cached_text, audio, cached_audio, text_out, audio_out in events:
        true_cost += Fraction(
            text * rates.text_in
            + cached_text * rates.cached_text_in
            + audio * rates.audio_in
            + cached_audio * rates.cached_audio_in
            + text_out * rates.text_out
            + audio_out * rates.audio_out,
            1_000_000,
        )
        totals += TokenTotals(
            input_audio=audio + cached_audio,
            input_text=text + cached_text,
            cached_input=cached_text + cached_audio,
            output_audio=audio_out,
            output_text=text_out,
        )
        cost = DEFAULT.brain_cost(model, totals)
        assert cost >= true_cost
        assert cost >= last
        last = cost
    if all(e[1] == 0 and e[3] == 0 for e in events):  # no cached tokens: exact to one ceil
        assert last - 1 < true_cost <= last


# --- price file -----------------------------------------------------------------------------


def _brain_entry(scale: str = "1") -> dict[str, str]:
    return {
        "text_in_per_million": "4.00",
        "cached_text_in_per_million": "0.40",
        "audio_in_per_million": "32.00",
        "cached_audio_in_per_million": "0.40",
        "text_out_per_million": "16.00",
        "audio_out_per_million": scale + "64.00",
    }


def _document() -> dict[str, Any]:
    return {
        "telephony": {
            "twilio": {
                "inbound": {"per_minute": "0.0125", "billing_increment_s": 60},
                "outbound": {"per_minute": "0.018", "billing_increment_s": 60},
            },
            "sip": {"*": {"per_minute": "0.004", "billing_increment_s": 1}},
        },
        "brains": {
            "gpt-realtime": _brain_entry(""),
            "gpt-realtime-mini": {
                "text_in_per_million": "0.60",
                "cached_text_in_per_million": "0.06",
                "audio_in_per_million": "10",
                "cached_audio_in_per_million": "0.30",
                "text_out_per_million": "2.40",
                "audio_out_per_million": "20.000000",
            },
        },
    }


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_price_file_loads_exact_micros(tmp_path: Path) -> None:
    table = PriceTable.from_file(_write(tmp_path, _document()))
    assert table.telephony_rate("twilio", "inbound") == TelephonyRate(12_500, 60)
    assert table.telephony_rate("twilio", "outbound") == TelephonyRate(18_000, 60)
    assert table.telephony_rate("sip", "outbound") == TelephonyRate(4_000, 1)
    assert table.brain_rates("gpt-realtime") == GPT_REALTIME_RATES
    assert table.brain_rates("gpt-realtime-mini") == GPT_REALTIME_MINI_RATES
    # No "*" in the file: derived, the element-wise maximum.
    assert table.brain_rates("unknown") == BrainRates.max_of(
        [GPT_REALTIME_RATES, GPT_REALTIME_MINI_RATES]
    )
    assert table.brain_rates("unknown").cached_audio_in == 400_000
    assert table == PriceTable.from_json(_document())


def test_price_file_integral_float_increment_is_accepted() -> None:
    doc = _document()
    doc["telephony"]["twilio"]["inbound"]["billing_increment_s"] = 60.0
    assert PriceTable.from_json(doc).telephony_rate("twilio", "inbound") == TelephonyRate(
        12_500, 60
    )
    doc["telephony"]["twilio"]["inbound"]["billing_increment_s"] = 60.5
    assert _error(doc).json_path == "$.telephony.twilio.inbound.billing_increment_s"
    doc["telephony"]["twilio"]["inbound"]["billing_increment_s"] = True
    assert _error(doc).json_path == "$.telephony.twilio.inbound.billing_increment_s"


def test_price_file_explicit_any_model_is_honoured(tmp_path: Path) -> None:
    document = _document()
    document["brains"]["*"] = _brain_entry("1")  # audio out $164/1M
    table = PriceTable.from_file(_write(tmp_path, document))
    assert table.brain_rates(None).audio_out == 164_000_000


def _error(document: object) -> PriceFileError:
    with pytest.raises(PriceFileError) as excinfo:
        PriceTable.from_json(document, source="prices.json")
    return excinfo.value


def test_price_file_errors_name_the_json_path() -> None:
    doc = _document()
    doc["telephony"]["twilio"]["inbound"]["per_minute"] = "0.0000001"
    err = _error(doc)
    assert err.json_path == "$.telephony.twilio.inbound.per_minute"
    assert str(err).startswith("prices.json: $.telephony.twilio.inbound.per_minute: ")
    assert "7 decimal places" in err.message

    doc = _document()
    doc["telephony"]["twilio"]["inbound"]["billing_increment_s"] = 0
    assert _error(doc).json_path == "$.telephony.twilio.inbound.billing_increment_s"

    doc = _document()
    doc["telephony"]["twilio"]["inbound"]["per_minute"] = 0.0125
    err = _error(doc)
    assert err.json_path == "$.telephony.twilio.inbound.per_minute"
    assert "string" in err.message

    doc = _document()
    doc["brains"]["gpt-realtime"]["audio_out_per_million"] = "-64"
    err = _error(doc)
    assert err.json_path == "$.brains['gpt-realtime'].audio_out_per_million"
    assert "negative" in err.message

    doc = _document()
    del doc["brains"]["gpt-realtime"]["text_in_per_million"]
    err = _error(doc)
    assert err.json_path == "$.brains['gpt-realtime']"
    assert "text_in_per_million" in err.message

    doc = _document()
    doc["telephony"]["twilio"]["sideways"] = {"per_minute": "1", "billing_increment_s": 1}
    err = _error(doc)
    assert err.json_path == "$.telephony.twilio"
    assert "sideways" in err.message

    doc = _document()
    doc["currency"] = "EUR"
    err = _error(doc)
    assert err.json_path == "$"
    assert "currency" in err.message

    doc = _document()
    del doc["brains"]
    assert "brains" in _error(doc).message

    doc = _document()
    doc["brains"] = {}
    assert _error(doc).json_path == "$.brains"

    assert _error([]).json_path == "$"


def test_price_file_sanity_bounds_catch_typos() -> None:
    doc = _document()
    doc["brains"]["gpt-realtime"]["audio_out_per_million"] = "6400"
    err = _error(doc)
    assert err.json_path == "$.brains['gpt-realtime'].audio_out_per_million"
    assert "sanity bound" in err.message
    doc = _document()
    doc["telephony"]["twilio"]["inbound"]["per_minute"] = "125"
    assert _error(doc).json_path == "$.telephony.twilio.inbound.per_minute"


def test_price_file_io_and_json_errors(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match="cannot read"):
        PriceTable.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"brains": ', encoding="utf-8")
    with pytest.raises(PriceFileError, match=r"not JSON: .* \(line 1, column 12\)"):
        PriceTable.from_file(bad)
    dup = tmp_path / "dup.json"
    dup.write_text('{"brains": {"m": {}, "m": {}}}', encoding="utf-8")
    with pytest.raises(PriceFileError, match="duplicate key 'm'"):
        PriceTable.from_file(dup)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PriceFileError, match="cannot read"):
        PriceTable.from_file(binary)
    assert issubclass(PriceFileError, ValueError)


def test_price_table_is_immutable() -> None:
    with pytest.raises(TypeError):
        DEFAULT.brains["x"] = GPT_REALTIME_RATES  # type: ignore[index]
    with pytest.raises(AttributeError):
        DEFAULT.brains = {}  # type: ignore[misc]
