"""TwiML documents the voice webhook answers with.

Built with :mod:`xml.etree.ElementTree`, which escapes text and attribute values;
untrusted values (caller numbers, messages) are never spliced into XML strings.
ElementTree does not reject characters XML 1.0 forbids (NUL, most C0 controls,
lone surrogates), so those are refused here rather than producing a document
Twilio cannot parse.
"""

from __future__ import annotations

import ipaddress
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import SplitResult, urlsplit

from rutster.trunk.xml_documents import checked_text, connect_stream_document, xml_document

#: Schemes a ``<Stream url>`` may use: Twilio wants ``wss``; ``ws`` is kept for local testing.
STREAM_URL_SCHEMES = frozenset({"ws", "wss"})

#: Schemes a stream ``statusCallback`` may use (Twilio POSTs a form there, docs/PROVIDERS.md §1.2).
STATUS_CALLBACK_SCHEMES = frozenset({"http", "https"})

#: ``<Reject reason>`` values Twilio accepts (TwiML ``<Reject>`` docs; twilio-python ``reject``).
REJECT_REASONS = frozenset({"rejected", "busy"})

#: Longest TwiML Twilio takes inline (``Twiml=`` on create or redirect): 4000 characters
#: (twilio.com/docs/api/errors/32018 "Twiml size exceeded maximum allowed value").
MAX_INLINE_TWIML_CHARS = 4000
#: Longest ``<Say>`` text :func:`say_hangup_twiml` takes. Seed decision: a goodbye or refusal
#: prompt is a sentence or two. Sized so that even text made only of ``&`` (escaped to ``&amp;``,
#: five times longer) stays under :data:`MAX_INLINE_TWIML_CHARS` once wrapped, and so that
#: 4-byte UTF-8 text stays under Twilio's smallest TTS limit, 3000 bytes for Polly voices
#: (twilio.com/docs/api/errors/13521).
MAX_SAY_CHARS = 500

#: E.164 number as Twilio's ``<Number>`` wants it: ``+``, a non-zero country-code digit, at most
#: 15 digits in all (ITU-T E.164 §6; Twilio "Formatting International Phone Numbers").
E164_PATTERN = re.compile(r"\+[1-9][0-9]{1,14}")

#: URI schemes a ``<Dial><Sip>`` target may use (TwiML ``<Sip>`` noun; ``sips`` = SIP over TLS,
#: RFC 3261 §19.1).
SIP_URI_SCHEMES = frozenset({"sip", "sips"})

#: ``sip:[userinfo@]host[:port][;params][?headers]`` (RFC 3261 §25.1), restricted to the characters
#: that grammar allows unescaped, so nothing that could end the URI (spaces, quotes, ``<``/``>``)
#: passes. The host is checked further in :func:`parse_transfer_destination`.
_SIP_URI = re.compile(
    r"(?P<scheme>[A-Za-z]+):"
    r"(?:(?P<userinfo>[A-Za-z0-9\-_.!~*'()%&=+$,;?/:]+)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<params>;[A-Za-z0-9\-_.!~*'()%\[\]/:&+$=;]*)?"
    r"(?P<headers>\?[A-Za-z0-9\-_.!~*'()%\[\]/?:+$=&]*)?"
)

#: One DNS label: letters, digits, inner hyphens (RFC 1123 §2.1).
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?")

#: Highest TCP/UDP port number (RFC 793 / RFC 768: 16-bit port field).
_MAX_PORT = 65535


def connect_stream_twiml(
    stream_url: str,
    parameters: Mapping[str, str],
    *,
    stream_name: str | None = None,
    status_callback: str | None = None,
) -> str:
    """``<Connect><Stream>``: fork the call to our media socket, bidirectionally.

    ``parameters`` become ``<Parameter>`` children, delivered in
    ``start.customParameters``. Raises ``ValueError`` for a stream URL that is not
    an absolute ``ws://``/``wss://`` URL, or that has a query string or fragment
    (Twilio does not support a query string on stream URLs, docs/PROVIDERS.md §1.2).
    """
    split = _split_url(stream_url, "stream_url")
    if split.scheme not in STREAM_URL_SCHEMES or not split.hostname:
        raise ValueError("stream_url must be an absolute ws:// or wss:// URL")
    if "?" in stream_url or "#" in stream_url:
        raise ValueError("stream_url must not have a query string or fragment; use parameters")
    stream_attrs = {"url": checked_text(stream_url, "stream_url")}
    if stream_name is not None:
        stream_attrs["name"] = checked_text(stream_name, "stream_name")
    if status_callback is not None:
        callback = _split_url(status_callback, "status_callback")
        if callback.scheme not in STATUS_CALLBACK_SCHEMES or not callback.hostname:
            raise ValueError("status_callback must be an absolute http:// or https:// URL")
        stream_attrs["statusCallback"] = checked_text(status_callback, "status_callback")

    return connect_stream_document(stream_attrs, parameters)


def reject_twiml(reason: str = "rejected") -> str:
    """``<Reject reason>``: refuse the call without answering it (no charge for the caller).

    ``reason`` is ``"rejected"`` or ``"busy"`` (what the caller hears); anything
    else is a ``ValueError``. Used for admission refusals of inbound calls.
    """
    if reason not in REJECT_REASONS:
        raise ValueError(f"reject reason must be one of {sorted(REJECT_REASONS)}")
    response = ET.Element("Response")
    ET.SubElement(response, "Reject", {"reason": reason})
    return xml_document(response)


def say_hangup_twiml(message: str) -> str:
    """``<Say>`` a short message, then ``<Hangup/>`` (goodbye and refusal prompts).

    The text is escaped by ElementTree; ``ValueError`` for an empty message, one
    longer than :data:`MAX_SAY_CHARS`, or one with characters XML cannot carry.
    The document always fits Twilio's inline-TwiML limit, so it can be sent as a
    redirect's ``Twiml=``.
    """
    if not message.strip():
        raise ValueError("message must not be empty")
    if len(message) > MAX_SAY_CHARS:
        raise ValueError(f"message must be at most {MAX_SAY_CHARS} characters")
    response = ET.Element("Response")
    say = ET.SubElement(response, "Say")
    say.text = checked_text(message, "message")
    ET.SubElement(response, "Hangup")
    document = xml_document(response)
    # Guaranteed by MAX_SAY_CHARS (worst-case escaping); checked so a change there cannot slip.
    if len(document) > MAX_INLINE_TWIML_CHARS:
        raise ValueError("message is too long once escaped for inline TwiML")
    return document


class TransferKind(StrEnum):
    """Which ``<Dial>`` noun a transfer destination becomes."""

    NUMBER = "number"  # <Number>: a PSTN number in E.164
    SIP = "sip"  # <Sip>: a SIP or SIPS URI


@dataclass(frozen=True, slots=True)
class TransferDestination:
    """A checked transfer target: safe to put in ``<Dial>`` as-is."""

    kind: TransferKind
    address: str


def parse_transfer_destination(destination: str) -> TransferDestination:
    """Check ``destination`` (an E.164 number or a ``sip:``/``sips:`` URI) for a transfer.

    Raises ``ValueError`` saying what is wrong. Nothing is trimmed or reformatted:
    a brain's ``"+1 (555) 123-4567"`` is refused rather than guessed at. The SIP
    scheme is lower-cased (schemes are case-insensitive, RFC 3261 §19.1.4).
    """
    if E164_PATTERN.fullmatch(destination):
        return TransferDestination(TransferKind.NUMBER, destination)
    scheme, colon, _ = destination.partition(":")
    if not colon or scheme.lower() not in SIP_URI_SCHEMES:
        raise ValueError(
            "transfer destination must be an E.164 number like +15551230000 "
            "or a sip:/sips: URI like sip:agent@pbx.example.com"
        )
    match = _SIP_URI.fullmatch(destination)
    if match is None:
        raise ValueError("transfer destination is not a well-formed SIP URI")
    if not _is_sip_host(match["host"]):
        raise ValueError("transfer destination SIP URI has an invalid host")
    port = match["port"]
    if port is not None and not 0 < int(port) <= _MAX_PORT:
        raise ValueError("transfer destination SIP URI has an invalid port")
    return TransferDestination(TransferKind.SIP, scheme.lower() + destination[len(scheme) :])


def is_valid_transfer_destination(destination: str) -> bool:
    """Whether :func:`transfer_twiml` accepts ``destination``."""
    try:
        parse_transfer_destination(destination)
    except ValueError:
        return False
    return True


def transfer_twiml(destination: str) -> str:
    """``<Dial>`` the caller to ``destination``: ``<Number>`` for E.164, ``<Sip>`` for a SIP URI.

    Sent as ``Twiml=`` when redirecting a live call (docs/PROVIDERS.md §1.6). When the
    ``<Dial>`` ends, the TwiML ends and Twilio hangs up the caller. Raises
    ``ValueError`` for anything else (see :func:`parse_transfer_destination`).
    """
    parsed = parse_transfer_destination(destination)
    response = ET.Element("Response")
    dial = ET.SubElement(response, "Dial")
    noun = ET.SubElement(dial, "Number" if parsed.kind is TransferKind.NUMBER else "Sip")
    noun.text = parsed.address
    return xml_document(response)


def _is_sip_host(host: str) -> bool:
    """An IPv6 reference ``[…]``, an IPv4 address or a DNS name (RFC 3261 §25.1 ``host``)."""
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    labels = host.removesuffix(".").split(".")
    return all(_DNS_LABEL.fullmatch(label) for label in labels)


def _split_url(url: str, what: str) -> SplitResult:
    """Parse ``url``, turning a malformed port or IPv6 host into ``ValueError`` with context."""
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 - reading the port is what validates it
    except ValueError as exc:
        raise ValueError(f"{what} is not a valid URL") from exc
    return split
