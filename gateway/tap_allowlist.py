"""Which brain URLs the core may dial (the SSRF guard).

The core dials out to brains. A tap URL chosen per number or per call (rather
than the configured default) is dialled only if it is on the allowlist, so a
webhook parameter can never make the gateway connect to an arbitrary host.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

#: Brains are reached over WebSocket only (TAP_PROTOCOL.md, Transport).
TAP_SCHEMES = ("ws", "wss")
_DEFAULT_PORTS = {"ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class _Origin:
    scheme: str
    host: str
    port: int
    path_prefix: str


def _parse(url: str) -> _Origin | None:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in TAP_SCHEMES or not parts.hostname:
        return None
    if parts.username or parts.password or parts.query or parts.fragment:
        return None
    # Dot segments and escapes could walk out of an allowed path prefix on the server.
    if "%" in parts.path or any(seg in (".", "..") for seg in parts.path.split("/")):
        return None
    return _Origin(
        scheme=parts.scheme,
        host=parts.hostname.lower(),
        port=port if port is not None else _DEFAULT_PORTS[parts.scheme],
        path_prefix=parts.path or "/",
    )


@dataclass(frozen=True)
class TapUrlAllowlist:
    """Exact origins plus path prefixes a tap URL must match.

    An entry ``ws://brains.internal:8082/`` allows every path on that origin;
    ``ws://127.0.0.1:8081/echo`` allows that path (and sub-paths) only.
    Scheme, host and port must match exactly; URLs with credentials, a query
    or a fragment are never allowed.
    """

    entries: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str, *, default: str | None = None) -> TapUrlAllowlist:
        """Parse a comma-separated list; ``default`` (the configured tap URL) is always allowed."""
        entries = [e.strip() for e in raw.split(",") if e.strip()]
        if default:
            entries.append(default)
        for entry in entries:
            if _parse(entry) is None:
                raise ValueError(f"not a ws:// or wss:// URL prefix: {entry!r}")
        return cls(tuple(entries))

    def allows(self, url: str) -> bool:
        """True when ``url`` is a ws(s) URL matching an entry."""
        candidate = _parse(url)
        if candidate is None:
            return False
        for entry in self.entries:
            allowed = _parse(entry)
            if allowed is None:
                continue
            if (candidate.scheme, candidate.host, candidate.port) != (
                allowed.scheme,
                allowed.host,
                allowed.port,
            ):
                continue
            prefix = allowed.path_prefix
            path = candidate.path_prefix
            if path == prefix or path.startswith(prefix.rstrip("/") + "/") or prefix == "/":
                return True
        return False
