"""Per-call media-stream tokens: format, binding, expiry."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from rutster.base.stream_token import (
    MIN_SECRET_BYTES,
    PARAM_TOKEN,
    STREAM_TOKEN_LIFETIME_S,
    StreamTokenSigner,
    TokenStatus,
)
from rutster.gateway.providers.sip import SIP_RING_TIMEOUT_S
from rutster.gateway.spend_settings import MEDIA_CONNECT_TIMEOUT_S

SECRET = b"0123456789abcdef0123456789abcdef"
CALL = "CA" + "0" * 32
TAP = "wss://brain.example.com/tap/v1"
#: A fixed issue time (unix s), so expiries in these tests are exact.
T0 = 1_700_000_000.25


def test_param_name() -> None:
    assert PARAM_TOKEN == "rutster_token"


def test_token_is_expiry_and_domain_separated_hmac_sha256_base64url() -> None:
    token = StreamTokenSigner(SECRET).issue(CALL, TAP, "call_1|acme", now_s=T0)
    expiry = str(int(T0) + STREAM_TOKEN_LIFETIME_S)
    message = (
        b"rutster-stream-v2\n"
        + expiry.encode()
        + b"\n"
        + CALL.encode()
        + b"\n"
        + TAP.encode()
        + b"\ncall_1|acme"
    )
    digest = hmac.new(SECRET, message, hashlib.sha256).digest()
    assert token == expiry + "." + base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert len(token) == 10 + 1 + 43 and "=" not in token


def test_lifetime_covers_a_ringing_sip_dial_and_the_media_connect_wait() -> None:
    # Derivation in stream_token.py: the longest wait from issue to ``start``.
    assert STREAM_TOKEN_LIFETIME_S == SIP_RING_TIMEOUT_S + MEDIA_CONNECT_TIMEOUT_S


def test_token_expires_after_its_lifetime() -> None:
    signer = StreamTokenSigner(SECRET)
    token = signer.issue(CALL, TAP, "ctx", now_s=T0)
    expires_at = int(T0) + STREAM_TOKEN_LIFETIME_S
    fresh = signer.check(token, CALL, TAP, "ctx", now_s=T0)
    assert fresh.status is TokenStatus.VALID and fresh.ok and fresh.expires_at_s == expires_at
    assert signer.verify(token, CALL, TAP, "ctx", now_s=expires_at - 0.001)
    for later in (expires_at, expires_at + 1, T0 + 10 * STREAM_TOKEN_LIFETIME_S):
        stale = signer.check(token, CALL, TAP, "ctx", now_s=later)
        assert stale.status is TokenStatus.EXPIRED and not stale.ok
        assert not signer.verify(token, CALL, TAP, "ctx", now_s=later)
    # Only an authentic token is told it expired; a forged one is just invalid.
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert signer.check(forged, CALL, TAP, "ctx", now_s=expires_at + 1).status is (
        TokenStatus.INVALID
    )


def test_lifetime_is_the_signers() -> None:
    signer = StreamTokenSigner(SECRET, lifetime_s=5)
    token = signer.issue(CALL, TAP, now_s=T0)
    assert signer.verify(token, CALL, TAP, now_s=T0 + 4)
    assert not signer.verify(token, CALL, TAP, now_s=T0 + 5)
    with pytest.raises(ValueError):
        StreamTokenSigner(SECRET, lifetime_s=0)


def test_expiry_cannot_be_pushed_back() -> None:
    signer = StreamTokenSigner(SECRET)
    token = signer.issue(CALL, TAP, now_s=T0)
    expiry, _, mac = token.partition(".")
    later = str(int(expiry) + 3600)
    assert not signer.verify(later + "." + mac, CALL, TAP, now_s=T0)
    # Non-canonical spellings of the same expiry are not accepted either.
    for spelling in ("0" + expiry, "+" + expiry, expiry + " ", " " + expiry, expiry + ".0"):
        assert not signer.verify(spelling + "." + mac, CALL, TAP, now_s=T0)
    assert not signer.verify(mac, CALL, TAP, now_s=T0)  # the MAC alone (a v1-shaped token)


def test_round_trip() -> None:
    signer = StreamTokenSigner(SECRET)
    assert signer.verify(signer.issue(CALL, TAP), CALL, TAP)
    unicode_tap = "wss://brän.example/tap?x=ü"
    assert signer.verify(signer.issue(CALL, unicode_tap), CALL, unicode_tap)


def test_binds_call_and_tap_url() -> None:
    signer = StreamTokenSigner(SECRET)
    token = signer.issue(CALL, TAP)
    assert not signer.verify(token, "CA" + "1" * 32, TAP)
    assert not signer.verify(token, CALL, "wss://evil.example.com/tap/v1")
    assert not signer.verify(token, CALL, TAP + "/")
    assert not StreamTokenSigner(SECRET[::-1]).verify(token, CALL, TAP)


def test_field_boundary_cannot_be_shifted() -> None:
    signer = StreamTokenSigner(SECRET)
    with pytest.raises(ValueError):
        signer.issue("CA1\nwss://a", "b")
    with pytest.raises(ValueError):
        signer.issue("CA1", "wss://a\nb")
    token = signer.issue("CA1", "wss://a", "b\nc")
    assert not signer.verify(token, "CA1", "wss://a\nb", "c")
    assert signer.verify(token, "CA1", "wss://a", "b\nc")


def test_binds_the_admission_context() -> None:
    signer = StreamTokenSigner(SECRET)
    token = signer.issue(CALL, TAP, "call_ab|acme|60|500000")
    assert signer.verify(token, CALL, TAP, "call_ab|acme|60|500000")
    assert not signer.verify(token, CALL, TAP, "call_ab|acme|60|900000")
    assert not signer.verify(token, CALL, TAP)


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "x",
        "A" * 43,
        "A" * 44,
        "é" * 43,
        "\ud800" * 43,
        "%%%",
        "\n",
        "." + "A" * 43,
        "9999999999." + "A" * 43,
        "9999999999.",
        "9999999999.\ud800",
        "٣" * 10 + "." + "A" * 43,  # non-ASCII digits are not an expiry
    ],
)
def test_garbage_is_rejected(token: str | None) -> None:
    assert not StreamTokenSigner(SECRET).verify(token, CALL, TAP)


def test_every_single_character_change_is_rejected() -> None:
    signer = StreamTokenSigner(SECRET)
    token = signer.issue(CALL, TAP)
    for index in range(len(token)):
        replacement = {"A": "B", ".": "A"}.get(token[index], "A")
        assert not signer.verify(token[:index] + replacement + token[index + 1 :], CALL, TAP)
    assert not signer.verify(token + "=", CALL, TAP)  # padded form is not canonical
    assert not signer.verify(token[:-1], CALL, TAP)


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        StreamTokenSigner(b"x" * (MIN_SECRET_BYTES - 1))
    StreamTokenSigner(b"x" * MIN_SECRET_BYTES)
