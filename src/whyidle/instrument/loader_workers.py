"""Per-batch timing inside DataLoader worker processes (standard library only; runs in the workers).

PyTorch's profiler shows a DataLoader's time as 0 once it has workers (pytorch/kineto#610): the
work happens in other processes. whyidle replaces the two fetchers of ``torch.utils.data._utils.fetch``
(``_MapDatasetFetcher.fetch``, ``_IterableDatasetFetcher.fetch``: what a worker calls for each
batch) by timing versions, installed in the training process (:func:`install`, from
:mod:`whyidle.instrument.torch`). Forked workers inherit them; spawned ones install them through
the agent the bootstrap starts there. In any process that is not a DataLoader worker (no
``torch.utils.data.get_worker_info()``: ``num_workers=0``, where the training process's own data
wait is timed already) they call PyTorch's fetcher at once.

In a worker, for each batch: when the worker started and finished it (``CLOCK_MONOTONIC`` ns, the
clock of every whyidle record, shared by the processes of a machine), the samples' own time (each
``dataset[index]``, or each ``next()`` of an ``IterableDataset``), ``collate_fn``'s time, the
worker thread's CPU time, a histogram of the sample times (powers of two) and the slowest samples'
indices. One JSON line per batch (:data:`RECORD_KIND`, docs/run-format.md) is appended to
``RUN_DIR/loader-<pid>.jsonl`` at the batch's end, one ``write`` (a persistent worker is a daemon,
terminated at the program's exit without running anything: a buffer would lose its last batches).
No thread, no lock, no signal on the worker's path. A ``Dataset`` with ``__getitems__`` is timed as one
call (no per-sample times).

The timing versions do what PyTorch 2.x's fetchers do, line for line (the same calls in the same
order, the same exceptions): only clock reads are added between them.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time

#: The record of one batch built by a worker (``loader-<pid>.jsonl``).
RECORD_KIND = "wbatch"
#: Slowest samples kept per batch (index and ns).
SLOWEST_PER_BATCH = 2
#: Histogram bucket of a sample's ns: ``max(0, ns.bit_length() - HIST_SHIFT)``; bucket b ≥ 1 holds
#: [2^(b+9), 2^(b+10)) ns (~1 µs at b = 1), bucket 0 everything under ~1 µs.
HIST_SHIFT = 10
#: File mode of ``loader-<pid>.jsonl`` (readable by its owner only, as every whyidle file).
FILE_MODE = 0o600

_monotonic_ns = time.monotonic_ns
_thread_time_ns = time.thread_time_ns

_RUN_DIR: str | None = None  # where the workers write (install); inherited by forked workers
_ON = False  # recording: set at install, off at restore or when the parent's agent stopped before a fork
_LOADER: int | None = None  # id() of the DataLoader whose iterator is being created (forked workers inherit it)
_LOG: _WorkerLog | None = None  # this worker process's log (made at its first batch)
_AGENT = None  # the installing process's agent (its state at a fork decides the child's _ON)
_AT_FORK = False  # the fork hook is registered (os.register_at_fork has no way back)


class _WorkerLog:
    """One worker process's ``loader-<pid>.jsonl``: a record appended per batch."""

    def __init__(self, run_dir: str, worker: int, loader: int | None) -> None:
        self.pid = os.getpid()
        self.path = os.path.join(run_dir, f"loader-{self.pid}.jsonl")
        self.worker = worker
        self.loader = loader
        self.fd: int | None = None
        self.seq = 0  # batches this worker built

    def add(self, t0: int, t1: int, n: int, samples_ns: int, collate_ns: int, cpu_ns: int,
            hist: dict, slow: list) -> None:
        """Appends one batch's record (one ``write``); an error stops this worker's recording."""
        global _ON
        line = json.dumps({
            "k": RECORD_KIND, "t": t1, "w": self.worker, "ld": self.loader, "i": self.seq, "t0": t0, "t1": t1,
            "n": n, "s": samples_ns, "c": collate_ns, "cpu": cpu_ns,
            "h": sorted(hist.items()) if hist else None, "slow": slow or None}, separators=(",", ":"))
        self.seq += 1
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            os.write(self.fd, (line + "\n").encode())
        except OSError:
            _ON = False


def _log() -> _WorkerLog | None:
    """This worker process's log; None outside a DataLoader worker or when not recording."""
    global _LOG
    if not _ON:
        return None
    log = _LOG
    if log is not None and log.pid == os.getpid():
        return log
    worker_mod = sys.modules.get("torch.utils.data._utils.worker")
    info = getattr(worker_mod, "_worker_info", None)
    if info is None or _RUN_DIR is None:
        return None
    _LOG = log = _WorkerLog(_RUN_DIR, int(getattr(info, "id", -1)), _LOADER)
    return log


def _index_label(index):
    """A sample's index as recorded: an integer (a NumPy one included) as an int, anything else
    its ``repr`` (≤ 40 characters)."""
    if type(index) is int:
        return index
    try:
        return operator.index(index)
    except TypeError:
        return repr(index)[:40]


def _timed(log: _WorkerLog, t0: int, c0: int, times: list, indices, data, collate):
    """Collates ``data`` (timed) and records the batch; returns the collated batch. ``times``:
    the samples' ns, in ``indices`` order (empty: not timed per sample)."""
    tc = _monotonic_ns()
    out = collate(data)
    t1 = _monotonic_ns()
    try:
        hist: dict = {}
        for ns in times:
            b = ns.bit_length() - HIST_SHIFT
            b = b if b > 0 else 0
            hist[b] = hist.get(b, 0) + 1
        slow = []
        if times and indices is not None:
            order = sorted(range(len(times)), key=times.__getitem__, reverse=True)[:SLOWEST_PER_BATCH]
            slow = [[_index_label(indices[i]), times[i]] for i in order]
        log.add(t0, t1, len(times) if times else _length(data), tc - t0, t1 - tc, _thread_time_ns() - c0, hist, slow)
    except Exception:  # never costs the batch
        pass
    return out


def _length(data) -> int:
    try:
        return len(data)
    except Exception:
        return 1


def install(torch, run_dir: str, agent=None) -> None:
    """Replaces the fetchers' ``fetch`` (once per process; put back by
    :func:`whyidle.instrument.patches.restore`) so that DataLoader workers record their batches
    into ``run_dir``. ``agent``: the process's agent; a fork made while it is disabled (recording
    stopped) records nothing. Errors: none raised for a PyTorch without these fetchers (nothing is
    installed)."""
    global _RUN_DIR, _ON, _AGENT, _AT_FORK
    from whyidle.instrument import patches

    fetch_mod = getattr(getattr(getattr(torch, "utils", None), "data", None), "_utils", None)
    fetch_mod = getattr(fetch_mod, "fetch", None)
    map_cls = getattr(fetch_mod, "_MapDatasetFetcher", None)
    iter_cls = getattr(fetch_mod, "_IterableDatasetFetcher", None)
    if map_cls is None or iter_cls is None:
        return
    orig_map, orig_iter = map_cls.fetch, iter_cls.fetch
    if getattr(orig_map, "__whyidle__", False):
        return
    _RUN_DIR, _ON, _AGENT = run_dir, True, agent

    def map_fetch(self, possibly_batched_index):
        log = _log()
        if log is None:
            return orig_map(self, possibly_batched_index)
        t0, c0 = _monotonic_ns(), _thread_time_ns()
        times: list[int] = []
        if self.auto_collation:
            if hasattr(self.dataset, "__getitems__") and self.dataset.__getitems__:
                data = self.dataset.__getitems__(possibly_batched_index)
            else:
                dataset = self.dataset
                data = []
                seen = []  # the indices (a batch sampler may yield an iterator)
                clock = _monotonic_ns
                for idx in possibly_batched_index:
                    s = clock()
                    data.append(dataset[idx])
                    times.append(clock() - s)
                    seen.append(idx)
                return _timed(log, t0, c0, times, seen, data, self.collate_fn)
            return _timed(log, t0, c0, times, None, data, self.collate_fn)
        data = self.dataset[possibly_batched_index]
        times.append(_monotonic_ns() - t0)
        return _timed(log, t0, c0, times, [possibly_batched_index], data, self.collate_fn)

    def iter_fetch(self, possibly_batched_index):
        log = _log()
        if log is None:
            return orig_iter(self, possibly_batched_index)
        if self.ended:
            raise StopIteration
        t0, c0 = _monotonic_ns(), _thread_time_ns()
        times: list[int] = []
        clock = _monotonic_ns
        if self.auto_collation:
            data = []
            for _ in possibly_batched_index:
                s = clock()
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
                times.append(clock() - s)
            if len(data) == 0 or (self.drop_last and len(data) < len(possibly_batched_index)):
                raise StopIteration
        else:
            data = next(self.dataset_iter)
            times.append(clock() - t0)
        return _timed(log, t0, c0, times, None, data, self.collate_fn)

    for fn, orig in ((map_fetch, orig_map), (iter_fetch, orig_iter)):
        fn.__whyidle__ = True
        fn.__wrapped__ = orig
        fn.__doc__ = orig.__doc__
    patches.assign(map_cls, "fetch", map_fetch)
    patches.assign(iter_cls, "fetch", iter_fetch)
    patches.on_restore(_off)
    if not _AT_FORK and hasattr(os, "register_at_fork"):
        # the parent's state at the fork (the agent disables itself in every forked child)
        os.register_at_fork(before=_before_fork)
        _AT_FORK = True


def _before_fork() -> None:
    global _ON
    agent = _AGENT
    if _ON and agent is not None and agent.disabled:
        _ON = False  # recording stopped (the reader is gone, the directory unwritable): the workers too


def _off() -> None:
    global _ON, _RUN_DIR, _AGENT
    _ON, _RUN_DIR, _AGENT = False, None, None


def set_loader(key: int | None) -> None:
    """The DataLoader (``id()``) whose iterator is being made now: the workers forked for it
    record it as their ``ld``."""
    global _LOADER
    _LOADER = key
