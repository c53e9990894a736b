"""Reading the DataLoader workers' batch records (``loader-<pid>.jsonl``, written by
:mod:`whyidle.instrument.loader_workers`; docs/run-format.md), folded while read into one
:class:`WorkerTally` per worker process: memory stays the same whatever the run's length (a
three-day job's workers build millions of batches).

Each block of lines is decoded by msgspec into typed records (the types are the checks: integer
times, ``t1 ≥ t0``); a line they do not fit — damaged by a kill, cut short at the end — is left out
and counted in the reader's problems.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from typing import Any, Optional

import msgspec
import numpy as np

#: Bins of the batch-latency histogram per power of two (quantiles within ~4.4 %, half a bin).
BINS_PER_OCTAVE = 8
#: Histogram bins: up to 2^64 ns.
N_BINS = 64 * BINS_PER_OCTAVE
#: Slowest samples kept per worker process.
SLOWEST_KEPT = 8
#: Lines decoded at once.
BLOCK_LINES = 65_536
#: A worker's last batches kept one by one (the timeline's track of that worker): ~0.2 MB each.
SPANS_KEPT = 5_000
#: Columns of :attr:`WorkerTally.spans`.
SPAN_COLUMNS = ("i", "t0", "t1", "n", "s", "c")
#: How the worker's writer starts each line (compact JSON, ``k`` first).
PREFIX = b'{"k":"wbatch",'


class _Batch(msgspec.Struct):
    """One ``wbatch`` record (docs/run-format.md)."""

    k: str
    w: int
    i: int
    t0: int
    t1: int
    n: int
    s: int
    c: int
    cpu: int
    ld: Optional[int] = None
    t: Any = None
    h: Optional[list[tuple[int, int]]] = None
    slow: Optional[list[tuple[Any, int]]] = None


_DECODE_BLOCK = msgspec.json.Decoder(list[_Batch]).decode
_DECODE_ONE = msgspec.json.Decoder(_Batch).decode


@dataclasses.dataclass
class WorkerTally:
    """One DataLoader worker process's batches, summed.

    Fields: ``pid``; ``worker`` (its id among the loader's workers); ``loader`` (``id()`` of the
    DataLoader whose iterator forked it; None when unknown: spawned workers); ``batches``;
    ``samples``; ``busy_ns`` (the batches' own time, Σ t1 − t0), ``samples_ns`` (the samples'
    fetch: ``dataset[index]`` / ``next()``), ``collate_ns``, ``cpu_ns`` (the worker thread's CPU
    over its batches); ``first_t0``, ``last_t1`` (monotonic ns); ``latency_bins`` (histogram of
    t1 − t0: bin ``floor(BINS_PER_OCTAVE · log2(ns))``, int64 array of :data:`N_BINS`);
    ``sample_hist`` (power-of-two bucket → samples, instrument/loader_workers.py ``HIST_SHIFT``);
    ``slowest`` (the :data:`SLOWEST_KEPT` slowest samples: ``[index, ns]``, slowest first);
    ``spans`` (its last :data:`SPANS_KEPT` batches one by one: int64 array, one row per batch in
    file order, columns :data:`SPAN_COLUMNS`).
    """

    pid: int
    worker: int
    loader: int | None
    batches: int = 0
    samples: int = 0
    busy_ns: int = 0
    samples_ns: int = 0
    collate_ns: int = 0
    cpu_ns: int = 0
    first_t0: int | None = None
    last_t1: int | None = None
    latency_bins: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(N_BINS, np.int64))
    sample_hist: dict = dataclasses.field(default_factory=dict)
    slowest: list = dataclasses.field(default_factory=list)
    spans: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, len(SPAN_COLUMNS)), np.int64))

    def add(self, batches: list[_Batch]) -> None:
        """Folds a block of this worker's records in."""
        if not batches:
            return
        kept = batches[-SPANS_KEPT:]
        block = np.array([(b.i, b.t0, b.t1, b.n, b.s, b.c) for b in kept], np.int64).reshape(-1, len(SPAN_COLUMNS))
        self.spans = np.concatenate([self.spans, block])[-SPANS_KEPT:]
        t0 = np.fromiter((b.t0 for b in batches), np.int64, len(batches))
        t1 = np.fromiter((b.t1 for b in batches), np.int64, len(batches))
        lat = np.maximum(t1 - t0, 1)
        self.latency_bins += np.bincount(np.minimum((np.log2(lat) * BINS_PER_OCTAVE).astype(np.int64), N_BINS - 1),
                                         minlength=N_BINS)
        self.batches += len(batches)
        self.busy_ns += int(lat.sum())
        self.samples += sum(b.n for b in batches)
        self.samples_ns += sum(b.s for b in batches)
        self.collate_ns += sum(b.c for b in batches)
        self.cpu_ns += sum(b.cpu for b in batches)
        lo, hi = int(t0.min()), int(t1.max())
        self.first_t0 = lo if self.first_t0 is None else min(self.first_t0, lo)
        self.last_t1 = hi if self.last_t1 is None else max(self.last_t1, hi)
        hist = self.sample_hist
        slow = self.slowest
        for b in batches:
            for bucket, count in b.h or ():
                hist[bucket] = hist.get(bucket, 0) + count
            if b.slow:
                slow.extend([index, ns] for index, ns in b.slow)
        if len(slow) > SLOWEST_KEPT:
            slow.sort(key=lambda e: -e[1])
            del slow[SLOWEST_KEPT:]


def read_loader_files(path: str) -> tuple[dict[int, WorkerTally], list[str]]:
    """Every ``loader-<pid>.jsonl`` of run directory ``path``, folded: ``({pid: WorkerTally},
    problems)``; problems name the lines left out (damaged, or fields of the wrong type). A file
    that cannot be read is left out with a problem. Errors: none raised."""
    tallies: dict[int, WorkerTally] = {}
    problems: list[str] = []
    for file in sorted(glob.glob(os.path.join(path, "loader-*.jsonl"))):
        m = re.search(r"loader-(\d+)\.jsonl$", file)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            bad = _read_file(file, pid, tallies)
        except OSError as exc:
            problems.append(f"{os.path.basename(file)}: left out: {exc.strerror or exc}")
            continue
        if bad:
            problems.append(f"{os.path.basename(file)}: {bad} damaged line{'s' if bad > 1 else ''} left out")
    return tallies, problems


def _read_file(file: str, pid: int, tallies: dict[int, WorkerTally]) -> int:
    """Folds one file into ``tallies``; returns the lines left out."""
    bad = 0
    with open(file, "rb") as f:
        while True:
            lines = f.readlines(BLOCK_LINES * 200)
            if not lines:
                return bad
            good = [ln.rstrip(b"\n") for ln in lines if ln.startswith(PREFIX) and ln.endswith(b"\n")]
            bad += len(lines) - len(good)
            try:
                batches = _DECODE_BLOCK(b"[" + b",".join(good) + b"]")
            except (msgspec.DecodeError, msgspec.ValidationError):
                batches = []
                for ln in good:
                    try:
                        batches.append(_DECODE_ONE(ln))
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        bad += 1
            kept = [b for b in batches if b.t1 >= b.t0 and b.n >= 0]
            bad += len(batches) - len(kept)
            if not kept:
                continue
            tally = tallies.get(pid)
            if tally is None:
                tally = tallies[pid] = WorkerTally(pid, kept[0].w, kept[0].ld)
            tally.add(kept)
