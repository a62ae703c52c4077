"""Who may start a call on a SIP worker: source allowlist, digest auth, rejection cache (sans-I/O).

The worker asks :meth:`SipAccessPolicy.decide` about every dialog-creating request (INVITE)
before anything else happens, and acts on the returned :class:`AccessDecision`:

- ``ACCEPT``: go on with admission (the gateway's spend gate).
- ``CHALLENGE``: answer ``401`` with the given ``WWW-Authenticate`` headers.
- ``REJECT``: answer the configured uniform ``reject_code`` (403 by default), whatever the cause,
  so a scanner cannot tell "unknown extension" from "wrong password" from "not allowlisted".
- ``DROP``: send nothing (``unknown_response="drop"``); the kernel filter in
  :mod:`trunk.sip.source_filter` does the same earlier, before pjsua's ``100 Trying``.

Rules, in order:

1. A source IP in the rejection cache is answered REJECT/DROP without looking at credentials.
2. With an allowlist, a source outside it is REJECT/DROP and counts as a failure.
3. With digest configured: no credentials -> CHALLENGE (counted separately: a source that keeps
   being challenged without ever authenticating is cached too); a stale nonce -> CHALLENGE with
   ``stale=true``; bad credentials -> REJECT/DROP and a failure; good credentials -> ACCEPT and the
   source's counters are cleared.
4. With only an allowlist, an allowlisted source is ACCEPT.

ACK and CANCEL cannot be challenged (RFC 3261 §22.1): with digest configured they are refused
when they carry no credentials, and a refused ACK is always DROP (nothing answers an ACK).
Requests pjsua matches to an existing dialog or transaction need not go through the policy.

Allowlist and digest together means both are required. Neither is refused at construction:
the worker never runs open by accident. In drop mode challenges are still sent (a client cannot
authenticate otherwise), so a digest-only worker is visible to scanners as "a SIP server that wants
a password" and nothing more.

The counters are per source IP, kept in bounded LRU maps so a spoofed-source flood costs fixed
memory. Caveat: over UDP an attacker who can spoof an allowlisted trunk's address can get that
address cached for ``block_s``; trunks that can use TCP should.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from rutster.trunk.sip.digest import DigestAuthenticator

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
UnknownResponse = Literal["reject", "drop"]

#: Uniform answer to anything refused: 403 Forbidden (RFC 3261 §21.4.4, "the server understood the
#: request, but is refusing to fulfill it"), the same for every cause (seed decision, issue 6).
DEFAULT_REJECT_CODE = 403

#: Failures (not allowlisted, bad credentials) within the window that put a source IP in the
#: rejection cache: fail2ban's default ``maxretry`` (5), the common SIP-server ban setting.
DEFAULT_FAILURE_LIMIT = 5

#: Window over which failures and challenges are counted: fail2ban's default ``findtime`` (10 min).
DEFAULT_FAILURE_WINDOW_S = 600.0

#: How long a cached source stays refused: fail2ban's default ``bantime`` (10 min). Not extended by
#: retries, so a blocked trunk recovers on its own once its operator fixes the password.
DEFAULT_BLOCK_S = 600.0

#: Unanswered challenges within the window that cache a source. Every call from a digest client
#: starts with one challenge and a success clears the count, so this only needs to cover a burst of
#: concurrent call setups from one trunk IP before the first retry lands (seed decision: 8 times a
#: worker's 4-call capacity); a scanner gets this many 401s per window and then silence.
DEFAULT_CHALLENGE_LIMIT = 32

#: Source IPs tracked (counters) and, separately, IPs cached as blocked. ~200 bytes per entry,
#: so each map stays under ~2 MB per worker (a worker is ~25 MB); the oldest entry is evicted
#: first. Separate maps so a spoofed flood of one-off sources cannot evict the blocked ones.
DEFAULT_CACHE_SIZE = 10_000

#: SIP status codes that may not be the uniform rejection: 401/407 are challenges and would make
#: clients retry with credentials; 2xx/3xx/1xx are not refusals at all.
_CHALLENGE_CODES = frozenset({401, 407})
#: Requests that cannot be challenged (RFC 3261 §22.1); ACK cannot be answered at all.
_UNCHALLENGEABLE = frozenset({"ACK", "CANCEL"})
#: RFC 3261 §25.1 token characters, for checking the method name.
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")

#: SIP status of a challenge (RFC 3261 §22.2, a UAS challenges with 401 and WWW-Authenticate).
CHALLENGE_STATUS = 401
CHALLENGE_HEADER = "WWW-Authenticate"


class AccessAction(StrEnum):
    """What the worker does with a request."""

    ACCEPT = "accept"
    CHALLENGE = "challenge"
    REJECT = "reject"
    DROP = "drop"


# Reason labels (low cardinality, for metrics).
REASON_ALLOWLISTED = "allowlisted"
REASON_AUTHENTICATED = "authenticated"
REASON_NO_CREDENTIALS = "no_credentials"
REASON_STALE_NONCE = "stale_nonce"
REASON_BAD_CREDENTIALS = "bad_credentials"
REASON_NOT_ALLOWLISTED = "not_allowlisted"
REASON_REJECTION_CACHE = "rejection_cache"
REASON_MALFORMED_SOURCE = "malformed_source"
REASON_MALFORMED_REQUEST = "malformed_request"

#: Every reason :meth:`SipAccessPolicy.decide` can return (pre-register metric label values).
ACCESS_REASONS: frozenset[str] = frozenset(
    {
        REASON_ALLOWLISTED,
        REASON_AUTHENTICATED,
        REASON_NO_CREDENTIALS,
        REASON_STALE_NONCE,
        REASON_BAD_CREDENTIALS,
        REASON_NOT_ALLOWLISTED,
        REASON_REJECTION_CACHE,
        REASON_MALFORMED_SOURCE,
        REASON_MALFORMED_REQUEST,
    }
)


@dataclass(frozen=True, slots=True)
class AccessDecision:
    """The policy's answer for one request.

    ``status`` is the SIP status to send (401 for CHALLENGE, the uniform reject code for REJECT,
    None for ACCEPT and DROP); ``headers`` are extra response headers as (name, value) pairs.
    ``reason`` is a label from :data:`ACCESS_REASONS`; ``detail`` is the digest verdict reason
    when credentials were checked (also a low-cardinality label), for logs.
    """

    action: AccessAction
    reason: str
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SipAccessSettings:
    """Access-control configuration of one SIP worker. Validated on construction.

    ``allowed_cidrs``: source networks (IPv4 or IPv6, host bits must be zero; a bare address
    means that host). ``digest``: require digest credentials. At least one of the two is required.
    ``unknown_response``: ``"reject"`` (uniform ``reject_code``) or ``"drop"`` (silence).
    """

    allowed_cidrs: tuple[str, ...] = ()
    digest: DigestAuthenticator | None = None
    unknown_response: UnknownResponse = "reject"
    reject_code: int = DEFAULT_REJECT_CODE
    failure_limit: int = DEFAULT_FAILURE_LIMIT
    failure_window_s: float = DEFAULT_FAILURE_WINDOW_S
    block_s: float = DEFAULT_BLOCK_S
    cache_size: int = DEFAULT_CACHE_SIZE
    challenge_limit: int = DEFAULT_CHALLENGE_LIMIT
    networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.allowed_cidrs, str):
            raise ValueError("allowed_cidrs must be a tuple of CIDR strings, not one string")
        networks: list[IPNetwork] = []
        for cidr in self.allowed_cidrs:
            try:
                networks.append(ipaddress.ip_network(cidr.strip(), strict=True))
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"invalid allowed CIDR {cidr!r}: {exc}") from None
        object.__setattr__(self, "networks", tuple(networks))
        if not networks and self.digest is None:
            raise ValueError(
                "SIP access control needs allowed_cidrs, digest credentials, or both: "
                "refusing to accept calls from anyone"
            )
        if self.unknown_response not in ("reject", "drop"):
            raise ValueError(
                f"unknown_response must be 'reject' or 'drop', not {self.unknown_response!r}"
            )
        if not 400 <= self.reject_code <= 699 or self.reject_code in _CHALLENGE_CODES:
            raise ValueError(
                f"reject_code must be a 4xx-6xx refusal other than 401/407, not {self.reject_code}"
            )
        for name in ("failure_limit", "challenge_limit", "cache_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("failure_window_s", "block_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


@dataclass(slots=True)
class _SourceCounters:
    failures: deque[float]
    challenges: deque[float]


class SipAccessPolicy:
    """Decides ACCEPT / CHALLENGE / REJECT / DROP per request; holds the rejection cache.

    Not thread-safe: call it from the worker's SIP thread only. Time (``now_s``) is an argument;
    use one clock consistently (the digest nonces want wall-clock seconds).
    """

    def __init__(self, settings: SipAccessSettings) -> None:
        self.settings = settings
        self._counters: OrderedDict[IPAddress, _SourceCounters] = OrderedDict()
        self._blocked: OrderedDict[IPAddress, float] = OrderedDict()
        #: Entries pushed out of the bounded maps (a flood signal worth a metric).
        self.evictions = 0
        #: Bumped whenever the set of blocked sources changes (added, evicted, expired), so the
        #: worker re-attaches the kernel filter only when :meth:`blocked_sources` differs.
        self.blocked_generation = 0

    def decide(
        self, source: str, authorization: str | None, method: str, now_s: float
    ) -> AccessDecision:
        """Judge a request from ``source`` ("ip:port" or "[v6]:port") carrying ``authorization``
        (the Authorization header value, or None) for SIP ``method`` at ``now_s``."""
        settings = self.settings
        ip = parse_source_ip(source)
        if ip is None:
            return self._refuse(REASON_MALFORMED_SOURCE, method)
        until = self._blocked.get(ip)
        if until is not None:
            if until > now_s:
                return self._refuse(REASON_REJECTION_CACHE, method)
            del self._blocked[ip]
            self.blocked_generation += 1
        if not isinstance(method, str) or not method or not set(method) <= _TOKEN_CHARS:
            self._count(ip, now_s, challenge=False)
            return self._refuse(REASON_MALFORMED_REQUEST, "")
        method = method.upper()
        if settings.networks and not any(ip in net for net in settings.networks):
            self._count(ip, now_s, challenge=False)
            return self._refuse(REASON_NOT_ALLOWLISTED, method)
        digest = settings.digest
        if digest is None:
            return AccessDecision(AccessAction.ACCEPT, REASON_ALLOWLISTED)
        if not authorization:
            self._count(ip, now_s, challenge=method not in _UNCHALLENGEABLE)
            if method in _UNCHALLENGEABLE:
                return self._refuse(REASON_NO_CREDENTIALS, method)
            return self._challenge(digest, now_s, stale=False, reason=REASON_NO_CREDENTIALS)
        verdict = digest.verify(authorization, method, now_s)
        if verdict.ok:
            self._counters.pop(ip, None)
            return AccessDecision(AccessAction.ACCEPT, REASON_AUTHENTICATED, detail=verdict.reason)
        if verdict.stale and method not in _UNCHALLENGEABLE:
            self._count(ip, now_s, challenge=True)
            return self._challenge(digest, now_s, stale=True, reason=REASON_STALE_NONCE)
        self._count(ip, now_s, challenge=False)
        return self._refuse(REASON_BAD_CREDENTIALS, method, detail=verdict.reason)

    @property
    def tracked_sources(self) -> int:
        """How many source IPs have failure/challenge counters (bounded by ``cache_size``)."""
        return len(self._counters)

    def blocked_sources(self, now_s: float) -> list[str]:
        """IP addresses in the rejection cache now (sorted, IPv4 first), for the BPF filter."""
        for ip, until in list(self._blocked.items()):
            if until <= now_s:
                del self._blocked[ip]
                self.blocked_generation += 1
        return [str(ip) for ip in sorted(self._blocked, key=lambda a: (a.version, a))]

    def _refuse(self, reason: str, method: str, detail: str = "") -> AccessDecision:
        # ACK gets no response (RFC 3261 §17.2.1), so refusing it always means dropping it.
        if self.settings.unknown_response == "drop" or method == "ACK":
            return AccessDecision(AccessAction.DROP, reason, detail=detail)
        return AccessDecision(
            AccessAction.REJECT, reason, status=self.settings.reject_code, detail=detail
        )

    def _challenge(
        self, digest: DigestAuthenticator, now_s: float, *, stale: bool, reason: str
    ) -> AccessDecision:
        headers = tuple((CHALLENGE_HEADER, value) for value in digest.challenges(now_s, stale))
        return AccessDecision(
            AccessAction.CHALLENGE, reason, status=CHALLENGE_STATUS, headers=headers
        )

    def _count(self, ip: IPAddress, now_s: float, *, challenge: bool) -> None:
        """Count a failure (or an unanswered challenge); cache the source when over its limit."""
        settings = self.settings
        counters = self._counters.get(ip)
        if counters is None:
            counters = _SourceCounters(
                failures=deque(maxlen=settings.failure_limit),
                challenges=deque(maxlen=settings.challenge_limit),
            )
            self._counters[ip] = counters
            if len(self._counters) > settings.cache_size:
                self._counters.popitem(last=False)
                self.evictions += 1
        else:
            self._counters.move_to_end(ip)
        events = counters.challenges if challenge else counters.failures
        limit = settings.challenge_limit if challenge else settings.failure_limit
        horizon = now_s - settings.failure_window_s
        while events and events[0] <= horizon:
            events.popleft()
        events.append(now_s)
        if len(events) >= limit:
            del self._counters[ip]
            self._blocked[ip] = now_s + settings.block_s
            self._blocked.move_to_end(ip)
            self.blocked_generation += 1
            if len(self._blocked) > settings.cache_size:
                self._blocked.popitem(last=False)
                self.evictions += 1


def parse_source_ip(source: str) -> IPAddress | None:
    """The IP of an "ip:port" / "[v6]:port" source string, or None if it is not one.

    IPv4-mapped IPv6 addresses (``[::ffff:192.0.2.1]:5060``, what a dual-stack socket reports)
    become plain IPv4 so they match IPv4 allowlists and the IPv4 kernel filter.
    """
    if not isinstance(source, str) or len(source) > 64:
        return None
    if source.startswith("["):
        host, sep, port = source[1:].partition("]:")
        if not sep:
            return None
    else:
        host, sep, port = source.rpartition(":")
        if not sep or ":" in host:
            return None
    if not port.isascii() or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    # Brackets are for IPv6 literals only (RFC 3986 §3.2.2), and IPv6 needs them.
    if isinstance(ip, ipaddress.IPv6Address) != source.startswith("["):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def allowed_networks(settings: SipAccessSettings) -> Sequence[str]:
    """The IPv4 allowlist for :class:`trunk.sip.source_filter.SourceFilter`.

    ``["0.0.0.0/0"]`` when no allowlist is configured (digest-only: every IPv4 source may try).
    """
    if not settings.networks:
        return ["0.0.0.0/0"]
    return [str(net) for net in settings.networks if net.version == 4]
