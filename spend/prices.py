"""What a call costs: telephony per-minute rates and brain per-token rates, in micros.

Sans-I/O except :meth:`PriceTable.from_file`, which only reads the file.

Telephony is billed per ``(provider, direction)`` in whole billing increments,
rounded up (Twilio bills per started minute); a missing direction falls back to
``(provider, "*")``. Brains are billed per 1M tokens, by model; a model the table
does not know (or ``None``) is billed at the ``"*"`` entry, by default the
element-wise maximum of all known models, so an unknown model is never
under-charged. A dated snapshot name (``gpt-realtime-2025-08-28``) is billed as
its base model when that is known.

Price file (``RUTSTER_PRICES_FILE``), JSON, amounts as decimal strings in USD
(at most six places), validated against :data:`PRICE_FILE_SCHEMA`. The file is
the whole table (it replaces the built-in defaults, it does not patch them)::

    {
      "telephony": {
        "twilio": {
          "inbound":  {"per_minute": "0.0125", "billing_increment_s": 60},
          "outbound": {"per_minute": "0.0180", "billing_increment_s": 60}
        },
        "sip": {"*": {"per_minute": "0.004", "billing_increment_s": 1}}
      },
      "brains": {
        "gpt-realtime": {
          "text_in_per_million": "4.00", "cached_text_in_per_million": "0.40",
          "audio_in_per_million": "32.00", "cached_audio_in_per_million": "0.40",
          "text_out_per_million": "16.00", "audio_out_per_million": "64.00"
        }
      }
    }

``telephony`` keys are provider names, then ``inbound``, ``outbound`` or ``*``;
``brains`` keys are model names or ``*`` (all six rates required per model).
Errors are :class:`PriceFileError` naming the JSON path of the offending value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol, Self

import jsonschema
from jsonschema.exceptions import best_match

from rutster.spend.money import MAX_MICROS, Micros, parse_money

__all__ = [
    "ANY",
    "DEFAULT_MODEL_KEY",
    "GPT_REALTIME_MINI_RATES",
    "GPT_REALTIME_RATES",
    "MAX_BILLING_INCREMENT_S",
    "MAX_BRAIN_MICROS_PER_MILLION",
    "MAX_TELEPHONY_MICROS_PER_MINUTE",
    "MAX_TOKEN_COUNT",
    "PRICE_FILE_SCHEMA",
    "SIP_BILLING_INCREMENT_S",
    "SIP_INBOUND_MICROS_PER_MINUTE",
    "SIP_OUTBOUND_MICROS_PER_MINUTE",
    "TOKENS_PER_RATE_UNIT",
    "TWILIO_BILLING_INCREMENT_S",
    "TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE",
    "TWILIO_US_INBOUND_MICROS_PER_MINUTE",
    "TWILIO_US_OUTBOUND_MICROS_PER_MINUTE",
    "BrainRates",
    "Direction",
    "PriceFileError",
    "PriceTable",
    "TelephonyRate",
    "TokenTotals",
    "UnknownPrice",
    "UsageReport",
]

Direction = Literal["inbound", "outbound"]
#: Wildcard key: a provider's any-direction rate, or the brains' unknown-model rate.
ANY: Final = "*"
#: Key of the rates billed for an unknown or unreported brain model.
DEFAULT_MODEL_KEY: Final = ANY
_DIRECTIONS = ("inbound", "outbound")

#: Brain rates are quoted per this many tokens (OpenAI pricing pages quote per 1M tokens).
TOKENS_PER_RATE_UNIT = 1_000_000
#: Largest token count a :class:`TokenTotals` holds: the house's 64-bit bound (Redis
#: integers are signed 64-bit, spend/money.py). A brain's larger count is saturated to it
#: by :meth:`TokenTotals.saturated_from_usage`, never refused.
MAX_TOKEN_COUNT = MAX_MICROS
_MS_PER_MINUTE = 60_000
_MS_PER_S = 1_000
_S_PER_MINUTE = 60

# --- Built-in telephony rates -------------------------------------------------------------
#: Twilio US voice, inbound (local number), per minute: $0.0085 (twilio.com/en-us/voice/pricing/us,
#: as of 2025).
TWILIO_US_INBOUND_MICROS_PER_MINUTE = 8_500
#: Twilio US voice, outbound, per minute: $0.0140 (twilio.com/en-us/voice/pricing/us, as of 2025).
TWILIO_US_OUTBOUND_MICROS_PER_MINUTE = 14_000
#: Twilio Media Streams surcharge, per minute, both directions: "Media Streams $0.004/min"
#: (twilio.com/en-us/voice/pricing/us, as of 2025).
TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE = 4_000
#: Twilio bills voice per started minute (twilio.com/en-us/voice/pricing/us: "rounded up").
TWILIO_BILLING_INCREMENT_S = 60
#: Our SIP trunk, inbound, per minute (seed decision: the order of magnitude of Twilio
#: Elastic SIP Trunking origination).
SIP_INBOUND_MICROS_PER_MINUTE = 4_000
#: Our SIP trunk, outbound, per minute (seed decision: order of magnitude of Twilio Elastic SIP
#: Trunking US termination).
SIP_OUTBOUND_MICROS_PER_MINUTE = 4_000
#: SIP trunks commonly bill per second (seed decision).
SIP_BILLING_INCREMENT_S = 1

# --- Sanity bounds for price files (a typo such as "6400" for "64.00" must not pass) -----
#: Highest telephony rate accepted, $10/min (seed decision: premium international routes
#: cost a few dollars a minute; anything dearer is taken for a typo).
MAX_TELEPHONY_MICROS_PER_MINUTE = 10_000_000
#: Longest billing increment accepted, one hour (seed decision: carriers bill per second
#: or per minute; longer increments are taken for a typo).
MAX_BILLING_INCREMENT_S = 3_600
#: Highest brain rate accepted, $1000 per 1M tokens (seed decision: ~15x the dearest
#: realtime rate, gpt-realtime audio out at $64/1M).
MAX_BRAIN_MICROS_PER_MILLION = 1_000_000_000


class UnknownPrice(LookupError):
    """No rate is known for a provider/direction or brain model."""

    def __str__(self) -> str:
        # LookupError's str() of one argument is repr-like; keep the message plain.
        return str(self.args[0]) if self.args else "unknown price"


class PriceFileError(ValueError):
    """A price file is unreadable or invalid; ``json_path`` names the offending value."""

    def __init__(self, message: str, *, json_path: str = "$", source: str = "<prices>") -> None:
        super().__init__(f"{source}: {json_path}: {message}")
        self.message = message
        self.json_path = json_path
        self.source = source


def _check_count(name: str, value: object, *, maximum: int = MAX_MICROS) -> None:
    """Reject non-ints (bools included) and values outside ``0..maximum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def _saturate(count: object) -> int:
    """``count`` as a token count in ``0..MAX_TOKEN_COUNT``; a non-count reads as 0."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return 0
    return min(count, MAX_TOKEN_COUNT)


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass(frozen=True, slots=True)
class TelephonyRate:
    """Micros per minute, billed in whole increments of ``billing_increment_s`` (rounded up)."""

    micros_per_minute: int
    billing_increment_s: int

    def __post_init__(self) -> None:
        _check_count("micros_per_minute", self.micros_per_minute)
        _check_count("billing_increment_s", self.billing_increment_s)
        if self.billing_increment_s < 1:
            raise ValueError("billing_increment_s must be >= 1")

    def increments(self, elapsed_ms: int) -> int:
        """Billing increments started after ``elapsed_ms`` (a started increment counts whole)."""
        _check_count("elapsed_ms", elapsed_ms)
        return _ceil_div(elapsed_ms, self.billing_increment_s * _MS_PER_S)

    def cost(self, elapsed_ms: int) -> Micros:
        """Cost of ``elapsed_ms`` of call time: whole increments, one ceil to the micro."""
        billed_s = self.increments(elapsed_ms) * self.billing_increment_s
        return _ceil_div(billed_s * self.micros_per_minute, _S_PER_MINUTE)


@dataclass(frozen=True, slots=True)
class BrainRates:
    """A brain model's rates in micros per 1M tokens."""

    text_in: int
    cached_text_in: int
    audio_in: int
    cached_audio_in: int
    text_out: int
    audio_out: int

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_count(f.name, getattr(self, f.name))

    @classmethod
    def max_of(cls, rates: list[BrainRates]) -> BrainRates:
        """Element-wise maximum: at least what any of ``rates`` would charge."""
        if not rates:
            raise ValueError("max_of needs at least one BrainRates")
        return cls(
            **{f.name: max(getattr(r, f.name) for r in rates) for f in fields(cls)},
        )


class UsageReport(Protocol):
    """A brain's token report as the spend gate reads it; every count optional.

    The tap protocol's ``Usage`` event (``protocols/tap.py``) has this shape: spend
    reads it structurally, so it depends on no protocol module (docs/ARCHITECTURE.md
    layers) and any brain's report of the same fields bills the same.
    """

    @property
    def model(self) -> str | None:
        """The model the tokens were spent on (None: the table's ``*`` rate)."""

    @property
    def input_audio_tokens(self) -> int | None:
        """Audio tokens in."""

    @property
    def output_audio_tokens(self) -> int | None:
        """Audio tokens out."""

    @property
    def input_text_tokens(self) -> int | None:
        """Text tokens in."""

    @property
    def output_text_tokens(self) -> int | None:
        """Text tokens out."""

    @property
    def cached_input_tokens(self) -> int | None:
        """Input tokens served from the model's cache."""


@dataclass(frozen=True, slots=True)
class TokenTotals:
    """Token counts of a call or of one usage report (cached ⊆ input, docs/PROVIDERS.md §5.5)."""

    input_audio: int = 0
    input_text: int = 0
    cached_input: int = 0
    output_audio: int = 0
    output_text: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_count(f.name, getattr(self, f.name), maximum=MAX_TOKEN_COUNT)

    @classmethod
    def from_usage(cls, usage: UsageReport) -> TokenTotals:
        """The counts of a tap ``usage`` event; an absent (``None``) count is 0.

        A count outside ``0..MAX_TOKEN_COUNT`` raises ``ValueError``; the meter uses
        :meth:`saturated_from_usage`, which never does.
        """
        return cls(
            input_audio=usage.input_audio_tokens or 0,
            input_text=usage.input_text_tokens or 0,
            cached_input=usage.cached_input_tokens or 0,
            output_audio=usage.output_audio_tokens or 0,
            output_text=usage.output_text_tokens or 0,
        )

    @classmethod
    def saturated_from_usage(cls, usage: UsageReport) -> TokenTotals:
        """The counts of a tap ``usage`` event, each forced into ``0..MAX_TOKEN_COUNT``.

        The tap decoder admits any JSON integer >= 0 (10**4000 included), and a brain's
        report must never raise inside the call: a count above the bound reads as the
        bound (the meter then clamps it to its ceiling and flags it), anything that is
        not a count >= 0 (a negative from a hand-built ``Usage``) reads as 0.
        """
        return cls(
            input_audio=_saturate(usage.input_audio_tokens),
            input_text=_saturate(usage.input_text_tokens),
            cached_input=_saturate(usage.cached_input_tokens),
            output_audio=_saturate(usage.output_audio_tokens),
            output_text=_saturate(usage.output_text_tokens),
        )

    @property
    def input_tokens(self) -> int:
        """Input tokens, text and audio (cached tokens are a subset of these)."""
        return self.input_audio + self.input_text

    @property
    def output_tokens(self) -> int:
        """Output tokens, text and audio."""
        return self.output_audio + self.output_text

    def __add__(self, other: TokenTotals) -> TokenTotals:
        if not isinstance(other, TokenTotals):
            return NotImplemented
        return TokenTotals(
            input_audio=self.input_audio + other.input_audio,
            input_text=self.input_text + other.input_text,
            cached_input=self.cached_input + other.cached_input,
            output_audio=self.output_audio + other.output_audio,
            output_text=self.output_text + other.output_text,
        )

    @property
    def cached_exceeds_input(self) -> bool:
        """More cached tokens than input tokens: impossible for one honest report."""
        return self.cached_input > self.input_audio + self.input_text

    def with_cached_within_input(self) -> TokenTotals:
        """This report with ``input_text`` raised so that cached ⊆ input holds.

        Cached tokens are a subset of the input (docs/PROVIDERS.md §5.5), so a report
        of more cached than input tokens means at least that much input; the
        excess is read as cached text (billed at the cached rate, nothing more).
        """
        excess = self.cached_input - self.input_audio - self.input_text
        if excess <= 0:
            return self
        return TokenTotals(
            input_audio=self.input_audio,
            input_text=self.input_text + excess,
            cached_input=self.cached_input,
            output_audio=self.output_audio,
            output_text=self.output_text,
        )


def _brain_cost(rates: BrainRates, tokens: TokenTotals) -> Micros:
    """Cost of cumulative ``tokens`` at ``rates``: one ceil, never under-charged.

    The tap reports cached tokens without a text/audio split, so they are taken
    out of the input class whose uncached rate is cheaper first (text, for every
    built-in model) and billed at the dearer of the two cached rates. That is the
    most expensive split consistent with the counts, so it is at least the true
    cost, also when summed over many reports.
    """
    cached_rate = max(rates.cached_text_in, rates.cached_audio_in)
    if rates.text_in <= rates.audio_in:
        from_text = min(tokens.cached_input, tokens.input_text)
        from_audio = min(tokens.cached_input - from_text, tokens.input_audio)
    else:
        from_audio = min(tokens.cached_input, tokens.input_audio)
        from_text = min(tokens.cached_input - from_audio, tokens.input_text)
    # Cached tokens beyond all input (a bad report) are still billed, at the cached rate.
    total = (
        (tokens.input_text - from_text) * rates.text_in
        + (tokens.input_audio - from_audio) * rates.audio_in
        + tokens.cached_input * cached_rate
        + tokens.output_text * rates.text_out
        + tokens.output_audio * rates.audio_out
    )
    return _ceil_div(total, TOKENS_PER_RATE_UNIT)


#: OpenAI gpt-realtime (GA) per 1M tokens: text in $4.00, cached text $0.40, audio in $32.00,
#: cached audio $0.40, text out $16.00, audio out $64.00 (openai.com/api/pricing).
GPT_REALTIME_RATES = BrainRates(
    text_in=4_000_000,
    cached_text_in=400_000,
    audio_in=32_000_000,
    cached_audio_in=400_000,
    text_out=16_000_000,
    audio_out=64_000_000,
)
#: OpenAI gpt-realtime-mini per 1M tokens: text in $0.60, cached text $0.06, audio in $10.00,
#: cached audio $0.30, text out $2.40, audio out $20.00 (openai.com/api/pricing).
GPT_REALTIME_MINI_RATES = BrainRates(
    text_in=600_000,
    cached_text_in=60_000,
    audio_in=10_000_000,
    cached_audio_in=300_000,
    text_out=2_400_000,
    audio_out=20_000_000,
)

#: A dated snapshot of a model (``gpt-realtime-2025-08-28``) is billed as its base model.
_DATED_SNAPSHOT = re.compile(r"(.+)-[0-9]{4}-[0-9]{2}-[0-9]{2}")


@dataclass(frozen=True)
class PriceTable:
    """Telephony and brain rates; immutable.

    ``telephony`` maps ``(provider, direction)`` (direction ``inbound``,
    ``outbound`` or ``*``) to a :class:`TelephonyRate`; ``brains`` maps model
    names (and ``*``) to :class:`BrainRates`. Without a ``*`` brain entry the
    table adds one, the element-wise maximum of the known models.
    """

    telephony: Mapping[tuple[str, str], TelephonyRate]
    brains: Mapping[str, BrainRates] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, rate in self.telephony.items():
            if not (
                isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)
            ):
                raise ValueError(f"telephony key must be (provider, direction), got {key!r}")
            if key[1] not in (*_DIRECTIONS, ANY):
                raise ValueError(f"telephony direction must be inbound, outbound or *: {key!r}")
            if not isinstance(rate, TelephonyRate):
                raise TypeError(f"telephony rate for {key!r} must be a TelephonyRate")
        brains = dict(self.brains)
        for model, rates in brains.items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"brain model name must be a non-empty string, got {model!r}")
            if not isinstance(rates, BrainRates):
                raise TypeError(f"brain rates for {model!r} must be BrainRates")
        if brains and DEFAULT_MODEL_KEY not in brains:
            brains[DEFAULT_MODEL_KEY] = BrainRates.max_of(list(brains.values()))
        object.__setattr__(self, "telephony", MappingProxyType(dict(self.telephony)))
        object.__setattr__(self, "brains", MappingProxyType(brains))

    def with_telephony(self, rates: Mapping[tuple[str, str], TelephonyRate]) -> PriceTable:
        """This table, with ``rates`` for the providers it has no rate of: a provider it
        prices in any way (even only ``*``) keeps this table's rates alone."""
        priced = {provider for provider, _ in self.telephony}
        added = {key: rate for key, rate in rates.items() if key[0] not in priced}
        return PriceTable(telephony={**added, **self.telephony}, brains=dict(self.brains))

    @classmethod
    def default(cls) -> PriceTable:
        """The built-in rates (module constants, sources in their comments)."""
        twilio_in = TWILIO_US_INBOUND_MICROS_PER_MINUTE + TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE
        twilio_out = TWILIO_US_OUTBOUND_MICROS_PER_MINUTE + TWILIO_MEDIA_STREAMS_MICROS_PER_MINUTE
        return cls(
            telephony={
                ("twilio", "inbound"): TelephonyRate(twilio_in, TWILIO_BILLING_INCREMENT_S),
                ("twilio", "outbound"): TelephonyRate(twilio_out, TWILIO_BILLING_INCREMENT_S),
                ("sip", "inbound"): TelephonyRate(
                    SIP_INBOUND_MICROS_PER_MINUTE, SIP_BILLING_INCREMENT_S
                ),
                ("sip", "outbound"): TelephonyRate(
                    SIP_OUTBOUND_MICROS_PER_MINUTE, SIP_BILLING_INCREMENT_S
                ),
            },
            brains={
                "gpt-realtime": GPT_REALTIME_RATES,
                "gpt-realtime-mini": GPT_REALTIME_MINI_RATES,
                # Unknown models pay the dearest known model's rates (never under-charge).
                DEFAULT_MODEL_KEY: GPT_REALTIME_RATES,
            },
        )

    # --- lookups ------------------------------------------------------------------------

    def telephony_rate(self, provider: str, direction: str) -> TelephonyRate:
        """The rate for ``(provider, direction)``, else ``(provider, "*")``, else UnknownPrice."""
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be 'inbound' or 'outbound', got {direction!r}")
        rate = self.telephony.get((provider, direction))
        if rate is None:
            rate = self.telephony.get((provider, ANY))
        if rate is None:
            raise UnknownPrice(f"no telephony rate for provider {provider!r} ({direction})")
        return rate

    def telephony_cost(self, provider: str, direction: str, elapsed_ms: int) -> Micros:
        """Telephony cost of ``elapsed_ms``: whole increments rounded up, ceil to the micro."""
        return self.telephony_rate(provider, direction).cost(elapsed_ms)

    def brain_rates(self, model: str | None) -> BrainRates:
        """Rates for ``model``: exact name, else its dated snapshot's base, else ``*``."""
        if model is not None:
            rates = self.brains.get(model)
            if rates is not None:
                return rates
            snapshot = _DATED_SNAPSHOT.fullmatch(model)
            if snapshot is not None and snapshot.group(1) in self.brains:
                return self.brains[snapshot.group(1)]
        rates = self.brains.get(DEFAULT_MODEL_KEY)
        if rates is None:
            raise UnknownPrice(f"no brain rates for model {model!r} and no '*' default")
        return rates

    def brain_cost(self, model: str | None, tokens: TokenTotals) -> Micros:
        """Cost of cumulative ``tokens`` of ``model`` (one ceil; see :func:`_brain_cost`)."""
        return _brain_cost(self.brain_rates(model), tokens)

    # --- price file ---------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """Load and validate a JSON price file (schema in the module docstring)."""
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PriceFileError(f"cannot read price file: {exc}", source=source) from exc
        try:
            document = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
        except _DuplicateKey as exc:
            raise PriceFileError(f"duplicate key {exc.key!r}", source=source) from None
        except json.JSONDecodeError as exc:
            raise PriceFileError(
                f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", source=source
            ) from None
        return cls.from_json(document, source=source)

    @classmethod
    def from_json(cls, document: object, *, source: str = "<prices>") -> Self:
        """Build a table from a parsed price document; PriceFileError names what is wrong."""
        error = best_match(_VALIDATOR.iter_errors(document))
        if error is not None:
            message = error.message
            if error.validator == "pattern" and error.schema.get("x-money"):
                # parse_money says why ("7 decimal places", "negative") better than a regex.
                try:
                    parse_money(error.instance)
                except ValueError as exc:
                    message = str(exc)
            raise PriceFileError(message, json_path=error.json_path, source=source)
        if not isinstance(document, dict):  # unreachable: the schema requires an object
            raise PriceFileError("a price file must be a JSON object", source=source)
        telephony: dict[tuple[str, str], TelephonyRate] = {}
        for provider, directions in document.get("telephony", {}).items():
            for direction, entry in directions.items():
                at = _json_path("telephony", provider, direction, "per_minute")
                per_minute = _money_at(entry["per_minute"], at, source)
                _bound(per_minute, MAX_TELEPHONY_MICROS_PER_MINUTE, at, source)
                # JSON Schema counts 60.0 as an integer; int() of it is exact.
                increment_s = int(entry["billing_increment_s"])
                telephony[(provider, direction)] = TelephonyRate(per_minute, increment_s)
        brains: dict[str, BrainRates] = {}
        for model, entry in document["brains"].items():
            values: dict[str, int] = {}
            for name in _BRAIN_FIELDS:
                key = f"{name}_per_million"
                at = _json_path("brains", model, key)
                value = _money_at(entry[key], at, source)
                _bound(value, MAX_BRAIN_MICROS_PER_MILLION, at, source)
                values[name] = value
            brains[model] = BrainRates(**values)
        return cls(telephony=telephony, brains=brains)

    def iter_telephony(self) -> Iterator[tuple[str, str, TelephonyRate]]:
        """``(provider, direction, rate)`` for every telephony entry, sorted."""
        for (provider, direction), rate in sorted(self.telephony.items()):
            yield provider, direction, rate


_BRAIN_FIELDS = tuple(f.name for f in fields(BrainRates))

#: A USD amount as a decimal string, at most six places (parse_money gives the precise error).
_MONEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": r"^[0-9]+(\.[0-9]{1,6})?$",
    "maxLength": 24,
    "x-money": True,
}

#: JSON Schema (draft 2020-12) of a price file.
PRICE_FILE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "rutster price table",
    "type": "object",
    "additionalProperties": False,
    "required": ["brains"],
    "properties": {
        "telephony": {
            "description": "provider -> direction (inbound, outbound or *) -> rate",
            "type": "object",
            "propertyNames": {"pattern": r"^[a-z][a-z0-9_-]{0,31}$"},
            "additionalProperties": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {"enum": ["inbound", "outbound", "*"]},
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["per_minute", "billing_increment_s"],
                    "properties": {
                        "per_minute": {**_MONEY_SCHEMA, "description": "USD per minute"},
                        "billing_increment_s": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_BILLING_INCREMENT_S,
                        },
                    },
                },
            },
        },
        "brains": {
            "description": "model name (or * for unknown models) -> USD per 1M tokens",
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": r"^(\*|[A-Za-z0-9][A-Za-z0-9._:/-]{0,127})$"},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": [f"{name}_per_million" for name in _BRAIN_FIELDS],
                "properties": {
                    f"{name}_per_million": {**_MONEY_SCHEMA, "description": "USD per 1M tokens"}
                    for name in _BRAIN_FIELDS
                },
            },
        },
    },
}

jsonschema.Draft202012Validator.check_schema(PRICE_FILE_SCHEMA)
_VALIDATOR = jsonschema.Draft202012Validator(PRICE_FILE_SCHEMA)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a repeated key would silently override a price."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


_PLAIN_PATH_KEY = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*")


def _json_path(*keys: str) -> str:
    """A JSON path written the way jsonschema's ``ValidationError.json_path`` writes it."""
    path = "$"
    for key in keys:
        if _PLAIN_PATH_KEY.fullmatch(key):
            path += "." + key
        else:
            path += "['" + key.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return path


def _money_at(text: str, json_path: str, source: str) -> Micros:
    try:
        return parse_money(text)
    except ValueError as exc:
        raise PriceFileError(str(exc), json_path=json_path, source=source) from None


def _bound(value: int, maximum: int, json_path: str, source: str) -> None:
    if value > maximum:
        raise PriceFileError(
            f"rate {value} micros is above the sanity bound {maximum}; a typo?",
            json_path=json_path,
            source=source,
        )
