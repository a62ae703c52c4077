"""A SIP worker's configuration, read once from the environment (and ``rutster sip-worker`` flags).

Secrets (the gateway's ``RUTSTER_SIP_SECRET``, digest and trunk passwords) come
from an env var or a ``*_FILE`` variable and are hidden from ``repr``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rutster.base.env_values import ConfigError, env_bool, env_int, read_secret
from rutster.base.stream_token import MIN_SECRET_BYTES

#: The gateway a worker dials when nothing is configured: ``rutster serve``'s default.
DEFAULT_GATEWAY_URL = "ws://127.0.0.1:8080"
#: Where the worker listens for SIP: loopback by default, so a worker started
#: without thought is not on the internet; set RUTSTER_SIP_BIND=0.0.0.0 to serve a trunk.
DEFAULT_SIP_BIND = "127.0.0.1"
#: RFC 3261 §19.1.2: the default port for sip: over UDP and TCP.
DEFAULT_SIP_PORT = 5060
#: Sources allowed when RUTSTER_SIP_ALLOW_CIDRS is unset: loopback only (safe default;
#: an operator lists their trunk's ranges, e.g. Twilio's published signalling IPs).
DEFAULT_ALLOWED_CIDRS = ("127.0.0.0/8",)
#: Uniform answer to INVITEs that are not allowed: 403 Forbidden (RFC 3261 §21.4.4),
#: the same for every user part, so extension scanners learn nothing.
DEFAULT_REJECT_CODE = 403
#: Digest realm announced in challenges when none is configured.
DEFAULT_REALM = "rutster"
#: Non-2xx finals a worker may use as its uniform answer (RFC 3261 §21.4).
ALLOWED_REJECT_CODES = frozenset({403, 404, 480, 486, 488, 503, 603})
UNKNOWN_RESPONSES = ("reject", "drop")


@dataclass(frozen=True)
class SipWorkerSettings:
    """Everything one ``rutster sip-worker`` process needs."""

    gateway_url: str = DEFAULT_GATEWAY_URL
    sip_secret: str = field(default="", repr=False)
    bind_host: str = DEFAULT_SIP_BIND
    sip_port: int = DEFAULT_SIP_PORT
    public_host: str | None = None
    worker_id: str = ""
    allowed_cidrs: tuple[str, ...] = DEFAULT_ALLOWED_CIDRS
    digest_user: str | None = None
    digest_password: str | None = field(default=None, repr=False)
    realm: str = DEFAULT_REALM
    unknown_response: str = "reject"
    reject_code: int = DEFAULT_REJECT_CODE
    trunk_uri: str | None = None
    trunk_user: str | None = None
    trunk_password: str | None = field(default=None, repr=False)
    trunk_register: bool = False
    #: Port of the worker's Prometheus ``/metrics`` (on ``bind_host``); None = not served.
    metrics_port: int | None = None

    @property
    def control_url(self) -> str:
        """The gateway's control-channel WebSocket URL."""
        return self.gateway_url.rstrip("/") + "/sip/workers"

    @property
    def stream_url(self) -> str:
        """The gateway's per-call media WebSocket URL."""
        return self.gateway_url.rstrip("/") + "/sip/stream"

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, sip_port: int | None = None
    ) -> SipWorkerSettings:
        """Read the settings; ``sip_port`` (a CLI flag) wins over ``RUTSTER_SIP_PORT``."""
        env = os.environ if env is None else env
        gateway_url = env.get("RUTSTER_GATEWAY_URL", "").strip() or DEFAULT_GATEWAY_URL
        parts = urlsplit(gateway_url)
        if parts.scheme not in ("ws", "wss") or not parts.netloc or parts.query:
            raise ConfigError(
                f"RUTSTER_GATEWAY_URL must be a ws(s):// base URL, got {gateway_url!r}"
            )
        secret = read_secret(env, "RUTSTER_SIP_SECRET")
        if secret is None or len(secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                "RUTSTER_SIP_SECRET (or RUTSTER_SIP_SECRET_FILE) must be set to the gateway's "
                f"SIP secret, at least {MIN_SECRET_BYTES} bytes"
            )
        port = (
            sip_port if sip_port is not None else env_int(env, "RUTSTER_SIP_PORT", DEFAULT_SIP_PORT)
        )
        if not 0 <= port <= 65535:
            raise ConfigError(f"SIP port must be 0..65535, got {port}")
        raw_cidrs = env.get("RUTSTER_SIP_ALLOW_CIDRS")
        cidrs = (
            DEFAULT_ALLOWED_CIDRS
            if raw_cidrs is None
            else tuple(c.strip() for c in raw_cidrs.split(",") if c.strip())
        )
        unknown = env.get("RUTSTER_SIP_UNKNOWN", "reject").strip() or "reject"
        if unknown not in UNKNOWN_RESPONSES:
            raise ConfigError(f"RUTSTER_SIP_UNKNOWN must be reject or drop, got {unknown!r}")
        reject_code = env_int(env, "RUTSTER_SIP_REJECT_CODE", DEFAULT_REJECT_CODE)
        if reject_code not in ALLOWED_REJECT_CODES:
            raise ConfigError(
                f"RUTSTER_SIP_REJECT_CODE must be one of {sorted(ALLOWED_REJECT_CODES)}"
            )
        digest_user = env.get("RUTSTER_SIP_DIGEST_USER", "").strip() or None
        digest_password = read_secret(env, "RUTSTER_SIP_DIGEST_PASSWORD")
        if (digest_user is None) != (digest_password is None):
            raise ConfigError("set both RUTSTER_SIP_DIGEST_USER and RUTSTER_SIP_DIGEST_PASSWORD")
        if not cidrs and digest_user is None:
            raise ConfigError(
                "RUTSTER_SIP_ALLOW_CIDRS is empty and no digest credentials are set: the "
                "worker would take INVITEs from anyone; set one or both"
            )
        trunk_uri = env.get("RUTSTER_SIP_TRUNK_URI", "").strip() or None
        if trunk_uri is not None and not trunk_uri.lower().startswith(("sip:", "sips:")):
            raise ConfigError(f"RUTSTER_SIP_TRUNK_URI must be a sip: URI, got {trunk_uri!r}")
        bind = env.get("RUTSTER_SIP_BIND", "").strip() or DEFAULT_SIP_BIND
        return cls(
            gateway_url=gateway_url,
            sip_secret=secret,
            bind_host=bind,
            sip_port=port,
            public_host=env.get("RUTSTER_SIP_PUBLIC_HOST", "").strip() or None,
            worker_id=env.get("RUTSTER_SIP_WORKER_ID", "").strip()
            or f"{socket.gethostname()[:40]}:{port}",
            allowed_cidrs=cidrs,
            digest_user=digest_user,
            digest_password=digest_password,
            realm=env.get("RUTSTER_SIP_REALM", "").strip() or DEFAULT_REALM,
            unknown_response=unknown,
            reject_code=reject_code,
            trunk_uri=trunk_uri,
            trunk_user=env.get("RUTSTER_SIP_TRUNK_USER", "").strip() or None,
            trunk_password=read_secret(env, "RUTSTER_SIP_TRUNK_PASSWORD"),
            trunk_register=env_bool(env, "RUTSTER_SIP_TRUNK_REGISTER", False),
            metrics_port=env_int(env, "RUTSTER_SIP_METRICS_PORT", 0) or None,
        )
