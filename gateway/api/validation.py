"""Request validation: bytes and query strings in, checked dicts out, or an :class:`ApiError`.

Bodies are parsed strictly (UTF-8, one JSON object, no duplicate keys, no
NaN/Infinity, no giant integers, no lone surrogates) and then checked against
the schemas in :mod:`gateway.api.schemas` with ``jsonschema`` (draft 2020-12,
strict about integers and ``$``: :mod:`rutster.base.strict_schema`).
A number with a zero fractional part (``6000.0``, ``6e3``) is an integer, as in
JSON Schema 2020-12, and is handed on as a Python ``int``. When several
things are wrong, ``jsonschema.exceptions.best_match`` picks one
deterministically (the shallowest error first: an unknown top-level field beats
a bad nested value), and the message names the field (``limits.max_cost``) and
what is wrong with it in words, never a dump of the offending value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NoReturn

from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from starlette.requests import ClientDisconnect, Request

from rutster.base.strict_schema import StrictValidator, ecma_regex
from rutster.gateway.api.errors import (
    invalid_request,
    payload_too_large,
    unsupported_media_type,
)
from rutster.gateway.api.schemas import (
    CALLS_QUERY_SCHEMA,
    CREATE_CALL_SCHEMA,
    MAX_METADATA_JSON_BYTES,
    PATTERN_HINTS,
    SPEND_QUERY_SCHEMA,
    Schema,
)

#: Largest request body: 16 KiB. The largest valid body (a create-call request
#: with a 2 KiB URL and 2 KiB of metadata) is ~5 KiB; 16 KiB leaves room for
#: whitespace and \\u escapes while bounding the parsing work per request.
MAX_BODY_BYTES = 16 * 1024
#: Longest integer literal accepted in a body: every value below 10**18 fits a
#: signed 64-bit Redis integer, and every bound in the schemas is far lower.
#: (Python would otherwise parse a 4,000-digit number, slowly.)
MAX_INTEGER_DIGITS = 18
#: Longest integer accepted in a query string (``limit``, ``days``): all bounds
#: there are 3 digits; 9 keeps ``int()`` cheap and still reports "must be <= 200".
MAX_QUERY_INTEGER_DIGITS = 9
#: Longest unknown-field name quoted back in an error message.
MAX_QUOTED_NAME_CHARS = 40

_MEDIA_TYPE = "application/json"
_QUERY_INT = re.compile(rf"^-?[0-9]{{1,{MAX_QUERY_INTEGER_DIGITS}}}$")
_TYPE_WORDS = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


# Compiled validators, by schema identity (the schemas are module constants).
_VALIDATORS: dict[int, tuple[Schema, Validator]] = {}


def validator_for(schema: Schema) -> Validator:
    """The (cached) strict draft 2020-12 validator for ``schema``."""
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    StrictValidator.check_schema(schema)
    validator: Validator = StrictValidator(schema)
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


# --- body -----------------------------------------------------------------------


def require_json_content_type(content_type: str | None) -> None:
    """Raise 415 unless ``content_type`` is ``application/json`` (charset, if any, UTF-8)."""
    if not content_type:
        raise unsupported_media_type(content_type)
    media_type, _, params = content_type.partition(";")
    if media_type.strip().lower() != _MEDIA_TYPE:
        raise unsupported_media_type(content_type)
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            # RFC 8259 §8.1: JSON between systems is UTF-8.
            raise unsupported_media_type(content_type)


async def read_body(request: Request, *, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """Read the request body, refusing (413) as soon as it exceeds ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before reading; a
    chunked body is counted as it streams, so a huge body is never buffered.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise payload_too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise payload_too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise invalid_request("the client disconnected before sending the whole body") from None
    return b"".join(chunks)


class _BadJson(ValueError):
    """Raised from inside ``json.loads`` hooks; becomes a 422."""


def _reject_constant(name: str) -> NoReturn:
    raise _BadJson(f"{name} is not valid JSON (numbers must be finite)")


def _check_digits(digits: int) -> None:
    if digits > MAX_INTEGER_DIGITS:
        raise _BadJson(f"a number has {digits} digits; at most {MAX_INTEGER_DIGITS} are accepted")


def _parse_int(literal: str) -> int:
    _check_digits(len(literal.lstrip("-")))
    return int(literal)


def _parse_float(literal: str) -> float | int:
    # JSON Schema 2020-12 (validation §6.1.1): "integer" is any number with a zero
    # fractional part, so 6000.0 and 6e3 are integers. Decided on the exact decimal
    # value (Decimal parses the literal exactly; float would call 60.0000000000000001
    # an integer), and bounded like integer literals before int() builds it.
    exact = Decimal(literal)
    if exact == exact.to_integral_value():
        _check_digits(exact.adjusted() + 1 if exact else 1)
        return int(exact)
    value = float(literal)
    if not math.isfinite(value):
        raise _BadJson(f"number {literal[:MAX_QUOTED_NAME_CHARS]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _BadJson(f"duplicate key {_quote(key)}")
        result[key] = value
    return result


def _quote(name: str) -> str:
    if len(name) > MAX_QUOTED_NAME_CHARS:
        name = name[:MAX_QUOTED_NAME_CHARS] + "…"
    return repr(name)


def _loads(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_request(f"request body is not UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise invalid_request("request body is empty; send a JSON object")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except _BadJson as exc:
        raise invalid_request(f"malformed JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise invalid_request(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise invalid_request("malformed JSON: nested too deeply") from None
    try:
        # A \ud800 escape decodes to a lone surrogate, which no UTF-8 store or log
        # can hold (RFC 8259 §8.2: such strings behave unpredictably). Cheap: the
        # body is at most MAX_BODY_BYTES.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise invalid_request("malformed JSON: a string holds a lone UTF-16 surrogate") from None
    except RecursionError:
        raise invalid_request("malformed JSON: nested too deeply") from None
    return value


def parse_json_body(
    raw: bytes, schema: Schema, *, max_bytes: int = MAX_BODY_BYTES
) -> dict[str, Any]:
    """Parse ``raw`` as one JSON object and validate it against ``schema``.

    Raises :class:`ApiError`: 413 over ``max_bytes``; 422 (``invalid_request``)
    for anything else wrong, with ``field`` naming the offending field.
    """
    if len(raw) > max_bytes:
        raise payload_too_large(max_bytes)
    body = _loads(raw)
    if not isinstance(body, dict):
        raise invalid_request(f"request body must be a JSON object, not {_json_type(body)}")
    check_instance(body, schema)
    return body


def parse_create_call_body(raw: bytes, *, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """:func:`parse_json_body` for ``POST /v1/calls``, plus the metadata size cap.

    The call record stores metadata as one JSON string of at most
    ``MAX_METADATA_JSON_BYTES``; the per-entry caps of the schema alone would
    allow more.
    """
    body = parse_json_body(raw, CREATE_CALL_SCHEMA, max_bytes=max_bytes)
    metadata = body.get("metadata")
    if metadata:
        size = len(metadata_json(metadata).encode("utf-8"))
        if size > MAX_METADATA_JSON_BYTES:
            raise invalid_request(
                f"must be at most {MAX_METADATA_JSON_BYTES} bytes as compact UTF-8 JSON "
                f"(is {size})",
                "metadata",
            )
    return body


def metadata_json(metadata: Mapping[str, str]) -> str:
    """The compact JSON form of call metadata, as stored and as size-checked."""
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def check_instance(instance: Mapping[str, Any], schema: Schema) -> None:
    """Validate an already-parsed object; raise a 422 for the most relevant error."""
    error = best_match(validator_for(schema).iter_errors(instance))
    if error is not None:
        field, message = describe_error(error)
        raise invalid_request(message, field)


# --- messages ---------------------------------------------------------------------


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _field(path: Iterable[object]) -> str | None:
    return ".".join(str(part) for part in path) or None


def describe_error(error: ValidationError) -> tuple[str | None, str]:
    """``(field, message)`` for one jsonschema error, in words (never the raw value)."""
    path = list(error.absolute_path)
    keyword = error.validator
    value: Any = error.validator_value
    instance: Any = error.instance
    if "propertyNames" in error.absolute_schema_path and isinstance(instance, str):
        # propertyNames errors point at the object; the instance is the key.
        return _field(path), f"key {_quote(instance)} {_keyword_message(keyword, value)}"
    if keyword == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extras = sorted(key for key in instance if key not in known)
        if extras:
            return _field([*path, extras[0]]), f"unknown field {_quote(extras[0])}"
    if keyword == "required" and isinstance(instance, dict):
        missing = [name for name in value if name not in instance]
        if missing:
            return _field([*path, missing[0]]), "is required"
    return _field(path), _keyword_message(keyword, value)


def _keyword_message(keyword: object, value: Any) -> str:
    if keyword == "type":
        types = [value] if isinstance(value, str) else list(value)
        return "must be " + " or ".join(_TYPE_WORDS.get(t, t) for t in types)
    if keyword == "minimum":
        return f"must be >= {value}"
    if keyword == "maximum":
        return f"must be <= {value}"
    if keyword == "pattern":
        return PATTERN_HINTS.get(value, "has an invalid format")
    if keyword == "maxLength":
        return f"must be at most {value} characters"
    if keyword == "minLength":
        return "must not be empty" if value == 1 else f"must be at least {value} characters"
    if keyword == "enum":
        return "must be one of " + ", ".join(json.dumps(v) for v in value)
    if keyword == "const":
        return f"must be {json.dumps(value)}"
    if keyword == "maxProperties":
        return f"must have at most {value} entries"
    if keyword == "minProperties":
        return f"must have at least {value} field{'s' if value != 1 else ''}"
    if keyword == "maxItems":
        return f"must have at most {value} items"
    return "is invalid"


# --- query strings ------------------------------------------------------------------


def parse_query_params(items: Iterable[tuple[str, str]], schema: Schema) -> dict[str, Any]:
    """Check query parameters (``request.query_params.multi_items()``) against ``schema``.

    Integer parameters are converted first; unknown or repeated parameters are
    refused; absent ones get the schema's ``default``. Raises a 422 naming the
    parameter.
    """
    properties: Mapping[str, Schema] = schema["properties"]
    values: dict[str, Any] = {}
    for name, text in items:
        prop = properties.get(name)
        if prop is None:
            raise invalid_request(
                f"unknown query parameter {_quote(name)}", name[:MAX_QUOTED_NAME_CHARS]
            )
        if name in values:
            raise invalid_request("must be given at most once", name)
        if prop.get("type") == "integer":
            if not _QUERY_INT.fullmatch(text):
                raise invalid_request("must be an integer", name)
            values[name] = int(text)
        else:
            values[name] = text
    check_instance(values, schema)
    for name, prop in properties.items():
        if name not in values and "default" in prop:
            values[name] = prop["default"]
    return values


@dataclass(frozen=True, slots=True)
class CallsQuery:
    """``GET /v1/calls`` parameters."""

    status: str | None
    limit: int
    cursor: str | None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class SpendQuery:
    """``GET /v1/spend`` parameters."""

    days: int
    tenant: str | None = None


def parse_calls_query(items: Iterable[tuple[str, str]]) -> CallsQuery:
    """``status`` (enum), ``limit`` (1..200, default 50), ``cursor``, ``tenant``."""
    values = parse_query_params(items, CALLS_QUERY_SCHEMA)
    return CallsQuery(
        status=values.get("status"),
        limit=values["limit"],
        cursor=values.get("cursor"),
        tenant=values.get("tenant"),
    )


def parse_spend_query(items: Iterable[tuple[str, str]]) -> SpendQuery:
    """``days`` (1..90, default 7), ``tenant`` (whose; an admin key must name one)."""
    values = parse_query_params(items, SPEND_QUERY_SCHEMA)
    return SpendQuery(days=values["days"], tenant=values.get("tenant"))


# --- path parameters ------------------------------------------------------------------


def check_path_param(name: str, value: str, pattern: str) -> str:
    """Return ``value`` if it matches ``pattern`` (a schemas.py pattern), else a 422."""
    if ecma_regex(pattern).search(value) is None:
        raise invalid_request(PATTERN_HINTS.get(pattern, "has an invalid format"), name)
    return value
