"""Plivo webhook signatures, V3: HMAC-SHA256 over the URL, the parameters and a nonce
(docs/PROVIDERS.md §4.5).

Plivo signs every callback with the account's (or sub-account's) auth token:
``X-Plivo-Signature-V3`` holds one or more comma-separated base64 signatures and
``X-Plivo-Signature-V3-Nonce`` the nonce. The signed string is built from the
callback URL (scheme, host and path; its query re-added sorted as ``k=v&...``) and,
for a POST with a body, ``?`` or ``.`` and the body's parameters sorted by name as
``namevalue`` with no separators; then ``"." + nonce``. Written here because no
library outside Plivo's own SDK (which pulls in requests and lxml) does it; the
suite checks it against plivo-python's ``validate_v3_signature``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qs, urlsplit, urlunsplit

__all__ = [
    "NONCE_HEADER",
    "SIGNATURE_HEADER",
    "PlivoSignatureV3",
]

#: Headers of a V3 signature (§4.5; plivo-python ``validate_v3_signature`` arguments).
SIGNATURE_HEADER = "X-Plivo-Signature-V3"
NONCE_HEADER = "X-Plivo-Signature-V3-Nonce"
#: Most signatures one header may list (Plivo sends one per token that may verify it:
#: account and sub-account; 8 is ample and bounds the work a forged header can cause).
MAX_SIGNATURES = 8

Params = Mapping[str, str | Sequence[str]]


def _sorted_query(params: Mapping[str, Sequence[str]]) -> str:
    """``k=v`` pairs sorted by key (a key's values sorted too), joined by ``&``."""
    return "&".join(f"{k}={v}" for k in sorted(params) for v in sorted(params[k]))


def _sorted_params(params: Params) -> str:
    """``keyvalue`` pairs sorted by key (a key's values sorted too), concatenated."""
    parts: list[str] = []
    for key in sorted(params):
        value = params[key]
        values = [value] if isinstance(value, str) else sorted(value)
        parts.extend(f"{key}{v}" for v in values)
    return "".join(parts)


def signed_string(method: str, url: str, params: Params) -> str:
    """The string Plivo signs (before ``"." + nonce``), as plivo-python builds it."""
    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    query = parse_qs(parts.query, keep_blank_values=True)
    if method.upper() == "GET":
        merged: dict[str, list[str]] = {k: list(v) for k, v in query.items()}
        for key, value in params.items():
            merged[key] = [value] if isinstance(value, str) else list(value)
        sorted_query = _sorted_query(merged)
        return base + ("?" + sorted_query if sorted_query else "")
    sorted_query = _sorted_query(query)
    if not params:  # a POST without parameters is signed as a GET without any
        return base + ("?" + sorted_query if sorted_query else "")
    return base + "?" + sorted_query + ("." if sorted_query else "") + _sorted_params(params)


class PlivoSignatureV3:
    """Computes and checks V3 signatures with one auth token."""

    def __init__(self, auth_token: str) -> None:
        if not auth_token:
            raise ValueError("the Plivo auth token is empty")
        self._key = auth_token.encode("utf-8")

    def compute(self, method: str, url: str, params: Params, nonce: str) -> str:
        """The base64 signature of a request (what Plivo puts in the header)."""
        message = f"{signed_string(method, url, params)}.{nonce}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.b64encode(digest).decode("ascii")

    def validate(
        self, method: str, url: str, params: Params, nonce: str | None, header: str | None
    ) -> bool:
        """Whether ``header`` holds the request's signature (compared in constant time)."""
        if not nonce or not header:
            return False
        expected = self.compute(method, url, params, nonce).encode("ascii")
        candidates = header.split(",")[:MAX_SIGNATURES]
        return any(hmac.compare_digest(expected, c.strip().encode()) for c in candidates)
