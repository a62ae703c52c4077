"""API keys: issue, look up and revoke tenant keys in Redis; check the operator's admin key.

A key is ``rk_live_`` + 32 URL-safe characters (24 random bytes, 192 bits).
Redis stores only its SHA-256 (``P:apikey:{sha256 hex}`` hash with ``tenant,
role, created_ms, label``) and a per-tenant index (``P:tenant:{t}:keys`` set of
hashes): a dump of Redis yields no usable key. The key itself is returned once,
by :meth:`ApiKeyStore.create`, and never logged or shown in a ``repr``.

The operator's admin key comes from ``RUTSTER_ADMIN_KEY`` /
``RUTSTER_ADMIN_KEY_FILE``, is never stored, and is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.typing import EncodableT, FieldT

from rutster.base.env_values import ConfigError, read_secret
from rutster.gateway.api.errors import unauthorized
from rutster.gateway.api.schemas import API_KEY_PATTERN, KEY_LABEL_PATTERN, ROLES
from rutster.spend.redis_url import REDIS_UNAVAILABLE_ERRORS, RedisClient
from rutster.spend.store import StoreUnavailable
from rutster.spend.tenant_id import TENANT_ID_PATTERN

log = logging.getLogger(__name__)

#: Every key starts with this, so a leaked key is recognisable (secret scanners).
KEY_PREFIX = "rk_live_"
#: Random bytes per key: 192 bits, unguessable; ``token_urlsafe(24)`` = 32 chars.
KEY_RANDOM_BYTES = 24
#: Shortest admin key accepted: 24 characters (96 bits as hex). Seed decision;
#: ``openssl rand -hex 32`` gives 64.
ADMIN_KEY_MIN_CHARS = 24
#: Env var naming the admin key (``..._FILE`` holds a path to it instead).
ADMIN_KEY_ENV = "RUTSTER_ADMIN_KEY"
#: Longest bearer token read: far above any key issued here; bounds the hashing
#: work an unauthenticated request can cause.
MAX_BEARER_TOKEN_CHARS = 512
#: Rate-limit / audit id of the env admin key (stored keys use their hash).
ADMIN_ENV_KEY_ID = "admin-env"
ROLE_TENANT = "tenant"
ROLE_ADMIN = "admin"

_KEY_RE = re.compile(API_KEY_PATTERN)
_TENANT_RE = re.compile(TENANT_ID_PATTERN)
_LABEL_RE = re.compile(KEY_LABEL_PATTERN)
_HASH_RE = re.compile(r"[0-9a-f]{64}")
#: RFC 6750 §2.1 ``b64token``.
_B64TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


class KeyStoreUnavailable(StoreUnavailable):
    """Redis could not be reached (or take writes) while handling a key.

    A :class:`spend.store.StoreUnavailable`, so one ``except`` covers every store.
    """


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A freshly issued key. ``key`` is the secret: show it once, never log it."""

    key: str = field(repr=False)
    tenant: str
    role: str
    label: str | None
    key_hash: str


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a tenant's key, a stored admin key, or the operator's env admin key.

    ``key_id`` identifies the key without revealing it (its SHA-256, or
    :data:`ADMIN_ENV_KEY_ID`): the per-key rate limit and audit logs use it.
    """

    tenant: str | None
    role: str
    key_id: str

    @property
    def is_admin(self) -> bool:
        """True for admin keys: every tenant, limits, keys and the kill switch."""
        return self.role == ROLE_ADMIN

    def may_see_tenant(self, tenant: str) -> bool:
        """Admins see every tenant; a tenant key sees only its own."""
        return self.is_admin or self.tenant == tenant


def hash_key(key: str) -> str:
    """SHA-256 hex of a key: its Redis identity."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_well_formed_key(key: str) -> bool:
    """True if ``key`` looks like a key this gateway issues (checked before any Redis call)."""
    return _KEY_RE.fullmatch(key) is not None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class ApiKeyStore:
    """Tenant API keys in Redis under ``prefix`` (works with or without ``decode_responses``)."""

    def __init__(self, redis: RedisClient, prefix: str = "rutster") -> None:
        self._redis = redis
        self._prefix = prefix

    def _key_hash_key(self, key_hash: str) -> str:
        return f"{self._prefix}:apikey:{key_hash}"

    def _tenant_index_key(self, tenant: str) -> str:
        return f"{self._prefix}:tenant:{tenant}:keys"

    async def create(
        self, tenant: str, role: str = ROLE_TENANT, label: str | None = None, *, now_ms: int
    ) -> IssuedKey:
        """Issue a key for ``tenant``; raises ``ValueError`` for a bad tenant, role or label."""
        if _TENANT_RE.fullmatch(tenant) is None:
            raise ValueError(f"invalid tenant id {tenant[:70]!r}: must match {TENANT_ID_PATTERN}")
        if role not in ROLES:
            raise ValueError(f"invalid role {role[:20]!r}: must be one of {', '.join(ROLES)}")
        if label is not None and _LABEL_RE.fullmatch(label) is None:
            raise ValueError("invalid label: 1..64 characters without control characters")
        key = KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)
        key_hash = hash_key(key)
        record: dict[FieldT, EncodableT] = {
            "tenant": tenant,
            "role": role,
            "created_ms": str(now_ms),
        }
        if label is not None:
            record["label"] = label
        try:
            # One MULTI: the key and its index entry appear together. 192 random
            # bits make a hash collision with an existing key impossible in practice.
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._key_hash_key(key_hash), mapping=record)
                pipe.sadd(self._tenant_index_key(tenant), key_hash)
                await pipe.execute()
        except REDIS_UNAVAILABLE_ERRORS as exc:
            raise KeyStoreUnavailable("store API key", exc) from exc
        return IssuedKey(key=key, tenant=tenant, role=role, label=label, key_hash=key_hash)

    async def lookup(self, key: str) -> Principal | None:
        """The principal of ``key``, or None if it is malformed, unknown or revoked."""
        if not is_well_formed_key(key):
            return None
        key_hash = hash_key(key)
        try:
            tenant_raw, role_raw = await self._redis.hmget(
                self._key_hash_key(key_hash), ["tenant", "role"]
            )
        except REDIS_UNAVAILABLE_ERRORS as exc:
            raise KeyStoreUnavailable("look up API key", exc) from exc
        tenant, role = _text(tenant_raw), _text(role_raw)
        if tenant is None:
            return None
        if role not in ROLES or _TENANT_RE.fullmatch(tenant) is None:
            # A hand-edited or corrupt record: refuse rather than guess a role.
            log.warning("API key record %s… is corrupt; refusing it", key_hash[:12])
            return None
        return Principal(tenant=tenant, role=role, key_id=key_hash)

    async def revoke(self, key_hash: str) -> bool:
        """Delete the key with this SHA-256 hex; True if it existed."""
        if _HASH_RE.fullmatch(key_hash) is None:
            raise ValueError("a key hash is 64 lowercase hex digits")
        record_key = self._key_hash_key(key_hash)
        try:
            tenant = _text(await self._redis.hget(record_key, "tenant"))
            if tenant is None:
                return False
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(record_key)
                pipe.srem(self._tenant_index_key(tenant), key_hash)
                deleted, _ = await pipe.execute()
        except REDIS_UNAVAILABLE_ERRORS as exc:
            raise KeyStoreUnavailable("revoke API key", exc) from exc
        return bool(deleted)

    async def tenant_key_hashes(self, tenant: str) -> set[str]:
        """Hashes of ``tenant``'s keys (the index; the keys themselves are not recoverable)."""
        try:
            members = await self._redis.smembers(self._tenant_index_key(tenant))
        except REDIS_UNAVAILABLE_ERRORS as exc:
            raise KeyStoreUnavailable("list API keys", exc) from exc
        return {text for member in members if (text := _text(member)) is not None}


class AdminKey:
    """The operator's admin key, checked in constant time; never stored, never shown."""

    __slots__ = ("_digest",)

    def __init__(self, secret: str, *, source: str = ADMIN_KEY_ENV) -> None:
        if len(secret) < ADMIN_KEY_MIN_CHARS:
            raise ConfigError(
                f"{source} must be at least {ADMIN_KEY_MIN_CHARS} characters "
                f"(got {len(secret)}); generate one with `openssl rand -hex 32`"
            )
        if _B64TOKEN_RE.fullmatch(secret) is None:
            # It travels as "Authorization: Bearer <key>", where only these are allowed.
            raise ConfigError(
                f"{source} may contain only letters, digits and -._~+/ (then '=' padding), "
                "as a bearer token (RFC 6750); generate one with `openssl rand -hex 32`"
            )
        # Compare digests: equal lengths, so compare_digest leaks nothing, not even length.
        self._digest = hashlib.sha256(secret.encode("utf-8")).digest()

    def __repr__(self) -> str:
        return "AdminKey(<hidden>)"

    def check(self, presented: str) -> bool:
        """True if ``presented`` is the admin key (constant time)."""
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        return hmac.compare_digest(digest, self._digest)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdminKey | None:
        """From ``RUTSTER_ADMIN_KEY_FILE`` (wins) or ``RUTSTER_ADMIN_KEY``; None when unset."""
        secret = read_secret(env, ADMIN_KEY_ENV)
        if secret is None:
            return None
        source = f"{ADMIN_KEY_ENV}_FILE" if env.get(f"{ADMIN_KEY_ENV}_FILE") else ADMIN_KEY_ENV
        return cls(secret, source=source)


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None if absent/malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_BEARER_TOKEN_CHARS:
        return None
    if _B64TOKEN_RE.fullmatch(token) is None:
        return None
    return token


async def authenticate(
    authorization: str | None, *, keys: ApiKeyStore, admin_key: AdminKey | None
) -> Principal:
    """The principal behind an ``Authorization`` header, or a 401 :class:`ApiError`.

    Raises :class:`KeyStoreUnavailable` when Redis cannot be reached (the env
    admin key still works then: it is checked first, without Redis).
    """
    if not authorization:
        raise unauthorized("missing 'Authorization: Bearer <API key>' header")
    token = parse_bearer(authorization)
    if token is None:
        raise unauthorized("malformed Authorization header; expected 'Bearer <API key>'")
    if admin_key is not None and admin_key.check(token):
        return Principal(tenant=None, role=ROLE_ADMIN, key_id=ADMIN_ENV_KEY_ID)
    principal = await keys.lookup(token)
    if principal is None:
        raise unauthorized("unknown or revoked API key")
    return principal
