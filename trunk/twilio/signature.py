"""Twilio request signatures (``X-Twilio-Signature``), checked without the Twilio SDK.

The algorithm (docs/PROVIDERS.md §1.5; twilio-python ``request_validator.py``):
the full URL Twilio requested (scheme, host, path, query string), then, for
form POSTs, every parameter name in sorted order followed by its value (a
repeated name contributes each of its distinct values, sorted), all
concatenated without separators; HMAC-SHA1 keyed with the account Auth Token;
base64. The Media Streams WebSocket upgrade is signed the same way over the
``wss://`` URL with no parameters.

Sans-I/O: callers pass the public URL (rebuilt from configuration, not from the
``Host`` header of an internal hop) and the decoded parameters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import parse_qs, urlsplit

#: HTTP header carrying the signature (Twilio docs; twilio-python ``SIGNATURE_HEADER``).
SIGNATURE_HEADER = "X-Twilio-Signature"

#: Query parameter Twilio adds to JSON-body webhooks: hex SHA-256 of the body
#: (docs/PROVIDERS.md §1.5).
BODY_SHA256_PARAM = "bodySHA256"

#: Ports Twilio may or may not write into the signed URL (twilio-python ``add_port``). Unlike
#: twilio-python, which uses 80 for every non-https scheme, the secure WebSocket scheme gets 443.
DEFAULT_PORTS: Mapping[str, int] = {"https": 443, "wss": 443, "http": 80, "ws": 80}

#: Form parameters as a mapping (a value may be a list for a repeated name) or as the list of
#: ``(name, value)`` pairs of a urlencoded body, which keeps repeated names.
SignatureParams = Mapping[str, str | Sequence[str]] | Sequence[tuple[str, str]]


class TwilioSignatureValidator:
    """Computes and checks ``X-Twilio-Signature`` values for one Auth Token."""

    def __init__(self, auth_token: str) -> None:
        if not auth_token:
            raise ValueError("auth_token must not be empty")
        self._key = auth_token.encode("utf-8")

    def compute(self, url: str, params: SignatureParams | None = None) -> str:
        """Return the base64 signature Twilio would send for ``url`` and ``params``.

        Raises ``UnicodeEncodeError`` for text that is not valid Unicode (lone surrogates).
        """
        return self._sign(url.encode("utf-8"), _signed_params(params))

    def _sign(self, url: bytes, signed_params: bytes) -> str:
        mac = hmac.new(self._key, url, hashlib.sha1)
        mac.update(signed_params)
        return base64.b64encode(mac.digest()).decode("ascii")

    def validate(self, url: str, params: SignatureParams | None, signature: str | None) -> bool:
        """Check ``signature`` for a request to ``url`` carrying ``params``.

        The URL is tried as given, with the scheme's default port added and with
        any explicit port removed, because Twilio is inconsistent about writing
        ``:443``/``:80`` into the URL it signs (twilio-python does the same).
        A missing or empty signature, or a URL that cannot be parsed, is invalid.
        """
        if not signature:
            return False
        candidates = _url_variants(url)
        if not candidates:
            return False
        presented = signature.encode("utf-8", "surrogatepass")
        valid = False
        try:
            # The parameters are the same under every URL variant: sorted and joined once.
            signed_params = _signed_params(params)
            urls = [candidate.encode("utf-8") for candidate in candidates]
        except UnicodeEncodeError:  # a lone surrogate: nothing Twilio could have signed
            return False
        for candidate in urls:
            expected = self._sign(candidate, signed_params).encode("ascii")
            # No short-circuit: every variant costs the same whether or not an earlier one matched.
            valid |= hmac.compare_digest(expected, presented)
        return valid

    def validate_json_body(
        self, url_with_body_sha256: str, body: bytes, signature: str | None
    ) -> bool:
        """Check a JSON-body webhook: the URL's ``bodySHA256`` must hash ``body``.

        The signature covers the URL only (empty parameters); the body is bound to
        it through the hex SHA-256 in the ``bodySHA256`` query parameter.
        """
        try:
            query = parse_qs(urlsplit(url_with_body_sha256).query)
        except ValueError:
            return False
        claimed = query.get(BODY_SHA256_PARAM)
        if not claimed:
            return False
        body_ok = hmac.compare_digest(
            hashlib.sha256(body).hexdigest().encode("ascii"),
            claimed[0].encode("utf-8", "surrogatepass"),
        )
        signature_ok = self.validate(url_with_body_sha256, None, signature)
        return body_ok and signature_ok


def _signed_params(params: SignatureParams | None) -> bytes:
    """What follows the URL in the signed string: each name, then each of its values."""
    parts: list[str] = []
    for name, values in sorted(_group_params(params).items()):
        # Distinct values only: twilio-python and twilio-node both de-duplicate (a set).
        for value in sorted(values):
            parts.append(name)
            parts.append(value)
    return "".join(parts).encode("utf-8")


def _group_params(params: SignatureParams | None) -> dict[str, set[str]]:
    """Collect the distinct values of each parameter name."""
    grouped: dict[str, set[str]] = {}
    if params is None:
        return grouped
    pairs: Iterable[tuple[str, str | Sequence[str]]]
    if isinstance(params, Mapping):
        getlist = getattr(params, "getlist", None)
        if callable(getlist):
            # Multi-dicts (Starlette FormData, Django QueryDict) keep repeated names behind getlist.
            pairs = [(name, list(getlist(name))) for name in params]
        else:
            pairs = params.items()
    else:
        pairs = params
    for name, value in pairs:
        bucket = grouped.setdefault(name, set())
        if isinstance(value, str):
            bucket.add(value)
        else:
            bucket.update(value)
    return grouped


def _url_variants(url: str) -> list[str]:
    """``url`` as given, with the default port added and with the port removed.

    The netloc is replaced in place, so the rest of the URL stays byte-identical
    (``urlunsplit`` would normalise it, e.g. drop an empty ``?``). An unparsable
    URL (bad port, malformed IPv6 host) yields no variants.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return []
    variants = [url]
    netloc = parts.netloc
    start = url.find("//")
    if not netloc or start < 0 or url[start + 2 : start + 2 + len(netloc)] != netloc:
        return variants
    prefix, suffix = url[: start + 2], url[start + 2 + len(netloc) :]
    userinfo, at, hostport = netloc.rpartition("@")
    if port is not None:
        host = hostport.rpartition(":")[0]
        variants.append(prefix + userinfo + at + host + suffix)
    else:
        default = DEFAULT_PORTS.get(parts.scheme)
        if default is not None:
            host = hostport.removesuffix(":")  # "host:" has an empty port
            variants.append(f"{prefix}{userinfo}{at}{host}:{default}{suffix}")
    return variants
