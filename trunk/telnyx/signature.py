"""Telnyx webhook signatures: Ed25519 over ``"{timestamp}|{raw body}"`` (docs/PROVIDERS.md §2.5).

Telnyx signs every webhook, TeXML's form posts included, with the account's
Ed25519 key: the ``telnyx-signature-ed25519`` header holds the base64 signature of
the ``telnyx-timestamp`` header's value, a ``|``, and the body exactly as sent. The
public key (base64, 32 bytes) is in the Mission Control portal. A timestamp more
than :data:`TIMESTAMP_TOLERANCE_S` from now is refused, so a captured request
cannot be replayed later (telnyx-python ``lib/webhook_verification.py`` does the
same). Verification is ``cryptography``'s Ed25519; the suite checks it against
the Telnyx SDK's own verifier.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TIMESTAMP_TOLERANCE_S",
    "TelnyxSignatureVerifier",
    "TelnyxWebhookSigner",
    "Verdict",
]

#: Header carrying the base64 Ed25519 signature (§2.5; telnyx-python ``SIGNATURE_HEADER``).
SIGNATURE_HEADER = "telnyx-signature-ed25519"
#: Header carrying the signing time, Unix seconds (§2.5; telnyx-python ``TIMESTAMP_HEADER``).
TIMESTAMP_HEADER = "telnyx-timestamp"
#: Largest |now - timestamp| accepted, seconds: telnyx-python's
#: ``TIMESTAMP_TOLERANCE_SECONDS`` (300, "5 minutes").
TIMESTAMP_TOLERANCE_S = 300
#: Sizes of an Ed25519 public key and signature (RFC 8032 §5.1.5, §5.1.6).
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
#: Longest timestamp header read: Unix seconds have 10 digits until 2286.
_MAX_TIMESTAMP_CHARS = 12


@dataclass(frozen=True, slots=True)
class Verdict:
    """A webhook's signature check: ``ok``, or ``reason`` (a stable metrics label) says why not."""

    ok: bool
    reason: str = ""


class TelnyxSignatureVerifier:
    """Checks Telnyx webhook signatures against the account's public key.

    Raises ``ValueError`` at construction for a key that is not base64 of 32 bytes.
    """

    def __init__(self, public_key_b64: str) -> None:
        try:
            raw = base64.b64decode(public_key_b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the Telnyx public key is not base64") from None
        if len(raw) != PUBLIC_KEY_BYTES:
            raise ValueError(
                f"the Telnyx public key is {len(raw)} bytes; an Ed25519 key is {PUBLIC_KEY_BYTES}"
            )
        self._key = Ed25519PublicKey.from_public_bytes(raw)

    def verify(
        self, body: bytes, signature: str | None, timestamp: str | None, *, now_s: float
    ) -> Verdict:
        """Whether Telnyx signed ``body`` at ``timestamp``, within the tolerance of ``now_s``."""
        if not signature or not timestamp:
            return Verdict(False, "missing")
        if len(timestamp) > _MAX_TIMESTAMP_CHARS or not (
            timestamp.isascii() and timestamp.isdigit()
        ):
            return Verdict(False, "bad_timestamp")
        if abs(now_s - int(timestamp)) > TIMESTAMP_TOLERANCE_S:
            return Verdict(False, "expired")
        try:
            raw_signature = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            return Verdict(False, "bad_signature")
        if len(raw_signature) != SIGNATURE_BYTES:
            return Verdict(False, "bad_signature")
        try:
            self._key.verify(raw_signature, timestamp.encode("ascii") + b"|" + body)
        except InvalidSignature:
            return Verdict(False, "mismatch")
        return Verdict(True)


class TelnyxWebhookSigner:
    """Signs webhooks as Telnyx does: for simulators and tests, never the gateway."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key

    @property
    def public_key_b64(self) -> str:
        """The public key an operator would paste into ``TELNYX_PUBLIC_KEY``."""
        raw = self._key.public_key().public_bytes_raw()
        return base64.b64encode(raw).decode("ascii")

    def headers(self, body: bytes, *, now_s: float) -> dict[str, str]:
        """The two signature headers for ``body`` sent at ``now_s``."""
        timestamp = str(int(now_s))
        signature = self._key.sign(timestamp.encode("ascii") + b"|" + body)
        return {
            SIGNATURE_HEADER: base64.b64encode(signature).decode("ascii"),
            TIMESTAMP_HEADER: timestamp,
        }
