"""Running the app under uvicorn with the gateway's limits."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
from types import FrameType

import uvicorn
from starlette.applications import Starlette
from threadpoolctl import threadpool_info, threadpool_limits

from rutster.gateway.drain import drain
from rutster.gateway.http_guard import HttpGuardStats, guarded_http_protocol
from rutster.gateway.state import GatewayState
from rutster.media import compiled, silero_kernel

log = logging.getLogger(__name__)

#: Largest WebSocket message uvicorn will read before closing with 1009. A
#: Twilio media message with the largest payload we accept (64 KiB) is ~88 KiB
#: of base64 JSON; 256 KiB bounds memory per socket with margin.
MAX_WS_MESSAGE_BYTES = 256 * 1024
#: Seconds between uvicorn's WebSocket pings. Twilio keeps its socket busy with
#: media every 20 ms, so pings only matter for dead peers.
WS_PING_INTERVAL_S = 20.0
#: uvicorn's WebSocket implementation. Measured with ``bench/vs_pipecat.py``'s load (25
#: echo calls on one core of the dev VM, two rounds, 2026-12-06): websockets' sans-I/O
#: protocol 3.22-3.51 % of the core per call, every call carried; uvicorn's legacy
#: websockets protocol 3.72-3.74 %, heard lag P99 140-211 ms; wsproto 3.51-3.87 %, one
#: round 23/25 carried. Named, not ``auto``: a uvicorn release may change its pick.
WS_PROTOCOL = "websockets-sansio"
#: Pending-connection backlog of the listening socket: uvicorn's own default
#: (``uvicorn.Config.backlog``), kept when the socket is bound here.
LISTEN_BACKLOG = 2048
#: Open files to allow when the hard limit is unlimited (the kernel's usual
#: nr_open ceiling is 1,048,576; this is enough for thousands of calls).
OPEN_FILES_WHEN_UNLIMITED = 65_536
#: Signals that ask the gateway to stop: a clean stop, exit code 0.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def uvicorn_config(
    app: Starlette, *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"
) -> uvicorn.Config:
    """The uvicorn configuration ``rutster serve`` and the tests use.

    HTTP is uvicorn's httptools protocol with read deadlines and a per-source
    connection cap (gateway/http_guard.py), counted in the app's metrics.
    """
    state: GatewayState = app.state.gateway
    stats = HttpGuardStats(
        on_close=lambda reason: state.metrics.http_connections_closed.labels(reason).inc()
    )
    state.http_guard = stats
    return uvicorn.Config(
        app,
        http=guarded_http_protocol(stats, max_per_source=state.config.http_max_per_source),
        host=host,
        port=port,
        log_level=log_level,
        ws=WS_PROTOCOL,
        ws_max_size=MAX_WS_MESSAGE_BYTES,
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_per_message_deflate=False,  # μ-law barely compresses; deflate costs CPU per frame
        lifespan="on",
        access_log=False,
        backlog=LISTEN_BACKLOG,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a graceful drain on the first SIGTERM (gateway/drain.py):
    the node admits nothing new, its calls run up to ``drain_timeout_s``, then it
    stops. A second SIGTERM, SIGINT, or a drain timeout of 0 stop at once."""

    def __init__(self, config: uvicorn.Config, state: GatewayState, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._state = state
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False
        self._drain: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """Run the server (remembering its loop, where a signal starts the drain)."""
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: drain on the first SIGTERM, else uvicorn's stop."""
        first_term = sig == signal.SIGTERM and not self._drain_requested and not self.should_exit
        if first_term and self._drain_timeout_s > 0 and self._loop is not None:
            self._drain_requested = True
            # A signal handler runs between two bytecodes of the loop's own thread:
            # hand the drain to the loop rather than start it here.
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._drain is None and not self.should_exit:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_stop())

    async def _drain_then_stop(self) -> None:
        try:
            await drain(self._state, self._drain_timeout_s)
        finally:
            self.should_exit = True


def raise_open_file_limit() -> None:
    """Raise the soft limit on open files to the hard limit, and log both.

    Every call holds a few descriptors (the provider socket, the brain socket,
    Redis); a 256 or 1024 soft limit is what many systems start a process
    with, while the hard limit is usually far higher (issue 14, finding 2:
    with 256, 240 held connections reset every honest webhook). The budget:
    about 4 descriptors a call plus the HTTP connections the guard allows
    (gateway/http_guard.py).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WHEN_UNLIMITED)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning(
                "open files: soft limit stays %d (raising it to %d failed: %s)", soft, target, exc
            )
            return
        log.info("open files: soft limit raised from %d to %d (the hard limit)", soft, target)
    else:
        log.info("open files: soft limit %d (the hard limit)", soft)


#: Threads numpy's BLAS may use in the gateway: one. The per-call engine's matrix
#: products are small (a 127-tap filter over a 20 ms frame, a 64-tap echo canceller),
#: where a second thread only adds hand-offs, and OpenBLAS's threads spin-wait on
#: another core after each product, taking it from the brain and the other calls.
#: Measured on the reflex benchmark (python -m bench.reflex --quick, 2-core VM): the
#: engine's CPU per call 1.12 -> 0.98 % with one thread. The gateway runs one process
#: per core.
NUMERIC_THREADS = 1


def limit_numeric_threads() -> None:
    """Keep numpy's BLAS (and any OpenMP pool) to :data:`NUMERIC_THREADS` threads; log it."""
    before = {info["internal_api"]: info["num_threads"] for info in threadpool_info()}
    threadpool_limits(limits=NUMERIC_THREADS)
    if before:
        pools = ", ".join(f"{api} {n}" for api, n in sorted(before.items()))
        log.info("numeric thread pools limited to %d (were: %s)", NUMERIC_THREADS, pools)


def log_compiled_kernels(silero_engine: str | None = None) -> None:
    """Say whether the media path runs its compiled kernels (media/compiled.py).

    Without them (the package was built where no C compiler was found) the echo gate's
    verdicts are the same, the resampler's output within one PCM step, Silero's
    probabilities within ~1e-6, and each call costs more CPU: a warning, so that an
    operator sizing a node knows. ``silero_engine`` is the one the config asks for
    (``RUTSTER_SILERO_ENGINE``; None: the default).
    """
    if compiled.KERNELS is not None and (
        silero_kernel.KERNEL is not None or silero_engine == "onnxruntime"
    ):
        log.info("media kernels: %s", compiled.describe(silero_engine))
    elif compiled.KERNELS is not None:
        log.warning(
            "media kernels: %s: Silero's probabilities the same within ~1e-6, ~50 µs "
            "more CPU a model window while a caller talks",
            compiled.describe(silero_engine),
        )
    else:
        log.warning(
            "media kernels: the compiled kernels were not built (no C compiler when rutster "
            "was installed?); running their numpy twins and Silero in onnxruntime: the same "
            "verdicts, more CPU a call"
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
