"""What one media message costs on each WebSocket server path: ``python -m bench.ws_paths``.

With the reflex loop cut out, about 71 % of a call's CPU in the side-by-side benchmark
is its four WebSocket messages a caller frame, each through asyncio, uvicorn or
websockets and Python (docs/BENCHMARKS.md, "What the reflex loop costs this load"). This
measures the provider side's two (one in, one out) on three server paths, with no
gateway code in them:

- ``asgi``: uvicorn as ``rutster serve`` runs it (uvloop, httptools, the
  websockets-sansio WebSocket protocol of ``gateway/server.py`` ``WS_PROTOCOL``, no
  deflate) and a Starlette WebSocket route: the path every provider stream takes;
- ``websockets``: websockets' own asyncio server (uvloop, no compression): one task
  per connection reading from websockets' message queue;
- ``sansio``: an asyncio ``Protocol`` driving websockets' sans-I/O ``ServerProtocol``,
  the handler called from ``data_received``: no task, queue or ASGI message per
  WebSocket message.

Each server runs alone on one core and echoes every text message it gets. The load runs
on the other core: ``--connections`` clients, each sending a Twilio ``media`` message
(20 ms of μ-law, base64 in JSON, as Twilio sends it: docs/PROVIDERS.md §1) every 20 ms
and reading the echoes. After ``WARMUP_S`` the load counts the echoes and the server's CPU
time (user and system, every thread) for ``--seconds``. Printed per path and level: the
server's share of its core, and its **CPU µs per message echoed** (one received and one
sent, the handler's echo included, no JSON or base64 work in it). Each path runs in a
fresh server process, the paths one after the other, ``--rounds`` times in turn; the
figure to read is each path's least over rounds (the run the VM disturbed least).

``--side client`` times the tap's side the same way: the clients' process alone on one
core, the ``sansio`` echo server on the other, and two client paths: websockets' asyncio
client as the tap uses it (``gateway/tap_client.py``: a task reading each connection,
``send`` under its lock) and an asyncio ``Protocol`` over websockets' sans-I/O
``ClientProtocol`` (echoes counted in ``data_received``, sends written at once). The
clients' pacing (a task and a timer per message) is in both figures.

Usage: ``python -m bench.ws_paths [--side server|client] [--connections 20,40]
[--seconds 10] [--rounds 3] [--paths ...]`` (from the checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import cast

import psutil
from websockets.protocol import Protocol

from rutster.gateway.server import MAX_WS_MESSAGE_BYTES
from rutster.tools.launcher import LOOPBACK, free_port

PATHS = ("asgi", "websockets", "sansio")
#: The client paths (``--side client``): websockets' asyncio client, as the tap uses it
#: (gateway/tap_client.py), and an asyncio Protocol over its sans-I/O ClientProtocol.
CLIENT_PATHS = ("websockets", "sansio")
#: Client connections per level: the calls a core carries today, and twice that
#: (docs/BENCHMARKS.md, "rutster and Pipecat, side by side": 20-50 calls).
LEVELS = (20, 40)
#: One media message every 20 ms per connection: Twilio's pace (docs/PROVIDERS.md §1).
FRAME_S = 0.020
#: μ-law bytes in one Twilio media message: 20 ms at 8 kHz.
MULAW_BYTES = 160
#: Counted window and the warm-up before it (s). Seed decision: 10 s holds 10,000-20,000
#: messages at these levels; 2 s lets every connection open and the server settle.
SECONDS = 10.0
WARMUP_S = 2.0
#: Rounds, the paths in turn (seed decision: the least of 3 steadied the VM's spread).
ROUNDS = 3
#: How long a server gets to start listening (s).
START_TIMEOUT_S = 10.0
#: Largest message every path accepts: the gateway's media-socket limit (bytes).
MAX_MESSAGE_BYTES = MAX_WS_MESSAGE_BYTES


def media_message(seq: int) -> str:
    """One Twilio ``media`` message, as Twilio sends it (docs/PROVIDERS.md §1)."""
    payload = base64.b64encode(bytes((seq + i) & 0xFF for i in range(MULAW_BYTES))).decode()
    return json.dumps(
        {
            "event": "media",
            "sequenceNumber": str(seq),
            "media": {
                "track": "inbound",
                "chunk": str(seq),
                "timestamp": str(seq * 20),
                "payload": payload,
            },
            "streamSid": "MZ00000000000000000000000000000000",
        }
    )


def write_out(protocol: Protocol, transport: asyncio.Transport) -> None:
    """Write what a websockets sans-I/O protocol has to send; close on its end of data."""
    for chunk in protocol.data_to_send():
        if chunk:
            transport.write(chunk)
        else:
            transport.close()  # the protocol is done with the connection


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server process, killing it if it does not exit within 5 s."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- the servers (each in its own process) -------------------------------------------


def serve_asgi(port: int) -> None:
    """uvicorn and a Starlette WebSocket route, configured as ``rutster serve`` does."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    from rutster.gateway.server import WS_PROTOCOL

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            return

    app = Starlette(routes=[WebSocketRoute("/ws", echo)])
    config = uvicorn.Config(
        app,
        host=LOOPBACK,
        port=port,
        loop="uvloop",
        http="httptools",
        ws=WS_PROTOCOL,
        ws_max_size=MAX_MESSAGE_BYTES,
        ws_per_message_deflate=False,
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run()


def serve_websockets(port: int) -> None:
    """websockets' asyncio server: a task per connection."""
    import uvloop
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    async def echo(connection: ServerConnection) -> None:
        try:
            async for message in connection:
                await connection.send(message)
        except ConnectionClosed:  # a client that closed while its echo was on the way
            return

    async def main() -> None:
        async with serve(
            echo, LOOPBACK, port, compression=None, max_size=MAX_MESSAGE_BYTES
        ) as server:
            await server.serve_forever()

    uvloop.run(main())


def serve_sansio(port: int) -> None:
    """An asyncio Protocol over websockets' sans-I/O ServerProtocol (handler inline)."""
    import uvloop
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request
    from websockets.protocol import State
    from websockets.server import ServerProtocol

    class EchoProtocol(asyncio.Protocol):
        def __init__(self) -> None:
            self.ws = ServerProtocol(max_size=MAX_MESSAGE_BYTES)
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

        def data_received(self, data: bytes) -> None:
            ws = self.ws
            ws.receive_data(data)
            for event in ws.events_received():
                if isinstance(event, Request):
                    ws.send_response(ws.accept(event))
                elif (
                    isinstance(event, Frame)
                    and event.opcode is Opcode.TEXT
                    and ws.state is State.OPEN
                ):
                    ws.send_text(event.data)  # the clients send whole messages
            self._flush()

        def _flush(self) -> None:
            assert self.transport is not None
            write_out(self.ws, self.transport)

        def eof_received(self) -> bool | None:
            self.ws.receive_eof()
            self._flush()
            return None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(EchoProtocol, LOOPBACK, port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


SERVERS = {"asgi": serve_asgi, "websockets": serve_websockets, "sansio": serve_sansio}


# ---- the load (the parent process, on the other core) ---------------------------------


@dataclass
class Result:
    """One path at one level: what the load counted in the window, and the CPU time of
    the side timed (the server, or with ``--side client`` the clients' process)."""

    path: str
    connections: int
    sent: int
    echoed: int
    cpu_s: float
    system_s: float
    seconds: float

    @property
    def cpu_pct(self) -> float:
        return 100.0 * self.cpu_s / self.seconds

    @property
    def us_per_message(self) -> float:
        return 1e6 * self.cpu_s / self.echoed if self.echoed else float("nan")

    @property
    def system_us_per_message(self) -> float:
        return 1e6 * self.system_s / self.echoed if self.echoed else float("nan")


def server_cpu_s(server: psutil.Process) -> tuple[float, float]:
    """The server's CPU time so far (every thread): user and system, and system alone."""
    times = server.cpu_times()
    return float(times.user + times.system), float(times.system)


def own_cpu_s() -> tuple[float, float]:
    """This process's CPU time so far: user and system, and system alone (getrusage)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


class SansIOClient(asyncio.Protocol):
    """A WebSocket client connection as an asyncio Protocol over websockets' sans-I/O
    ``ClientProtocol``: each echo is counted in ``data_received``, each send written at
    once (no reader task, no send lock)."""

    def __init__(self, uri: str, on_echo: Callable[[], None]) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self.ws = ClientProtocol(parse_uri(uri), max_size=MAX_MESSAGE_BYTES)
        self.on_echo = on_echo
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.ws.send_request(self.ws.connect())
        self._flush()

    def data_received(self, data: bytes) -> None:
        from websockets.frames import Frame, Opcode
        from websockets.http11 import Response

        ws = self.ws
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Response):
                if ws.handshake_exc is None:
                    self.opened.set_result(None)
                else:
                    self.opened.set_exception(ws.handshake_exc)
            elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                self.on_echo()
        self._flush()

    def send(self, text: str) -> None:
        from websockets.protocol import State

        if self.ws.state is State.OPEN:
            self.ws.send_text(text.encode())
            self._flush()

    def close(self) -> None:
        from websockets.protocol import State

        if self.ws.state is State.OPEN:
            self.ws.send_close()
            self._flush()

    def _flush(self) -> None:
        assert self.transport is not None
        write_out(self.ws, self.transport)


async def load(
    port: int,
    connections: int,
    seconds: float,
    cpu: Callable[[], tuple[float, float]],
    warmup_s: float,
    client_path: str = "websockets",
) -> Result:
    """``connections`` clients at Twilio's pace, each on ``client_path``; counts the
    window after the warm-up, and ``cpu()`` over it."""
    from websockets.asyncio.client import ClientConnection, connect

    messages = [media_message(seq) for seq in range(50)]
    counts = {"sent": 0, "echoed": 0}
    counting = False
    stop = asyncio.Event()
    uri = f"ws://{LOOPBACK}:{port}/ws"
    loop = asyncio.get_running_loop()

    def echoed() -> None:
        if counting:
            counts["echoed"] += 1

    async def paced(index: int, send: Callable[[str], Awaitable[None] | None]) -> None:
        # Spread the connections over the 20 ms, as calls' frames are.
        next_at = loop.time() + FRAME_S * index / connections
        seq = 0
        while not stop.is_set():
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            pending = send(messages[seq % len(messages)])
            if pending is not None:
                await pending
            if counting:
                counts["sent"] += 1
            seq += 1
            next_at += FRAME_S

    async def websockets_client(index: int) -> None:
        conn: ClientConnection = await connect(uri, compression=None, max_size=MAX_MESSAGE_BYTES)

        async def read() -> None:
            async for _ in conn:
                echoed()

        reader = asyncio.create_task(read())
        await paced(index, conn.send)
        await conn.close()
        reader.cancel()

    async def sansio_client(index: int) -> None:
        _, client = await loop.create_connection(lambda: SansIOClient(uri, echoed), LOOPBACK, port)
        await client.opened
        await paced(index, client.send)
        client.close()

    client = websockets_client if client_path == "websockets" else sansio_client
    tasks = [asyncio.create_task(client(i)) for i in range(connections)]
    await asyncio.sleep(warmup_s)
    counting = True
    cpu_before, started = cpu(), time.monotonic()
    await asyncio.sleep(seconds)
    counting = False
    cpu_after, ended = cpu(), time.monotonic()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return Result(
        path=client_path,
        connections=connections,
        sent=counts["sent"],
        echoed=counts["echoed"],
        cpu_s=cpu_after[0] - cpu_before[0],
        system_s=cpu_after[1] - cpu_before[1],
        seconds=ended - started,
    )


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before listening")
        with socket.socket() as sock:
            if sock.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the server did not listen on port {port} within {START_TIMEOUT_S} s")


def run_path(
    path: str,
    connections: int,
    seconds: float,
    cores: tuple[int, int],
    warmup_s: float = WARMUP_S,
) -> Result:
    """A fresh server for ``path`` on core ``cores[0]``; the load in this process (main()
    pins it to ``cores[1]``)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.ws_paths", "--serve", path, "--port", str(port)]
    )
    try:
        server = psutil.Process(proc.pid)
        server.cpu_affinity([cores[0]])
        wait_listening(port, proc)
        import uvloop

        result = uvloop.run(
            load(port, connections, seconds, lambda: server_cpu_s(server), warmup_s)
        )
        result.path = path
        return result
    finally:
        stop(proc)


def run_client_path(
    path: str,
    connections: int,
    seconds: float,
    cores: tuple[int, int],
    warmup_s: float = WARMUP_S,
) -> Result:
    """The clients on ``path`` in a process of their own on core ``cores[0]``, measured;
    the leanest echo server (``sansio``) on ``cores[1]``."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.ws_paths", "--serve", "sansio", "--port", str(port)]
    )
    try:
        psutil.Process(server.pid).cpu_affinity([cores[1]])
        wait_listening(port, server)
        clients = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
                "from bench.ws_paths import client_main; client_main(sys.argv[2:])",
                str(cores[0]),
                path,
                str(port),
                str(connections),
                str(seconds),
                str(warmup_s),
            ],
            capture_output=True,
            text=True,
            timeout=warmup_s + seconds + START_TIMEOUT_S + 30,
            check=False,
        )
        if clients.returncode != 0:
            raise RuntimeError(f"the {path} clients failed: {clients.stderr.strip()[-400:]}")
        return Result(**json.loads(clients.stdout.strip().splitlines()[-1]))
    finally:
        stop(server)


def client_main(argv: list[str]) -> None:
    """The measured clients' process (``run_client_path``): prints its Result as JSON."""
    import uvloop

    path, port, connections, seconds, warmup_s = argv
    result = uvloop.run(
        load(int(port), int(connections), float(seconds), own_cpu_s, float(warmup_s), path)
    )
    print(json.dumps(asdict(result)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", default=",".join(map(str, LEVELS)))
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--side",
        choices=("server", "client"),
        default="server",
        help="time the server paths (the provider's socket) or the client paths (the tap's)",
    )
    parser.add_argument("--paths", default=None, help="comma-separated (default: the side's all)")
    parser.add_argument("--serve", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        SERVERS[args.serve](args.port)
        return
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        sys.exit(
            "bench.ws_paths needs two cores: the side timed on one, the other side on the other"
        )
    cores = (available[0], available[1])
    os.sched_setaffinity(0, {cores[1]})
    side_paths = PATHS if args.side == "server" else CLIENT_PATHS
    levels = [int(n) for n in args.connections.split(",")]
    paths = side_paths if args.paths is None else tuple(p for p in args.paths.split(",") if p)
    for path in paths:
        if path not in side_paths:
            sys.exit(f"unknown {args.side} path {path!r}; choose from {', '.join(side_paths)}")
    timed = "server" if args.side == "server" else "clients"
    other = "load" if args.side == "server" else "sansio echo server"
    print(
        f"{timed} on core [{cores[0]}], {other} on [{cores[1]}]; each connection sends a Twilio "
        f"media message every {FRAME_S * 1000:.0f} ms and reads its echo; counted for "
        f"{args.seconds:g} s after {WARMUP_S:g} s; {args.rounds} rounds, the paths in turn"
    )
    print(
        f"{'path':<11} {'conns':>5} {'round':>5} {'sent':>7} {'echoed':>7} {timed + ' CPU':>11} "
        f"{'µs/message':>10} {'in kernel':>9}"
    )
    run = run_path if args.side == "server" else run_client_path
    best: dict[tuple[str, int], float] = {}
    for round_no in range(1, args.rounds + 1):
        for connections in levels:
            for path in paths:
                r = run(path, connections, args.seconds, cores)
                print(
                    f"{path:<11} {r.connections:>5} {round_no:>5} {r.sent:>7} {r.echoed:>7} "
                    f"{r.cpu_pct:>10.1f}% {r.us_per_message:>10.1f} "
                    f"{r.system_us_per_message:>9.1f}",
                    flush=True,
                )
                key = (path, connections)
                best[key] = min(best.get(key, float("inf")), r.us_per_message)
    owner = "server's" if args.side == "server" else "clients'"
    print(f"least over rounds, the {owner} CPU µs per message echoed (one sent, one received):")
    for connections in levels:
        cells = ", ".join(f"{path} {best[(path, connections)]:.1f}" for path in paths)
        print(f"  {connections} connections: {cells}")


if __name__ == "__main__":
    main()
