"""Reading a provider's form-encoded webhook safely: size, field count, encoding.

Twilio's voice webhook and Telnyx's TeXML webhook both POST
``application/x-www-form-urlencoded`` bodies of a few hundred bytes to ~2 KB
(docs/PROVIDERS.md §1.1, §2.1). Both are read here under the same bounds, before
anything is parsed or any signature checked: the raw body (what Telnyx signs) and
its fields (what Twilio signs), or the error response to send.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rutster.gateway.metrics import GatewayMetrics

#: Largest webhook body accepted. The providers' form posts are a few hundred bytes to
#: ~2 KB (docs/PROVIDERS.md §1.1 field list); 16 KiB leaves ample margin. It was 64 KiB
#: until 2026-12-05: percent-decoding that much costs the event loop 4-5 ms per
#: request, signed or not (measured, 2-core dev VM), about 1.2 ms at 16 KiB.
MAX_WEBHOOK_BODY_BYTES = 16 * 1024
#: Most form fields a webhook may carry. Twilio's voice and status webhooks send
#: about 30 (docs/PROVIDERS.md §1.1 field list), plus one ``SipHeader_*`` per custom SIP
#: header on SIP calls; 200 leaves ample margin. Without it a 64 KiB body of short
#: fields (~6,500-11,000) cost the event loop 23-40 ms to parse and check the
#: signature of (measured, 2-core dev VM, 2026-12-05): every call on the gateway
#: stalled that long per such request, signed or not. 199 fields cost 0.24 ms.
MAX_WEBHOOK_FIELDS = 200
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class WebhookForm:
    """A webhook's body as sent, and its fields in order."""

    body: bytes
    fields: list[tuple[str, str]]


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it passes ``limit`` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def too_many_fields(body: bytes) -> bool:
    """More than :data:`MAX_WEBHOOK_FIELDS` fields, counted before anything is parsed."""
    return body.count(b"&") >= MAX_WEBHOOK_FIELDS


async def read_form(
    request: Request, metrics: GatewayMetrics, source: str
) -> WebhookForm | Response:
    """The webhook's form, or the response refusing it (counted under ``source``)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != FORM_CONTENT_TYPE:
        metrics.bad_messages.labels(source, "bad_content_type").inc()
        return PlainTextResponse(f"expected {FORM_CONTENT_TYPE}", 415)
    body = await read_body(request, MAX_WEBHOOK_BODY_BYTES)
    if body is None:
        metrics.bad_messages.labels(source, "too_large").inc()
        return PlainTextResponse("request body too large", 413)
    if too_many_fields(body):
        metrics.bad_messages.labels(source, "too_many_fields").inc()
        return PlainTextResponse(f"more than {MAX_WEBHOOK_FIELDS} form fields", 413)
    try:
        fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        metrics.bad_messages.labels(source, "bad_body").inc()
        return PlainTextResponse("malformed form body", 400)
    return WebhookForm(body=body, fields=fields)
