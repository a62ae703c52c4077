"""Telnyx webhook signatures (trunk/telnyx/signature.py), checked against the Telnyx SDK's."""

from __future__ import annotations

import base64
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from telnyx.lib.webhook_verification import WebhookVerificationError, verify_webhook_signature

from rutster.trunk.telnyx.signature import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TIMESTAMP_TOLERANCE_S,
    TelnyxSignatureVerifier,
    TelnyxWebhookSigner,
)

BODY = b"AccountSid=a1&CallControlId=v3%3Axyz&From=%2B15551230000&To=%2B15559870000"
NOW = 1_700_000_000.0


@pytest.fixture
def signer() -> TelnyxWebhookSigner:
    # A fixed key (RFC 8032 §7.1 test 1's secret), so failures repeat.
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    return TelnyxWebhookSigner(Ed25519PrivateKey.from_private_bytes(seed))


def test_rfc_8032_key_gives_its_public_key(signer: TelnyxWebhookSigner) -> None:
    expected = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert base64.b64decode(signer.public_key_b64).hex() == expected


def test_the_telnyx_sdk_accepts_what_the_simulator_signs(signer: TelnyxWebhookSigner) -> None:
    # The SDK's verifier reads the wall clock: sign now.
    headers = signer.headers(BODY, now_s=time.time())
    verify_webhook_signature(BODY, headers, signer.public_key_b64)  # raises if not
    with pytest.raises(WebhookVerificationError):
        verify_webhook_signature(BODY + b"&x=1", headers, signer.public_key_b64)


def test_a_valid_signature_passes(signer: TelnyxWebhookSigner) -> None:
    verifier = TelnyxSignatureVerifier(signer.public_key_b64)
    h = signer.headers(BODY, now_s=NOW)
    assert verifier.verify(BODY, h[SIGNATURE_HEADER], h[TIMESTAMP_HEADER], now_s=NOW).ok
    # Within the tolerance either way.
    later = NOW + TIMESTAMP_TOLERANCE_S
    assert verifier.verify(BODY, h[SIGNATURE_HEADER], h[TIMESTAMP_HEADER], now_s=later).ok


def test_what_the_sdk_refuses_is_refused_here_too(signer: TelnyxWebhookSigner) -> None:
    verifier = TelnyxSignatureVerifier(signer.public_key_b64)
    h = signer.headers(BODY, now_s=NOW)
    sig, ts = h[SIGNATURE_HEADER], h[TIMESTAMP_HEADER]

    def reason(body: bytes, signature: str | None, timestamp: str | None, now: float = NOW) -> str:
        verdict = verifier.verify(body, signature, timestamp, now_s=now)
        assert not verdict.ok
        return verdict.reason

    assert reason(BODY + b"&Direction=outbound-api", sig, ts) == "mismatch"  # tampered body
    assert reason(BODY, sig, str(int(NOW) + 1)) == "mismatch"  # tampered timestamp
    assert reason(BODY, sig, ts, NOW + TIMESTAMP_TOLERANCE_S + 1) == "expired"  # replayed later
    assert reason(BODY, sig, ts, NOW - TIMESTAMP_TOLERANCE_S - 1) == "expired"  # from the future
    assert reason(BODY, None, ts) == "missing"
    assert reason(BODY, sig, None) == "missing"
    assert reason(BODY, "not base64!", ts) == "bad_signature"
    assert reason(BODY, base64.b64encode(b"\x00" * 63).decode(), ts) == "bad_signature"
    assert reason(BODY, sig, "17e8") == "bad_timestamp"
    assert reason(BODY, sig, "9" * 40) == "bad_timestamp"
    other = TelnyxWebhookSigner(Ed25519PrivateKey.generate()).headers(BODY, now_s=NOW)
    assert reason(BODY, other[SIGNATURE_HEADER], ts) == "mismatch"  # another account's key


@pytest.mark.parametrize("key", ["", "not base64", base64.b64encode(b"\x01" * 31).decode()])
def test_a_key_that_is_no_ed25519_public_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="Telnyx public key"):
        TelnyxSignatureVerifier(key)
