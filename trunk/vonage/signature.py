"""Vonage signed webhooks and upgrades: HS256 JWTs with the account's signature secret.

Vonage signs voice webhooks with ``Authorization: Bearer <JWT>`` (docs/PROVIDERS.md
§3.4): HS256 with the signature secret, claims ``iat``, ``jti``, ``iss`` ("Vonage"),
``payload_hash`` (hex SHA-256 of the raw body) and ``api_key``. An NCCO websocket
endpoint with ``authorization: {"type": "vonage"}`` gets the same kind of token on
its WebSocket handshake (§3.2). PyJWT checks the signature; this module adds the
body hash and an age bound, which the docs do not set (seed decision:
:data:`MAX_AGE_S`, Telnyx's timestamp tolerance), so a captured token cannot be
replayed much later.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import jwt

__all__ = ["MAX_AGE_S", "Verdict", "VonageJwt"]

#: Largest |now - iat| accepted, seconds (seed decision; Telnyx's 300 s).
MAX_AGE_S = 300
#: The only algorithm accepted: a token naming another (``none``, RS256 with our
#: secret as a "public key") is refused (RFC 8725 §3.1).
ALGORITHM = "HS256"
#: The issuer Vonage writes (§3.4).
ISSUER = "Vonage"
_BEARER = "Bearer "


@dataclass(frozen=True, slots=True)
class Verdict:
    """A token's check: ``ok``, or ``reason`` (a stable metrics label) says why not."""

    ok: bool
    reason: str = ""


class VonageJwt:
    """Verifies (and, for simulators and tests, signs) Vonage's HS256 tokens."""

    def __init__(self, signature_secret: str) -> None:
        if not signature_secret:
            raise ValueError("the Vonage signature secret is empty")
        self._secret = signature_secret

    def verify(self, authorization: str | None, body: bytes | None, *, now_s: float) -> Verdict:
        """Check an ``Authorization`` header; ``body`` (None: a handshake, no body) must
        match the token's ``payload_hash`` when the token carries one."""
        if not authorization or not authorization.startswith(_BEARER):
            return Verdict(False, "missing")
        try:
            claims = jwt.decode(
                authorization[len(_BEARER) :],
                self._secret,
                algorithms=[ALGORITHM],
                options={"require": ["iat"], "verify_iat": False},
            )
        except jwt.InvalidTokenError:
            return Verdict(False, "mismatch")
        iat = claims.get("iat")
        if not isinstance(iat, int | float) or abs(now_s - iat) > MAX_AGE_S:
            return Verdict(False, "expired")
        expected = claims.get("payload_hash")
        if (
            body is not None
            and expected is not None
            and expected != hashlib.sha256(body).hexdigest()
        ):
            return Verdict(False, "body_mismatch")
        return Verdict(True)

    def sign(self, body: bytes | None, *, now_s: float, api_key: str = "key") -> str:
        """A token as Vonage would send it for ``body`` (None: a handshake)."""
        claims: dict[str, object] = {
            "iat": int(now_s),
            "jti": secrets.token_hex(8),
            "iss": ISSUER,
            "api_key": api_key,
        }
        if body is not None:
            claims["payload_hash"] = hashlib.sha256(body).hexdigest()
        return _BEARER + jwt.encode(claims, self._secret, algorithm=ALGORITHM)
