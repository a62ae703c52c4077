"""Kernel source filter: real loopback sockets (127.0.0.1 vs 127.0.0.2) plus program semantics."""

from __future__ import annotations

import ipaddress
import multiprocessing
import multiprocessing.synchronize
import socket
import struct
import sys
import time
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.trunk.sip.source_filter import (
    BPF_MAXINSNS,
    MAX_DENIED_ENTRIES,
    SKF_NET_OFF,
    BpfInstruction,
    SourceFilter,
    build_filter_program,
    find_listening_sockets,
    parse_ipv4_networks,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux BPF only")

ALLOWED_SRC = "127.0.0.1"
OTHER_SRC = "127.0.0.2"  # all of 127/8 is loopback on Linux
#: How long "never arrives" is waited for: loopback delivery takes microseconds.
SILENCE_S = 0.3
#: connect() timeout for a SYN the filter drops (the kernel would retransmit for ~2 min).
CONNECT_TIMEOUT_S = 0.5


@pytest.fixture
def udp_server() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock
    sock.close()


def send_from(source_ip: str, port: int, payload: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.bind((source_ip, 0))
        sender.sendto(payload, ("127.0.0.1", port))


def received(server: socket.socket) -> list[tuple[bytes, str]]:
    """Everything that arrives within SILENCE_S."""
    got: list[tuple[bytes, str]] = []
    server.settimeout(SILENCE_S)
    while True:
        try:
            data, (ip, _) = server.recvfrom(2048)
        except TimeoutError:
            return got
        got.append((data, ip))


def connects_from(source_ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        client.bind((source_ip, 0))
        client.settimeout(CONNECT_TIMEOUT_S)
        try:
            client.connect(("127.0.0.1", port))
        except TimeoutError:
            return False
        return True


# -- real sockets -----------------------------------------------------------------------------


def test_udp_only_allowed_source_arrives(udp_server: socket.socket) -> None:
    port = udp_server.getsockname()[1]
    send_from(OTHER_SRC, port, b"before")  # no filter yet: arrives
    assert received(udp_server) == [(b"before", OTHER_SRC)]
    source_filter = SourceFilter(["127.0.0.1/32"])
    assert source_filter.attach(port) == 1
    send_from(ALLOWED_SRC, port, b"allowed")
    send_from(OTHER_SRC, port, b"stranger")
    assert received(udp_server) == [(b"allowed", ALLOWED_SRC)]


def test_tcp_syn_from_stranger_never_completes(tcp_listener: socket.socket) -> None:
    port = tcp_listener.getsockname()[1]
    assert SourceFilter(["127.0.0.1"]).attach(port) == 1
    started = time.monotonic()
    assert not connects_from(OTHER_SRC, port)
    assert time.monotonic() - started >= CONNECT_TIMEOUT_S * 0.9  # a timeout, not a refusal
    assert connects_from(ALLOWED_SRC, port)
    conn, (peer_ip, _) = tcp_listener.accept()
    conn.close()
    assert peer_ip == ALLOWED_SRC


def test_attach_covers_udp_and_tcp_on_the_same_port(udp_server: socket.socket) -> None:
    port = udp_server.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        try:
            listener.bind(("127.0.0.1", port))
        except OSError:
            pytest.skip(f"TCP port {port} is taken by someone else")
        listener.listen(4)
        assert sorted(kind for _, kind in find_listening_sockets(port)) == [
            socket.SOCK_STREAM,
            socket.SOCK_DGRAM,
        ]
        source_filter = SourceFilter(["127.0.0.0/31"])  # .0 and .1
        assert source_filter.attach(port) == 2
        assert not connects_from(OTHER_SRC, port)
        send_from(OTHER_SRC, port, b"x")
        assert received(udp_server) == []


def test_update_denied_blocks_a_previously_allowed_source(udp_server: socket.socket) -> None:
    port = udp_server.getsockname()[1]
    source_filter = SourceFilter(["127.0.0.0/8"])
    source_filter.attach(port)
    send_from(OTHER_SRC, port, b"1")
    send_from(ALLOWED_SRC, port, b"2")
    assert sorted(received(udp_server)) == [(b"1", OTHER_SRC), (b"2", ALLOWED_SRC)]
    assert source_filter.update_denied(["127.0.0.2", "2001:db8::1"]) == 0
    assert source_filter.denied == ("127.0.0.2/32",)
    send_from(OTHER_SRC, port, b"3")
    send_from(ALLOWED_SRC, port, b"4")
    assert received(udp_server) == [(b"4", ALLOWED_SRC)]
    source_filter.update_denied([])  # lifted again
    send_from(OTHER_SRC, port, b"5")
    assert received(udp_server) == [(b"5", OTHER_SRC)]


def test_update_denied_on_tcp_keeps_established_connections(tcp_listener: socket.socket) -> None:
    port = tcp_listener.getsockname()[1]
    source_filter = SourceFilter(["127.0.0.0/8"])
    source_filter.attach(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        client.bind((OTHER_SRC, 0))
        client.settimeout(2)
        client.connect(("127.0.0.1", port))
        conn, _ = tcp_listener.accept()
        with conn:
            source_filter.update_denied(["127.0.0.2"])
            assert not connects_from(OTHER_SRC, port)  # new connections refused...
            client.sendall(b"still here")  # ...the established call keeps flowing
            conn.settimeout(2)
            assert conn.recv(100) == b"still here"


def test_detach_restores_delivery(udp_server: socket.socket) -> None:
    port = udp_server.getsockname()[1]
    source_filter = SourceFilter(["127.0.0.1"])
    source_filter.attach(port)
    source_filter.detach()
    send_from(OTHER_SRC, port, b"back")
    assert received(udp_server) == [(b"back", OTHER_SRC)]


def test_largest_program_is_accepted_by_the_kernel(udp_server: socket.socket) -> None:
    port = udp_server.getsockname()[1]
    allowed = [f"10.{i}.0.0/16" for i in range(200)] + ["127.0.0.1"]
    source_filter = SourceFilter(allowed)
    source_filter.attach(port)
    denied = [f"127.1.{i >> 8}.{i & 255}" for i in range(MAX_DENIED_ENTRIES + 10)]
    assert source_filter.update_denied(denied) == 10
    assert source_filter.denied_overflow == 10
    assert len(source_filter.program()) <= BPF_MAXINSNS
    send_from(ALLOWED_SRC, port, b"ok")
    send_from(OTHER_SRC, port, b"no")
    assert received(udp_server) == [(b"ok", ALLOWED_SRC)]


def test_attach_without_a_socket_is_a_clear_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    with pytest.raises(LookupError, match=f"port {free_port}"):
        SourceFilter(["127.0.0.1"]).attach(free_port)
    with pytest.raises(ValueError, match="port"):
        SourceFilter(["127.0.0.1"]).attach(70000)


def test_attach_socket_directly(udp_server: socket.socket) -> None:
    SourceFilter(["127.0.0.2"]).attach_socket(udp_server)
    port = udp_server.getsockname()[1]
    send_from(ALLOWED_SRC, port, b"a")
    send_from(OTHER_SRC, port, b"b")
    assert received(udp_server) == [(b"b", OTHER_SRC)]


# -- configuration errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "match"),
    [
        (["2001:db8::/32"], "IPv4 only"),
        (["::1"], "IPv4 only"),
        (["10.0.0.0/40"], "invalid allowed"),
        (["not-an-ip"], "invalid allowed"),
        ([], "at least one"),
        ("127.0.0.1", "not one string"),
    ],
)
def test_bad_allowlists_are_refused(allowed: Sequence[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SourceFilter(allowed)


def test_bad_denied_entries_are_refused() -> None:
    source_filter = SourceFilter(["127.0.0.1"])
    with pytest.raises(ValueError, match="invalid denied"):
        source_filter.update_denied(["garbage"])
    with pytest.raises(ValueError, match="not one string"):
        source_filter.update_denied("127.0.0.2")


def test_non_linux_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(OSError, match="needs Linux"):
        SourceFilter(["127.0.0.1"])


def test_too_many_allowed_networks_is_a_clear_error() -> None:
    allowed = parse_ipv4_networks([f"10.{i >> 8}.{i & 255}.0/24" for i in range(1100)], "allowed")
    with pytest.raises(ValueError, match="kernel limit"):
        build_filter_program(allowed)


# -- program semantics, checked with an independent classic-BPF interpreter -------------------


def run_program(program: Sequence[BpfInstruction], ip_header: bytes) -> int:
    """Interpret the subset of classic BPF the filter uses over a packet's network header."""
    a = x = 0
    pc = 0
    net_base = SKF_NET_OFF & 0xFFFFFFFF
    while True:
        ins = program[pc]
        pc += 1
        if ins.code in (0x20, 0x30):  # ld / ldb [SKF_NET_OFF + off]
            offset = ins.k - net_base
            size = 4 if ins.code == 0x20 else 1
            if offset + size > len(ip_header):
                return 0  # out-of-bounds load aborts with "drop", as in the kernel
            a = int.from_bytes(ip_header[offset : offset + size], "big")
        elif ins.code == 0x54:
            a &= ins.k
        elif ins.code == 0x15:
            pc += ins.jt if a == ins.k else ins.jf
        elif ins.code == 0x06:
            return ins.k
        elif ins.code == 0x07:
            x = a
        elif ins.code == 0x87:
            a = x
        else:
            raise AssertionError(f"unexpected opcode {ins.code:#x}")


def ipv4_header(source: ipaddress.IPv4Address) -> bytes:
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 48, 0, 0, 64, 17, 0, source.packed, bytes(4))


_ipv4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
_networks = st.builds(
    lambda address, prefix: ipaddress.IPv4Network((address, prefix), strict=False),
    _ipv4,
    st.integers(0, 32),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_networks, min_size=1, max_size=6),
    st.lists(_networks, max_size=6),
    st.lists(_ipv4, min_size=1, max_size=8),
)
def test_program_matches_allow_minus_deny(
    allowed: list[ipaddress.IPv4Network],
    denied: list[ipaddress.IPv4Network],
    sources: list[ipaddress.IPv4Address],
) -> None:
    program = build_filter_program(allowed, denied)
    for source in [*sources, *(n.network_address for n in allowed + denied)]:
        expected = any(source in n for n in allowed) and not any(source in n for n in denied)
        verdict = run_program(program, ipv4_header(source))
        assert (verdict != 0) == expected, (source, allowed, denied)


def test_non_ipv4_packets_are_dropped() -> None:
    program = build_filter_program(parse_ipv4_networks(["0.0.0.0/0"], "allowed"))
    ipv6_header = bytes([0x60]) + bytes(39)
    assert run_program(program, ipv6_header) == 0
    assert run_program(program, ipv4_header(ipaddress.IPv4Address("8.8.8.8"))) != 0
    # Every jump is a one-instruction skip, so long lists cannot overflow 8-bit offsets.
    assert all(ins.jt <= 1 and ins.jf <= 1 for ins in program)


# -- on pjsua2's own sockets ------------------------------------------------------------------


def _pjsua_behind_filter(
    port: int,
    allowed: list[str],
    ready: multiprocessing.Queue[int | str],
    stop: multiprocessing.synchronize.Event,
) -> None:
    """Child process: a pjsua2 UA on ``port`` (UDP and TCP) with the filter on its sockets."""
    import pjsua2 as pj  # type: ignore[import-untyped]  # SWIG module without stubs

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
    for kind in (pj.PJSIP_TRANSPORT_UDP, pj.PJSIP_TRANSPORT_TCP):
        transport = pj.TransportConfig()
        transport.port = port
        transport.boundAddress = "127.0.0.1"
        ep.transportCreate(kind, transport)
    ep.libStart()
    try:
        ready.put(SourceFilter(allowed).attach(port))
    except (OSError, LookupError, ValueError) as exc:
        ready.put(repr(exc))
    deadline = time.monotonic() + 20
    while not stop.is_set() and time.monotonic() < deadline:
        ep.libHandleEvents(10)
    ep.libDestroy()


def sip_options(source_ip: str, source_port: int, port: int) -> bytes:
    return (
        f"OPTIONS sip:probe@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {source_ip}:{source_port};branch=z9hG4bK-{source_port}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:scanner@{source_ip}>;tag=1\r\n"
        f"To: <sip:probe@127.0.0.1:{port}>\r\n"
        f"Call-ID: probe-{source_ip}\r\n"
        "CSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def test_pjsua2_transport_is_silent_to_strangers() -> None:
    """The point of the filter: pjsua itself answers OPTIONS (and 100 Trying to INVITE); behind
    the filter a stranger gets nothing at all over UDP and cannot even open a TCP connection."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    ready: multiprocessing.Queue[int | str] = context.Queue()
    stop = context.Event()
    child = context.Process(target=_pjsua_behind_filter, args=(port, ["127.0.0.1"], ready, stop))
    child.start()
    try:
        assert ready.get(timeout=20) == 2  # pjsua's UDP socket and TCP listener
        answers = {}
        for source_ip in (ALLOWED_SRC, OTHER_SRC):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                client.bind((source_ip, 0))
                client.settimeout(1.0 if source_ip == ALLOWED_SRC else SILENCE_S)
                request = sip_options(source_ip, client.getsockname()[1], port)
                client.sendto(request, ("127.0.0.1", port))
                try:
                    answers[source_ip] = client.recv(4096).split(b"\r\n", 1)[0]
                except TimeoutError:
                    answers[source_ip] = b""
        assert answers == {ALLOWED_SRC: b"SIP/2.0 200 OK", OTHER_SRC: b""}
        assert not connects_from(OTHER_SRC, port)
        assert connects_from(ALLOWED_SRC, port)
    finally:
        stop.set()
        child.join(timeout=20)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0
