"""Requests pjsip's parser drops, read from its log and answered (trunk/sip/unparsed.py).

The log lines below are pjsua2 2.15's own, decorated as pjsua2 decorates them by default;
tests/test_sip_security.py checks the whole path against a running worker.
"""

from __future__ import annotations

from trunk.sip.unparsed import DroppedPacketReader, UnparsedRequest, stateless_answer

REQUEST = (
    "INVITE sip:b@127.0.0.1:5060 SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK1;rport\r\n"
    "Via: SIP/2.0/UDP 10.0.0.2:5060;branch=z9hG4bK0\r\n"
    "Max-Forwards: 70\r\n"
    "From: <sip:a@10.0.0.1>;tag=1\r\n"
    "To: <sip:b@127.0.0.1>\r\n"
    "Call-ID: abc@x\r\n"
    "CSeq: 1 INVITE\r\n"
    "Authorization: Basic YTpi\r\n"
    "Content-Length: 0\r\n\r\n"
)
DROPPING = (
    "20:27:53.654        sip_transport.c  Dropping 314 bytes packet from UDP 10.0.0.1:5070 : "
    "PJSIP syntax error exception when parsing 'Authorization' header on line 9 col 22\n\n"
)


def _dropped(text: str) -> str:
    return f"20:27:53.654        sip_transport.c  Dropped packet:{text}\n-- end of packet.\n"


def _read(text: str = REQUEST) -> UnparsedRequest:
    reader = DroppedPacketReader()
    assert reader.feed(DROPPING) is None
    request = reader.feed(_dropped(text))
    assert request is not None
    return request


def test_the_two_log_lines_make_one_request() -> None:
    request = _read()
    assert request.transport == "UDP"
    assert request.source == "10.0.0.1:5070"
    assert request.method == "INVITE"
    assert request.authorization == "Basic YTpi"
    assert "'Authorization' header" in request.reason


def test_a_packet_line_without_its_dropping_line_is_ignored() -> None:
    reader = DroppedPacketReader()
    assert reader.feed(_dropped(REQUEST)) is None
    assert reader.feed("sip_endpoint.c  Module registered") is None
    # One Dropping line pairs with one packet only.
    assert reader.feed(DROPPING) is None
    assert reader.feed(_dropped(REQUEST)) is not None
    assert reader.feed(_dropped(REQUEST)) is None
    assert reader.packets == 1


def test_a_dropped_response_or_garbage_is_not_a_request() -> None:
    for text in ("SIP/2.0 200 OK\r\nVia: x\r\n\r\n", "\r\n\r\n", "GET / HTTP/1.1\r\n\r\n"):
        reader = DroppedPacketReader()
        reader.feed(DROPPING)
        assert reader.feed(_dropped(text)) is None, text


def test_the_answer_copies_what_the_caller_matches_on_and_adds_a_to_tag() -> None:
    answer = stateless_answer(_read(), 403, "f00d")
    assert answer is not None
    assert answer.decode().split("\r\n") == [
        "SIP/2.0 403 Forbidden",
        "Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK1;rport",
        "Via: SIP/2.0/UDP 10.0.0.2:5060;branch=z9hG4bK0",
        "From: <sip:a@10.0.0.1>;tag=1",
        "To: <sip:b@127.0.0.1>;tag=f00d",
        "Call-ID: abc@x",
        "CSeq: 1 INVITE",
        "Content-Length: 0",
        "",
        "",
    ]


def test_compact_headers_and_an_existing_to_tag() -> None:
    text = (
        "OPTIONS sip:b@h SIP/2.0\r\nv: SIP/2.0/UDP h:1;branch=z9hG4bK2\r\nf: <sip:a@h>;tag=9\r\n"
        "t: <sip:b@h>;tag=7\r\ni: c@h\r\nCSeq: 4 OPTIONS\r\nAuthorization: Bearer x\r\n\r\n"
    )
    answer = stateless_answer(_read(text), 400, "f00d")
    assert answer is not None
    lines = answer.decode().split("\r\n")
    assert lines[0] == "SIP/2.0 400 Bad Request"
    assert "To: <sip:b@h>;tag=7" in lines
    assert "Call-ID: c@h" in lines


def test_no_answer_to_an_ack_or_to_a_request_the_caller_could_not_match() -> None:
    ack = REQUEST.replace("INVITE sip:", "ACK sip:", 1)
    assert stateless_answer(_read(ack), 403, "t") is None
    no_call_id = REQUEST.replace("Call-ID: abc@x\r\n", "")
    assert stateless_answer(_read(no_call_id), 403, "t") is None
    assert stateless_answer(_read(), 200, "t") is None  # never a success
