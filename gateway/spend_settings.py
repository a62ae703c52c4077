"""The spend gate's and REST API's settings, read from the environment.

Kept apart from :mod:`gateway.config` (media, brains, Twilio) because this
part is about money and tenants: where Redis is, what a tenant may spend by
default, how the API is guarded. Secrets (the admin key) come from an env var
or a ``*_FILE``, never reach ``repr`` or a log.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rutster.base.env_values import ConfigError, env_float, env_int, env_pairs, read_secret
from rutster.gateway.api.rate_limit import DEFAULT_BURST, DEFAULT_RATE_PER_S
from rutster.spend.gate import (
    DEFAULT_CALL_MAX_COST_MICROS,
    DEFAULT_CALL_MAX_DURATION_S,
    GatePolicy,
)
from rutster.spend.limits import LimitsError, TenantLimits
from rutster.spend.money import parse_money
from rutster.spend.prices import PriceFileError, PriceTable
from rutster.spend.redis_url import RedisUrlError, check_redis_url, key_prefix
from rutster.spend.store import DEFAULT_PREFIX, LEDGER_MAX_ENTRIES, RECEIPT_RETENTION_S
from rutster.spend.tenant_id import TENANT_ID_MAX_CHARS, is_tenant_id

#: Where the embedded Redis keeps its data (and the spend journal lives) when
#: ``RUTSTER_DATA_DIR`` is not set: a folder in the working directory.
DEFAULT_DATA_DIR = ".rutster"
#: Redis key prefix (the store's default). Installations may share one Redis by prefix.
DEFAULT_REDIS_PREFIX = DEFAULT_PREFIX
#: Tenant that inbound calls belong to unless ``RUTSTER_TENANT_BY_NUMBER`` says otherwise.
DEFAULT_TENANT = "default"
#: Shortest admin key accepted: 24 characters (~140 bits from ``openssl rand -base64 24``).
MIN_ADMIN_KEY_CHARS = 24
#: Default limits of a tenant with none stored. Seed decisions, deliberately
#: modest so that a forgotten tenant cannot burn much: 20 USD a day, 200 USD a
#: month, 10 calls at once, 20 calls per caller per hour, 30 outbound calls per
#: campaign per minute. Per-call caps come from the gateway ceilings below.
DEFAULT_BUDGET_DAY_MICROS = 20_000_000
DEFAULT_BUDGET_MONTH_MICROS = 200_000_000
DEFAULT_MAX_CONCURRENT = 10
DEFAULT_CALLER_CALLS_PER_HOUR = 20
DEFAULT_CAMPAIGN_CALLS_PER_MINUTE = 30
#: How long per-call records and receipts are kept after a call ends (the store's default).
DEFAULT_RETENTION_S = RECEIPT_RETENTION_S
#: Ledger stream length, approximate (the store's default).
DEFAULT_LEDGER_MAX_ENTRIES = LEDGER_MAX_ENTRIES
#: Names of configured brains usable in ``POST /v1/calls``: lowercase words.
BRAIN_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,31}")
#: How long an admitted call may take to open its media stream before its admission
#: is released (settled at zero, reason ``no_media``). Twilio opens the stream within
#: a second or two of our TwiML; 30 s is far past that (seed decision).
MEDIA_CONNECT_TIMEOUT_S = 30.0
#: Least RUTSTER_MEDIA_CONNECT_TIMEOUT_S: a provider needs a moment between our answer
#: and its stream (Twilio: a second or two). Seed decision.
MIN_MEDIA_CONNECT_TIMEOUT_S = 1.0
#: What a caller hears when admission refuses their call (TwiML).
REFUSAL_RESPONSES = ("reject", "busy", "say")


def _money(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_money(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc} (write USD like 12.50)") from None


def default_node_id() -> str:
    """This process's name in the call directory: host, pid and a random suffix."""
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class SpendSettings:
    """Everything the spend gate and the REST API read from the environment."""

    redis_url: str | None = None
    redis_prefix: str = DEFAULT_REDIS_PREFIX
    data_dir: Path = field(default_factory=lambda: Path(DEFAULT_DATA_DIR))
    admin_key: str | None = field(default=None, repr=False)
    prices: PriceTable = field(default_factory=PriceTable.default, repr=False)
    #: ``prices`` came from ``RUTSTER_PRICES_FILE``: it is the whole table (the providers'
    #: own rates do not fill its gaps; a provider it does not price is refused).
    prices_from_file: bool = False
    policy: GatePolicy = field(default_factory=GatePolicy)
    default_tenant: str = DEFAULT_TENANT
    tenant_by_number: Mapping[str, str] = field(default_factory=dict)
    brains: Mapping[str, str] = field(default_factory=dict)
    refusal_response: str = "reject"
    goodbye_text: str | None = None
    retention_s: int = DEFAULT_RETENTION_S
    ledger_max_entries: int = DEFAULT_LEDGER_MAX_ENTRIES
    api_rate_per_s: float = DEFAULT_RATE_PER_S
    api_burst: int = DEFAULT_BURST
    node_id: str = field(default_factory=default_node_id)
    media_connect_timeout_s: float = MEDIA_CONNECT_TIMEOUT_S

    @property
    def key_prefix(self) -> str:
        """The prefix of every Redis key: RUTSTER_REDIS_PREFIX, as a hash tag on a Cluster."""
        return key_prefix(self.redis_url, self.redis_prefix)

    @property
    def journal_path(self) -> Path:
        """The local spend journal (records Redis could not take yet)."""
        return self.data_dir / "spend-journal.jsonl"

    def tenant_for_number(self, number: str) -> str:
        """The tenant an inbound call to ``number`` belongs to."""
        return self.tenant_by_number.get(number, self.default_tenant)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SpendSettings:
        """Read the settings (default: ``os.environ``); raises :class:`ConfigError`."""
        env = os.environ if env is None else env
        redis_url = env.get("REDIS_URL", "").strip() or None
        if redis_url is not None:
            try:
                check_redis_url(redis_url)
            except RedisUrlError as exc:
                raise ConfigError(f"REDIS_URL: {exc}") from None
        admin_key = read_secret(env, "RUTSTER_ADMIN_KEY")
        if admin_key is not None and len(admin_key) < MIN_ADMIN_KEY_CHARS:
            raise ConfigError(
                f"RUTSTER_ADMIN_KEY must be at least {MIN_ADMIN_KEY_CHARS} characters "
                "(e.g. `openssl rand -hex 24`)"
            )
        prices_file = env.get("RUTSTER_PRICES_FILE", "").strip()
        try:
            prices = PriceTable.from_file(prices_file) if prices_file else PriceTable.default()
        except (PriceFileError, OSError) as exc:
            raise ConfigError(f"RUTSTER_PRICES_FILE: {exc}") from None
        try:
            defaults = TenantLimits(
                budget_day=_money(env, "RUTSTER_DEFAULT_BUDGET_DAY", DEFAULT_BUDGET_DAY_MICROS),
                budget_month=_money(
                    env, "RUTSTER_DEFAULT_BUDGET_MONTH", DEFAULT_BUDGET_MONTH_MICROS
                ),
                max_concurrent=env_int(
                    env, "RUTSTER_DEFAULT_MAX_CONCURRENT", DEFAULT_MAX_CONCURRENT
                ),
                caller_calls_per_hour=env_int(
                    env, "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR", DEFAULT_CALLER_CALLS_PER_HOUR
                ),
                campaign_calls_per_minute=env_int(
                    env,
                    "RUTSTER_DEFAULT_CAMPAIGN_CALLS_PER_MINUTE",
                    DEFAULT_CAMPAIGN_CALLS_PER_MINUTE,
                ),
            )
        except LimitsError as exc:
            raise ConfigError(f"RUTSTER_DEFAULT_*: {exc}") from None
        on_down = env.get("RUTSTER_SPEND_ON_REDIS_DOWN", "").strip().lower() or "refuse"
        if on_down not in ("refuse", "admit"):
            raise ConfigError(
                f"RUTSTER_SPEND_ON_REDIS_DOWN must be refuse or admit, got {on_down!r}"
            )
        policy = GatePolicy(
            default_limits=defaults,
            max_call_duration_s=env_int(
                env, "RUTSTER_MAX_CALL_DURATION_S", DEFAULT_CALL_MAX_DURATION_S, minimum=1
            ),
            max_call_cost=_money(env, "RUTSTER_MAX_CALL_COST", DEFAULT_CALL_MAX_COST_MICROS),
            admit_when_store_down=on_down == "admit",
        )
        default_tenant = env.get("RUTSTER_DEFAULT_TENANT", "").strip() or DEFAULT_TENANT
        by_number = env_pairs(env, "RUTSTER_TENANT_BY_NUMBER")
        for tenant in (default_tenant, *by_number.values()):
            if not is_tenant_id(tenant):
                raise ConfigError(
                    "tenant ids are lowercase letters, digits, - and _, "
                    f"1..{TENANT_ID_MAX_CHARS} long (got {tenant!r})"
                )
        brains = env_pairs(env, "RUTSTER_BRAINS")
        for name in brains:
            if not BRAIN_NAME_PATTERN.fullmatch(name):
                raise ConfigError(f"RUTSTER_BRAINS: brain names are lowercase words, got {name!r}")
        refusal = env.get("RUTSTER_REFUSAL_RESPONSE", "").strip().lower() or "reject"
        if refusal not in REFUSAL_RESPONSES:
            raise ConfigError(
                f"RUTSTER_REFUSAL_RESPONSE must be one of {', '.join(REFUSAL_RESPONSES)}"
            )
        return cls(
            redis_url=redis_url,
            redis_prefix=env.get("RUTSTER_REDIS_PREFIX", "").strip() or DEFAULT_REDIS_PREFIX,
            data_dir=Path(env.get("RUTSTER_DATA_DIR", "").strip() or DEFAULT_DATA_DIR),
            admin_key=admin_key,
            prices=prices,
            prices_from_file=bool(prices_file),
            policy=policy,
            default_tenant=default_tenant,
            tenant_by_number=by_number,
            brains=brains,
            refusal_response=refusal,
            goodbye_text=env.get("RUTSTER_GOODBYE_TEXT", "").strip() or None,
            retention_s=env_int(env, "RUTSTER_RETENTION_S", DEFAULT_RETENTION_S, minimum=60),
            ledger_max_entries=env_int(
                env, "RUTSTER_LEDGER_MAX_ENTRIES", DEFAULT_LEDGER_MAX_ENTRIES, minimum=1000
            ),
            api_rate_per_s=env_float(
                env, "RUTSTER_API_RATE_PER_S", DEFAULT_RATE_PER_S, minimum=0.01
            ),
            api_burst=env_int(env, "RUTSTER_API_BURST", DEFAULT_BURST, minimum=1),
            node_id=env.get("RUTSTER_NODE_ID", "").strip() or default_node_id(),
            media_connect_timeout_s=_media_connect_timeout(env),
        )


def _media_connect_timeout(env: Mapping[str, str]) -> float:
    """``RUTSTER_MEDIA_CONNECT_TIMEOUT_S``: at most :data:`MEDIA_CONNECT_TIMEOUT_S`, which
    the stream token's lifetime is sized for (base/stream_token.py)."""
    name = "RUTSTER_MEDIA_CONNECT_TIMEOUT_S"
    value = env_float(env, name, MEDIA_CONNECT_TIMEOUT_S, minimum=MIN_MEDIA_CONNECT_TIMEOUT_S)
    if value > MEDIA_CONNECT_TIMEOUT_S:
        raise ConfigError(f"{name} must be <= {MEDIA_CONNECT_TIMEOUT_S:g}, got {value:g}")
    return value
