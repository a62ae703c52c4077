"""The Starlette application: routes, health, metrics, startup warnings, spend services.

At startup the app connects to Redis (``REDIS_URL``), or starts a private
embedded Redis when none is configured, and builds the spend store, gate,
API keys, rate limiter and control channel on it; maintenance tasks replay
the local spend journal and reap calls whose gateway died.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rutster.gateway.api.api_keys import AdminKey, ApiKeyStore
from rutster.gateway.api.rate_limit import RateLimiter
from rutster.gateway.api.routes import api_routes, hang_up_local_call, unrouted
from rutster.gateway.config import GatewayConfig, silero_engine
from rutster.gateway.control_channel import (
    OPERATION_HANGUP,
    ControlChannel,
    ControlOutcome,
    ControlReply,
    ControlRequest,
)
from rutster.gateway.dashboard_feed import dashboard_routes
from rutster.gateway.loop_watch import watch_loop
from rutster.gateway.overload_guard import OverloadGuard
from rutster.gateway.peer_faults import (
    UVICORN_ERROR_LOGGER,
    ClientDisconnectGuard,
    InvalidUtf8LogFilter,
)
from rutster.gateway.provider_registry import ProviderRegistry
from rutster.gateway.state import GatewayState
from rutster.media.vad import preload
from rutster.protocols.tap import SessionEndReason
from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.gate import SpendGate
from rutster.spend.journal import SpendJournal
from rutster.spend.store import SpendStore, StoreUnavailable, redis_client, redis_listener

log = logging.getLogger(__name__)

VERSION = "0.1.0"
#: How long shutdown waits for a cancelled background task before it goes on
#: and closes the Redis clients under it (which ends any read it is stuck in).
#: Seed decision: a task that honours cancellation ends in milliseconds; one did
#: not (the control channel's listener cancelled mid-subscribe, redis-py 8.2),
#: and the gateway then never exited.
TASK_STOP_TIMEOUT_S = 2.0


def startup_warnings(config: GatewayConfig) -> list[str]:
    """What an operator must hear about at startup (insecure or fragile settings)."""
    warnings = []
    if not config.signatures_enforced:
        warnings.append(
            "DEV MODE: TWILIO_AUTH_TOKEN is not set, so X-Twilio-Signature is NOT checked on "
            "/twilio/voice or /twilio/stream. Anyone who can reach this gateway can start calls. "
            "Set TWILIO_AUTH_TOKEN or TWILIO_AUTH_TOKEN_FILE before exposing it."
        )
    if config.stream_secret_generated:
        warnings.append(
            "RUTSTER_STREAM_SECRET is not set: a random per-process secret signs stream tokens, "
            "so a media socket must reach the same process that answered the webhook. Set it "
            "when running several gateway processes."
        )
    if not config.twilio_rest_enabled:
        warnings.append(
            "TWILIO_ACCOUNT_SID is not set: the hangup tool ends calls by closing the media "
            "stream, and the transfer tool is unavailable. Set TWILIO_ACCOUNT_SID (and "
            "TWILIO_AUTH_TOKEN) to act on calls through Twilio's REST API."
        )
    if config.spend.admin_key is None:
        warnings.append(
            "RUTSTER_ADMIN_KEY is not set: nobody can create API keys, change limits or use "
            "the kill switch until it is."
        )
    if config.spend.policy.admit_when_store_down:
        warnings.append(
            "RUTSTER_SPEND_ON_REDIS_DOWN=admit: calls are admitted without budget checks "
            "while Redis is unreachable."
        )
    if not config.public_url.startswith("https://"):
        warnings.append(
            f"RUTSTER_PUBLIC_URL is {config.public_url}: Twilio only connects media streams "
            "over wss://, so this works with the local simulator only."
        )
    return warnings


async def start_spend_services(state: GatewayState) -> list[asyncio.Task[None]]:
    """Connect to (or start) Redis and build the spend services; returns their tasks."""
    settings = state.config.spend
    url = settings.redis_url
    if url is None:
        embedded = EmbeddedRedis(settings.data_dir / "redis", stop_with_parent=True)
        # Spawned on this thread, which lives as long as the process: the server
        # is told to stop when the thread that started it ends (EmbeddedRedis.spawn).
        embedded.spawn()
        await asyncio.to_thread(embedded.wait_ready)
        state.embedded_redis = embedded
        url = embedded.url
        log.info(
            "REDIS_URL is not set: spend, keys and receipts live in an embedded Redis at %s "
            "(data in %s), private to this process; set REDIS_URL to share them between "
            "gateway processes",
            url,
            embedded.data_dir,
        )
    redis = redis_client(url)
    state.redis = redis
    store = SpendStore(
        redis,
        settings.key_prefix,
        retention_s=settings.retention_s,
        ledger_max_entries=settings.ledger_max_entries,
    )
    state.spend_store = store
    journal = SpendJournal(settings.journal_path)
    # The built-in table, completed by the providers' own rates; a price file is the whole table.
    prices = (
        settings.prices
        if settings.prices_from_file
        else settings.prices.with_telephony(state.providers.default_rates())
    )
    gate = SpendGate(store, prices, journal, policy=settings.policy, node=settings.node_id)
    state.spend_gate = gate
    state.metrics.spend_store_errors.set_function(lambda: gate.store_errors)
    state.metrics.orphaned_calls.set_function(lambda: gate.orphans_settled)
    state.api_keys = ApiKeyStore(redis, settings.key_prefix)
    if settings.admin_key is not None:
        state.admin_key = AdminKey(settings.admin_key)
    state.rate_limiter = RateLimiter(
        redis, settings.key_prefix, settings.api_rate_per_s, settings.api_burst
    )
    # A subscriber waits indefinitely for its next message: no read timeout there.
    listener = redis_listener(url)
    channel = ControlChannel(redis, settings.key_prefix, settings.node_id, listener=listener)
    state.control_channel = channel
    pending = len(journal.pending())
    if pending:
        log.warning("spend journal holds %d record(s) not yet in Redis; replaying", pending)
        with contextlib.suppress(StoreUnavailable):
            await gate.replay_journal()

    async def on_control(request: ControlRequest) -> ControlReply:
        if request.operation == OPERATION_HANGUP:
            if request.call_id not in state.calls_by_id:
                return ControlReply(ControlOutcome.NOT_HERE)
            await hang_up_local_call(state, request.call_id)
            return ControlReply(ControlOutcome.DONE)
        handler = state.control_handlers.get(request.operation)
        if handler is None:
            log.warning("control channel: no handler for operation %r", request.operation)
            return ControlReply(ControlOutcome.FAILED, "unknown operation")
        return await handler(request)

    with contextlib.suppress(StoreUnavailable):
        await gate.join_cluster()
    return [
        asyncio.create_task(gate.maintain(), name="spend:maintain"),
        asyncio.create_task(
            gate.keep_node_alive(lambda: {k: f() for k, f in state.node_info.items()}),
            name="spend:node",
        ),
        asyncio.create_task(channel.listen(on_control), name="control:listen"),
    ]


async def stop_spend_services(state: GatewayState, tasks: list[asyncio.Task[None]]) -> None:
    """Stop the tasks, close Redis clients, stop the embedded Redis."""
    for task in tasks:
        task.cancel()
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=TASK_STOP_TIMEOUT_S)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("background task %s failed", task.get_name(), exc_info=task.exception())
        if pending:
            log.warning(
                "shutdown: background task(s) %s did not stop within %.0f s of being "
                "cancelled; closing Redis under them",
                ", ".join(sorted(t.get_name() for t in pending)),
                TASK_STOP_TIMEOUT_S,
            )
    if state.spend_gate is not None and not state.calls:
        # Its calls are over (ended and settled by the lifespan): out of the directory.
        await state.spend_gate.leave_cluster()
    if state.control_channel is not None:
        await state.control_channel.aclose()
    if state.redis is not None:
        await state.redis.aclose()
    if tasks and pending:
        await asyncio.wait(pending, timeout=TASK_STOP_TIMEOUT_S)
    if state.embedded_redis is not None:
        await asyncio.to_thread(state.embedded_redis.stop)


def create_app(
    config: GatewayConfig | None = None, *, providers: ProviderRegistry | None = None
) -> Starlette:
    """Build the gateway app (config from the environment unless given) serving
    ``providers`` (default: every provider of ``gateway/providers/__init__.py``)."""
    state = GatewayState(config=config or GatewayConfig.from_env())
    state.metrics.silero_compiled.set(silero_engine(state.config) == "compiled")
    if providers is not None:
        state.providers = providers
    state.overload_guard = OverloadGuard(
        state.config.max_calls, measured=state.config.overload_guard
    )
    guard = state.overload_guard

    def reading_or_nan(value: float | int | None) -> float:
        return float("nan") if value is None else float(value)

    state.metrics.loop_busy.set_function(lambda: reading_or_nan(guard.reading().busy))
    state.metrics.loop_lag.set_function(lambda: reading_or_nan(guard.reading().lag_p90_s))
    state.metrics.capacity_estimate.set_function(lambda: reading_or_nan(guard.reading().capacity))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for warning in startup_warnings(state.config):
            log.warning("%s", warning)
        # Everything loaded so far lives as long as the process: move it out of the
        # cyclic GC's reach. Measured: without this a full (gen2) collection paused
        # the event loop ~20 ms with 75 calls up, late enough to starve playout.
        config = state.config
        # Load the VAD model now, not inside the first call (~50 ms + the import).
        await asyncio.to_thread(preload, config.vad, config.silero_engine)
        for provider in state.providers:
            await provider.startup(state)
        utf8_filter = InvalidUtf8LogFilter(state.metrics.bad_messages)
        logging.getLogger(UVICORN_ERROR_LOGGER).addFilter(utf8_filter)
        spend_tasks = await start_spend_services(state)
        spend_tasks.append(
            asyncio.create_task(watch_loop(guard, lambda: len(state.calls)), name="loop:watch")
        )
        gc.collect()
        gc.freeze()
        log.info(
            "rutster gateway ready: public URL %s, default brain %s",
            state.config.public_url,
            state.config.tap_url,
        )
        yield
        calls = list(state.calls.values())
        if calls:
            log.info("shutting down: ending %d call(s)", len(calls))
            await asyncio.gather(*(c.end(SessionEndReason.SHUTDOWN) for c in calls))
        for provider in state.providers:
            await provider.shutdown(state)
        state.stop_watchers()
        await stop_spend_services(state, spend_tasks)
        logging.getLogger(UVICORN_ERROR_LOGGER).removeFilter(utf8_filter)

    async def healthz(request: Request) -> Response:
        # 503 while draining: a load balancer's health check takes the node out.
        return JSONResponse(
            {
                "status": "draining" if state.draining else "ok",
                "version": VERSION,
                "active_calls": len(state.calls),
                "sip_workers": len(state.sip_workers),
                "node": state.config.spend.node_id,
                "redis": "embedded" if state.embedded_redis is not None else "external",
                "twilio_signatures": "enforced"
                if state.config.signatures_enforced
                else "disabled (dev mode: TWILIO_AUTH_TOKEN not set)",
            },
            status_code=503 if state.draining else 200,
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            *state.providers.routes(),
            *api_routes(),
            *dashboard_routes(),
        ],
        lifespan=lifespan,
        exception_handlers={404: unrouted, 405: unrouted},
        middleware=[Middleware(ClientDisconnectGuard, bad_messages=state.metrics.bad_messages)],
    )
    app.state.gateway = state
    return app
