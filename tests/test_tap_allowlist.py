"""The SSRF guard on brain URLs: which tap URLs the core may dial."""

from __future__ import annotations

import pytest

from rutster.gateway.tap_allowlist import TapUrlAllowlist

ECHO = "ws://127.0.0.1:8081/echo"


def allowlist(*entries: str) -> TapUrlAllowlist:
    return TapUrlAllowlist.parse(",".join(entries))


# ---- exact and prefix entries ----------------------------------------------------


def test_exact_entry_allows_itself_and_sub_paths_only() -> None:
    allow = allowlist(ECHO)
    assert allow.allows(ECHO)
    assert allow.allows(ECHO + "/")
    assert allow.allows(ECHO + "/v2")
    # A longer name sharing the prefix is another path, not a sub-path.
    assert not allow.allows("ws://127.0.0.1:8081/echoes")
    assert not allow.allows("ws://127.0.0.1:8081/ech")
    assert not allow.allows("ws://127.0.0.1:8081/")
    assert not allow.allows("ws://127.0.0.1:8081")
    assert not allow.allows("ws://127.0.0.1:8081/admin")


def test_trailing_slash_entry_is_a_directory_prefix() -> None:
    allow = allowlist("ws://brains.internal:8082/tenants/")
    assert allow.allows("ws://brains.internal:8082/tenants/a")
    assert allow.allows("ws://brains.internal:8082/tenants/a/b")
    assert not allow.allows("ws://brains.internal:8082/tenantsX")
    assert not allow.allows("ws://brains.internal:8082/other")


@pytest.mark.parametrize("entry", ["ws://brains.internal:8082/", "ws://brains.internal:8082"])
def test_origin_entry_allows_every_path(entry: str) -> None:
    allow = allowlist(entry)
    assert allow.allows("ws://brains.internal:8082/")
    assert allow.allows("ws://brains.internal:8082")
    assert allow.allows("ws://brains.internal:8082/anything/at/all")


def test_several_entries() -> None:
    allow = allowlist("ws://a.internal:1/x", " wss://b.internal/y ", "")
    assert allow.entries == ("ws://a.internal:1/x", "wss://b.internal/y")
    assert allow.allows("ws://a.internal:1/x")
    assert allow.allows("wss://b.internal/y/z")
    assert not allow.allows("ws://a.internal:1/y")
    assert not allow.allows("wss://b.internal/x")


def test_default_is_always_on_the_list() -> None:
    allow = TapUrlAllowlist.parse("", default=ECHO)
    assert allow.allows(ECHO)
    assert not allow.allows("ws://127.0.0.1:8082/echo")


def test_empty_allowlist_allows_nothing() -> None:
    allow = TapUrlAllowlist()
    assert not allow.allows(ECHO)
    assert not TapUrlAllowlist.parse(" , ").allows(ECHO)


# ---- scheme, host and port must match -------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "wss://127.0.0.1:8081/echo",  # other scheme
        "ws://127.0.0.2:8081/echo",  # other host
        "ws://localhost:8081/echo",  # same machine, other name: still another host
        "ws://127.0.0.1:8082/echo",  # other port
        "ws://127.0.0.1/echo",  # default port 80, not 8081
        "ws://127.0.0.1.evil.example:8081/echo",  # allowed host as a prefix of another
        "ws://evil.example/127.0.0.1:8081/echo",  # allowed origin inside the path
        "ws://[::1]:8081/echo",
    ],
)
def test_scheme_host_and_port_must_match(url: str) -> None:
    assert not allowlist(ECHO).allows(url)


def test_default_ports() -> None:
    assert allowlist("ws://brain.internal/").allows("ws://brain.internal:80/x")
    assert allowlist("ws://brain.internal:80/").allows("ws://brain.internal/x")
    assert allowlist("wss://brain.internal/").allows("wss://brain.internal:443/x")
    assert allowlist("wss://brain.internal:443/").allows("wss://brain.internal/x")
    # The default port belongs to the scheme: ws on 443 is not wss.
    assert not allowlist("wss://brain.internal/").allows("ws://brain.internal:443/x")
    assert not allowlist("ws://brain.internal/").allows("ws://brain.internal:443/x")


def test_host_is_case_insensitive() -> None:
    assert allowlist("ws://Brain.Internal:8082/rt").allows("ws://BRAIN.internal:8082/rt")
    assert allowlist("ws://brain.internal:8082/rt").allows("WS://brain.INTERNAL:8082/rt")
    # Paths are case-sensitive on the server, so they stay so here.
    assert not allowlist("ws://brain.internal:8082/rt").allows("ws://brain.internal:8082/RT")


# ---- tricks refused -----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        # credentials (and the classic "allowed host as userinfo" trick)
        "ws://user:pass@127.0.0.1:8081/echo",
        "ws://user@127.0.0.1:8081/echo",
        "ws://127.0.0.1:8081@evil.example/echo",
        "ws://127.0.0.1:8081\\@evil.example/echo",
        # query and fragment
        "ws://127.0.0.1:8081/echo?target=http://169.254.169.254/",
        "ws://127.0.0.1:8081/echo#frag",
        # dot segments that would walk out of the prefix on the server
        "ws://127.0.0.1:8081/echo/../admin",
        "ws://127.0.0.1:8081/echo/./x",
        "ws://127.0.0.1:8081/echo/..",
        # percent escapes (an encoded dot segment or slash)
        "ws://127.0.0.1:8081/echo/%2e%2e/admin",
        "ws://127.0.0.1:8081/echo%2F..%2Fadmin",
        "ws://127.0.0.1:8081/echo/%41",
        # not a WebSocket URL at all
        "http://127.0.0.1:8081/echo",
        "https://127.0.0.1:8081/echo",
        "file:///etc/passwd",
        "127.0.0.1:8081/echo",
        "//127.0.0.1:8081/echo",
        "",
        "ws://",
        "ws:///echo",
        # a port that cannot be parsed
        "ws://127.0.0.1:99999/echo",
        "ws://127.0.0.1:port/echo",
    ],
)
def test_tricks_are_refused(url: str) -> None:
    # An origin entry (every path allowed) so only the trick itself can refuse it.
    allow = allowlist("ws://127.0.0.1:8081/")
    assert not allow.allows(url)


@pytest.mark.parametrize(
    "entry",
    [
        "http://127.0.0.1:8081/echo",
        "https://brains.internal/",
        "ws://user:pw@brains.internal/",
        "ws://brains.internal/x?y=1",
        "ws://brains.internal/x#y",
        "ws://brains.internal/a/../b",
        "ws://brains.internal/%2e",
        "brains.internal:8082",
        "ws://brains.internal:70000/",
    ],
)
def test_bad_entries_are_refused_at_parse_time(entry: str) -> None:
    with pytest.raises(ValueError, match="not a ws:// or wss:// URL prefix"):
        TapUrlAllowlist.parse(entry)


def test_bad_default_is_refused_at_parse_time() -> None:
    with pytest.raises(ValueError):
        TapUrlAllowlist.parse("", default="http://127.0.0.1:8081/echo")


def test_surrounding_whitespace_is_ignored() -> None:
    assert allowlist(ECHO).allows(f"  {ECHO}  ")
