"""SIP access policy: allowlist, digest, uniform refusals, rejection cache (virtual time)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.trunk.sip.access import (
    ACCESS_REASONS,
    DEFAULT_BLOCK_S,
    DEFAULT_CHALLENGE_LIMIT,
    DEFAULT_FAILURE_LIMIT,
    AccessAction,
    AccessDecision,
    SipAccessPolicy,
    SipAccessSettings,
    allowed_networks,
    parse_source_ip,
)
from rutster.trunk.sip.digest import DigestAuthenticator, digest_response, parse_authorization

SECRET = b"policy-test-secret-0123456789abc"
REALM = "rutster.test"
USER = "trunk"
PASSWORD = "pw-0123456789"
URI = "sip:+15550100@10.0.0.1:5070"
T0 = 1_800_000_000.0
TRUNK = "192.0.2.10:5060"
STRANGER = "203.0.113.66:5060"


def authenticator() -> DigestAuthenticator:
    return DigestAuthenticator(REALM, USER, PASSWORD, SECRET)


def answer(decision: AccessDecision, *, password: str = PASSWORD, nc: int = 1) -> str:
    """The Authorization a client computes for the first challenge of ``decision``."""
    assert decision.action is AccessAction.CHALLENGE
    _, params = parse_authorization(decision.headers[0][1])
    nc_text = f"{nc:08x}"
    response = digest_response(
        algorithm=params["algorithm"],
        username=USER,
        realm=params["realm"],
        password=password,
        method="INVITE",
        uri=URI,
        nonce=params["nonce"],
        nc=nc_text,
        cnonce="c1",
    )
    return (
        f'Digest username="{USER}", realm="{params["realm"]}", nonce="{params["nonce"]}", '
        f'uri="{URI}", response="{response}", algorithm={params["algorithm"]}, cnonce="c1", '
        f"qop=auth, nc={nc_text}"
    )


def policy(**kwargs: object) -> SipAccessPolicy:
    return SipAccessPolicy(SipAccessSettings(**kwargs))  # type: ignore[arg-type]


# -- settings ---------------------------------------------------------------------------------


def test_settings_refuse_an_open_worker() -> None:
    with pytest.raises(ValueError, match="refusing to accept calls from anyone"):
        SipAccessSettings()
    with pytest.raises(ValueError, match="refusing"):
        SipAccessSettings(allowed_cidrs=(), digest=None, unknown_response="drop")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"allowed_cidrs": ("10.0.0.0/33",)}, "invalid allowed CIDR"),
        ({"allowed_cidrs": ("10.0.0.1/8",)}, "invalid allowed CIDR"),  # host bits set
        ({"allowed_cidrs": ("banana",)}, "invalid allowed CIDR"),
        ({"allowed_cidrs": (None,)}, "invalid allowed CIDR"),
        ({"allowed_cidrs": "10.0.0.0/8"}, "not one string"),
        ({"unknown_response": "ignore"}, "unknown_response"),
        ({"reject_code": 401}, "reject_code"),
        ({"reject_code": 407}, "reject_code"),
        ({"reject_code": 200}, "reject_code"),
        ({"reject_code": 700}, "reject_code"),
        ({"failure_limit": 0}, "failure_limit"),
        ({"challenge_limit": 0}, "challenge_limit"),
        ({"cache_size": 0}, "cache_size"),
        ({"failure_window_s": 0.0}, "failure_window_s"),
        ({"block_s": -1.0}, "block_s"),
    ],
)
def test_settings_validation(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"allowed_cidrs": ("192.0.2.0/24",)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SipAccessSettings(**args)  # type: ignore[arg-type]


def test_settings_repr_hides_the_password() -> None:
    settings_ = SipAccessSettings(digest=authenticator())
    assert PASSWORD not in repr(settings_)
    assert REALM in repr(settings_)


def test_allowed_networks_for_the_kernel_filter() -> None:
    only_digest = SipAccessSettings(digest=authenticator())
    assert allowed_networks(only_digest) == ["0.0.0.0/0"]
    mixed = SipAccessSettings(allowed_cidrs=("192.0.2.0/24", "2001:db8::/32", "198.51.100.7"))
    assert allowed_networks(mixed) == ["192.0.2.0/24", "198.51.100.7/32"]


# -- source parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("192.0.2.1:5060", "192.0.2.1"),
        ("[2001:db8::1]:5060", "2001:db8::1"),
        ("[::ffff:192.0.2.1]:5060", "192.0.2.1"),
        ("192.0.2.1:65535", "192.0.2.1"),
    ],
)
def test_parse_source_ip(source: str, expected: str) -> None:
    assert parse_source_ip(source) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "source",
    [
        "",
        "192.0.2.1",
        "192.0.2.1:",
        "192.0.2.1:0",
        "192.0.2.1:65536",
        "192.0.2.1:50a",
        "192.0.2.1:٥٠٦٠",  # non-ASCII digits
        "2001:db8::1:5060",
        "[2001:db8::1]",
        "[2001:db8::1]5060",
        "[192.0.2.1]:5060",
        "999.0.2.1:5060",
        "host.example:5060",
        "x" * 200,
    ],
)
def test_malformed_sources(source: str) -> None:
    assert parse_source_ip(source) is None
    decision = policy(allowed_cidrs=("0.0.0.0/0",)).decide(source, None, "INVITE", T0)
    assert (decision.action, decision.reason) == (AccessAction.REJECT, "malformed_source")


def test_non_string_source_is_malformed() -> None:
    decision = policy(allowed_cidrs=("0.0.0.0/0",)).decide(None, None, "INVITE", T0)  # type: ignore[arg-type]
    assert decision.reason == "malformed_source"


# -- allowlist only ---------------------------------------------------------------------------


def test_allowlist_only() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24", "2001:db8::/32"))
    assert p.decide(TRUNK, None, "INVITE", T0) == AccessDecision(AccessAction.ACCEPT, "allowlisted")
    assert p.decide("[2001:db8::5]:5060", None, "INVITE", T0).action is AccessAction.ACCEPT
    assert p.decide("[::ffff:192.0.2.77]:5060", None, "INVITE", T0).action is AccessAction.ACCEPT
    refused = p.decide(STRANGER, None, "INVITE", T0)
    assert refused == AccessDecision(AccessAction.REJECT, "not_allowlisted", status=403)


def test_drop_mode_and_custom_code() -> None:
    dropping = policy(allowed_cidrs=("192.0.2.0/24",), unknown_response="drop")
    assert dropping.decide(STRANGER, None, "INVITE", T0) == AccessDecision(
        AccessAction.DROP, "not_allowlisted"
    )
    custom = policy(allowed_cidrs=("192.0.2.0/24",), reject_code=404)
    assert custom.decide(STRANGER, None, "INVITE", T0).status == 404


def test_ack_is_never_answered() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",))
    assert p.decide(STRANGER, None, "ACK", T0).action is AccessAction.DROP


def test_bad_method_is_refused_and_counted() -> None:
    p = policy(allowed_cidrs=("0.0.0.0/0",), failure_limit=2)
    for method in ("", "IN VITE"):
        assert p.decide(STRANGER, None, method, T0).reason == "malformed_request"
    assert p.decide(STRANGER, None, "INVITE", T0 + 1).reason == "rejection_cache"


# -- digest -----------------------------------------------------------------------------------


def test_digest_only_flow() -> None:
    p = policy(digest=authenticator())
    challenge = p.decide(STRANGER, None, "INVITE", T0)
    assert challenge.action is AccessAction.CHALLENGE
    assert challenge.status == 401 and challenge.reason == "no_credentials"
    assert [name for name, _ in challenge.headers] == ["WWW-Authenticate"] * 2
    assert "algorithm=SHA-256" in challenge.headers[0][1]
    accepted = p.decide(STRANGER, answer(challenge), "INVITE", T0 + 0.1)
    assert (accepted.action, accepted.reason, accepted.detail) == (
        AccessAction.ACCEPT,
        "authenticated",
        "ok",
    )
    bad = p.decide(STRANGER, answer(challenge, password="guess", nc=2), "INVITE", T0 + 0.2)
    assert bad == AccessDecision(
        AccessAction.REJECT, "bad_credentials", status=403, detail="bad_credentials"
    )
    garbage = p.decide(STRANGER, "Digest ,,, =", "INVITE", T0 + 0.3)
    assert (garbage.action, garbage.reason, garbage.detail) == (
        AccessAction.REJECT,
        "bad_credentials",
        "malformed",
    )


def test_replayed_credentials_are_refused() -> None:
    p = policy(digest=authenticator())
    header = answer(p.decide(TRUNK, None, "INVITE", T0))
    assert p.decide(TRUNK, header, "INVITE", T0 + 0.1).action is AccessAction.ACCEPT
    replay = p.decide(STRANGER, header, "INVITE", T0 + 0.2)
    assert (replay.action, replay.detail) == (AccessAction.REJECT, "replay")


def test_stale_nonce_gets_a_stale_challenge() -> None:
    p = policy(digest=authenticator())
    header = answer(p.decide(TRUNK, None, "INVITE", T0))
    stale = p.decide(TRUNK, header, "INVITE", T0 + 3600)
    assert (stale.action, stale.reason, stale.status) == (
        AccessAction.CHALLENGE,
        "stale_nonce",
        401,
    )
    assert all("stale=true" in value for _, value in stale.headers)


def test_drop_mode_still_challenges() -> None:
    p = policy(digest=authenticator(), unknown_response="drop")
    challenge = p.decide(STRANGER, None, "INVITE", T0)
    assert challenge.action is AccessAction.CHALLENGE
    bad = p.decide(STRANGER, answer(challenge, password="x"), "INVITE", T0)
    assert bad == AccessDecision(AccessAction.DROP, "bad_credentials", detail="bad_credentials")


def test_cancel_is_not_challenged() -> None:
    p = policy(digest=authenticator())
    decision = p.decide(TRUNK, None, "CANCEL", T0)
    assert (decision.action, decision.reason) == (AccessAction.REJECT, "no_credentials")


def test_allowlist_and_digest_both_required() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",), digest=authenticator())
    challenge = p.decide(TRUNK, None, "INVITE", T0)
    assert challenge.action is AccessAction.CHALLENGE
    header = answer(challenge)
    # Valid credentials from outside the allowlist: refused without a challenge.
    outside = p.decide(STRANGER, header, "INVITE", T0)
    assert outside == AccessDecision(AccessAction.REJECT, "not_allowlisted", status=403)
    assert p.decide(STRANGER, None, "INVITE", T0).reason == "not_allowlisted"
    assert p.decide(TRUNK, header, "INVITE", T0).action is AccessAction.ACCEPT


def test_refusals_are_uniform() -> None:
    """Every refusal looks the same on the wire: same status, no headers (nothing to learn)."""
    p = policy(allowed_cidrs=("192.0.2.0/24",), digest=authenticator(), failure_limit=100)
    header = answer(p.decide(TRUNK, None, "INVITE", T0))
    refusals = [
        p.decide(STRANGER, None, "INVITE", T0),
        p.decide(STRANGER, header, "INVITE", T0),
        p.decide(TRUNK, header.replace("nc=00000001", "nc=00000009"), "INVITE", T0),
        p.decide(TRUNK, "Basic Zm9vOmJhcg==", "INVITE", T0),
        p.decide("nonsense", None, "INVITE", T0),
    ]
    assert {(d.action, d.status, d.headers) for d in refusals} == {(AccessAction.REJECT, 403, ())}
    assert {d.reason for d in refusals} <= ACCESS_REASONS


# -- rejection cache --------------------------------------------------------------------------


def test_failures_put_a_source_in_the_cache_until_block_expires() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",), digest=authenticator())
    challenge = p.decide(TRUNK, None, "INVITE", T0)
    for i in range(DEFAULT_FAILURE_LIMIT):
        decision = p.decide(TRUNK, answer(challenge, password=f"guess{i}"), "INVITE", T0 + i)
        assert decision.reason == "bad_credentials"
    assert p.blocked_sources(T0 + 10) == ["192.0.2.10"]
    # Now even valid credentials are not looked at.
    fresh = SipAccessPolicy(p.settings).decide(TRUNK, None, "INVITE", T0 + 10)
    blocked = p.decide(TRUNK, answer(fresh), "INVITE", T0 + 10)
    assert blocked == AccessDecision(AccessAction.REJECT, "rejection_cache", status=403)
    assert p.decide("192.0.2.10:7777", None, "INVITE", T0 + 11).reason == "rejection_cache"
    # Other sources are unaffected; the block lapses after block_s (retries do not extend it).
    assert p.decide("192.0.2.11:5060", None, "INVITE", T0 + 11).action is AccessAction.CHALLENGE
    end = T0 + DEFAULT_FAILURE_LIMIT - 1 + DEFAULT_BLOCK_S
    assert p.decide(TRUNK, None, "INVITE", end - 0.01).reason == "rejection_cache"
    assert p.blocked_sources(end) == []
    assert p.decide(TRUNK, None, "INVITE", end).action is AccessAction.CHALLENGE


def test_cached_source_in_drop_mode_is_dropped() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",), unknown_response="drop", failure_limit=2)
    p.decide(STRANGER, None, "INVITE", T0)
    p.decide(STRANGER, None, "INVITE", T0)
    assert p.decide(STRANGER, None, "INVITE", T0) == AccessDecision(
        AccessAction.DROP, "rejection_cache"
    )


def test_failures_outside_the_window_do_not_add_up() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",), failure_limit=3, failure_window_s=60.0)
    for i in range(10):
        p.decide(STRANGER, None, "INVITE", T0 + i * 31)  # at most 2 within any 60 s
    assert p.blocked_sources(T0 + 400) == []
    p.decide(STRANGER, None, "INVITE", T0 + 400)
    p.decide(STRANGER, None, "INVITE", T0 + 401)
    assert p.blocked_sources(T0 + 401) == []
    p.decide(STRANGER, None, "INVITE", T0 + 402)  # third within 60 s
    assert p.blocked_sources(T0 + 402) == ["203.0.113.66"]


def test_challenges_without_success_end_in_the_cache() -> None:
    p = policy(digest=authenticator())
    for _ in range(DEFAULT_CHALLENGE_LIMIT):
        assert p.decide(STRANGER, None, "INVITE", T0).action is AccessAction.CHALLENGE
    assert p.decide(STRANGER, None, "INVITE", T0 + 1).reason == "rejection_cache"


def test_success_clears_the_counters() -> None:
    """A trunk that authenticates every call is never cached, however many calls it makes."""
    p = policy(digest=authenticator(), challenge_limit=3, failure_limit=2)
    for i in range(50):
        now = T0 + i
        challenge = p.decide(TRUNK, None, "INVITE", now)
        assert challenge.action is AccessAction.CHALLENGE
        if i % 10 == 0:  # an occasional typo does not add up either
            p.decide(TRUNK, answer(challenge, password="typo"), "INVITE", now)
        accepted = p.decide(TRUNK, answer(challenge, nc=2), "INVITE", now)
        assert accepted.action is AccessAction.ACCEPT
    assert p.blocked_sources(T0 + 60) == []
    assert p.tracked_sources == 0


def test_concurrent_setups_from_one_trunk_fit_under_the_challenge_limit() -> None:
    p = policy(digest=authenticator())
    burst = [p.decide(TRUNK, None, "INVITE", T0) for _ in range(DEFAULT_CHALLENGE_LIMIT - 1)]
    assert {d.action for d in burst} == {AccessAction.CHALLENGE}
    for d in burst:
        assert p.decide(TRUNK, answer(d), "INVITE", T0 + 0.05).action is AccessAction.ACCEPT


def test_caches_are_bounded_under_a_spoofed_flood() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",), failure_limit=2, cache_size=50)
    # Ten sources get blocked first.
    for i in range(10):
        for _ in range(2):
            p.decide(f"198.51.100.{i}:5060", None, "INVITE", T0)
    assert len(p.blocked_sources(T0)) == 10
    # Then 10 000 spoofed one-off sources: counters stay bounded and the blocked ones stay.
    for i in range(10_000):
        source = f"{10 + (i >> 16) % 200}.{(i >> 8) & 255}.{i & 255}.1:5060"
        assert p.decide(source, None, "INVITE", T0 + 1).reason == "not_allowlisted"
    assert p.tracked_sources == 50
    assert p.evictions == 10_000 - 50
    assert len(p.blocked_sources(T0 + 1)) == 10
    # Many blocked sources: that map is bounded too.
    for i in range(200):
        for _ in range(2):
            p.decide(f"100.64.{i}.1:5060", None, "INVITE", T0 + 2)
    assert len(p.blocked_sources(T0 + 2)) == 50


def test_blocked_sources_sorted_ipv4_first_and_expired_removed() -> None:
    p = policy(allowed_cidrs=("192.0.2.0/24",), failure_limit=1, block_s=10.0)
    assert p.blocked_generation == 0
    for source in ("[2001:db8::2]:5060", "203.0.113.9:5060", "198.51.100.1:5060"):
        p.decide(source, None, "INVITE", T0)
    assert p.blocked_generation == 3
    p.decide("198.51.100.1:5060", None, "INVITE", T0 + 1)  # already cached: no change
    assert p.blocked_generation == 3
    p.decide("198.51.100.200:5060", None, "INVITE", T0 + 5)
    assert p.blocked_sources(T0 + 1) == [
        "198.51.100.1",
        "198.51.100.200",
        "203.0.113.9",
        "2001:db8::2",
    ]
    assert p.blocked_sources(T0 + 12) == ["198.51.100.200"]
    assert p.blocked_generation == 7  # 4 added, 3 expired


_sources = st.one_of(
    st.sampled_from([TRUNK, STRANGER, "192.0.2.99:5060", "[2001:db8::1]:5060", "junk"]),
    st.text(max_size=30),
)
_auth = st.one_of(st.none(), st.just("challenge-answer"), st.text(max_size=80))
_methods = st.sampled_from(["INVITE", "ACK", "CANCEL", "OPTIONS", "", "bad method"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_sources, _auth, _methods, st.floats(0, 2000, allow_nan=False)), max_size=60
    ),
    st.sampled_from(["reject", "drop"]),
    st.booleans(),
)
def test_fuzz_decisions_are_well_formed(
    events: list[tuple[str, str | None, str, float]], mode: str, with_allowlist: bool
) -> None:
    p = policy(
        allowed_cidrs=("192.0.2.0/24",) if with_allowlist else (),
        digest=authenticator(),
        unknown_response=mode,
        failure_limit=3,
        challenge_limit=4,
        cache_size=5,
    )
    last_challenge: AccessDecision | None = None
    for source, authorization, method, offset in events:
        if authorization == "challenge-answer":
            authorization = answer(last_challenge) if last_challenge else None
        decision = p.decide(source, authorization, method, T0 + offset)
        assert decision.reason in ACCESS_REASONS
        if decision.action is AccessAction.CHALLENGE:
            last_challenge = decision
            assert decision.status == 401 and len(decision.headers) == 2
        elif decision.action is AccessAction.REJECT:
            assert mode == "reject" and decision.status == 403 and decision.headers == ()
        elif decision.action is AccessAction.DROP:
            assert decision.status is None and (mode == "drop" or method == "ACK")
        else:
            assert decision.reason == "authenticated" and decision.status is None
        assert p.tracked_sources <= 5
        assert len(p.blocked_sources(T0 + offset)) <= 5
