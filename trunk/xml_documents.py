"""XML documents the providers' webhooks answer with (TwiML, TeXML, Plivo XML).

They are built with :mod:`xml.etree.ElementTree`, which escapes text and attribute
values, so untrusted values (caller numbers, messages) are never spliced into XML
strings. ElementTree does not reject characters XML 1.0 forbids (NUL, most C0
controls, lone surrogates), so those are refused here rather than producing a
document the provider cannot parse.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

__all__ = [
    "XML_DECLARATION",
    "checked_text",
    "connect_stream_document",
    "xml_can_carry",
    "xml_document",
]

#: The declaration the providers' own helper libraries emit (twilio-python
#: ``TwiML.to_xml``; TeXML and Plivo XML take the same).
XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>'
#: Characters outside the XML 1.0 ``Char`` production (W3C XML 1.0 §2.2).
_INVALID_XML_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_can_carry(value: str) -> bool:
    """Whether every character of ``value`` is one XML 1.0 can carry (W3C XML 1.0 §2.2)."""
    return _INVALID_XML_CHARS.search(value) is None


def checked_text(value: str, what: str) -> str:
    """``value`` if XML can carry it; ``ValueError`` naming ``what`` otherwise."""
    if not xml_can_carry(value):
        raise ValueError(f"{what} contains a character XML cannot carry")
    return value


def xml_document(root: ET.Element) -> str:
    """``root`` as a whole document, declaration first."""
    return XML_DECLARATION + ET.tostring(root, encoding="unicode")


def connect_stream_document(stream: Mapping[str, str], parameters: Mapping[str, str]) -> str:
    """``<Response><Connect><Stream …>`` with ``stream``'s attributes (already checked by
    the caller) and one ``<Parameter name value>`` per entry of ``parameters`` (TwiML
    and TeXML share this form). Raises ``ValueError`` for an empty parameter name or a
    value XML cannot carry."""
    response = ET.Element("Response")
    element = ET.SubElement(ET.SubElement(response, "Connect"), "Stream", dict(stream))
    for name, value in parameters.items():
        if not name:
            raise ValueError("parameter names must not be empty")
        ET.SubElement(
            element,
            "Parameter",
            {
                "name": checked_text(name, "parameter name"),
                "value": checked_text(value, "parameter"),
            },
        )
    return xml_document(response)
