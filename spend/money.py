"""Money as integer micro-units: exact parsing and formatting of USD amounts.

Every amount in the spend gate is an ``int`` of micro-dollars (1 USD =
1_000_000 micros): sums and comparisons are exact, Redis stores them with
``INCRBY``, and no float ever touches money. At the edges (API bodies, price
files, receipts) amounts are decimal strings in USD such as ``"0.50"``; this
module converts between the two, strictly: a string that is not a plain
non-negative decimal with at most six places is refused with a message that
says why, never rounded.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import TypeAlias

__all__ = [
    "MAX_MICROS",
    "MAX_MONEY_TEXT_CHARS",
    "MICROS_PER_USD",
    "MONEY_DECIMALS",
    "Micros",
    "format_money",
    "parse_money",
]

#: An amount of money in micro-dollars.
Micros: TypeAlias = int

#: Micro-units per dollar: the house unit (1 USD = 1_000_000 micros; common brief).
MICROS_PER_USD = 1_000_000
#: Decimal places a money string may carry: one micro-dollar is the smallest unit.
MONEY_DECIMALS = 6
#: Largest amount accepted: Redis integers (INCRBY, HINCRBY) are signed 64-bit.
MAX_MICROS = 2**63 - 1
#: Longest money string looked at (a bound on work for hostile input): the
#: largest valid amount, "9223372036854.775807", has 20 characters.
MAX_MONEY_TEXT_CHARS = 40

_PLAIN_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?")


def parse_money(text: str) -> Micros:
    """Parse a USD decimal string (``"0.0140"``) into micros (``14_000``), exactly.

    Accepted: digits, optionally a point and 1 to 6 more digits. Refused with a
    ``ValueError`` naming the problem: non-strings, empty or over-long strings,
    surrounding spaces, signs (negatives included), exponent forms, NaN and
    infinities, more than six decimal places, amounts above :data:`MAX_MICROS`.
    """
    if not isinstance(text, str):
        raise ValueError(
            f"money must be a decimal string such as '0.50', not {type(text).__name__}"
        )
    if not text:
        raise ValueError("money must not be empty")
    if len(text) > MAX_MONEY_TEXT_CHARS:
        raise ValueError(f"money string longer than {MAX_MONEY_TEXT_CHARS} characters")
    match = _PLAIN_DECIMAL.fullmatch(text)
    if match is None:
        raise ValueError(_why_not_plain(text))
    fraction = match.group(2) or ""
    if len(fraction) > MONEY_DECIMALS:
        raise ValueError(
            f"money {text!r} has {len(fraction)} decimal places; at most {MONEY_DECIMALS} "
            "(one micro-dollar) are allowed"
        )
    # The regex admits only plain digits, so the Decimal is finite and the
    # product with 10**6 is an integral value: the conversion is exact.
    micros = int(Decimal(text) * MICROS_PER_USD)
    if micros > MAX_MICROS:
        raise ValueError(f"money {text!r} is too large (at most {format_money(MAX_MICROS)})")
    return micros


def _why_not_plain(text: str) -> str:
    """The most specific reason why ``text`` is not a plain decimal amount."""
    if text != text.strip():
        return f"money {text!r} must not have surrounding whitespace"
    try:
        value = Decimal(text)
    except InvalidOperation:
        return f"money {text!r} is not a decimal number such as '0.50'"
    if value.is_nan():
        return f"money {text!r}: NaN is not an amount"
    if value.is_infinite():
        return f"money {text!r}: infinity is not an amount"
    if value.is_signed() and value != 0:
        return f"money {text!r} is negative; amounts must be >= 0"
    if "e" in text.lower():
        return f"money {text!r}: exponent forms are not allowed; write the plain decimal"
    if text[0] in "+-":
        return f"money {text!r} must not carry a sign"
    if "_" in text:
        return f"money {text!r} must not contain underscores"
    return f"money {text!r} must be digits with an optional point and 1-6 decimals, e.g. '0.50'"


def format_money(micros: Micros) -> str:
    """Format micros as a USD decimal string with exactly six places (``14_000`` → ``"0.014000"``).

    Negative amounts (an over-spent budget's "left") keep their sign.
    """
    if not isinstance(micros, int) or isinstance(micros, bool):
        raise TypeError(f"micros must be an int, not {type(micros).__name__}")
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    return f"{sign}{whole}.{frac:0{MONEY_DECIMALS}d}"
