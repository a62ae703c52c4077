"""One stream token, one media socket: the claim a verified token must win before a call runs.

A stream token (base/stream_token.py) proves which call, brain and
admission a media socket is for, until it expires; on its own it could be
presented again, by a second socket, to this gateway or to any other one. So
the first socket whose token verifies *claims* the call, in the Redis the
spend store uses (same client, same key prefix ``P``)::

    SET P:stream_claim:<call_id> <node id> NX PX <token's remaining lifetime + margin>

``NX`` makes the claim atomic across every node on that Redis: exactly one
socket wins, the others are refused as replays. The key outlives the token
(``CLAIM_CLOCK_SKEW_MARGIN_MS``), so no node whose clock runs a little behind
sees the token still valid after the key is gone, and then it expires by itself.

If Redis cannot be reached at claim time the claim falls back to a set kept in
this process (bounded, each entry forgotten when its token has expired): a
replay to this node is still refused, one to another node is not until Redis is
back (the call record check in gateway/media_socket.py is the next line). Claims
that Redis took are remembered locally as well, so same-node replays are refused
even if Redis goes away later.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from rutster.spend.redis_url import REDIS_UNAVAILABLE_ERRORS

if TYPE_CHECKING:
    from rutster.spend.store import SpendStore

log = logging.getLogger(__name__)

#: Any failure of the claim's one SET: an error reply, or Redis (or a Cluster's slot) away.
_CLAIM_FAILURES: tuple[type[BaseException], ...] = (
    redis_errors.RedisError,
    *REDIS_UNAVAILABLE_ERRORS,
)

#: Key part after the store's prefix: ``P:stream_claim:<call_id>``.
CLAIM_KEY_PART = "stream_claim"
#: Extra life of a claim past its token's expiry, ms. Tokens expire by each verifying
#: node's wall clock; NTP keeps hosts within tens of milliseconds (spend/store.py already
#: requires synced clocks), 5 s also covers a host that drifted badly. Seed decision: it
#: only keeps a ~50-byte key 5 s longer.
CLAIM_CLOCK_SKEW_MARGIN_MS = 5_000
#: Local fallback claims kept at most. An entry lives one token lifetime (60 s) plus the
#: margin; a gateway process runs ~20 calls per core (README, capacity), so even a
#: process starting 150 streams a second for a whole minute fits. Seed decision, ~2 MB.
MAX_LOCAL_CLAIMS = 10_000


class ClaimOutcome(enum.Enum):
    """What claiming a call's stream found."""

    #: First use, recorded in Redis: no node will admit the token again.
    CLAIMED = "claimed"
    #: First use on this node; Redis was unreachable, so only this node knows.
    CLAIMED_LOCALLY = "claimed_locally"
    #: A socket with this token was admitted before (here, or on a node sharing Redis).
    ALREADY_USED = "already_used"


class StreamClaims:
    """Claims of calls' stream tokens: Redis first, a bounded node-local set as fallback.

    ``clock`` (monotonic seconds) and ``wall_ms`` (unix milliseconds) are injectable
    for tests; the Redis TTL is computed from the wall clock, as token expiry is.
    """

    def __init__(
        self,
        *,
        max_local: int = MAX_LOCAL_CLAIMS,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        if max_local < 1:
            raise ValueError("max_local must be at least 1")
        self._max_local = max_local
        self._clock = clock
        self._wall_ms = wall_ms
        #: call id -> monotonic deadline (s) after which the entry is forgotten.
        self._local: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        """Local claims currently held (expired ones are dropped lazily)."""
        return len(self._local)

    @staticmethod
    def key(prefix: str, call_id: str) -> str:
        """The Redis key of ``call_id``'s claim under the store prefix ``prefix``."""
        return f"{prefix}:{CLAIM_KEY_PART}:{call_id}"

    async def claim(
        self, store: SpendStore | None, call_id: str, node: str, expires_at_s: int
    ) -> ClaimOutcome:
        """Claim ``call_id``'s stream for ``node``, for as long as its token (expiring at
        unix second ``expires_at_s``) could still be presented.

        ``store`` None (no Redis configured) claims locally only.
        """
        ttl_ms = max(1, expires_at_s * 1000 - self._wall_ms()) + CLAIM_CLOCK_SKEW_MARGIN_MS
        now = self._clock()
        self._forget_expired(now)
        deadline = self._local.get(call_id)
        if deadline is not None and deadline > now:
            return ClaimOutcome.ALREADY_USED
        # Taken locally before awaiting Redis: two sockets racing on this node are decided
        # here even if Redis then fails for both.
        self._remember(call_id, now + ttl_ms / 1000.0)
        if store is None:
            return ClaimOutcome.CLAIMED_LOCALLY
        try:
            won = await store.redis.set(
                self.key(store.keys.prefix, call_id), node, nx=True, px=ttl_ms
            )
        except _CLAIM_FAILURES as exc:
            # Any failure of this one SET means Redis did not record the claim: fall back.
            log.warning(
                "call %s: Redis unreachable when claiming its stream token (%s); claimed on "
                "this node only, a replay to another node is not refused until Redis is back",
                call_id,
                type(exc).__name__,
            )
            return ClaimOutcome.CLAIMED_LOCALLY
        # The local entry stays either way: a refused replay's token is used too.
        return ClaimOutcome.CLAIMED if won else ClaimOutcome.ALREADY_USED

    def _remember(self, call_id: str, deadline: float) -> None:
        self._local[call_id] = deadline
        self._local.move_to_end(call_id)
        while len(self._local) > self._max_local:
            self._local.popitem(last=False)

    def _forget_expired(self, now: float) -> None:
        # Entries come in roughly deadline order (each lives what is left of a 60 s token
        # plus the margin), so scanning stops at the first live one: an expired entry
        # behind it waits for a later pass, lookups check deadlines, the bound caps size.
        while self._local:
            call_id, deadline = next(iter(self._local.items()))
            if deadline > now:
                break
            del self._local[call_id]
