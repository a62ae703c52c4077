"""Server-side SIP digest auth: RFC vectors, tampering, expiry, replay, garbage, pjsua2 interop."""

from __future__ import annotations

import multiprocessing
import re
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.trunk.sip.digest import (
    DEFAULT_NONCE_TTL_S,
    NONCE_FUTURE_TOLERANCE_S,
    VERDICT_REASONS,
    DigestAuthenticator,
    DigestParseError,
    digest_response,
    parse_authorization,
)

SECRET = b"0123456789abcdef0123456789abcdef"
REALM = "rutster.test"
USER = "trunk-a"
PASSWORD = "correct horse battery staple"
URI = "sip:+15550100@127.0.0.1:5070"
T0 = 1_800_000_000.0


def make_auth(**kwargs: object) -> DigestAuthenticator:
    args: dict[str, object] = {
        "realm": REALM,
        "username": USER,
        "password": PASSWORD,
        "nonce_secret": SECRET,
    }
    args.update(kwargs)
    return DigestAuthenticator(**args)  # type: ignore[arg-type]


def challenge_params(value: str) -> dict[str, str]:
    scheme, params = parse_authorization(value)
    assert scheme == "Digest"
    return params


def client_authorization(
    challenge: str,
    *,
    username: str = USER,
    password: str = PASSWORD,
    method: str = "INVITE",
    uri: str = URI,
    nc: int = 1,
    cnonce: str = "0a4f113b",
    realm: str | None = None,
) -> str:
    """What a well-behaved client sends back for ``challenge`` (computed independently below)."""
    params = challenge_params(challenge)
    algorithm = params["algorithm"]
    realm = params["realm"] if realm is None else realm
    nc_text = f"{nc:08x}"
    response = digest_response(
        algorithm=algorithm,
        username=username,
        realm=realm,
        password=password,
        method=method,
        uri=uri,
        nonce=params["nonce"],
        nc=nc_text,
        cnonce=cnonce,
    )
    return (
        f'Digest username="{username}", realm="{realm}", nonce="{params["nonce"]}", '
        f'uri="{uri}", response="{response}", algorithm={algorithm}, cnonce="{cnonce}", '
        f"qop=auth, nc={nc_text}"
    )


# -- RFC test vectors -------------------------------------------------------------------------


def test_rfc7616_section_3_9_1_vectors() -> None:
    # RFC 7616 §3.9.1: the same request answered with SHA-256 and with MD5.
    common = {
        "username": "Mufasa",
        "realm": "http-auth@example.org",
        "password": "Circle of Life",
        "method": "GET",
        "uri": "/dir/index.html",
        "nonce": "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
        "nc": "00000001",
        "cnonce": "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
    }
    assert (
        digest_response(algorithm="SHA-256", **common)
        == "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
    )
    assert digest_response(algorithm="MD5", **common) == "8ca523f5e9506fed4657c9700eebdbec"


def test_rfc2617_section_3_5_vector() -> None:
    # RFC 2617 §3.5 (the MD5 qop=auth example SIP inherited through RFC 3261 §22.4).
    assert (
        digest_response(
            algorithm="md5",
            username="Mufasa",
            realm="testrealm@host.com",
            password="Circle Of Life",
            method="GET",
            uri="/dir/index.html",
            nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
            nc="00000001",
            cnonce="0a4f113b",
        )
        == "6629fae49393a05397450978507c4ef1"
    )


# -- challenges and the happy path -----------------------------------------------------------


def test_challenges_offer_sha256_then_md5_with_one_nonce() -> None:
    auth = make_auth()
    values = auth.challenges(T0)
    params = [challenge_params(v) for v in values]
    assert [p["algorithm"] for p in params] == ["SHA-256", "MD5"]
    assert all(p["realm"] == REALM and p["qop"] == "auth" for p in params)
    assert params[0]["nonce"] == params[1]["nonce"]
    assert "stale" not in params[0]
    assert challenge_params(auth.challenges(T0, stale=True)[0])["stale"] == "true"
    # Two challenges in the same instant still get distinct nonces.
    assert challenge_params(auth.challenges(T0)[0])["nonce"] != params[0]["nonce"]


@pytest.mark.parametrize("index", [0, 1])
def test_valid_credentials_verify(index: int) -> None:
    auth = make_auth()
    challenge = auth.challenges(T0)[index]
    verdict = auth.verify(client_authorization(challenge), "INVITE", T0 + 1)
    assert verdict.ok and not verdict.stale and verdict.reason == "ok"
    assert verdict.algorithm == ("SHA-256", "MD5")[index]


def test_md5_only_authenticator_refuses_sha256_and_vice_versa() -> None:
    md5 = make_auth(algorithms=["md5"])
    sha = make_auth(algorithms=["SHA-256"])
    assert [challenge_params(c)["algorithm"] for c in md5.challenges(T0)] == ["MD5"]
    from_sha = client_authorization(sha.challenges(T0)[0])
    assert md5.verify(from_sha, "INVITE", T0).reason == "algorithm_unsupported"
    from_md5 = client_authorization(md5.challenges(T0)[0])
    assert sha.verify(from_md5, "INVITE", T0).reason == "algorithm_unsupported"
    # A missing algorithm parameter means MD5 (RFC 7616 §3.3).
    no_alg = re.sub(r", algorithm=MD5", "", from_md5)
    assert md5.verify(no_alg, "INVITE", T0).ok
    assert sha.verify(no_alg, "INVITE", T0).reason == "algorithm_unsupported"


# -- tampering --------------------------------------------------------------------------------


def test_wrong_password_or_user_is_bad_credentials() -> None:
    auth = make_auth()
    challenge = auth.challenges(T0)[0]
    for header in (
        client_authorization(challenge, password="wrong"),
        client_authorization(challenge, username="other"),
        client_authorization(challenge, method="REGISTER"),
    ):
        verdict = auth.verify(header, "INVITE", T0)
        assert (verdict.ok, verdict.stale, verdict.reason) == (False, False, "bad_credentials")


@pytest.mark.parametrize(
    ("field", "replacement", "reason"),
    [
        ("uri", 'uri="sip:other@127.0.0.1"', "bad_credentials"),
        ("cnonce", 'cnonce="deadbeef"', "bad_credentials"),
        ("nc", "nc=00000002", "bad_credentials"),
        ("response", 'response="' + "0" * 64 + '"', "bad_credentials"),
        ("realm", 'realm="evil.example"', "realm_mismatch"),
    ],
)
def test_tampered_fields_fail(field: str, replacement: str, reason: str) -> None:
    auth = make_auth()
    header = client_authorization(auth.challenges(T0)[0])
    tampered, count = re.subn(rf'\b{field}=("[^"]*"|[^,]*)', replacement, header)
    assert count == 1
    assert auth.verify(tampered, "INVITE", T0).reason == reason


def test_forged_or_foreign_nonces_fail() -> None:
    auth = make_auth()
    challenge = auth.challenges(T0)[0]
    nonce = challenge_params(challenge)["nonce"]
    # Flip one character of the nonce (recomputing the response so only the nonce is wrong).
    flipped = nonce[:-3] + ("A" if nonce[-3] != "A" else "B") + nonce[-2:]
    forged = challenge.replace(nonce, flipped)
    assert auth.verify(client_authorization(forged), "INVITE", T0).reason == "bad_nonce"
    # A nonce from another secret, or from another realm with the same secret.
    other_secret = make_auth(nonce_secret=b"another-secret-of-32-bytes------")
    foreign = client_authorization(other_secret.challenges(T0)[0])
    assert auth.verify(foreign, "INVITE", T0).reason == "bad_nonce"
    other_realm = make_auth(realm="other.test")
    their_nonce = challenge_params(other_realm.challenges(T0)[0])["nonce"]
    moved = client_authorization(challenge.replace(nonce, their_nonce))
    assert auth.verify(moved, "INVITE", T0).reason == "bad_nonce"
    for junk in ("", "abc", "!!!!", "A" * 200, "é" * 40):
        header = client_authorization(challenge.replace(nonce, junk))
        assert auth.verify(header, "INVITE", T0).reason in {"bad_nonce", "malformed"}


def test_restart_with_new_secret_invalidates_outstanding_nonces() -> None:
    before = make_auth(nonce_secret=secrets.token_bytes(32))
    header = client_authorization(before.challenges(T0)[0])
    after = make_auth(nonce_secret=secrets.token_bytes(32))
    assert after.verify(header, "INVITE", T0 + 1).reason == "bad_nonce"
    # Same secret after a restart: still valid (nonces are stateless).
    same = make_auth(nonce_secret=SECRET)
    assert same.verify(client_authorization(make_auth().challenges(T0)[0]), "INVITE", T0).ok


def test_request_uri_check_is_optional() -> None:
    auth = make_auth()
    header = client_authorization(auth.challenges(T0)[0])
    verdict = auth.verify(header, "INVITE", T0, request_uri="sip:other@127.0.0.1")
    assert verdict.reason == "uri_mismatch"
    assert auth.verify(header, "INVITE", T0, request_uri=URI).ok


# -- expiry and replay ------------------------------------------------------------------------


def test_expired_nonce_is_stale_only_with_right_password() -> None:
    auth = make_auth(nonce_ttl_s=10.0)
    challenge = auth.challenges(T0)[0]
    good = client_authorization(challenge)
    bad = client_authorization(challenge, password="nope")
    assert auth.verify(good, "INVITE", T0 + 10.0).ok  # age == TTL is still fresh
    late = auth.verify(client_authorization(challenge, nc=2), "INVITE", T0 + 10.5)
    assert (late.ok, late.stale, late.reason) == (False, True, "nonce_expired")
    assert auth.verify(bad, "INVITE", T0 + 10.5).reason == "bad_credentials"
    assert not auth.verify(bad, "INVITE", T0 + 10.5).stale


def test_nonce_from_the_future_is_stale() -> None:
    auth = make_auth()
    header = client_authorization(auth.challenges(T0 + 60)[0])
    assert auth.verify(header, "INVITE", T0).stale  # clock stepped back 60 s
    header = client_authorization(auth.challenges(T0 + NONCE_FUTURE_TOLERANCE_S / 2)[0])
    assert auth.verify(header, "INVITE", T0).ok


def test_replay_of_same_nonce_count_is_refused() -> None:
    auth = make_auth()
    challenge = auth.challenges(T0)[0]
    first = client_authorization(challenge)
    assert auth.verify(first, "INVITE", T0).ok
    replay = auth.verify(first, "INVITE", T0 + 1)
    assert (replay.ok, replay.stale, replay.reason) == (False, False, "replay")
    # The same nonce with the next count is a legitimate new request (RFC 7616 §3.4).
    assert auth.verify(client_authorization(challenge, nc=2), "INVITE", T0 + 2).ok
    # After the nonce expired, the replay is "stale", never "ok".
    late = auth.verify(first, "INVITE", T0 + DEFAULT_NONCE_TTL_S + 5)
    assert not late.ok


def test_replay_cache_is_bounded() -> None:
    auth = make_auth(replay_cache_size=3)
    challenge = auth.challenges(T0)[0]
    headers = [client_authorization(challenge, nc=n) for n in range(1, 6)]
    for header in headers:
        assert auth.verify(header, "INVITE", T0).ok
    assert len(auth._seen) == 3
    # The newest three are still refused as replays; the oldest were evicted (documented bound).
    assert [auth.verify(h, "INVITE", T0).reason for h in headers[2:]] == ["replay"] * 3


def test_replay_cache_forgets_expired_nonces() -> None:
    auth = make_auth(nonce_ttl_s=5.0)
    for i in range(10):
        challenge = auth.challenges(T0 + i * 10)[0]
        assert auth.verify(client_authorization(challenge), "INVITE", T0 + i * 10).ok
    assert len(auth._seen) == 1


# -- messy but valid headers ------------------------------------------------------------------


def test_messy_but_valid_header_forms() -> None:
    auth = make_auth()
    challenge = auth.challenges(T0)[1]  # MD5
    nonce = challenge_params(challenge)["nonce"]
    response = digest_response(
        algorithm="MD5",
        username=USER,
        realm=REALM,
        password=PASSWORD,
        method="INVITE",
        uri=URI,
        nonce=nonce,
        nc="0000000A",  # hashed exactly as sent
        cnonce="x y",
    )
    messy = (
        f'  dIgEsT\tUserName = "{USER}" ,REALM="{REALM}",\r\n nonce= "{nonce}",,'
        f'uri="{URI}", Response="{response.upper()}", ALGORITHM=md5, cnonce="x y",'
        f' QOP="auth", nc=0000000A , '
    )
    verdict = auth.verify(messy, "invite".upper(), T0)
    assert verdict.ok, verdict


def test_escaped_quotes_in_username() -> None:
    name = 'we"ird\\user'
    auth = make_auth(username=name)
    challenge = auth.challenges(T0)[0]
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    header = client_authorization(challenge, username=name).replace(
        f'username="{name}"', f'username="{escaped}"'
    )
    assert auth.verify(header, "INVITE", T0).ok


def test_non_ascii_credentials() -> None:
    auth = make_auth(username="jürgen", password="pässwörd")
    challenge = auth.challenges(T0)[0]
    assert auth.verify(
        client_authorization(challenge, username="jürgen", password="pässwörd"), "INVITE", T0
    ).ok


# -- garbage ----------------------------------------------------------------------------------


def _valid_header() -> tuple[DigestAuthenticator, str]:
    auth = make_auth()
    return auth, client_authorization(auth.challenges(T0)[0])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda h: "", "malformed"),
        (lambda h: "   ", "malformed"),
        (lambda h: "Digest", "missing_param"),
        (lambda h: h.replace("Digest", "Basic"), "bad_scheme"),
        (lambda h: "Basic dXNlcjpwYXNz", "bad_scheme"),
        (lambda h: h + ", qop=auth", "duplicate_param"),
        (lambda h: h.replace("qop=auth", 'qop="auth-int"'), "qop_unsupported"),
        (lambda h: re.sub(r", cnonce=[^,]*, qop=auth, nc=\w+", "", h), "qop_unsupported"),
        (lambda h: re.sub(r", cnonce=\"[^\"]*\"", "", h), "missing_param"),
        (
            lambda h: h.replace("algorithm=SHA-256", "algorithm=SHA-256-sess"),
            "algorithm_unsupported",
        ),
        (
            lambda h: h.replace("algorithm=SHA-256", "algorithm=SHA-512-256"),
            "algorithm_unsupported",
        ),
        (lambda h: h + ", userhash=true", "userhash_unsupported"),
        (lambda h: h.replace("nc=00000001", "nc=00000000"), "bad_nc"),
        (lambda h: h.replace("nc=00000001", "nc=1"), "bad_nc"),
        (lambda h: h.replace("nc=00000001", "nc=0000000g"), "bad_nc"),
        (lambda h: h.replace('username="', 'username="\x00'), "malformed"),
        (lambda h: h.replace(", qop=auth", ', qop="auth'), "malformed"),
        (lambda h: h[:-5] + '"', "malformed"),
        (lambda h: h.replace("qop=auth", "qop"), "malformed"),
        (lambda h: h.replace(", ", " "), "malformed"),
        (lambda h: h + ", =x", "malformed"),
        (lambda h: h + ', x="' + "a" * 5000 + '"', "too_long"),
    ],
)
def test_garbage_is_refused_with_a_reason(mutate: object, reason: str) -> None:
    auth, header = _valid_header()
    verdict = auth.verify(mutate(header), "INVITE", T0)  # type: ignore[operator]
    assert (verdict.ok, verdict.stale, verdict.reason) == (False, False, reason)


def test_wrong_types_and_bad_methods_do_not_raise() -> None:
    auth, header = _valid_header()
    assert auth.verify(None, "INVITE", T0).reason == "malformed"  # type: ignore[arg-type]
    assert auth.verify(header.encode(), "INVITE", T0).reason == "malformed"  # type: ignore[arg-type]
    assert auth.verify(header, "", T0).reason == "malformed"
    assert auth.verify(header, "IN VITE", T0).reason == "malformed"
    assert auth.verify(header, "INVITE", float("nan")).ok is False  # a broken clock never passes


def test_parse_authorization_errors_carry_reason() -> None:
    with pytest.raises(DigestParseError) as info:
        parse_authorization('Digest a="b')
    assert info.value.reason == "malformed"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text_never_raises(text: str) -> None:
    auth = make_auth()
    verdict = auth.verify(text, "INVITE", T0)
    assert not verdict.ok
    assert verdict.reason in VERDICT_REASONS


_param_names = st.sampled_from(
    ["username", "realm", "nonce", "uri", "response", "algorithm", "cnonce", "qop", "nc", "x"]
)
_param_values = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_param_names, _param_values, st.booleans()), max_size=12))
def test_fuzz_structured_params_never_raise(params: list[tuple[str, str, bool]]) -> None:
    auth, header = _valid_header()
    valid = challenge_params(header.replace("Digest ", "Digest ", 1))
    parts = []
    for name, value, quoted in params:
        value = valid.get(name, value) if value == "" else value
        parts.append(f'{name}="{value}"' if quoted else f"{name}={value}")
    verdict = auth.verify("Digest " + ", ".join(parts), "INVITE", T0)
    assert not verdict.ok
    assert verdict.reason in VERDICT_REASONS


# -- construction and secrecy -----------------------------------------------------------------


def test_repr_hides_password_and_secret() -> None:
    auth = make_auth()
    text = repr(auth) + str(auth) + f"{auth!r} {auth}"
    assert REALM in text
    assert PASSWORD not in text
    assert SECRET.decode() not in text
    # The password is not even kept: only HA1 hashes are.
    assert all(PASSWORD not in repr(v) for v in vars(auth).values())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"realm": ""},
        {"realm": 'a"b'},
        {"realm": "a\nb"},
        {"username": ""},
        {"password": ""},
        {"nonce_secret": b"short"},
        {"nonce_ttl_s": 0},
        {"algorithms": []},
        {"algorithms": ["MD5", "md5"]},
        {"algorithms": ["SHA-512-256"]},
        {"replay_cache_size": 0},
    ],
)
def test_constructor_rejects_bad_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        make_auth(**kwargs)


# -- interop with a real pjsua2 client --------------------------------------------------------


def _pjsua_caller(
    target: str, creds: list[tuple[str, str]], results: multiprocessing.Queue[list[int]]
) -> None:
    """Child process: a pjsua2 UA that places one call per credential to ``target``."""
    import pjsua2 as pj  # type: ignore[import-untyped]  # SWIG module without stubs

    class Call(pj.Call):  # type: ignore[misc]
        def __init__(self, account: pj.Account) -> None:
            super().__init__(account)
            self.done = False
            self.status = 0

        def onCallState(self, prm: pj.OnCallStateParam) -> None:
            info = self.getInfo()
            if info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                self.done = True
                self.status = info.lastStatusCode

    ep = pj.Endpoint()
    ep.libCreate()
    config = pj.EpConfig()
    config.uaConfig.threadCnt = 0
    config.uaConfig.mainThreadOnly = False
    config.uaConfig.userAgent = "rutster"
    config.logConfig.level = 0
    config.logConfig.consoleLevel = 0
    ep.libInit(config)
    ep.audDevManager().setNullDev()
    transport = pj.TransportConfig()
    transport.port = 0
    transport.boundAddress = "127.0.0.1"
    ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, transport)
    ep.libStart()
    accounts = []
    statuses = []
    for user, password in creds:
        account_config = pj.AccountConfig()
        account_config.idUri = f"sip:{user}@127.0.0.1"
        account_config.sipConfig.authCreds.append(pj.AuthCredInfo("digest", "*", user, 0, password))
        account = pj.Account()
        account.create(account_config)
        accounts.append(account)
        call = Call(account)
        call.makeCall(target, pj.CallOpParam(True))
        deadline = time.monotonic() + 10
        while not call.done and time.monotonic() < deadline:
            ep.libHandleEvents(10)
        statuses.append(call.status)
        del call  # release before libDestroy, or pjsua asserts at exit (docs/SIP.md)
    for account in accounts:
        account.shutdown()
    accounts.clear()
    ep.libDestroy()
    results.put(statuses)


@dataclass
class _Request:
    method: str
    start_line: str
    headers: list[tuple[str, str]]


def _parse_request(data: bytes) -> _Request:
    head = data.decode("utf-8").split("\r\n\r\n", 1)[0]
    lines = head.split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return _Request(lines[0].split(" ", 1)[0], lines[0], headers)


def _response(request: _Request, status: str, extra: list[str]) -> bytes:
    out = [f"SIP/2.0 {status}"]
    for name, value in request.headers:
        lower = name.lower()
        if lower in ("via", "from", "call-id", "cseq"):
            out.append(f"{name}: {value}")
        elif lower == "to":
            out.append(f"{name}: {value};tag=uas-test")
    return "\r\n".join([*out, *extra, "Content-Length: 0", "", ""]).encode()


@pytest.fixture
def sip_socket() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)
    yield sock
    sock.close()


def test_pjsua2_client_interop(sip_socket: socket.socket) -> None:
    """A real pjsua2 UA answers our challenge; its retried INVITE verifies (and fails with a wrong
    password). Three calls: both algorithms offered, MD5 only, wrong password."""
    port = sip_socket.getsockname()[1]
    both = make_auth(username="alice", password="s3cret")
    md5_only = make_auth(username="alice", password="s3cret", algorithms=["MD5"])
    plans = [(both, "alice", "s3cret"), (md5_only, "alice", "s3cret"), (both, "alice", "wrong")]
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[list[int]] = context.Queue()
    child = context.Process(
        target=_pjsua_caller,
        args=(f"sip:bob@127.0.0.1:{port}", [(u, p) for _, u, p in plans], results),
    )
    child.start()
    verdicts = []
    try:
        for auth, _, _ in plans:
            answered = False
            while True:
                data, addr = sip_socket.recvfrom(65535)
                request = _parse_request(data)
                if request.method == "ACK":
                    if answered:
                        break  # the ACK of our 603: this call is over
                    continue  # the ACK of the 401
                assert request.method == "INVITE"
                authorization = [v for n, v in request.headers if n.lower() == "authorization"]
                if not authorization:
                    challenges = [f"WWW-Authenticate: {c}" for c in auth.challenges(time.time())]
                    sip_socket.sendto(_response(request, "401 Unauthorized", challenges), addr)
                    continue
                assert len(authorization) == 1
                verdicts.append(auth.verify(authorization[0], "INVITE", time.time()))
                sip_socket.sendto(_response(request, "603 Decline", []), addr)
                answered = True
        statuses = results.get(timeout=20)
    finally:
        child.join(timeout=20)
        if child.is_alive():
            child.kill()
            child.join()
    assert [(v.ok, v.reason, v.algorithm) for v in verdicts] == [
        (True, "ok", "SHA-256"),
        (True, "ok", "MD5"),
        (False, "bad_credentials", "SHA-256"),
    ]
    assert statuses == [603, 603, 603]
    assert child.exitcode == 0
