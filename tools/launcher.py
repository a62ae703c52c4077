"""Starting gateway and brain processes on free loopback ports (demo, tests, benchmarks)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

#: How long a freshly spawned process may take to start listening.
READY_TIMEOUT_S = 20.0
#: Grace given to a process to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 5.0
LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_listening(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Block until ``host:port`` accepts TCP connections; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s")


def wait_healthy(
    host: str, port: int, path: str, timeout_s: float, proc: subprocess.Popen[bytes]
) -> None:
    """Block until ``GET path`` on ``host:port`` answers 2xx; fail early if ``proc`` died.

    ``rutster serve`` binds its socket before the app starts (gateway/server.py),
    so a TCP connection is accepted before the gateway can serve it.
    """
    deadline = time.monotonic() + timeout_s
    url = f"http://{host}:{port}{path}"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if 200 <= response.status < 300:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 2xx after {timeout_s}s")


@dataclass
class Service:
    """A spawned rutster process listening on ``port``."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if needed; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def spawn(
    args: list[str],
    *,
    port: int,
    env: Mapping[str, str] | None = None,
    host: str = LOOPBACK,
    quiet: bool = True,
    health_path: str | None = None,
    stderr_path: str | None = None,
) -> Service:
    """Run ``python -m rutster.tools.cli ARGS`` and wait until it listens on ``port``.

    With ``health_path``, wait until ``GET health_path`` answers 2xx instead.
    With ``stderr_path``, the process's stderr (its log) goes to that file.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    out = subprocess.DEVNULL if quiet else None
    with contextlib.ExitStack() as files:
        err: int | IO[bytes] | None = out
        if stderr_path is not None:
            # The child has its own copy of the descriptor; ours closes once it is spawned.
            err = files.enter_context(open(stderr_path, "ab"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "rutster.tools.cli", *args],
            env=full_env,
            stdout=out,
            stderr=err,
        )
    try:
        if health_path is None:
            wait_listening(host, port, READY_TIMEOUT_S, proc)
        else:
            wait_healthy(host, port, health_path, READY_TIMEOUT_S, proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return Service(proc=proc, host=host, port=port)


@contextmanager
def echo_brain_process(port: int | None = None, *, quiet: bool = True) -> Iterator[Service]:
    """An echo brain (``rutster brain echo``) in its own process."""
    port = port or free_port()
    service = spawn(
        ["brain", "echo"], port=port, env={"RUTSTER_BRAIN_BIND": f"{LOOPBACK}:{port}"}, quiet=quiet
    )
    try:
        yield service
    finally:
        service.stop()


@contextmanager
def realtime_brain_process(
    mock_url: str | None = None,
    port: int | None = None,
    *,
    mock_reply_ms: int | None = None,
    quiet: bool = True,
) -> Iterator[Service]:
    """A realtime brain (``rutster brain realtime --mock``) in its own process.

    With ``mock_url`` it uses that already running mock server (so a test can
    inspect what the mock saw); otherwise it starts its own.
    """
    port = port or free_port()
    args = ["brain", "realtime", "--mock", "--bind", f"{LOOPBACK}:{port}"]
    if mock_reply_ms is not None:
        args += ["--mock-reply-ms", str(mock_reply_ms)]
    if mock_url is not None:
        args += ["--mock-url", mock_url]
    service = spawn(args, port=port, quiet=quiet)
    try:
        yield service
    finally:
        service.stop()


@contextmanager
def gateway_process(
    env: Mapping[str, str],
    port: int | None = None,
    *,
    quiet: bool = True,
    stderr_path: str | None = None,
) -> Iterator[Service]:
    """The gateway (``rutster serve``) under uvicorn in its own process (its log, at
    level warning, to ``stderr_path`` when given)."""
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="rutster-gateway-") as data_dir:
        service = spawn(
            ["serve", "--host", LOOPBACK, "--port", str(port), "--log-level", "warning"],
            port=port,
            # Each process its own data folder (embedded Redis, spend journal) unless given.
            env={
                "RUTSTER_PUBLIC_URL": f"http://{LOOPBACK}:{port}",
                "RUTSTER_DATA_DIR": data_dir,
                # Service.stop means stop now: no drain, unless the caller asks for one.
                "RUTSTER_DRAIN_TIMEOUT_S": "0",
                **env,
            },
            quiet=quiet,
            health_path="/healthz",
            stderr_path=stderr_path,
        )
        try:
            yield service
        finally:
            service.stop()


@contextmanager
def sip_worker_process(
    env: Mapping[str, str], port: int | None = None, *, quiet: bool = True
) -> Iterator[Service]:
    """One SIP worker (``rutster sip-worker``) in its own process, ready once its TCP
    transport listens (UDP and TCP share the port)."""
    port = port or free_port()
    service = spawn(
        ["sip-worker", "--sip-port", str(port), "--log-level", "warning" if quiet else "debug"],
        port=port,
        env={"RUTSTER_SIP_BIND": LOOPBACK, **env},
        quiet=quiet,
    )
    try:
        yield service
    finally:
        service.stop()
