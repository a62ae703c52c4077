"""Per-call spend meter: running cost, reservation quanta, and when to hang up. Sans-I/O.

One :class:`CallMeter` per call. Time is passed in (integer ms, any origin
shared with ``started_ms``); the meter reads no clock and does no I/O. The
gate drives it:

1. construct it (an unknown provider/direction raises :class:`UnknownPrice`),
   reserve :attr:`CallMeter.first_quantum` at admission, then
   :meth:`~CallMeter.on_reserved` with the store's confirmed total;
2. feed every tap ``usage`` to :meth:`~CallMeter.on_usage` (or
   :meth:`~CallMeter.on_tap_usage`);
3. on every tick call :meth:`~CallMeter.decide`: ``Continue``; ``Extend(amount)``
   — reserve ``amount`` more, then report :meth:`~CallMeter.on_reserved`,
   :meth:`~CallMeter.on_extension_refused` (the budget said no) or
   :meth:`~CallMeter.on_extension_failed` (the store could not be asked; a later
   tick asks again); or ``End(reason)`` — hang up (sticky);
4. at hang-up :meth:`~CallMeter.stop`, then settle :meth:`~CallMeter.settlement`.

Cost = telephony for the elapsed time (whole billing increments, rounded up)
+ brain tokens (cumulative per model, one ceil). Budget checks look
``hangup_guard_ms`` ahead for telephony, so the call is hung up before it
starts a billing increment it cannot pay for, not after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

from brains.tap import Usage
from spend.money import Micros
from spend.prices import (
    GPT_REALTIME_RATES,
    TOKENS_PER_RATE_UNIT,
    PriceTable,
    TelephonyRate,
    TokenTotals,
)

__all__ = [
    "CONTINUE",
    "DEFAULT_HANGUP_GUARD_MS",
    "DEFAULT_LOW_WATER_FRACTION",
    "DEFAULT_QUANTUM_TELEPHONY_S",
    "END_BUDGET_EXHAUSTED",
    "END_MAX_DURATION",
    "EXPECTED_BRAIN_MICROS_PER_MINUTE",
    "EXPECTED_INPUT_AUDIO_TOKENS_PER_MINUTE",
    "EXPECTED_OUTPUT_AUDIO_TOKENS_PER_MINUTE",
    "MAX_MODELS_PER_CALL",
    "CallCaps",
    "CallMeter",
    "Continue",
    "End",
    "EndReason",
    "Extend",
    "MeterDecision",
    "MeterSnapshot",
    "QuantumPolicy",
]

#: Input audio tokens per minute of caller audio: OpenAI's realtime models count
#: about 1 token per 100 ms of input audio (issue-5 design derivation).
EXPECTED_INPUT_AUDIO_TOKENS_PER_MINUTE = 600
#: Output audio tokens per minute of call: about 1 token per 50 ms of assistant
#: audio (1200/min), with the assistant speaking half the minute (issue-5 design).
EXPECTED_OUTPUT_AUDIO_TOKENS_PER_MINUTE = 600
#: Expected brain spend per minute of call, at gpt-realtime's audio rates:
#: 600 x $32/1M (19_200 micros) + 600 x $64/1M (38_400) = 57_600 micros. Only
#: sizes the reservation quanta: the meter charges what the brain reports.
EXPECTED_BRAIN_MICROS_PER_MINUTE = -(
    -(
        EXPECTED_INPUT_AUDIO_TOKENS_PER_MINUTE * GPT_REALTIME_RATES.audio_in
        + EXPECTED_OUTPUT_AUDIO_TOKENS_PER_MINUTE * GPT_REALTIME_RATES.audio_out
    )
    // TOKENS_PER_RATE_UNIT
)
#: Call time covered by one reservation quantum (issue-5 design: one minute).
DEFAULT_QUANTUM_TELEPHONY_S = 60
#: Ask for the next quantum when less than this share of one is left unspent
#: (issue-5 design: 25 %).
DEFAULT_LOW_WATER_FRACTION = Fraction(1, 4)
#: How far ahead budget checks look at telephony (seed decision): one 1 s gate
#: tick plus ~1 s for the provider to act on a hang-up request.
DEFAULT_HANGUP_GUARD_MS = 2_000
#: Distinct brain model names tracked per call (seed decision: a call has one or
#: two); reports naming further models are billed at the "*" rates.
MAX_MODELS_PER_CALL = 8

END_MAX_DURATION: Final = "max_duration"
END_BUDGET_EXHAUSTED: Final = "budget_exhausted"
EndReason: TypeAlias = Literal["max_duration", "budget_exhausted"]

_MS_PER_S = 1_000
_S_PER_MINUTE = 60


def _check_int(name: str, value: object, *, minimum: int | None = 0) -> int:
    """``value`` as an int, refusing floats and bools (money and ms are exact)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Continue:
    """Keep going; nothing to do."""


@dataclass(frozen=True, slots=True)
class Extend:
    """Reserve ``amount`` more micros for this call, then report the outcome to the meter."""

    amount: Micros


@dataclass(frozen=True, slots=True)
class End:
    """Hang up now, for ``reason``; once returned, :meth:`CallMeter.decide` keeps returning it."""

    reason: EndReason


MeterDecision: TypeAlias = Continue | Extend | End
#: The one ``Continue`` instance the meter returns.
CONTINUE: Final = Continue()


@dataclass(frozen=True, slots=True)
class CallCaps:
    """The call's effective caps (already the minimum of request, tenant and global caps)."""

    max_duration_s: int
    max_cost_micros: Micros

    def __post_init__(self) -> None:
        _check_int("max_duration_s", self.max_duration_s, minimum=1)
        _check_int("max_cost_micros", self.max_cost_micros)


@dataclass(frozen=True, slots=True)
class QuantumPolicy:
    """How much to reserve at a time, and when to ask for more.

    A quantum is the telephony cost of ``telephony_s`` plus the expected brain
    spend over the same time; the next one is asked for when less than
    ``low_water_fraction`` of a quantum is left.
    """

    telephony_s: int = DEFAULT_QUANTUM_TELEPHONY_S
    brain_micros_per_minute: Micros = EXPECTED_BRAIN_MICROS_PER_MINUTE
    low_water_fraction: Fraction = DEFAULT_LOW_WATER_FRACTION
    hangup_guard_ms: int = DEFAULT_HANGUP_GUARD_MS

    def __post_init__(self) -> None:
        _check_int("telephony_s", self.telephony_s, minimum=1)
        _check_int("brain_micros_per_minute", self.brain_micros_per_minute)
        _check_int("hangup_guard_ms", self.hangup_guard_ms)
        if not isinstance(self.low_water_fraction, Fraction):
            raise TypeError("low_water_fraction must be a fractions.Fraction (exact)")
        if not 0 < self.low_water_fraction <= 1:
            raise ValueError(f"low_water_fraction must be in (0, 1], got {self.low_water_fraction}")

    def quantum_micros(self, rate: TelephonyRate) -> Micros:
        """One quantum at ``rate``: telephony for ``telephony_s`` + expected brain spend."""
        telephony = rate.cost(self.telephony_s * _MS_PER_S)
        brain = -(-(self.brain_micros_per_minute * self.telephony_s) // _S_PER_MINUTE)
        return telephony + brain

    def low_water_micros(self, quantum: Micros) -> Micros:
        """Unspent reservation below which the next quantum is asked for (ceil)."""
        scaled = quantum * self.low_water_fraction
        return -(-scaled.numerator // scaled.denominator)


@dataclass(frozen=True, slots=True)
class MeterSnapshot:
    """A call's meter at one instant (receipts, dashboard); all amounts in micros."""

    elapsed_ms: int
    cost: Micros
    reserved: Micros
    telephony_cost: Micros
    brain_cost: Micros


class CallMeter:
    """Running cost and reservation decisions for one call (see the module docstring).

    ``started_ms`` is when telephony billing starts (the answer). Times earlier
    than the latest seen are read as the latest (the meter never runs
    backwards), so cost is monotone. Counters: ``malformed_usage`` (reports of
    more cached than input tokens, billed as if the input were that large).
    """

    __slots__ = (
        "_brain_cost",
        "_brain_costs",
        "_end",
        "_last_ms",
        "_pending",
        "_prices",
        "_rate",
        "_refused",
        "_reserved",
        "_stopped_ms",
        "_tokens",
        "caps",
        "direction",
        "first_quantum",
        "low_water",
        "malformed_usage",
        "policy",
        "provider",
        "quantum",
        "started_ms",
    )

    def __init__(
        self,
        prices: PriceTable,
        *,
        provider: str,
        direction: str,
        started_ms: int,
        caps: CallCaps,
        quantum: QuantumPolicy | None = None,
    ) -> None:
        self.policy = quantum if quantum is not None else QuantumPolicy()
        self._prices = prices
        # Both lookups fail here, before the call is admitted, not mid-call.
        self._rate = prices.telephony_rate(provider, direction)
        prices.brain_rates(None)
        self.provider = provider
        self.direction = direction
        self.started_ms = _check_int("started_ms", started_ms, minimum=None)
        self.caps = caps
        #: A full reservation quantum (micros).
        self.quantum: Micros = self.policy.quantum_micros(self._rate)
        #: What admission reserves: one quantum, capped by the call's max cost.
        self.first_quantum: Micros = min(self.quantum, caps.max_cost_micros)
        #: Unspent reservation below which the meter asks for more.
        self.low_water: Micros = self.policy.low_water_micros(self.quantum)
        self.malformed_usage = 0
        self._last_ms = self.started_ms
        self._stopped_ms: int | None = None
        self._reserved: Micros = 0
        self._pending = False
        self._refused = False
        self._end: End | None = None
        self._tokens: dict[str | None, TokenTotals] = {}
        self._brain_costs: dict[str | None, Micros] = {}
        self._brain_cost: Micros = 0

    # --- inputs -------------------------------------------------------------------------

    def on_usage(self, model: str | None, tokens: TokenTotals, now_ms: int) -> None:
        """Add one usage report (a delta) of ``model``; ``None`` = model not reported."""
        if not isinstance(tokens, TokenTotals):
            raise TypeError(f"tokens must be TokenTotals, not {type(tokens).__name__}")
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a str or None, not {type(model).__name__}")
        self._advance(now_ms)
        if tokens.cached_exceeds_input:
            self.malformed_usage += 1
            tokens = tokens.with_cached_within_input()
        key = model
        if key not in self._tokens and len(self._tokens) >= MAX_MODELS_PER_CALL:
            key = None  # billed at the "*" rates: never less than any known model
        totals = self._tokens.get(key, TokenTotals()) + tokens
        self._tokens[key] = totals
        cost = self._prices.brain_cost(key, totals)
        self._brain_cost += cost - self._brain_costs.get(key, 0)
        self._brain_costs[key] = cost

    def on_tap_usage(self, usage: Usage, now_ms: int) -> None:
        """Add a tap ``usage`` event (absent counts are 0)."""
        self.on_usage(usage.model, TokenTotals.from_usage(usage), now_ms)

    def on_reserved(self, total_reserved: Micros) -> None:
        """The store confirmed ``total_reserved`` (cumulative) for this call.

        A stale (smaller) total is ignored; a total above the call's max cost is
        a bug in the caller and raises ``ValueError``.
        """
        _check_int("total_reserved", total_reserved)
        if total_reserved > self.caps.max_cost_micros:
            raise ValueError(
                f"reserved total {total_reserved} exceeds the call's max cost "
                f"{self.caps.max_cost_micros}"
            )
        self._reserved = max(self._reserved, total_reserved)
        self._pending = False

    def on_extension_refused(self) -> None:
        """The store refused an extension (budget): no more are asked for this call."""
        self._refused = True
        self._pending = False

    def on_extension_failed(self) -> None:
        """An extension could not be asked (store unreachable); a later decide may ask again."""
        self._pending = False

    def stop(self, now_ms: int) -> None:
        """The call ended at ``now_ms``: telephony stops counting (the first stop wins)."""
        now = self._advance(now_ms)
        if self._stopped_ms is None:
            self._stopped_ms = now

    # --- outputs ------------------------------------------------------------------------

    def decide(self, now_ms: int) -> MeterDecision:
        """What the gate should do now (see the module docstring)."""
        now = self._advance(now_ms)
        if self._end is not None:
            return self._end
        if self._stopped_ms is not None:
            return CONTINUE  # the call is over; nothing left to reserve or end
        elapsed = self._elapsed(now)
        max_duration_ms = self.caps.max_duration_s * _MS_PER_S
        if elapsed >= max_duration_ms:
            return self._finish(END_MAX_DURATION)
        cost = self._rate.cost(elapsed) + self._brain_cost
        # Telephony a guard ahead: the hang-up lands up to that much later (also when the
        # duration cap ends the call, so the guard is not capped at max duration).
        projected = self._rate.cost(elapsed + self.policy.hangup_guard_ms) + self._brain_cost
        max_cost = self.caps.max_cost_micros
        if cost >= max_cost or projected > max_cost:
            return self._finish(END_BUDGET_EXHAUSTED)
        room = max_cost - self._reserved
        can_extend = not self._refused and room > 0
        if not can_extend:
            if cost >= self._reserved or projected > self._reserved:
                return self._finish(END_BUDGET_EXHAUSTED)
            return CONTINUE
        if self._pending:
            return CONTINUE  # the last Extend is still in flight
        if cost >= self._reserved or projected > self._reserved - self.low_water:
            # A full quantum of headroom again, plus whatever is already overrun.
            amount = min(self.quantum + max(0, projected - self._reserved), room)
            if amount > 0:
                self._pending = True
                return Extend(amount)
        return CONTINUE

    def elapsed_ms(self, now_ms: int) -> int:
        """Billable call time at ``now_ms`` (frozen at :meth:`stop`)."""
        return self._elapsed(self._advance(now_ms))

    def telephony_cost(self, now_ms: int) -> Micros:
        """Telephony cost so far."""
        return self._rate.cost(self.elapsed_ms(now_ms))

    @property
    def brain_cost(self) -> Micros:
        """Brain cost so far (cumulative tokens per model, one ceil each)."""
        return self._brain_cost

    def cost_ms(self, now_ms: int) -> Micros:
        """Total cost so far at ``now_ms``: telephony by elapsed time + brain."""
        return self.telephony_cost(now_ms) + self._brain_cost

    def settlement(self, now_ms: int) -> Micros:
        """The actual cost to settle at ``now_ms`` (the cost at that time)."""
        return self.cost_ms(now_ms)

    def snapshot(self, now_ms: int) -> MeterSnapshot:
        """The meter's numbers at ``now_ms``."""
        elapsed = self.elapsed_ms(now_ms)
        telephony = self._rate.cost(elapsed)
        return MeterSnapshot(
            elapsed_ms=elapsed,
            cost=telephony + self._brain_cost,
            reserved=self._reserved,
            telephony_cost=telephony,
            brain_cost=self._brain_cost,
        )

    @property
    def reserved(self) -> Micros:
        """Total reserved for this call, as last confirmed by the store."""
        return self._reserved

    @property
    def ended(self) -> End | None:
        """The sticky ``End`` decision, if one was made."""
        return self._end

    @property
    def extension_pending(self) -> bool:
        """An ``Extend`` was returned and its outcome not yet reported."""
        return self._pending

    @property
    def extension_refused(self) -> bool:
        """The store refused an extension; the call lives on what it has."""
        return self._refused

    @property
    def stopped_ms(self) -> int | None:
        """When :meth:`stop` was called, if it was."""
        return self._stopped_ms

    @property
    def tokens(self) -> Mapping[str | None, TokenTotals]:
        """Cumulative tokens per reported model (``None``: unreported or over the cap)."""
        return MappingProxyType(dict(self._tokens))

    # --- internals ----------------------------------------------------------------------

    def _advance(self, now_ms: int) -> int:
        now = _check_int("now_ms", now_ms, minimum=None)
        if now > self._last_ms:
            self._last_ms = now
        return self._last_ms

    def _elapsed(self, now: int) -> int:
        end = now if self._stopped_ms is None else min(now, self._stopped_ms)
        return max(0, end - self.started_ms)

    def _finish(self, reason: EndReason) -> End:
        self._end = End(reason)
        self._pending = False
        return self._end
