"""Kineto trace events decoded into small typed structs and reduced to :class:`TraceData` columns.

Two struct sets, one per way of checking the fields whyidle reads:

* :class:`_FastEvent` (with small structs for the other phases, :data:`_OTHER_PHASES`):
  every check (a number in range, an int64 id, a string) is a msgspec constraint, applied by the
  decoder in its one pass over the text; :meth:`_Columns.add_checked` then takes each column with
  one C-level pass (``map`` of an attribute getter into ``numpy.fromiter``), no per-event code.
* :class:`_Event`: any JSON type per field, checked event by event in :meth:`_Columns.add` (an
  unusable ``ts``/``dur`` left out and counted, an id out of range read as -1). Text where any
  event fails the checks of the first set is decoded into this one: the same columns, slower.

Read by :mod:`whyidle.record.kineto` (the file, its blocks and byte ranges).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from whyidle.record.trace_data import COPY_KINDS, KERNEL, MEMCPY, MEMSET


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

#: The checks of :meth:`_Columns.add` as msgspec constraints, so that the decoder applies them (in
#: C, in its one pass over the text) and the columns are taken without a per-event check: an id
#: (stream, correlation) is an int64, ``Group size`` 1 .. 2^31-1, a byte count 0 .. 2^63-1, a
#: device 0 .. 2^20-1, ``ts`` within ±1e17 µs and ``dur`` 0 .. 1e13 µs (NaN and ±Infinity are
#: not JSON: such text takes the lenient path). A chunk where any event breaks one is decoded
#: again into :class:`_Event` and checked per event (the same result, slower).
_Id = Annotated[int, msgspec.Meta(ge=-(2 ** 63) + 1, le=2 ** 63 - 1)]
_MISSING_TS = float("nan")  # a ``ts`` key absent (JSON cannot hold NaN; null fails the decoder)


class _FastArgs(msgspec.Struct, gc=False, frozen=True):
    """:class:`_Args` with each field's usable type and range checked by the decoder; -1 (or
    None) when absent."""

    device: Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)] = -1
    stream: _Id | str | None = -1  # ROCm writes "0x0" on runtime calls: -1 (unknown) in a column
    correlation: _Id = -1
    bytes: Annotated[int, msgspec.Meta(ge=0, le=2 ** 63 - 1)] = -1
    cuda_sync_kind: str | None = None
    group_size: Annotated[int, msgspec.Meta(gt=0, lt=1 << 31)] = msgspec.field(default=-1, name="Group size")


_NO_FAST_ARGS = _FastArgs()


class _FastEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """An ``X`` (complete) event: :class:`_Event` with the checks of :meth:`_Columns.add` done by
    the decoder (see :data:`_Id`), read into columns by :meth:`_Columns.add_checked` without
    per-event code. Events of the other phases of the Chrome trace format decode into small
    structs of their own (:data:`_OTHER_PHASES`: only the types of four fields checked, no
    ``args``, ``pid`` or ``tid`` object made); a ``ph`` outside the format, or none, sends the
    chunk to the per-event checks."""

    cat: str | None = None
    name: str | None = None
    ts: Annotated[float, msgspec.Meta(gt=-1e17, lt=1e17)] = _MISSING_TS
    dur: Annotated[float, msgspec.Meta(ge=0, lt=1e13)] = 0.0
    pid: int | str | None = None
    tid: int | str | None = None
    args: _FastArgs = _NO_FAST_ARGS


#: One struct per other ``ph`` of the Chrome trace event format: whyidle reads nothing of those
#: events, but their ``cat``, ``name``, ``ts`` and ``dur`` keep the JSON types :class:`_Event`
#: checks (an event that breaks them is counted as left out, as before), stored under names that
#: the column code does not read (``cat`` reads None on them: they join no column group).
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{i}", [("cat_", str | None, msgspec.field(default=None, name="cat")),
                                     ("name_", str | None, msgspec.field(default=None, name="name")),
                                     ("ts_", float | None, msgspec.field(default=None, name="ts")),
                                     ("dur_", float | None, msgspec.field(default=None, name="dur"))],
                      tag_field="ph", tag=ph, gc=False, namespace={"cat": None})
    for i, ph in enumerate("B E i I C b n e s t f P O N S T p F D M V v R c ( )".split()))
_FAST_TYPES = frozenset((_FastEvent, *_OTHER_PHASES))
_FAST_DECODER = msgspec.json.Decoder(list[Union[(_FastEvent, *_OTHER_PHASES)]])  # noqa: UP007 - a tuple of types
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

#: Column groups of an ``X`` event (1: GPU, then runtime, CPU, sync) and, on the decoder-checked
#: path, its code by ``cat`` (only ``X`` events have a ``cat`` there): a GPU kind + 1, runtime,
#: sync, or each CPU category its own code from :data:`_CPU_CODE0` on (its string id is then read
#: from the code).
_G_RUNTIME, _G_CPU, _G_SYNC = 4, 5, 6
_CPU_CODE0 = 10
_CPU_CAT_LIST = sorted(CPU_CATS)
_CODE_OF_X = {**{c: k + 1 for c, k in GPU_CATS.items()}, **dict.fromkeys(RUNTIME_CATS, _G_RUNTIME),
              "cuda_sync": _G_SYNC, **{c: _CPU_CODE0 + i for i, c in enumerate(_CPU_CAT_LIST)}}
_TS, _DUR, _NAME, _TID, _CAT, _ARGS = (attrgetter(k) for k in ("ts", "dur", "name", "tid", "cat", "args"))
_DEVICE, _STREAM, _CORR, _BYTES, _GROUP = (attrgetter(k) for k in ("device", "stream", "correlation", "bytes",
                                                                    "group_size"))


def _int_column(values: list) -> np.ndarray:
    """An int64 column of checked ids where a string or null stands for -1 (unknown; numpy would
    read ``"12"`` as 12)."""
    if set(map(type, values)) <= {int}:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    return np.fromiter((v if type(v) is int else -1 for v in values), dtype=np.int64, count=len(values))


class _Columns:
    """Accumulates the columns of one trace while blocks are parsed."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.index: dict[str, int] = {}
        self.gpu = {k: [] for k in ("ts", "dur", "kind", "device", "stream", "name", "correlation", "bytes", "copy", "group")}
        self.pageable: list[np.ndarray] = []  # each column: a list of arrays, one per block
        self.runtime = {k: [] for k in ("ts", "dur", "name", "tid", "correlation")}
        self.cpu = {k: [] for k in ("ts", "dur", "name", "tid", "cat")}
        self.syncs = {k: [] for k in ("ts", "dur", "name", "stream")}
        self.steps: list[tuple[int, float, float]] = []
        self.events = 0
        self.skipped = 0  # events with unusable fields: not an object, ts/dur not a number in range
        self.cut: str | None = None  # where the readable events end early (a file cut short), or None
        self.tids: dict = {}
        self.step_ids: list[int] = []  # ids of the interned ``ProfilerStep#`` names

    def intern(self, s) -> int:
        s = str(s)
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.strings)
            self.strings.append(s)
            if s.startswith("ProfilerStep#"):
                self.step_ids.append(i)
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
        """Adds a block's events to the columns: :meth:`add_checked` for :class:`_FastEvent`
        (checked by the decoder), else each event checked here (unusable ``ts``/``dur``: left out
        and counted in ``skipped``; ids out of range: -1)."""
        if events and type(events[0]) in _FAST_TYPES:
            self.add_checked(events)
            return
        self.events += len(events)
        gpu, rt, cpu, syn = ({k: [] for k in g} for g in (self.gpu, self.runtime, self.cpu, self.syncs))
        pageable: list[bool] = []
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
                pageable.append(kind == MEMCPY and "Pageable" in name)
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
        for mine, cols in ((gpu, self.gpu), (rt, self.runtime), (cpu, self.cpu), (syn, self.syncs)):
            if mine["ts"]:
                for k, v in mine.items():
                    cols[k].append(np.asarray(v, dtype=np.float64 if k in ("ts", "dur") else np.int64))
        if pageable:
            self.pageable.append(np.asarray(pageable, dtype=bool))

    def add_checked(self, events: list) -> None:
        """:meth:`add` for events of :class:`_FastEvent`, whose fields the decoder checked: the
        same columns, strings and thread ids in the same order, taken a column at a time (each a
        C-level pass: ``map`` of an attribute getter into ``numpy.fromiter``)."""
        n = len(events)
        self.events += n
        if not n:
            return
        codes = np.fromiter(map(_CODE_OF_X.get, map(_CAT, events), repeat(0, n)), dtype=np.int8, count=n)
        groups = {}  # group -> (events, their positions in the block, ts, dur, codes)
        for g, mask in ((1, (codes > 0) & (codes <= 3)), (_G_RUNTIME, codes == _G_RUNTIME),
                        (_G_CPU, codes >= _CPU_CODE0), (_G_SYNC, codes == _G_SYNC)):
            if not mask.any():
                continue
            pos = np.flatnonzero(mask)
            sub = list(compress(events, mask.view(np.uint8).tobytes()))
            ts = np.fromiter(map(_TS, sub), dtype=np.float64, count=len(sub))
            if np.isnan(ts).any():  # X events without ts are left out (not counted, as add does)
                keep = ~np.isnan(ts)
                sub, pos, ts = list(compress(sub, keep.view(np.uint8).tobytes())), pos[keep], ts[keep]
                if not sub:
                    continue
            groups[g] = (sub, pos, ts, np.fromiter(map(_DUR, sub), dtype=np.float64, count=len(sub)), codes[pos])
        if not groups:
            return
        try:  # most blocks hold no new string or thread: one pass a column
            name_ids, cat_ids = self._string_ids(groups)
        except KeyError:
            self._intern_in_order(groups)
            name_ids, cat_ids = self._string_ids(groups)
        tid_get = self.tids.__getitem__
        threaded = [g for g in (_G_RUNTIME, _G_CPU) if g in groups]
        try:
            tid_cols = {g: np.fromiter(map(tid_get, map(_TID, groups[g][0])), np.int64, len(groups[g][0]))
                        for g in threaded}
        except KeyError:
            self._new_tids(threaded, groups)
            tid_cols = {g: np.fromiter(map(tid_get, map(_TID, groups[g][0])), np.int64, len(groups[g][0]))
                        for g in threaded}
        for g, (sub, _pos, ts, dur, gcodes) in groups.items():
            k = len(sub)
            ids = name_ids[g]
            if g == 1:
                self._gpu_columns(sub, gcodes.astype(np.int64) - 1, ts, dur, ids)
                continue
            group = {_G_RUNTIME: self.runtime, _G_CPU: self.cpu, _G_SYNC: self.syncs}[g]
            group["ts"].append(ts)
            group["dur"].append(dur)
            group["name"].append(ids)
            if g == _G_SYNC:
                group["stream"].append(_int_column(list(map(_STREAM, map(_ARGS, sub)))))
                continue
            group["tid"].append(tid_cols[g])
            if g == _G_RUNTIME:
                group["correlation"].append(np.fromiter(map(_CORR, map(_ARGS, sub)), np.int64, k))
            else:
                group["cat"].append(cat_ids)
                self._steps(ids, ts, dur)

    def _names(self, g: int, sub: list) -> list:
        """The interned names of a group's events: a sync event's kind, else its name."""
        names = list(map(_NAME, sub))
        if g == _G_SYNC:
            names = [e.args.cuda_sync_kind or nm for e, nm in zip(sub, names)]
        return names

    def _string_ids(self, groups: dict) -> tuple[dict, np.ndarray | None]:
        """Each group's name ids and the CPU events' category ids. Errors: KeyError when a string
        is not interned yet."""
        get = self.index.__getitem__
        name_ids = {g: np.fromiter(map(get, map(_NAME, grp[0]) if g != _G_SYNC else self._names(g, grp[0])),
                                   dtype=np.int64, count=len(grp[0])) for g, grp in groups.items()}
        cat_ids = None
        if _G_CPU in groups:
            lut = np.array([self.index.get(c, -1) for c in _CPU_CAT_LIST], dtype=np.int64)
            cat_ids = lut[groups[_G_CPU][4].astype(np.int64) - _CPU_CODE0]
            if (cat_ids < 0).any():
                raise KeyError("category")
        return name_ids, cat_ids

    def _intern_in_order(self, groups: dict) -> None:
        """Interns the new strings of the groups' names and the CPU events' categories (each right
        after its event's name) in the order :meth:`add` meets them: by first position."""
        index = self.index
        first: dict = {}  # new string -> 2 x its first event position (+1 for a category)

        def note(values: list, pos: np.ndarray, odd: int) -> None:
            new = [v for v in dict.fromkeys(values) if v not in index]
            if not new:
                return
            if len(new) > 32:
                at = dict(zip(reversed(values), range(len(values) - 1, -1, -1)))
                where = [at[v] for v in new]
            else:
                where = [values.index(v) for v in new]
            for v, i in zip(new, where):
                p = 2 * int(pos[i]) + odd
                if v not in first or p < first[v]:
                    first[v] = p

        for g, (sub, pos, _ts, _dur, _codes) in groups.items():
            note(self._names(g, sub), pos, 0)
        if _G_CPU in groups:
            note(list(map(_CAT, groups[_G_CPU][0])), groups[_G_CPU][1], 1)
        saw_none = None in first
        if saw_none:  # a missing name is ""
            p = first.pop(None)
            if "" not in index:
                first[""] = min(p, first.get("", p))
        for _p, v in sorted((p, v) for v, p in first.items()):
            self.intern(v)
        if saw_none:
            index[None] = index[""]

    def _new_tids(self, threaded: list, groups: dict) -> None:
        """Gives the new thread ids of the runtime and CPU events (groups ``threaded``) their ids
        (:meth:`tid`) in event order (the order decides only the ids of names that are not
        numbers)."""
        tids = self.tids
        first = []
        for g in threaded:
            values = list(map(_TID, groups[g][0]))
            new = [v for v in dict.fromkeys(values) if v not in tids]
            pos = groups[g][1]
            first.extend((int(pos[values.index(v)]), v) for v in new)
        for _p, v in sorted(first, key=lambda pv: pv[0]):
            self.tid(v)

    def _gpu_columns(self, sub: list, kind: np.ndarray, ts, dur, ids) -> None:
        gpu = self.gpu
        k = len(sub)
        args = list(map(_ARGS, sub))

        def col(get) -> np.ndarray:
            return np.fromiter(map(get, args), dtype=np.int64, count=k)

        def stream_col() -> np.ndarray:
            return _int_column(list(map(_STREAM, args)))

        device = col(_DEVICE)
        if (device < 0).any():  # no usable args.device: the pid, else 0
            for i in np.flatnonzero(device < 0).tolist():
                pid = sub[i].pid
                device[i] = pid if isinstance(pid, int) and 0 <= pid < 1 << 20 else 0
        gpu["ts"].append(ts)
        gpu["dur"].append(dur)
        gpu["kind"].append(kind)
        gpu["device"].append(device)
        gpu["stream"].append(stream_col())
        gpu["name"].append(ids)
        gpu["correlation"].append(col(_CORR))
        gpu["bytes"].append(np.where(kind != KERNEL, col(_BYTES), -1))
        copy = np.full(k, -1, dtype=np.int64)
        pageable = np.zeros(k, dtype=bool)
        memcpy = np.flatnonzero(kind == MEMCPY)
        if len(memcpy):
            strings = self.strings
            of = {}
            for i in np.unique(ids[memcpy]).tolist():
                s = strings[i]
                of[i] = (next((j for j, c in enumerate(COPY_KINDS) if c in s), -1), "Pageable" in s)
            copy[memcpy] = [of[i][0] for i in ids[memcpy].tolist()]
            pageable[memcpy] = [of[i][1] for i in ids[memcpy].tolist()]
        gpu["copy"].append(copy)
        gpu["group"].append(np.where(kind == KERNEL, col(_GROUP), -1))
        self.pageable.append(pageable)

    def _steps(self, ids: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> None:
        strings = self.strings
        if not self.step_ids:
            return
        for j in np.flatnonzero(np.isin(ids, self.step_ids)).tolist():
            try:
                self.steps.append((int(strings[ids[j]][13:]), float(ts[j]), float(dur[j])))
            except ValueError:
                pass

    def raw(self) -> dict:
        """The columns as numpy arrays in reading order, with this reader's string and thread
        tables (merged across parallel parts by :func:`_assemble`)."""
        def arrays(group: dict) -> dict[str, np.ndarray]:
            return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.float64 if k in ("ts", "dur") else np.int64)
                    for k, v in group.items()}

        return {"strings": self.strings, "tids": self.tids, "gpu": arrays(self.gpu), "runtime": arrays(self.runtime),
                "cpu": arrays(self.cpu), "syncs": arrays(self.syncs),
                "pageable": np.concatenate(self.pageable) if self.pageable else np.zeros(0, dtype=bool),
                "steps": self.steps, "events": self.events,
                "skipped": self.skipped, "cut": self.cut}
