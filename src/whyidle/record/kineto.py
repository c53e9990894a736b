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

A large uncompressed file is split into byte ranges at verified event boundaries, each read the
same way by its own process (this one and forked ones); the ranges' columns are merged (strings
and thread ids made global, sorted by time) into what one process reading the whole file gives.

Errors: :class:`TraceError` with a one-line message for unreadable input (truncated gzip, invalid
JSON, a JSON document that is not a trace).
"""

from __future__ import annotations

import gc
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
#: structs stay far below the file size.
BLOCK_BYTES = 4 * 1024 * 1024

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
    if fast:
        try:
            return _FAST_DECODER.decode(text)
        except msgspec.ValidationError:  # a field out of its checked type or range: the checks below
            pass
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError:  # an event of another shape (the typed decoder stops there)
        try:
            return _lenient(msgspec.json.decode(text))
        except msgspec.DecodeError as exc:  # and beyond standard JSON further on
            error = exc
    except msgspec.DecodeError as exc:
        error = exc
    import json

    try:
        items = json.loads(bytes(text).decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        raise error from None  # not JSON
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
    """Reads one trace file into columns (see :mod:`whyidle.record.trace_data`).

    An uncompressed file of at least :data:`PARALLEL_MIN_BYTES` is split into byte ranges at
    verified event boundaries, read by ``workers`` processes at once (this one and forked ones;
    default: one per usable core, at most one per :data:`MIN_PART_BYTES` and :data:`MAX_WORKERS`);
    ``workers=1`` reads it in this process alone. A gzip file is read sequentially (it cannot be
    split).

    Errors: :class:`TraceError` (one line) for a missing, truncated or invalid file, or a JSON
    document without ``traceEvents``.
    """
    with gc_paused():
        try:
            with _open(path) as f:
                head, buf, a0 = _find_array(f, block_bytes, path)
                parts = _split_points(path, a0, workers) if not _is_gzip(path) else []
                if parts:
                    f.close()
                    return _read_parallel(path, head, a0, parts, block_bytes)
                cols = _Columns()
                tail = _scan(f, buf, cols, block_bytes, path, None)
            return _assemble(path, head, tail, [cols.raw()])
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


#: Uncompressed traces from this size on are read by several processes, each byte range at least
#: :data:`MIN_PART_BYTES` (below it, starting a process costs more than it saves: a fork and the
#: columns sent back are ~10-30 ms, a 16 MB range decodes in ~50 ms on one core).
PARALLEL_MIN_BYTES = 32 * 1024 * 1024
MIN_PART_BYTES = 16 * 1024 * 1024
#: Byte ranges at most (one process each).
MAX_WORKERS = 64


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


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
        if len(buf) > 64 * block_bytes:
            break
    _check_json(buf, path)
    raise TraceError(f"{path}: not a PyTorch profiler trace (no \"traceEvents\" array)")


def _scan(f, buf: bytes, cols: _Columns, block_bytes: int, path: str, stop: int | None) -> bytes:
    """Reads events from ``f`` (``buf`` already read) into ``cols``. With ``stop`` (bytes left to
    read in this part), the part ends right after an event and its ``,``; without, at the end of
    the array, whose following text is returned.

    The text waiting to be parsed lives in one :class:`_Pending` buffer, read into in place and
    decoded through a memoryview: no block is copied or allocated anew on the way."""
    left = stop
    work = _Pending(buf, block_bytes)
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

    def __init__(self, text: bytes, block_bytes: int) -> None:
        self.buf = bytearray(max(2 * block_bytes, len(text) + 1) + 2)
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


def _split_points(path: str, a0: int, workers: int | None) -> list[int]:
    """Offsets (of an event's ``{``) that split the array into parts of about equal size, verified
    to be event starts; [] when the file is too small or one process is asked for."""
    size = os.path.getsize(path)
    from whyidle.sampling.limits import own_usable_cores

    n = min(workers or int(own_usable_cores() + 1e-9) or 1, MAX_WORKERS, max(1, (size - a0) // max(1, MIN_PART_BYTES)))
    if n < 2 or size < PARALLEL_MIN_BYTES:
        return []
    import json

    decoder = json.JSONDecoder()
    points = []
    with open(path, "rb") as f:
        for k in range(1, n):
            target = a0 + (size - a0) * k // n
            f.seek(target)
            window = f.read(4 * 1024 * 1024).decode("latin-1")  # one char per byte: offsets stay exact
            for m in _CUT.finditer(window.encode("latin-1")):
                pos = m.end()
                try:
                    _obj, end = decoder.raw_decode(window, pos)
                except ValueError:
                    continue
                rest = window[end:end + 64].lstrip()
                if rest[:1] in (",", "]"):
                    points.append(target + pos)
                    break
    points = sorted(set(points))
    return points if len(points) == n - 1 else []


def _read_part(path: str, start: int, stop: int | None, block_bytes: int) -> tuple[dict, bytes]:
    gc.disable()
    cols = _Columns()
    with open(path, "rb") as f:
        f.seek(start)
        tail = _scan(f, b"", cols, block_bytes, path, None if stop is None else stop - start)
    return cols.raw(), tail


def _read_parallel(path: str, head: bytes, a0: int, points: list[int], block_bytes: int) -> TraceData:
    """Reads the byte ranges between ``a0`` and the ``points`` (event starts) and the end: the
    first in this process, each other in a forked process, all at once; one :class:`TraceData`."""
    import concurrent.futures
    import multiprocessing

    bounds = [a0, *points]
    stops: list[int | None] = [*points, None]
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(len(bounds) - 1, mp_context=ctx) as pool:
        futures = [pool.submit(_read_part, path, b, e, block_bytes) for b, e in zip(bounds[1:], stops[1:])]
        first = _read_part(path, bounds[0], stops[0], block_bytes)
        results = [first] + [f.result() for f in futures]
    return _assemble(path, head, results[-1][1], [r[0] for r in results])


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
        tid_map = {}
        for key, local in part["tids"].items():
            if local < 0:
                tid_map[local] = tid_ids.setdefault(key, -(len(tid_ids) + 1))
        for g in merged:
            for k, v in part[g].items():
                if k in ("name", "cat") and len(v):
                    v = ids[v]
                elif k == "tid" and len(v) and tid_map and (v < 0).any():
                    lut = np.zeros(max(-x for x in tid_map) + 1, dtype=np.int64)
                    for local, glob in tid_map.items():
                        lut[-local] = glob
                    v = np.where(v < 0, lut[np.clip(-v, 0, len(lut) - 1)], v)
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
    for g, group in merged.items():
        arrays = {k: np.concatenate(v) for k, v in group.items()}
        order = np.argsort(arrays["ts"], kind="stable")
        cols[g] = {k: v[order] for k, v in arrays.items()}
        if g == "gpu":
            gpu_order = order
    flags = np.concatenate(pageable)[gpu_order] if pageable else np.zeros(0, dtype=bool)
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
    if n - 1 > 8 * block_bytes + (1 << 20):  # no cut at all in 33 MB: one giant event, or not events
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
