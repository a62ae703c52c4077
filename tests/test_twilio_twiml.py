"""TwiML generation, checked against twilio-python's VoiceResponse."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from twilio.twiml.voice_response import Connect, VoiceResponse

from rutster.trunk.twilio.twiml import (
    MAX_INLINE_TWIML_CHARS,
    MAX_SAY_CHARS,
    TransferDestination,
    TransferKind,
    connect_stream_twiml,
    is_valid_transfer_destination,
    parse_transfer_destination,
    reject_twiml,
    say_hangup_twiml,
    transfer_twiml,
)
from rutster.trunk.xml_documents import XML_DECLARATION

STREAM_URL = "wss://gw.example.com/twilio/media"
HOSTILE = [
    "quote \" and apostrophe '",
    "<Hangup/>",
    "a & b &amp; c",
    "]]> <![CDATA[x]]>",
    "</Stream><Redirect>https://evil.example</Redirect>",
    "日本語 ünïcødé 😀",
    "tab\tnewline\ncarriage\r",
    "",
]

Shape = tuple[str, dict[str, str], str | None, list["Shape"]]


def _shape(element: ET.Element) -> Shape:
    """Tag, attributes, text and children: what Twilio reads, ignoring serialisation details."""
    return (
        element.tag,
        dict(element.attrib),
        element.text,
        [_shape(child) for child in element],
    )


def _parse(document: str) -> ET.Element:
    assert document.startswith(XML_DECLARATION)
    return ET.fromstring(document.encode("utf-8"))


def _reference_stream(
    url: str, parameters: dict[str, str], name: str | None = None, callback: str | None = None
) -> str:
    response = VoiceResponse()
    connect = Connect()
    stream = connect.stream(url=url, name=name, status_callback=callback)
    for key, value in parameters.items():
        stream.parameter(name=key, value=value)
    response.append(connect)
    return str(response.to_xml())


def test_connect_stream_matches_twilio_python() -> None:
    parameters = {"rutster_token": "abc-_123", "from": "+15551230000", "direction": "inbound"}
    ours = connect_stream_twiml(
        STREAM_URL,
        parameters,
        stream_name="agent-leg",
        status_callback="https://gw.example.com/twilio/stream-status",
    )
    reference = _reference_stream(
        STREAM_URL, parameters, "agent-leg", "https://gw.example.com/twilio/stream-status"
    )
    assert _shape(_parse(ours)) == _shape(_parse(reference))
    root = _parse(ours)
    stream = root.find("./Connect/Stream")
    assert stream is not None
    assert stream.get("url") == STREAM_URL
    assert [(p.get("name"), p.get("value")) for p in stream.findall("Parameter")] == list(
        parameters.items()
    )


def test_connect_stream_minimal() -> None:
    ours = connect_stream_twiml("ws://localhost:8080/twilio/media", {})
    assert _shape(_parse(ours)) == _shape(
        _parse(_reference_stream("ws://localhost:8080/twilio/media", {}))
    )
    assert _shape(_parse(ours)) == (
        "Response",
        {},
        None,
        [
            (
                "Connect",
                {},
                None,
                [("Stream", {"url": "ws://localhost:8080/twilio/media"}, None, [])],
            )
        ],
    )


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_parameter_values_round_trip(value: str) -> None:
    ours = connect_stream_twiml(STREAM_URL, {"from": value, f"n{value}": "v"}, stream_name=value)
    reference = _reference_stream(STREAM_URL, {"from": value, f"n{value}": "v"}, name=value)
    root = _parse(ours)
    assert _shape(root) == _shape(_parse(reference))
    stream = root.find("./Connect/Stream")
    assert stream is not None
    assert stream.get("name") == value
    params = stream.findall("Parameter")
    assert [(p.get("name"), p.get("value")) for p in params] == [
        ("from", value),
        (f"n{value}", "v"),
    ]
    # Nothing leaked out of its attribute: exactly the elements we built.
    assert [element.tag for element in root.iter()] == [
        "Response",
        "Connect",
        "Stream",
        "Parameter",
        "Parameter",
    ]


@pytest.mark.parametrize("value", HOSTILE[:-1])
def test_hostile_say_message_round_trips(value: str) -> None:
    ours = say_hangup_twiml(value)
    reference = VoiceResponse()
    reference.say(value)
    reference.hangup()
    root = _parse(ours)
    assert _shape(root) == _shape(_parse(str(reference.to_xml())))
    say = root.find("Say")
    assert say is not None and say.text == value.replace("\r", "\n")  # XML end-of-line handling
    assert [child.tag for child in root] == ["Say", "Hangup"]


@pytest.mark.parametrize("bad", ["\x00", "\x01", "\x1b[31m", "\ufffe", "\ud800"])
def test_characters_xml_cannot_carry_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        connect_stream_twiml(STREAM_URL, {"from": bad})
    with pytest.raises(ValueError):
        connect_stream_twiml(STREAM_URL, {bad: "x"})
    with pytest.raises(ValueError):
        connect_stream_twiml(STREAM_URL, {}, stream_name=bad)
    with pytest.raises(ValueError):
        say_hangup_twiml(f"hello {bad}")


@pytest.mark.parametrize(
    "url",
    [
        "https://gw.example.com/twilio/media",
        "http://gw.example.com/twilio/media",
        "/twilio/media",
        "wss:///twilio/media",
        "wss://gw.example.com/twilio/media?token=abc",
        "wss://gw.example.com/twilio/media?",
        "wss://gw.example.com/twilio/media#frag",
        "wss://gw.example.com:99999/twilio/media",
        "wss://[::1/twilio/media",
        'wss://gw.example.com/"><Hangup/>\x00',
    ],
)
def test_bad_stream_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        connect_stream_twiml(url, {})


@pytest.mark.parametrize("callback", ["wss://gw.example.com/x", "/relative", "https://:1/x"])
def test_bad_status_callback_is_refused(callback: str) -> None:
    with pytest.raises(ValueError):
        connect_stream_twiml(STREAM_URL, {}, status_callback=callback)


def test_empty_parameter_name_is_refused() -> None:
    with pytest.raises(ValueError):
        connect_stream_twiml(STREAM_URL, {"": "x"})


@pytest.mark.parametrize("reason", ["rejected", "busy"])
def test_reject_matches_twilio_python(reason: str) -> None:
    reference = VoiceResponse()
    reference.reject(reason=reason)
    assert _shape(_parse(reject_twiml(reason))) == _shape(_parse(str(reference.to_xml())))


def test_reject_default_and_bad_reason() -> None:
    assert _shape(_parse(reject_twiml())) == (
        "Response",
        {},
        None,
        [("Reject", {"reason": "rejected"}, None, [])],
    )
    with pytest.raises(ValueError):
        reject_twiml('busy" foo="bar')


@pytest.mark.parametrize("message", ["", "   "])
def test_empty_say_is_refused(message: str) -> None:
    with pytest.raises(ValueError):
        say_hangup_twiml(message)


@pytest.mark.parametrize("char", ["&", "<", ">", "a", "😀"])
def test_longest_say_fits_inline_twiml(char: str) -> None:
    """Even the worst-escaping text of the maximum length can be sent as ``Twiml=``."""
    document = say_hangup_twiml(char * MAX_SAY_CHARS)
    assert len(document) <= MAX_INLINE_TWIML_CHARS
    say = _parse(document).find("Say")
    assert say is not None and say.text == char * MAX_SAY_CHARS
    with pytest.raises(ValueError):
        say_hangup_twiml(char * (MAX_SAY_CHARS + 1))


def test_say_hangup_shape() -> None:
    assert _shape(_parse(say_hangup_twiml("Sorry, we cannot take your call."))) == (
        "Response",
        {},
        None,
        [("Say", {}, "Sorry, we cannot take your call.", []), ("Hangup", {}, None, [])],
    )


# ---- transfer (<Dial>) ----------------------------------------------------------------

VALID_NUMBERS = ["+15551230000", "+442071838750", "+12", "+123456789012345"]
VALID_SIP_URIS = [
    "sip:agent@pbx.example.com",
    "sips:agent@pbx.example.com:5061",
    "sip:+15551230000@trunk.example.com;transport=tls",
    "sip:pbx.example.com",
    "sip:1001@192.0.2.10:5080",
    "sip:agent@[2001:db8::1]:5060;transport=tcp",
    "sip:agent@pbx.example.com?X-Rutster-Call=abc&X-Reason=transfer",
    "sip:alice:secret@pbx.example.com.",
]
INVALID_DESTINATIONS = [
    "",
    "15551230000",  # no +
    "+05551230000",  # country codes never start with 0
    "+1234567890123456",  # 16 digits: longer than E.164 allows
    "+1 555 123 0000",
    "+1-555-123-0000",
    " +15551230000",
    "+15551230000\n",
    "+\u0661\u0665\u0665\u0665",  # Arabic-Indic digits
    "tel:+15551230000",
    "https://pbx.example.com",
    "sip:",
    "sip:agent@",
    "sip:agent@pbx..example.com",
    "sip:agent@-pbx.example.com",
    "sip:agent@pbx.example.com:0",
    "sip:agent@pbx.example.com:65536",
    "sip:agent@[not-ipv6]",
    "sip:agent @pbx.example.com",
    "sip:agent@pbx.example.com\n",
    "sip:agent@pbx.example.com</Sip><Redirect>https://evil.example</Redirect>",
    'sip:agent@pbx.example.com" foo="bar',
    "sip:agent@pbx.example.com\x00",
]


def _reference_dial(noun: str, address: str) -> str:
    response = VoiceResponse()
    dial = response.dial()
    if noun == "Number":
        dial.number(address)
    else:
        dial.sip(address)
    return str(response.to_xml())


@pytest.mark.parametrize("number", VALID_NUMBERS)
def test_transfer_to_number_matches_twilio_python(number: str) -> None:
    ours = transfer_twiml(number)
    assert _shape(_parse(ours)) == _shape(_parse(_reference_dial("Number", number)))
    assert _shape(_parse(ours)) == (
        "Response",
        {},
        None,
        [("Dial", {}, None, [("Number", {}, number, [])])],
    )
    assert parse_transfer_destination(number) == TransferDestination(TransferKind.NUMBER, number)


@pytest.mark.parametrize("uri", VALID_SIP_URIS)
def test_transfer_to_sip_matches_twilio_python(uri: str) -> None:
    ours = transfer_twiml(uri)
    assert _shape(_parse(ours)) == _shape(_parse(_reference_dial("Sip", uri)))
    sip = _parse(ours).find("./Dial/Sip")
    assert sip is not None and sip.text == uri
    assert is_valid_transfer_destination(uri)


def test_sip_scheme_is_lower_cased() -> None:
    assert parse_transfer_destination("SIPS:agent@pbx.example.com") == TransferDestination(
        TransferKind.SIP, "sips:agent@pbx.example.com"
    )


@pytest.mark.parametrize("destination", INVALID_DESTINATIONS)
def test_bad_transfer_destination_is_refused(destination: str) -> None:
    assert not is_valid_transfer_destination(destination)
    with pytest.raises(ValueError, match="transfer destination"):
        transfer_twiml(destination)
