"""API keys against a real Redis: issue, look up, revoke; the admin key; bearer parsing."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from rutster.base.env_values import ConfigError
from rutster.gateway.api.api_keys import (
    ADMIN_ENV_KEY_ID,
    MAX_BEARER_TOKEN_CHARS,
    AdminKey,
    ApiKeyStore,
    KeyStoreUnavailable,
    Principal,
    authenticate,
    hash_key,
    parse_bearer,
)
from rutster.gateway.api.errors import ApiError
from rutster.spend.embedded_redis import EmbeddedRedis

NOW_MS = 1_764_504_000_000
ADMIN_SECRET = "0123456789abcdef0123456789abcdef"


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
async def redis(request: pytest.FixtureRequest, redis_server_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server_url, decode_responses=request.param)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def store(redis: Redis, redis_prefix: str) -> ApiKeyStore:
    return ApiKeyStore(redis, redis_prefix)


def _dead_port() -> int:
    # A port nothing listens on: bound, then released.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def dead_store() -> AsyncIterator[ApiKeyStore]:
    # No retries: redis-py would otherwise back off for seconds before giving up.
    client = Redis(
        host="127.0.0.1", port=_dead_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    try:
        yield ApiKeyStore(client, "dead")
    finally:
        await client.aclose()


async def test_create_then_lookup(store: ApiKeyStore) -> None:
    issued = await store.create("acme", label="ci", now_ms=NOW_MS)
    assert issued.key.startswith("rk_live_") and len(issued.key) == len("rk_live_") + 32
    assert (issued.tenant, issued.role, issued.label) == ("acme", "tenant", "ci")
    assert issued.key_hash == hashlib.sha256(issued.key.encode()).hexdigest()
    principal = await store.lookup(issued.key)
    assert principal == Principal(tenant="acme", role="tenant", key_id=issued.key_hash)
    assert not principal.is_admin
    assert principal.may_see_tenant("acme") and not principal.may_see_tenant("other")
    assert await store.tenant_key_hashes("acme") == {issued.key_hash}


async def test_admin_role_keys(store: ApiKeyStore) -> None:
    issued = await store.create("ops", role="admin", now_ms=NOW_MS)
    principal = await store.lookup(issued.key)
    assert principal is not None and principal.is_admin and principal.may_see_tenant("acme")


async def test_keys_are_unique_and_independent(store: ApiKeyStore) -> None:
    first = await store.create("acme", now_ms=NOW_MS)
    second = await store.create("acme", now_ms=NOW_MS)
    other = await store.create("globex", now_ms=NOW_MS)
    assert len({first.key, second.key, other.key}) == 3
    assert await store.tenant_key_hashes("acme") == {first.key_hash, second.key_hash}
    found = await store.lookup(other.key)
    assert found is not None and found.tenant == "globex"


async def test_only_the_hash_is_stored_and_the_key_is_never_shown(
    store: ApiKeyStore, redis: Redis, redis_prefix: str
) -> None:
    issued = await store.create("acme", label="prod", now_ms=NOW_MS)
    assert issued.key not in repr(issued)
    dumped = []
    async for name in redis.scan_iter(match=f"{redis_prefix}:*"):
        dumped.append(repr(name))
        kind = await redis.type(name)
        if kind in (b"hash", "hash"):
            dumped.append(repr(await redis.hgetall(name)))
        elif kind in (b"set", "set"):
            dumped.append(repr(await redis.smembers(name)))
    blob = "\n".join(dumped)
    assert issued.key_hash in blob
    assert issued.key not in blob
    assert issued.key.removeprefix("rk_live_") not in blob
    record = await redis.hgetall(f"{redis_prefix}:apikey:{issued.key_hash}")
    decoded = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in record.items()
    }
    assert decoded == {"tenant": "acme", "role": "tenant", "created_ms": str(NOW_MS),
                       "label": "prod"}  # fmt: skip


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "rk_live_",
        "rk_live_short",
        "rk_test_" + "a" * 32,
        "rk_live_" + "a" * 31 + "!",
        "rk_live_" + "a" * 33,
        "rk_live_" + "a" * 32 + "\n",
        "RK_LIVE_" + "a" * 32,
    ],
)
async def test_malformed_keys_never_reach_redis(dead_store: ApiKeyStore, presented: str) -> None:
    # The store's Redis is unreachable: any Redis call would raise.
    assert await dead_store.lookup(presented) is None


async def test_unknown_well_formed_key_is_none(store: ApiKeyStore) -> None:
    assert await store.lookup("rk_live_" + "A" * 32) is None


async def test_revoke(store: ApiKeyStore) -> None:
    keep = await store.create("acme", now_ms=NOW_MS)
    drop = await store.create("acme", now_ms=NOW_MS)
    assert await store.revoke(drop.key_hash) is True
    assert await store.lookup(drop.key) is None
    assert await store.lookup(keep.key) is not None
    assert await store.tenant_key_hashes("acme") == {keep.key_hash}
    assert await store.revoke(drop.key_hash) is False
    with pytest.raises(ValueError, match="64 lowercase hex"):
        await store.revoke("not-a-hash")


async def test_corrupt_records_are_refused(
    store: ApiKeyStore, redis: Redis, redis_prefix: str
) -> None:
    issued = await store.create("acme", now_ms=NOW_MS)
    await redis.hset(f"{redis_prefix}:apikey:{issued.key_hash}", "role", "superuser")
    assert await store.lookup(issued.key) is None
    await redis.hset(
        f"{redis_prefix}:apikey:{issued.key_hash}", mapping={"role": "tenant", "tenant": "Bad Id"}
    )
    assert await store.lookup(issued.key) is None


@pytest.mark.parametrize(
    ("tenant", "role", "label", "match"),
    [
        ("Acme", "tenant", None, "invalid tenant id"),
        ("", "tenant", None, "invalid tenant id"),
        ("a" * 64, "tenant", None, "invalid tenant id"),
        ("acme\n", "tenant", None, "invalid tenant id"),
        ("acme", "root", None, "invalid role"),
        ("acme", "tenant", "", "invalid label"),
        ("acme", "tenant", "x" * 65, "invalid label"),
        ("acme", "tenant", "bell\x07", "invalid label"),
    ],
)
async def test_create_rejects_bad_input(
    store: ApiKeyStore, tenant: str, role: str, label: str | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await store.create(tenant, role=role, label=label, now_ms=NOW_MS)


async def test_redis_down_is_key_store_unavailable(dead_store: ApiKeyStore) -> None:
    with pytest.raises(KeyStoreUnavailable):
        await dead_store.lookup("rk_live_" + "a" * 32)
    with pytest.raises(KeyStoreUnavailable):
        await dead_store.create("acme", now_ms=NOW_MS)
    with pytest.raises(KeyStoreUnavailable):
        await dead_store.revoke("a" * 64)
    with pytest.raises(KeyStoreUnavailable):
        await dead_store.tenant_key_hashes("acme")


# --- admin key ---------------------------------------------------------------------------


def test_admin_key_check_is_exact() -> None:
    admin = AdminKey(ADMIN_SECRET)
    assert admin.check(ADMIN_SECRET)
    assert not admin.check(ADMIN_SECRET[:-1])
    assert not admin.check(ADMIN_SECRET + "0")
    assert not admin.check(ADMIN_SECRET.upper())
    assert not admin.check("")
    assert ADMIN_SECRET not in repr(admin)
    assert hash_key(ADMIN_SECRET) not in repr(admin)


@pytest.mark.parametrize(
    ("secret", "match"),
    [("x" * 23, "at least 24 characters"), ("a" * 30 + " b", "bearer token"),
     ("a" * 30 + "é", "bearer token"), ("=" + "a" * 30, "bearer token")],
)  # fmt: skip
def test_admin_key_must_be_long_and_bearer_safe(secret: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        AdminKey(secret)
    assert secret not in str(info.value)


def test_admin_key_from_env_and_file(tmp_path: Path) -> None:
    assert AdminKey.from_env({}) is None
    from_var = AdminKey.from_env({"RUTSTER_ADMIN_KEY": ADMIN_SECRET})
    assert from_var is not None and from_var.check(ADMIN_SECRET)
    path = tmp_path / "admin_key"
    other = "f" * 40
    path.write_text(other + "\n")
    from_file = AdminKey.from_env(
        {"RUTSTER_ADMIN_KEY": ADMIN_SECRET, "RUTSTER_ADMIN_KEY_FILE": str(path)}
    )
    assert from_file is not None and from_file.check(other) and not from_file.check(ADMIN_SECRET)
    path.write_text("short")
    with pytest.raises(ConfigError, match="RUTSTER_ADMIN_KEY_FILE must be at least 24"):
        AdminKey.from_env({"RUTSTER_ADMIN_KEY_FILE": str(path)})
    with pytest.raises(ConfigError, match="cannot read"):
        AdminKey.from_env({"RUTSTER_ADMIN_KEY_FILE": str(tmp_path / "missing")})


# --- bearer parsing and authentication ------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer rk_live_abc", "rk_live_abc"),
        ("bearer rk_live_abc", "rk_live_abc"),
        ("BEARER   rk_live_abc  ", "rk_live_abc"),
        ("Bearer abc+/=", "abc+/="),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer two tokens", None),
        ("Bearer tok\u00e9n", None),
        ("Bearer =abc", None),
        ("Bearer " + "a" * (MAX_BEARER_TOKEN_CHARS + 1), None),
        ("Bearer " + "a" * MAX_BEARER_TOKEN_CHARS, "a" * MAX_BEARER_TOKEN_CHARS),
    ],
)
def test_parse_bearer(header: str | None, token: str | None) -> None:
    assert parse_bearer(header) == token


async def test_authenticate(store: ApiKeyStore) -> None:
    admin = AdminKey(ADMIN_SECRET)
    issued = await store.create("acme", now_ms=NOW_MS)
    principal = await authenticate(f"Bearer {issued.key}", keys=store, admin_key=admin)
    assert principal.tenant == "acme" and principal.key_id == issued.key_hash
    env_admin = await authenticate(f"Bearer {ADMIN_SECRET}", keys=store, admin_key=admin)
    assert env_admin == Principal(tenant=None, role="admin", key_id=ADMIN_ENV_KEY_ID)
    # Without an admin key configured, the admin secret is just an unknown token.
    for header, message in [
        (None, "missing"),
        ("Token abc", "malformed"),
        ("Bearer rk_live_" + "b" * 32, "unknown or revoked"),
        (f"Bearer {ADMIN_SECRET}", "unknown or revoked"),
    ]:
        with pytest.raises(ApiError) as info:
            await authenticate(header, keys=store, admin_key=None)
        assert (info.value.status, info.value.code) == (401, "unauthorized")
        assert message in info.value.message
        assert info.value.headers["WWW-Authenticate"].startswith("Bearer")
        assert ADMIN_SECRET not in info.value.message


async def test_env_admin_key_works_while_redis_is_down(dead_store: ApiKeyStore) -> None:
    admin = AdminKey(ADMIN_SECRET)
    principal = await authenticate(f"Bearer {ADMIN_SECRET}", keys=dead_store, admin_key=admin)
    assert principal.is_admin
    with pytest.raises(KeyStoreUnavailable):
        await authenticate("Bearer rk_live_" + "c" * 32, keys=dead_store, admin_key=admin)


async def test_redis_refusing_writes_is_key_store_unavailable(tmp_path: Path) -> None:
    # A private server (its memory cap is changed): maxmemory 1 byte, noeviction.
    with EmbeddedRedis(tmp_path) as server:
        client = Redis.from_url(server.url, decode_responses=True)
        try:
            store = ApiKeyStore(client, "oom")
            issued = await store.create("acme", now_ms=NOW_MS)
            await client.config_set("maxmemory", "1")
            with pytest.raises(KeyStoreUnavailable):
                await store.create("acme", now_ms=NOW_MS)
            # Reads still work: existing keys keep authenticating.
            assert await store.lookup(issued.key) is not None
        finally:
            await client.aclose()
