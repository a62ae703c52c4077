"""Per-call Media Streams tokens: defence in depth behind the WebSocket signature.

Twilio ``<Stream>`` URLs cannot carry a query string (PROVIDERS.md §1.2), so the
voice webhook puts a token in a ``<Parameter>`` and the media socket checks it
on ``start`` (``start.customParameters``). The token is an HMAC over the CallSid,
the brain's tap URL *and* the call's admission context (call id, tenant, caps),
so a media socket holding a valid token for its call still cannot swap in
another brain, claim another call's reservation, or lift its own caps.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

#: ``<Parameter>`` name carrying the token into ``start.customParameters``.
PARAM_TOKEN = "rutster_token"

#: Shortest secret accepted: 128 bits, the security level HMAC-SHA256 is used at here
#: (NIST SP 800-107 r1 §5.3.4: key strength must be at least the desired security strength).
MIN_SECRET_BYTES = 16

#: Domain separation, so a MAC computed for another purpose with the same secret never verifies.
TOKEN_DOMAIN = b"rutster-stream-v1\n"

#: Separator between the CallSid and the tap URL inside the MAC'd message.
_FIELD_SEPARATOR = b"\n"


class StreamTokenSigner:
    """Issues and verifies the per-call stream token."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"stream token secret must be at least {MIN_SECRET_BYTES} bytes")
        self._secret = secret

    def issue(self, call_sid: str, tap_url: str, context: str = "") -> str:
        """Return the token binding ``call_sid`` to ``tap_url`` and ``context`` (base64url).

        Raises ``ValueError`` if ``call_sid`` or ``tap_url`` contains a newline, which
        would make the message ambiguous (CallSids are ``CA`` + 32 hex digits).
        """
        if "\n" in call_sid or "\n" in tap_url:
            raise ValueError("call_sid and tap_url must not contain a newline")
        return self._token(call_sid, tap_url, context)

    def verify(self, token: str | None, call_sid: str, tap_url: str, context: str = "") -> bool:
        """True if ``token`` was issued for exactly this ``call_sid``, ``tap_url`` and ``context``.

        Constant time in the token's content; a missing, malformed or wrong-length
        token is simply invalid.
        """
        if not token or "\n" in call_sid or "\n" in tap_url:
            return False
        expected = self._token(call_sid, tap_url, context).encode("ascii")
        # Compare the canonical encoding: base64 variants with other padding bits never match.
        return hmac.compare_digest(expected, token.encode("utf-8", "surrogatepass"))

    def _token(self, call_sid: str, tap_url: str, context: str) -> str:
        message = (
            TOKEN_DOMAIN
            + call_sid.encode("utf-8", "surrogatepass")
            + _FIELD_SEPARATOR
            + tap_url.encode("utf-8", "surrogatepass")
            + _FIELD_SEPARATOR
            + context.encode("utf-8", "surrogatepass")
        )
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
