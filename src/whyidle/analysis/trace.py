"""Diagnosis metrics of PyTorch profiler (Kineto) traces, with Holistic Trace Analysis' definitions.

Pure and vectorized: :class:`~whyidle.record.trace_data.TraceData` columns in, plain dicts out
(numpy only; no pandas frame, no framework import, no Python loop over events — loops run over
devices, streams, threads or steps). Times in the trace are microseconds; every ``*_s`` value
returned is seconds, every ``*_us`` value microseconds, every share a fraction 0–1. ``None``
means the trace cannot tell (never a zero standing in for "unknown").

Sources. HTA = Holistic Trace Analysis (github.com/facebookresearch/HolisticTraceAnalysis):
``hta/analyzers/breakdown_analysis.py`` (temporal breakdown, idle time breakdown),
``hta/analyzers/cuda_kernel_analysis.py`` (``cuda_kernel_launch_stats``),
``hta/analyzers/trace_counters.py`` (queue length), ``hta/common/trace_symbol_table.py`` (launch
names), ``hta/common/trace.py`` (correlation, step filtering), ``hta/utils/utils.py``
(``merge_kernel_intervals``). TB = the PyTorch profiler TensorBoard plugin
(github.com/pytorch/kineto, ``tb_plugin/torch_tb_profiler/profiler/step_parser.py`` and
``overall_parser.py``: the "Step Time Breakdown").

Definitions (all for the *device used*: the GPU with the most busy time, see ``devices``):

* **GPU op**: a kernel, memcpy or memset activity (HTA: every event with ``stream != -1``).
* **Busy** (``gpu_busy_s``): length of the union of all GPU op intervals of the device, over all
  its streams (HTA ``merge_kernel_intervals``: intervals that touch or overlap merge).
  **Window** (``window_s``): first GPU op start to last GPU op end on that device (HTA
  ``_get_idle_time_for_kernels``: "kernel time"). ``busy_share = busy / window``,
  ``idle_share = 1 − busy_share``. ``compute_busy_share``: the same with kernels only (memcpy and
  memset left out; NCCL kernels count as kernels here, whereas HTA's temporal breakdown puts them
  in "non-compute"). Difference from HTA: HTA's ``load_traces`` by default drops the GPU ops of
  the last ``ProfilerStep`` and GPU ops without a correlated CPU event when the trace has two or
  more steps (``Trace._filter_irrelevant_gpu_kernels``); whyidle keeps every GPU op, so on traces
  whose last step is long or partial the two windows differ.
* **Idle time breakdown** (HTA ``BreakdownAnalysis.get_idle_time_breakdown``). Per stream: the GPU
  ops of the stream in start order; the gap before each op (but the first) is
  ``op.ts − previous op's end``. It is *host wait* when the op's launch call (the runtime event with
  the same correlation id) began after the previous op ended (the host had not enqueued it yet),
  else *kernel wait* when the gap is shorter than :data:`KERNEL_WAIT_US`, else *other* (e.g. an op
  waiting on an event from another stream). Ops without a launch call in the trace cannot be host
  wait. Gaps are clipped at 0 (HTA sums a few negative µs from rounding; a few µs in the traces
  here). **Per-stream idle over-counts**: a stream is "idle" while other streams keep the device
  busy, so the per-stream figures add up to more than the device's idle time whenever streams
  overlap (e.g. a side stream with a few NCCL kernels is idle for almost the whole window). It can
  also miss device idle: a stream's idle runs only from its own first op to its last, so time
  when the device is idle between work on different streams counts on no stream.
  **Device level** (whyidle's addition, same rule on the union of all streams): each gap between
  two busy intervals of the device is host wait when the op that ends the gap (the first op of the
  next busy interval) was launched after the gap began, kernel wait when shorter than the
  threshold, else other; these parts add up exactly to the device idle (window − busy).
* **Steps** (one per ``ProfilerStep#N`` annotation; its host window ``[ts, ts + dur)``): the
  window's wall time is cut into exclusive parts by priority, as in TB's step time breakdown:
  *kernel* (a kernel runs on the device) > *memcpy* > *memset* > *runtime* (a CUDA/HIP runtime or
  driver call runs on a host thread) > *dataloader* (a host thread is inside
  ``enumerate(DataLoader)…``, ``_SingleProcessDataLoaderIter.__next__`` or
  ``_MultiProcessingDataLoaderIter.__next__``) > *cpu_only* (a host thread is inside any other
  recorded CPU op or annotation — the GPU idle and no loader or runtime call) > *other* (nothing
  recorded: the device idle and no host op: untraced Python, waiting). Each instant belongs to
  exactly one part, so the ``shares`` add up to 1. Shares are time-weighted over all steps (sum of
  a part over steps / sum of step times). Host parts count every host thread of the traced process,
  not only the step's thread: PyTorch runs backward on an autograd worker thread, whose launch
  calls would otherwise be missed (45 % of the runtime calls in ``kineto_resnet50``). Raw (not
  exclusive) figures per step are in ``per_step``: ``dataloader_s`` (host time in the DataLoader,
  overlapping GPU work or not), ``runtime_s``, ``gpu_busy_s``; ``dataloader_share`` is the mean over
  steps of ``dataloader_s / dur_s`` — the share of step time the host spent getting the next batch
  (``shares.dataloader`` is the part of it during which the device also had nothing to run).
* **Kernels**: durations of the device's kernels; ``short_time_share``: share of kernel time in
  kernels shorter than :data:`SHORT_KERNEL_US`, ``short_count_share`` their share of the count;
  ``shorter_than_launch_count_share``: share of kernels that ran for less time than their own launch
  call took on the host (HTA's "short GPU kernels" plot in ``cuda_kernel_launch_stats``).
  **Launch delay** = kernel start − launch call start (µs). HTA's ``cuda_kernel_launch_stats``
  computes ``ts_gpu − ts_cpu + dur_cpu`` and includes memcpy/memset; whyidle takes kernels only and
  splits the population: a kernel launched while its stream was idle (its launch call began after
  the previous op of the stream ended, HTA's host-wait test; or the first op of the stream) has a
  delay that is pure launch overhead (``launch_overhead_us``); one launched onto a busy stream
  waited in the queue behind earlier work (HTA's queue length > 0, ``trace_counters.py``), and its
  delay is mostly queueing (``queue_delay_us``). ``launched_on_idle_share``: share of kernels
  launched onto an idle stream (near 1 = the host cannot keep ahead of the device: launch-bound).
* **Launches**: runtime/driver calls that launched at least one GPU op in the trace (a GPU op with
  the same correlation id), counted per API name, whatever the name (``cudaLaunchKernel``,
  ``cudaLaunchKernelExC``, ``cuLaunchKernel`` (Triton), ``cudaGraphLaunch``, ``hipLaunchKernel``,
  ``hipExtModuleLaunchKernel``, ``cudaMemcpyAsync``, ...). ``hta_missed``: how many of them have a
  name outside :data:`HTA_LAUNCH_NAMES`, the names HTA's ``cuda_kernel_launch_stats`` matches.
* **Syncs**: host-blocking synchronizations: runtime calls named in :data:`SYNC_NAMES`, plus
  ``cuda_sync`` events during which no runtime call runs (a ``cuda_sync`` event mirrors the
  runtime call with its correlation id and starts while that call runs, so it is not counted
  twice; ``Stream Wait Event`` is a device-side wait, not counted). ``count``: all of them;
  ``per_step``: those that begin inside a ``ProfilerStep`` per step; ``cuda_sync_events``: how
  many ``cuda_sync`` events the trace has (any kind). ``op``: the innermost enclosing ``aten::`` op
  on the same thread; ``frame``: the innermost enclosing ``python_function`` event (traces taken
  with ``with_stack``), else None. ``idle_after_s`` of a sync: when the device is idle at the
  moment the call returns, the time from that return until the next GPU op starts on the device
  (the host, released, has to refill the queue); 0 when the device is still busy (another
  stream) or never runs again. Several syncs returning into one idle gap: the gap goes to the
  first of them, so the per-sync figures add up to the total without double counting.
  ``events``: groups by (name, op, frame), largest idle first, at most :data:`MAX_SYNC_GROUPS`.
  Syncs that begin inside torch.compile's compile work (inductor benchmarks the kernels it
  tunes; :func:`whyidle.analysis.trace_compile.compile_intervals`) are the compiler's, not the
  loop's: left out of all of these, counted in ``in_compile``; compile work inside the idle gap
  after a sync is not that sync's idle.
* **Memcpy**: ``h2d_bytes``/``h2d_s`` (sum of the HtoD copies' bytes and device durations),
  ``h2d_gbps`` = bytes / s / 1e9 over the copies whose size the trace gives (None when none: ROCm
  traces give the size on the runtime call only); ``d2h_bytes``; pageable copies (``Pageable`` in
  the activity name: the host buffer was not pinned, so the copy is staged and blocks the host),
  both directions: count, bytes, device seconds, and ``pageable_share_of_step``: the union of
  their intervals inside step windows over the total step time (None without steps).
"""

from __future__ import annotations

import numpy as np

from whyidle.record.trace_data import COPY_KINDS, KERNEL, MEMCPY, TraceData

#: Gap between consecutive GPU ops below which idle time counts as *kernel wait* (the cost of
#: launching back-to-back work), µs. HTA's ``get_idle_time_breakdown(consecutive_kernel_delay=30)``
#: default; HTA documents it as "30 nanoseconds" but keeps Kineto's microsecond timestamps
#: unscaled, so it acts as 30 µs (newer HTA labels its columns "(us)").
KERNEL_WAIT_US = 30.0

#: Kernels shorter than this are "short": one host thread launching from PyTorch eager mode
#: spends ~5–10 µs per kernel (op dispatch plus ``cudaLaunchKernel``), so a stream of kernels
#: shorter than that drains the queue faster than the host refills it (launch-bound). Same order
#: as the launch overheads quoted for CUDA Graphs ("a few µs per kernel launch").
SHORT_KERNEL_US = 10.0

#: Launch API names that HTA's ``CudaKernelAnalysis.cuda_kernel_launch_stats`` matches (its
#: launch-delay statistics); anything else launching GPU work is "missed". (HTA's queue-length
#: query in ``trace_symbol_table.py`` accepts more names in recent versions.)
HTA_LAUNCH_NAMES = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")

#: Runtime calls that block the host until the device has finished earlier work.
SYNC_NAMES = (
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpy2D", "cudaMemcpyFromSymbol",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
    "hipMemcpyWithStream",
)

#: ``cuda_sync`` kinds that are not host-blocking (a stream waiting on another stream's event).
NON_BLOCKING_SYNC_KINDS = ("Stream Wait Event",)

#: Host events whose name marks the DataLoader fetching the next batch (TB's ``DataLoader`` role;
#: the iterator classes of ``torch.utils.data``).
DATALOADER_PREFIX = "enumerate(DataLoader)"
DATALOADER_NAMES = ("_SingleProcessDataLoaderIter.__next__", "_MultiProcessingDataLoaderIter.__next__")

#: How many of the latest-starting ops before a sync are searched for its enclosing op (ops nest;
#: the innermost enclosing op is among the last few that started before the sync).
ENCLOSING_SEARCH = 64

#: Sync groups (name, op, frame) kept in ``syncs.events``, largest idle first.
MAX_SYNC_GROUPS = 50

SHARE_KEYS = ("kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_only", "other")

_EMPTY = np.zeros(0, dtype=np.float64)


# --------------------------------------------------------------------------- interval helpers


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint ``(starts, ends)``; touching intervals merge (as in
    HTA's ``merge_kernel_intervals``)."""
    if len(starts) == 0:
        return _EMPTY, _EMPTY
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum(ends[order], s)
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


class _Cover:
    """Length of a union of intervals inside any ``[a, b)``, by prefix sums (vectorized)."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, merged: bool = False) -> None:
        self.s, self.e = (starts, ends) if merged else _merge(starts, ends)
        self.cum = np.concatenate([[0.0], np.cumsum(self.e - self.s)])

    def upto(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if len(self.s) == 0:
            return np.zeros_like(x)
        k = np.searchsorted(self.s, x, side="right")
        km = np.maximum(k - 1, 0)
        part = np.minimum(x, self.e[km]) - self.s[km]
        return np.where(k > 0, self.cum[km] + part, 0.0)

    def between(self, a, b) -> np.ndarray:
        return self.upto(b) - self.upto(a)

    @property
    def total(self) -> float:
        return float(self.cum[-1])


def _stats(values: np.ndarray, keys=("p50", "mean")) -> dict | None:
    """``{p50, p90, max, mean}`` (the requested ones) of a sample, or None when it is empty."""
    if len(values) == 0:
        return None
    out = {}
    for k in keys:
        if k == "mean":
            out[k] = float(np.mean(values))
        elif k == "max":
            out[k] = float(np.max(values))
        else:
            out[k] = float(np.percentile(values, float(k[1:])))
    return out


def _ids(strings: list[str], pred) -> np.ndarray:
    """Interned indices of the strings for which ``pred`` holds (a pass over the string table,
    not over events)."""
    return np.array([i for i, s in enumerate(strings) if pred(s)], dtype=np.int64)


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` of the first row whose key equals each query (``found`` mask, value or NaN)."""
    if len(keys) == 0 or len(query) == 0:
        return np.zeros(len(query), dtype=bool), np.full(len(query), np.nan)
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    pos = np.clip(np.searchsorted(k, query, side="left"), 0, len(k) - 1)
    found = (k[pos] == query) & (query != -1)
    out = np.where(found, values[order][pos], np.nan)
    return found, out


def _innermost(c_ts, c_end, c_tid, q_ts, q_end, q_tid) -> np.ndarray:
    """Index (into the container arrays) of the innermost container enclosing each query interval
    on the same thread, or -1. Containers nest per thread, so the innermost one is the latest
    starting container that ends after the query; the :data:`ENCLOSING_SEARCH` latest ones that
    started before the query are checked, vectorized (a loop over threads only)."""
    out = np.full(len(q_ts), -1, dtype=np.int64)
    if len(c_ts) == 0 or len(q_ts) == 0:
        return out
    offs = np.arange(1, ENCLOSING_SEARCH + 1)
    for tid in np.unique(q_tid):
        ci = np.flatnonzero(c_tid == tid)
        if len(ci) == 0:
            continue
        # by start, and the longer first on equal starts so the later (nested) one is found first
        ci = ci[np.lexsort((-c_end[ci], c_ts[ci]))]
        cts, cend = c_ts[ci], c_end[ci]
        qi = np.flatnonzero(q_tid == tid)
        k = np.searchsorted(cts, q_ts[qi], side="right")
        cand = k[:, None] - offs[None, :]
        candc = np.maximum(cand, 0)
        ok = (cand >= 0) & (cend[candc] >= q_end[qi][:, None]) & (cts[candc] <= q_ts[qi][:, None])
        first = ok.argmax(axis=1)
        rows = np.arange(len(qi))
        found = ok[rows, first]
        out[qi[found]] = ci[candc[rows, first][found]]
    return out


# --------------------------------------------------------------------------- GPU side


def _device_rows(t: TraceData) -> tuple[int | None, list[dict]]:
    """The device used (most busy time) and the per-device busy figures."""
    g = t.gpu
    devices = []
    best, best_busy = None, -1.0
    for dev in np.unique(g["device"]):
        m = g["device"] == dev
        ts, end = g["ts"][m], g["ts"][m] + np.maximum(g["dur"][m], 0)
        window = float(end.max() - ts.min())
        busy = _Cover(ts, end).total
        km = m & (g["kind"] == KERNEL)
        kbusy = _Cover(g["ts"][km], g["ts"][km] + np.maximum(g["dur"][km], 0)).total
        devices.append({
            "device": int(dev), "window_s": window / 1e6, "busy_s": busy / 1e6,
            "busy_share": busy / window if window > 0 else None,
            "compute_busy_share": kbusy / window if window > 0 else None,
            "idle_s": (window - busy) / 1e6,
        })
        if busy > best_busy:
            best, best_busy = int(dev), busy
    return best, devices


def _idle_breakdown(ts, end, stream, launch_ts, has_launch, merged) -> dict:
    """Per-stream (HTA) and device-level idle breakdown, see the module docstring."""
    order = np.lexsort((ts, stream))
    s_ts, s_end, s_stream = ts[order], end[order], stream[order]
    s_launch, s_has = launch_ts[order], has_launch[order]
    n = len(order)
    has_prev = np.zeros(n, dtype=bool)
    has_prev[1:] = s_stream[1:] == s_stream[:-1]
    prev_end = np.full(n, np.nan)
    prev_end[1:] = s_end[:-1]
    gap = np.where(has_prev, np.maximum(s_ts - np.nan_to_num(prev_end), 0.0), 0.0)
    host = has_prev & s_has & (s_launch > prev_end)
    kwait = has_prev & ~host & (gap < KERNEL_WAIT_US)
    other = has_prev & ~host & ~kwait
    streams, inv = np.unique(s_stream, return_inverse=True)
    sums = {name: np.bincount(inv, weights=np.where(mask, gap, 0.0), minlength=len(streams))
            for name, mask in (("host", host), ("kernel", kwait), ("other", other))}
    per_stream = [{
        "stream": int(st), "host_wait_s": float(sums["host"][i]) / 1e6,
        "kernel_wait_s": float(sums["kernel"][i]) / 1e6, "other_s": float(sums["other"][i]) / 1e6,
        "idle_s": float(sums["host"][i] + sums["kernel"][i] + sums["other"][i]) / 1e6,
    } for i, st in enumerate(streams)]

    # device level: gaps between busy intervals of the union; the op opening the next interval
    ms, me = merged
    gaps = ms[1:] - me[:-1]
    t_order = np.lexsort((end, ts))
    first_at = np.searchsorted(ts[t_order], ms[1:], side="left")
    nxt = t_order[np.clip(first_at, 0, max(len(t_order) - 1, 0))] if len(gaps) else np.zeros(0, np.int64)
    d_host = has_launch[nxt] & (launch_ts[nxt] > me[:-1]) if len(gaps) else np.zeros(0, bool)
    d_kwait = ~d_host & (gaps < KERNEL_WAIT_US)
    d_other = ~d_host & ~d_kwait
    device = {
        "host_wait_s": float(gaps[d_host].sum()) / 1e6,
        "kernel_wait_s": float(gaps[d_kwait].sum()) / 1e6,
        "other_s": float(gaps[d_other].sum()) / 1e6,
        "idle_s": float(gaps.sum()) / 1e6,
    }
    return {"per_stream": per_stream, "device": device, "kernel_wait_threshold_us": KERNEL_WAIT_US}


def _kernel_stats(ts, end, dur, kind, stream, launch_ts, launch_dur, has_launch) -> dict | None:
    """Kernel duration distribution, short kernels, launch delay split (module docstring)."""
    k = kind == KERNEL
    if not k.any():
        return None
    kdur = dur[k]
    total = float(kdur.sum())
    short = kdur < SHORT_KERNEL_US
    # stream state at launch: previous op (any kind) of the same stream, in start order
    order = np.lexsort((ts, stream))
    n = len(order)
    has_prev = np.zeros(n, dtype=bool)
    has_prev[1:] = stream[order][1:] == stream[order][:-1]
    prev_end = np.full(n, -np.inf)
    prev_end[1:] = end[order][:-1]
    prev_end = np.where(has_prev, prev_end, -np.inf)
    idle_at_launch = np.empty(n, dtype=bool)
    idle_at_launch[order] = launch_ts[order] > prev_end
    sel = k & has_launch
    delay = ts[sel] - launch_ts[sel]
    on_idle = idle_at_launch[sel]
    return {
        "count": int(k.sum()),
        "dur_us": _stats(kdur, ("p50", "p90", "max", "mean")),
        "short_threshold_us": SHORT_KERNEL_US,
        "short_time_share": float(kdur[short].sum()) / total if total > 0 else None,
        "short_count_share": float(short.mean()),
        "shorter_than_launch_count_share": (float((dur[sel] < launch_dur[sel]).mean())
                                            if sel.any() else None),
        "launch_delay_us": _stats(delay),
        "launch_overhead_us": _stats(delay[on_idle]),
        "queue_delay_us": _stats(delay[~on_idle]),
        "launched_on_idle_share": float(on_idle.mean()) if len(on_idle) else None,
    }


def _launches(t: TraceData) -> dict:
    """Launch calls per API name and the count HTA's name list misses (module docstring)."""
    rt, g = t.runtime, t.gpu
    gc = g["correlation"][g["correlation"] != -1]
    m = np.isin(rt["correlation"], gc) & (rt["correlation"] != -1)
    names, counts = np.unique(rt["name"][m], return_counts=True)
    by_name = {t.strings[i]: int(c) for i, c in sorted(zip(names.tolist(), counts.tolist()),
                                                         key=lambda x: -x[1])}
    missed = sum(c for n, c in by_name.items() if n not in HTA_LAUNCH_NAMES)
    return {"counts": by_name, "total": int(m.sum()), "hta_missed": int(missed),
            "hta_names": list(HTA_LAUNCH_NAMES)}


# --------------------------------------------------------------------------- host side


def _steps(t: TraceData, gpu_sets: list | None, host_sets: list) -> dict:
    """Per-step time and its exclusive parts (module docstring). ``gpu_sets``: cumulative
    ``_Cover``s of kernel, kernel+memcpy, kernel+memcpy+memset (None without GPU);
    ``host_sets``: intervals (starts, ends) of runtime calls, DataLoader events, other CPU ops."""
    if not t.steps:
        return {"count": 0, "step_s": None, "shares": None, "dataloader_share": None, "per_step": []}
    num = np.array([s[0] for s in t.steps], dtype=np.int64)
    a = np.array([s[1] for s in t.steps], dtype=np.float64)
    dur = np.maximum(np.array([s[2] for s in t.steps], dtype=np.float64), 0.0)
    b = a + dur
    (r_s, r_e), (d_s, d_e), (c_s, c_e) = host_sets
    raw_rt = _Cover(r_s, r_e).between(a, b)
    raw_dl = _Cover(d_s, d_e).between(a, b)

    base_s = gpu_sets[-1].s if gpu_sets else _EMPTY
    base_e = gpu_sets[-1].e if gpu_sets else _EMPTY
    u_rt = _Cover(np.concatenate([base_s, r_s]), np.concatenate([base_e, r_e]))
    u_dl = _Cover(np.concatenate([u_rt.s, d_s]), np.concatenate([u_rt.e, d_e]))
    u_cpu = _Cover(np.concatenate([u_dl.s, c_s]), np.concatenate([u_dl.e, c_e]))
    cov_rt, cov_dl, cov_cpu = u_rt.between(a, b), u_dl.between(a, b), u_cpu.between(a, b)
    if gpu_sets:
        cov_k, cov_km, cov_g = (cv.between(a, b) for cv in gpu_sets)
    else:
        cov_k = cov_km = cov_g = np.zeros(len(a))
    parts = {
        "kernel": cov_k, "memcpy": cov_km - cov_k, "memset": cov_g - cov_km,
        "runtime": cov_rt - cov_g, "dataloader": cov_dl - cov_rt, "cpu_only": cov_cpu - cov_dl,
        "other": dur - cov_cpu,
    }
    parts = {k: np.maximum(v, 0.0) for k, v in parts.items()}
    total = float(dur.sum())
    shares = {k: (float(parts[k].sum()) / total if total > 0 else None) for k in SHARE_KEYS}
    if not gpu_sets:
        for k in ("kernel", "memcpy", "memset"):
            shares[k] = None
    per_step = []
    for i in range(len(a)):  # one row per step
        per_step.append({
            "step": int(num[i]), "ts": float(a[i]), "dur_s": float(dur[i]) / 1e6,
            "dataloader_s": float(raw_dl[i]) / 1e6, "runtime_s": float(raw_rt[i]) / 1e6,
            "gpu_busy_s": float(cov_g[i]) / 1e6 if gpu_sets else None,
            "parts_s": {k: (float(parts[k][i]) / 1e6 if gpu_sets or k not in ("kernel", "memcpy", "memset")
                            else None) for k in SHARE_KEYS},
        })
    dl_share = np.where(dur > 0, raw_dl / np.where(dur > 0, dur, 1.0), 0.0)
    return {
        "count": len(a),
        "step_s": {"p50": float(np.percentile(dur, 50)) / 1e6, "p90": float(np.percentile(dur, 90)) / 1e6,
                   "mean": float(dur.mean()) / 1e6, "max": float(dur.max()) / 1e6},
        "shares": shares,
        "dataloader_share": float(dl_share.mean()),
        "per_step": per_step,
    }


def _syncs(t: TraceData, merged: tuple[np.ndarray, np.ndarray] | None, aten_ids, py_ids,
           sync_ids, step_bounds, compiling: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """Host-blocking syncs, their enclosing op and the idle that follows (module docstring);
    syncs that begin inside ``compiling`` (disjoint, sorted µs intervals of torch.compile's work:
    inductor benchmarks its kernels) are the compiler's, counted in ``in_compile`` only."""
    rt, cpu, sy, S = t.runtime, t.cpu, t.syncs, t.strings
    m = np.isin(rt["name"], sync_ids)
    q_ts, q_end = rt["ts"][m], rt["ts"][m] + np.maximum(rt["dur"][m], 0)
    q_name, q_tid = rt["name"][m], rt["tid"][m]
    # cuda_sync events not mirrored by an enclosing runtime call (and host-blocking)
    nb = _ids(S, lambda s: s in NON_BLOCKING_SYNC_KINDS)
    cs_ts, cs_end = sy["ts"], sy["ts"] + np.maximum(sy["dur"], 0)
    if len(cs_ts):
        if len(rt["ts"]):
            by_ts = np.argsort(rt["ts"], kind="stable")
            r_ts = rt["ts"][by_ts]
            reach = np.maximum.accumulate(r_ts + np.maximum(rt["dur"][by_ts], 0))
            k = np.searchsorted(r_ts, cs_ts, side="right") - 1
            mirrored = (k >= 0) & (reach[np.maximum(k, 0)] >= cs_ts)  # a call was running
        else:
            mirrored = np.zeros(len(cs_ts), dtype=bool)
        orphan = ~mirrored & ~np.isin(sy["name"], nb)
        q_ts = np.concatenate([q_ts, cs_ts[orphan]])
        q_end = np.concatenate([q_end, cs_end[orphan]])
        q_name = np.concatenate([q_name, sy["name"][orphan]])
        q_tid = np.concatenate([q_tid, np.full(int(orphan.sum()), -(10 ** 12), dtype=np.int64)])
    in_compile = 0
    if compiling is not None and len(compiling[0]) and len(q_ts):
        k = np.searchsorted(compiling[0], q_ts, side="right") - 1
        inside = (k >= 0) & (q_ts < compiling[1][np.maximum(k, 0)])
        in_compile = int(inside.sum())
        q_ts, q_end, q_name, q_tid = q_ts[~inside], q_end[~inside], q_name[~inside], q_tid[~inside]
    n = len(q_ts)
    # enclosing aten:: op and python frame on the same thread
    c_end = cpu["ts"] + np.maximum(cpu["dur"], 0)
    am = np.isin(cpu["name"], aten_ids)
    op_idx = _innermost(cpu["ts"][am], c_end[am], cpu["tid"][am], q_ts, q_end, q_tid)
    op_name = np.where(op_idx >= 0, cpu["name"][am][np.maximum(op_idx, 0)] if am.any() else -1, -1)
    pm = np.isin(cpu["name"], py_ids) if len(py_ids) else np.zeros(len(cpu["ts"]), dtype=bool)
    if pm.any():
        fr_idx = _innermost(cpu["ts"][pm], c_end[pm], cpu["tid"][pm], q_ts, q_end, q_tid)
        fr_name = np.where(fr_idx >= 0, cpu["name"][pm][np.maximum(fr_idx, 0)], -1)
    else:
        fr_name = np.full(n, -1, dtype=np.int64)
    # idle after each sync: the device idle gap the call returns into, first sync per gap
    idle = np.full(n, np.nan) if merged is None else np.zeros(n)
    if merged is not None and n and len(merged[0]):
        ms, me = merged
        k = np.searchsorted(ms, q_end, side="right") - 1  # last busy interval starting ≤ return
        in_gap = (k >= 0) & (k < len(ms) - 1) & (q_end >= me[np.maximum(k, 0)])
        cand = np.flatnonzero(in_gap)
        if len(cand):
            cand = cand[np.argsort(q_end[cand], kind="stable")]
            _, first = np.unique(k[cand], return_index=True)
            win = cand[first]
            idle[win] = ms[k[win] + 1] - q_end[win]
            if compiling is not None and len(compiling[0]):  # a compilation in the gap holds that part
                idle[win] -= _Cover(*compiling, merged=True).between(q_end[win], ms[k[win] + 1])
    # per-step count
    a, b = step_bounds  # sorted by start (TraceData.steps is)
    in_step = np.zeros(n, dtype=bool)
    if len(a) and n:
        j = np.searchsorted(a, q_ts, side="right") - 1
        in_step = (j >= 0) & (q_ts < b[np.maximum(j, 0)])
    # groups by (name, op, frame), vectorized
    events = []
    if n:
        base = len(S) + 1
        key = (q_name.astype(np.int64) * base + (op_name + 1)) * base + (fr_name + 1)
        uk, inv = np.unique(key, return_inverse=True)
        cnt = np.bincount(inv, minlength=len(uk))
        idl = np.bincount(inv, weights=np.nan_to_num(idle), minlength=len(uk))
        rows = np.argsort(-idl, kind="stable")[:MAX_SYNC_GROUPS]
        for r in rows:  # at most MAX_SYNC_GROUPS rows
            kk = int(uk[r])
            fr = kk % base - 1
            op = (kk // base) % base - 1
            nm = kk // base // base
            events.append({
                "name": S[nm], "count": int(cnt[r]),
                "idle_after_s": float(idl[r]) / 1e6 if merged is not None else None,
                "op": S[op] if op >= 0 else None, "frame": S[fr] if fr >= 0 else None,
            })
    return {
        "count": int(n),
        "per_step": (float(in_step.sum()) / len(a)) if len(a) else None,
        "idle_after_s": float(np.nansum(idle)) / 1e6 if merged is not None else None,
        "cuda_sync_events": int(len(cs_ts)),
        "in_compile": in_compile,
        "events": events,
    }


def _memcpy(t: TraceData, rows: np.ndarray, step_bounds) -> dict:
    """H2D volume and bandwidth, pageable copies (module docstring)."""
    g = t.gpu
    mc = rows & (g["kind"] == MEMCPY)
    known = g["bytes"] >= 0
    nbytes = np.maximum(g["bytes"], 0).astype(np.float64)
    h2d = mc & (g["copy"] == COPY_KINDS.index("HtoD"))
    d2h = mc & (g["copy"] == COPY_KINDS.index("DtoH"))
    pageable = mc & (t.pageable if t.pageable is not None and len(t.pageable) == len(g["ts"])
                     else np.zeros(len(g["ts"]), dtype=bool))
    h2d_s = float(g["dur"][h2d].sum()) / 1e6
    h2d_bytes = float(nbytes[h2d].sum())
    bw_s = float(g["dur"][h2d & known].sum()) / 1e6  # bandwidth over the copies whose size is known
    a, b = step_bounds
    share = None
    if len(a) and (b - a).sum() > 0:
        cov = _Cover(g["ts"][pageable], g["ts"][pageable] + np.maximum(g["dur"][pageable], 0))
        share = float(cov.between(a, b).sum() / (b - a).sum())
    return {
        "h2d_bytes": int(h2d_bytes), "h2d_s": h2d_s,
        "h2d_gbps": h2d_bytes / bw_s / 1e9 if bw_s > 0 else None,
        "d2h_bytes": int(nbytes[d2h].sum()),
        "pageable_count": int(pageable.sum()), "pageable_bytes": int(nbytes[pageable].sum()),
        "pageable_s": float(g["dur"][pageable].sum()) / 1e6,
        "pageable_share_of_step": share,
    }


def _device_name(t: TraceData, device: int | None) -> str | None:
    if device is None:
        return None
    props = t.device_properties or []
    for p in props:
        if isinstance(p, dict) and p.get("id") == device:
            return p.get("name")
    if 0 <= device < len(props) and isinstance(props[device], dict):
        return props[device].get("name")
    return None


# --------------------------------------------------------------------------- public API


def rank_metrics(t: TraceData) -> dict:
    """Every metric of one rank's trace (definitions in the module docstring). Keys: ``rank``,
    ``world_size``, ``events``, ``gpu_events``, ``has_gpu``, ``device``, ``device_name``,
    ``window_s``, ``gpu_busy_s``, ``busy_share``, ``idle_share``, ``compute_busy_share``,
    ``devices``, ``idle_breakdown``, ``steps``, ``kernels``, ``launches``, ``syncs``, ``memcpy``,
    ``compile`` (:func:`whyidle.analysis.trace_compile.compile_metrics`; None without torch.compile).
    GPU figures are None when the trace has no GPU op."""
    S = t.strings
    g, rt, cpu = t.gpu, t.runtime, t.cpu
    has_gpu = len(g["ts"]) > 0
    device, devices = _device_rows(t) if has_gpu else (None, [])
    top = next((d for d in devices if d["device"] == device), None)

    step_a = np.array([s[1] for s in t.steps], dtype=np.float64)
    step_b = step_a + np.maximum(np.array([s[2] for s in t.steps], dtype=np.float64), 0)
    step_bounds = (step_a, step_b)

    # host interval sets (all threads of the process)
    r_end = rt["ts"] + np.maximum(rt["dur"], 0)
    c_end = cpu["ts"] + np.maximum(cpu["dur"], 0)
    dl_ids = _ids(S, lambda s: s.startswith(DATALOADER_PREFIX) or any(n in s for n in DATALOADER_NAMES))
    not_host = _ids(S, lambda s: s.startswith("ProfilerStep#"))
    trace_cat = _ids(S, lambda s: s == "Trace")
    dlm = np.isin(cpu["name"], dl_ids)
    cm = ~dlm & ~np.isin(cpu["name"], not_host) & ~np.isin(cpu["cat"], trace_cat)
    host_sets = [(rt["ts"], r_end), (cpu["ts"][dlm], c_end[dlm]), (cpu["ts"][cm], c_end[cm])]

    aten_ids = _ids(S, lambda s: s.startswith("aten::"))
    py_cat = _ids(S, lambda s: s == "python_function")
    py_ids = np.unique(cpu["name"][np.isin(cpu["cat"], py_cat)]) if len(py_cat) else np.zeros(0, np.int64)
    sync_ids = _ids(S, lambda s: s in SYNC_NAMES)

    out: dict = {
        "rank": t.rank, "world_size": t.world_size, "events": int(t.events),
        "gpu_events": int(len(g["ts"])), "has_gpu": bool(has_gpu), "device": device,
        "device_name": _device_name(t, device),
        "window_s": None, "gpu_busy_s": None, "busy_share": None, "idle_share": None,
        "compute_busy_share": None, "devices": devices, "idle_breakdown": None,
        "kernels": None, "memcpy": None,
    }
    merged = None
    gpu_sets = None
    if has_gpu:
        rows = g["device"] == device
        ts = g["ts"][rows]
        dur = np.maximum(g["dur"][rows], 0)
        end = ts + dur
        kind, stream = g["kind"][rows], g["stream"][rows]
        found, launch_ts = _lookup(rt["correlation"], rt["ts"], g["correlation"][rows])
        _, launch_dur = _lookup(rt["correlation"], rt["dur"], g["correlation"][rows])
        cover_all = _Cover(ts, end)
        merged = (cover_all.s, cover_all.e)
        k, km = kind == KERNEL, (kind == KERNEL) | (kind == MEMCPY)
        gpu_sets = [_Cover(ts[k], end[k]), _Cover(ts[km], end[km]), cover_all]
        out.update({
            "window_s": top["window_s"], "gpu_busy_s": top["busy_s"], "busy_share": top["busy_share"],
            "idle_share": (1.0 - top["busy_share"]) if top["busy_share"] is not None else None,
            "compute_busy_share": top["compute_busy_share"],
            "idle_breakdown": _idle_breakdown(ts, end, stream, launch_ts, found, merged),
            "kernels": _kernel_stats(ts, end, dur, kind, stream, launch_ts, launch_dur, found),
            "memcpy": _memcpy(t, rows, step_bounds),
        })
    out["steps"] = _steps(t, gpu_sets, host_sets)
    out["launches"] = _launches(t)
    from whyidle.analysis.trace_compile import compile_intervals, compile_metrics  # they import this module

    out["syncs"] = _syncs(t, merged, aten_ids, py_ids, sync_ids, step_bounds, compile_intervals(t))
    out["compile"] = compile_metrics(t, step_bounds)
    return out
