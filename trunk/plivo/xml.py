"""Plivo XML documents the answer webhook replies with (docs/PROVIDERS.md §4.1-4.2).

``<Stream bidirectional="true" keepCallAlive="true">`` forks the call to our media
socket both ways, μ-law at 8 kHz (``contentType``), inbound track only; the socket's
URL is the element's text. ``keepCallAlive`` holds the call for as long as the
socket is open, and nothing follows the stream: closing the socket ends the call.
Rejection is ``<Hangup reason>``; a spoken refusal ``<Speak>`` then ``<Hangup>``
(element and attribute names as plivo-python's ``plivo/xml``). Built with
:mod:`xml.etree.ElementTree`; characters XML 1.0 cannot carry are refused.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from rutster.trunk.xml_documents import checked_text, xml_can_carry, xml_document

__all__ = ["HANGUP_REASONS", "dial_xml", "hangup_xml", "speak_hangup_xml", "stream_xml"]

#: ``<Hangup reason>`` values that refuse a call (plivo-python ``HangupElement``).
HANGUP_REASONS = frozenset({"rejected", "busy"})
#: The stream our codec (``trunk/plivo/codec.py``) speaks: both ways, caller's track,
#: μ-law 8 kHz, the call held while the socket is open (§4.2).
STREAM_ATTRIBUTES = {
    "bidirectional": "true",
    "keepCallAlive": "true",
    "audioTrack": "inbound",
    "contentType": "audio/x-mulaw;rate=8000",
}


def stream_xml(stream_url: str) -> str:
    """``<Stream>`` to ``stream_url`` (ws/wss; its query carries the stream's parameters)."""
    if not stream_url.startswith(("wss://", "ws://")) or not xml_can_carry(stream_url):
        raise ValueError("the stream URL must be a ws:// or wss:// URL XML can carry")
    response = ET.Element("Response")
    ET.SubElement(response, "Stream", STREAM_ATTRIBUTES).text = stream_url
    return xml_document(response)


def hangup_xml(reason: str) -> str:
    """``<Hangup reason>``: refuse the call."""
    if reason not in HANGUP_REASONS:
        raise ValueError(f"hang-up reason must be one of {sorted(HANGUP_REASONS)}")
    response = ET.Element("Response")
    ET.SubElement(response, "Hangup", {"reason": reason})
    return xml_document(response)


def speak_hangup_xml(text: str) -> str:
    """``<Speak>`` a sentence, then ``<Hangup/>``."""
    if not xml_can_carry(text):
        raise ValueError("the text holds a character XML cannot carry")
    response = ET.Element("Response")
    ET.SubElement(response, "Speak").text = text
    ET.SubElement(response, "Hangup")
    return xml_document(response)


def dial_xml(destination: str) -> str:
    """``<Dial>`` the caller to ``destination``: an E.164 number (``<Number>``, digits
    without the ``+``, as Plivo writes numbers) or a SIP URI (``<User>``), as
    plivo-python's ``DialElement``, ``NumberElement`` and ``UserElement`` write them."""
    checked_text(destination, "dial destination")
    response = ET.Element("Response")
    dial = ET.SubElement(response, "Dial")
    if destination.startswith(("sip:", "sips:")):
        ET.SubElement(dial, "User").text = destination
    else:
        ET.SubElement(dial, "Number").text = destination.removeprefix("+")
    return xml_document(response)
