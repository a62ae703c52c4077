"""SpendJournal: fsync'd records survive restarts, corrupt lines are skipped, replay is
idempotent; and a Redis SIGKILL in the middle of live calls loses no money."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.journal import (
    AdmitRecord,
    HeartbeatRecord,
    JournalRecord,
    SettleRecord,
    SpendJournal,
    UnconnectedSettleRecord,
    decode_record,
    encode_record,
)
from rutster.spend.limits import TenantLimits
from rutster.spend.store import (
    AdmitRequest,
    SettleResult,
    SpendStore,
    StoreUnavailable,
    redis_client,
    time_buckets,
)

#: 2025-12-01T12:00:00Z.
NOW = 1_764_590_400_000
DAY = time_buckets(NOW)[0]


def admit_request(call_id: str, **overrides: Any) -> AdmitRequest:
    values: dict[str, Any] = {
        "call_id": call_id,
        "tenant": "acme",
        "now_ms": NOW,
        "quantum": 10_000,
        "provider": "twilio",
        "direction": "inbound",
    }
    values.update(overrides)
    return AdmitRequest(**values)


@pytest.fixture(scope="module")
def journal_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("journal-redis")) as server:
        yield server


@pytest.fixture
async def store(journal_redis: EmbeddedRedis) -> AsyncIterator[SpendStore]:
    client = redis_client(journal_redis.url)
    yield SpendStore(client, f"jt{secrets.token_hex(4)}")
    await client.aclose()


async def ledger_entries(store: SpendStore) -> list[dict[str, str]]:
    raw = cast(list[tuple[str, dict[str, str]]], await store.redis.xrange(store.keys.ledger))
    return [{"id": entry_id, **fields} for entry_id, fields in raw]


async def day_totals(store: SpendStore) -> tuple[int, int]:
    raw = await store.redis.hmget(store.keys.day("acme", DAY), ["spent", "reserved"])
    return int(raw[0] or 0), int(raw[1] or 0)


# -- file format ------------------------------------------------------------------------


def test_records_round_trip_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state" / "spend.journal"  # the folder is created on first write
    records: list[JournalRecord] = [
        AdmitRecord(admit_request("call_a", caller="+15550001111", metadata={"k": "v"})),
        HeartbeatRecord("call_a", 1, NOW + 5_000, 1_200),
        SettleRecord("call_a", 2, 2_345, NOW + 9_000, "caller_hangup"),
        UnconnectedSettleRecord("call_b", NOW + 9_500, "no_media"),
    ]
    journal = SpendJournal(path)
    for record in records:
        journal.append(record)
    for record in records:
        assert decode_record(encode_record(record).rstrip(b"\n")) == record
    # A new instance (gateway restart) reads the same records back, in order.
    assert SpendJournal(path).pending() == records
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        b'{"v": 2, "op": "settle"}',
        b'{"v": 1, "op": "explode"}',
        b'{"v": 1, "op": "settle", "call_id": "c", "seq": 1, "actual": "5", "now_ms": 1,'
        b' "end_reason": "x"}',
        b'{"v": 1, "op": "settle", "call_id": "c", "seq": true, "actual": 5, "now_ms": 1,'
        b' "end_reason": "x"}',
        b'{"v": 1, "op": "heartbeat", "call_id": "c", "seq": 1, "now_ms": 1}',
        b'{"v": 1, "op": "admit", "call_id": "bad id", "tenant": "t", "now_ms": 1,'
        b' "quantum": 1, "provider": "p", "direction": "d"}',
        b'{"v": 1, "op": "heartbeat", "pad": "' + b"x" * 20_000 + b'"}',
    ],
)
def test_decode_rejects_corrupt_lines(line: bytes) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode_record(line)


async def test_corrupt_and_torn_lines_are_counted_and_kept_aside(
    tmp_path: Path, store: SpendStore
) -> None:
    path = tmp_path / "spend.journal"
    await store.admit(admit_request("call_a"))
    journal = SpendJournal(path)
    journal.append(HeartbeatRecord("call_a", 1, NOW + 1, 500))
    with path.open("ab") as f:
        f.write(b"garbage line\n")
        f.write(b'{"v":1,"op":"settle","call_id":"call_a","se')  # torn by a crash
    # The next append starts on a fresh line instead of gluing onto the torn one.
    journal.append(SettleRecord("call_a", 2, 700, NOW + 2, "hangup"))
    assert journal.corrupt_lines() == 2
    assert [type(r) for r in journal.pending()] == [HeartbeatRecord, SettleRecord]
    report = await journal.replay(store)
    assert (report.applied, report.superseded, report.corrupt, report.remaining) == (1, 1, 2, 0)
    assert path.read_bytes() == b""
    kept = journal.corrupt_path.read_bytes().splitlines()
    assert kept[0] == b"garbage line" and kept[1].startswith(b'{"v":1,"op":"settle"')
    assert await day_totals(store) == (700, 0)


# -- replay -----------------------------------------------------------------------------


async def test_replay_is_idempotent(tmp_path: Path, store: SpendStore) -> None:
    await store.admit(admit_request("call_a"))
    journal = SpendJournal(tmp_path / "j")
    await journal.record_heartbeat("call_a", 1, NOW + 1_000, 3_000)
    await journal.record_settle("call_a", 2, 4_000, NOW + 2_000, "hangup")
    first = await journal.replay(store)
    assert (first.applied, first.superseded, first.remaining) == (1, 1, 0)
    # The same records again (say the gateway crashed before compacting): no change.
    await journal.record_heartbeat("call_a", 1, NOW + 1_000, 3_000)
    await journal.record_settle("call_a", 2, 4_000, NOW + 2_000, "hangup")
    second = await journal.replay(store)
    assert (second.applied, second.replayed, second.superseded) == (0, 1, 1)
    assert await day_totals(store) == (4_000, 0)
    assert [e["type"] for e in await ledger_entries(store)] == ["reserve", "settle"]
    # A record for a call Redis never saw is counted, not fatal.
    await journal.record_settle("call_zz", 1, 0, NOW, "admit_unconfirmed")
    assert (await journal.replay(store)).unknown == 1
    assert journal.pending() == []


async def test_a_journalled_zero_settlement_never_zeroes_a_call_that_connected_since(
    tmp_path: Path, store: SpendStore
) -> None:
    # Node A's watcher gave up on two calls while Redis was away; meanwhile one of them
    # connected on node B. Replayed, only the other is settled at zero.
    await store.admit(admit_request("call_live"))
    await store.admit(admit_request("call_gone"))
    journal = SpendJournal(tmp_path / "j")
    await journal.record_unconnected_settle("call_live", NOW + 30_000, "no_media")
    await journal.record_unconnected_settle("call_gone", NOW + 30_000, "no_media")
    assert (await store.connect("call_live", "node-b", NOW + 20_000)).won
    report = await journal.replay(store)
    assert (report.applied, report.replayed, report.remaining) == (1, 1, 0)
    live, gone = await store.get_call("call_live"), await store.get_call("call_gone")
    assert live is not None and live["status"] == "active"
    assert gone is not None and (gone["status"], gone["end_reason"]) == ("ended", "no_media")


async def test_fail_open_admission_is_recorded_on_replay(tmp_path: Path, store: SpendStore) -> None:
    # While Redis was down the gateway let a call through (fail-open); by the time the
    # journal is replayed the kill switch is engaged: the call happened, so it is recorded.
    journal = SpendJournal(tmp_path / "j")
    await journal.record_admit(admit_request("call_a", quantum=20_000))
    await journal.record_settle("call_a", 1, 15_000, NOW + 30_000, "caller_hangup")
    await store.set_kill_switch(True)
    report = await journal.replay(store)
    assert (report.applied, report.remaining) == (2, 0)
    assert await day_totals(store) == (15_000, 0)
    ledger = await ledger_entries(store)
    assert [(e["type"], e["reason"]) for e in ledger] == [
        ("reserve", "forced"),
        ("settle", "caller_hangup"),
    ]


async def test_replay_keeps_what_redis_did_not_take(tmp_path: Path) -> None:
    journal = SpendJournal(tmp_path / "j")
    await journal.record_settle("call_a", 1, 10, NOW, "hangup")
    await journal.record_settle("call_b", 1, 20, NOW, "hangup")
    client = redis_client(EmbeddedRedis(tmp_path / "down").url)  # nothing listening
    report = await journal.replay(SpendStore(client, "down"))
    await client.aclose()
    assert (report.applied, report.remaining) == (0, 2)
    assert [r.call_id for r in journal.pending() if isinstance(r, SettleRecord)] == [
        "call_a",
        "call_b",
    ]


class AppendingStore(SpendStore):
    """A store whose first settle lets another record land in the journal meanwhile."""

    journal: SpendJournal | None = None

    async def settle(
        self,
        call_id: str,
        seq: int,
        actual: int,
        now_ms: int,
        end_reason: str,
        *,
        unconnected_only: bool = False,
    ) -> SettleResult:
        if self.journal is not None:
            journal, self.journal = self.journal, None
            await journal.record_settle("call_late", 1, 99, NOW, "hangup")
        return await super().settle(
            call_id, seq, actual, now_ms, end_reason, unconnected_only=unconnected_only
        )


async def test_records_appended_during_a_replay_are_kept(
    tmp_path: Path, journal_redis: EmbeddedRedis
) -> None:
    client = redis_client(journal_redis.url)
    store = AppendingStore(client, f"jt{secrets.token_hex(4)}")
    journal = SpendJournal(tmp_path / "j")
    store.journal = journal
    await store.admit(admit_request("call_a"))
    await journal.record_settle("call_a", 1, 5, NOW + 1, "hangup")
    report = await journal.replay(store)
    await client.aclose()
    assert report.applied == 1
    assert journal.pending() == [SettleRecord("call_late", 1, 99, NOW, "hangup")]


# -- the crash test ---------------------------------------------------------------------

CALLS = 60
CONCURRENT = 12
KILL_AFTER_S = 0.25
OUTAGE_S = 0.4


async def test_redis_sigkill_mid_run_loses_nothing(tmp_path: Path) -> None:
    """Live calls while Redis is SIGKILLed and restarted: settlements that cannot reach
    it go to the journal; after a gateway restart and a replay the ledger balances to
    the micro-unit against what the calls really cost."""
    rng = random.Random(5)
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    client = redis_client(server.url)
    store = SpendStore(client, "crash")
    journal_path = tmp_path / "spend.journal"
    journal = SpendJournal(journal_path)
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=CONCURRENT))
    truth: dict[str, int] = {}  # call id -> what the call really cost (0 if never ran)
    journaled = {"settle": 0, "heartbeat": 0, "admit_unconfirmed": 0}
    slots = asyncio.Semaphore(CONCURRENT)
    restarted = asyncio.Event()
    admitted_after_restart = 0

    async def call(index: int) -> None:
        nonlocal admitted_after_restart
        call_id = f"call_{index:03d}"
        await asyncio.sleep(index * 0.012)
        async with slots:
            now = NOW + index
            quantum = rng.randint(5_000, 30_000)
            try:
                admitted = await store.admit(admit_request(call_id, now_ms=now, quantum=quantum))
            except StoreUnavailable:
                # Fail closed; the admit may still have landed: release it via the journal.
                truth[call_id] = 0
                await journal.record_settle(call_id, 1, 0, now, "admit_unconfirmed")
                journaled["admit_unconfirmed"] += 1
                return
            if not admitted.admitted:
                return
            admitted_after_restart += restarted.is_set()
            reserved, cost, seq = quantum, 0, 0
            for step in range(rng.randint(2, 6)):
                await asyncio.sleep(rng.uniform(0.005, 0.02))
                seq += 1
                cost = min(reserved, cost + rng.randint(0, 6_000))
                try:
                    if step % 2:
                        ext = await store.extend(call_id, seq, 8_000, now + seq, cost)
                        reserved = ext.reserved_total
                    else:
                        await store.heartbeat(call_id, seq, now + seq, cost)
                except StoreUnavailable:
                    if step % 2 == 0:
                        await journal.record_heartbeat(call_id, seq, now + seq, cost)
                        journaled["heartbeat"] += 1
                    # A failed extension is a refused one: the call lives on what it has.
            seq += 1
            truth[call_id] = cost
            try:
                await store.settle(call_id, seq, cost, now + seq, "hangup")
            except StoreUnavailable:
                await journal.record_settle(call_id, seq, cost, now + seq, "hangup")
                journaled["settle"] += 1

    async def crash_redis() -> None:
        await asyncio.sleep(KILL_AFTER_S)
        server.kill()  # SIGKILL: no shutdown, no final flush
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(server.start)
        restarted.set()

    try:
        await asyncio.gather(crash_redis(), *(call(i) for i in range(CALLS)))
        assert journaled["settle"] > 0, journaled  # the outage really hit settlements
        assert admitted_after_restart > 0  # and the same client recovered by itself

        # The gateway restarts: a fresh journal object reads the file back and replays.
        with journal_path.open("ab") as f:
            f.write(b'{"v":1,"op":"sett')  # and it had crashed mid-write
        after_restart = SpendJournal(journal_path)
        assert len(after_restart.pending()) == sum(journaled.values())
        report = await after_restart.replay(store)
        assert (report.remaining, report.corrupt) == (0, 1)
        assert after_restart.pending() == []

        spent, reserved = await day_totals(store)
        ledger = await ledger_entries(store)
        settled = sum(int(e["amount"]) for e in ledger if e["type"] == "settle")
        assert spent == settled == sum(truth.values())
        assert reserved == 0
        assert {e["type"] for e in ledger} <= {"reserve", "extend", "settle", "refuse"}
        assert await client.zcard(store.keys.active) == 0
        reserved_calls = {e["call"] for e in ledger if e["type"] == "reserve"}
        settled_calls = [e["call"] for e in ledger if e["type"] == "settle"]
        assert sorted(settled_calls) == sorted(reserved_calls)  # each exactly once
        for call_id in reserved_calls:
            record = await store.get_call(call_id)
            assert record is not None and record["status"] == "ended"
            assert record["spent"] == truth[call_id]
    finally:
        await client.aclose()
        server.stop()
