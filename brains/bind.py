"""Where a brain process listens: parsing its bind address.

A brain takes its address from the command line or ``RUTSTER_BRAIN_BIND`` in
any of these forms: ``host:port``, ``:port`` (default host), ``[::1]:port``
(IPv6 in brackets), or a ``ws://host[:port][/path]`` URL (the path is
ignored: each brain serves its own fixed path).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

#: Environment variable a brain process reads its bind address from.
BRAIN_BIND_ENV = "RUTSTER_BRAIN_BIND"
#: Highest TCP port number (RFC 793: 16-bit port field).
MAX_PORT = 65_535
#: A DNS name or IPv4 literal (RFC 1123 §2.1 letters, digits, hyphens, dots).
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_FORMS = "host:port, :port, [::1]:port or ws://host:port[/path]"


def _port(text: str, value: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"bad bind address {value!r}: port {text!r} is not a number")
    port = int(text)
    if port > MAX_PORT:
        raise ValueError(f"bad bind address {value!r}: port {port} is over {MAX_PORT}")
    return port


def _host(text: str, value: str) -> str:
    if text.startswith("[") and text.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(text[1:-1]))
        except ValueError:
            raise ValueError(
                f"bad bind address {value!r}: {text!r} is not an IPv6 address"
            ) from None
    if not _HOSTNAME.fullmatch(text):
        hint = " (put IPv6 addresses in brackets: [::1]:8081)" if ":" in text else ""
        raise ValueError(f"bad bind address {value!r}: bad host {text!r}{hint}")
    return text


def parse_bind(value: str | None, *, default_host: str, default_port: int) -> tuple[str, int]:
    """Parse a brain's bind address into ``(host, port)``.

    ``None`` or a blank string gives the defaults. An IPv6 host comes back
    without brackets. Port 0 is allowed (the OS picks one). Anything else
    raises ``ValueError`` naming the accepted forms.
    """
    if value is None or not value.strip():
        return default_host, default_port
    text = value.strip()
    if "://" in text:
        return _parse_url(text, value, default_port)
    host, sep, port = text.rpartition(":")
    if not sep:
        hint = f" (for a port alone write ':{text}')" if text.isdigit() else ""
        raise ValueError(f"bad bind address {value!r}: no port{hint}; use {_FORMS}")
    if "]" in port:  # "[::1]" alone: the last ':' was inside the brackets
        raise ValueError(f"bad bind address {value!r}: no port; use {_FORMS}")
    return (_host(host, value) if host else default_host), _port(port, value)


def _parse_url(text: str, value: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(text)
    if parts.scheme == "wss":
        raise ValueError(
            f"bad bind address {value!r}: brains listen on plain ws:// "
            "(terminate TLS in front of them)"
        )
    if parts.scheme != "ws":
        raise ValueError(f"bad bind address {value!r}: scheme must be ws://; use {_FORMS}")
    if parts.username is not None or parts.query or parts.fragment:
        raise ValueError(f"bad bind address {value!r}: no credentials, query or fragment")
    netloc = parts.netloc
    host_part, sep, port_part = netloc.rpartition(":")
    if not sep or "]" in port_part:  # no port given
        host_part, port_part = netloc, ""
    if not host_part:
        raise ValueError(f"bad bind address {value!r}: no host; use {_FORMS}")
    host = _host(host_part, value)
    return host, (_port(port_part, value) if port_part else default_port)


def ws_url(host: str, port: int, path: str) -> str:
    """The ``ws://`` URL a listener on ``host:port`` serves ``path`` at."""
    shown = f"[{host}]" if ":" in host else host
    return f"ws://{shown}:{port}{path}"
