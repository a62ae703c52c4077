"""Take out credentials pjsip cannot parse, so such a request is answered instead of lost.

Why: pjsip reads ``Authorization`` and ``Proxy-Authorization`` only in the Digest scheme. A
request carrying any other scheme (``Basic``, ``Bearer``) fails to parse and pjsip drops it
whole, before pjsua2 sees it: nothing answers, and the caller retransmits for 32 s (RFC 3261
Timer B). RFC 3261 §22.1 forbids accepting Basic anyway ("MUST NOT"), and §22.4 makes Digest the
one scheme of SIP, so credentials in another scheme can never authenticate here.

What: :func:`strip_non_digest_credentials` takes the text of a request pjsip refused and returns
it without those header fields (continuation lines included), every other byte unchanged. The
SIP worker hands the shorter request back to pjsip (``trunk/sip/pj_dropped_packets.py``), which
parses it with the packet's real source: the request then takes the normal path (kernel source
filter, access policy, rejection cache) as a request that brought no credentials. Digest
credentials are always kept, and nothing else is ever changed: a request that fails to parse
for another reason gets ``None`` and stays dropped.

Sans-I/O: bytes in, bytes out. No credential value is kept or returned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CREDENTIAL_HEADERS",
    "OTHER_SCHEME_LABEL",
    "StrippedCredentials",
    "strip_non_digest_credentials",
]

#: The header fields that carry credentials (RFC 3261 §20.7 and §20.28); neither has a compact
#: form (RFC 3261 §7.3.3).
CREDENTIAL_HEADERS = frozenset({b"authorization", b"proxy-authorization"})

#: The one scheme pjsip parses in those fields (RFC 3261 §22.4).
_DIGEST = b"digest"

#: Schemes named in metrics and logs; any other is reported as ``other`` so a peer cannot
#: invent label values (Basic: RFC 7617, Bearer: RFC 6750).
_KNOWN_SCHEMES = frozenset({"basic", "bearer"})
#: The label of every scheme outside ``_KNOWN_SCHEMES``.
OTHER_SCHEME_LABEL = "other"

#: RFC 3261 §7.1 Request-Line: Method SP Request-URI SP SIP-Version. Method is a token (§25.1).
_REQUEST_LINE = re.compile(rb"^[A-Za-z0-9.!%*_+`'~-]+ [^ \r\n]+ SIP/2\.0\r?\n")
#: One line with its terminator (pjsip accepts bare LF as well as CRLF).
_LINE = re.compile(rb"[^\n]*\n|[^\n]+$")


@dataclass(frozen=True, slots=True)
class StrippedCredentials:
    """A request without its non-Digest credential fields.

    ``message`` is strictly shorter than the original; ``schemes`` names what was removed,
    lower-case, each ``basic``, ``bearer`` or ``other``.
    """

    message: bytes
    schemes: tuple[str, ...]


def strip_non_digest_credentials(packet: bytes) -> StrippedCredentials | None:
    """``packet`` without its non-Digest ``Authorization``/``Proxy-Authorization`` fields.

    ``None`` when ``packet`` is not a request or carries no such field: it was refused for
    another reason, which this module does not touch.
    """
    if _REQUEST_LINE.match(packet) is None:
        return None
    kept: list[bytes] = []
    schemes: list[str] = []
    removing = False
    position = 0
    in_headers = True
    for match in _LINE.finditer(packet):
        line = match.group()
        position = match.end()
        if not kept:  # the request line
            kept.append(line)
            continue
        if line in (b"\r\n", b"\n"):  # the blank line: the body follows untouched
            kept.append(line)
            in_headers = False
            break
        if line[:1] in (b" ", b"\t"):  # a continuation of the field above (RFC 3261 §7.3.1)
            if not removing:
                kept.append(line)
            continue
        scheme = _non_digest_scheme(line)
        removing = scheme is not None
        if scheme is None:
            kept.append(line)
        else:
            schemes.append(scheme)
    if not schemes:
        return None
    rest = packet[position:] if not in_headers else b""
    return StrippedCredentials(b"".join(kept) + rest, tuple(schemes))


def _non_digest_scheme(line: bytes) -> str | None:
    """The scheme label when ``line`` starts a credential field in a scheme other than Digest."""
    name, colon, value = line.partition(b":")
    if not colon or name.strip().lower() not in CREDENTIAL_HEADERS:
        return None
    scheme = value.strip().split(None, 1)[0].lower() if value.strip() else b""
    if scheme == _DIGEST:
        return None
    label = scheme.decode("ascii", errors="replace")
    return label if label in _KNOWN_SCHEMES else OTHER_SCHEME_LABEL
