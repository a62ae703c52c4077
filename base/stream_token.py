"""Per-call Media Streams tokens: defence in depth behind the WebSocket signature.

Twilio ``<Stream>`` URLs cannot carry a query string (docs/PROVIDERS.md §1.2), so the
voice webhook puts a token in a ``<Parameter>`` and the media socket checks it
on ``start`` (``start.customParameters``). The token is an HMAC over the CallSid,
the brain's tap URL *and* the call's admission context (call id, tenant, caps),
so a media socket holding a valid token for its call still cannot swap in
another brain, claim another call's reservation, or lift its own caps.

Format (``v2``): ``<expires_at>.<mac>`` — ``expires_at`` is the token's expiry in
unix seconds (decimal, canonical), ``mac`` the unpadded base64url HMAC-SHA256 of
``rutster-stream-v2\\n<expires_at>\\n<call_sid>\\n<tap_url>\\n<context>``. The
expiry is inside the MAC, so it cannot be pushed back; it is checked against the
verifying node's wall clock (gateways keep their clocks NTP-synced, as the spend
store already requires). Using a token only once is not this module's job: the
media socket claims it (gateway/stream_claims.py).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import time
from dataclasses import dataclass

#: ``<Parameter>`` name carrying the token into ``start.customParameters``.
PARAM_TOKEN = "rutster_token"

#: Shortest secret accepted: 128 bits, the security level HMAC-SHA256 is used at here
#: (NIST SP 800-107 r1 §5.3.4: key strength must be at least the desired security strength).
MIN_SECRET_BYTES = 16

#: Domain separation, so a MAC computed for another purpose with the same secret never
#: verifies. v2: the expiry joined the MAC'd message (v1 tokens had none and never expired).
TOKEN_DOMAIN = b"rutster-stream-v2\n"

#: How long a token admits its media socket after it is issued, seconds. The longest
#: legitimate wait between issuing and the socket's ``start`` is an outbound SIP call:
#: the token goes out with the dial order, the callee rings for up to
#: gateway/providers/sip.py SIP_RING_TIMEOUT_S (30 s), and the worker then opens
#: the stream, which is given gateway/spend_settings.py MEDIA_CONNECT_TIMEOUT_S (30 s)
#: before the admission is released. 30 + 30 = 60 s; Twilio (stream opened a second or
#: two after our TwiML) and inbound SIP (answered, then streamed at once) need far less.
#: A token outliving that would only ever admit sockets for calls already released.
#: (Literal, not imported: gateway/providers/sip.py imports this module; a unit
#: test holds it to the sum.)
STREAM_TOKEN_LIFETIME_S = 60

#: Separator between the fields inside the MAC'd message.
_FIELD_SEPARATOR = b"\n"
#: Separator between the expiry and the MAC in the token text (in neither alphabet).
_TOKEN_SEPARATOR = "."
#: The expiry as written by :meth:`StreamTokenSigner.issue`: canonical decimal unix
#: seconds, no sign, no leading zero; 12 digits reach far past any real clock.
_EXPIRY_PATTERN = re.compile(r"[1-9][0-9]{0,11}")


class TokenStatus(enum.Enum):
    """What checking a stream token found."""

    VALID = "valid"
    #: Missing, malformed, forged, or issued for another call, brain or context.
    INVALID = "invalid"
    #: Authentic, but past its expiry.
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class TokenCheck:
    """The verdict on one token, and (when authentic) when it expires."""

    status: TokenStatus
    #: Unix seconds the token expires at; 0 when it is not authentic.
    expires_at_s: int = 0

    @property
    def ok(self) -> bool:
        """True when the token is authentic and not expired."""
        return self.status is TokenStatus.VALID


class StreamTokenSigner:
    """Issues and verifies the per-call stream token."""

    def __init__(self, secret: bytes, *, lifetime_s: int = STREAM_TOKEN_LIFETIME_S) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"stream token secret must be at least {MIN_SECRET_BYTES} bytes")
        if lifetime_s < 1:
            raise ValueError("stream token lifetime must be at least 1 s")
        self._secret = secret
        self._lifetime_s = lifetime_s

    def issue(
        self, call_sid: str, tap_url: str, context: str = "", *, now_s: float | None = None
    ) -> str:
        """Return the token binding ``call_sid``, ``tap_url``, ``context`` and its expiry.

        The token expires ``lifetime_s`` after ``now_s`` (unix seconds; default: now).
        Raises ``ValueError`` if ``call_sid`` or ``tap_url`` contains a newline, which
        would make the message ambiguous (CallSids are ``CA`` + 32 hex digits).
        """
        if "\n" in call_sid or "\n" in tap_url:
            raise ValueError("call_sid and tap_url must not contain a newline")
        issued = time.time() if now_s is None else now_s
        return self._token(int(issued) + self._lifetime_s, call_sid, tap_url, context)

    def check(
        self,
        token: str | None,
        call_sid: str,
        tap_url: str,
        context: str = "",
        *,
        now_s: float | None = None,
    ) -> TokenCheck:
        """Whether ``token`` was issued for exactly this ``call_sid``, ``tap_url`` and
        ``context``, and is not expired at ``now_s`` (unix seconds; default: now).

        The MAC comparison is constant time in the token's content; a missing,
        malformed or wrong-length token is simply invalid. Expiry is only reported
        for authentic tokens, so a forged one never learns more than "invalid".
        """
        if not token or "\n" in call_sid or "\n" in tap_url:
            return TokenCheck(TokenStatus.INVALID)
        expiry_text, separator, _ = token.partition(_TOKEN_SEPARATOR)
        if not separator or not _EXPIRY_PATTERN.fullmatch(expiry_text):
            return TokenCheck(TokenStatus.INVALID)
        expires_at = int(expiry_text)
        expected = self._token(expires_at, call_sid, tap_url, context).encode("ascii")
        # Compare the canonical encoding: base64 variants with other padding bits never match.
        if not hmac.compare_digest(expected, token.encode("utf-8", "surrogatepass")):
            return TokenCheck(TokenStatus.INVALID)
        now = time.time() if now_s is None else now_s
        if now >= expires_at:
            return TokenCheck(TokenStatus.EXPIRED, expires_at)
        return TokenCheck(TokenStatus.VALID, expires_at)

    def verify(
        self,
        token: str | None,
        call_sid: str,
        tap_url: str,
        context: str = "",
        *,
        now_s: float | None = None,
    ) -> bool:
        """True if ``token`` is authentic for these fields and not expired (see :meth:`check`)."""
        return self.check(token, call_sid, tap_url, context, now_s=now_s).ok

    def _token(self, expires_at: int, call_sid: str, tap_url: str, context: str) -> str:
        expiry = str(expires_at)
        # The expiry goes first: it is digits only, so no field boundary can shift into it.
        message = (
            TOKEN_DOMAIN
            + expiry.encode("ascii")
            + _FIELD_SEPARATOR
            + call_sid.encode("utf-8", "surrogatepass")
            + _FIELD_SEPARATOR
            + tap_url.encode("utf-8", "surrogatepass")
            + _FIELD_SEPARATOR
            + context.encode("utf-8", "surrogatepass")
        )
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        mac = base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
        return expiry + _TOKEN_SEPARATOR + mac
