"""The write-ahead log and the roller: framing, torn tails, group commit, crash-safe rolling."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from collector.admission import dropped_record
from collector.messages import Tenant, stamp
from collector.roller import recover, roll_segment
from collector.wal import (
    WalUnavailable,
    WriteAheadLog,
    encode_frames,
    frame,
    list_segments,
    read_records,
    segment_seq,
    write_frames,
)
from mallard.paths import DataPaths
from mallard.regulations import RegulationStore

TENANT = Tenant("c", "a", "A")


def stored(n: int) -> bytes:
    msg = stamp(
        "track",
        {"userId": f"u{n}", "event": "E"},
        TENANT,
        channel="server",
        source="http",
        received=datetime(2026, 3, 1, 12, tzinfo=UTC),
        request_ip=None,
    )
    return msgspec.json.encode(msg)


def test_torn_tail_is_dropped(tmp_path: Path) -> None:
    seg = tmp_path / "0000000000000001.wal"
    good = [stored(i) for i in range(3)]
    data = b"".join(frame(p) for p in good)
    seg.write_bytes(data + frame(stored(9))[:-5])  # crash mid-write of the 4th record
    assert list(read_records(seg)) == good
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF  # a flipped byte in the last record fails its CRC
    seg.write_bytes(bytes(corrupt))
    assert list(read_records(seg)) == good[:2]


@pytest.mark.parametrize("short", [False, True])
def test_write_frames_frames_each_payload_of_a_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short: bool
) -> None:
    # More records than one writev takes; payloads laid end to end as in an Arrow array.
    payloads = [stored(i) for i in range(1500)] + [b""]
    data = b"".join(payloads)
    offsets = [0]
    for p in payloads:
        offsets.append(offsets[-1] + len(p))
    if short:  # the kernel may write less than asked: the rest must follow, in order
        monkeypatch.setattr(os, "writev", lambda fd, parts: os.write(fd, b"".join(parts)[:999]))
    seg = tmp_path / "0000000000000001.sealed"
    fd = os.open(seg, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_frames(fd, data, offsets)
    finally:
        os.close(fd)
    assert seg.read_bytes() == b"".join(frame(p) for p in payloads)
    assert list(read_records(seg)) == payloads


def test_group_commit_acknowledges_after_write(tmp_path: Path) -> None:
    sealed: list[Path] = []
    wal = WriteAheadLog(
        tmp_path / "wal", roll_interval_s=60, roll_max_bytes=1 << 30, on_seal=sealed.append
    )
    wal.start(1)
    futures = [wal.append([stored(i)]) for i in range(200)]
    for f in futures:
        f.result(timeout=10)
    assert wal.records_written == 200
    assert wal.fsyncs < 200  # concurrent appends shared fsyncs
    # The other segment is the spare the sealer opened ahead: no records.
    (seg,) = [s for s in list_segments(tmp_path / "wal") if any(read_records(s))]
    assert len(list(read_records(seg))) == 200
    wal.close()
    assert sealed and sealed[0].suffix == ".sealed"
    with pytest.raises(WalUnavailable):
        wal.append([stored(1)]).result(timeout=5)


def test_segments_roll_by_time_and_the_writer_idles(tmp_path: Path) -> None:
    sealed: list[Path] = []
    wal = WriteAheadLog(
        tmp_path / "wal", roll_interval_s=0.1, roll_max_bytes=1 << 30, on_seal=sealed.append
    )
    wal.start(1)
    wal.append([stored(1)]).result(timeout=5)
    deadline = time.monotonic() + 5
    while not sealed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(sealed) == 1
    # After a roll the writer must sleep, not spin (a regression once burned a whole core). The
    # writer thread's own CPU clock: blocked on its condition it uses none, however slow the
    # host, while a spinning one uses whatever share of the window the scheduler gives it.
    assert wal._thread is not None and wal._thread.ident is not None
    clock = time.pthread_getcpuclockid(wal._thread.ident)
    cpu, wall = time.clock_gettime(clock), time.monotonic()
    time.sleep(0.5)  # the window watched, not a wait for anything
    used, window = time.clock_gettime(clock) - cpu, time.monotonic() - wall
    print(f"the idle writer thread used {used * 1000:.1f} ms of CPU in {window:.2f} s")
    assert used < 0.02 * window, (used, window)
    wal.close()


def test_write_failure_refuses_new_appends(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal", roll_interval_s=60, roll_max_bytes=1 << 30)
    wal.start(1)
    wal.append([stored(1)]).result(timeout=5)
    # The log's file fails under it, as a full or broken disk would. (Closing the descriptor
    # let the sealer's next spare segment take its number and the write succeed.)
    broken = os.open(os.devnull, os.O_RDONLY)
    os.dup2(broken, wal._fd)
    os.close(broken)
    with pytest.raises(WalUnavailable):
        wal.append([stored(2)]).result(timeout=5)
    assert not wal.healthy
    with pytest.raises(WalUnavailable):
        wal.append([stored(3)]).result(timeout=5)
    os.close(wal._fd)
    wal._fd = -1
    wal.close()


RECOVERED = (".wal", ".sealed", ".next")  # what recovery lands (list_segments)


def _has_records(path: Path) -> bool:
    try:
        return any(read_records(path))
    except FileNotFoundError:  # sealed meanwhile: it held records
        return True


def test_rolls_leave_the_writer_thread_and_acks_stay_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll costs the acknowledging thread no directory fsync: the sealer opens the next
    segment ahead and seals the last. Every ack still follows the directory fsync that made its
    segment's file durable under a name recovery reads (the spare's `.next`; the writer's rename
    to `.wal` needs none), segments are sealed in order with every record once, and closing
    leaves no spare behind."""
    from collector import wal as wal_module

    wal_dir = tmp_path / "wal"
    synced: set[int] = set()  # inodes of segments durable in the directory so far
    threads: list[str] = []
    real_fsync_dir = wal_module.fsync_dir

    def fsync_dir(path: Path) -> None:
        files = {e.inode() for e in os.scandir(path) if e.name.endswith(RECOVERED)}
        real_fsync_dir(path)
        synced.update(files)
        threads.append(threading.current_thread().name)

    monkeypatch.setattr(wal_module, "fsync_dir", fsync_dir)
    sealed: list[Path] = []
    wal = WriteAheadLog(
        wal_dir, roll_interval_s=0.03, roll_max_bytes=1 << 30, on_seal=sealed.append
    )
    wal.start(1)
    n, deadline = 0, time.monotonic() + 0.6
    while time.monotonic() < deadline or len(sealed) < 3:
        wal.append([stored(n)]).result(timeout=5)
        n += 1
        # What holds the acknowledged record is in the directory for good (only a spare being
        # opened may be new, and it holds no record).
        written = {
            e.inode()
            for e in os.scandir(wal_dir)
            if e.name.endswith(".wal") and _has_records(Path(e.path))
        }
        assert written <= synced, (written, synced)
    wal.close()

    assert len(sealed) >= 3
    assert "wal-writer" not in threads
    assert [p.name for p in sealed] == sorted(p.name for p in sealed)
    users = [msgspec.json.decode(r)["userId"] for p in sealed for r in read_records(p)]
    assert users == [f"u{i}" for i in range(n)]
    assert sorted(wal_dir.iterdir()) == sorted(sealed)  # the spare is gone


def test_a_segment_is_named_when_it_begins_to_take_records(tmp_path: Path) -> None:
    """A spare is `<n>.next` until the writer takes it and names it `<ms>.wal`: an idle log
    holds no `.wal` a Delete would wait for (purge.wait_for_logs waits for the segments begun
    before a suppression), and a segment's name is not older than its first record. Recovery
    lands a `.next` too: after a crash the writer's rename may not be on disk."""
    wal_dir = tmp_path / "wal"
    wal = WriteAheadLog(wal_dir, roll_interval_s=0.05, roll_max_bytes=1 << 30)
    wal.start(1)
    deadline = time.monotonic() + 5
    while wal._spare is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    before_ms = time.time_ns() // 1_000_000
    wal.append([stored(1)]).result(timeout=5)
    (seg,) = [p for p in wal_dir.iterdir() if p.suffix == ".wal"]
    assert segment_seq(seg) >= before_ms
    while seg.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(p.suffix for p in wal_dir.iterdir()) == [".next", ".sealed"]
    wal.close()

    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "0000000000000009.next").write_bytes(frame(stored(7)) + b"\xff" * 100)
    assert recover(crashed, DataPaths(tmp_path), "c0") == 10
    (landed,) = (tmp_path / "landing").rglob("*.parquet")
    assert pq.read_table(landed).column("user_id").to_pylist() == ["u7"]
    assert not list(crashed.iterdir())


def test_segments_written_in_advance_recover_and_seal_without_their_room(
    tmp_path: Path,
) -> None:
    """The sealer writes a spare's room (0xff filler) before the writer uses it, so O_DSYNC
    writes overwrite existing blocks. A crash leaves the filler after the last record: recovery
    lands exactly the acknowledged records, also after a torn one; a sealed segment keeps no
    filler; a segment that outgrows its room grows."""
    wal_dir = tmp_path / "wal"
    sealed: list[Path] = []
    # roll_max_bytes bounds the room: 64 KiB holds ~200 of these records.
    wal = WriteAheadLog(wal_dir, roll_interval_s=60, roll_max_bytes=64 << 10, on_seal=sealed.append)
    wal.start(1)
    wal.append([stored(0)]).result(timeout=5)
    deadline = time.monotonic() + 5
    while wal._spare is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for n in range(1, 600):
        wal.append([stored(n)]).result(timeout=5)
    assert len(sealed) >= 2  # rolled by size, past their room
    (open_seg,) = [s for s in list_segments(wal_dir) if s.suffix == ".wal" and any(read_records(s))]
    in_open = list(read_records(open_seg))
    acked = [r for s in (*sealed, open_seg) for r in read_records(s)]
    assert [msgspec.json.decode(r)["userId"] for r in acked] == [f"u{i}" for i in range(600)]

    # As after a kill: the open segment with its filler, a torn frame written into it.
    data = bytearray(open_seg.read_bytes())
    used = sum(8 + len(r) for r in in_open)
    assert used < len(data) and data[used:] == b"\xff" * (len(data) - used)
    torn = frame(stored(999))
    data[used : used + len(torn) - 5] = torn[:-5]
    wal.close()
    assert sealed[-1].name == open_seg.with_suffix(".sealed").name
    for s in sealed:  # no filler kept: the frames end to end
        assert s.stat().st_size == sum(8 + len(r) for r in read_records(s))
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / open_seg.name).write_bytes(bytes(data))
    recover(crashed, DataPaths(tmp_path), "c0")
    (landed,) = (tmp_path / "landing").rglob("*.parquet")
    users = pq.read_table(landed).column("user_id").to_pylist()
    assert users == [msgspec.json.decode(r)["userId"] for r in in_open]
    assert not list(crashed.iterdir())


def test_roll_is_idempotent_across_a_crash(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    seg = wal_dir / "0000000000000007.sealed"
    records = [stored(i) for i in range(5)]
    seg.write_bytes(b"".join(frame(r) for r in records))
    copy = seg.read_bytes()
    (landed,) = roll_segment(seg, paths, "c0")
    assert not seg.exists()
    assert landed.name == "c0-0000000000000007.parquet"
    assert landed.parent.name == "date=2026-03-01"
    # A crash after the rename but before the segment was deleted: recovery rolls it again.
    seg.write_bytes(copy)
    assert recover(wal_dir, paths, "c0") == 8
    files = list((tmp_path / "landing").rglob("*.parquet"))
    assert files == [landed]
    table = pq.read_table(landed)
    assert table.num_rows == 5
    assert table.column("user_id").to_pylist() == [f"u{i}" for i in range(5)]
    assert not list(wal_dir.iterdir())


def test_concurrent_appends_from_threads(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal", roll_interval_s=60, roll_max_bytes=1 << 30)
    wal.start(1)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(50):
                wal.append([stored(k * 1000 + i)]).result(timeout=10)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    wal.close()
    total = sum(len(list(read_records(s))) for s in list_segments(tmp_path / "wal"))
    assert total == 400


def test_recovery_lands_an_unsealed_segment_with_a_torn_tail(tmp_path: Path) -> None:
    """A server killed mid-write leaves its open `.wal` segment with a torn last frame (never
    acknowledged: its fsync did not complete). The next start lands every whole record once, sealed
    segments and unsealed alike, drops the torn one, and continues after the highest sequence."""
    paths = DataPaths(tmp_path)
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    sealed = [stored(i) for i in range(2)]
    (wal_dir / "0000000000000003.sealed").write_bytes(b"".join(frame(r) for r in sealed))
    acked = [stored(i) for i in range(2, 6)]
    torn = frame(stored(9))[:-7]
    (wal_dir / "0000000000000004.wal").write_bytes(b"".join(frame(r) for r in acked) + torn)

    assert recover(wal_dir, paths, "c0") == 5
    landed = sorted((tmp_path / "landing").rglob("*.parquet"))
    assert [p.name for p in landed] == [
        "c0-0000000000000003.parquet",
        "c0-0000000000000004.parquet",
    ]
    users = [u for p in landed for u in pq.read_table(p).column("user_id").to_pylist()]
    assert users == [f"u{i}" for i in range(6)]  # u9, the torn record, is not among them
    assert not list(wal_dir.iterdir())
    # A second start finds nothing left to land, and lands nothing twice.
    recover(wal_dir, paths, "c0")
    assert sorted((tmp_path / "landing").rglob("*.parquet")) == landed


def test_a_dropped_calls_record_goes_to_the_store_not_to_a_landing_file(tmp_path: Path) -> None:
    """A segment holding kept messages and a dropped call's record (collector.admission): the
    messages land, the record reaches the regulations store's dropped_events, and a roll again
    after a crash keeps it once."""
    paths = DataPaths(tmp_path)
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    kept = msgspec.json.decode(stored(1))
    # Dropped now: the store keeps the last DROPPED_KEEP_DAYS days.
    gone = stamp(
        "track",
        {"userId": "u2", "event": "E"},
        TENANT,
        channel="server",
        source="http",
        received=datetime.now(UTC),
        request_ip=None,
    )
    records = [kept, dropped_record(gone, "suppress"), msgspec.json.decode(stored(3))]
    seg = wal_dir / "0000000000000009.sealed"
    seg.write_bytes(encode_frames(records, msgspec.json.Encoder()))
    copy = seg.read_bytes()
    (landed,) = roll_segment(seg, paths, "c0")
    table = pq.read_table(landed)
    assert table.column("user_id").to_pylist() == ["u1", "u3"]
    assert gone["eventId"] not in table.column("event_id").to_pylist()
    store = RegulationStore(paths)
    assert store.dropped("a", gone["eventId"]) == "suppress"
    assert store.dropped("other-account", gone["eventId"]) is None
    assert store.dropped("a", kept["eventId"]) is None
    seg.write_bytes(copy)
    recover(wal_dir, paths, "c0")
    count = store._conn().execute("select count(*) from dropped_events").fetchone()[0]
    assert count == 1
    store.close()
