"""What one gateway app holds while it runs: config, metrics, live calls, the spend services."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rutster.gateway.call import Call
from rutster.gateway.call_trail import CallTrail
from rutster.gateway.config import GatewayConfig
from rutster.gateway.http_guard import HttpGuardStats
from rutster.gateway.metrics import GatewayMetrics
from rutster.gateway.overload_guard import OverloadGuard, RefusalNotes
from rutster.gateway.stream_claims import StreamClaims
from rutster.protocols.call_control import ProviderCallControl
from rutster.trunk.sip.worker_links import SipCallControl, SipWorkerRegistry

if TYPE_CHECKING:
    from rutster.gateway.api.api_keys import AdminKey, ApiKeyStore
    from rutster.gateway.api.rate_limit import RateLimiter
    from rutster.gateway.control_channel import ControlChannel, ControlHandler
    from rutster.gateway.provider_registry import ProviderRegistry
    from rutster.spend.embedded_redis import EmbeddedRedis
    from rutster.spend.gate import SpendGate
    from rutster.spend.redis_url import RedisClient
    from rutster.spend.store import SpendStore

#: Trails of ended calls kept in memory for inspection. Seed decision: the last
#: few hundred calls; durable receipts are the spend gate's ledger (Redis).
MAX_RECENT_TRAILS = 500

log = logging.getLogger(__name__)


def _default_providers() -> ProviderRegistry:
    # Imported here: the providers' modules import this one (their handlers hold a state).
    from rutster.gateway.providers import REGISTRY

    return REGISTRY


@dataclass
class GatewayState:
    """Shared by every handler of one app (``app.state.gateway``).

    The spend services (Redis client, store, gate, keys, rate limiter) are set
    by the app's startup; they are None only before it ran.
    """

    config: GatewayConfig
    #: The ingress providers served (gateway/providers/__init__.py): routes, dialling.
    providers: ProviderRegistry = field(default_factory=_default_providers)
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    calls: dict[str, Call] = field(default_factory=dict)
    #: The same live calls by public call id (``call_…``), for the API and control messages.
    calls_by_id: dict[str, Call] = field(default_factory=dict)
    #: Twilio REST call control (None without TWILIO_ACCOUNT_SID + auth token).
    twilio_call_control: ProviderCallControl | None = None
    #: What a provider keeps per app (its settings, clients), by provider name: the
    #: registry's provider objects are shared by every app of a process.
    provider_state: dict[str, object] = field(default_factory=dict)
    recent_trails: OrderedDict[str, CallTrail] = field(default_factory=OrderedDict)
    redis: RedisClient | None = None
    embedded_redis: EmbeddedRedis | None = None
    #: Set by gateway.server.uvicorn_config: what the HTTP guard closed, and live counts.
    http_guard: HttpGuardStats | None = None
    spend_store: SpendStore | None = None
    spend_gate: SpendGate | None = None
    api_keys: ApiKeyStore | None = None
    admin_key: AdminKey | None = None
    rate_limiter: RateLimiter | None = None
    control_channel: ControlChannel | None = None
    #: Control operations a provider answers for other nodes, by name (set in its
    #: ``startup``; the hang-up is the app's own).
    control_handlers: dict[str, ControlHandler] = field(default_factory=dict)
    #: What this node tells the others at every beat (the node directory), by name:
    #: a provider registers its own in ``startup`` (SIP: its free worker capacity).
    node_info: dict[str, Callable[[], str]] = field(default_factory=dict)
    #: SIP worker processes connected on ``/sip/workers``, and their calls' call control.
    sip_workers: SipWorkerRegistry = field(default_factory=SipWorkerRegistry)
    sip_call_control: SipCallControl = field(default_factory=SipCallControl)
    #: One-time claims of stream tokens (Redis through ``spend_store``, node-local fallback).
    stream_claims: StreamClaims = field(default_factory=StreamClaims)
    #: Set once a stop was asked for (gateway/drain.py): no admission from then on.
    draining: bool = False
    #: Set while no call is live here (what a drain waits for).
    no_calls: asyncio.Event = field(default_factory=asyncio.Event)
    #: Whether one more call fits on this node (a fixed cap, the loop's measurements).
    overload_guard: OverloadGuard = field(default_factory=OverloadGuard)
    #: Which node refusals reach the dashboard's recent-refusals stream.
    refusal_notes: RefusalNotes = field(default_factory=RefusalNotes)
    #: Admissions asking the spend gate right now (not yet waiting for their media).
    admitting: int = 0
    #: Admissions waiting for their media stream, by call id.
    media_watchers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: Work started without waiting for it (run_in_background), until it finishes.
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def watch_media_connect(self, call_id: str, watcher: Coroutine[Any, Any, None]) -> None:
        """Run ``watcher`` (releases the admission if no stream opens) until the call's
        stream starts here, or it finishes; a strong reference keeps it alive. A new
        watcher replaces the call's old one (a placed call rang, then was answered)."""
        old = self.media_watchers.pop(call_id, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(watcher, name=f"{call_id}:media-connect")
        self.media_watchers[call_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self.media_watchers.get(call_id) is done:
                del self.media_watchers[call_id]

        task.add_done_callback(forget)

    def run_in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Start ``work`` without waiting for it (an API hang-up answers 202 at once).

        A strong reference keeps the task alive until it finishes, and a failure is
        logged rather than lost with the task.
        """
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self.background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s failed: %s", task.get_name(), exc, exc_info=exc)

    def media_connected(self, call_id: str) -> None:
        """The call's stream started in this process: its watcher is not needed."""
        task = self.media_watchers.pop(call_id, None)
        if task is not None:
            task.cancel()

    def stop_watchers(self) -> None:
        """Cancel every media-connect watcher (shutdown)."""
        for task in list(self.media_watchers.values()):
            task.cancel()

    def add_call(self, call: Call) -> None:
        """Register a live call."""
        self.no_calls.clear()
        self.calls[call.session_id] = call
        if call.call_id is not None:
            self.calls_by_id[call.call_id] = call

    def remove_call(self, call: Call) -> None:
        """Forget an ended call, keeping its trail."""
        self.calls.pop(call.session_id, None)
        if call.call_id is not None:
            self.calls_by_id.pop(call.call_id, None)
        if not self.calls:
            self.no_calls.set()
        self.remember_trail(call.trail)

    def remember_trail(self, trail: CallTrail) -> None:
        """Keep an ended call's trail, dropping the oldest beyond the bound."""
        self.recent_trails[trail.session_id] = trail
        while len(self.recent_trails) > MAX_RECENT_TRAILS:
            self.recent_trails.popitem(last=False)
