"""The Starlette application: routes, health, metrics, startup warnings."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from brains.tap import SessionEndReason
from gateway.config import GatewayConfig
from gateway.state import GatewayState
from media.vad import preload
from trunk.twilio.call_control import TwilioCallControl
from trunk.twilio.routes import twilio_stream, twilio_voice

log = logging.getLogger(__name__)

VERSION = "0.1.0"


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
    if not config.public_url.startswith("https://"):
        warnings.append(
            f"RUTSTER_PUBLIC_URL is {config.public_url}: Twilio only connects media streams "
            "over wss://, so this works with the local simulator only."
        )
    return warnings


def create_app(config: GatewayConfig | None = None) -> Starlette:
    """Build the gateway app (config from the environment unless given)."""
    state = GatewayState(config=config or GatewayConfig.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for warning in startup_warnings(state.config):
            log.warning("%s", warning)
        # Everything loaded so far lives as long as the process: move it out of the
        # cyclic GC's reach. Measured: without this a full (gen2) collection paused
        # the event loop ~20 ms with 75 calls up, late enough to starve playout.
        config = state.config
        # Load the VAD model now, not inside the first call (~50 ms + the import).
        await asyncio.to_thread(preload, config.vad)
        control = None
        if config.twilio_account_sid is not None and config.twilio_auth_token is not None:
            control = TwilioCallControl(
                account_sid=config.twilio_account_sid,
                auth_token=config.twilio_auth_token,
                base_url=config.twilio_api_base_url,
            )
            state.twilio_call_control = control
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
        if control is not None:
            await control.aclose()

    async def healthz(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "version": VERSION,
                "active_calls": len(state.calls),
                "twilio_signatures": "enforced"
                if state.config.signatures_enforced
                else "disabled (dev mode: TWILIO_AUTH_TOKEN not set)",
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/twilio/voice", twilio_voice, methods=["GET", "POST"]),
            WebSocketRoute("/twilio/stream", twilio_stream),
        ],
        lifespan=lifespan,
    )
    app.state.gateway = state
    return app
