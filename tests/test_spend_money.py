"""spend.money: exact USD decimal strings <-> integer micros."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.spend.money import (
    MAX_MICROS,
    MAX_MONEY_TEXT_CHARS,
    MICROS_PER_USD,
    format_money,
    parse_money,
)


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("0.0140", 14_000),
        ("0", 0),
        ("0.0", 0),
        ("1", 1_000_000),
        ("0.000001", 1),
        ("0.50", 500_000),
        ("12.345678", 12_345_678),
        ("10000", 10_000_000_000),
        ("007.5", 7_500_000),
        ("9223372036854.775807", MAX_MICROS),
    ],
)
def test_parse_money_exact(text: str, micros: int) -> None:
    assert parse_money(text) == micros


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("-1", "negative"),
        ("-0.01", "negative"),
        ("-0", "sign"),
        ("+1", "sign"),
        ("1e3", "exponent"),
        ("1E-2", "exponent"),
        ("NaN", "NaN"),
        ("sNaN", "NaN"),
        ("inf", "infinity"),
        ("-Infinity", "infinity"),
        ("0.0000001", "7 decimal places"),
        ("1.1234567", "7 decimal places"),
        (" 1", "whitespace"),
        ("1\n", "whitespace"),
        ("1_000", "underscores"),
        ("1.", "digits with an optional point"),
        (".5", "digits with an optional point"),
        ("abc", "not a decimal number"),
        ("0x10", "not a decimal number"),
        ("1,50", "not a decimal number"),
        ("9223372036854.775808", "too large"),
        ("1" * (MAX_MONEY_TEXT_CHARS + 1), "longer than"),
        ("١٢", "digits with an optional point"),  # Arabic-Indic digits: Decimal takes them
    ],
)
def test_parse_money_rejects_with_a_clear_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_money(text)


@pytest.mark.parametrize("value", [1.5, 1, None, b"1", Decimal("1")])
def test_parse_money_rejects_non_strings(value: object) -> None:
    with pytest.raises(ValueError, match="decimal string"):
        parse_money(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (14_000, "0.014000"),
        (0, "0.000000"),
        (1, "0.000001"),
        (1_000_000, "1.000000"),
        (12_345_678, "12.345678"),
        (-1, "-0.000001"),
        (-2_500_000, "-2.500000"),
    ],
)
def test_format_money(micros: int, text: str) -> None:
    assert format_money(micros) == text


@pytest.mark.parametrize("value", [1.0, True, "1", None])
def test_format_money_rejects_non_ints(value: object) -> None:
    with pytest.raises(TypeError, match="int"):
        format_money(value)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=MAX_MICROS))
def test_format_then_parse_round_trips(micros: int) -> None:
    assert parse_money(format_money(micros)) == micros


@settings(max_examples=300, deadline=None)
@given(
    whole=st.integers(min_value=0, max_value=10**12),
    fraction=st.text(alphabet="0123456789", min_size=0, max_size=6),
)
def test_parse_matches_decimal_arithmetic(whole: int, fraction: str) -> None:
    text = f"{whole}.{fraction}" if fraction else str(whole)
    expected = Decimal(text) * MICROS_PER_USD
    assert expected == expected.to_integral_value()
    assert parse_money(text) == int(expected)
    assert Decimal(format_money(parse_money(text))) == Decimal(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_parse_money_never_crashes_on_arbitrary_text(text: str) -> None:
    try:
        micros = parse_money(text)
    except ValueError:
        return
    assert 0 <= micros <= MAX_MICROS
    assert Decimal(text) * MICROS_PER_USD == micros
