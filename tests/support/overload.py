"""A gateway that measured its loop saturated, for the tests of what an overloaded node
answers on each admission path."""

from __future__ import annotations

import time
from typing import Any

from rutster.gateway.overload_guard import SAMPLE_INTERVAL_S, WINDOW_S, LoopSample, OverloadGuard
from rutster.gateway.state import GatewayState

#: The live calls the stand-in window says were up (above MIN_CALLS_MEASURED).
STAND_IN_CALLS = 30


def saturated_guard() -> OverloadGuard:
    """A guard whose window says its loop ran at 95 % of its core with 30 calls up."""
    guard = OverloadGuard()
    now = time.monotonic()
    steps = round(WINDOW_S / SAMPLE_INTERVAL_S)
    for i in range(steps + 1):
        at = now - (steps - i) * SAMPLE_INTERVAL_S
        guard.on_sample(LoopSample(at, 0.95 * i * SAMPLE_INTERVAL_S, 0.002, STAND_IN_CALLS))
    return guard


def overload(state: GatewayState) -> None:
    """Make ``state``'s node overloaded: a saturated guard and stand-in live calls (the
    measured rules apply only with enough calls up). Undo with :func:`relieve`."""
    state.overload_guard = saturated_guard()
    stand_ins: dict[str, Any] = {f"stand-in-{i}": object() for i in range(STAND_IN_CALLS)}
    state.calls.update(stand_ins)


def relieve(state: GatewayState) -> None:
    """Take the stand-in calls away again (before the app shuts down and ends its calls)."""
    for key in [k for k in state.calls if k.startswith("stand-in-")]:
        del state.calls[key]
