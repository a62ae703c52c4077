"""A local, fsync'd journal of spend operations that could not reach Redis.

When Redis is unavailable the gate cannot reserve money (no extension is ever journaled:
no money is reserved without Redis), but what already happened must not be lost:

- ``settle``: a call ended and its actual cost must reach the ledger;
- ``heartbeat``: the running cost of a call (so a reaper settles it at no less);
- ``admit``: a call the gateway let through under a fail-open policy (replayed with
  ``force``, i.e. recorded without checks: the call happened).

Records are JSON lines, appended and fsync'd one by one, so they survive a crash of the
gateway as well as of Redis. :meth:`SpendJournal.replay` applies them in order through
:class:`spend.store.SpendStore` (every store operation is idempotent, so a record applied
twice, e.g. after a crash in the middle of a replay, changes nothing the second time)
and compacts the file down to what is still unapplied. Corrupt lines (a torn write at a
crash, a bad edit) are counted, moved to ``<path>.corrupt`` and skipped, never fatal.

Tip for the gate: when an ``admit`` fails with StoreUnavailable the gateway cannot know
whether Redis applied it before the connection broke. Journal ``settle(call_id, seq=1,
actual=0, end_reason="admit_unconfirmed")`` for it: if the admission did land, the replay
releases its reservation; if not, the record is a counted no-op (``unknown``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Final

from rutster.spend.store import AdmitRequest, SpendStore, StoreUnavailable

log = logging.getLogger(__name__)

#: Record format version written in every line ("v").
JOURNAL_VERSION: Final = 1
#: Longest line read back; anything longer is corrupt. Seed decision: the largest
#: legitimate record (an admit with 2 KB metadata and 2 KB URLs) is under 8 KB.
MAX_LINE_BYTES = 16_384


@dataclass(frozen=True, slots=True)
class SettleRecord:
    """A settlement that could not reach Redis."""

    call_id: str
    seq: int
    actual: int
    now_ms: int
    end_reason: str


@dataclass(frozen=True, slots=True)
class UnconnectedSettleRecord:
    """A call that never connected, to settle at zero only if it still has not
    (``SpendStore.settle`` with ``unconnected_only``): replayed late, it must not zero a
    call whose media started on another node while Redis was away."""

    call_id: str
    now_ms: int
    end_reason: str


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    """A running-cost report that could not reach Redis."""

    call_id: str
    seq: int
    now_ms: int
    cost: int


@dataclass(frozen=True, slots=True)
class AdmitRecord:
    """An admission allowed without Redis (fail-open); replayed with ``force``."""

    request: AdmitRequest


JournalRecord = SettleRecord | UnconnectedSettleRecord | HeartbeatRecord | AdmitRecord
#: The records with flat fields (str and int only), by their ``op``.
FlatRecord = SettleRecord | UnconnectedSettleRecord | HeartbeatRecord


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What one replay did.

    - ``applied``: records that changed Redis;
    - ``replayed``: records Redis already had (idempotent no-ops);
    - ``superseded``: heartbeats skipped because a later record for the same call follows;
    - ``unknown``: records for a call Redis does not know (or a conflicting admit);
    - ``corrupt``: unreadable lines, moved to ``<path>.corrupt``;
    - ``remaining``: records still pending (Redis became unavailable again mid-replay).
    """

    applied: int = 0
    replayed: int = 0
    superseded: int = 0
    unknown: int = 0
    corrupt: int = 0
    remaining: int = 0


_RECORD_TYPES: Final[dict[str, type[FlatRecord]]] = {
    "settle": SettleRecord,
    "settle_unconnected": UnconnectedSettleRecord,
    "heartbeat": HeartbeatRecord,
}
_RECORD_OPS: Final = {kind: op for op, kind in _RECORD_TYPES.items()}
_ADMIT_FIELDS: Final = tuple(f.name for f in fields(AdmitRequest))


def encode_record(record: JournalRecord) -> bytes:
    """One JSON line (with the trailing newline)."""
    body: dict[str, object]
    if isinstance(record, AdmitRecord):
        body = {name: getattr(record.request, name) for name in _ADMIT_FIELDS}
        body["metadata"] = dict(record.request.metadata)
        op = "admit"
    else:
        body = {f.name: getattr(record, f.name) for f in fields(record)}
        op = _RECORD_OPS[type(record)]
    line = json.dumps({"v": JOURNAL_VERSION, "op": op, **body}, separators=(",", ":"))
    return line.encode() + b"\n"


def decode_record(line: bytes) -> JournalRecord:
    """Parse one line; ValueError (or TypeError) if it is not a valid record."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError("line too long")
    data = json.loads(line)
    if not isinstance(data, dict) or data.get("v") != JOURNAL_VERSION:
        raise ValueError("not a journal record of this version")
    op = data.pop("op", None)
    data.pop("v")
    if op == "admit":
        # AdmitRequest validates every field (types, patterns, sizes).
        return AdmitRecord(AdmitRequest(**data))
    kind = _RECORD_TYPES.get(op) if isinstance(op, str) else None
    if kind is None:
        raise ValueError(f"unknown op {str(op)[:32]!r}")
    expected = {f.name: f.type for f in fields(kind)}
    if set(data) != set(expected):
        raise ValueError(f"{op} record has fields {sorted(data)}")
    for name, type_name in expected.items():
        value = data[name]
        wanted: type = str if type_name == "str" else int
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise ValueError(f"{op}.{name} must be {type_name}")
    record: FlatRecord = kind(**data)
    return record


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpendJournal:
    """The append-only journal file at ``path`` (created on first write); one file per
    gateway process.

    Appends are serialized by a lock and fsync'd before they return; the async
    ``record_*`` methods do the blocking write in a worker thread so the event loop
    (which paces audio) never waits on the disk. A disk error raises OSError.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.corrupt_path = self.path.with_name(self.path.name + ".corrupt")
        # Appends come from worker threads; a replay from the event loop.
        self._lock = threading.Lock()
        self._replay_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"SpendJournal({str(self.path)!r})"

    # -- writing ----------------------------------------------------------------------

    def append(self, record: JournalRecord) -> None:
        """Append one record and fsync it (blocking)."""
        line = encode_record(record)
        with self._lock:
            self._append_locked(line)

    def _append_locked(self, data: bytes) -> None:
        created = not self.path.exists()
        if created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            # A crash mid-write can leave a torn last line: start on a fresh line so the
            # torn one stays a single corrupt line instead of swallowing this record.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self.path.parent)

    async def record(self, record: JournalRecord) -> None:
        """Append one record without blocking the event loop."""
        await asyncio.to_thread(self.append, record)

    async def record_settle(
        self, call_id: str, seq: int, actual: int, now_ms: int, end_reason: str
    ) -> None:
        """Journal a settlement (same arguments as :meth:`SpendStore.settle`)."""
        await self.record(SettleRecord(call_id, seq, actual, now_ms, end_reason))

    async def record_unconnected_settle(self, call_id: str, now_ms: int, end_reason: str) -> None:
        """Journal a zero settlement of a call that never connected (replayed with
        ``unconnected_only``)."""
        await self.record(UnconnectedSettleRecord(call_id, now_ms, end_reason))

    async def record_heartbeat(self, call_id: str, seq: int, now_ms: int, cost: int) -> None:
        """Journal a running-cost report (same arguments as :meth:`SpendStore.heartbeat`)."""
        await self.record(HeartbeatRecord(call_id, seq, now_ms, cost))

    async def record_admit(self, request: AdmitRequest) -> None:
        """Journal an admission made without Redis (fail-open); replayed with force."""
        await self.record(AdmitRecord(request))

    # -- reading ----------------------------------------------------------------------

    def _read_locked(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""

    @staticmethod
    def _parse(data: bytes) -> tuple[list[tuple[JournalRecord, bytes]], list[bytes]]:
        records: list[tuple[JournalRecord, bytes]] = []
        corrupt: list[bytes] = []
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                records.append((decode_record(raw), raw))
            except (ValueError, TypeError):
                corrupt.append(raw)
        return records, corrupt

    def pending(self) -> list[JournalRecord]:
        """The records not yet replayed, in order (corrupt lines skipped)."""
        with self._lock:
            data = self._read_locked()
        records, _ = self._parse(data)
        return [record for record, _ in records]

    def corrupt_lines(self) -> int:
        """How many unreadable lines the journal currently holds."""
        with self._lock:
            data = self._read_locked()
        return len(self._parse(data)[1])

    # -- replay -----------------------------------------------------------------------

    async def replay(self, store: SpendStore) -> ReplayReport:
        """Apply the pending records in order, then keep only what is still unapplied.

        Stops at the first StoreUnavailable (the rest stays for the next replay). Run it
        at startup and whenever Redis comes back, before new operations for the same
        calls where possible (a stale record is a harmless no-op either way).
        """
        async with self._replay_lock:
            return await self._replay(store)

    def _snapshot(self) -> bytes:
        with self._lock:
            return self._read_locked()

    def _compact(self, replayed_bytes: int, unapplied: list[bytes], corrupt: list[bytes]) -> None:
        with self._lock:
            # Records appended while the replay ran are kept after the unapplied ones.
            tail = self._read_locked()[replayed_bytes:]
            if corrupt:
                self._keep_corrupt(corrupt)
            self._rewrite_locked(b"".join(line + b"\n" for line in unapplied) + tail)

    async def _replay(self, store: SpendStore) -> ReplayReport:
        # File work (reads, fsync'd rewrite) runs in a worker thread, off the event loop.
        data = await asyncio.to_thread(self._snapshot)
        records, corrupt = self._parse(data)
        counts = {"applied": 0, "replayed": 0, "superseded": 0, "unknown": 0}
        # Heartbeats only matter as the latest word on a call: skip any followed by
        # another record for the same call.
        last_index = {_call_of(record): i for i, (record, _) in enumerate(records)}
        unapplied: list[bytes] = []
        for i, (record, raw) in enumerate(records):
            if unapplied:
                unapplied.append(raw)
                continue
            if isinstance(record, HeartbeatRecord) and last_index[record.call_id] != i:
                counts["superseded"] += 1
                continue
            try:
                outcome = await _apply(store, record)
            except StoreUnavailable:
                unapplied.append(raw)
                continue
            except ValueError:
                corrupt.append(raw)  # store-side validation: not applicable, keep evidence
                continue
            counts[outcome] += 1
        await asyncio.to_thread(self._compact, len(data), unapplied, corrupt)
        report = ReplayReport(corrupt=len(corrupt), remaining=len(unapplied), **counts)
        if corrupt or counts["unknown"]:
            log.warning("spend journal replay: %s", report)
        return report

    def _keep_corrupt(self, lines: list[bytes]) -> None:
        fd = os.open(self.corrupt_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"".join(line + b"\n" for line in lines))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _rewrite_locked(self, data: bytes) -> None:
        # Write-then-rename: a crash leaves either the old journal or the new one.
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)


def _call_of(record: JournalRecord) -> str:
    return record.request.call_id if isinstance(record, AdmitRecord) else record.call_id


async def _apply(store: SpendStore, record: JournalRecord) -> str:
    """Apply one record; returns which ReplayReport counter it belongs to."""
    if isinstance(record, SettleRecord):
        settled = await store.settle(
            record.call_id, record.seq, record.actual, record.now_ms, record.end_reason
        )
        if settled.status in ("settled", "adjusted"):
            return "applied"
        return "replayed" if settled.status == "replayed" else "unknown"
    if isinstance(record, UnconnectedSettleRecord):
        settled = await store.settle(
            record.call_id, 1, 0, record.now_ms, record.end_reason, unconnected_only=True
        )
        if settled.status == "settled":
            return "applied"
        # "connected": its media started meanwhile; the live call settles itself.
        return "replayed" if settled.status in ("replayed", "connected") else "unknown"
    if isinstance(record, HeartbeatRecord):
        beat = await store.heartbeat(record.call_id, record.seq, record.now_ms, record.cost)
        if beat.applied:
            return "applied"
        return "unknown" if beat.status == "unknown_call" else "replayed"
    admitted = await store.admit(replace(record.request, force=True))
    if admitted.admitted:
        return "replayed" if admitted.replayed else "applied"
    return "unknown"
