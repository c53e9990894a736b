"""Streaming reader of PyTorch profiler (Kineto) Chrome traces into :class:`TraceData` columns.

A trace is one JSON object whose ``traceEvents`` array holds every event. Reading it whole would
build one Python dict per event (gigabytes for a 500 MB trace). Instead the file (``.json`` or
``.json.gz``) is read in blocks of :data:`BLOCK_BYTES`; each block is cut after the last complete
event (a ``}`` followed by ``,`` and the ``{`` of the next event, checked by parsing), the events of
the block are parsed at once with orjson and reduced to columns, and the dicts are dropped. Peak
memory is a few blocks plus the columns. The keys around ``traceEvents`` (``deviceProperties``,
``distributedInfo``, ...) are parsed from the text before and after the array.

Errors: :class:`TraceError` with a one-line message for unreadable input (truncated gzip, invalid
JSON, a JSON document that is not a trace).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib

import numpy as np

from whyidle.record.trace_data import COPY_KINDS, KERNEL, MEMCPY, MEMSET, TraceData

try:
    import orjson

    _loads = orjson.loads
    _JSONError: tuple = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is a dependency; stdlib json is the fallback
    import json

    _loads = json.loads
    _JSONError = (ValueError,)

#: Bytes read per block: large enough that parsing dominates, small enough that one block's
#: dicts (~5× its size) stay far below the file size.
BLOCK_BYTES = 16 * 1024 * 1024

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


def _open(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


class _Columns:
    """Accumulates the columns of one trace while blocks are parsed."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.index: dict[str, int] = {}
        self.gpu = {k: [] for k in ("ts", "dur", "kind", "device", "stream", "name", "correlation", "bytes", "copy")}
        self.pageable: list[bool] = []
        self.runtime = {k: [] for k in ("ts", "dur", "name", "tid", "correlation")}
        self.cpu = {k: [] for k in ("ts", "dur", "name", "tid", "cat")}
        self.syncs = {k: [] for k in ("ts", "dur", "name", "stream")}
        self.steps: list[tuple[int, float, float]] = []
        self.events = 0
        self.tids: dict = {}

    def intern(self, s) -> int:
        s = str(s)
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.strings)
            self.strings.append(s)
        return i

    def tid(self, t) -> int:
        i = self.tids.get(t)
        if i is None:
            try:
                i = int(t)
            except (TypeError, ValueError):
                i = -(len(self.tids) + 1)  # "stream 7" style thread names: a stable negative id
            self.tids[t] = i
        return i

    def add(self, events: list) -> None:
        self.events += len(events)
        gpu, rt, cpu, syn = self.gpu, self.runtime, self.cpu, self.syncs
        intern = self.intern
        for e in events:
            if e.get("ph") != "X":
                continue
            cat = e.get("cat")
            ts = e.get("ts")
            if ts is None:
                continue
            dur = e.get("dur") or 0
            kind = GPU_CATS.get(cat)
            if kind is not None:
                args = e.get("args") or {}
                name = e.get("name") or ""
                gpu["ts"].append(ts)
                gpu["dur"].append(dur)
                gpu["kind"].append(kind)
                dev = args.get("device")
                gpu["device"].append(dev if isinstance(dev, int) else (e.get("pid") if isinstance(e.get("pid"), int) else 0))
                stream = args.get("stream")
                gpu["stream"].append(stream if isinstance(stream, int) else -1)
                gpu["name"].append(intern(name))
                gpu["correlation"].append(args.get("correlation", -1))
                gpu["bytes"].append(args.get("bytes", -1) if kind != KERNEL else -1)
                copy = -1
                if kind == MEMCPY:
                    for i, k in enumerate(COPY_KINDS):
                        if k in name:
                            copy = i
                            break
                gpu["copy"].append(copy)
                self.pageable.append(kind == MEMCPY and "Pageable" in name)
            elif cat in RUNTIME_CATS:
                args = e.get("args") or {}
                rt["ts"].append(ts)
                rt["dur"].append(dur)
                rt["name"].append(intern(e.get("name") or ""))
                rt["tid"].append(self.tid(e.get("tid")))
                rt["correlation"].append(args.get("correlation", -1))
            elif cat in CPU_CATS:
                name = e.get("name") or ""
                cpu["ts"].append(ts)
                cpu["dur"].append(dur)
                cpu["name"].append(intern(name))
                cpu["tid"].append(self.tid(e.get("tid")))
                cpu["cat"].append(intern(cat))
                if name.startswith("ProfilerStep#"):
                    try:
                        self.steps.append((int(name[13:]), float(ts), float(dur)))
                    except ValueError:
                        pass
            elif cat == "cuda_sync":
                args = e.get("args") or {}
                syn["ts"].append(ts)
                syn["dur"].append(dur)
                syn["name"].append(intern(args.get("cuda_sync_kind") or e.get("name") or ""))
                stream = args.get("stream")
                syn["stream"].append(stream if isinstance(stream, int) else -1)

    def arrays(self, group: dict) -> dict[str, np.ndarray]:
        out = {}
        for k, v in group.items():
            dtype = np.float64 if k in ("ts", "dur") else np.int64
            out[k] = np.asarray(v, dtype=dtype)
        order = np.argsort(out["ts"], kind="stable") if len(out["ts"]) else None
        if order is not None:
            out = {k: v[order] for k, v in out.items()}
        return out


def _parse_events(chunk: bytes) -> list:
    return _loads(b"[" + chunk + b"]")


def read_trace(path: str, block_bytes: int = BLOCK_BYTES) -> TraceData:
    """Reads one trace file into columns (see :mod:`whyidle.record.trace_data`).

    Errors: :class:`TraceError` (one line) for a missing, truncated or invalid file, or a JSON
    document without ``traceEvents``.
    """
    cols = _Columns()
    head = b""
    tail = b""
    try:
        with _open(path) as f:
            buf = b""
            found = False
            while not found:  # find the start of the array; keep the text before it
                block = f.read(block_bytes)
                if not block:
                    break
                buf += block
                m = _EVENTS_KEY.search(buf)
                if m:
                    head, buf, found = buf[:m.start()], buf[m.end():], True
                elif len(buf) > 64 * block_bytes:
                    break
            if not found:
                _check_json(head or buf, path)
                raise TraceError(f"{path}: not a PyTorch profiler trace (no \"traceEvents\" array)")
            eof = False
            while True:
                if not eof:
                    block = f.read(block_bytes)
                    if block:
                        buf += block
                    else:
                        eof = True
                if eof:
                    tail = _finish(buf, cols, path)
                    break
                events, rest = _take(buf, block_bytes, path)
                if events is not None:
                    cols.add(events)
                    buf = rest
    except TraceError:
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: truncated or corrupt gzip file ({exc})") from None
    except _JSONError as exc:
        raise TraceError(f"{path}: invalid JSON ({str(exc).splitlines()[0][:120]})") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    meta = _meta(head, tail)
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    return TraceData(
        path=path, strings=cols.strings, gpu=cols.arrays(cols.gpu), runtime=cols.arrays(cols.runtime),
        cpu=cols.arrays(cols.cpu), syncs=cols.arrays(cols.syncs), steps=sorted(cols.steps, key=lambda s: s[1]),
        rank=dist.get("rank"), world_size=dist.get("world_size"), backend=dist.get("backend"),
        device_properties=meta.get("deviceProperties") or [], events=cols.events,
        pageable=_sorted_like(cols.pageable, cols.gpu["ts"]),
    )


def _sorted_like(values: list, ts: list) -> np.ndarray:
    arr = np.asarray(values, dtype=bool)
    if len(ts):
        arr = arr[np.argsort(np.asarray(ts, dtype=np.float64), kind="stable")]
    return arr


#: Cut candidates tried per block before reading more: a ``}, {`` inside a string (a kernel name)
#: or inside a nested object fails to parse and the previous one is tried.
MAX_CUT_TRIES = 8


def _take(buf: bytes, block_bytes: int, path: str) -> tuple[list | None, bytes]:
    """Parses the complete events at the start of ``buf``: ``(events, the rest)``, or
    ``(None, buf)`` when no cut parses yet (more data needed).

    A cut is a ``}`` followed by ``,`` and the next ``{``. A candidate inside a string or a nested
    object leaves unbalanced text, which never parses, so the first candidate from the end that
    parses is the right one. Errors: :class:`TraceError` when a buffer of many blocks holds no
    parsable prefix (the JSON is invalid)."""
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
    if len(buf) > 8 * block_bytes + (1 << 20):
        _parse_events(buf[:max(0, buf.rfind(b"}") + 1)])  # raises the JSON error to report
        raise TraceError(f"{path}: invalid JSON in traceEvents")
    return None, buf


def _finish(buf: bytes, cols: _Columns, path: str) -> bytes:
    """Parses the last events (up to the array's ``]``) and returns the text after the array."""
    stripped = buf.rstrip()
    if not stripped:
        raise TraceError(f"{path}: truncated trace (the traceEvents array never ends)")
    # the array ends at a ']' followed by the rest of the object; try from the end backwards
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
    raise TraceError(f"{path}: invalid or truncated JSON in traceEvents")


def _meta(head: bytes, tail: bytes) -> dict:
    """The keys before and after the ``traceEvents`` array (best effort; {} when unreadable)."""
    out: dict = {}
    h = head.strip()
    if h.startswith(b"{"):
        body = h[1:].strip().rstrip(b",")
        try:
            out.update(_loads(b"{" + body + b"}"))
        except _JSONError:
            pass
    t = tail.strip()
    if t.startswith(b","):
        try:
            out.update(_loads(b"{" + t[1:]))
        except _JSONError:
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
