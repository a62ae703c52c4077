"""Kernel-level source filter for the SIP worker's sockets (Linux classic BPF, IPv4 only).

Why: in ``unknown_response="drop"`` mode nothing may come back to a stranger, but pjsua answers
``100 Trying`` to an INVITE before any application callback runs, so the application cannot
stay silent on its own. A classic BPF socket filter (``SO_ATTACH_FILTER``) runs in the kernel
when a packet is queued to the socket, before pjsua reads it: packets from sources outside the
allowlist, or on the deny list (the access policy's rejection cache), are discarded there.

What the program does, per packet:

1. ``ldb [SKF_NET_OFF]``, keep the version nibble: not IPv4 -> drop. IPv6 is not supported:
   IPv6 CIDRs are refused with a clear error, and IPv6 packets (possible only on a dual-stack
   socket) are dropped.
2. ``ld [SKF_NET_OFF + 12]``: the IPv4 source address. The negative ``SKF_NET_OFF`` base makes
   the offset relative to the network header, which works on both UDP sockets (where the packet
   data given to the filter starts at the UDP header) and TCP sockets.
3. Denied addresses/networks first (``ret #0`` = drop), then the allowed networks (accept the
   whole packet); anything left is dropped.

On a TCP listening socket the filter sees the SYN, so a refused peer's connection never
completes (its ``connect`` times out: no RST, nothing learned). Connections accepted later
inherit the listener's filter as it was at accept time; :meth:`SourceFilter.update_denied`
re-attaches to the UDP and listening sockets only, so established calls are never cut.

The sockets belong to pjsua (C code), so they are found by local port among this process's
sockets (psutil) and the filter is attached through a ``dup`` of their descriptor: the filter is a
property of the socket, not of the descriptor. Linux only; elsewhere the constructor raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

#: ``SO_ATTACH_FILTER`` / ``SO_DETACH_FILTER`` from <asm-generic/socket.h> (not in Python's socket).
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27

#: ``SKF_NET_OFF`` from <linux/filter.h>: loads at this negative base are relative to the network
#: (IP) header rather than to the start of the data the filter is given.
SKF_NET_OFF = -0x100000

#: ``BPF_MAXINSNS`` from <linux/bpf_common.h>: the kernel refuses longer classic programs.
BPF_MAXINSNS = 4096

#: Denied entries placed in the program. A single address costs 2 instructions, so 1024 of them
#: leave more than half of ``BPF_MAXINSNS`` for the allowlist. Entries beyond this are not
#: filtered in the kernel (the access policy still refuses them in user space) and are counted.
MAX_DENIED_ENTRIES = 1024

#: Classic BPF opcodes (<linux/bpf_common.h>, <linux/filter.h>).
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word at k
BPF_LD_B_ABS = 0x30  # BPF_LD | BPF_B | BPF_ABS: A = byte at k
BPF_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K: A &= k
BPF_JMP_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K: pc += (A == k) ? jt : jf
BPF_RET_K = 0x06  # BPF_RET | BPF_K: return k (bytes of the packet to keep; 0 = drop)
BPF_MISC_TAX = 0x07  # BPF_MISC | BPF_TAX: X = A
BPF_MISC_TXA = 0x87  # BPF_MISC | BPF_TXA: A = X

#: Return values: keep the whole packet (any value >= its length does) / drop it.
ACCEPT_ALL = 0xFFFFFFFF
DROP = 0

_U32 = 0xFFFFFFFF
_IPV4_SOURCE_OFFSET = 12  # RFC 791: source address at byte 12 of the IPv4 header
_IP_VERSION_MASK = 0xF0
_IPV4_VERSION_NIBBLE = 0x40


@dataclass(frozen=True, slots=True)
class BpfInstruction:
    """One ``struct sock_filter``: opcode, jump-if-true, jump-if-false, constant."""

    code: int
    jt: int
    jf: int
    k: int


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter)))


def parse_ipv4_networks(entries: Iterable[str], what: str) -> list[ipaddress.IPv4Network]:
    """Parse IPv4 CIDRs (a bare address means /32); refuse IPv6 and garbage with a ValueError."""
    if isinstance(entries, str):
        raise ValueError(f"{what} must be a list of CIDR strings, not one string")
    networks: list[ipaddress.IPv4Network] = []
    for entry in entries:
        try:
            network = ipaddress.ip_network(str(entry).strip(), strict=False)
        except ValueError as exc:
            raise ValueError(f"invalid {what} entry {entry!r}: {exc}") from None
        if not isinstance(network, ipaddress.IPv4Network):
            raise ValueError(
                f"{what} entry {entry!r} is IPv6: the SIP source filter handles IPv4 only"
            )
        networks.append(network)
    return networks


def build_filter_program(
    allowed: Sequence[ipaddress.IPv4Network], denied: Sequence[ipaddress.IPv4Network] = ()
) -> list[BpfInstruction]:
    """The classic BPF program: IPv4 only, ``denied`` dropped, ``allowed`` accepted, rest dropped.

    Every test jumps at most one instruction forward (into an inline ``ret``), so no jump offset
    can overflow the 8-bit ``jt``/``jf`` fields however long the lists are.
    """
    ins = BpfInstruction
    program = [
        ins(BPF_LD_B_ABS, 0, 0, SKF_NET_OFF & _U32),
        ins(BPF_ALU_AND_K, 0, 0, _IP_VERSION_MASK),
        ins(BPF_JMP_JEQ_K, 1, 0, _IPV4_VERSION_NIBBLE),
        ins(BPF_RET_K, 0, 0, DROP),
        ins(BPF_LD_W_ABS, 0, 0, (SKF_NET_OFF + _IPV4_SOURCE_OFFSET) & _U32),
        ins(BPF_MISC_TAX, 0, 0, 0),
    ]
    a_is_source = True  # whether A still holds the source address (an AND overwrites it)
    for networks, verdict in ((denied, DROP), (allowed, ACCEPT_ALL)):
        for network in networks:
            if network.prefixlen == 32:
                if not a_is_source:
                    program.append(ins(BPF_MISC_TXA, 0, 0, 0))
                    a_is_source = True
            else:
                if not a_is_source:
                    program.append(ins(BPF_MISC_TXA, 0, 0, 0))
                program.append(ins(BPF_ALU_AND_K, 0, 0, int(network.netmask)))
                a_is_source = False
            # Equal: fall into the ret below; not equal: skip over it.
            program.append(ins(BPF_JMP_JEQ_K, 0, 1, int(network.network_address)))
            program.append(ins(BPF_RET_K, 0, 0, verdict))
    program.append(ins(BPF_RET_K, 0, 0, DROP))
    if len(program) > BPF_MAXINSNS:
        raise ValueError(
            f"source filter program has {len(program)} instructions (kernel limit {BPF_MAXINSNS}): "
            "use fewer, wider allowed CIDRs"
        )
    return program


def find_listening_sockets(port: int) -> list[tuple[int, int]]:
    """(fd, socket type) of this process's UDP sockets and listening TCP sockets on ``port``."""
    found: list[tuple[int, int]] = []
    for conn in psutil.Process().net_connections(kind="inet"):
        if conn.fd < 0 or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.type == socket.SOCK_DGRAM or (
            conn.type == socket.SOCK_STREAM and conn.status == psutil.CONN_LISTEN
        ):
            found.append((conn.fd, int(conn.type)))
    return found


class SourceFilter:
    """Attaches a source-address BPF filter to the SIP sockets of this process.

    ``allowed``: IPv4 CIDRs (or bare addresses) whose packets are accepted, e.g. the trunk's
    ranges, or ``["0.0.0.0/0"]`` for digest-only workers (then only the deny list bites).
    Thread-safe enough for its use: the kernel swaps a socket's filter atomically.
    """

    def __init__(self, allowed: Sequence[str]) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(
                f"the SIP source filter needs Linux socket filters (SO_ATTACH_FILTER); "
                f"this is {sys.platform}: use unknown_response='reject' instead"
            )
        networks = parse_ipv4_networks(allowed, "allowed")
        if not networks:
            raise ValueError("the source filter needs at least one allowed CIDR")
        self._allowed = networks
        self._denied: list[ipaddress.IPv4Network] = []
        self._ports: list[int] = []
        #: Denied entries left out of the kernel program at the last update (over the cap).
        self.denied_overflow = 0

    @property
    def denied(self) -> tuple[str, ...]:
        """The deny entries currently in the program."""
        return tuple(str(n) for n in self._denied)

    def program(self) -> list[BpfInstruction]:
        """The program that :meth:`attach` installs for the current allow and deny lists."""
        return build_filter_program(self._allowed, self._denied)

    def attach(self, port: int) -> int:
        """Attach to every UDP socket and listening TCP socket of this process on ``port``.

        Returns how many sockets were filtered; raises ``LookupError`` if there are none (the
        transport is not up yet, or the port is wrong) and ``OSError`` if the kernel refuses.
        """
        if not 0 < port <= 65535:
            raise ValueError(f"port out of range: {port}")
        count = self._apply(port)
        if count == 0:
            raise LookupError(f"no UDP or listening TCP socket on port {port} in this process")
        if port not in self._ports:
            self._ports.append(port)
        return count

    def attach_socket(self, sock: socket.socket) -> None:
        """Attach the current program to one socket object (e.g. one created in Python)."""
        _attach_fd(sock.fileno(), self.program())

    def update_denied(self, ips: Iterable[str]) -> int:
        """Replace the deny list and re-attach to the attached ports; return entries left out.

        ``ips`` are IPv4 addresses or CIDRs (e.g. ``SipAccessPolicy.blocked_sources``); IPv6
        entries are skipped since IPv6 packets are dropped anyway. Only the first
        :data:`MAX_DENIED_ENTRIES` go into the kernel; the count of the rest is returned and kept
        in :attr:`denied_overflow`. Garbage entries raise ``ValueError``.
        """
        if isinstance(ips, str):
            raise ValueError("update_denied takes a list of addresses, not one string")
        ipv4: list[str] = []
        for entry in ips:
            try:
                version = ipaddress.ip_network(str(entry).strip(), strict=False).version
            except ValueError as exc:
                raise ValueError(f"invalid denied entry {entry!r}: {exc}") from None
            if version == 4:
                ipv4.append(entry)
        networks = list(dict.fromkeys(parse_ipv4_networks(ipv4, "denied")))
        self._denied = networks[:MAX_DENIED_ENTRIES]
        self.denied_overflow = len(networks) - len(self._denied)
        for port in self._ports:
            self._apply(port)
        return self.denied_overflow

    def detach(self) -> None:
        """Remove the filter from the attached ports' sockets (e.g. on shutdown)."""
        for port in self._ports:
            for fd, _ in find_listening_sockets(port):
                # ENOENT: no filter on that socket (it was opened after attach).
                with _dup_socket(fd) as sock, contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        self._ports.clear()

    def _apply(self, port: int) -> int:
        program = self.program()
        sockets = find_listening_sockets(port)
        for fd, _ in sockets:
            _attach_fd(fd, program)
        return len(sockets)


def _dup_socket(fd: int) -> socket.socket:
    """A Python socket over a duplicate of ``fd``: closing it leaves the owner's descriptor open."""
    return socket.socket(fileno=os.dup(fd))


def _attach_fd(fd: int, program: Sequence[BpfInstruction]) -> None:
    array = (_SockFilter * len(program))(*(_SockFilter(i.code, i.jt, i.jf, i.k) for i in program))
    fprog = _SockFprog(len(program), ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    # The kernel copies the program during the call; ``array`` stays referenced until then.
    with _dup_socket(fd) as sock:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))
