"""The trace file: buffered packets written out, bundled, and never left invalid.

A writer's events go into a byte buffer (``_buf``, which the C encoder
appends to as well); this part writes it out. Uncompressed, packets are
appended as they are. Compressed, small flushes append raw packets (a
*tail*) and a full buffer's worth becomes one zlib bundle written over that
tail, so every flush is durable and the file still ends up made of big
bundles. The file is a valid trace at every instant, even if the process is
killed between two system calls (see :meth:`_FileOutput._write_bundle`), and a
write that fails or falls short (a full disk) leaves it holding what it held
before: the error is raised only once the file is a valid trace again.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
import threading
import zlib
from pathlib import Path
from typing import Any

from tracer.errors import TraceWriteError
from tracer.format._encoding import _ClosedBuffer
from tracer.format._wire import field_bytes, packet, varint

__all__: list[str] = []


class _FileOutput:
    """Where the writer's packets go: the buffer, the file, and the writes between them."""

    def __init__(
        self, path: str | os.PathLike[str], *, compress: bool, compression_level: int,
        buffer_size: int,
    ) -> None:
        self.path = Path(path)
        self._file = _open_for_writing(self.path)
        self._compress = compress
        self._compression_level = compression_level
        self._limit = buffer_size
        self._buf: bytearray | _ClosedBuffer = bytearray()
        self._tail = bytearray()  # raw packets on disk that the next bundle will replace
        # Chunks taken from the buffer, written in order under _io_lock (see detach()).
        self._outbox: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._io_lock = threading.Lock()
        self._file_end = 0
        self.bytes_written = 0

    def _flush_buffer(self, durable_only: bool = False) -> None:
        """Write the buffer out.

        Uncompressed, the packets are appended as they are. Compressed, small
        flushes (``durable_only``: the caller wants the events on disk now, as
        a runner does at every wave) append the packets raw, as a *tail*; once
        the tail and buffer reach ``buffer_size`` (and at close) they become
        one zlib bundle written over the tail. Small per-flush bundles would
        compress about 3x worse than big ones, and this keeps both: every
        flush is durable, and the file ends up made of big bundles.
        """
        self._take(durable_only)
        self._drain_outbox()

    def _take(self, durable_only: bool) -> None:
        """Move the buffer to the outbox (no I/O), in event order."""
        buf = self._buf
        if len(buf):
            self._outbox.append((bytes(buf), durable_only))  # type: ignore[arg-type]
            buf.clear()  # type: ignore[union-attr]
        elif not durable_only:
            self._outbox.append((b"", False))  # at close: bundle the raw tail

    def _drain_outbox(self) -> None:
        """Write what was taken, in the order it was taken (one writer of the file at a time)."""
        with self._io_lock:
            outbox = self._outbox
            while outbox:
                data, durable_only = outbox.popleft()
                self._commit(data, durable_only)

    def _commit(self, data: bytes, durable_only: bool) -> None:
        if not data and (durable_only or not self._tail):
            return
        if not self._compress:
            self._write(data)
            return
        if durable_only and len(self._tail) + len(data) < self._limit:
            self._write(data)
            self._tail += data
            return
        raw = bytes(self._tail) + data if self._tail else data
        self._write_bundle(packet(field_bytes(50, zlib.compress(raw, self._compression_level))))

    def _write_bundle(self, bundle: bytes) -> None:
        """Append ``bundle``, replacing the raw tail it contains.

        The file must be a valid trace at every instant, even if this process
        is killed between two system calls. So the bundle goes over the tail
        in one ``pwrite`` (a kill cannot split a system call), padded with an
        ignorable packet to the tail's length, and only then is the padding
        cut off with ``ftruncate``.

        A ``pwrite`` can also write less than it was given (the disk or the
        file size limit reached part-way, a signal): then the rest is written,
        and if that fails, :meth:`_undo_bundle` puts the raw tail back (only a
        write error leaves the file invalid for that moment) before the error
        is raised. The usual path costs one comparison more.
        """
        tail_len = len(self._tail)
        if not tail_len:
            self._write(bundle)
            return
        start = self._file_end - tail_len
        payload = bundle + _padding(tail_len - len(bundle))
        fd = self._file.fileno()
        try:
            written = os.pwrite(fd, payload, start)
        except OSError as exc:  # nothing written (a regular file's write fails only then)
            raise self._write_error(exc) from exc
        if written != len(payload):
            self._finish_bundle(fd, payload, start, written)
        # The file is now whole: bundle, then padding (a valid trace either way).
        self._tail.clear()
        self._file_end = self.bytes_written = start + len(payload)
        end = start + len(bundle)
        try:
            os.ftruncate(fd, end)
            self._file_end = self.bytes_written = end
        except OSError as exc:  # the padding stays: still a valid trace
            raise self._write_error(exc) from exc
        finally:
            self._seek_end()

    def _finish_bundle(self, fd: int, payload: bytes, start: int, written: int) -> None:
        """Write the rest of a bundle after a short ``pwrite``, or undo it and raise."""
        view = memoryview(payload)
        try:
            while written < len(payload):
                more = os.pwrite(fd, view[written:], start + written)
                if not more:
                    raise OSError(errno.ENOSPC, "short write")
                written += more
        except OSError as exc:
            self._undo_bundle(fd, start, written)
            raise self._write_error(exc) from exc

    def _undo_bundle(self, fd: int, start: int, written: int) -> None:
        """Put back the raw tail that ``written`` bytes of a bundle went over.

        Overwriting bytes the file already has needs no more room, so this
        works on a full disk; if it fails all the same, the file is cut where
        the tail began, which loses only the tail and leaves a valid trace.
        """
        damaged = min(written, len(self._tail))
        try:
            done = 0
            while done < damaged:
                more = os.pwrite(fd, self._tail[done:damaged], start + done)
                if not more:
                    raise OSError(errno.ENOSPC, "short write")
                done += more
            os.ftruncate(fd, self._file_end)  # what went past the end, if any
            return
        except OSError:
            pass
        try:
            os.ftruncate(fd, start)
        except OSError:
            return  # nothing more can be done; the error is raised all the same
        self._tail.clear()
        self._file_end = self.bytes_written = start
        self._seek_end()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError(errno.ENOSPC, "short write")
                view = view[written:]
        except OSError as exc:
            if len(view) != len(data):  # a cut packet at the end: cut it off
                with contextlib.suppress(OSError):
                    os.ftruncate(self._file.fileno(), self._file_end)
                self._seek_end()
            raise self._write_error(exc) from exc
        self.bytes_written += len(data)
        self._file_end += len(data)

    def _seek_end(self) -> None:
        """Where the next append goes: the end of what was written (not where a failed write
        left the file's offset)."""
        with contextlib.suppress(OSError):
            self._file.seek(self._file_end)

    def _write_error(self, exc: OSError) -> TraceWriteError:
        return TraceWriteError(f"cannot write trace file {self.path}: {exc}")

    def flush(self) -> None:
        """Write everything buffered to the file now (raw when compressing; see _flush_buffer)."""
        if isinstance(self._buf, _ClosedBuffer):
            return
        self._flush_buffer(durable_only=True)

    def detach(self) -> None:
        """Take what is buffered for :meth:`write_detached`, without any I/O.

        For a writer shared by threads: call ``detach`` where events are
        written (under the caller's own lock), and ``write_detached`` from
        another thread, outside that lock, so event writers never wait for
        the disk. Chunks are written in the order they were detached.
        """
        if not isinstance(self._buf, _ClosedBuffer):
            self._take(durable_only=True)

    def write_detached(self) -> None:
        """Write everything :meth:`detach` took (thread-safe; raises TraceWriteError)."""
        self._drain_outbox()

    def file_removed(self) -> bool:
        """Whether the trace file was deleted (or its folder) while open.

        On Linux writes to a deleted file succeed and vanish, so a long-running
        writer checks this now and then (one ``fstat``, about a microsecond).
        """
        if self.closed:
            return False
        try:
            return os.fstat(self._file.fileno()).st_nlink == 0
        except OSError:
            return True

    @property
    def closed(self) -> bool:
        return isinstance(self._buf, _ClosedBuffer)

    def _close_file(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            raise TraceWriteError(f"cannot close trace file {self.path}: {exc}") from exc


def _open_for_writing(path: Path) -> Any:
    parent = path.parent
    if not parent.is_dir():
        raise TraceWriteError(
            f"cannot create trace file {path}: folder {parent} does not exist"
            if not parent.exists()
            else f"cannot create trace file {path}: {parent} is not a folder"
        )
    if path.is_dir():
        raise TraceWriteError(f"cannot create trace file {path}: it is a folder")
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False  # not there yet: created below
    if fifo:
        return _open_fifo(path)
    try:
        return open(path, "wb", buffering=0)
    except OSError as exc:
        raise TraceWriteError(f"cannot create trace file {path}: {exc.strerror or exc}") from exc


def _open_fifo(path: Path) -> Any:
    """A FIFO some process reads (an uncompressed trace streamed to it); one nobody reads
    is an error at once, where a plain open would wait for a reader forever."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "it is a FIFO that no process is reading" if exc.errno == errno.ENXIO else (
            exc.strerror or str(exc))
        raise TraceWriteError(f"cannot create trace file {path}: {why}") from exc
    os.set_blocking(fd, True)
    return open(fd, "wb", buffering=0)


# Padding uses TracePacket fields 14 and 15, which Perfetto leaves unused:
# readers skip unknown fields.
_PAD_VARINT = b"\x70\x00"  # field 14, varint 0: two bytes
_PAD_BYTES_TAG = b"\x7a"  # field 15, length-delimited


def _padding(size: int) -> bytes:
    """``size`` bytes that readers skip: packets holding only unknown fields.

    A single byte is a packet tag with no length, which readers treat as a
    truncated last packet.
    """
    if size <= 0:
        return b""
    if size == 1:
        return b"\x0a"
    for body_len in range(size - 2, -1, -1):
        head = b"\x0a" + varint(body_len)
        if len(head) + body_len == size and body_len != 1:  # no field is 1 byte long
            return head + _padding_body(body_len)
    # No single packet has that size (a length varint grows a byte at 128,
    # 16384, ...): an empty packet, then the rest.
    return b"\x0a\x00" + _padding(size - 2)


def _padding_body(size: int) -> bytes:
    """``size`` (0 or >= 2) bytes of unknown TracePacket fields."""
    if size == 0:
        return b""
    for inner in range(size - 2, -1, -1):
        field = _PAD_BYTES_TAG + varint(inner)
        if len(field) + inner == size:
            return field + bytes(inner)
    return _PAD_VARINT + _padding_body(size - 2)
