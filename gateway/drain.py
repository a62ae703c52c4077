"""Graceful drain: a node asked to stop (SIGTERM) admits nothing new and lets its calls end.

A rolling restart or a scale-down sends SIGTERM to one gateway node. Cutting its
live calls at once would drop callers who did nothing wrong, so the node drains:

1. it stops admitting (every admission path refuses with reason ``draining``,
   ``gateway/admission.py`` ``REASON_DRAINING``;
   ``/healthz`` answers 503 ``draining`` so a load balancer stops sending it work);
2. its live calls go on, until they end by themselves or the drain deadline
   (``RUTSTER_DRAIN_TIMEOUT_S``) passes;
3. at the deadline every call still up ends with ``session_end{reason:
   "shutdown"}`` (its provider leg hung up, settled what it used), and the
   process stops.

A second SIGTERM, or SIGINT, stops at once (the calls still end with
``shutdown``, in the app's lifespan shutdown). Calls admitted but whose media has
not arrived are not waited for: their stream token is good on any node sharing
the stream secret, and their watcher settles them at zero if no node takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from rutster.protocols.tap import SessionEndReason

if TYPE_CHECKING:  # the configuration imports this module's default; the state imports it
    from rutster.gateway.state import GatewayState

log = logging.getLogger(__name__)

#: Default drain deadline, seconds: inside the 30 s a container orchestrator gives a
#: stopping process before SIGKILL (Kubernetes' terminationGracePeriodSeconds
#: default; Docker's stop timeout is 10 s, so set RUTSTER_DRAIN_TIMEOUT_S below it
#: there), leaving 5 s to end the calls still up and close cleanly.
DEFAULT_DRAIN_TIMEOUT_S = 25.0


async def drain(state: GatewayState, timeout_s: float) -> None:
    """Stop admitting, wait up to ``timeout_s`` for the live calls to end, then end the
    rest with ``shutdown``. Returns when no call is left on this node."""
    state.draining = True
    state.metrics.draining.set(1)
    live = len(state.calls)
    log.warning(
        "draining: admitting no new calls; %d live call(s) may run up to %.0f s", live, timeout_s
    )
    if state.calls:
        state.no_calls.clear()  # set again by the last call's removal
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.no_calls.wait(), timeout_s)
    calls = list(state.calls.values())
    if calls:
        log.warning("drain deadline: ending %d call(s) with shutdown", len(calls))
        await asyncio.gather(
            *(call.end(SessionEndReason.SHUTDOWN) for call in calls), return_exceptions=True
        )
        await asyncio.gather(
            *(call.hang_up_provider(reason="shutdown") for call in calls), return_exceptions=True
        )
    else:
        log.info("drained: no call left")
