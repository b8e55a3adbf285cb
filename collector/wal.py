"""The write-ahead log: framed records, one writer thread, group-commit fsync, segment rotation.

A request is acknowledged only after its record is written and synced (O_DSYNC). Records that
arrive while an fsync is running are written and synced together by the next round, so
concurrent requests share fsyncs (~0.2 ms each here).

Frame: 4-byte little-endian length, 4-byte CRC32 of the payload, payload. A torn tail (a crash
mid-write) fails the length or CRC check and is dropped on recovery; it was never acknowledged.
Segments are named `<seq>.wal` while open and renamed `<seq>.sealed` when rotated; `<seq>` is
the millisecond the segment began to take records (orchestration/regulations/purge.py waits for
the segments begun before a suppression).

A roll costs the writer one rename: the next segment is opened ahead by a second thread, the
sealer (created as a spare, `<n>.next`, its room written and its directory entry fsynced), and
renamed `<seq>.wal` when the writer takes it (no fsync needed: after a crash the file is there
under one name or the other, and recovery lands both). The sealer also closes, renames and
directory-fsyncs the segment the writer hands it, and passes it on. Those two directory fsyncs
took tens of ms on this disk now and then, and before they ran on the writer thread, between
acknowledging rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Union

import msgspec

# Who waits for a record: a thread (concurrent Future) or a coroutine (asyncio Future).
Waiter = Union[Future[None], "asyncio.Future[None]"]

HEADER = struct.Struct("<II")
OPEN_SUFFIX = ".wal"
SEALED_SUFFIX = ".sealed"
SPARE_SUFFIX = ".next"  # opened ahead, not yet taking records
_IOV_MAX = 1024  # pieces per writev (Linux's limit)
_NO_HEADER = bytes(HEADER.size)
SPARE_MIN_BYTES = 1 << 20
log = logging.getLogger(__name__)


class WalUnavailable(OSError):
    """The log cannot be written (disk full, I/O error); nothing new is acknowledged."""


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def encode_frames(messages: list[Any], encoder: msgspec.json.Encoder) -> bytes:
    """frame(encoder.encode(m)) of each message, laid end to end: each encoded in place into
    one buffer after room for its header, with no bytes object per message."""
    buf = bytearray()
    for message in messages:
        start = len(buf)
        buf += _NO_HEADER
        encoder.encode_into(message, buf, -1)
        with memoryview(buf) as view:
            crc = zlib.crc32(view[start + HEADER.size :])
        HEADER.pack_into(buf, start, len(buf) - start - HEADER.size, crc)
    return bytes(buf)


def write_frames(fd: int, data: bytes | memoryview, offsets: list[int]) -> None:
    """Writes frame() of each payload laid end to end in `data` (payload i is
    data[offsets[i]:offsets[i + 1]], as in an Arrow string array) to `fd`, gathered by writev
    a few hundred records at a time: no payload is copied out first, no segment-sized buffer is
    built, and the few objects per record are freed before the next batch makes theirs (held
    for a whole segment, they made the allocator take fresh pages for every segment)."""
    view, pack, crc = memoryview(data), HEADER.pack, zlib.crc32
    per_call = _IOV_MAX // 2
    for first in range(0, len(offsets) - 1, per_call):
        ends = offsets[first : first + per_call + 1]
        parts: list[bytes | memoryview] = []
        for start, end in zip(ends[:-1], ends[1:], strict=False):
            payload = view[start:end]
            parts += (pack(end - start, crc(payload)), payload)
        size = HEADER.size * (len(ends) - 1) + ends[-1] - ends[0]
        written = os.writev(fd, parts)
        if written < size:  # a short write (a signal, a full disk): the rest one by one
            rest = memoryview(b"".join(parts))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def read_records(path: Path) -> Iterator[bytes]:
    """The intact records of a segment, stopping at the first torn or corrupt frame (or at the
    unused room of a segment written in advance: its 0xff bytes read as a frame longer than
    the file)."""
    data = path.read_bytes()
    pos, end = 0, len(data)
    while pos + HEADER.size <= end:
        length, crc = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        if start + length > end:
            return
        payload = data[start : start + length]
        if zlib.crc32(payload) != crc:
            return
        yield payload
        pos = start + length


def segment_seq(path: Path) -> int:
    return int(path.name.split(".")[0])


def list_segments(wal_dir: Path) -> list[Path]:
    return sorted(
        (p for p in wal_dir.iterdir() if p.suffix in (OPEN_SUFFIX, SEALED_SUFFIX, SPARE_SUFFIX)),
        key=segment_seq,
    )


def settle(waiters: list[Waiter], error: str | None) -> None:
    """Complete waiters from the writer thread: each event loop is woken once per group
    commit for all of its waiters, not once per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for w in waiters:
        if isinstance(w, Future):
            if error is None:
                w.set_result(None)
            else:
                w.set_exception(WalUnavailable(error))
        else:
            by_loop.setdefault(w.get_loop(), []).append(w)
    for loop, futs in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
            loop.call_soon_threadsafe(_settle_in_loop, futs, error)


def _settle_in_loop(futs: list[asyncio.Future[None]], error: str | None) -> None:
    for f in futs:
        if f.done():  # the request was cancelled (client went away)
            continue
        if error is None:
            f.set_result(None)
        else:
            f.set_exception(WalUnavailable(error))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Appends from any thread or event loop; one writer thread does the I/O."""

    def __init__(
        self,
        wal_dir: Path,
        *,
        roll_interval_s: float,
        roll_max_bytes: int,
        fsync: bool = True,
        on_seal: Callable[[Path], None] | None = None,
    ) -> None:
        self.dir = wal_dir
        self.roll_interval_s = roll_interval_s
        self.roll_max_bytes = roll_max_bytes
        self.fsync = fsync
        self.on_seal = on_seal
        self._pending: list[tuple[bytes, Waiter]] = []
        self._cond = threading.Condition()
        self._wakes: set[asyncio.AbstractEventLoop] = set()  # loops with a _wake scheduled
        self._closing = False
        self._failed: BaseException | None = None
        self._failed_at = 0.0
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._seg_path: Path | None = None
        self._seg_bytes = 0
        self._seg_room = 0  # bytes written in advance (filler); 0: the segment grows as written
        self._last_seg_bytes = 0
        self._seg_opened = 0.0
        self._next_seq = 0
        self.records_written = 0
        self.fsyncs = 0
        # The sealer thread's work, under its own lock: segments to seal (in roll order) and
        # the spare segment it keeps open ahead for the writer.
        self._sealer_cond = threading.Condition()
        self._to_seal: list[tuple[int, Path, int, int]] = []  # fd, path, bytes, room
        self._spare: tuple[int, Path, int] | None = None  # fd, path, room
        self._opening = False  # the sealer is opening a spare (its seq already taken)
        self._spare_retry_at = 0.0
        self._sealer_stop = False
        self._sealer: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, next_seq: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._next_seq = next_seq
        self._sealer = threading.Thread(target=self._run_sealer, name="wal-sealer", daemon=True)
        self._sealer.start()
        self._thread = threading.Thread(target=self._run, name="wal-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write and sync everything pending, seal the open segment, stop the writer."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread:
            self._thread.join()
        with self._sealer_cond:
            self._sealer_stop = True
            self._sealer_cond.notify()
        if self._sealer:
            self._sealer.join()

    # --- appends ------------------------------------------------------------------------------

    def append(self, payloads: list[bytes]) -> Future[None]:
        """Queue records; the future completes after they are durable (or fails)."""
        fut: Future[None] = Future()
        self._enqueue(payloads, fut)
        return fut

    async def append_async(self, payloads: list[bytes]) -> None:
        """Returns once the records are durable; raises WalUnavailable if they cannot be."""
        await self.append_frames_async(b"".join(frame(p) for p in payloads))

    async def append_frames_async(self, blob: bytes) -> None:
        """append_async of records already framed (encode_frames)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._enqueue_blob(blob, fut, loop)
        await fut

    def _enqueue(self, payloads: list[bytes], waiter: Waiter) -> None:
        self._enqueue_blob(b"".join(frame(p) for p in payloads), waiter)

    def _enqueue_blob(
        self, blob: bytes, waiter: Waiter, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        with self._cond:
            failing = self._failed is not None and time.monotonic() - self._failed_at < 1.0
            if not (failing or self._closing):
                self._pending.append((blob, waiter))
                if loop is None:
                    self._cond.notify()
                elif loop not in self._wakes:
                    # The writer is woken once per turn of the event loop, after every request
                    # of that turn has queued its records, not once per request: fewer, fuller
                    # group commits and fewer switches of the GIL between the two threads.
                    self._wakes.add(loop)
                    loop.call_soon(self._wake, loop)
                return
        settle([waiter], f"write-ahead log unavailable: {self._failed or 'closing'}")

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._cond:
            self._wakes.discard(loop)
            self._cond.notify()

    @property
    def healthy(self) -> bool:
        return self._failed is None

    # --- the writer thread --------------------------------------------------------------------

    def _next_seq_now(self) -> int:
        with self._sealer_cond:
            # Time-based sequence numbers: unique across restarts without scanning the landing
            # dir.
            seq = max(self._next_seq, time.time_ns() // 1_000_000)
            self._next_seq = seq + 1
        return seq

    def _new_segment(self, room: int = 0, suffix: str = OPEN_SUFFIX) -> tuple[int, Path, int]:
        """A new segment, its directory entry durable, and `room` bytes of filler (0xff, never
        a whole frame: an empty record is all zeros) written and synced in advance. Any
        thread."""
        path = self.dir / f"{self._next_seq_now():016d}{suffix}"
        room = room if self.fsync else 0
        fd = -1
        try:
            if room:
                # Records then overwrite blocks that exist: an O_DSYNC write changes no
                # metadata, so it needs no commit of ext4's journal, which is shared with every
                # other writer of the file system (the roller's Parquet files, other programs).
                fill = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    filler = b"\xff" * min(room, 1 << 20)
                    for offset in range(0, room, len(filler)):
                        os.pwrite(fill, filler[: room - offset], offset)
                    os.fsync(fill)
                finally:
                    os.close(fill)
            # With O_DSYNC each write returns once its data is on disk (the fdatasync of that
            # write): a group commit is one system call, so the writer thread gives up and
            # takes back the GIL once a round instead of twice.
            flags = os.O_WRONLY | os.O_CREAT | (os.O_DSYNC if self.fsync else 0)
            fd = os.open(path, flags, 0o644)
            if self.fsync:
                fsync_dir(self.dir)
        except OSError:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return fd, path, room

    def _spare_room(self) -> int:
        """Room for the next spare: twice what the last segment held, 1 MiB to roll_max_bytes
        (written every roll, and held on the disk; a segment that outgrows its room grows as
        it is written, as one opened without room does)."""
        return min(self.roll_max_bytes, 1 << 30, max(SPARE_MIN_BYTES, 2 * self._last_seg_bytes))

    def _open_segment(self) -> None:
        """The writer's next segment: the spare opened ahead, else one opened now (without
        room written in advance: that would be on the acknowledging path)."""
        with self._sealer_cond:
            while self._spare is None and self._opening:
                self._sealer_cond.wait()  # one is on its way, and has the lower seq
            spare, self._spare = self._spare, None
            self._sealer_cond.notify()  # open the next spare
        if spare is None:
            self._fd, self._seg_path, self._seg_room = self._new_segment()
        else:
            # Named now, by when it begins to take records: a spare made before a suppression
            # holds nothing received before it.
            fd, path, room = spare
            named = self.dir / f"{self._next_seq_now():016d}{OPEN_SUFFIX}"
            try:
                os.rename(path, named)
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
            self._fd, self._seg_path, self._seg_room = fd, named, room
        self._seg_bytes = 0

    def _roll(self) -> None:
        """Hand the open segment to the sealer; the next write goes to the spare."""
        if self._fd < 0 or self._seg_path is None:
            return
        with self._sealer_cond:
            self._to_seal.append((self._fd, self._seg_path, self._seg_bytes, self._seg_room))
            self._last_seg_bytes = self._seg_bytes
            self._sealer_cond.notify()
        self._fd, self._seg_path, self._seg_bytes, self._seg_room = -1, None, 0, 0

    def _seal(self) -> None:
        """Seal the open segment on this thread (after a failure)."""
        if self._fd < 0 or self._seg_path is None:
            return
        fd, path, size, room = self._fd, self._seg_path, self._seg_bytes, self._seg_room
        self._fd, self._seg_path, self._seg_bytes, self._seg_room = -1, None, 0, 0
        self._seal_segment(fd, path, size, room)

    def _seal_segment(self, fd: int, path: Path, size: int, room: int) -> None:
        if room > size and size:
            # The unused room goes; if this is lost in a crash, recovery stops at it.
            os.ftruncate(fd, size)
        os.close(fd)
        if size == 0:
            path.unlink()
            return
        sealed = path.with_suffix(SEALED_SUFFIX)
        os.rename(path, sealed)
        if self.fsync:
            fsync_dir(self.dir)
        if self.on_seal:
            self.on_seal(sealed)

    def _run_sealer(self) -> None:
        while True:
            with self._sealer_cond:
                while True:
                    stop = self._sealer_stop
                    want_spare = (
                        self._spare is None
                        and not stop
                        and time.monotonic() >= self._spare_retry_at
                    )
                    if self._to_seal or stop or want_spare:
                        break
                    timeout = None
                    if self._spare is None:
                        timeout = max(0.0, self._spare_retry_at - time.monotonic())
                    self._sealer_cond.wait(timeout)
                to_seal, self._to_seal = self._to_seal, []
                self._opening = want_spare and not to_seal
            for fd, path, size, room in to_seal:
                try:
                    self._seal_segment(fd, path, size, room)
                except OSError as e:
                    self._fail(e)
                except Exception:  # on_seal's: the segment stays in the log for recovery
                    log.exception("sealing %s failed", path.name)
            if stop:  # the writer has stopped: everything it handed over is sealed
                with self._sealer_cond:
                    spare, self._spare = self._spare, None
                if spare is not None:
                    os.close(spare[0])
                    with contextlib.suppress(OSError):
                        spare[1].unlink()
                return
            if self._opening:
                try:
                    spare = self._new_segment(self._spare_room(), SPARE_SUFFIX)
                except OSError:
                    # The writer opens its own (and fails the log) if the disk still refuses.
                    spare, self._spare_retry_at = None, time.monotonic() + 1.0
                with self._sealer_cond:
                    self._spare, self._opening = spare, False
                    self._sealer_cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    timeout = None
                    if self._seg_bytes:
                        timeout = max(
                            0.0, self._seg_opened + self.roll_interval_s - time.monotonic()
                        )
                        if timeout == 0.0:
                            break
                    self._cond.wait(timeout)
                batch, self._pending = self._pending, []
                closing = self._closing
            if batch:
                self._write(batch)
            if self._failed is None:
                due = self._seg_bytes and (
                    self._seg_bytes >= self.roll_max_bytes
                    or time.monotonic() - self._seg_opened >= self.roll_interval_s
                )
                if due or (closing and not batch):
                    self._roll()
            if closing and not batch:
                return

    def _write(self, batch: list[tuple[bytes, Waiter]]) -> None:
        try:
            if self._failed is not None:
                self._try_recover()
            data = b"".join(blob for blob, _ in batch)
            if self._fd < 0:
                self._open_segment()
            if self._seg_bytes == 0:
                self._seg_opened = time.monotonic()  # the roll interval counts from here
            view = memoryview(data)
            offset = self._seg_bytes
            while view:  # synced as written (O_DSYNC) when fsync is on
                n = os.pwrite(self._fd, view, offset)
                view, offset = view[n:], offset + n
            self.fsyncs += 1
            self._seg_bytes += len(data)
            self.records_written += len(batch)
        except OSError as e:
            self._undo_partial_write()
            self._fail(e)
            settle([w for _, w in batch], f"write-ahead log unavailable: {e}")
            return
        settle([w for _, w in batch], None)

    def _undo_partial_write(self) -> None:
        # Cut back to the last acknowledged byte, so records whose requests got an error are
        # not landed later (a torn frame would be dropped anyway; a whole one would not).
        if self._fd >= 0:
            self._seg_room = 0  # the room after it goes too: the segment grows as written
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._seg_bytes)

    def _try_recover(self) -> None:
        """After a failure, retry on a fresh segment once a second (e.g. the disk was freed)."""
        if time.monotonic() - self._failed_at < 1.0:
            raise WalUnavailable(str(self._failed))
        try:
            self._seal()
        except OSError:
            self._fd, self._seg_path, self._seg_bytes = -1, None, 0
        self._open_segment()  # raises if the disk still refuses
        self._failed = None

    def _fail(self, exc: BaseException) -> None:
        # Until a fresh segment opens, refuse appends at once: nothing is acknowledged that
        # recovery might not find. Records acknowledged earlier were synced and stay.
        self._failed = exc
        self._failed_at = time.monotonic()
        with self._cond:
            pending, self._pending = self._pending, []
        settle([w for _, w in pending], f"write-ahead log unavailable: {exc}")
