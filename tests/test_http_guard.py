"""HTTP read deadlines and the per-source cap (issue 14, finding 2: slowloris)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
import websockets

from rutster.gateway.app import create_app
from rutster.gateway.http_guard import HttpGuardStats, guarded_http_protocol
from rutster.gateway.server import uvicorn_config
from rutster.gateway.state import GatewayState
from rutster.tools.launcher import LOOPBACK, free_port
from tests.conftest import eventually, gateway_config

#: Short deadlines so the test does not wait the production 10 s.
DEADLINE_S = 0.3
CAP = 5


@dataclass
class Guarded:
    port: int
    stats: HttpGuardStats
    state: GatewayState

    def metric(self, reason: str) -> float:
        value = self.state.metrics.registry.get_sample_value(
            "rutster_http_connections_closed_total", {"reason": reason}
        )
        return 0.0 if value is None else value


@contextlib.asynccontextmanager
async def guarded_gateway() -> AsyncIterator[Guarded]:
    port = free_port()
    app = create_app(gateway_config("ws://127.0.0.1:9/unused"))
    config = uvicorn_config(app, host=LOOPBACK, port=port, log_level="warning")
    assert getattr(config.http, "__name__", "") == "GuardedHttpToolsProtocol"  # as served
    stats = app.state.gateway.http_guard
    assert stats is not None
    config.http = guarded_http_protocol(
        stats, header_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S, max_per_source=CAP
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started, 10)
    try:
        yield Guarded(port, stats, app.state.gateway)
    finally:
        server.should_exit = True
        await task


async def closed_by_peer(reader: asyncio.StreamReader, within_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within_s) == b""
    except TimeoutError:
        return False


async def healthz(port: int) -> bytes:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_slow_and_silent_clients_are_cut_at_the_deadlines() -> None:
    async with guarded_gateway() as gw:
        silent = await asyncio.open_connection(LOOPBACK, gw.port)
        slow = await asyncio.open_connection(LOOPBACK, gw.port)
        slow[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        body = await asyncio.open_connection(LOOPBACK, gw.port)
        body[1].write(
            b"POST /twilio/voice HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nCall"
        )
        results = await asyncio.gather(
            *(closed_by_peer(r, 10 * DEADLINE_S) for r, _ in (silent, slow, body))
        )
        for _, writer in (silent, slow, body):
            writer.close()
        assert all(results), results
        assert gw.stats.closed["header_timeout"] == 2
        assert gw.stats.closed["body_timeout"] == 1
        assert (gw.metric("header_timeout"), gw.metric("body_timeout")) == (2, 1)
        # Honest requests, and a kept-alive connection's later requests, are served.
        assert (await healthz(gw.port)).startswith(b"HTTP/1.1 200")
        reader, writer = await asyncio.open_connection(LOOPBACK, gw.port)
        for _ in range(3):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(reader.readuntil(b"}"), 5)).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(DEADLINE_S / 2)
        writer.close()


async def test_one_source_cannot_hold_more_than_its_cap() -> None:
    async with guarded_gateway() as gw:
        url = f"ws://{LOOPBACK}:{gw.port}/twilio/stream"
        # Upgraded WebSockets leave the HTTP phase: they do not count.
        sockets = [await websockets.connect(url) for _ in range(CAP + 2)]
        held = [await asyncio.open_connection(LOOPBACK, gw.port) for _ in range(CAP)]
        await eventually(lambda: gw.stats.open_by_source[LOOPBACK] == CAP)
        reader, refused = await asyncio.open_connection(LOOPBACK, gw.port)
        assert await closed_by_peer(reader, 1.0)
        refused.close()
        assert gw.stats.closed["too_many_from_source"] == 1
        for _, writer in held:
            writer.close()
        await eventually(lambda: gw.stats.open_by_source[LOOPBACK] == 0)
        assert (await healthz(gw.port)).startswith(b"HTTP/1.1 200")
        for ws in sockets:
            await ws.close()
        assert gw.metric("too_many_from_source") == 1


def test_serve_raises_its_open_file_limit_and_says_so() -> None:
    script = (
        "import logging, resource\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from gateway.server import raise_open_file_limit\n"
        "raise_open_file_limit()\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True", done.stderr
    assert "open files" in done.stderr and "256" in done.stderr, done.stderr
