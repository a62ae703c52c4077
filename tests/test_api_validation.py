"""Request validation: strict JSON parsing, schema errors in words, query strings, errors' shape."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rutster.base.strict_schema import ecma_regex
from rutster.gateway.api import errors
from rutster.gateway.api.errors import ApiError, error_response, handle_api_error
from rutster.gateway.api.schemas import (
    BRAIN_PATTERN,
    CALL_COST_PATTERN,
    CALL_ID_PATTERN,
    CALLS_QUERY_SCHEMA,
    CREATE_CALL_SCHEMA,
    CREATE_KEY_SCHEMA,
    CURSOR_PATTERN,
    KEY_LABEL_PATTERN,
    KILL_SWITCH_SCHEMA,
    MAX_CALL_DURATION_S,
    MAX_METADATA_ENTRIES,
    MAX_METADATA_JSON_BYTES,
    MAX_METADATA_VALUE_CHARS,
    MONEY_PATTERN,
    PATTERN_HINTS,
    POSITIVE_CALL_COST_PATTERN,
    REQUEST_SCHEMAS,
    RESPONSE_SCHEMAS,
    SPEND_QUERY_SCHEMA,
    TENANT_LIMITS_SCHEMA,
    Schema,
)
from rutster.gateway.api.validation import (
    MAX_BODY_BYTES,
    MAX_INTEGER_DIGITS,
    CallsQuery,
    SpendQuery,
    check_path_param,
    parse_calls_query,
    parse_create_call_body,
    parse_json_body,
    parse_spend_query,
    read_body,
    require_json_content_type,
    validator_for,
)
from rutster.spend.tenant_id import TENANT_ID_PATTERN

MINIMAL_CALL = {"to": "+15551234567", "from": "+15557654321", "provider": "twilio"}
FULL_CALL = {
    "to": "+442071234567",
    "from": "+15557654321",
    "provider": "twilio",
    "brain": "wss://brain.example.com/tap",
    "limits": {"max_duration_s": 600, "max_cost": "0.50"},
    "metadata": {"crm_id": "A-123", "note": "callback"},
    "campaign": "spring.sale-2026",
}


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode()


def _error(raw: bytes, schema: Schema = CREATE_CALL_SCHEMA, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        if schema is CREATE_CALL_SCHEMA:
            parse_create_call_body(raw, **kwargs)
        else:
            parse_json_body(raw, schema, **kwargs)
    return info.value


def _with(**fields: Any) -> dict[str, Any]:
    return {**MINIMAL_CALL, **fields}


# --- valid bodies ------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        MINIMAL_CALL,
        FULL_CALL,
        _with(provider="sip", to="sip:alice@pbx.example.com"),
        _with(provider="sip", to="sips:+15551234567@trunk.example.com:5061;transport=tls"),
        _with(provider="sip", to="+15551234567"),
        _with(brain="echo"),
        _with(limits={}),
        _with(limits={"max_cost": "10000"}),
        _with(limits={"max_cost": "10000.000000"}),
        _with(limits={"max_cost": "0.000001"}),
        _with(limits={"max_duration_s": 1}),
        _with(limits={"max_duration_s": MAX_CALL_DURATION_S}),
        _with(metadata={}),
        _with(metadata={"ключ": "значение ✓"}),
    ],
)
def test_valid_call_bodies_are_returned_unchanged(body: dict[str, Any]) -> None:
    assert parse_create_call_body(_raw(body)) == body


@pytest.mark.parametrize(
    ("literal", "value"),
    [("60.0", 60), ("6e1", 60), ("6.0E+1", 60), ("600e-1", 60), ("1.000000000000000000", 1),
     ("86400.0", 86_400), ("9.99999999999999999e17", 999_999_999_999_999_990)],
)  # fmt: skip
def test_integral_numbers_are_integers(literal: str, value: int) -> None:
    # JSON Schema 2020-12: any number with a zero fractional part is an integer. They reach
    # the handlers as ints, never floats (Redis and the spend gate count in ints).
    raw = _raw(MINIMAL_CALL)[:-1] + b', "limits": {"max_duration_s": ' + literal.encode() + b"}}"
    if value > MAX_CALL_DURATION_S:
        assert _error(raw).message == f"must be <= {MAX_CALL_DURATION_S}"
        return
    limits = parse_create_call_body(raw)["limits"]
    assert limits == {"max_duration_s": value} and type(limits["max_duration_s"]) is int
    put = parse_json_body(b'{"campaign_calls_per_minute": 6000.0}', TENANT_LIMITS_SCHEMA)
    assert put == {"campaign_calls_per_minute": 6000}
    assert type(put["campaign_calls_per_minute"]) is int


@pytest.mark.parametrize(
    "literal", ["60.5", "60.0000000000000001", "1e-400", "-0.5e-3", "59.999999999999999999"]
)
def test_numbers_with_a_fraction_are_not_integers(literal: str) -> None:
    # Decided on the exact decimal, not on a float that rounded the fraction away.
    raw = b'{"max_concurrent": ' + literal.encode() + b"}"
    error = _error(raw, TENANT_LIMITS_SCHEMA)
    assert (error.field, error.message) == ("max_concurrent", "must be an integer")


def test_other_request_bodies_accept_valid_input() -> None:
    limits = {"budget_day": "25.00", "max_concurrent": 0, "max_call_cost": "10000"}
    assert parse_json_body(_raw(limits), TENANT_LIMITS_SCHEMA) == limits
    key = {"tenant": "acme-1", "label": "prod dialer", "role": "admin"}
    assert parse_json_body(_raw(key), CREATE_KEY_SCHEMA) == key
    assert parse_json_body(b'{"engaged": true}', KILL_SWITCH_SCHEMA) == {"engaged": True}


# --- schema errors, in words, with the field path ----------------------------------------

SCHEMA_CASES: list[tuple[dict[str, Any], str | None, str]] = [
    (_with(foo=1), "foo", "unknown field 'foo'"),
    (_with(limits={"max_cost": "1", "bogus": 2}), "limits.bogus", "unknown field 'bogus'"),
    ({"from": "+15557654321", "provider": "twilio"}, "to", "is required"),
    (_with(limits={"max_duration_s": "60"}), "limits.max_duration_s", "must be an integer"),
    (_with(limits={"max_duration_s": 60.5}), "limits.max_duration_s", "must be an integer"),
    (_with(limits={"max_duration_s": 0.0}), "limits.max_duration_s", "must be >= 1"),
    (_with(limits={"max_duration_s": True}), "limits.max_duration_s", "must be an integer"),
    (_with(limits={"max_duration_s": 86_401}), "limits.max_duration_s", "must be <= 86400"),
    (_with(limits={"max_duration_s": 0}), "limits.max_duration_s", "must be >= 1"),
    (_with(to="5551234567"), "to", "E.164 like +15551234567"),
    (_with(to="+1555"), "to", "E.164 like +15551234567"),
    (_with(to="+1" + "5" * 15), "to", "E.164 like +15551234567"),
    (_with(provider="sip", to="sip:"), "to", "or a sip: URI like sip:alice@pbx.example.com"),
    (_with(provider="sip", to="sip:a@b c"), "to", "or a sip: URI"),
    (_with(provider="sip", to="+1555"), "to", "E.164 number like +15551234567 (or a sip: URI"),
    (_with(to="+15551234567\n"), "to", "must match E.164 like +15551234567"),
    (_with(to="sip:alice@pbx.example.com"), "to", "must match E.164 like +15551234567"),
    (_with(**{"from": "alice"}), "from", "must match E.164 like +15551234567"),
    (
        _with(provider="bandwidth"),
        "provider",
        'must be one of "twilio", "sip", "telnyx", "plivo", "vonage"',
    ),
    (_with(provider="phone"), "provider", "must be one of"),  # answers calls, places none
    (_with(limits={"max_cost": 0.5}), "limits.max_cost", "must be a string"),
    (_with(limits={"max_cost": "0"}), "limits.max_cost", "> 0 and <= 10000"),
    (_with(limits={"max_cost": "10000.01"}), "limits.max_cost", "> 0 and <= 10000"),
    (_with(limits={"max_cost": "1.1234567"}), "limits.max_cost", "at most 6 decimals"),
    (_with(limits={"max_cost": "-1"}), "limits.max_cost", "> 0 and <= 10000"),
    (_with(limits={"max_cost": "1e3"}), "limits.max_cost", "> 0 and <= 10000"),
    (_with(limits="cheap"), "limits", "must be an object"),
    (_with(brain="Not A Name"), "brain", "configured brain name"),
    (_with(brain="http://brain.example.com"), "brain", "ws:// or wss:// URL"),
    (_with(brain="wss://" + "a" * 2048), "brain", "must be at most 2048 characters"),
    (_with(brain="ws://brain.example/\x01tap"), "brain", "printable ASCII"),
    (_with(brain="ws://brain.example/\x1ctap"), "brain", "printable ASCII"),
    (_with(brain="ws://brain.example/\x7f"), "brain", "printable ASCII"),
    (_with(brain="ws://brain.example/tap\n"), "brain", "printable ASCII"),
    (_with(brain="ws://brain.example/\ufefftap"), "brain", "printable ASCII"),
    (_with(brain="ws://brain.example/tap?x=1"), "brain", "no spaces, query, fragment"),
    (_with(brain="ws://brain.example/tap#x"), "brain", "no spaces, query, fragment"),
    (_with(brain="ws://brain.example/%2e%2e/"), "brain", "no spaces, query, fragment"),
    (_with(brain="ws://bräin.example/"), "brain", "printable ASCII"),
    (_with(campaign="spring sale"), "campaign", "letters, digits"),
    (_with(metadata={"k": 1}), "metadata.k", "must be a string"),
    (_with(metadata={"k": "v" * 257}), "metadata.k", "must be at most 256 characters"),
    (_with(metadata={"a\n": "x"}), "metadata", "key 'a\\n' must be 1..40 characters"),
    (_with(metadata={"a\x9b": "x"}), "metadata", "without control characters"),
    (_with(metadata={"k" * 41: "x"}), "metadata", "must be 1..40 characters"),
    (
        _with(metadata={f"k{i}": "v" for i in range(MAX_METADATA_ENTRIES + 1)}),
        "metadata",
        "must have at most 16 entries",
    ),
]


@pytest.mark.parametrize(("body", "field", "message"), SCHEMA_CASES)
def test_schema_errors_name_the_field_and_the_problem(
    body: dict[str, Any], field: str | None, message: str
) -> None:
    error = _error(_raw(body))
    assert (error.status, error.code) == (422, "invalid_request")
    assert error.field == field
    assert message in error.message
    # The message says what is wrong, it does not dump the offending value.
    assert "v" * 100 not in error.message and "a" * 100 not in error.message


@pytest.mark.parametrize(
    ("schema", "body", "field", "message"),
    [
        (TENANT_LIMITS_SCHEMA, {}, None, "must have at least 1 field"),
        (TENANT_LIMITS_SCHEMA, {"budget_day": 25}, "budget_day", "must be a string"),
        (TENANT_LIMITS_SCHEMA, {"budget_day": "12345678"}, "budget_day", "7 integer digits"),
        (TENANT_LIMITS_SCHEMA, {"max_concurrent": -1}, "max_concurrent", "must be >= 0"),
        (TENANT_LIMITS_SCHEMA, {"max_concurrent": 10**9}, "max_concurrent", "must be <= 100000"),
        (TENANT_LIMITS_SCHEMA, {"max_call_cost": "20000"}, "max_call_cost", "0..10000"),
        (
            TENANT_LIMITS_SCHEMA,
            {"caller_calls_per_hour": 3601},
            "caller_calls_per_hour",
            "must be <= 3600",
        ),
        (CREATE_KEY_SCHEMA, {}, "tenant", "is required"),
        (CREATE_KEY_SCHEMA, {"tenant": "Acme"}, "tenant", "lowercase letters"),
        (CREATE_KEY_SCHEMA, {"tenant": "acme", "role": "root"}, "role", "must be one of"),
        (CREATE_KEY_SCHEMA, {"tenant": "acme", "label": ""}, "label", "1..64 characters"),
        (CREATE_KEY_SCHEMA, {"tenant": "acme", "label": "a\x00"}, "label", "control"),
        (CREATE_KEY_SCHEMA, {"tenant": "acme", "label": "a\x85"}, "label", "control"),
        (KILL_SWITCH_SCHEMA, {"engaged": 1}, "engaged", "must be true or false"),
        (KILL_SWITCH_SCHEMA, {"engaged": "yes"}, "engaged", "must be true or false"),
        (KILL_SWITCH_SCHEMA, {}, "engaged", "is required"),
    ],
)
def test_other_bodies_errors(
    schema: Schema, body: dict[str, Any], field: str | None, message: str
) -> None:
    error = _error(_raw(body), schema)
    assert (error.status, error.field) == (422, field)
    assert message in error.message


def test_metadata_is_capped_by_its_serialized_size() -> None:
    # 10 entries of 256 two-byte characters: within the per-entry caps, over 2 KiB.
    metadata = {f"k{i}": "é" * MAX_METADATA_VALUE_CHARS for i in range(10)}
    error = _error(_raw(_with(metadata=metadata)))
    assert error.field == "metadata"
    assert f"at most {MAX_METADATA_JSON_BYTES} bytes" in error.message
    # Just under the cap passes.
    small = {f"k{i}": "é" * 90 for i in range(10)}
    assert parse_create_call_body(_raw(_with(metadata=small)))["metadata"] == small


def test_the_shallowest_error_wins_and_the_choice_is_stable() -> None:
    body = _with(zzz=1, aaa=2, limits={"max_duration_s": "x", "nope": 1}, to="bad")
    error = _error(_raw(body))
    # Unknown top-level fields beat nested problems; among them, the first by name.
    assert (error.field, error.message) == ("aaa", "unknown field 'aaa'")


@given(st.randoms(use_true_random=False))
@settings(max_examples=50, deadline=None)
def test_the_chosen_error_does_not_depend_on_key_order(rng: random.Random) -> None:
    body: dict[str, Any] = {
        "to": "bad",
        "from": "also bad",
        "provider": "vonage",
        "limits": {"max_duration_s": -5, "max_cost": 3, "extra": 1},
        "metadata": {"k": 1},
    }
    expected = _error(_raw(body))
    items = list(body.items())
    rng.shuffle(items)
    shuffled = dict(items)
    limits = list(body["limits"].items())
    rng.shuffle(limits)
    shuffled["limits"] = dict(limits)
    error = _error(_raw(shuffled))
    assert (error.field, error.message) == (expected.field, expected.message)


# --- malformed JSON and transport-level problems ----------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "request body is empty"),
        (b"   \n", "request body is empty"),
        (b"{bad", "malformed JSON at line 1 column 2"),
        (b'{"to": "+15551234567",}', "malformed JSON"),
        (b'{"to": "+15551234567"} {}', "malformed JSON"),
        (b'{"to": "a", "to": "b"}', "duplicate key 'to'"),
        (b'{"limits": {"max_cost": "1", "max_cost": "2"}}', "duplicate key 'max_cost'"),
        (b'{"to": NaN}', "NaN is not valid JSON"),
        (b'{"to": Infinity}', "Infinity is not valid JSON"),
        (b'{"to": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"to": 1e400}', "a number has 401 digits; at most 18 are accepted"),
        (b'{"to": 1e18}', "a number has 19 digits; at most 18 are accepted"),
        (b'{"to": 1E+1000000000}', "at most 18 are accepted"),
        (b'{"to": 1' + b"0" * 400 + b".5}", "out of range"),
        (b'{"to": "\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"metadata": {"\\udfff": "x"}}', "lone UTF-16 surrogate"),
        (b'{"to": ' + b"9" * (MAX_INTEGER_DIGITS + 1) + b"}", "at most 18 are accepted"),
        (b'{"to": -' + b"9" * 5000 + b"}", "at most 18 are accepted"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b'{"a":' * 3000 + b"1" + b"}" * 3000, "nested too deeply"),
        (b"[]", "must be a JSON object, not an array"),
        (b'"hello"', "must be a JSON object, not a string"),
        (b"null", "must be a JSON object, not null"),
        (b"42", "must be a JSON object, not an integer"),
        (b"\xff\xfe{}", "not UTF-8"),
        ('{"to": "é"}'.encode("latin-1"), "not UTF-8"),
        (b"\xef\xbb\xbf{}", "malformed JSON"),
    ],
)
def test_malformed_bodies_are_422_without_a_field(raw: bytes, message: str) -> None:
    error = _error(raw, max_bytes=len(raw) + 1)
    assert (error.status, error.code, error.field) == (422, "invalid_request", None)
    assert message in error.message


def test_the_largest_accepted_integer_still_reaches_the_schema() -> None:
    raw = b'{"engaged": ' + b"9" * MAX_INTEGER_DIGITS + b"}"
    error = _error(raw, KILL_SWITCH_SCHEMA)
    assert (error.field, error.message) == ("engaged", "must be true or false")


def test_body_size_limit_is_exact() -> None:
    body = _raw(_with(metadata={"pad": ""}))
    padded = body[:-1] + b" " * (MAX_BODY_BYTES - len(body)) + b"}"
    assert len(padded) == MAX_BODY_BYTES
    assert parse_create_call_body(padded)["to"] == MINIMAL_CALL["to"]
    error = _error(padded + b" ")
    assert (error.status, error.code) == (413, "payload_too_large")
    assert _error(body, max_bytes=len(body) - 1).status == 413


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        'application/json;charset="UTF-8"',
        "application/json; charset=utf8; foo=bar",
    ],
)
def test_json_content_types_are_accepted(content_type: str) -> None:
    require_json_content_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    [None, "", "text/plain", "application/x-www-form-urlencoded", "application/json-patch+json",
     "application/json; charset=latin-1", "multipart/form-data; boundary=x"],
)  # fmt: skip
def test_other_content_types_are_415(content_type: str | None) -> None:
    with pytest.raises(ApiError) as info:
        require_json_content_type(content_type)
    assert (info.value.status, info.value.code) == (415, "unsupported_media_type")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values, st.sampled_from(list(REQUEST_SCHEMAS.values())))
@settings(max_examples=300, deadline=None)
def test_any_json_gets_an_answer_never_a_crash(value: Any, schema: Schema) -> None:
    try:
        parse_json_body(json.dumps(value).encode(), schema)
    except ApiError as exc:
        assert exc.status in (413, 422)
        assert exc.message


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "to": st.sampled_from(["+15551234567", "sip:a@b.example", "x", 5]),
            "from": st.sampled_from(["+15557654321", "", None]),
            "provider": st.sampled_from(["twilio", "sip", "other"]),
            "brain": st.sampled_from(["echo", "wss://b.example/tap", "ftp://x"]),
            "limits": st.fixed_dictionaries(
                {},
                optional={
                    "max_duration_s": st.integers(-5, 100_000),
                    "max_cost": st.sampled_from(["0.5", "0", "10001", "abc", 1]),
                },
            ),
            "campaign": st.sampled_from(["c1", "", "a b"]),
            "extra": st.just(1),
        },
    )
)
@settings(max_examples=300, deadline=None)
def test_call_bodies_get_an_answer_never_a_crash(body: dict[str, Any]) -> None:
    try:
        assert parse_create_call_body(_raw(body)) == body
    except ApiError as exc:
        assert exc.status == 422
        assert exc.field is None or exc.field.split(".")[0] in body or exc.message == "is required"


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_get_an_answer_never_a_crash(raw: bytes) -> None:
    try:
        parse_json_body(raw, KILL_SWITCH_SCHEMA)
    except ApiError as exc:
        assert exc.status == 422


# --- query strings ---------------------------------------------------------------------


def test_calls_query_defaults_and_values() -> None:
    assert parse_calls_query([]) == CallsQuery(status=None, limit=50, cursor=None, tenant=None)
    assert parse_calls_query(
        [("status", "in_progress"), ("limit", "200"), ("cursor", "1700000000000:call_ab")]
    ) == CallsQuery(status="in_progress", limit=200, cursor="1700000000000:call_ab")
    assert parse_calls_query([("tenant", "acme")]).tenant == "acme"
    assert parse_spend_query([]) == SpendQuery(days=7)
    assert parse_spend_query([("days", "90")]) == SpendQuery(days=90)
    assert parse_spend_query([("tenant", "acme")]) == SpendQuery(days=7, tenant="acme")


@pytest.mark.parametrize(
    ("schema", "items", "field", "message"),
    [
        (CALLS_QUERY_SCHEMA, [("limit", "0")], "limit", "must be >= 1"),
        (CALLS_QUERY_SCHEMA, [("limit", "201")], "limit", "must be <= 200"),
        (CALLS_QUERY_SCHEMA, [("limit", "-3")], "limit", "must be >= 1"),
        (CALLS_QUERY_SCHEMA, [("limit", "ten")], "limit", "must be an integer"),
        (CALLS_QUERY_SCHEMA, [("limit", "1.5")], "limit", "must be an integer"),
        (CALLS_QUERY_SCHEMA, [("limit", "9" * 40)], "limit", "must be an integer"),
        (CALLS_QUERY_SCHEMA, [("limit", "")], "limit", "must be an integer"),
        (CALLS_QUERY_SCHEMA, [("limit", "5"), ("limit", "5")], "limit", "at most once"),
        (CALLS_QUERY_SCHEMA, [("status", "done")], "status", "must be one of"),
        (CALLS_QUERY_SCHEMA, [("cursor", "a" * 129)], "cursor", "next_cursor"),
        (CALLS_QUERY_SCHEMA, [("cursor", "a b")], "cursor", "next_cursor"),
        (CALLS_QUERY_SCHEMA, [("cursor", "")], "cursor", "next_cursor"),
        (CALLS_QUERY_SCHEMA, [("cursor", "garbage")], "cursor", "next_cursor"),
        (CALLS_QUERY_SCHEMA, [("cursor", "1700000000000:CA12")], "cursor", "next_cursor"),
        (CALLS_QUERY_SCHEMA, [("tenant", "Acme")], "tenant", "lowercase letters"),
        (CALLS_QUERY_SCHEMA, [("Limit", "5")], "Limit", "unknown query parameter 'Limit'"),
        (SPEND_QUERY_SCHEMA, [("days", "0")], "days", "must be >= 1"),
        (SPEND_QUERY_SCHEMA, [("days", "91")], "days", "must be <= 90"),
        (SPEND_QUERY_SCHEMA, [("since", "2026-01-01")], "since", "unknown query parameter"),
        (SPEND_QUERY_SCHEMA, [("tenant", "Acme")], "tenant", "lowercase letters"),
    ],
)
def test_bad_query_parameters_are_422(
    schema: Schema, items: list[tuple[str, str]], field: str, message: str
) -> None:
    with pytest.raises(ApiError) as info:
        if schema is CALLS_QUERY_SCHEMA:
            parse_calls_query(items)
        else:
            parse_spend_query(items)
    assert (info.value.status, info.value.field) == (422, field)
    assert message in info.value.message


def test_path_parameters() -> None:
    assert check_path_param("id", "call_0a1b", CALL_ID_PATTERN) == "call_0a1b"
    assert check_path_param("id", "acme", TENANT_ID_PATTERN) == "acme"
    for bad in ("call_XYZ", "call_", "call_ab\n", "../etc"):
        with pytest.raises(ApiError) as info:
            check_path_param("id", bad, CALL_ID_PATTERN)
        assert (info.value.status, info.value.field) == (422, "id")


# --- the schemas themselves ---------------------------------------------------------------


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)


ALL_SCHEMAS = [*REQUEST_SCHEMAS.values(), *RESPONSE_SCHEMAS.values()]
ALL_SCHEMAS += [CALLS_QUERY_SCHEMA, SPEND_QUERY_SCHEMA]


@pytest.mark.parametrize("schema", ALL_SCHEMAS, ids=lambda s: str(s.get("title")))
def test_schemas_are_valid_closed_and_every_pattern_has_a_hint(schema: Schema) -> None:
    validator_for(schema)  # check_schema raises on an invalid schema
    for pattern in _patterns(schema):
        assert pattern in PATTERN_HINTS, pattern
        assert pattern.startswith("^") and pattern.endswith("$"), pattern

    def closed(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False, path
            for key, value in node.items():
                closed(value, f"{path}/{key}")
        elif isinstance(node, list):
            for item in node:
                closed(item, path)

    closed(schema, "")


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        (MONEY_PATTERN, ["0", "0.5", "9999999.999999", "25.00"], ["", "1.", ".5", "10000000",
                                                                  "1.1234567", "-1", "1e3"]),
        (CALL_COST_PATTERN, ["0", "10000", "10000.000000", "9999.999999"],
         ["10000.000001", "10001", "12345", "0.1234567"]),
        (POSITIVE_CALL_COST_PATTERN, ["0.000001", "10000", "0.5"], ["0", "0.0", "000.000000"]),
        (TENANT_ID_PATTERN, ["a", "acme", "0x", "a" * 63], ["", "Acme", "-a", "a" * 64, "a b"]),
        (CURSOR_PATTERN, ["1700000000000:call_0a1b", "0:call_f", "9" * 16 + ":call_" + "a" * 64],
         ["", ":call_a", "1700000000000", "1:call_", "1:call_AB", "x:call_a", "9" * 17 + ":call_a",
          "1:call_" + "a" * 65, "1:call_a:2"]),
        (BRAIN_PATTERN, ["echo", "wss://brains.example:443/tap/v1", "ws://127.0.0.1:8081/echo",
                         "ws://[::1]:8081/a;b=c&d~e!"],
         ["Echo", "ws://", "ws://a b", "ws://a\tb", "ws://a\x1fb", "ws://a?x", "ws://a#x",
          "ws://a%20", "ws://é", "ws://a\u2028", "http://a"]),
        (KEY_LABEL_PATTERN, ["ci", "prod dialer", "ключ ✓", "\U0001f600" * 64],
         ["", "a\x00", "a\x1f", "a\x7f", "a\x80", "a\x9f", "a" * 65]),
    ],
)  # fmt: skip
def test_bounded_patterns(pattern: str, good: list[str], bad: list[str]) -> None:
    regex = ecma_regex(pattern)
    assert all(regex.search(text) for text in good)
    assert not any(regex.search(text) for text in bad)
    assert not regex.search(good[0] + "\n")


# --- errors: one JSON shape ------------------------------------------------------------------


def test_error_response_shape_and_headers() -> None:
    response = error_response(errors.invalid_request("must be an integer", "limits.max_cost"))
    assert response.status_code == 422
    assert json.loads(bytes(response.body)) == {
        "error": {
            "code": "invalid_request",
            "message": "must be an integer",
            "field": "limits.max_cost",
        }
    }
    limited = error_response(errors.rate_limited(0.05))
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "1"
    assert errors.rate_limited(2.01).headers["Retry-After"] == "3"
    refused = errors.refused("budget_day", "the tenant's daily budget is spent")
    assert refused.body()["error"]["reason"] == "budget_day"
    assert refused.status == 402
    assert errors.unauthorized("no key").headers["WWW-Authenticate"].startswith("Bearer")
    assert errors.unavailable().headers["Retry-After"] == "2"
    long = errors.invalid_request("x" * 5000)
    assert len(long.body()["error"]["message"]) == errors.MAX_MESSAGE_CHARS
    with pytest.raises(ValueError):
        errors.retry_after_header(float("inf"))


# --- reading the body over real HTTP ------------------------------------------------------------


async def _echo_body(request: Request) -> Response:
    try:
        require_json_content_type(request.headers.get("content-type"))
        raw = await read_body(request, max_bytes=64)
        return JSONResponse(parse_json_body(raw, KILL_SWITCH_SCHEMA, max_bytes=64))
    except ApiError as exc:
        return error_response(exc)


async def test_read_body_enforces_the_limit_declared_or_streamed() -> None:
    app = Starlette(
        routes=[Route("/", _echo_body, methods=["POST"])],
        exception_handlers={ApiError: handle_api_error},
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        ok = await client.post("/", json={"engaged": False})
        assert (ok.status_code, ok.json()) == (200, {"engaged": False})

        big = await client.post("/", content=b'{"engaged": true' + b" " * 100 + b"}",
                                headers={"content-type": "application/json"})  # fmt: skip
        assert (big.status_code, big.json()["error"]["code"]) == (413, "payload_too_large")

        async def chunks() -> Any:
            for _ in range(10):
                yield b"          "

        streamed = await client.post(
            "/", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413

        form = await client.post("/", data={"engaged": "true"})
        assert form.status_code == 415
        assert form.json()["error"]["code"] == "unsupported_media_type"
