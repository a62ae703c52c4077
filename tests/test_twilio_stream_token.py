"""Per-call media-stream tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from trunk.twilio.stream_token import MIN_SECRET_BYTES, PARAM_TOKEN, StreamTokenSigner

SECRET = b"0123456789abcdef0123456789abcdef"
CALL = "CA" + "0" * 32
TAP = "wss://brain.example.com/tap/v1"


def test_param_name() -> None:
    assert PARAM_TOKEN == "rutster_token"


def test_token_is_domain_separated_hmac_sha256_base64url() -> None:
    token = StreamTokenSigner(SECRET).issue(CALL, TAP, "call_1|acme")
    message = b"rutster-stream-v1\n" + CALL.encode() + b"\n" + TAP.encode() + b"\ncall_1|acme"
    digest = hmac.new(SECRET, message, hashlib.sha256).digest()
    assert token == base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert len(token) == 43 and "=" not in token


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
    [None, "", "x", "A" * 43, "A" * 44, "é" * 43, "\ud800" * 43, "%%%", "\n"],
)
def test_garbage_is_rejected(token: str | None) -> None:
    assert not StreamTokenSigner(SECRET).verify(token, CALL, TAP)


def test_every_single_character_change_is_rejected() -> None:
    signer = StreamTokenSigner(SECRET)
    token = signer.issue(CALL, TAP)
    for index in range(len(token)):
        replacement = "A" if token[index] != "A" else "B"
        assert not signer.verify(token[:index] + replacement + token[index + 1 :], CALL, TAP)
    assert not signer.verify(token + "=", CALL, TAP)  # padded form is not canonical
    assert not signer.verify(token[:-1], CALL, TAP)


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        StreamTokenSigner(b"x" * (MIN_SECRET_BYTES - 1))
    StreamTokenSigner(b"x" * MIN_SECRET_BYTES)
