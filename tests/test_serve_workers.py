"""``rutster serve --workers 2``: two gateway processes on one port, one Redis, one secret.

The supervisor binds the port, starts one embedded Redis for both workers and hands
them one stream secret, so a call's webhook and its media socket may reach different
workers. A worker killed outright is started again; SIGTERM stops everything with
exit 0 and takes the embedded Redis down with it.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import tempfile
import time

import httpx
import psutil

from rutster.brains.echo import EchoBrain
from rutster.tools.launcher import LOOPBACK, free_port, spawn
from rutster.tools.twilio_simulator import TwilioSimulator
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo

#: Fresh connections to /healthz until both workers have answered.
MAX_PROBES = 400


async def nodes_answering(url: str, wanted: set[str]) -> set[str]:
    seen: set[str] = set()
    for _ in range(MAX_PROBES):
        # A new connection each time: the kernel hands it to one of the workers.
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            seen.add((await http.get("/healthz")).json()["node"])
        if wanted <= seen:
            break
    return seen


def gateway_workers(supervisor_pid: int) -> list[psutil.Process]:
    """The supervisor's live ``serve`` children (a killed one not yet reaped is left out)."""
    found = []
    for child in psutil.Process(supervisor_pid).children():
        try:
            if "serve" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:  # gone, or a zombie, between the listing and the look
            continue
    return found


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex((LOOPBACK, port)) == 0


@realtime_echo
async def test_two_workers_share_the_port_the_redis_and_the_calls(
    echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    with tempfile.TemporaryDirectory(prefix="rutster-workers-") as data_dir:
        env = {
            "RUTSTER_PUBLIC_URL": url,
            "RUTSTER_DATA_DIR": data_dir,
            "RUTSTER_TAP_URL": echo_brain.url,
            "RUTSTER_NODE_ID": "host1",
            "RUTSTER_DRAIN_TIMEOUT_S": "2",
        }
        supervisor = spawn(
            ["serve", "--workers", "2", "--host", LOOPBACK, "--port", str(port)],
            port=port,
            env=env,
            health_path="/healthz",
        )
        redis_ports: set[int] = set()
        try:
            workers = {"host1-w0", "host1-w1"}
            assert await nodes_answering(url, workers) == workers
            async with httpx.AsyncClient(base_url=url, timeout=5) as http:
                health = (await http.get("/healthz")).json()
            assert health["redis"] == "external"  # the supervisor's one embedded Redis
            redis_ports = {
                c.laddr.port
                for p in psutil.Process(supervisor.proc.pid).children()
                if p.name().startswith("redis")
                for c in p.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN
            }
            assert len(redis_ports) == 1
            # Calls, whichever worker takes the webhook and whichever the media.
            sent = speech_pcm[: 3 * 8000 * 2]
            results = await asyncio.gather(
                *(TwilioSimulator(url).place_call(sent, tail_s=1.0) for _ in range(4))
            )
            for result in results:
                assert_echo_intact(sent, result)
            # A worker killed outright is started again.
            gateways = [
                p for p in psutil.Process(supervisor.proc.pid).children() if "serve" in p.cmdline()
            ]
            assert len(gateways) == 2
            gateways[0].kill()
            deadline = time.monotonic() + 20
            while True:
                alive = gateway_workers(supervisor.proc.pid)
                if len(alive) == 2 and gateways[0].pid not in {p.pid for p in alive}:
                    break
                assert time.monotonic() < deadline, "the killed worker was not started again"
                await asyncio.sleep(0.2)
            assert await nodes_answering(url, workers) == workers
        finally:
            supervisor.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(supervisor.proc.wait, 20)
        assert code == 0
        assert not port_open(port)
        assert not any(port_open(p) for p in redis_ports)
