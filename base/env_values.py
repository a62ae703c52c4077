"""Reading typed values and secrets from the environment, with clear errors.

Shared by every settings module (:mod:`gateway.config`, :mod:`gateway.spend_settings`,
the brains' configs). Secrets come from an env var or, preferably, a ``*_FILE``
variable naming a file (container secrets); the file wins when both are set.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A configuration value is missing or malformed."""


def read_secret(env: Mapping[str, str], name: str) -> str | None:
    """Return secret ``name`` from ``NAME_FILE`` (wins) or ``NAME``; None when neither is set."""
    file_var = f"{name}_FILE"
    path = env.get(file_var)
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{file_var}: cannot read {path!r}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"{file_var}: {path!r} is not UTF-8 text (write a text secret, "
                "e.g. `openssl rand -hex 32`)"
            ) from None
        if not value:
            raise ConfigError(f"{file_var}: {path!r} is empty")
        return value
    value = env.get(name, "").strip()
    return value or None


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    """Integer ``name`` (``default`` when unset or blank), at least ``minimum``."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """On/off ``name`` (on/off, true/false, yes/no, 1/0); ``default`` when unset."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    raise ConfigError(f"{name} must be on/off (or true/false, 1/0), got {raw!r}")


def env_float(
    env: Mapping[str, str], name: str, default: float, *, minimum: float | None = None
) -> float:
    """Number ``name`` (``default`` when unset or blank), at least ``minimum`` when given."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and not value >= minimum:  # also refuses NaN
        raise ConfigError(f"{name} must be >= {minimum}, got {raw!r}")
    return value


def env_pairs(env: Mapping[str, str], name: str) -> dict[str, str]:
    """``KEY=VALUE,KEY=VALUE`` from ``name`` (empty when unset)."""
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in env.get(name, "").split(","))):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"{name} entries are KEY=VALUE, got {entry!r}")
        out[key.strip()] = value.strip()
    return out


def env_http_url(env: Mapping[str, str], name: str, default: str) -> str:
    """An http(s) base URL from ``name`` (``default`` when unset), without a trailing slash."""
    value = env.get(name, "").strip() or default
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{name} must be an http(s) URL, got {value!r}")
    return value.rstrip("/")
