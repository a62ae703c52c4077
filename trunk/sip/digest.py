"""Server-side SIP digest authentication (RFC 3261 §22.4, RFC 7616, RFC 8760), sans-I/O.

Hand-written on purpose: no maintained Python library implements the *server* side of SIP
digest (the HTTP ones are client-only or tied to a web framework, and pjsua2 only answers
challenges, it does not issue or check them). The subset is deliberately small:

- ``qop="auth"`` only. Without ``qop`` there is no nonce count, so a captured response could be
  replayed at will; every current SIP stack (pjsip, Asterisk, Kamailio, Linphone) sends qop.
  ``auth-int``, the ``-sess`` algorithms and ``userhash`` are refused with a reason label.
- Algorithms SHA-256 (RFC 7616, RFC 8760) and MD5 (RFC 3261, kept for old trunks), offered in
  that order because RFC 7616 §3.7 has the server list its preferred algorithm first.
- Stateless nonces: ``base64url(timestamp_ms | salt | HMAC-SHA256(secret, realm | timestamp |
  salt)[:16])``. Any worker sharing the secret can check a nonce; changing the secret (or a
  restart with a fresh random secret) invalidates every outstanding nonce. A nonce older than
  ``nonce_ttl_s`` is answered with ``stale=true`` so the client retries without asking its user.
- Replays: each accepted ``(nonce, nc)`` pair is remembered until the nonce expires, in a bounded
  cache (only requests with valid credentials can add to it, so a flood cannot evict entries).

Time is always an argument (``now_s``, wall-clock seconds so nonces survive a restart when the
secret does). Bad input never raises from :meth:`DigestAuthenticator.verify`: it returns a
:class:`DigestVerdict` with a low-cardinality ``reason`` label suitable for metrics.
The password is reduced to the per-algorithm ``HA1`` at construction and never kept, logged
or shown in ``repr``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

#: Nonce lifetime: Asterisk res_pjsip's ``nonce_lifetime`` default (32 s). An INVITE is retried
#: with credentials right after the 401, so anything longer only widens the replay window.
DEFAULT_NONCE_TTL_S = 32.0

#: Accepted clock step backwards before a nonce from "the future" is treated as stale: one NTP
#: slew/step of ordinary size; anything larger gets a fresh (stale=true) challenge, not an error.
NONCE_FUTURE_TOLERANCE_S = 2.0

#: Remembered ``(nonce, nc)`` pairs. Entries live one nonce TTL; a SIP worker holds at most 4 calls
#: (the pjsua2 wheel's limit, see docs/SIP.md), so 4096 entries cover >100 authenticated requests
#: per second per worker, far above what it can serve, for about 0.5 MB.
DEFAULT_REPLAY_CACHE_SIZE = 4096

#: Offered algorithms, preferred first (RFC 7616 §3.7, RFC 8760 §2.4: SHA-256 before MD5).
DEFAULT_ALGORITHMS: tuple[str, ...] = ("SHA-256", "MD5")

#: Algorithms this module can verify, by their RFC 7616 names (upper case) -> hashlib name.
SUPPORTED_ALGORITHMS: dict[str, str] = {"MD5": "md5", "SHA-256": "sha256"}

#: Shortest nonce secret accepted: 128 bits, the security level HMAC-SHA256 is used at here
#: (NIST SP 800-107 r1 §5.3.4), same rule as the stream-token secret.
MIN_NONCE_SECRET_BYTES = 16

#: Longest Authorization value parsed. Real digest headers are ~300-500 characters; the cap
#: bounds parsing work per packet when a scanner sends a megabyte of garbage.
MAX_AUTHORIZATION_LENGTH = 4096

#: HMAC tag length kept in the nonce: 128 bits (NIST SP 800-107 r1 §5.3.4 truncation >= 64 bits).
_NONCE_MAC_BYTES = 16
#: Random salt so two challenges issued in the same millisecond differ (48 bits is plenty: it only
#: has to separate nonces; unforgeability comes from the MAC).
_NONCE_SALT_BYTES = 6
#: Timestamp field: unsigned 64-bit big-endian milliseconds.
_NONCE_TS = struct.Struct(">Q")
_NONCE_RAW_BYTES = _NONCE_TS.size + _NONCE_SALT_BYTES + _NONCE_MAC_BYTES
#: Domain separation, so a MAC made with the same secret for another purpose never verifies.
_NONCE_DOMAIN = b"rutster-sip-digest-nonce-v1\n"

#: Parameters a qop=auth response must carry (RFC 7616 §3.4, RFC 3261 §22.4).
_REQUIRED_PARAMS = ("username", "realm", "nonce", "uri", "response", "qop", "nc", "cnonce")

# Reason labels (low cardinality, for metrics and logs).
REASON_OK = "ok"
REASON_MALFORMED = "malformed"
REASON_TOO_LONG = "too_long"
REASON_BAD_SCHEME = "bad_scheme"
REASON_MISSING_PARAM = "missing_param"
REASON_DUPLICATE_PARAM = "duplicate_param"
REASON_ALGORITHM_UNSUPPORTED = "algorithm_unsupported"
REASON_QOP_UNSUPPORTED = "qop_unsupported"
REASON_USERHASH_UNSUPPORTED = "userhash_unsupported"
REASON_REALM_MISMATCH = "realm_mismatch"
REASON_BAD_NONCE = "bad_nonce"
REASON_NONCE_EXPIRED = "nonce_expired"
REASON_BAD_NC = "bad_nc"
REASON_URI_MISMATCH = "uri_mismatch"
REASON_BAD_CREDENTIALS = "bad_credentials"
REASON_REPLAY = "replay"

#: Every reason :meth:`DigestAuthenticator.verify` can return.
VERDICT_REASONS: frozenset[str] = frozenset(
    {
        REASON_OK,
        REASON_MALFORMED,
        REASON_TOO_LONG,
        REASON_BAD_SCHEME,
        REASON_MISSING_PARAM,
        REASON_DUPLICATE_PARAM,
        REASON_ALGORITHM_UNSUPPORTED,
        REASON_QOP_UNSUPPORTED,
        REASON_USERHASH_UNSUPPORTED,
        REASON_REALM_MISMATCH,
        REASON_BAD_NONCE,
        REASON_NONCE_EXPIRED,
        REASON_BAD_NC,
        REASON_URI_MISMATCH,
        REASON_BAD_CREDENTIALS,
        REASON_REPLAY,
    }
)

# RFC 3261 §25.1 token characters (also RFC 7230 tchar plus a few SIP extras).
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")
_LWS = " \t\r\n"
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True)
class DigestVerdict:
    """Outcome of :meth:`DigestAuthenticator.verify`.

    ``ok`` means the credentials are valid and fresh. ``stale`` means they were computed with the
    right password over an expired nonce: answer with a new challenge carrying ``stale=true``.
    ``reason`` is a label from :data:`VERDICT_REASONS`; ``algorithm`` is the one the client used
    when it could be read.
    """

    ok: bool
    stale: bool
    reason: str
    algorithm: str | None = None


class DigestParseError(ValueError):
    """An Authorization value that is not a well-formed digest credential; ``reason`` is a label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def digest_hash(algorithm: str, text: str) -> str:
    """Lower-case hex ``H(text)`` for an RFC 7616 algorithm name (UTF-8, RFC 7616 §3.4.1)."""
    name = SUPPORTED_ALGORITHMS[algorithm.upper()]
    return hashlib.new(name, text.encode("utf-8", "surrogatepass")).hexdigest()


def digest_response(
    *,
    algorithm: str,
    username: str,
    realm: str,
    password: str,
    method: str,
    uri: str,
    nonce: str,
    nc: str,
    cnonce: str,
    qop: str = "auth",
) -> str:
    """The ``response`` value of a qop=auth digest credential (RFC 7616 §3.4.1, RFC 3261 §22.4).

    ``HA1 = H(username:realm:password)``, ``HA2 = H(method:uri)``,
    ``response = H(HA1:nonce:nc:cnonce:qop:HA2)``. Used by the verifier and by test clients.
    """
    ha1 = digest_hash(algorithm, f"{username}:{realm}:{password}")
    return _response_from_ha1(algorithm, ha1, method, uri, nonce, nc, cnonce, qop)


def _response_from_ha1(
    algorithm: str, ha1: str, method: str, uri: str, nonce: str, nc: str, cnonce: str, qop: str
) -> str:
    ha2 = digest_hash(algorithm, f"{method}:{uri}")
    return digest_hash(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


def parse_authorization(value: str) -> tuple[str, dict[str, str]]:
    """Split an ``Authorization``/``Proxy-Authorization`` value into (scheme, params).

    Only ``Digest`` parameters are parsed; another scheme comes back with no parameters.
    Tolerant of what real stacks send: any case for the scheme and parameter names (names are
    returned lower-case), linear whitespace (including folded lines) around ``=`` and ``,``, empty
    list elements, quoted or bare values, backslash escapes in quoted strings. Raises
    :class:`DigestParseError` for anything else (unterminated quotes, missing ``=``, repeated
    parameters, control characters).
    """
    if len(value) > MAX_AUTHORIZATION_LENGTH:
        raise DigestParseError(REASON_TOO_LONG)
    text = value
    n = len(text)
    i = _skip_lws(text, 0)
    start = i
    while i < n and text[i] in _TOKEN_CHARS:
        i += 1
    scheme = text[start:i]
    if not scheme:
        raise DigestParseError(REASON_MALFORMED)
    if i < n and text[i] not in _LWS:
        raise DigestParseError(REASON_MALFORMED)
    params: dict[str, str] = {}
    if scheme.lower() != "digest":
        return scheme, params  # other schemes' credentials (Basic's token68...) are not parsed
    while True:
        i = _skip_lws(text, i)
        # Empty list elements ("a=b,,c=d", trailing comma) are allowed (RFC 7230 §7).
        while i < n and text[i] == ",":
            i = _skip_lws(text, i + 1)
        if i >= n:
            break
        start = i
        while i < n and text[i] in _TOKEN_CHARS:
            i += 1
        name = text[start:i].lower()
        if not name:
            raise DigestParseError(REASON_MALFORMED)
        i = _skip_lws(text, i)
        if i >= n or text[i] != "=":
            raise DigestParseError(REASON_MALFORMED)
        i = _skip_lws(text, i + 1)
        if i < n and text[i] == '"':
            param_value, i = _read_quoted(text, i)
        else:
            start = i
            while i < n and text[i] in _TOKEN_CHARS:
                i += 1
            param_value = text[start:i]
            if not param_value:
                raise DigestParseError(REASON_MALFORMED)
        if name in params:
            raise DigestParseError(REASON_DUPLICATE_PARAM)
        params[name] = param_value
        i = _skip_lws(text, i)
        if i < n and text[i] != ",":
            raise DigestParseError(REASON_MALFORMED)
    return scheme, params


def _skip_lws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _LWS:
        i += 1
    return i


def _read_quoted(text: str, i: int) -> tuple[str, int]:
    """Read a quoted-string starting at the opening quote; return (unescaped, index after)."""
    out: list[str] = []
    i += 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\":
            if i + 1 >= n:
                break
            ch = text[i + 1]
            i += 1
        if (ord(ch) < 0x20 and ch != "\t") or ch == "\x7f":
            raise DigestParseError(REASON_MALFORMED)
        out.append(ch)
        i += 1
    raise DigestParseError(REASON_MALFORMED)


class DigestAuthenticator:
    """Issues digest challenges and verifies credentials for one SIP user in one realm.

    ``nonce_secret`` keys the stateless nonces (at least 16 bytes; share it between workers that
    sit behind one dispatcher so a retry may land on another worker). ``algorithms`` are offered
    in the order given. The authenticator keeps a bounded replay cache, so use one instance per
    worker process, from one thread.
    """

    def __init__(
        self,
        realm: str,
        username: str,
        password: str,
        nonce_secret: bytes,
        nonce_ttl_s: float = DEFAULT_NONCE_TTL_S,
        *,
        algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
        replay_cache_size: int = DEFAULT_REPLAY_CACHE_SIZE,
    ) -> None:
        if not realm or any(ch in realm for ch in '"\\') or not realm.isprintable():
            raise ValueError("digest realm must be non-empty printable text without quotes")
        if not username:
            raise ValueError("digest username must not be empty")
        if not password:
            raise ValueError("digest password must not be empty")
        if len(nonce_secret) < MIN_NONCE_SECRET_BYTES:
            raise ValueError(f"nonce secret must be at least {MIN_NONCE_SECRET_BYTES} bytes")
        if not nonce_ttl_s > 0:
            raise ValueError("nonce_ttl_s must be positive")
        if replay_cache_size < 1:
            raise ValueError("replay_cache_size must be at least 1")
        offered = tuple(a.upper() for a in algorithms)
        if not offered or len(set(offered)) != len(offered):
            raise ValueError("algorithms must be a non-empty list without repeats")
        unknown = [a for a in offered if a not in SUPPORTED_ALGORITHMS]
        if unknown:
            raise ValueError(
                f"unsupported digest algorithm(s) {unknown}; supported: "
                f"{sorted(SUPPORTED_ALGORITHMS)}"
            )
        self.realm = realm
        self.username = username
        self.algorithms = offered
        self.nonce_ttl_s = float(nonce_ttl_s)
        # Only HA1 per algorithm is kept: the password itself is not stored.
        self._ha1 = {a: digest_hash(a, f"{username}:{realm}:{password}") for a in offered}
        self._secret = bytes(nonce_secret)
        self._realm_bytes = realm.encode("utf-8")
        self._replay_cache_size = replay_cache_size
        # (nonce, nc) -> nonce expiry (now_s scale); insertion order = expiry order in practice.
        self._seen: OrderedDict[tuple[str, int], float] = OrderedDict()

    def __repr__(self) -> str:
        return (
            f"DigestAuthenticator(realm={self.realm!r}, username={self.username!r}, "
            f"algorithms={self.algorithms!r}, nonce_ttl_s={self.nonce_ttl_s!r})"
        )

    # -- challenges -------------------------------------------------------------------------

    def new_nonce(self, now_s: float) -> str:
        """A fresh stateless nonce stamped with ``now_s``."""
        ts_ms = max(0, int(now_s * 1000))
        head = _NONCE_TS.pack(ts_ms) + secrets.token_bytes(_NONCE_SALT_BYTES)
        raw = head + self._nonce_mac(head)
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    def challenges(self, now_s: float, stale: bool = False) -> list[str]:
        """``WWW-Authenticate`` values to send with a 401, one per offered algorithm.

        All share one nonce. ``stale=True`` tells the client its previous credentials were
        right but the nonce had expired, so it retries without prompting (RFC 7616 §3.3).
        """
        nonce = self.new_nonce(now_s)
        stale_param = ", stale=true" if stale else ""
        return [
            f'Digest realm="{self.realm}", nonce="{nonce}", algorithm={algorithm}, '
            f'qop="auth"{stale_param}'
            for algorithm in self.algorithms
        ]

    # -- verification -----------------------------------------------------------------------

    def verify(
        self,
        authorization: str,
        method: str,
        now_s: float,
        *,
        request_uri: str | None = None,
    ) -> DigestVerdict:
        """Check an ``Authorization`` value sent with a ``method`` request at ``now_s``.

        ``request_uri``, when given, must equal the credential's ``uri`` (RFC 3261 §22.4 lets a
        server check it; leave it out behind a dispatcher that rewrites the Request-URI). Never
        raises for bad input; returns a verdict with a reason label instead.
        """
        try:
            return self._verify(authorization, method, now_s, request_uri)
        except DigestParseError as exc:
            return DigestVerdict(ok=False, stale=False, reason=exc.reason)
        except (UnicodeError, ValueError, TypeError):
            return DigestVerdict(ok=False, stale=False, reason=REASON_MALFORMED)

    def _verify(
        self, authorization: str, method: str, now_s: float, request_uri: str | None
    ) -> DigestVerdict:
        if not isinstance(authorization, str) or not isinstance(method, str):
            return DigestVerdict(ok=False, stale=False, reason=REASON_MALFORMED)
        scheme, params = parse_authorization(authorization)
        if scheme.lower() != "digest":
            return DigestVerdict(ok=False, stale=False, reason=REASON_BAD_SCHEME)
        algorithm = params.get("algorithm", "MD5").upper()  # absent means MD5 (RFC 7616 §3.3)
        if algorithm not in self.algorithms:
            return DigestVerdict(ok=False, stale=False, reason=REASON_ALGORITHM_UNSUPPORTED)

        def verdict(reason: str, ok: bool = False, stale: bool = False) -> DigestVerdict:
            return DigestVerdict(ok=ok, stale=stale, reason=reason, algorithm=algorithm)

        if params.get("userhash", "false").lower() != "false":
            return verdict(REASON_USERHASH_UNSUPPORTED)
        if "qop" in params and params["qop"].lower() != "auth":
            return verdict(REASON_QOP_UNSUPPORTED)
        if any(name not in params for name in _REQUIRED_PARAMS):
            # A response without qop is the RFC 2069 form: refused because it has no nonce count.
            rfc2069 = "qop" not in params and "response" in params and "nonce" in params
            return verdict(REASON_QOP_UNSUPPORTED if rfc2069 else REASON_MISSING_PARAM)
        nc_text = params["nc"]
        if len(nc_text) != 8 or not set(nc_text) <= _HEX:
            return verdict(REASON_BAD_NC)
        nc = int(nc_text, 16)
        if nc == 0:
            return verdict(REASON_BAD_NC)
        if not method or not set(method) <= _TOKEN_CHARS:
            return verdict(REASON_MALFORMED)
        if params["realm"] != self.realm:
            return verdict(REASON_REALM_MISMATCH)
        nonce = params["nonce"]
        issued_s = self._nonce_issued_s(nonce)
        if issued_s is None:
            return verdict(REASON_BAD_NONCE)
        if request_uri is not None and params["uri"] != request_uri:
            return verdict(REASON_URI_MISMATCH)

        expected = _response_from_ha1(
            algorithm,
            self._ha1[algorithm],
            method,
            params["uri"],
            nonce,
            nc_text,
            params["cnonce"],
            "auth",
        )
        # Both comparisons always run, so a wrong username costs the same as a wrong password.
        user_ok = hmac.compare_digest(
            params["username"].encode("utf-8", "surrogatepass"),
            self.username.encode("utf-8", "surrogatepass"),
        )
        response_ok = hmac.compare_digest(
            params["response"].lower().encode("utf-8", "surrogatepass"), expected.encode("ascii")
        )
        if not (user_ok and response_ok):
            return verdict(REASON_BAD_CREDENTIALS)
        age_s = now_s - issued_s
        # Written so that a NaN age (a broken clock) also lands here.
        if not -NONCE_FUTURE_TOLERANCE_S <= age_s <= self.nonce_ttl_s:
            return verdict(REASON_NONCE_EXPIRED, stale=True)
        if not self._remember(nonce, nc, issued_s + self.nonce_ttl_s, now_s):
            return verdict(REASON_REPLAY)
        return verdict(REASON_OK, ok=True)

    def _nonce_mac(self, head: bytes) -> bytes:
        message = _NONCE_DOMAIN + self._realm_bytes + b"\n" + head
        return hmac.new(self._secret, message, hashlib.sha256).digest()[:_NONCE_MAC_BYTES]

    def _nonce_issued_s(self, nonce: str) -> float | None:
        """The issue time of a nonce this authenticator made, or None if forged/garbled."""
        if len(nonce) > 2 * _NONCE_RAW_BYTES or not nonce.isascii():
            return None
        try:
            raw = base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _NONCE_RAW_BYTES:
            return None
        head, mac = raw[:-_NONCE_MAC_BYTES], raw[-_NONCE_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._nonce_mac(head)):
            return None
        (ts_ms,) = _NONCE_TS.unpack(head[: _NONCE_TS.size])
        return float(ts_ms / 1000)

    def _remember(self, nonce: str, nc: int, expires_s: float, now_s: float) -> bool:
        """Record ``(nonce, nc)``; False if it was already used (a replay)."""
        seen = self._seen
        # Drop expired entries from the old end: a replay of those fails the nonce age check.
        while seen:
            key, expiry = next(iter(seen.items()))
            if expiry >= now_s:
                break
            del seen[key]
        key = (nonce, nc)
        if key in seen:
            return False
        seen[key] = expires_s
        while len(seen) > self._replay_cache_size:
            seen.popitem(last=False)
        return True
