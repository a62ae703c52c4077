"""``REDIS_URL``: one Redis server, or a master found through Redis Sentinel.

- ``redis://``, ``rediss://``, ``unix://``: one server (redis-py's own URL forms).
- ``redis+sentinel://[:password@]host1:port1[,host2:port2...]/<service>[/<db>]``:
  the master of ``<service>`` as the Sentinels name it. Every new connection asks
  them, so after a failover the clients reconnect to the promoted replica by
  themselves (redis-py's ``SentinelConnectionPool``). ``rediss+sentinel://`` speaks
  TLS to the master. The password (if any) is the master's; the Sentinels are asked
  without one.
- ``redis+cluster://[:password@]host1:port1[,host2:port2...]``: a Redis Cluster, found
  from any of the nodes named (redis-py's ``RedisCluster``, which follows MOVED
  replies and re-reads the slot map after a failover). ``rediss+cluster://`` for TLS.
  Every key then carries the hash tag ``{prefix}`` (:func:`cluster_key_prefix`): the
  spend scripts touch a tenant's keys and the global ones (active set, ledger) in one
  atomic step, which Cluster allows only within one hash slot. So all of rutster's state
  lives on one shard: Cluster buys failover, not write capacity (docs/OPERATIONS.md,
  "Redis", which also says what a failover can cost in money).

:data:`REDIS_UNAVAILABLE_ERRORS` is what any of these clients raises when the server
cannot be reached or cannot take writes now: every store maps it to its own
"unavailable" error, one policy for all topologies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

#: Schemes of one server (redis-py parses them).
SERVER_SCHEMES = ("redis", "rediss", "unix")
#: Schemes of a master found through Sentinel.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Schemes of a Redis Cluster.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: Port of a Sentinel named without one (Redis' own default).
DEFAULT_SENTINEL_PORT = 26379
#: Port of a Cluster node named without one (Redis' own default).
DEFAULT_REDIS_PORT = 6379

#: A client of any topology this module builds.
RedisClient = Redis | RedisCluster

#: Failures that mean "not reachable / not taking writes right now" (redis-py maps the
#: server's LOADING, OOM, READONLY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN replies to some of
#: these; a Cluster whose slot has no reachable master raises the cluster ones). Anything
#: else (a script's own bug, a cross-slot command) is a bug and stays loud.
REDIS_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.OutOfMemoryError,
    redis_errors.ReadOnlyError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
    redis_errors.RedisClusterUnreachableError,
    OSError,
)
#: The same conditions as plain error replies, or wrapped inside a script error
#: ("ERR Error running script ...: @user_script:12: -OOM command not allowed ...").
REDIS_UNAVAILABLE_REPLY = re.compile(
    r"(?:^|[\s:-])(OOM|BUSY|LOADING|MISCONF|READONLY|MASTERDOWN|NOREPLICAS|CLUSTERDOWN|TRYAGAIN)\b"
)


def is_unavailable_reply(exc: redis_errors.ResponseError) -> bool:
    """True if an error reply means Redis cannot take the command now (not our bug)."""
    return REDIS_UNAVAILABLE_REPLY.search(str(exc)) is not None


class RedisUrlError(ValueError):
    """``REDIS_URL`` is not a form this module knows."""


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where to find the master: the Sentinels, the service name, db and credentials."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None
    tls: bool = False


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse a ``redis+sentinel://`` URL; :class:`RedisUrlError` if it is not one."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise RedisUrlError(f"not a Sentinel URL (scheme {parts.scheme!r})")
    hosts = parts.netloc.rpartition("@")[2]
    password = unquote(parts.password) if parts.password else None
    sentinels = _addresses(hosts, DEFAULT_SENTINEL_PORT, "Sentinel")
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2:
        raise RedisUrlError(
            "a Sentinel URL is redis+sentinel://host:port[,host:port...]/<service>[/<db>]"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise RedisUrlError(f"bad database number {path[1]!r}") from None
    return SentinelTarget(
        tuple(sentinels), path[0], db, password, tls=parts.scheme.startswith("rediss")
    )


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """Where to find a Redis Cluster: some of its nodes, and the credentials."""

    nodes: tuple[tuple[str, int], ...]
    password: str | None = None
    tls: bool = False


def _addresses(hosts: str, default_port: int, kind: str) -> list[tuple[str, int]]:
    addresses = []
    for entry in filter(None, hosts.split(",")):
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        try:
            addresses.append((host or entry, int(port) if port else default_port))
        except ValueError:
            raise RedisUrlError(f"bad {kind} address {entry!r}") from None
    return addresses


def parse_cluster_url(url: str) -> ClusterTarget:
    """Parse a ``redis+cluster://`` URL; :class:`RedisUrlError` if it is not one."""
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise RedisUrlError(f"not a Cluster URL (scheme {parts.scheme!r})")
    nodes = _addresses(parts.netloc.rpartition("@")[2], DEFAULT_REDIS_PORT, "Cluster node")
    if not nodes or parts.path.strip("/"):
        # A Cluster has one database: a path would be a database number it cannot have.
        raise RedisUrlError("a Cluster URL is redis+cluster://host:port[,host:port...]")
    password = unquote(parts.password) if parts.password else None
    return ClusterTarget(tuple(nodes), password, tls=parts.scheme.startswith("rediss"))


def is_cluster_url(url: str) -> bool:
    """True if ``url`` names a Redis Cluster."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def cluster_key_prefix(prefix: str) -> str:
    """``prefix`` as a hash tag, so that every key under it falls in one Cluster slot."""
    return f"{{{prefix}}}"


def key_prefix(url: str | None, prefix: str) -> str:
    """The key prefix to use on the Redis ``url`` names (hash-tagged on a Cluster)."""
    return cluster_key_prefix(prefix) if url is not None and is_cluster_url(url) else prefix


def check_redis_url(url: str) -> None:
    """:class:`RedisUrlError` unless ``url`` is a form this module can connect to."""
    scheme = urlsplit(url).scheme
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
    elif scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
    elif scheme not in SERVER_SCHEMES:
        raise RedisUrlError(
            "REDIS_URL must be a redis://, rediss://, unix://, redis+sentinel:// or "
            f"redis+cluster:// URL (scheme was {scheme!r})"
        )


class SentinelMaster(Redis):
    """The master's client; closing it also closes its connections to the Sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the client, its pool, and the Sentinel clients that pool asks."""
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


def sentinel_master(url: str, **connection: Any) -> Redis:
    """A client of the master a ``redis+sentinel://`` URL names, with ``connection``
    settings (timeouts, retries, decoding) for its connections to the master."""
    target = parse_sentinel_url(url)
    timeouts = {
        k: v for k, v in connection.items() if k in ("socket_timeout", "socket_connect_timeout")
    }
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=timeouts)
    master: Redis = sentinel.master_for(
        target.service,
        redis_class=SentinelMaster,
        db=target.db,
        password=target.password,
        ssl=target.tls,
        **connection,
    )
    return master


def cluster_client(url: str, **connection: Any) -> RedisCluster:
    """A client of the Redis Cluster a ``redis+cluster://`` URL names, with
    ``connection`` settings (timeouts, decoding, connections per node)."""
    target = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        password=target.password,
        ssl=target.tls,
        **connection,
    )
