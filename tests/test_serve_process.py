"""``rutster serve`` as a process: a port in use, SIGTERM, and a gateway killed outright.

Issue 14, finding 11: on a port already in use the gateway logged the error,
then waited for its application shutdown for ever, ignored SIGTERM, and after
SIGKILL left its embedded ``redis-server`` running; a clean SIGTERM stop
exited -15.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import psutil
import pytest

from rutster.gateway.state import GatewayState
from rutster.tools.launcher import LOOPBACK, Service, free_port, gateway_process

#: How long a refused start may take: the interpreter, the imports, the bind.
REFUSED_START_S = 15.0
#: How long a started gateway may take to answer /healthz.
READY_S = 20.0
#: How long a stop may take after SIGTERM (ending no calls, closing Redis).
STOP_S = 10.0
#: How long the embedded Redis may outlive a gateway killed with SIGKILL.
ORPHAN_GRACE_S = 5.0


def serve_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rutster.tools.cli",
        "serve",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
    ]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_in_use_exits_at_once_with_the_reason(busy_port: int, tmp_path: Path) -> None:
    env = {**os.environ, "RUTSTER_DATA_DIR": str(tmp_path)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            serve_command(busy_port), env=env, capture_output=True, timeout=REFUSED_START_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"rutster serve on a port in use did not exit: {exc.stderr!r}")
    elapsed = time.monotonic() - started
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode not in (0, -signal.SIGTERM), stderr
    assert f"{LOOPBACK}:{busy_port}" in stderr and "in use" in stderr, stderr
    # Refused before anything started: no embedded Redis was ever run.
    assert not (tmp_path / "redis").exists(), stderr
    assert elapsed < REFUSED_START_S


def embedded_redis(gateway: Service) -> list[psutil.Process]:
    """The gateway's redis-server child, once it runs and answers.

    The listening socket is bound before the app starts: wait for /healthz.
    """
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://{LOOPBACK}:{gateway.port}/healthz", timeout=1.0).is_success:
                break
        time.sleep(0.05)
    children = psutil.Process(gateway.proc.pid).children(recursive=True)
    return [p for p in children if "redis" in p.name()]


def still_running(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``timeout_s``.

    A zombie has exited: an orphan's exit status waits for an init that, in a
    container, may never collect it.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.mark.parametrize("settle_s", [0.0, 1.0])
def test_sigterm_stops_the_gateway_and_its_redis_with_exit_0(settle_s: float) -> None:
    # 0 s: the stop comes while the control channel's listener is still subscribing
    # (the shutdown used to wait on it for ever).
    with gateway_process({}) as gateway:
        redis = embedded_redis(gateway)
        assert redis, "the gateway runs an embedded Redis by default"
        time.sleep(settle_s)
        gateway.proc.send_signal(signal.SIGTERM)
        try:
            code = gateway.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the gateway did not stop on SIGTERM")
        assert code == 0
        assert not still_running(redis, 1.0)


def test_the_embedded_redis_does_not_outlive_a_killed_gateway() -> None:
    port = free_port()
    with gateway_process({}, port) as gateway:
        redis = embedded_redis(gateway)
        assert redis
        gateway.proc.kill()
        gateway.proc.wait()
        alive = still_running(redis, ORPHAN_GRACE_S)
        for proc in alive:
            proc.kill()
        assert not alive, "the embedded redis-server outlived its gateway"


async def test_shutdown_goes_on_past_a_task_that_ignores_its_cancellation() -> None:
    from rutster.gateway.app import TASK_STOP_TIMEOUT_S, stop_spend_services

    release = asyncio.Event()

    async def stubborn() -> None:
        # What the control listener did inside redis-py 8.2: the cancel was swallowed.
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    state = SimpleNamespace(
        control_channel=None, redis=None, embedded_redis=None, spend_gate=None, calls={}
    )
    started = time.monotonic()
    try:
        await asyncio.wait_for(
            stop_spend_services(cast(GatewayState, state), [task]), 3 * TASK_STOP_TIMEOUT_S + 1
        )
        assert time.monotonic() - started < 3 * TASK_STOP_TIMEOUT_S
    finally:
        # Whatever happened, let the stubborn task end: the test's loop waits for it.
        release.set()
        await task
