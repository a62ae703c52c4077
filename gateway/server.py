"""Running the app under uvicorn with the gateway's limits."""

from __future__ import annotations

import signal
import socket
from types import FrameType

import uvicorn
from starlette.applications import Starlette

#: Largest WebSocket message uvicorn will read before closing with 1009. A
#: Twilio media message with the largest payload we accept (64 KiB) is ~88 KiB
#: of base64 JSON; 256 KiB bounds memory per socket with margin.
MAX_WS_MESSAGE_BYTES = 256 * 1024
#: Seconds between uvicorn's WebSocket pings. Twilio keeps its socket busy with
#: media every 20 ms, so pings only matter for dead peers.
WS_PING_INTERVAL_S = 20.0
#: Pending-connection backlog of the listening socket: uvicorn's own default
#: (``uvicorn.Config.backlog``), kept when the socket is bound here.
LISTEN_BACKLOG = 2048
#: Signals that ask the gateway to stop: a clean stop, exit code 0.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
        backlog=LISTEN_BACKLOG,
    )


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port``, bound before anything else starts.

    Raises ``OSError`` (a port in use: ``EADDRINUSE``). uvicorn binds only after
    the app's startup, so a port in use was found after the embedded Redis and
    the background tasks were running, and its shutdown path then waited on
    them; bound first, the gateway refuses to start before it has started anything.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)


def serve(server: uvicorn.Server, sock: socket.socket) -> int:
    """Run ``server`` on ``sock`` until it stops; 0 when it stopped on a stop signal.

    uvicorn handles SIGTERM and SIGINT itself (a graceful shutdown), then
    raises the signal again once it is done so that the default action ends the
    process (exit -15). Handlers installed here receive that second signal
    instead, so a requested stop that went well exits 0. A failed startup
    still exits non-zero (uvicorn's ``SystemExit``).
    """
    stops: list[int] = []

    def stopped(signum: int, frame: FrameType | None) -> None:
        stops.append(signum)

    previous = {signum: signal.signal(signum, stopped) for signum in STOP_SIGNALS}
    try:
        server.run(sockets=[sock])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sock.close()
    return 0
