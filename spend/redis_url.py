"""``REDIS_URL``: one Redis server, or a master found through Redis Sentinel.

- ``redis://``, ``rediss://``, ``unix://``: one server (redis-py's own URL forms).
- ``redis+sentinel://[:password@]host1:port1[,host2:port2...]/<service>[/<db>]``:
  the master of ``<service>`` as the Sentinels name it. Every new connection asks
  them, so after a failover the clients reconnect to the promoted replica by
  themselves (redis-py's ``SentinelConnectionPool``). ``rediss+sentinel://`` speaks
  TLS to the master. The password (if any) is the master's; the Sentinels are asked
  without one.

Redis Cluster is not supported: the spend scripts touch a tenant's keys and the global
ones (active set, ledger) in one atomic step, which Cluster allows only within one hash
slot (docs/OPERATIONS.md, "Redis", which also says what a failover can cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

#: Schemes of one server (redis-py parses them).
SERVER_SCHEMES = ("redis", "rediss", "unix")
#: Schemes of a master found through Sentinel.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Port of a Sentinel named without one (Redis' own default).
DEFAULT_SENTINEL_PORT = 26379


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
    sentinels = []
    for entry in filter(None, hosts.split(",")):
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        try:
            sentinels.append((host or entry, int(port) if port else DEFAULT_SENTINEL_PORT))
        except ValueError:
            raise RedisUrlError(f"bad Sentinel address {entry!r}") from None
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


def check_redis_url(url: str) -> None:
    """:class:`RedisUrlError` unless ``url`` is a form :func:`redis_from_url` takes."""
    scheme = urlsplit(url).scheme
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
    elif scheme not in SERVER_SCHEMES:
        raise RedisUrlError(
            "REDIS_URL must be a redis://, rediss://, unix:// or redis+sentinel:// URL "
            f"(scheme was {scheme!r})"
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
