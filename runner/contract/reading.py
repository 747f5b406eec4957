"""Reading a jsonl dataset someone else supplied, with bounded work: bytes, line length, records,
compression ratio and time.

The bot reads datasets that chat users point it at (Slack uploads, storage URIs) to estimate and to check
them before renting; a 300 KB gzip can expand to a 300 MB line, and a text-mode ``for line in stream``
holds a whole line in memory however long it is. ``LineReader`` reads in fixed chunks, so memory stays
under one line's cap, and each limit is either a *sample* bound (stop early and say so: ``stopped``,
``fraction_read()`` lets an estimate scale up) or a *hard* bound (``DatasetLimitError`` naming the limit
and, when the caller says which, the setting that raises it).

Pure apart from opening the URI with fsspec (any local path or fsspec URI, compression inferred from the
name as the runner does); never torch: the bot imports it.

The time bound is a wall-clock deadline for the whole read, enforced even while a read blocks: an http(s)
dataset is read here with http.client (not fsspec's aiohttp, whose reads wait for whole blocks with no
deadline), each socket read waiting at most the time left, and a watchdog that shuts the connection down at
the deadline (headers dribbled a byte at a time included). A server that sends a byte every few seconds
costs its sender one refused estimate, not a thread of the bot for hours.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import lzma
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import fsspec
import fsspec.compression
import fsspec.utils

CHUNK = 1 << 16
# The ratio is checked only past this many decompressed bytes: the first block of a small file can
# legitimately expand a lot (a header, a run of blank lines).
RATIO_FLOOR = 1 << 20
MIB = 1 << 20


class DatasetError(ValueError):
    """The dataset cannot be used as given (malformed record, empty after filtering, unreadable, over a
    limit); the message names the file and the 1-based line, because users fix datasets in editors."""

    def __init__(self, message: str, *, uri: str | None = None, line: int | None = None) -> None:
        where = ""
        if uri is not None:
            where = f"{uri}:{line}: " if line is not None else f"{uri}: "
        super().__init__(f"{where}{message}")
        self.uri = uri
        self.line = line


class DatasetLimitError(DatasetError):
    """A hard limit was hit (``limit``: "line", "ratio" or "seconds"); the message says how to raise it."""

    def __init__(self, message: str, *, limit: str, uri: str | None = None, line: int | None = None) -> None:
        super().__init__(message, uri=uri, line=line)
        self.limit = limit


@dataclass(frozen=True)
class ReadLimits:
    """How much of an untrusted dataset one read may cost. None: unbounded.

    Sample bounds stop the read early (``LineReader.stopped``); hard bounds raise DatasetLimitError.
    ``settings`` maps a limit's name to the setting that raises it, for the message.
    """

    sample_records: int | None = None  # stop after this many records (non-blank lines)
    sample_bytes: int | None = None  # stop after this many decompressed bytes (at a line's end)
    max_line_bytes: int | None = None  # hard: one line longer than this
    max_ratio: float | None = None  # hard: decompressed / compressed bytes above this (a bomb)
    seconds: float | None = None  # hard: the whole read takes longer than this
    settings: Mapping[str, str] = field(default_factory=dict)

    def with_records(self, records: int | None) -> ReadLimits:
        return ReadLimits(
            sample_records=records,
            sample_bytes=self.sample_bytes,
            max_line_bytes=self.max_line_bytes,
            max_ratio=self.max_ratio,
            seconds=self.seconds,
            settings=self.settings,
        )

    def hint(self, limit: str) -> str:
        setting = self.settings.get(limit)
        return f"; raise it with {setting}" if setting else ""


# What the decompressors raise on corrupt or truncated input (gzip's BadGzipFile is an OSError).
_CORRUPT = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


class _Counting(io.RawIOBase):
    """A read-only wrapper that counts the bytes the decompressor pulls from the file."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.count = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(getattr(self.inner, "seekable", lambda: False)())

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        return n

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.count += len(data)
        return bytes(data)


class _Gunzip:
    """gzip decoding (member after member, like gzip itself) with exact accounting: ``used`` is the number
    of compressed bytes behind the output returned so far, so a sample knows which share of the file it
    covered (gzip.GzipFile reads ahead by whole blocks, which is a third of a small file)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.pending = b""
        self.used = 0
        self.in_member = False  # the current member has started: running out of input now is truncation

    def read(self, size: int) -> bytes:
        while True:
            if not self.pending:
                self.pending = self.raw.read(CHUNK)
                if not self.pending:
                    if self.in_member:
                        raise EOFError("compressed file ended before the end-of-stream marker")
                    return b""
            before = len(self.pending)
            out = self.inflate.decompress(self.pending, size)
            self.in_member = True
            if self.inflate.eof:  # a member ends here; what follows is the next member
                self.pending = self.inflate.unused_data
                self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self.in_member = False
            else:
                self.pending = self.inflate.unconsumed_tail
            self.used += before - len(self.pending)
            if out:
                return out

    def close(self) -> None:
        pass


HTTP_SCHEMES = ("http", "https")
MAX_REDIRECTS = 5
IDLE_READ_S = 60.0  # without a deadline, a socket read still waits at most this long for a byte


class _DeadlinePassed(Exception):
    """The whole read's wall-clock deadline passed (the watchdog cut the connection)."""


class _HttpBody(io.RawIOBase):
    """An http(s) dataset's bytes as a raw file, within a wall-clock deadline (``left()``: seconds left,
    None for none): every socket read waits at most the time left, and a watchdog thread shuts the socket
    down at the deadline, which ends a read blocked anywhere (status line, headers, body). Redirects are
    followed (http and https only, MAX_REDIRECTS); the body is taken as sent (no content decoding)."""

    def __init__(self, uri: str, left: Callable[[], float | None]) -> None:
        super().__init__()
        self.left = left
        self.cut = False
        self.size: int | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._resp: http.client.HTTPResponse | None = None
        self._lock = threading.Lock()
        remaining = left()
        self._timer = threading.Timer(remaining, self._stop) if remaining is not None else None
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        try:
            self._open(uri)
        except BaseException:
            self.close()
            raise

    def _open(self, uri: str) -> None:
        url = uri
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in HTTP_SCHEMES or not parts.hostname:
                raise OSError(f"cannot follow a redirect to {parts.scheme or 'a relative'} URL")
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.hostname, parts.port, timeout=self._wait())
            with self._lock:
                self._conn = conn
            if self.cut:
                raise _DeadlinePassed
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            try:
                conn.request("GET", path, headers={"Accept-Encoding": "identity", "User-Agent": "tunebot"})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                if self.cut:
                    raise _DeadlinePassed from None
                raise OSError(f"{type(exc).__name__}: {exc}") from None
            location = resp.getheader("Location")
            if resp.status in (301, 302, 303, 307, 308) and location:
                resp.close()
                conn.close()
                url = urljoin(url, location)
                continue
            if resp.status in (404, 410):
                raise FileNotFoundError(url)
            if resp.status != 200:
                raise OSError(f"HTTP {resp.status} {resp.reason}")
            length = resp.getheader("Content-Length")
            self.size = int(length) if length and length.isdigit() else None
            self._resp = resp
            return
        raise OSError(f"more than {MAX_REDIRECTS} redirects")

    def _wait(self) -> float:
        """How long one socket operation may wait: the time left (never more than IDLE_READ_S)."""
        remaining = self.left()
        if remaining is None:
            return IDLE_READ_S
        if remaining <= 0:
            self._stop()
            raise _DeadlinePassed
        return min(remaining, IDLE_READ_S)

    def _stop(self) -> None:
        """The watchdog: the deadline passed; shut the connection down so that a blocked read returns."""
        with self._lock:
            self.cut = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._resp is None:
            return b""
        wait = self._wait()
        sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            sock.settimeout(wait)
        try:
            data = self._resp.read1(size if size and size > 0 else CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            if self.cut or (self.left() or 1.0) <= 0:
                raise _DeadlinePassed from None
            if isinstance(exc, TimeoutError):
                raise OSError(f"the server sent nothing for {wait:.0f} s") from None
            raise OSError(f"{type(exc).__name__}: {exc}") from None
        if self.cut:
            raise _DeadlinePassed
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(Exception):
            if self._resp is not None:
                self._resp.close()
        with contextlib.suppress(Exception):
            if self._conn is not None:
                self._conn.close()
        super().close()


class LineReader:
    """Iterate (1-based line number, text) over the non-blank lines of a jsonl file, within ``limits``.

    After iterating: ``stopped`` is "records" or "bytes" when a sample bound ended the read with more data
    left, ``records`` the lines yielded, ``fraction_read()`` the share of the file read (for scaling up).
    """

    def __init__(
        self,
        uri: str,
        limits: ReadLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.uri = uri
        self.limits = limits or ReadLimits()
        self.clock = clock
        self.compression = fsspec.utils.infer_compression(uri)
        self.stopped: str | None = None
        self.records = 0
        self.raw_size: int | None = None  # the file's size as stored (compressed), when known
        self.raw_read = 0  # bytes read from the file (compressed)
        self.decoded = 0  # decompressed bytes read
        self.consumed = 0  # decompressed bytes up to the end of the last line yielded

    def fraction_read(self) -> float | None:
        """The share of the file this read covered (1.0 when it read everything), None when unknown."""
        if self.stopped is None:
            return 1.0
        if not self.raw_size:
            return None
        done = float(self.consumed)
        if self.compression:  # the compressed bytes behind what was consumed, at the ratio seen so far
            done *= self.raw_read / max(self.decoded, 1)
        return min(1.0, max(done, 1.0) / self.raw_size)

    def _fail(self, limit: str, message: str, line: int | None = None) -> DatasetLimitError:
        return DatasetLimitError(message + self.limits.hint(limit), limit=limit, uri=self.uri, line=line)

    def _open(self, deadline: float | None) -> Any:
        """The raw file: http(s) within the deadline (``_HttpBody``), anything else through fsspec."""
        if fsspec.utils.get_protocol(self.uri) in HTTP_SCHEMES:

            def left() -> float | None:
                return None if deadline is None else deadline - self.clock()

            body = _HttpBody(self.uri, left)
            self.raw_size = body.size
            return contextlib.closing(body)
        opened = fsspec.open(self.uri, "rb")
        try:
            self.raw_size = int(opened.fs.size(opened.path))
        except Exception:  # noqa: BLE001 - a size is only needed to scale a sample up
            self.raw_size = None
        return opened

    def __iter__(self) -> Iterator[tuple[int, str]]:
        lim = self.limits
        deadline = self.clock() + lim.seconds if lim.seconds else None
        try:
            with self._open(deadline) as raw:
                counted = _Counting(raw)
                if self.compression == "gzip":
                    stream: Any = _Gunzip(counted)
                elif self.compression:
                    stream = fsspec.compression.compr[self.compression](counted, mode="rb")
                else:
                    stream = counted
                try:
                    yield from self._lines(stream, counted, deadline)
                finally:
                    if stream is not counted:
                        stream.close()
        except _DeadlinePassed:
            raise self._fail("seconds", f"reading took longer than {lim.seconds:g} s") from None
        except DatasetError:
            raise
        except FileNotFoundError as exc:
            raise DatasetError("dataset not found", uri=self.uri) from exc
        except _CORRUPT as exc:
            what = f"{self.compression} data is corrupt or truncated" if self.compression else "cannot read"
            raise DatasetError(f"{what} ({type(exc).__name__}: {exc})", uri=self.uri) from exc

    def _lines(self, stream: Any, counted: _Counting, deadline: float | None) -> Iterator[tuple[int, str]]:
        lim = self.limits
        buf = bytearray()
        number = 0  # lines seen, blank ones included (editors count them)
        pending: tuple[int, str] | None = None  # a record read past a sample bound: is there more?

        def timed_out() -> bool:
            return deadline is not None and self.clock() > deadline

        while True:
            if timed_out():
                raise self._fail("seconds", f"reading took longer than {lim.seconds:g} s", number or None)
            chunk = stream.read(CHUNK)
            if not chunk:
                break
            self.decoded += len(chunk)
            self.raw_read = stream.used if isinstance(stream, _Gunzip) else counted.count
            if (
                self.compression
                and lim.max_ratio
                and self.decoded > RATIO_FLOOR
                and self.decoded > lim.max_ratio * max(self.raw_read, 1)
            ):
                raise self._fail(
                    "ratio",
                    f"{self.compression} data expands more than {lim.max_ratio:g} times (a compression "
                    "bomb?)",
                )
            buf += chunk
            start = 0
            while (end := buf.find(b"\n", start)) != -1:
                number += 1
                line = bytes(buf[start:end])
                start = end + 1
                pending = self._record(line, number)
                if pending is None:
                    self.consumed += len(line) + 1
                    continue
                if self._sample_full():
                    self.stopped = "records" if self._records_full() else "bytes"
                    return
                if timed_out():
                    raise self._fail("seconds", f"reading took longer than {lim.seconds:g} s", number)
                self.records += 1
                self.consumed += len(line) + 1
                yield pending
            del buf[:start]
            if lim.max_line_bytes and len(buf) > lim.max_line_bytes:
                raise self._line_too_long(number + 1)
        if buf:
            number += 1
            pending = self._record(bytes(buf), number)
            if pending is not None:
                if self._sample_full():
                    self.stopped = "records" if self._records_full() else "bytes"
                    return
                self.records += 1
                self.consumed += len(buf)
                yield pending

    def _records_full(self) -> bool:
        return self.limits.sample_records is not None and self.records >= self.limits.sample_records

    def _sample_full(self) -> bool:
        bytes_full = self.limits.sample_bytes is not None and self.consumed >= self.limits.sample_bytes
        return self._records_full() or bytes_full

    def _line_too_long(self, number: int) -> DatasetLimitError:
        cap = self.limits.max_line_bytes or 0
        size = f"{cap / MIB:g} MiB" if cap >= MIB else f"{cap:,} bytes"
        return self._fail("line", f"a line is longer than {size}", number)

    def _record(self, line: bytes, number: int) -> tuple[int, str] | None:
        """(number, text) of a non-blank line; None for a blank one."""
        if self.limits.max_line_bytes and len(line) > self.limits.max_line_bytes:
            raise self._line_too_long(number)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(f"not UTF-8 text ({exc.reason})", uri=self.uri, line=number) from None
        text = text.rstrip("\r")
        return (number, text) if text.strip() else None


def read_lines(uri: str, limits: ReadLimits | None = None) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a dataset within ``limits`` (see LineReader)."""
    return iter(LineReader(uri, limits))
