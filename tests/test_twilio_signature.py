"""X-Twilio-Signature: fixed vectors and equivalence with twilio-python's RequestValidator."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable

import pytest
from starlette.datastructures import ImmutableMultiDict
from twilio.request_validator import RequestValidator

from rutster.trunk.twilio.signature import SIGNATURE_HEADER, TwilioSignatureValidator

TOKEN = "12345"
FORM_URL = "https://gw.example.com/twilio/voice"
FORM_PARAMS = {
    "AccountSid": "AC1",
    "CallSid": "CA123",
    "From": "+15551230000",
    "To": "+15559870000",
}
FORM_SIGNATURE = "UdNBFt/wHn8utvfcJrAUQIuvWS4="  # docs/PROVIDERS.md §8
WSS_URL = "wss://gw.example.com/twilio/media"
WSS_SIGNATURE = "xOtUNom2O6Ixz0xt8ODDv8MkQUY="  # docs/PROVIDERS.md §8

SEED = 20260821
CASES = 300


class _MultiDict:
    """Just enough of a multi-dict for RequestValidator.get_values (Django's getlist)."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self._pairs = list(pairs)

    def __iter__(self) -> Iterable[str]:
        return iter([name for name, _ in self._pairs])

    def getlist(self, name: str) -> list[str]:
        return [value for key, value in self._pairs if key == name]


def _reference(token: str = TOKEN) -> RequestValidator:
    return RequestValidator(token)


def test_header_name() -> None:
    assert SIGNATURE_HEADER == "X-Twilio-Signature"


def test_form_webhook_vector() -> None:
    validator = TwilioSignatureValidator(TOKEN)
    assert validator.compute(FORM_URL, FORM_PARAMS) == FORM_SIGNATURE
    assert validator.compute(FORM_URL, list(FORM_PARAMS.items())) == FORM_SIGNATURE
    assert validator.validate(FORM_URL, FORM_PARAMS, FORM_SIGNATURE)
    assert validator.validate(FORM_URL, list(reversed(FORM_PARAMS.items())), FORM_SIGNATURE)


def test_wss_upgrade_vector() -> None:
    validator = TwilioSignatureValidator(TOKEN)
    assert validator.compute(WSS_URL) == WSS_SIGNATURE
    assert validator.compute(WSS_URL, {}) == WSS_SIGNATURE
    assert validator.validate(WSS_URL, None, WSS_SIGNATURE)
    # Twilio may write the default port into the URL it signs, or not.
    assert validator.validate("wss://gw.example.com:443/twilio/media", None, WSS_SIGNATURE)
    assert not validator.validate("https://gw.example.com/twilio/media", None, WSS_SIGNATURE)


@pytest.mark.parametrize("signature", [None, "", " ", "UdNBFt/wHn8utvfcJrAUQIuvWS4", "é" * 28])
def test_missing_or_garbage_signature_is_invalid(signature: str | None) -> None:
    assert not TwilioSignatureValidator(TOKEN).validate(FORM_URL, FORM_PARAMS, signature)


def test_wrong_token_wrong_params_wrong_url_are_invalid() -> None:
    assert not TwilioSignatureValidator("54321").validate(FORM_URL, FORM_PARAMS, FORM_SIGNATURE)
    tampered = {**FORM_PARAMS, "To": "+15559870001"}
    validator = TwilioSignatureValidator(TOKEN)
    assert not validator.validate(FORM_URL, tampered, FORM_SIGNATURE)
    assert not validator.validate(FORM_URL + "?x=1", FORM_PARAMS, FORM_SIGNATURE)
    assert not validator.validate(FORM_URL, None, FORM_SIGNATURE)


@pytest.mark.parametrize(
    "url", ["https://gw.example.com:99999/x", "https://[::1/x", "https://gw.example.com:ab/x"]
)
def test_unparsable_url_is_invalid_not_a_crash(url: str) -> None:
    assert not TwilioSignatureValidator(TOKEN).validate(url, None, WSS_SIGNATURE)


def test_lone_surrogate_is_invalid_not_a_crash() -> None:
    validator = TwilioSignatureValidator(TOKEN)
    assert not validator.validate(FORM_URL, {"From": "\ud800"}, FORM_SIGNATURE)


def test_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        TwilioSignatureValidator("")


def test_repeated_names_need_pairs_or_a_multidict() -> None:
    pairs = [("b", "2"), ("a", "z"), ("a", "y"), ("a", "z")]
    validator = TwilioSignatureValidator(TOKEN)
    expected = _reference().compute_signature(FORM_URL, _MultiDict(pairs))
    # Distinct values, sorted: "ay" "az" "b2" (twilio-python de-duplicates with a set).
    assert expected == _reference().compute_signature(FORM_URL + "ayazb2", {})
    assert validator.compute(FORM_URL, pairs) == expected
    assert validator.compute(FORM_URL, {"a": ["z", "y"], "b": "2"}) == expected
    # Starlette's multi-dicts (FormData's base) expose repeated names through getlist().
    multidict = ImmutableMultiDict[str, str](pairs)
    assert validator.compute(FORM_URL, multidict) == expected
    assert validator.validate(FORM_URL, multidict, expected)
    # A plain dict keeps one value per name, so it cannot stand in for the body.
    assert validator.compute(FORM_URL, dict(pairs)) != expected


# ---- generated equivalence with twilio-python --------------------------------------------

_HOSTS = ["gw.example.com", "a.b-c.example.org", "127.0.0.1"]
_PATHS = ["", "/", "/twilio/voice", "/twilio/media", "/a%20b/ü"]
_QUERIES = ["", "?x=1", "?a=1&b=%20two&a=3", "?bodySHA256=abc"]
_NAMES = ["From", "To", "CallSid", "Body", "Digits", "ünï", "a", "A", "_", "x y"]
_VALUES = ["", "+15551230000", "client:alice", "héllo wörld", "日本語", "a&b=c", " ", "😀", "0"]
_DEFAULT = {"https": 443, "wss": 443, "http": 80}


def _generated_cases() -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """(scheme, host, path+query, params) tuples, deterministic."""
    rng = random.Random(SEED)
    cases = []
    for _ in range(CASES):
        scheme = rng.choice(["http", "https", "wss"])
        rest = rng.choice(_PATHS) + rng.choice(_QUERIES)
        params = [
            (rng.choice(_NAMES), rng.choice(_VALUES)) for _ in range(rng.randint(0, 6))
        ]  # names repeat often
        cases.append((scheme, rng.choice(_HOSTS), rest, params))
    return cases


def _forms(scheme: str, host: str, rest: str) -> list[str]:
    """The URL without a port, with the scheme's default port, and with :8443."""
    return [
        f"{scheme}://{host}{rest}",
        f"{scheme}://{host}:{_DEFAULT[scheme]}{rest}",
        f"{scheme}://{host}:8443{rest}",
    ]


def test_compute_matches_twilio_python() -> None:
    ours = TwilioSignatureValidator(TOKEN)
    for scheme, host, rest, params in _generated_cases():
        for url in _forms(scheme, host, rest):
            expected = _reference().compute_signature(url, _MultiDict(params))
            assert ours.compute(url, params) == expected, (url, params)


def test_validate_matches_twilio_python() -> None:
    ours = TwilioSignatureValidator(TOKEN)
    reference = _reference()
    accepted = 0
    for scheme, host, rest, params in _generated_cases():
        forms = _forms(scheme, host, rest)
        for signed in forms:
            signature = reference.compute_signature(signed, _MultiDict(params))
            for presented in forms:
                if scheme == "wss" and presented == forms[0] and signed == forms[1]:
                    continue  # deliberate difference, see test_wss_default_port_is_443
                got = ours.validate(presented, params, signature)
                assert got == reference.validate(presented, _MultiDict(params), signature), (
                    signed,
                    presented,
                    params,
                )
                accepted += got
                # A flipped character, or another token, must fail.
                broken = ("B" if signature[0] == "A" else "A") + signature[1:]
                assert not ours.validate(presented, params, broken)
                assert not TwilioSignatureValidator("54321").validate(presented, params, signature)
    assert accepted > CASES  # the loop really exercised matching signatures


def test_wss_default_port_is_443() -> None:
    """twilio-python adds :80 to any non-https URL; a wss:// URL's default port is 443."""
    ours = TwilioSignatureValidator(TOKEN)
    signed_443 = ours.compute("wss://gw.example.com:443/twilio/media")
    assert ours.validate(WSS_URL, None, signed_443)
    assert not _reference().validate(WSS_URL, {}, signed_443)
    signed_80 = ours.compute("wss://gw.example.com:80/twilio/media")
    assert not ours.validate(WSS_URL, None, signed_80)


def test_json_body_matches_twilio_python() -> None:
    ours = TwilioSignatureValidator(TOKEN)
    reference = _reference()
    rng = random.Random(SEED)
    for index in range(50):
        body = json.dumps(
            {"n": index, "text": rng.choice(_VALUES), "list": [rng.random()]}, ensure_ascii=False
        )
        digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
        url = f"https://gw.example.com/hooks/json?bodySHA256={digest}"
        signature = reference.compute_signature(url, {})
        assert ours.validate_json_body(url, body.encode("utf-8"), signature)
        assert reference.validate(url, body, signature)
        tampered = body + " "
        assert not ours.validate_json_body(url, tampered.encode("utf-8"), signature)
        assert not reference.validate(url, tampered, signature)
        assert not ours.validate_json_body(url, body.encode("utf-8"), signature[::-1])
        with_port = f"https://gw.example.com:443/hooks/json?bodySHA256={digest}"
        assert ours.validate_json_body(with_port, body.encode("utf-8"), signature)
        assert reference.validate(with_port, body, signature)


def test_json_body_without_hash_param_is_invalid() -> None:
    ours = TwilioSignatureValidator(TOKEN)
    url = "https://gw.example.com/hooks/json"
    assert not ours.validate_json_body(url, b"{}", ours.compute(url))
    assert not ours.validate_json_body(
        url + "?bodySHA256=", b"", ours.compute(url + "?bodySHA256=")
    )
