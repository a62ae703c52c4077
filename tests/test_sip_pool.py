"""The SIP worker pool supervisor (trunk/sip/pool.py), with tiny Python UDP children."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rutster.trunk.sip.pool import (
    MAX_WORKERS,
    PoolConfigError,
    RestartPolicy,
    SipWorkerPool,
    WorkerStatus,
    worker_ports,
)

REPO = Path(__file__).resolve().parent.parent

#: A worker stand-in: answers every UDP datagram on its port with "<pid> <tag> <payload>".
#: With "ignore-term" it ignores SIGTERM (a worker stuck in shutdown).
ECHO_CHILD = """
import os, signal, socket, sys
port = int(sys.argv[1])
if "ignore-term" in sys.argv[2:]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", port))
tag = os.environ.get("POOL_TEST_TAG", "-")
while True:
    data, addr = sock.recvfrom(2048)
    sock.sendto(f"{os.getpid()} {tag} ".encode() + data, addr)
"""

#: A worker that crashes at once, logging each start time to argv[1].
CRASH_CHILD = """
import sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{time.monotonic()}\\n")
sys.exit(3)
"""

#: Runs a pool in its own process (so real signals reach it) and prints the worker pids.
POOL_MAIN = """
import asyncio, json, sys
from rutster.trunk.sip.pool import SipWorkerPool

async def main() -> None:
    child, base = sys.argv[1], int(sys.argv[2])
    pool = SipWorkerPool(
        workers=3, base_port=base, command_for=lambda i, p: [sys.executable, child, str(p)]
    )
    task = asyncio.create_task(pool.run())
    while not all(s.alive for s in pool.status()):
        await asyncio.sleep(0.02)
    print(json.dumps([s.pid for s in pool.status()]), flush=True)
    rc = await task
    print(json.dumps({"rc": rc, "codes": [s.last_exit_code for s in pool.status()]}), flush=True)

asyncio.run(main())
"""


def consecutive_free_udp_ports(count: int) -> int:
    """A base port such that ``count`` consecutive loopback UDP ports are free right now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise RuntimeError("no free run of UDP ports found")


def udp_ask(port: int, timeout_s: float = 5.0) -> tuple[int, str]:
    """(pid, tag) of the echo child on ``port``, retrying until it answers."""
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.1)
        while time.monotonic() < deadline:
            sock.sendto(b"ping", ("127.0.0.1", port))
            try:
                data, _ = sock.recvfrom(2048)
            except (TimeoutError, ConnectionRefusedError):
                continue
            pid, tag, payload = data.decode().split(" ", 2)
            assert payload == "ping"
            return int(pid), tag
    raise TimeoutError(f"nothing answered on UDP port {port}")


async def wait_until(pred: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``pred`` until true, or fail the test."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def echo_command(child: Path, *extra: str) -> Callable[[int, int], list[str]]:
    """A ``command_for`` factory running the echo child on the worker's port."""
    return lambda index, port: [sys.executable, str(child), str(port), *extra]


@pytest.fixture
def echo_child(tmp_path: Path) -> Path:
    path = tmp_path / "echo_child.py"
    path.write_text(ECHO_CHILD)
    return path


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- sans-I/O parts ---------------------------------------------------------------------------


def test_worker_ports_are_consecutive() -> None:
    assert worker_ports(5070, 3) == [5070, 5071, 5072]
    assert worker_ports(65535, 1) == [65535]


@pytest.mark.parametrize(
    ("base", "workers", "needle"),
    [
        (5070, 0, "workers must be"),
        (5070, MAX_WORKERS + 1, "workers must be"),
        (0, 1, "base port"),
        (70000, 1, "base port"),
        (65534, 3, "65536"),
    ],
)
def test_worker_ports_rejects_impossible_layouts(base: int, workers: int, needle: str) -> None:
    with pytest.raises(PoolConfigError, match=needle):
        worker_ports(base, workers)


def test_restart_policy_backs_off_up_to_the_cap() -> None:
    policy = RestartPolicy(delays=(0.5, 1.0, 2.0), stable_after_s=10.0)
    now = 100.0
    delays = []
    for _ in range(5):
        policy.on_start(now)
        now += 0.1  # quick crash
        delays.append(policy.on_exit(now))
        now += delays[-1]
    assert delays == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert policy.consecutive_failures == 5


def test_restart_policy_resets_after_a_stable_run() -> None:
    policy = RestartPolicy(delays=(0.5, 1.0, 2.0), stable_after_s=10.0)
    policy.on_start(0.0)
    assert policy.on_exit(1.0) == 0.5
    policy.on_start(1.5)
    assert policy.on_exit(2.0) == 1.0
    policy.on_start(3.0)
    assert policy.on_exit(13.0) == 0.5  # ran 10 s: healthy, the walk starts over
    assert policy.consecutive_failures == 1


def test_restart_policy_failed_spawns_keep_backing_off() -> None:
    policy = RestartPolicy(delays=(0.5, 1.0, 2.0), stable_after_s=10.0)
    policy.on_start(0.0)
    assert policy.on_exit(1.0) == 0.5
    # Spawn failures (exit without start), even far apart, never count as healthy runs.
    assert policy.on_exit(100.0) == 1.0
    assert policy.on_exit(200.0) == 2.0


@pytest.mark.parametrize("delays", [(), (0.5, 0.0), (-1.0,)])
def test_restart_policy_rejects_delays_that_would_spin(delays: tuple[float, ...]) -> None:
    with pytest.raises(PoolConfigError):
        RestartPolicy(delays=delays)


def test_pool_rejects_negative_grace() -> None:
    with pytest.raises(PoolConfigError, match="stop_grace_s"):
        SipWorkerPool(workers=1, base_port=5070, command_for=lambda i, p: ["x"], stop_grace_s=-1)


# --- real processes ---------------------------------------------------------------------------


async def test_workers_come_up_on_consecutive_ports(echo_child: Path) -> None:
    base = consecutive_free_udp_ports(3)
    pool = SipWorkerPool(
        workers=3,
        base_port=base,
        command_for=echo_command(echo_child),
        env_for=lambda index, port: {"POOL_TEST_TAG": f"w{index}p{port}"},
    )
    async with pool:
        assert pool.ports == [base, base + 1, base + 2]
        for st in pool.status():
            pid, tag = await asyncio.to_thread(udp_ask, st.port)
            assert st.alive
            assert pid == st.pid
            assert tag == f"w{st.index}p{base + st.index}"
            assert st.restarts == 0
            assert st.last_exit_code is None
    assert all(not s.alive for s in pool.status())


async def test_killed_worker_restarts_on_same_port_others_untouched(echo_child: Path) -> None:
    base = consecutive_free_udp_ports(3)
    pool = SipWorkerPool(
        workers=3, base_port=base, command_for=echo_command(echo_child), restart_delays=(0.1,)
    )
    async with pool:
        for st in pool.status():
            await asyncio.to_thread(udp_ask, st.port)
        before = pool.status()
        victim = before[1]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)

        def restarted() -> bool:
            now = pool.status()[1]
            return now.restarts == 1 and now.alive and now.pid != victim.pid

        await wait_until(restarted)
        after = pool.status()
        new_pid, _ = await asyncio.to_thread(udp_ask, base + 1)
        assert new_pid == after[1].pid != victim.pid
        assert after[1].port == victim.port
        assert after[1].last_exit_code == -signal.SIGKILL
        for i in (0, 2):
            assert after[i].pid == before[i].pid
            assert after[i].restarts == 0
            assert (await asyncio.to_thread(udp_ask, base + i))[0] == before[i].pid
    assert pid_gone(after[1].pid or 0)


async def test_crash_looping_worker_backs_off(tmp_path: Path) -> None:
    child = tmp_path / "crash_child.py"
    child.write_text(CRASH_CHILD)
    starts_log = tmp_path / "starts.log"
    delays = (0.05, 0.1, 0.2, 0.4, 0.8)
    pool = SipWorkerPool(
        workers=1,
        base_port=5070,  # never bound: the child crashes first
        command_for=lambda i, p: [sys.executable, str(child), str(starts_log)],
        restart_delays=delays,
    )
    async with pool:
        await asyncio.sleep(1.6)
        st: WorkerStatus = pool.status()[0]
    starts = [float(line) for line in starts_log.read_text().split()]
    # 0.05 + 0.1 + 0.2 + 0.4 = 0.75 s of waiting for 5 starts; the next wait is 0.8 s, so at
    # most 6 starts fit in 1.6 s, at least 4 even with slow (0.4 s) interpreter starts. A spinning
    # loop would do hundreds.
    assert 4 <= len(starts) <= 6, starts
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for gap, delay in zip(gaps, delays, strict=False):
        assert gap >= delay  # each wait at least its (growing) backoff step
    assert st.last_exit_code == 3
    assert st.restarts in (len(starts) - 1, len(starts))  # one may be scheduled, not yet run


async def test_missing_executable_is_counted_and_retried(tmp_path: Path) -> None:
    pool = SipWorkerPool(
        workers=2,
        base_port=5070,
        command_for=lambda i, p: [str(tmp_path / "no-such-binary"), str(p)],
        restart_delays=(0.05, 0.1),
    )
    async with pool:
        await wait_until(lambda: all(s.spawn_failures >= 2 for s in pool.status()))
        for st in pool.status():
            assert st.pid is None
            assert not st.alive
            assert st.restarts >= 1


async def test_broken_command_factory_fails_fast() -> None:
    pool = SipWorkerPool(workers=2, base_port=5070, command_for=lambda i, p: [])
    with pytest.raises(PoolConfigError, match="non-empty list"):
        await pool.start()
    assert all(s.pid is None for s in pool.status())


async def test_broken_env_factory_fails_fast() -> None:
    pool = SipWorkerPool(
        workers=1,
        base_port=5070,
        command_for=lambda i, p: [sys.executable, "-c", "pass"],
        env_for=lambda i, p: {"PORT": p, "SECRET": "s3cr3t-value"},  # type: ignore[dict-item]
    )
    with pytest.raises(PoolConfigError, match="env_for") as caught:
        await pool.start()
    assert "PORT" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)
    assert pool.status()[0].pid is None


async def test_factory_raising_later_is_a_counted_spawn_failure(tmp_path: Path) -> None:
    child = tmp_path / "crash_child.py"
    child.write_text(CRASH_CHILD)
    calls = 0

    def env_for(index: int, port: int) -> dict[str, str]:
        nonlocal calls
        calls += 1
        if calls > 2:  # start()'s check and the first spawn work, every restart fails
            raise RuntimeError("secret store unreachable")
        return {}

    pool = SipWorkerPool(
        workers=1,
        base_port=5070,
        command_for=lambda i, p: [sys.executable, str(child), str(tmp_path / "starts.log")],
        env_for=env_for,
        restart_delays=(0.05,),
    )
    async with pool:
        await wait_until(lambda: pool.status()[0].spawn_failures >= 2)
        st = pool.status()[0]
        assert st.last_exit_code == 3  # the one real run
        assert not st.alive
    assert len((tmp_path / "starts.log").read_text().split()) == 1


async def test_stuck_worker_is_killed_after_the_grace(echo_child: Path) -> None:
    base = consecutive_free_udp_ports(2)
    pool = SipWorkerPool(
        workers=2,
        base_port=base,
        command_for=lambda i, p: (
            [sys.executable, str(echo_child), str(p), "ignore-term"]
            if i == 0
            else [sys.executable, str(echo_child), str(p)]
        ),
        stop_grace_s=0.5,
    )
    await pool.start()
    for port in pool.ports:
        await asyncio.to_thread(udp_ask, port)  # both are up (and worker 0 ignores SIGTERM)
    started = time.monotonic()
    await pool.stop()
    elapsed = time.monotonic() - started
    codes = [s.last_exit_code for s in pool.status()]
    assert codes == [-signal.SIGKILL, -signal.SIGTERM]
    assert 0.5 <= elapsed < 5.0
    await pool.stop()  # idempotent


async def test_second_stop_request_kills_at_once(echo_child: Path) -> None:
    base = consecutive_free_udp_ports(1)
    pool = SipWorkerPool(
        workers=1,
        base_port=base,
        command_for=echo_command(echo_child, "ignore-term"),
        stop_grace_s=60.0,
    )
    run = asyncio.create_task(pool.run())
    await wait_until(lambda: pool.status()[0].alive)
    await asyncio.to_thread(udp_ask, base)
    pool.request_stop(signal.SIGTERM)
    await asyncio.sleep(0.2)
    assert pool.status()[0].alive  # ignores SIGTERM; the 60 s grace is running
    pool.request_stop(signal.SIGTERM)
    assert await asyncio.wait_for(run, 5.0) == 0
    assert pool.status()[0].last_exit_code == -signal.SIGKILL


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_pool_process_stops_all_workers(
    echo_child: Path, tmp_path: Path, signum: signal.Signals
) -> None:
    base = consecutive_free_udp_ports(3)
    main = tmp_path / "pool_main.py"
    main.write_text(POOL_MAIN)
    proc = subprocess.Popen(
        [sys.executable, str(main), str(echo_child), str(base)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pids: list[int] = json.loads(proc.stdout.readline())
        assert len(pids) == 3
        for i, pid in enumerate(pids):
            assert udp_ask(base + i)[0] == pid
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    result = json.loads(out)
    assert result == {"rc": 0, "codes": [-signum] * 3}  # forwarded as-is, not escalated
    assert all(pid_gone(pid) for pid in pids)
