"""Rank summaries: what a merge of node runs reads of a rank instead of its ``proc-<pid>.jsonl``
(docs/run-format.md, "ranks.json and ranks.npy"; pure I/O, no analysis here).

A node's report (at the end of ``whyidle run``, and ``whyidle report`` of one ended node run)
writes, beside the records, one summary per rank: its figures (made by the analysis,
:func:`whyidle.analysis.ranks.summary`), the few records every rank's analysis reads, and its time
in collectives per step. ``whyidle report DIR DIR ...`` reads them for every rank and the records
of the one rank it describes, instead of every rank's step records.

Two files: ``ranks.json`` (msgspec JSON: one entry per rank, each with the size and modification
time, in ns, of the ``proc-<pid>.jsonl`` it summarizes) and ``ranks.npy`` (one 1-D integer array:
every rank's nanoseconds in collectives per step, and their step indexes when these are not one
run of consecutive steps; int32 when every value fits, else int64). ``ranks.json`` holds the
array's length, type and CRC-32. A summary is used only when everything matches: the format,
the analysis version, the array, and the source file's size and mtime (a file written since,
or another file, is read in full). Anything else (missing, damaged, of another version) reads as
no summary: the merge reads those ranks in full, as for runs made before summaries existed.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Any, Optional

import msgspec
import numpy as np

from whyidle.record.writer import atomic_file

FORMAT = "whyidle.ranks/1"
JSON_NAME = "ranks.json"
ARRAY_NAME = "ranks.npy"


@dataclasses.dataclass
class RankSummary:
    """One rank's summary (the fields of :func:`whyidle.analysis.ranks.summary`, and its source).

    ``pid``; ``size`` and ``mtime_ns`` of ``proc-<pid>.jsonl`` when summarized (bytes, ns);
    ``records`` (the records kept, dicts); ``problems`` (the reader's notes on that file);
    ``figures`` and ``other`` (dicts or None); ``steps`` (its step rows); ``trains`` (bool);
    ``wait_steps`` (int64 step indexes, increasing) and ``wait_ns`` (nanoseconds in collectives
    at each, an integer array).
    """

    pid: int
    size: int
    mtime_ns: int
    records: list
    problems: list
    figures: Optional[dict]
    other: Optional[dict]
    steps: int
    trains: bool
    wait_steps: np.ndarray
    wait_ns: np.ndarray


class _Entry(msgspec.Struct):
    pid: int
    size: int
    mtime_ns: int
    records: list[dict[str, Any]]
    problems: list[str]
    figures: Optional[dict[str, Any]]
    other: Optional[dict[str, Any]]
    steps: int
    trains: bool
    waits: tuple[int, int]  # (offset, count) of its values in the array
    first: Optional[int] = None  # its waits are at steps first, first + 1, ... (no index array)
    at: Optional[tuple[int, int]] = None  # else (offset, count) of their step indexes


class _File(msgspec.Struct):
    format: str
    version: int
    array: tuple[int, str, int]  # (values, dtype, CRC-32 of the bytes)
    ranks: list[_Entry]


_DECODER = msgspec.json.Decoder(_File)


def source_stamp(path: str) -> tuple[int, int]:
    """``(size, mtime_ns)`` of a file (bytes, ns). Errors: ``OSError``."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def proc_file(run_dir: str, pid: int) -> str:
    """The ``proc-<pid>.jsonl`` of ``pid`` in ``run_dir``."""
    return os.path.join(run_dir, f"proc-{pid}.jsonl")


def write(run_dir: str, summaries: list[RankSummary], version: int) -> None:
    """Writes ``ranks.npy`` then ``ranks.json`` into ``run_dir`` (each atomically: a reader sees
    the old pair, a new array beside the old JSON, whose CRC refuses it, or the new pair).
    ``version``: the analysis version of the figures (:data:`whyidle.analysis.ranks.SUMMARY_VERSION`).
    Errors: ``OSError`` when the directory cannot be written.
    """
    parts: list[np.ndarray] = []
    entries = []
    offset = 0

    def put(values: np.ndarray) -> tuple[int, int]:
        nonlocal offset
        parts.append(values)
        offset += len(values)
        return offset - len(values), len(values)

    for s in summaries:
        steps = np.asarray(s.wait_steps, dtype=np.int64)
        run = len(steps) > 0 and int(steps[-1]) - int(steps[0]) == len(steps) - 1
        first = int(steps[0]) if run else None
        at = None if run or not len(steps) else put(steps)
        entries.append(_Entry(pid=s.pid, size=s.size, mtime_ns=s.mtime_ns, records=s.records, problems=s.problems,
                              figures=s.figures, other=s.other, steps=s.steps, trains=s.trains,
                              waits=put(np.asarray(s.wait_ns, dtype=np.int64)), first=first, at=at))
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    narrow = np.iinfo(np.int32)
    if not len(values) or (values.min() >= narrow.min and values.max() <= narrow.max):
        values = values.astype(np.int32)
    values = np.ascontiguousarray(values)
    with atomic_file(os.path.join(run_dir, ARRAY_NAME)) as f:
        np.save(f, values, allow_pickle=False)
    head = _File(format=FORMAT, version=version, array=(len(values), values.dtype.str, zlib.crc32(values.tobytes())),
                 ranks=entries)
    with atomic_file(os.path.join(run_dir, JSON_NAME)) as f:
        f.write(msgspec.json.encode(head))


def read(run_dir: str, version: int) -> dict[int, RankSummary]:
    """The fresh summaries of ``run_dir``: pid → :class:`RankSummary`, for each rank whose
    ``proc-<pid>.jsonl`` still has the size and mtime it had when summarized. Empty when there are
    none or they cannot be used (missing, damaged, another format or ``version``); never raises
    for what the files hold."""
    try:
        with open(os.path.join(run_dir, JSON_NAME), "rb") as f:
            head = _DECODER.decode(f.read())
        if head.format != FORMAT or head.version != version:
            return {}
        count, dtype, crc = head.array
        if np.dtype(dtype).kind != "i":
            return {}
        values = np.load(os.path.join(run_dir, ARRAY_NAME), allow_pickle=False)
        if values.ndim != 1 or len(values) != count or values.dtype != np.dtype(dtype) \
                or zlib.crc32(values.tobytes()) != crc:
            return {}
    except (OSError, ValueError, EOFError, TypeError, AttributeError, RecursionError, msgspec.DecodeError):
        # ValueError: a damaged .npy header; AttributeError: not an array (a zip)
        return {}
    out: dict[int, RankSummary] = {}
    ranges: dict[tuple[int, int], np.ndarray] = {}  # one index array for the ranks of the same steps
    for e in head.ranks:
        try:
            stamp = source_stamp(proc_file(run_dir, e.pid))
        except OSError:
            continue
        start, n = e.waits
        if stamp != (e.size, e.mtime_ns) or not _inside(e.waits, count):
            continue
        if e.first is not None:
            steps = ranges.get((e.first, n))
            if steps is None:
                steps = ranges[(e.first, n)] = np.arange(e.first, e.first + n, dtype=np.int64)
        elif e.at is not None and _inside(e.at, count) and e.at[1] == n:
            steps = values[e.at[0]:e.at[0] + n].astype(np.int64)
            if n > 1 and not bool((np.diff(steps) > 0).all()):
                continue
        elif n == 0:
            steps = np.zeros(0, dtype=np.int64)
        else:
            continue
        out[e.pid] = RankSummary(pid=e.pid, size=e.size, mtime_ns=e.mtime_ns, records=e.records,
                                 problems=e.problems, figures=e.figures, other=e.other, steps=e.steps,
                                 trains=e.trains, wait_steps=steps, wait_ns=values[start:start + n])
    return out


def _inside(part: tuple[int, int], count: int) -> bool:
    start, n = part
    return 0 <= start and 0 <= n and start + n <= count
