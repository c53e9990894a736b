"""Streaming reader of PyTorch profiler (Kineto) Chrome traces into :class:`TraceData` columns.

A trace is one JSON object whose ``traceEvents`` array holds every event. Reading it whole would
build one Python dict per event (gigabytes for a 500 MB trace). Instead the file (``.json`` or
``.json.gz``) is read in blocks of :data:`BLOCK_BYTES` into one reused buffer; each block is cut
after the last complete event (a ``}`` followed by ``,`` and the ``{`` of the next event, checked
by parsing), the events of the block are decoded at once with msgspec into small typed structs
holding only the fields whyidle reads (every other key is skipped by the decoder; the checks on
those fields are decoder constraints: :mod:`whyidle.record.kineto_events`), reduced to columns,
and dropped. The garbage collector is paused while reading: the structs are not cyclic, and
collections triggered by millions of allocations cost more than the decoding itself. Peak memory
is a few blocks plus the columns. The keys around ``traceEvents`` (``deviceProperties``,
``distributedInfo``, ...) are parsed from the text before and after the array.

A large uncompressed file is split into byte ranges of about :data:`RANGE_BYTES` at verified
event boundaries, read the same way by several processes at once: this one and forked helpers
that import nothing, each taking the next range left (so a process slowed by other load takes
fewer), the helpers sending their columns back through a pipe as raw array bytes. The helpers
start when a :class:`TraceReading` is made, so the caller's own work (imports) overlaps their
reading. The ranges' columns are merged in file order (strings and thread ids made global, sorted
by time) into what one process reading the whole file gives.

Errors: :class:`TraceError` with a one-line message for unreadable input (truncated gzip, invalid
JSON, a JSON document that is not a trace).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import zlib

import msgspec
import numpy as np

from whyidle.gcpause import gc_paused
from whyidle.record.kineto_events import _BAD, _DECODER, _FAST_DECODER, _I64, _Columns, _Event
from whyidle.record.trace_data import TraceData

_JSONError: tuple = (msgspec.DecodeError,)
_loads = msgspec.json.decode

#: Bytes read per block: large enough that decoding dominates, small enough that one block's
#: structs stay in the processor's caches while their columns are taken (1 MiB read a 150 MB trace
#: ~5 % faster than 4 MiB; 512 KiB no faster) and far below the file size.
BLOCK_BYTES = 1024 * 1024
#: Text without an event boundary that is given up on as one giant event (or not events), bytes.
GIANT_BYTES = 33 * 1024 * 1024

_CUT = re.compile(rb"\}\s*,\s*(?=\{)")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class TraceError(Exception):
    """Unreadable trace input; ``str()`` is a one-line message for the user."""


def trace_files(path: str) -> list[str]:
    """The trace files of ``path``: the file itself, or the ``*.json``/``*.json.gz`` files of a
    folder (one job's ranks), sorted. Errors: :class:`TraceError` when there is none."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith((".json", ".json.gz")) and os.path.isfile(os.path.join(path, f)))
        if not files:
            raise TraceError(f"{path}: no trace files (*.json, *.json.gz) in this folder")
        return files
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file or folder")
    return [path]


#: A gzip trace may decompress to at most this many times its size once past
#: :data:`GZIP_FREE_BYTES` (real Kineto traces: 7-30x; deflate's ceiling is ~1032x): beyond, it is
#: refused as a decompression bomb.
MAX_GZIP_RATIO = 200
GZIP_FREE_BYTES = 1 << 30


def _open(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    return _Gunzip(path) if magic == b"\x1f\x8b" else open(path, "rb")


class _Gunzip:
    """A gzip file read in blocks that keeps what was decompressed before damage: a read that
    meets a cut-short or corrupt stream returns the bytes before it (``error`` keeps the reason)
    and the next read raises it. Stops with :class:`TraceError` past :data:`MAX_GZIP_RATIO`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.limit = max(GZIP_FREE_BYTES, MAX_GZIP_RATIO * os.path.getsize(path))
        self._f = gzip.open(path, "rb")  # noqa: SIM115 - closed by close()
        self.error: BaseException | None = None
        self.total = 0

    def read(self, size: int) -> bytes:
        if self.error is not None:
            raise self.error
        out: list[bytes] = []
        n = 0
        while n < size:
            try:
                chunk = self._f.read1(min(size - n, 1 << 16))
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                self.error = exc
                break
            if not chunk:
                break
            out.append(chunk)
            n += len(chunk)
        self.total += n
        if self.total > self.limit:
            raise TraceError(f"{self.path}: decompresses to over {MAX_GZIP_RATIO}x its size (more than "
                             f"{self.total / 1e9:.1f} GB read): not a profiler trace (a decompression bomb?)")
        if not out and self.error is not None:
            raise self.error
        return b"".join(out)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _parse_events(chunk: bytes, fast: bool = True) -> list:
    """The events of ``chunk`` (the text between ``[`` and ``]``): :func:`_decode_array`."""
    return _decode_array(b"[" + chunk + b"]", fast)


def _decode_array(text, fast: bool = True) -> list:
    """The events of ``text`` (a JSON array, bytes or a memoryview). Fast path (``fast``): msgspec
    into :class:`_FastEvent`, every field checked by the decoder; text with a field outside those
    checks is decoded into :class:`_Event` and checked per event by :meth:`_Columns.add`. Text
    that is valid JSON but has an event of an unexpected shape, or that holds what Python's JSON
    reader accepts beyond the standard (NaN, Infinity) or invalid UTF-8, is read leniently
    (:func:`_lenient`). Errors: ``msgspec.DecodeError`` when it is not JSON at all (the block
    cutter then tries another cut)."""
    error = None
    if fast:
        try:
            return _FAST_DECODER.decode(text)
        except msgspec.ValidationError:  # a field out of its checked type or range: the checks below
            pass
        except msgspec.DecodeError as exc:  # not standard JSON: maybe NaN or Infinity (below)
            error = exc.with_traceback(None)  # kept without its traceback: no cycle through this frame
    if error is None:
        try:
            return _DECODER.decode(text)
        except msgspec.ValidationError:  # an event of another shape (the typed decoder stops there)
            try:
                return _lenient(msgspec.json.decode(text))
            except msgspec.DecodeError as exc:  # and beyond standard JSON further on
                error = exc.with_traceback(None)
        except msgspec.DecodeError as exc:
            error = exc.with_traceback(None)
    import json

    try:
        items = json.loads(bytes(text).decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        try:
            raise error from None  # not JSON
        finally:  # no cycle (error → its traceback → this frame → error) keeps the caller's buffer
            del error, text  # exported while the collector is paused (a bytearray it resizes next)
    return _lenient(items if isinstance(items, list) else [])


def _lenient(items: list) -> list:
    """Each item as an :class:`_Event`; an item that is not an event object becomes :data:`_BAD`,
    and ``args`` that are not an object of the expected fields are dropped."""
    out = []
    for item in items:
        if not isinstance(item, dict):
            out.append(_BAD)
            continue
        try:
            out.append(msgspec.convert(item, _Event, str_keys=True))
        except (msgspec.ValidationError, TypeError, ValueError, RecursionError):
            item = {k: v for k, v in item.items() if k != "args"}
            try:
                out.append(msgspec.convert(item, _Event, str_keys=True))
            except (msgspec.ValidationError, TypeError, ValueError, RecursionError):
                out.append(_BAD)
    return out


def read_trace(path: str, block_bytes: int = BLOCK_BYTES, workers: int | None = None) -> TraceData:
    """Reads one trace file into columns (see :mod:`whyidle.record.trace_data`):
    ``TraceReading(path, block_bytes, workers).result()``.

    An uncompressed file of at least :data:`PARALLEL_MIN_BYTES` is split into byte ranges of about
    :data:`RANGE_BYTES` at verified event boundaries, read by ``workers`` processes at once (this
    one and forked ones, each taking the next range left until none is: :func:`_start_parallel`;
    default: one per usable core, at most one per :data:`MIN_PART_BYTES` and :data:`MAX_WORKERS`);
    ``workers=1`` reads it in this process alone. A gzip file is read sequentially (it cannot be
    split).

    Errors: :class:`TraceError` (one line) for a missing, truncated or invalid file, or a JSON
    document without ``traceEvents``.
    """
    return TraceReading(path, block_bytes, workers).result()


class TraceReading:
    """One trace file being read (:func:`read_trace`). Making one starts the forked helper
    processes of a parallel read, which begin reading at once, so that the caller can do other
    work (imports) before :meth:`result` reads this process's share; a sequential read happens
    in :meth:`result`. Errors found while starting are raised by :meth:`result`."""

    def __init__(self, path: str, block_bytes: int = BLOCK_BYTES, workers: int | None = None) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self._parallel: _ParallelRead | None = None
        self._error: Exception | None = None
        if workers == 1 or not hasattr(os, "fork"):
            return
        with gc_paused():  # the helpers are forked with the collector paused
            try:
                with _one_line_errors(path):
                    with _open(path) as f:
                        if not isinstance(f, io.BufferedReader):  # gzip: read sequentially
                            return
                        head, _buf, a0 = _find_array(f, block_bytes, path)
                    procs = _processes(path, a0, workers)
                    points = _split_points(path, a0, procs, RANGE_BYTES) if procs > 1 else []
                    if points:
                        self._parallel = _start_parallel(path, head, a0, points, block_bytes, procs)
            except Exception as exc:  # noqa: BLE001 - raised by result(), as a sequential read would
                self._error = exc

    def result(self) -> TraceData:
        """The trace's columns (to be asked for once). Errors: :class:`TraceError` (see
        :func:`read_trace`)."""
        if self._error is not None:
            raise self._error
        with gc_paused(), _one_line_errors(self.path):
            if self._parallel is not None:
                return self._parallel.finish()
            with _open(self.path) as f:
                head, buf, _a0 = _find_array(f, self.block_bytes, self.path)
                cols = _Columns()
                tail = _scan(f, buf, cols, self.block_bytes, self.path, None)
            return _assemble(self.path, head, tail, [cols.raw()])


@contextlib.contextmanager
def _one_line_errors(path: str):
    """Turns the errors of reading ``path`` into :class:`TraceError` with a one-line message."""
    try:
        yield
    except TraceError:
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: truncated or corrupt gzip file ({exc})") from None
    except _JSONError as exc:
        raise TraceError(f"{path}: invalid JSON ({str(exc).splitlines()[0][:120]})") from None
    except RecursionError:
        raise TraceError(f"{path}: invalid JSON (nested too deeply: not a profiler trace)") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None


#: Uncompressed traces from this size on are read by several processes, at most one per
#: :data:`MIN_PART_BYTES` of events (below it, starting a process costs more than it saves: a
#: fork and the columns sent back are ~5-20 ms, a 16 MB range decodes in ~35 ms on one core).
PARALLEL_MIN_BYTES = 32 * 1024 * 1024
MIN_PART_BYTES = 16 * 1024 * 1024
#: Reading processes at most.
MAX_WORKERS = 64


def _find_array(f, block_bytes: int, path: str) -> tuple[bytes, bytes, int]:
    """(text before the array, bytes read after its ``[``, offset of those bytes in the stream)."""
    buf = b""
    while True:
        block = f.read(block_bytes)
        if not block:
            break
        buf += block
        m = _EVENTS_KEY.search(buf)
        if m:
            return buf[:m.start()], buf[m.end():], m.end()
        if len(buf) > max(64 * block_bytes, 256 << 20):
            break
    _check_json(buf, path)
    raise TraceError(f"{path}: not a PyTorch profiler trace (no \"traceEvents\" array)")


def _scan(f, buf: bytes, cols: _Columns, block_bytes: int, path: str, stop: int | None,
          work: _Pending | None = None) -> bytes:
    """Reads events from ``f`` (``buf`` already read) into ``cols``. With ``stop`` (bytes left to
    read in this part), the part ends right after an event and its ``,``; without, at the end of
    the array, whose following text is returned.

    The text waiting to be parsed lives in one :class:`_Pending` buffer, read into in place and
    decoded through a memoryview: no block is copied or allocated anew on the way (``work``: a
    buffer of an earlier range to reuse)."""
    left = stop
    work = _Pending(buf, block_bytes, reuse=work)
    while True:
        size = block_bytes if left is None else min(block_bytes, left)
        try:
            got = work.read_from(f, size) if size > 0 else 0
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # the data before the damage is usable
            cols.cut = f"a damaged gzip stream ({str(exc)[:80]})"
            got = 0
        if left is not None:
            left -= got
        if not got:
            buf = work.text()
            if stop is not None:
                body = buf.rstrip().rstrip(b",")
                if body.strip():
                    try:
                        cols.add(_parse_events(body))
                    except _JSONError:  # damage in this part: its events one by one
                        cols.add(_salvage(body + b",{", cols)[0])
                return b""
            return _finish(buf, cols, path)
        events = _take(work, block_bytes, cols)
        if events is not None:
            cols.add(events)
            del events


class _Pending:
    """``[`` followed by the text not parsed yet, in a bytearray whose memory is kept from block
    to block (``n``: bytes in use, the ``[`` included)."""

    def __init__(self, text: bytes, block_bytes: int, reuse: _Pending | None = None) -> None:
        size = max(2 * block_bytes, len(text) + 1) + 2
        self.buf = reuse.buf if reuse is not None and len(reuse.buf) >= size else bytearray(size)
        self.buf[0] = 0x5B  # [
        self.buf[1:1 + len(text)] = text
        self.n = 1 + len(text)

    def read_from(self, f, size: int) -> int:
        """Appends up to ``size`` bytes read from ``f``; the count read (0 at the end)."""
        if self.n + size + 2 > len(self.buf):
            self.buf.extend(bytes(self.n + size + 2 - len(self.buf)))
        if type(f) is io.BufferedReader:
            with memoryview(self.buf) as mv:
                got = f.readinto(mv[self.n:self.n + size])
        else:
            block = f.read(size)
            got = len(block)
            self.buf[self.n:self.n + got] = block
        self.n += got or 0
        return got or 0

    def text(self) -> bytes:
        """The text waiting (without the ``[``)."""
        return bytes(self.buf[1:self.n])

    def keep_from(self, start: int) -> None:
        """Drops the text before ``start`` (an index in the buffer)."""
        rest = self.n - start
        self.buf[1:1 + rest] = self.buf[start:self.n]
        self.n = 1 + rest

    def replace(self, text: bytes) -> None:
        """The text waiting becomes ``text``."""
        if len(text) + 2 > len(self.buf):
            self.buf.extend(bytes(len(text) + 2 - len(self.buf)))
        self.buf[1:1 + len(text)] = text
        self.n = 1 + len(text)

    def decode_to(self, end: int) -> list:
        """The events of the text up to ``end`` (the index after an event's ``}``, whose next byte
        is a ``,`` or a space and is set to ``]`` while decoding): :func:`_decode_array`."""
        buf = self.buf
        saved = buf[end]
        buf[end] = 0x5D  # ]
        try:
            with memoryview(buf) as mv:
                return _decode_array(mv[:end + 1])
        finally:
            buf[end] = saved


def _processes(path: str, a0: int, workers: int | None) -> int:
    """Processes to read the file with: ``workers``, default one per usable core; at most
    :data:`MAX_WORKERS` and one per :data:`MIN_PART_BYTES` of events; 1 below
    :data:`PARALLEL_MIN_BYTES`."""
    size = os.path.getsize(path)
    if size < PARALLEL_MIN_BYTES or workers == 1:
        return 1
    if not workers:
        from whyidle.sampling.limits import own_usable_cores

        workers = int(own_usable_cores() + 1e-9) or 1
    return max(1, min(workers, MAX_WORKERS, (size - a0) // max(1, MIN_PART_BYTES)))


def _split_points(path: str, a0: int, workers: int | None, range_bytes: int | None = None) -> list[int]:
    """Offsets (of an event's ``{``), verified to be event starts, that split the array: into one
    range of about equal size per process (:func:`_processes`), or with ``range_bytes`` into
    ranges that shrink as the file is used up (:func:`_range_targets`; at least one range per
    process); [] when the file is too small or one process is asked for. A target inside an
    event larger than the search window gives no point (fewer, larger ranges)."""
    n = _processes(path, a0, workers)
    if n < 2:
        return []
    size = os.path.getsize(path)
    targets = _range_targets(a0, size, n, range_bytes) if range_bytes is not None else []
    if len(targets) < n - 1:  # at least one range per process
        targets = [a0 + (size - a0) * k // n for k in range(1, n)]
    import json

    decoder = json.JSONDecoder()
    points = []
    with open(path, "rb") as f:
        for target in targets:
            for window_bytes in (1 << 16, 4 << 20):  # most events are far smaller than the first
                f.seek(target)
                point = _event_start(f.read(window_bytes), decoder)
                if point is not None:
                    points.append(target + point)
                    break
    return sorted(set(points))


def _range_targets(start: int, end: int, processes: int, range_bytes: int) -> list[int]:
    """Where the ranges of a parallel read begin after ``start`` (offsets before ``end``): each
    range the bytes left over twice the processes, between a quarter of and four times
    ``range_bytes`` (guided self-scheduling: large ranges first, small ones last, so the
    processes end within a small range's decode of each other), at most :data:`MAX_RANGES`."""
    low, high = max(1, range_bytes // 4), 4 * range_bytes
    targets: list[int] = []
    pos = start
    while len(targets) < MAX_RANGES - 1:
        step = min(max((end - pos) // (2 * processes), low), high)
        if end - pos - step < low:  # no last range smaller than the smallest
            break
        pos += step
        targets.append(pos)
    return targets


def _event_start(window: bytes, decoder) -> int | None:
    """The offset in ``window`` of the first ``{`` after a ``},`` that starts a whole event followed
    by ``,`` or ``]`` (checked by parsing it), or None."""
    text = window.decode("latin-1")  # one char per byte: offsets stay exact
    for m in _CUT.finditer(window):
        pos = m.end()
        try:
            _obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            continue
        if text[end:end + 64].lstrip()[:1] in (",", "]"):
            return pos
    return None


#: Typical size of one byte range of a parallel read (:func:`_range_targets`: from 4× this down to
#: a quarter, the last ranges the smallest, so the processes end within ~5 ms of each other
#: whatever else loads the cores), large enough that the cost per range (its split point, its
#: string table, its columns sent back) stays ~1 %.
RANGE_BYTES = 8 * 1024 * 1024
#: Byte ranges at most (the claim tokens fill at most one pipe buffer).
MAX_RANGES = 4096


def _read_ranges(path: str, claims: int, bounds: list[int], stops: list, block_bytes: int) -> list[tuple]:
    """Reads ranges of ``path`` until none is left: each range index taken from the pipe
    ``claims`` (2 bytes each; all written before the processes started, so a read takes one
    whole index or finds the pipe empty). Returns ``[(index, raw columns, text after the
    array)]`` of the ranges this process read."""
    out = []
    work = None
    with open(path, "rb") as f:
        while True:
            token = os.read(claims, 2)
            if len(token) < 2:
                return out
            i = int.from_bytes(token, "little")
            cols = _Columns()
            f.seek(bounds[i])
            work = _Pending(b"", block_bytes, reuse=work)
            tail = _scan(f, b"", cols, block_bytes, path, None if stops[i] is None else stops[i] - bounds[i], work)
            out.append((i, cols.raw(), tail))


def _start_parallel(path: str, head: bytes, a0: int, points: list[int], block_bytes: int,
                    procs: int = 2) -> _ParallelRead:
    """Starts reading the byte ranges between ``a0``, the ``points`` (event starts) and the end
    with ``procs`` processes: forks ``procs - 1`` of them now, each taking the next range left
    (:func:`_read_ranges`) until none is, so a process slowed by other load takes fewer. A forked
    process imports nothing, sends its ranges' columns back through a pipe as raw array bytes
    (:func:`_send`) and ends without tearing down the interpreter (``os._exit``). This process
    joins in :meth:`_ParallelRead.finish`."""
    bounds = [a0, *points]
    stops: list[int | None] = [*points, None]
    claims, w = os.pipe()
    try:
        os.write(w, b"".join(i.to_bytes(2, "little") for i in range(len(bounds))))
    finally:
        os.close(w)
    run = _ParallelRead(path, head, bounds, stops, block_bytes, claims)
    try:
        for _ in range(min(procs, len(bounds)) - 1):
            out_r, out_w = os.pipe()
            with contextlib.suppress(AttributeError, OSError):  # Linux: 1 MiB a write, not 64 KiB
                import fcntl

                fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, 1 << 20)
            pid = os.fork()
            if pid == 0:  # the helper: read ranges, send them, exit at once
                os.close(out_r)
                _child(out_w, lambda: _read_ranges(path, claims, bounds, stops, block_bytes))
            os.close(out_w)
            run.children.append((pid, out_r))
    except BaseException:
        run.close(kill=True)
        raise
    return run


class _ParallelRead:
    """A parallel read under way (:func:`_start_parallel`)."""

    def __init__(self, path: str, head: bytes, bounds: list[int], stops: list, block_bytes: int, claims: int) -> None:
        self.path, self.head, self.bounds, self.stops, self.block_bytes = path, head, bounds, stops, block_bytes
        self.claims = claims  # the read end of the pipe of range indices
        self.children: list[tuple[int, int]] = []  # (pid, read end of its result pipe)

    def finish(self) -> TraceData:
        """Reads ranges here until none is left, takes the helpers' ranges, reads any range of a
        helper that died without sending it, and merges them in file order: the result equals one
        process reading the whole file. Errors: what reading a range raised (:class:`TraceError`,
        a JSON error), re-raised here."""
        results: dict[int, tuple] = {}
        done = False
        try:
            for i, raw, tail in _read_ranges(self.path, self.claims, self.bounds, self.stops, self.block_bytes):
                results[i] = (raw, tail)
            for _pid, out_r in self.children:
                try:
                    status, payload = _receive(out_r)
                except (EOFError, OSError, ValueError):  # died (killed, out of memory): its ranges are read below
                    continue
                if status == "error":
                    raise payload
                for i, raw, tail in payload:
                    results[i] = (raw, tail)
            done = True
        finally:
            self.close(kill=not done)
        bounds, stops = self.bounds, self.stops
        for i in range(len(bounds)):
            if i not in results:
                results[i] = _read_part(self.path, bounds[i], stops[i], self.block_bytes)
        return _assemble(self.path, self.head, results[len(bounds) - 1][1], [results[i][0] for i in range(len(bounds))])

    def close(self, kill: bool = False) -> None:
        """Closes the pipes and waits for the helpers (killed first with ``kill``: their work is
        not wanted when this process failed). Closing again does nothing."""
        if self.claims < 0:
            return
        os.close(self.claims)
        self.claims = -1
        for pid, out_r in self.children:
            os.close(out_r)
            if kill:
                import signal

                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.children = []

    def __del__(self) -> None:  # a read started and never finished (the caller failed first)
        self.close(kill=True)


def _read_part(path: str, start: int, stop: int | None, block_bytes: int) -> tuple[dict, bytes]:
    """The raw columns of the range from ``start`` to ``stop`` (the end of the array: None) and
    the text after the array."""
    cols = _Columns()
    with open(path, "rb") as f:
        f.seek(start)
        tail = _scan(f, b"", cols, block_bytes, path, None if stop is None else stop - start)
    return cols.raw(), tail


def _child(fd: int, work) -> None:
    """In a forked process: runs ``work()``, sends ``("ok", result)`` or ``("error", exception)``
    through ``fd`` and exits with ``os._exit`` (no interpreter teardown, no flushing of the
    parent's buffers). Never returns."""
    code = 0
    try:
        try:
            payload = ("ok", work())
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
            payload = ("error", exc)
        try:
            _send(fd, payload)
        except Exception:  # noqa: BLE001 - an exception that cannot be pickled: its text
            exc = payload[1]
            _send(fd, ("error", TraceError(f"reading a byte range failed ({type(exc).__name__}: {str(exc)[:200]})")))
    except BaseException:  # noqa: BLE001 - the parent sees the pipe end early and reads the ranges itself
        code = 1
    finally:
        os._exit(code)


def _send(fd: int, obj) -> None:
    """Writes ``obj`` to ``fd``: pickled with its arrays' memory out of band and written as is
    (lengths first), so no array is copied into the pickle."""
    import pickle
    import struct

    buffers: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = [m.nbytes for m in raws]
    with open(fd, "wb", buffering=0, closefd=True) as out:
        for chunk in (struct.pack(f"<QI{len(sizes)}Q", len(head), len(sizes), *sizes), head, *raws):
            with memoryview(chunk) as mv:
                mv = mv.cast("B")
                while len(mv):
                    mv = mv[out.write(mv):]


def _receive(fd: int):
    """Reads what :func:`_send` wrote to the other end of ``fd``. Errors: EOFError when the pipe
    ends early (the sender died)."""
    import pickle
    import struct

    with open(fd, "rb", buffering=0, closefd=False) as src:
        def exactly(n: int) -> bytearray:
            buf = bytearray(n)
            with memoryview(buf) as mv:
                got = 0
                while got < n:
                    k = src.readinto(mv[got:])
                    if not k:
                        raise EOFError("the pipe ended early")
                    got += k
            return buf

        head_len, count = struct.unpack("<QI", exactly(12))
        sizes = struct.unpack(f"<{count}Q", exactly(8 * count)) if count else ()
        head = exactly(head_len)
        buffers = [exactly(n) for n in sizes]
    return pickle.loads(head, buffers=buffers)


def _assemble(path: str, head: bytes, tail: bytes, parts: list[dict]) -> TraceData:
    """One :class:`TraceData` from the parts' raw columns: string and thread ids made global,
    columns concatenated and sorted by time."""
    index: dict[str, int] = {}
    tid_ids: dict = {}
    merged: dict[str, dict[str, list]] = {g: {} for g in ("gpu", "runtime", "cpu", "syncs")}
    pageable = []
    steps: list = []
    events = skipped = 0
    cut = None
    for part in parts:
        ids = np.asarray([index.setdefault(x, len(index)) for x in part["strings"]], dtype=np.int64)
        tid_map = {}  # a part's ids of named threads ("stream 7": negative, per part) -> the trace's
        for key, local in part["tids"].items():
            if local < 0 and isinstance(key, str):  # a negative number is a thread id as it is
                tid_map[local] = tid_ids.setdefault(key, -(len(tid_ids) + 1))
        for g in merged:
            for k, v in part[g].items():
                if k in ("name", "cat") and len(v):
                    v = ids[v]
                elif k == "tid" and len(v) and tid_map and (v < 0).any():
                    local = np.array(sorted(tid_map), dtype=np.int64)
                    at = np.clip(np.searchsorted(local, v), 0, len(local) - 1)
                    v = np.where(local[at] == v, np.array([tid_map[x] for x in local.tolist()])[at], v)
                merged[g].setdefault(k, []).append(v)
        pageable.append(part["pageable"])
        steps.extend(part["steps"])
        events += part["events"]
        skipped += part["skipped"]
        cut = cut or part["cut"]
    strings = [None] * len(index)
    for x, i in index.items():
        strings[i] = x
    cols = {}
    gpu_order = None
    for g, group in merged.items():
        arrays = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in group.items()}
        ts = arrays["ts"]
        if len(ts) > 1 and not (ts[1:] >= ts[:-1]).all():  # in time order already (GPU, runtime): kept
            order = np.argsort(ts, kind="stable")
            arrays = {k: v[order] for k, v in arrays.items()}
            if g == "gpu":
                gpu_order = order
        cols[g] = arrays
    flags = np.concatenate(pageable) if pageable else np.zeros(0, dtype=bool)
    if gpu_order is not None:
        flags = flags[gpu_order]
    meta = _meta(head, tail)
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    props = meta.get("deviceProperties")
    return TraceData(
        path=path, strings=strings, gpu=cols["gpu"], runtime=cols["runtime"], cpu=cols["cpu"], syncs=cols["syncs"],
        steps=sorted(steps, key=lambda st: st[1]), rank=_count(dist.get("rank")),
        world_size=_count(dist.get("world_size")),
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        device_properties=[p for p in props if isinstance(p, dict)] if isinstance(props, list) else [], events=events,
        base_ns=_count(meta.get("baseTimeNanoseconds")), pageable=flags, skipped=skipped, cut=cut,
    )


def _count(v) -> int | None:
    """``v`` when it is a non-negative int64 integer (a rank, a size, a time in ns), else None."""
    return v if type(v) is int and 0 <= v < _I64 else None


#: Cut candidates tried per block before reading more: a ``}, {`` inside a string (a kernel name)
#: or inside a nested object fails to parse and the previous one is tried.
MAX_CUT_TRIES = 8


def _take(work: _Pending, block_bytes: int, cols: _Columns) -> list | None:
    """Parses the complete events at the start of the text waiting in ``work`` and drops them from
    it: the events, or None when no cut parses yet (more data needed).

    A cut is a ``}`` followed by ``,`` and the next ``{``. A candidate inside a string or a nested
    object leaves unbalanced text, which never parses, so the first candidate from the end that
    parses is the right one. When none of :data:`MAX_CUT_TRIES` candidates parses in a buffer of a
    block or more, the buffer holds damage: its events are salvaged one by one (:func:`_salvage`)."""
    tries = 0
    buf, n = work.buf, work.n
    window = min(n - 1, 1 << 16)  # grown while it holds no cut
    pos = n
    while tries < MAX_CUT_TRIES:
        matches = list(_CUT.finditer(buf, max(1, pos - window), pos))
        if not matches:
            if pos - window <= 1:
                break
            window *= 4
            continue
        for m in reversed(matches):
            tries += 1
            try:
                events = work.decode_to(m.start() + 1)
            except _JSONError:
                if tries >= MAX_CUT_TRIES:
                    break
                continue
            work.keep_from(m.end())
            return events
        pos = matches[0].start()
    if n - 1 >= block_bytes and tries >= MAX_CUT_TRIES:
        events, rest = _salvage(work.text(), cols)
        work.replace(rest)
        return events
    if n - 1 > max(8 * block_bytes + (1 << 20), GIANT_BYTES):  # no cut in 33 MB: one giant event, or not events
        cols.skipped += 1
        cols.cut = "an event or text over 33 MB without an event boundary"
        work.replace(b"")
        return []
    return None


#: Cuts merged into one event candidate at most while salvaging (a cut inside a string or a nested
#: object); beyond it the text up to the next cut is left out as damaged.
MAX_MERGED_CUTS = 16


def _salvage(buf: bytes, cols: _Columns) -> tuple[list, bytes]:
    """The events of a damaged ``buf`` (bits flipped, junk inserted), parsed from cut to cut: a
    piece that does not parse is tried merged with the next ones (the cut was inside a string) up
    to :data:`MAX_MERGED_CUTS` of them, else it alone is left out and counted in ``cols.skipped``.
    Returns the events and the text after the last cut (the start of the next event)."""
    cuts = [(m.start(), m.end()) for m in _CUT.finditer(buf)]
    events: list = []
    start = i = 0
    while i < len(cuts):
        for j in range(i, min(i + MAX_MERGED_CUTS, len(cuts))):
            try:
                events.extend(_parse_events(buf[start:cuts[j][0] + 1], fast=False))
                break
            except _JSONError:
                continue
        else:
            j = i
            cols.skipped += 1
        start = cuts[j][1]
        i = j + 1
    return events, buf[start:]


def _finish(buf: bytes, cols: _Columns, path: str) -> bytes:
    """Parses the last events (up to the array's ``]``) and returns the text after the array. A
    damaged last block is salvaged (:func:`_salvage`); a file cut short (no ``]`` after the last
    events: a write killed mid-way) keeps the events before the cut, and ``cols.cut`` says so."""
    if not buf.strip():
        if cols.events or cols.cut:
            cols.cut = cols.cut or "the end of the file (no closing ]): cut short"
            return b""
        raise TraceError(f"{path}: truncated trace (the traceEvents array never ends)")
    tail = _close(buf, cols)
    if tail is not None:
        return tail
    events, rest = _salvage(buf, cols)
    cols.add(events)
    tail = _close(rest, cols) if rest.strip() else None
    if tail is not None:
        return tail
    if not cols.events:
        raise TraceError(f"{path}: invalid or truncated JSON in traceEvents")
    cols.cut = cols.cut or "the end of the file (no closing ]): cut short"
    if rest.strip():
        cols.skipped += 1  # the last, incomplete event
    return b""


def _close(buf: bytes, cols: _Columns) -> bytes | None:
    """Adds the events of ``buf`` up to the array's closing ``]`` (tried from the end backwards)
    and returns the text after it; None when no ``]`` closes parsable events."""
    pos = len(buf)
    for _ in range(64):
        pos = buf.rfind(b"]", 0, pos)
        if pos < 0:
            break
        body = buf[:pos].strip()
        try:
            events = _parse_events(body) if body else []
        except _JSONError:
            continue
        cols.add(events)
        return buf[pos + 1:]
    return None


def _meta(head: bytes, tail: bytes) -> dict:
    """The keys before and after the ``traceEvents`` array (best effort; {} when unreadable)."""
    out: dict = {}
    h = head.strip()
    if h.startswith(b"{"):
        body = h[1:].strip().rstrip(b",")
        try:
            out.update(_loads(b"{" + body + b"}"))
        except (*_JSONError, RecursionError):
            pass
    t = tail.strip()
    if t.startswith(b","):
        try:
            out.update(_loads(b"{" + t[1:]))
        except (*_JSONError, RecursionError):
            pass
    return out


def _check_json(text: bytes, path: str) -> None:
    """Raises the right one-line error for a document without ``traceEvents``."""
    s = text.strip()
    if not s:
        raise TraceError(f"{path}: empty file")
    try:
        _loads(s)
    except _JSONError as exc:
        raise TraceError(f"{path}: invalid JSON ({str(exc).splitlines()[0][:120]})") from None
    except RecursionError:
        raise TraceError(f"{path}: invalid JSON (nested too deeply)") from None


def read_job(path: str, rank: int | None = None) -> list[TraceData]:
    """Every trace of a file or folder, sorted by rank (files without a rank by name); with
    ``rank``, only that rank's. Errors: :class:`TraceError`."""
    traces = [read_trace(p) for p in trace_files(path)]
    traces.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.path))
    if rank is not None:
        chosen = [t for t in traces if t.rank == rank]
        if not chosen:
            have = sorted({t.rank for t in traces if t.rank is not None})
            raise TraceError(f"{path}: no trace of rank {rank} (ranks here: {have or 'none recorded'})")
        return chosen
    return traces


def separate_runs(traces: list) -> bool:
    """Whether the traces of a folder (anything with a ``rank``: :class:`TraceData`, rank
    summaries) come from separate runs, not from one job's ranks: more than one, and one without a ``distributedInfo`` rank or two with the same rank (a profiler's
    ``tensorboard_trace_handler`` folder that a script wrote to twice)."""
    ranks = [t.rank for t in traces]
    return len(traces) > 1 and (None in ranks or len(set(ranks)) < len(ranks))


def loader_kind(traces: list[TraceData]) -> str | None:
    """Which DataLoader iterator the traces show: ``"single"`` (``_SingleProcessDataLoaderIter``,
    num_workers=0), ``"multi"`` (``_MultiProcessingDataLoaderIter``), or None."""
    for t in traces:
        text = " ".join(s for s in t.strings if "DataLoaderIter" in s)
        if "_SingleProcessDataLoaderIter" in text:
            return "single"
        if "_MultiProcessingDataLoaderIter" in text:
            return "multi"
    return None
