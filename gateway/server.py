"""Running the app under uvicorn with the gateway's limits."""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette

#: Largest WebSocket message uvicorn will read before closing with 1009. A
#: Twilio media message with the largest payload we accept (64 KiB) is ~88 KiB
#: of base64 JSON; 256 KiB bounds memory per socket with margin.
MAX_WS_MESSAGE_BYTES = 256 * 1024
#: Seconds between uvicorn's WebSocket pings. Twilio keeps its socket busy with
#: media every 20 ms, so pings only matter for dead peers.
WS_PING_INTERVAL_S = 20.0


def uvicorn_config(
    app: Starlette, *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"
) -> uvicorn.Config:
    """The uvicorn configuration ``rutster serve`` and the tests use."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        ws_max_size=MAX_WS_MESSAGE_BYTES,
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_per_message_deflate=False,  # μ-law barely compresses; deflate costs CPU per frame
        lifespan="on",
        access_log=False,
    )
