"""Streaming reader of PyTorch profiler (Kineto) Chrome traces into :class:`TraceData` columns.

A trace is one JSON object whose ``traceEvents`` array holds every event. Reading it whole would
build one Python dict per event (gigabytes for a 500 MB trace). Instead the file (``.json`` or
``.json.gz``) is read in blocks of :data:`BLOCK_BYTES`; each block is cut after the last complete
event (a ``}`` followed by ``,`` and the ``{`` of the next event, checked by parsing), the events of
the block are decoded at once with msgspec into small typed structs holding only the fields
whyidle reads (every other key is skipped by the decoder), reduced to columns, and dropped. The
garbage collector is paused while reading: the structs are not cyclic, and collections triggered
by millions of allocations cost more than the decoding itself. Peak memory is a few blocks plus
the columns. The keys around ``traceEvents`` (``deviceProperties``, ``distributedInfo``, ...) are
parsed from the text before and after the array.

Errors: :class:`TraceError` with a one-line message for unreadable input (truncated gzip, invalid
JSON, a JSON document that is not a trace).
"""

from __future__ import annotations

import gc
import gzip
import os
import re
import zlib
from typing import Any

import msgspec
import numpy as np

from whyidle.record.trace_data import COPY_KINDS, KERNEL, MEMCPY, MEMSET, TraceData

_JSONError: tuple = (msgspec.DecodeError,)
_loads = msgspec.json.decode

#: Bytes read per block: large enough that decoding dominates, small enough that one block's
#: structs stay far below the file size.
BLOCK_BYTES = 4 * 1024 * 1024


class _Args(msgspec.Struct, gc=False):
    """The ``args`` fields whyidle reads (any JSON type: producers differ)."""

    device: Any = None
    stream: Any = None
    correlation: Any = -1
    bytes: Any = -1
    cuda_sync_kind: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")


class _Event(msgspec.Struct, gc=False):
    """The event fields whyidle reads; unknown keys are skipped by the decoder. ``cat``, ``name``,
    ``ts`` and ``dur`` are typed, so the decoder checks them (in C); a block with an event of
    another shape is read leniently (:func:`_lenient`), that event left out."""

    ph: Any = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = 0
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


_DECODER = msgspec.json.Decoder(list[_Event])
#: Stands for an event that could not be read (not an object, a field of the wrong JSON type):
#: :class:`_Columns` counts it as skipped.
_BAD = _Event(ph="unreadable")
#: Bounds of a usable ``ts`` (µs; epoch µs are ~1.8e15 in 2027) and ``dur`` (µs: 115 days).
_TS_LIMIT = 1e17
_DUR_LIMIT = 1e13
_I64 = 2 ** 63

GPU_CATS = {"kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
            "gpu_memset": MEMSET, "Memset": MEMSET}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver", "hip_runtime", "hip_driver"}
CPU_CATS = {"cpu_op", "Operator", "user_annotation", "python_function", "Trace"}

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


class _Columns:
    """Accumulates the columns of one trace while blocks are parsed."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.index: dict[str, int] = {}
        self.gpu = {k: [] for k in ("ts", "dur", "kind", "device", "stream", "name", "correlation", "bytes", "copy", "group")}
        self.pageable: list[bool] = []
        self.runtime = {k: [] for k in ("ts", "dur", "name", "tid", "correlation")}
        self.cpu = {k: [] for k in ("ts", "dur", "name", "tid", "cat")}
        self.syncs = {k: [] for k in ("ts", "dur", "name", "stream")}
        self.steps: list[tuple[int, float, float]] = []
        self.events = 0
        self.skipped = 0  # events with unusable fields: not an object, ts/dur not a number in range
        self.cut: str | None = None  # where the readable events end early (a file cut short), or None
        self.tids: dict = {}

    def intern(self, s) -> int:
        s = str(s)
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.strings)
            self.strings.append(s)
        return i

    def tid(self, t) -> int:
        try:
            i = self.tids.get(t)
        except TypeError:  # a list or object for a thread id
            t = repr(t)[:100]
            i = self.tids.get(t)
        if i is None:
            try:
                i = int(t)
                if not -_I64 < i < _I64:
                    raise ValueError(t)
            except (TypeError, ValueError, OverflowError):
                i = -(len(self.tids) + 1)  # "stream 7" style thread names: a stable negative id
            self.tids[t] = i
        return i

    def add(self, events: list) -> None:
        self.events += len(events)
        gpu, rt, cpu, syn = self.gpu, self.runtime, self.cpu, self.syncs
        intern = self.intern
        no_args = _Args()
        lim, dlim = _TS_LIMIT, _DUR_LIMIT
        for e in events:
            if e.ph != "X":
                if e is _BAD:
                    self.skipped += 1
                continue
            cat = e.cat
            ts = e.ts
            if ts is None:
                continue
            dur = e.dur or 0
            if not (-lim < ts < lim and 0 <= dur < dlim):  # NaN fails too
                self.skipped += 1
                continue
            name = e.name or ""
            kind = GPU_CATS.get(cat)
            if kind is not None:
                args = e.args or no_args
                gpu["ts"].append(ts)
                gpu["dur"].append(dur)
                gpu["kind"].append(kind)
                dev = args.device
                gpu["device"].append(dev if isinstance(dev, int) and 0 <= dev < 1 << 20 else
                                     (e.pid if isinstance(e.pid, int) and 0 <= e.pid < 1 << 20 else 0))
                stream = args.stream
                gpu["stream"].append(stream if isinstance(stream, int) and -_I64 < stream < _I64 else -1)
                gpu["name"].append(intern(name))
                corr = args.correlation
                gpu["correlation"].append(corr if isinstance(corr, int) and -_I64 < corr < _I64 else -1)
                nbytes = args.bytes
                gpu["bytes"].append(nbytes if kind != KERNEL and isinstance(nbytes, int) and 0 <= nbytes < _I64 else -1)
                copy = -1
                if kind == MEMCPY:
                    for i, k in enumerate(COPY_KINDS):
                        if k in name:
                            copy = i
                            break
                gpu["copy"].append(copy)
                group = args.group_size
                gpu["group"].append(group if kind == KERNEL and isinstance(group, int) and 0 < group < 1 << 31 else -1)
                self.pageable.append(kind == MEMCPY and "Pageable" in name)
            elif cat in RUNTIME_CATS:
                corr = (e.args or no_args).correlation
                rt["ts"].append(ts)
                rt["dur"].append(dur)
                rt["name"].append(intern(name))
                rt["tid"].append(self.tid(e.tid))
                rt["correlation"].append(corr if isinstance(corr, int) and -_I64 < corr < _I64 else -1)
            elif cat in CPU_CATS:
                cpu["ts"].append(ts)
                cpu["dur"].append(dur)
                cpu["name"].append(intern(name))
                cpu["tid"].append(self.tid(e.tid))
                cpu["cat"].append(intern(cat))
                if name.startswith("ProfilerStep#"):
                    try:
                        self.steps.append((int(name[13:]), float(ts), float(dur)))
                    except ValueError:
                        pass
            elif cat == "cuda_sync":
                args = e.args or no_args
                syn["ts"].append(ts)
                syn["dur"].append(dur)
                syn["name"].append(intern(args.cuda_sync_kind or name))
                stream = args.stream
                syn["stream"].append(stream if isinstance(stream, int) and -_I64 < stream < _I64 else -1)

    def raw(self) -> dict:
        """The columns as numpy arrays in reading order, with this reader's string and thread
        tables (merged across parallel parts by :func:`_assemble`)."""
        def arrays(group: dict) -> dict[str, np.ndarray]:
            return {k: np.asarray(v, dtype=np.float64 if k in ("ts", "dur") else np.int64) for k, v in group.items()}

        return {"strings": self.strings, "tids": self.tids, "gpu": arrays(self.gpu), "runtime": arrays(self.runtime),
                "cpu": arrays(self.cpu), "syncs": arrays(self.syncs),
                "pageable": np.asarray(self.pageable, dtype=bool), "steps": self.steps, "events": self.events,
                "skipped": self.skipped, "cut": self.cut}


def _parse_events(chunk: bytes) -> list:
    """The events of ``chunk`` (the text between ``[`` and ``]``). Fast path: msgspec into
    :class:`_Event`. Text that is valid JSON but has an event of an unexpected shape, or that holds
    what Python's JSON reader accepts beyond the standard (NaN, Infinity) or invalid UTF-8, is read
    leniently (:func:`_lenient`). Errors: ``msgspec.DecodeError`` when it is not JSON at all (the
    block cutter then tries another cut)."""
    text = b"[" + chunk + b"]"
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
        items = json.loads(text.decode("utf-8", "replace"))
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

    An uncompressed file of at least :data:`PARALLEL_MIN_BYTES` is split at event boundaries and
    read by ``workers`` processes (default: the CPU count, at most :data:`MAX_WORKERS`); a gzip
    file is read sequentially (it cannot be split).

    Errors: :class:`TraceError` (one line) for a missing, truncated or invalid file, or a JSON
    document without ``traceEvents``.
    """
    was_enabled = gc.isenabled()
    gc.disable()
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
    finally:
        if was_enabled:
            gc.enable()


#: Uncompressed traces from this size on are read by several processes (below it, starting them
#: costs more than it saves).
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
MAX_WORKERS = 4


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
    the array, whose following text is returned."""
    left = stop
    while True:
        size = block_bytes if left is None else min(block_bytes, left)
        try:
            block = f.read(size) if size > 0 else b""
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # the data before the damage is usable
            cols.cut = f"a damaged gzip stream ({str(exc)[:80]})"
            block = b""
        if left is not None:
            left -= len(block)
        if block:
            buf += block
        else:
            if stop is not None:
                body = buf.rstrip().rstrip(b",")
                if body.strip():
                    try:
                        cols.add(_parse_events(body))
                    except _JSONError:  # damage in this part: its events one by one
                        cols.add(_salvage(body + b",{", cols)[0])
                return b""
            return _finish(buf, cols, path)
        events, rest = _take(buf, block_bytes, cols)
        if events is not None:
            cols.add(events)
            buf = rest


def _split_points(path: str, a0: int, workers: int | None) -> list[int]:
    """Offsets (of an event's ``{``) that split the array into parts of about equal size, verified
    to be event starts; [] when the file is too small or one process is asked for."""
    size = os.path.getsize(path)
    from whyidle.sampling.limits import own_usable_cores

    n = min(workers or int(own_usable_cores() + 1e-9) or 1, MAX_WORKERS)
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
    import concurrent.futures
    import multiprocessing

    bounds = [a0, *points]
    stops: list[int | None] = [*points, None]
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(len(bounds), mp_context=ctx) as pool:
        results = list(pool.map(_read_part, [path] * len(bounds), bounds, stops, [block_bytes] * len(bounds)))
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
                elif k == "tid" and len(v) and tid_map:
                    v = np.asarray([tid_map.get(int(x), int(x)) for x in v], dtype=np.int64) if (v < 0).any() else v
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


def _take(buf: bytes, block_bytes: int, cols: _Columns) -> tuple[list | None, bytes]:
    """Parses the complete events at the start of ``buf``: ``(events, the rest)``, or
    ``(None, buf)`` when no cut parses yet (more data needed).

    A cut is a ``}`` followed by ``,`` and the next ``{``. A candidate inside a string or a nested
    object leaves unbalanced text, which never parses, so the first candidate from the end that
    parses is the right one. When none of :data:`MAX_CUT_TRIES` candidates parses in a buffer of a
    block or more, the buffer holds damage: its events are salvaged one by one (:func:`_salvage`)."""
    tries = 0
    window = min(len(buf), 1 << 20)
    pos = len(buf)
    while tries < MAX_CUT_TRIES:
        matches = list(_CUT.finditer(buf, max(0, pos - window), pos))
        if not matches:
            if pos - window <= 0:
                break
            window *= 4
            continue
        for m in reversed(matches):
            tries += 1
            try:
                return _parse_events(buf[:m.start() + 1]), buf[m.end():]
            except _JSONError:
                if tries >= MAX_CUT_TRIES:
                    break
        pos = matches[0].start()
    if len(buf) >= block_bytes and tries >= MAX_CUT_TRIES:
        return _salvage(buf, cols)
    if len(buf) > 8 * block_bytes + (1 << 20):  # no cut at all in 33 MB: one giant event, or not events
        cols.skipped += 1
        cols.cut = "an event or text over 33 MB without an event boundary"
        return [], b""
    return None, buf


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
                events.extend(_parse_events(buf[start:cuts[j][0] + 1]))
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
