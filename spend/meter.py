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
4. at hang-up :meth:`~CallMeter.stop`, then settle :meth:`~CallMeter.settlement`
   (and record :meth:`~CallMeter.over_reservation`, if any).

Cost = telephony for the elapsed time (whole billing increments, rounded up)
+ brain tokens (cumulative per model, one ceil). Budget checks look
``hangup_guard_ms`` ahead for telephony, so the call is hung up before it
starts a billing increment it cannot pay for, not after; spending exactly the
cap or the reservation is allowed (a cap of one increment pays for all of it).

A brain's counts are its own word, so they are bounded twice. Each report is
clamped to the :class:`UsageCeiling` (the most tokens the call time carried so
far can plausibly have used); the clamped part is still billed, the rest is
returned as an ``over_ceiling`` :class:`UsageAnomaly`. And the settlement is
never more than the reservation (itself never more than the call's max cost):
cost above it is an ``over_reservation`` anomaly. No count raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

from rutster.spend.money import MAX_MICROS, Micros
from rutster.spend.prices import (
    GPT_REALTIME_RATES,
    MAX_TOKEN_COUNT,
    TOKENS_PER_RATE_UNIT,
    PriceTable,
    TelephonyRate,
    TokenTotals,
    UsageReport,
)

__all__ = [
    "ANOMALY_OVER_CEILING",
    "ANOMALY_OVER_RESERVATION",
    "CEILING_INPUT_TOKENS_PER_S",
    "CEILING_OUTPUT_MARGIN",
    "CEILING_OUTPUT_TOKENS_PER_S",
    "CEILING_RESPONSES_PER_S",
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
    "REALTIME_CONTEXT_WINDOW_TOKENS",
    "REALTIME_INPUT_AUDIO_TOKENS_PER_S",
    "REALTIME_MAX_OUTPUT_TOKENS",
    "REALTIME_OUTPUT_AUDIO_TOKENS_PER_S",
    "AnomalyKind",
    "CallCaps",
    "CallMeter",
    "Continue",
    "End",
    "EndReason",
    "Extend",
    "MeterDecision",
    "MeterSnapshot",
    "QuantumPolicy",
    "UsageAnomaly",
    "UsageCeiling",
]

#: Input audio tokens per second of caller audio: OpenAI's realtime models count
#: 1 token per 100 ms of user audio (developers.openai.com/api/docs/guides/realtime-costs).
REALTIME_INPUT_AUDIO_TOKENS_PER_S = 10
#: Output audio tokens per second of assistant audio: 1 token per 50 ms
#: (developers.openai.com/api/docs/guides/realtime-costs).
REALTIME_OUTPUT_AUDIO_TOKENS_PER_S = 20
#: Input audio tokens per minute of caller audio: 10/s x 60 (issue-5 design derivation).
EXPECTED_INPUT_AUDIO_TOKENS_PER_MINUTE = REALTIME_INPUT_AUDIO_TOKENS_PER_S * 60
#: Output audio tokens per minute of call: 20/s x 60 = 1200/min of assistant audio,
#: with the assistant speaking half the minute (issue-5 design): 600.
EXPECTED_OUTPUT_AUDIO_TOKENS_PER_MINUTE = REALTIME_OUTPUT_AUDIO_TOKENS_PER_S * 60 // 2
#: Expected brain spend per minute of call, at gpt-realtime's audio rates:
#: 600 x $32/1M (19_200 micros) + 600 x $64/1M (38_400) = 57_600 micros. Only
#: sizes the reservation quanta: the meter charges what the brain reports (up to the
#: usage ceiling below).
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

# --- The usage ceiling (derivation in docs/SPEND.md, "Implausible usage") ------------------
#: gpt-realtime's context window: 32,000 tokens
#: (developers.openai.com/api/docs/models/compare?model=gpt-realtime, read 2026-12;
#: gpt-realtime-mini's is the same; gpt-realtime-2 has 128,000: see docs/SPEND.md). Every
#: response re-bills the conversation so far as input tokens
#: (developers.openai.com/api/docs/guides/realtime-costs), so one response's input (text +
#: audio, cached included) is at most this.
REALTIME_CONTEXT_WINDOW_TOKENS = 32_000
#: gpt-realtime's most output tokens per response: 4,096
#: (developers.openai.com/api/docs/models/compare?model=gpt-realtime, read 2026-12); a
#: session's
#: ``max_output_tokens`` can only lower it.
REALTIME_MAX_OUTPUT_TOKENS = 4_096
#: Full-context responses per second of call the input ceiling allows (seed decision): 1.
#: A response follows a caller turn (at least 0.7 s each: 200 ms of speech and 500 ms of
#: silence, media/endpointing.py) or a tool result (at most 3 a turn, 20 a call,
#: gateway/tool_registry.py); a phone call takes a turn every few seconds, so a whole
#: context re-billed every second of the call is several times any real pace.
CEILING_RESPONSES_PER_S = 1
#: Margin on the assistant's audio rate for the output ceiling (seed decision): 4x covers
#: the transcript's text tokens (~3/s at 150 words a minute) and audio generated faster
#: than it plays then cut by a barge-in (billed, never heard), with room to spare.
CEILING_OUTPUT_MARGIN = 4
#: Input tokens a second of call may add to the ceiling: 32,000 x 1 = 32,000.
CEILING_INPUT_TOKENS_PER_S = REALTIME_CONTEXT_WINDOW_TOKENS * CEILING_RESPONSES_PER_S
#: Output tokens a second of call may add to the ceiling: 20 x 4 = 80.
CEILING_OUTPUT_TOKENS_PER_S = REALTIME_OUTPUT_AUDIO_TOKENS_PER_S * CEILING_OUTPUT_MARGIN

END_MAX_DURATION: Final = "max_duration"
END_BUDGET_EXHAUSTED: Final = "budget_exhausted"
EndReason: TypeAlias = Literal["max_duration", "budget_exhausted"]

ANOMALY_OVER_CEILING: Final = "over_ceiling"
ANOMALY_OVER_RESERVATION: Final = "over_reservation"
AnomalyKind: TypeAlias = Literal["over_ceiling", "over_reservation"]

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
class UsageCeiling:
    """The most brain tokens a call can plausibly have used after ``elapsed_ms`` of call time.

    Cumulative over the call and all its models, input and output apart: one
    response's worth at any time (``*_burst``: its usage may be reported before the
    call time that pays for it, at 0 s or after the hang-up), plus a rate per second
    of call carried. The defaults are derived in docs/SPEND.md ("Implausible usage").
    """

    input_burst: int = REALTIME_CONTEXT_WINDOW_TOKENS
    input_per_s: int = CEILING_INPUT_TOKENS_PER_S
    output_burst: int = REALTIME_MAX_OUTPUT_TOKENS
    output_per_s: int = CEILING_OUTPUT_TOKENS_PER_S

    def __post_init__(self) -> None:
        for name in ("input_burst", "input_per_s", "output_burst", "output_per_s"):
            _check_int(name, getattr(self, name))

    def input_tokens(self, elapsed_ms: int) -> int:
        """Input tokens (text + audio, cached included) allowed after ``elapsed_ms``."""
        return _allowance(self.input_burst, self.input_per_s, elapsed_ms)

    def output_tokens(self, elapsed_ms: int) -> int:
        """Output tokens (text + audio) allowed after ``elapsed_ms``."""
        return _allowance(self.output_burst, self.output_per_s, elapsed_ms)


def _allowance(burst: int, per_s: int, elapsed_ms: int) -> int:
    """``burst + per_s x elapsed`` (ceil), within what a TokenTotals holds."""
    grown = -(-(per_s * max(0, elapsed_ms)) // _MS_PER_S)
    return min(burst + grown, MAX_TOKEN_COUNT)


@dataclass(frozen=True, slots=True)
class UsageAnomaly:
    """Usage the meter did not bill as reported: content-free (kind, counts, micros).

    ``over_ceiling``: one report above the :class:`UsageCeiling`; ``reported`` is what
    it said (counts saturated at ``MAX_TOKEN_COUNT``), ``allowed`` what was billed.
    ``over_reservation``: at settlement, the metered ``cost`` above ``reserved``, which
    is what is settled. ``excess_micros`` is the cost left unbilled, at most
    ``MAX_MICROS`` (a 64-bit Redis integer; a saturated report's is above it).
    """

    kind: AnomalyKind
    elapsed_ms: int
    excess_micros: Micros
    reported: TokenTotals = field(default_factory=TokenTotals)
    allowed: TokenTotals = field(default_factory=TokenTotals)
    cost: Micros = 0
    reserved: Micros = 0

    def payload(self) -> dict[str, int | str]:
        """The receipt's fields (flat ints and the kind; never a model name or content)."""
        fields: dict[str, int | str] = {"kind": self.kind, "elapsed_ms": self.elapsed_ms}
        if self.kind == ANOMALY_OVER_CEILING:
            reported, allowed = self.reported, self.allowed
            fields.update(
                reported_input_tokens=reported.input_tokens,
                allowed_input_tokens=allowed.input_tokens,
                excess_input_tokens=reported.input_tokens - allowed.input_tokens,
                reported_output_tokens=reported.output_tokens,
                allowed_output_tokens=allowed.output_tokens,
                excess_output_tokens=reported.output_tokens - allowed.output_tokens,
            )
        else:
            fields.update(cost=self.cost, reserved=self.reserved)
        fields["excess_micros"] = self.excess_micros
        return fields


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
    backwards), so cost is monotone. ``usage_ceiling`` bounds what brain reports
    can bill (default :class:`UsageCeiling`). Counters: ``malformed_usage``
    (reports of more cached than input tokens, billed as if the input were that
    large), ``clamped_usage`` and ``clamped_micros`` (reports over the ceiling, and
    the cost they were not billed).
    """

    __slots__ = (
        "_brain_cost",
        "_brain_costs",
        "_end",
        "_input_used",
        "_last_ms",
        "_output_used",
        "_pending",
        "_prices",
        "_rate",
        "_refused",
        "_reserved",
        "_stopped_ms",
        "_tokens",
        "caps",
        "clamped_micros",
        "clamped_usage",
        "direction",
        "first_quantum",
        "low_water",
        "malformed_usage",
        "policy",
        "provider",
        "quantum",
        "started_ms",
        "usage_ceiling",
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
        usage_ceiling: UsageCeiling | None = None,
    ) -> None:
        self.policy = quantum if quantum is not None else QuantumPolicy()
        self.usage_ceiling = usage_ceiling if usage_ceiling is not None else UsageCeiling()
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
        self.clamped_usage = 0
        self.clamped_micros: Micros = 0
        # Tokens billed so far, all models: what the ceiling is counted against.
        self._input_used = 0
        self._output_used = 0
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

    def on_usage(self, model: str | None, tokens: TokenTotals, now_ms: int) -> UsageAnomaly | None:
        """Add one usage report (a delta) of ``model``; ``None`` = model not reported.

        The report is billed up to the :class:`UsageCeiling` at the call time carried
        so far; the anomaly returned (else None) says what was not billed.
        """
        if not isinstance(tokens, TokenTotals):
            raise TypeError(f"tokens must be TokenTotals, not {type(tokens).__name__}")
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a str or None, not {type(model).__name__}")
        now = self._advance(now_ms)
        if tokens.cached_exceeds_input:
            self.malformed_usage += 1
            tokens = tokens.with_cached_within_input()
        key = model
        if key not in self._tokens and len(self._tokens) >= MAX_MODELS_PER_CALL:
            key = None  # billed at the "*" rates: never less than any known model
        anomaly = None
        elapsed = self._elapsed(now)
        allowed = self._within_ceiling(key, tokens, elapsed)
        if allowed != tokens:
            excess = _minus(tokens, allowed)
            micros = min(self._prices.brain_cost(key, excess), MAX_MICROS)
            self.clamped_usage += 1
            self.clamped_micros = min(self.clamped_micros + micros, MAX_MICROS)
            anomaly = UsageAnomaly(
                ANOMALY_OVER_CEILING, elapsed, micros, reported=tokens, allowed=allowed
            )
        self._input_used += allowed.input_tokens
        self._output_used += allowed.output_tokens
        totals = self._tokens.get(key, TokenTotals()) + allowed
        self._tokens[key] = totals
        cost = self._prices.brain_cost(key, totals)
        self._brain_cost += cost - self._brain_costs.get(key, 0)
        self._brain_costs[key] = cost
        return anomaly

    def on_tap_usage(self, usage: UsageReport, now_ms: int) -> UsageAnomaly | None:
        """Add a tap ``usage`` event (absent counts are 0; none raises: see on_usage)."""
        return self.on_usage(usage.model, TokenTotals.saturated_from_usage(usage), now_ms)

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
        # Spending exactly the cap (or the reservation) is allowed: a cap of one billing
        # increment pays for that whole increment. projected >= cost, so it alone decides.
        if projected > max_cost:
            return self._finish(END_BUDGET_EXHAUSTED)
        room = max_cost - self._reserved
        can_extend = not self._refused and room > 0
        if not can_extend:
            if projected > self._reserved:
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
        """What to settle at ``now_ms``: the cost, but never more than the reservation.

        The reservation is never more than the call's max cost, so neither is this;
        cost above it is reported by :meth:`over_reservation`.
        """
        return min(self.cost_ms(now_ms), self._reserved)

    def over_reservation(self, now_ms: int) -> UsageAnomaly | None:
        """The ``over_reservation`` anomaly of settling at ``now_ms``, or None if the cost fits.

        Cost passes the reservation when usage is reported after the last tick (a
        ``response.done`` after the hang-up) or the hang-up lands later than the guard.
        """
        cost = self.cost_ms(now_ms)
        if cost <= self._reserved:
            return None
        return UsageAnomaly(
            ANOMALY_OVER_RESERVATION,
            self.elapsed_ms(now_ms),
            min(cost - self._reserved, MAX_MICROS),
            cost=cost,
            reserved=self._reserved,
        )

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

    def _within_ceiling(self, key: str | None, tokens: TokenTotals, elapsed: int) -> TokenTotals:
        """``tokens`` cut down to what the ceiling still allows after ``elapsed`` ms.

        Within each of input and output, the dearer class (at ``key``'s rates) is kept
        first, so a clamped report bills the most its own counts allow.
        """
        ceiling = self.usage_ceiling
        room_in = max(0, ceiling.input_tokens(elapsed) - self._input_used)
        room_out = max(0, ceiling.output_tokens(elapsed) - self._output_used)
        if tokens.input_tokens <= room_in and tokens.output_tokens <= room_out:
            return tokens
        rates = self._prices.brain_rates(key)
        if rates.audio_in >= rates.text_in:
            in_audio, in_text = _fill(room_in, tokens.input_audio, tokens.input_text)
        else:
            in_text, in_audio = _fill(room_in, tokens.input_text, tokens.input_audio)
        if rates.audio_out >= rates.text_out:
            out_audio, out_text = _fill(room_out, tokens.output_audio, tokens.output_text)
        else:
            out_text, out_audio = _fill(room_out, tokens.output_text, tokens.output_audio)
        return TokenTotals(
            input_audio=in_audio,
            input_text=in_text,
            cached_input=min(tokens.cached_input, in_audio + in_text),  # cached ⊆ input
            output_audio=out_audio,
            output_text=out_text,
        )

    def _finish(self, reason: EndReason) -> End:
        self._end = End(reason)
        self._pending = False
        return self._end


def _fill(room: int, first: int, second: int) -> tuple[int, int]:
    """Up to ``room`` tokens, ``first`` taken before ``second``."""
    kept = min(first, room)
    return kept, min(second, room - kept)


def _minus(reported: TokenTotals, allowed: TokenTotals) -> TokenTotals:
    """What a clamp left out (each count of ``allowed`` is at most ``reported``'s)."""
    return TokenTotals(
        input_audio=reported.input_audio - allowed.input_audio,
        input_text=reported.input_text - allowed.input_text,
        cached_input=reported.cached_input - allowed.cached_input,
        output_audio=reported.output_audio - allowed.output_audio,
        output_text=reported.output_text - allowed.output_text,
    )
