"""trunk/sip/non_digest_credentials.py: what is taken out of a refused request, and what is not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.trunk.sip.non_digest_credentials import (
    OTHER_SCHEME_LABEL,
    strip_non_digest_credentials,
)

HEAD = (
    "INVITE sip:+15550001111@127.0.0.1 SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 127.0.0.2:5062;branch=z9hG4bK1\r\n"
    "From: <sip:a@127.0.0.2>;tag=1\r\n"
    "To: <sip:+15550001111@127.0.0.1>\r\n"
    "Call-ID: c1\r\n"
    "CSeq: 1 INVITE\r\n"
)
BODY = "v=0\r\no=- 1 1 IN IP4 127.0.0.2\r\ns=-\r\nAuthorization: Basic not-a-header\r\n"
DIGEST = 'Authorization: Digest username="u", realm="r", nonce="n", uri="sip:x", response="0"\r\n'


def _request(extra: str, body: str = BODY, newline: str = "\r\n") -> bytes:
    text = f"{HEAD}{extra}Content-Length: {len(body)}\r\n\r\n{body}"
    return text.replace("\r\n", newline).encode()


def test_a_basic_authorization_is_taken_out_and_nothing_else_changes() -> None:
    stripped = strip_non_digest_credentials(_request("Authorization: Basic dXNlcjpwYXNz\r\n"))
    assert stripped is not None
    assert stripped.message == _request("")
    assert stripped.schemes == ("basic",)
    assert b"dXNlcjpwYXNz" not in stripped.message


def test_digest_stays_and_only_the_foreign_field_goes_with_its_continuation_lines() -> None:
    foreign = "Proxy-Authorization: Bearer\r\n  eyJhbGciOiJub25lIn0.e30.\r\n"
    stripped = strip_non_digest_credentials(_request(DIGEST + foreign + "X-Tenant: acme\r\n"))
    assert stripped is not None
    assert stripped.message == _request(DIGEST + "X-Tenant: acme\r\n")
    assert stripped.schemes == ("bearer",)


def test_a_body_that_looks_like_a_header_is_never_touched() -> None:
    # The SDP body here contains an "Authorization: Basic" line: bodies are not headers.
    stripped = strip_non_digest_credentials(_request("authorization: BASIC eA==\r\n"))
    assert stripped is not None
    assert stripped.message.endswith(BODY.encode())
    assert stripped.schemes == ("basic",)


def test_bare_line_feeds_are_handled_like_crlf() -> None:
    stripped = strip_non_digest_credentials(_request("Authorization: Basic eA==\r\n", newline="\n"))
    assert stripped is not None
    assert stripped.message == _request("", newline="\n")


@pytest.mark.parametrize(
    ("field", "label"),
    [
        ("Authorization: NTLM abc\r\n", OTHER_SCHEME_LABEL),
        ("Authorization: \u00e9vil abc\r\n", OTHER_SCHEME_LABEL),
        ("Authorization:\r\n", OTHER_SCHEME_LABEL),
        ("Proxy-Authorization: bearer x\r\n", "bearer"),
    ],
)
def test_labels_never_echo_what_the_peer_invented(field: str, label: str) -> None:
    stripped = strip_non_digest_credentials(_request(field))
    assert stripped is not None
    assert stripped.schemes == (label,)


@pytest.mark.parametrize(
    "message",
    [
        _request(""),  # refused for another reason: not ours to touch
        _request(DIGEST),
        b"SIP/2.0 200 OK\r\nAuthorization: Basic eA==\r\n\r\n",  # a response, never a request
        b"\x00\x01garbage Authorization: Basic eA==\r\n",
        b"",
    ],
)
def test_nothing_is_returned_when_there_is_nothing_to_take_out(message: bytes) -> None:
    assert strip_non_digest_credentials(message) is None


def test_the_result_is_always_shorter_so_pjsip_can_take_it_back() -> None:
    for extra in ("Authorization: Basic eA==\r\n", "Authorization:\r\n", "Authorization: x\n"):
        original = _request(extra)
        stripped = strip_non_digest_credentials(original)
        assert stripped is not None
        assert 0 < len(stripped.message) < len(original)


_LINES = st.sampled_from(
    [
        "Authorization: Basic eA==",
        "Proxy-Authorization: Bearer x",
        "Authorization: Digest a=b",
        "authorization:",
        "  folded continuation",
        "\tfolded continuation",
        "X-Other: Basic",
        "Via: SIP/2.0/UDP 127.0.0.2",
        "",
        ":",
        "Authorization Basic",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    head=st.lists(_LINES, max_size=8),
    newline=st.sampled_from(["\r\n", "\n"]),
    tail=st.binary(max_size=64),
)
def test_any_refused_request_gives_none_or_a_shorter_request_without_foreign_credentials(
    head: list[str], newline: str, tail: bytes
) -> None:
    # Whatever a peer sends, the hook gets None or something pjsip can take back (shorter),
    # still a request, with no non-Digest credential field left in its headers.
    packet = ("INVITE sip:x SIP/2.0" + newline + newline.join(head) + newline).encode() + tail
    stripped = strip_non_digest_credentials(packet)
    if stripped is None:
        return
    assert 0 < len(stripped.message) < len(packet)
    assert stripped.message.startswith(b"INVITE sip:x SIP/2.0")
    assert strip_non_digest_credentials(stripped.message) is None
