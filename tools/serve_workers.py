"""``rutster serve --workers N``: one gateway process per core on one host, one listening port.

A gateway process runs one event loop, so it uses one core; a host with N cores
runs N of them. This supervisor binds the port once and starts N ``rutster serve``
worker processes that all accept on that socket (inherited, ``--listen-fd``): the
kernel hands each new connection to one of them. They are nodes of one cluster
(docs/ARCHITECTURE.md, "Processes"), sharing:

- **Redis**: ``REDIS_URL``, or else one embedded ``redis-server`` this supervisor
  starts for all of them (under ``RUTSTER_DATA_DIR``), not one each;
- **the stream secret**: ``RUTSTER_STREAM_SECRET`` (or ``_FILE``), or else one random
  secret for this host's workers, so a call's media socket may land on any of them;
- **node ids**: ``<RUTSTER_NODE_ID or host-pid>-w<k>``, one per worker.

SIGTERM is passed to every worker, each of which drains (gateway/drain.py); SIGINT
stops them at once. A worker that dies on its own is started again after
:data:`RESTART_DELAY_S` (its calls were settled by the others as ``node_lost``),
at most :data:`MAX_RESTARTS_PER_MINUTE` times a minute, after which the supervisor
stops everything and exits 1 rather than crash-loop.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from rutster.base.parent_death import stop_with_parent
from rutster.spend.embedded_redis import EmbeddedRedis

log = logging.getLogger(__name__)

#: Wait before a worker that died is started again. Seed decision: long enough not to
#: spin on a worker that dies at startup, short next to a call.
RESTART_DELAY_S = 1.0
#: Restarts allowed in any minute before the supervisor gives up. Seed decision.
MAX_RESTARTS_PER_MINUTE = 10
#: How often the supervisor looks at its workers.
POLL_S = 0.2
#: Most workers one supervisor starts (a sanity bound on a typo, not a tuning).
MAX_WORKERS = 256


class WorkerPool:
    """The supervisor's state: its workers and whether a stop was asked for."""

    def __init__(self, count: int, argv: list[str], env: Mapping[str, str], fd: int) -> None:
        self.count = count
        self.argv = argv
        self.env = dict(env)
        self.fd = fd
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * count
        self.stopping: int | None = None  # the signal that asked for the stop
        self.restarts: list[float] = []

    def start(self, k: int) -> None:
        env = {**self.env, "RUTSTER_NODE_ID": f"{self.env['RUTSTER_NODE_ID']}-w{k}"}
        self.workers[k] = subprocess.Popen(
            [*self.argv, "--listen-fd", str(self.fd)],
            env=env,
            pass_fds=[self.fd],
            # Its own session: a terminal's Ctrl-C reaches the supervisor only, which
            # passes it on once (a second SIGINT would skip the worker's clean stop);
            # and it stops if the supervisor is killed outright.
            start_new_session=True,
            preexec_fn=stop_with_parent(),
        )

    def signal_all(self, signum: int) -> None:
        for proc in self.workers:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signum)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM: every worker drains; SIGINT (or a second signal): they stop at once."""
        forward = signal.SIGINT if self.stopping is not None else signum
        self.stopping = signum
        self.signal_all(forward)

    def run(self) -> int:
        """Start the workers and watch them until they have all exited; the exit code."""
        for k in range(self.count):
            self.start(k)
        codes: dict[int, int] = {}
        while True:
            for k, proc in enumerate(self.workers):
                if proc is None or (code := proc.poll()) is None:
                    continue
                if self.stopping is not None:
                    codes[k] = code
                    continue
                now = time.monotonic()
                self.restarts = [t for t in self.restarts if now - t < 60.0] + [now]
                if len(self.restarts) > MAX_RESTARTS_PER_MINUTE:
                    log.error(
                        "workers keep dying (%d restarts in a minute): stopping",
                        len(self.restarts),
                    )
                    self.stopping = signal.SIGTERM
                    self.signal_all(signal.SIGTERM)
                    codes[k] = 1
                    continue
                log.error("gateway worker %d exited with %s; starting it again", k, code)
                time.sleep(RESTART_DELAY_S)
                self.start(k)
            if self.stopping is not None and all(
                p is None or p.poll() is not None for p in self.workers
            ):
                for k, proc in enumerate(self.workers):
                    if proc is not None:
                        codes.setdefault(k, proc.returncode)
                return 0 if all(code == 0 for code in codes.values()) else 1
            time.sleep(POLL_S)


def serve_workers(count: int, *, host: str, port: int, log_level: str, sock: socket.socket) -> int:
    """Run ``count`` gateway workers on ``sock`` (bound by the caller); the exit code."""
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"--workers must be 1..{MAX_WORKERS}")
    env = dict(os.environ)
    embedded: EmbeddedRedis | None = None
    if not env.get("REDIS_URL", "").strip():
        data_dir = Path(env.get("RUTSTER_DATA_DIR", "").strip() or ".rutster")
        embedded = EmbeddedRedis(data_dir / "redis", stop_with_parent=True)
        embedded.start()
        env["REDIS_URL"] = embedded.url
        log.info(
            "embedded Redis for the %d workers at %s (data in %s)", count, embedded.url, data_dir
        )
    if not env.get("RUTSTER_STREAM_SECRET") and not env.get("RUTSTER_STREAM_SECRET_FILE"):
        # One secret for this host's workers, so any of them takes any call's media.
        env["RUTSTER_STREAM_SECRET"] = secrets.token_urlsafe(32)
    env.setdefault("RUTSTER_NODE_ID", f"{socket.gethostname()[:32]}-{os.getpid()}")
    argv = [sys.executable, "-m", "rutster.tools.cli", "serve", "--host", host]
    argv += ["--port", str(port), "--log-level", log_level]
    pool = WorkerPool(count, argv, env, sock.fileno())
    previous = {s: signal.signal(s, pool.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info("listening on http://%s:%d with %d gateway workers", host, port, count)
    try:
        return pool.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sock.close()
        if embedded is not None:
            embedded.stop()
