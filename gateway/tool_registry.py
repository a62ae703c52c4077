"""The in-core tool registry: the brain proposes, the core disposes (docs/ARCHITECTURE.md).

Every ``function_call`` from a brain comes here. It is answered exactly once,
with one of the tap statuses:

- ``not_implemented``: the name is not in the brain's latest ``tools.update``,
  or the gateway has no implementation for it;
- ``error``: the arguments fail the tool's JSON Schema (the validation
  message says why: ``jsonschema``, not hand checks), the implementation
  failed, or it ran past the timeout;
- ``rejected``: over the per-turn or per-call budget, or refused by policy
  (the implementation says so, e.g. a transfer destination not allowlisted);
- ``ok``: done; a result larger than the cap is cut and marked ``truncated``.

Each answer leaves a content-free :class:`ToolReceipt`: tool name, status, a
stable reason label, duration and the truncated flag, never argument values
or result content.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import best_match as best_validation_error

from rutster.protocols.tap import JSON, FunctionCall, FunctionCallOutput, ToolStatus, ToolsUpdate

log = logging.getLogger(__name__)

#: Tool calls a brain may make between two caller turns. Seed decision: a model
#: that needs more than three actions to answer one utterance is looping.
DEFAULT_CALLS_PER_TURN = 3
#: Tool calls over a whole call. Seed decision: generous for a real conversation,
#: a hard stop for a runaway loop of proposals.
DEFAULT_CALLS_PER_CALL = 20
#: How long one tool may run. Seed decision: a provider REST call answers in well
#: under a second (Twilio's own SDK times out at 30 s, far too long for a caller
#: waiting in silence).
DEFAULT_TOOL_TIMEOUT_MS = 5_000
#: Largest result returned to the brain, as compact JSON. Seed decision: results
#: go back into the model's context, where every byte costs tokens.
DEFAULT_RESULT_MAX_BYTES = 4_096
#: Call ids remembered to enforce one answer per id (bounded for long calls).
MAX_REMEMBERED_CALL_IDS = 256
#: Tools one catalog may hold: OpenAI's limit on a request's ``tools`` ("a max of
#: 128 functions are supported", API reference), which the realtime brain passes
#: on. Later ones are left out, counted as invalid.
MAX_CATALOG_TOOLS = 128
#: Distinct tool schemas whose meta-schema check is remembered, process-wide. The
#: check costs ~2 ms a schema (jsonschema, Draft 2020-12, measured on the 2-core
#: VM): every call of a deployment sends the same catalog, and a brain that
#: resends it on reconnect should not pay again. Seed decision.
SCHEMA_CHECKS_REMEMBERED = 1_024
#: Longest validation message returned to the brain. Seed decision: enough for
#: jsonschema's messages, bounded because they quote the offending value.
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class ToolLimits:
    """Per-call tool budgets (configurable; see ``gateway/config.py``)."""

    calls_per_turn: int = DEFAULT_CALLS_PER_TURN
    calls_per_call: int = DEFAULT_CALLS_PER_CALL
    timeout_ms: int = DEFAULT_TOOL_TIMEOUT_MS
    result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES


@dataclass(frozen=True)
class ToolOutcome:
    """What an implementation returns: a status, a JSON result and a stable reason label."""

    status: ToolStatus
    result: JSON
    reason: str


@dataclass(frozen=True)
class ToolReceipt:
    """The content-free record of one tool call, for the call's event trail."""

    call_id: str
    tool: str
    status: ToolStatus
    reason: str
    duration_ms: int
    truncated: bool

    def as_payload(self) -> dict[str, str | int | bool]:
        """The receipt as a flat, sanitized event payload."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "status": self.status.value,
            "reason": self.reason,
            "duration_ms": self.duration_ms,
            "truncated": self.truncated,
        }


#: A tool implementation: validated arguments in, outcome out.
ToolImplementation = Callable[[dict[str, Any]], Awaitable[ToolOutcome]]


def _skip_pattern(*_: object) -> None:
    """Brain schemas' ``pattern`` keywords are not evaluated (see :data:`BrainSchemaValidator`)."""


#: Validates arguments against a *brain's* schema. A brain is outside the trust
#: boundary and Python's ``re`` backtracks: a hostile ``pattern`` could stall the
#: event loop for every call. So ``pattern`` is skipped here; the gateway's own
#: schema, checked first, bounds every argument (known keys, string lengths).
BrainSchemaValidator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _skip_pattern}
)


def _error(reason: str, message: str) -> ToolOutcome:
    return ToolOutcome(ToolStatus.ERROR, {"error": message[:MAX_ERROR_CHARS]}, reason)


def _validation_message(validator: Any, args: Mapping[str, Any]) -> str | None:
    error = best_validation_error(validator.iter_errors(args))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
    message = error.message
    if len(message) > MAX_ERROR_CHARS // 2:
        # jsonschema quotes the offending value; a long one would bury the reason.
        message = f"value fails {error.validator!r}: {error.validator_value!r}"
    return f"{where}: {message}"


#: Verdicts by the SHA-256 of the schema's canonical JSON (32 bytes an entry: a
#: brain sending large distinct schemas cannot grow this by their size).
_schema_checks: OrderedDict[bytes, bool] = OrderedDict()


def _schema_key(parameters: Mapping[str, Any]) -> bytes:
    text = json.dumps(parameters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).digest()


def schema_is_valid(parameters: Mapping[str, Any]) -> bool:
    """Whether ``parameters`` is a valid JSON Schema (Draft 2020-12), remembered by content."""
    key = _schema_key(parameters)
    known = _schema_checks.get(key)
    if known is not None:
        _schema_checks.move_to_end(key)
        return known
    try:
        Draft202012Validator.check_schema(parameters)
        valid = True
    except SchemaError:
        valid = False
    _schema_checks[key] = valid
    while len(_schema_checks) > SCHEMA_CHECKS_REMEMBERED:
        _schema_checks.popitem(last=False)
    return valid


async def check_schemas_paced(update: ToolsUpdate) -> None:
    """Check every new schema of ``update`` one per event-loop turn (each ~2 ms).

    Unpaced, a catalog of 120 tools held the loop 2.2 s, and every call's audio
    with it (issue 14, finding 1). Paced, another call waits at most one check.
    """
    for tool in update.tools[:MAX_CATALOG_TOOLS]:
        if _schema_key(tool.parameters) not in _schema_checks:
            schema_is_valid(tool.parameters)
            await asyncio.sleep(0)


class ToolRegistry:
    """One call's tool registry: the brain's catalog, the gateway's implementations, budgets.

    ``implementations`` maps tool names to coroutines; each also brings the
    gateway's own schema for its arguments (``own_schemas``), checked in
    addition to the brain's, so a brain cannot widen what the gateway accepts.
    """

    def __init__(
        self,
        implementations: Mapping[str, ToolImplementation],
        *,
        own_schemas: Mapping[str, Mapping[str, Any]],
        limits: ToolLimits = ToolLimits(),
        clock_ms: Callable[[], float] = lambda: time.monotonic() * 1000.0,
    ) -> None:
        self._implementations = dict(implementations)
        self._own = {
            name: Draft202012Validator(dict(schema)) for name, schema in own_schemas.items()
        }
        self.limits = limits
        self._clock_ms = clock_ms
        self._catalog: dict[str, Any] = {}
        self._answered: OrderedDict[str, None] = OrderedDict()
        self.calls_this_turn = 0
        self.calls_total = 0
        self.duplicates_dropped = 0

    @property
    def catalog(self) -> tuple[str, ...]:
        """Names in the brain's latest catalog whose schemas are valid."""
        return tuple(self._catalog)

    def update_catalog(self, update: ToolsUpdate) -> list[str]:
        """Replace the catalog; return the names left out (an invalid JSON Schema, or
        past :data:`MAX_CATALOG_TOOLS`).

        The schema checks are synchronous: call :func:`check_schemas_paced` first
        on the event loop, so each check runs in its own loop turn.
        """
        catalog: dict[str, Any] = {}
        invalid: list[str] = []
        for index, tool in enumerate(update.tools):
            if index >= MAX_CATALOG_TOOLS or not schema_is_valid(tool.parameters):
                invalid.append(tool.name)
                continue
            catalog[tool.name] = BrainSchemaValidator(tool.parameters)
        self._catalog = catalog
        return invalid

    def turn_ended(self) -> None:
        """The caller finished a turn: the per-turn budget starts again."""
        self.calls_this_turn = 0

    def claim(self, call_id: str) -> bool:
        """Reserve ``call_id`` for one answer; False if it was already seen.

        Claimed when the proposal arrives, not when it is answered, so a repeat
        that arrives while the first is still running is caught too.
        """
        if call_id in self._answered:
            return False
        self._answered[call_id] = None
        while len(self._answered) > MAX_REMEMBERED_CALL_IDS:
            self._answered.popitem(last=False)
        return True

    def check(self, call: FunctionCall) -> ToolOutcome | None:
        """The immediate answer for ``call`` if it must not run, else None. No I/O.

        Counts the proposal against the budgets either way: a brain that keeps
        proposing bad calls is looping just the same.
        """
        self.calls_this_turn += 1
        self.calls_total += 1
        name = call.name
        if name not in self._catalog:
            return ToolOutcome(
                ToolStatus.NOT_IMPLEMENTED,
                {"error": f"tool {name[:64]!r} is not in this brain's tool catalog"},
                "not_in_catalog",
            )
        if name not in self._implementations:
            return ToolOutcome(
                ToolStatus.NOT_IMPLEMENTED,
                {"error": f"tool {name!r} is not implemented by this gateway"},
                "no_implementation",
            )
        for validator in (self._own.get(name), self._catalog[name]):
            if validator is None:
                continue
            message = _validation_message(validator, call.args)
            if message is not None:
                return _error("invalid_args", f"invalid arguments for {name}: {message}")
        if self.calls_this_turn > self.limits.calls_per_turn:
            return ToolOutcome(
                ToolStatus.REJECTED,
                {"error": f"more than {self.limits.calls_per_turn} tool calls in one turn"},
                "turn_budget",
            )
        if self.calls_total > self.limits.calls_per_call:
            return ToolOutcome(
                ToolStatus.REJECTED,
                {"error": f"more than {self.limits.calls_per_call} tool calls in this call"},
                "call_budget",
            )
        return None

    async def dispose(self, call: FunctionCall) -> tuple[FunctionCallOutput, ToolReceipt]:
        """Decide, run (under the timeout) and answer one proposal (claim its id first)."""
        started = self._clock_ms()
        outcome = self.check(call)
        if outcome is None:
            implementation = self._implementations[call.name]
            timeout_ms = self.limits.timeout_ms
            try:
                async with asyncio.timeout(timeout_ms / 1000.0):
                    outcome = await implementation(dict(call.args))
            except TimeoutError:
                outcome = _error("timeout", f"tool {call.name} timed out after {timeout_ms} ms")
            except Exception:  # an implementation bug must not take the call down
                log.exception("tool %s failed", call.name)
                outcome = _error("internal_error", f"tool {call.name} failed inside the gateway")
        result, truncated = self._cap(outcome.result)
        receipt = ToolReceipt(
            call_id=call.id,
            tool=call.name[:64],
            status=outcome.status,
            reason=outcome.reason,
            duration_ms=round(self._clock_ms() - started),
            truncated=truncated,
        )
        return FunctionCallOutput(call.id, outcome.status, result), receipt

    def _cap(self, result: JSON) -> tuple[JSON, bool]:
        text = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
        limit = self.limits.result_max_bytes
        if len(text.encode()) <= limit:
            return result, False
        preview = text.encode()[:limit].decode("utf-8", errors="ignore")
        return {"truncated": True, "preview": preview}, True
