"""Where the ``transfer`` tool may send a caller (``RUTSTER_TRANSFER_ALLOWLIST``).

A brain is outside the trust boundary (docs/ARCHITECTURE.md): a prompt-injected
model must not be able to forward callers to a premium-rate number. Only
destinations the operator lists are allowed; an empty list allows none.

Entries, comma-separated:

- ``+15551234567`` — exactly that E.164 number;
- ``+1555*`` — any E.164 number starting with ``+1555`` (a trailing ``*`` only);
- ``sip:desk@pbx.example.com`` — exactly that SIP URI (``sips:`` likewise),
  compared case-insensitively in the scheme and host as RFC 3261 §19.1.4 says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: E.164: a '+', then up to 15 digits, the first not 0 (ITU-T E.164 §6).
E164 = re.compile(r"\+[1-9][0-9]{1,14}")
_E164_PREFIX = re.compile(r"\+[0-9]{0,15}")
_SIP_URI = re.compile(r"(sips?):([^@\s]+)@([A-Za-z0-9.\-\[\]:]+)(;[^\s]*)?", re.IGNORECASE)


def normalize_destination(destination: str) -> str:
    """The canonical form used for comparison; ``ValueError`` if it is neither E.164 nor SIP."""
    text = destination.strip()
    if E164.fullmatch(text):
        return text
    match = _SIP_URI.fullmatch(text)
    if match:
        scheme, user, host, params = match.groups()
        return f"{scheme.lower()}:{user}@{host.lower()}{params or ''}"
    raise ValueError(
        f"{destination[:64]!r} is neither an E.164 number (+15551234567) nor a sip: URI"
    )


@dataclass(frozen=True)
class TransferAllowlist:
    """The parsed allowlist; :meth:`allows` answers for one destination."""

    exact: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> TransferAllowlist:
        """Parse the env var's value; ``ValueError`` names a bad entry."""
        exact: set[str] = set()
        prefixes: list[str] = []
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            if entry.endswith("*"):
                prefix = entry[:-1]
                if not _E164_PREFIX.fullmatch(prefix) or len(prefix) < 2:
                    raise ValueError(
                        f"bad transfer allowlist entry {entry!r}: wildcards are for E.164 "
                        "prefixes only, e.g. +1555*"
                    )
                prefixes.append(prefix)
                continue
            try:
                exact.add(normalize_destination(entry))
            except ValueError as exc:
                raise ValueError(f"bad transfer allowlist entry: {exc}") from None
        return cls(frozenset(exact), tuple(prefixes))

    def allows(self, destination: str) -> bool:
        """True if ``destination`` may be dialled (False for malformed input too)."""
        try:
            canonical = normalize_destination(destination)
        except ValueError:
            return False
        if canonical in self.exact:
            return True
        return E164.fullmatch(canonical) is not None and any(
            canonical.startswith(p) for p in self.prefixes
        )

    def __bool__(self) -> bool:
        return bool(self.exact or self.prefixes)
