"""The rank the others wait for, from the collectives in a job's rank traces (pure; numpy only).

A collective completes on every rank when the last one has arrived, so its execution on each rank
lasts from that rank's arrival to the common completion: arrival relative to completion is
``−duration``, and the rank whose execution is shortest arrived last (the step's *culprit*); each
other rank's excess over it is its wait. Aligning on the completion needs no clock alignment
between nodes. What executes a collective in a Kineto trace:

* **NCCL / RCCL**: the collective's GPU kernel (``ncclKernel_*``, ``ncclDevKernel_*``) on the
  rank's own device; it starts when the rank's stream reaches it and spins until every peer
  has joined. Kernels whose ``Group size`` (newer Kineto) is smaller than the job's world size
  belong to a sub-group (tensor or pipeline parallel) and are left out: only collectives of the
  whole job compare across all ranks.
* **gloo**: the ``gloo:<collective>`` annotation, recorded on gloo's worker thread from the start
  of the collective's execution to its end (the ``c10d::`` op on the training thread only
  enqueues it).

Collectives are matched across ranks per ``ProfilerStep#N`` (the step whose host window holds the
collective's launch call; without one, its start): the k-th collective of a name in step N on
one rank is the k-th on every other. A (step, name) group is compared only when every rank holds
the same number of them (sub-sampled or partial traces differ, and guessing would pair unrelated
collectives). The length of the union of a rank's matched collectives in a step (gloo runs a
step's gradient buckets on several threads at once, NCCL may use several streams: their
durations overlap and must not add up) is its seconds in collectives in that step, which :func:`whyidle.analysis.collectives.culprit` turns into the culprit, as for live runs.
HTA has no such analysis; AMD's TraceLens reports "rank N arrived last X % of the time" per
collective from start times after aligning clocks.
"""

from __future__ import annotations

import re
import statistics

import numpy as np

from whyidle.analysis.trace import _Cover, _lookup, _merge
from whyidle.record.trace_data import TraceData

#: GPU kernels that execute a collective: NCCL's (and RCCL's, which keeps the names).
COLLECTIVE_KERNEL = re.compile(r"^nccl(Dev)?Kernel", re.IGNORECASE)

#: Host annotations that execute a gloo collective (on gloo's worker thread).
GLOO_PREFIX = "gloo:"

#: Host event categories of operators (``aten::*``, ``c10d::*``): a CPU-only rank's device work.
#: Annotations (``user_annotation``: Lightning's ``run_training_batch``, DDP's ``forward``) and
#: ``python_function`` events span the Python around them and are left out.
OPERATOR_CATS = ("cpu_op", "Operator")

#: Fewest steps every rank holds for a measured culprit from traces: the profiler's ``schedule``
#: already skipped its ``wait`` and ``warmup`` steps, and traces usually hold 2–5 active steps.
TRACE_MIN_STEPS = 2

#: A part of the culprit's step (its DataLoader, its device compute) names why it is late when it
#: is larger than on the other ranks by at least this fraction of the wait it causes.
CAUSE_MIN_SHARE = 0.5


def collective_table(t: TraceData, device: int | None) -> dict:
    """One rank's collectives and per-step figures, small enough to send between processes.

    Args:
        t: the rank's trace.
        device: the device the rank used (:func:`whyidle.analysis.trace.rank_metrics` ``device``),
            None without GPU activity.
    Returns:
        ``{kind, rows, outside, compute_s}``: ``kind`` ``"nccl"``, ``"gloo"`` or None (no
        collective); ``rows``: ``[(step, name, start_us, dur_us)]`` in start order (the rank's own
        clock), for the collectives inside a ``ProfilerStep`` (``outside``: how many were not); ``compute_s``: step → seconds
        the device ran other GPU work (union of its non-collective kernels, memcpys and memsets
        inside the step's host window), empty without GPU activity.
    """
    S = t.strings
    steps = sorted(t.steps, key=lambda s: s[1])
    a = np.array([s[1] for s in steps], dtype=np.float64)
    b = a + np.maximum(np.array([s[2] for s in steps], dtype=np.float64), 0.0)
    nums = [int(s[0]) for s in steps]
    g = t.gpu
    kind = None
    ts = dur = ref = names = None
    compute: dict[int, float] = {}
    if device is not None and len(g["ts"]):
        ids = np.array([i for i, s in enumerate(S) if COLLECTIVE_KERNEL.search(s)], dtype=np.int64)
        mine = g["device"] == device
        coll = mine & np.isin(g["name"], ids)
        group = g.get("group")
        if group is not None and t.world_size:
            coll &= (group < 0) | (group >= int(t.world_size))
        other = mine & ~np.isin(g["name"], ids)
        if len(a):
            busy = _Cover(g["ts"][other], g["ts"][other] + np.maximum(g["dur"][other], 0)).between(a, b)
            compute = {n: float(v) / 1e6 for n, v in zip(nums, busy)}
        if coll.any():
            kind = "nccl"
            ts, dur, names = g["ts"][coll], np.maximum(g["dur"][coll], 0), g["name"][coll]
            found, launch = _lookup(t.runtime["correlation"], t.runtime["ts"], g["correlation"][coll])
            ref = np.where(found, launch, ts)
    gloo = np.array([i for i, s in enumerate(S) if s.startswith(GLOO_PREFIX)], dtype=np.int64)
    if device is None and len(a):  # CPU-only: the cores are the device; its work is the operators
        op_cats = np.array([i for i, s in enumerate(S) if s in OPERATOR_CATS], dtype=np.int64)
        ops = np.isin(t.cpu["cat"], op_cats)
        busy = _Cover(t.cpu["ts"][ops], t.cpu["ts"][ops] + np.maximum(t.cpu["dur"][ops], 0)).between(a, b)
        compute = {n: float(v) / 1e6 for n, v in zip(nums, busy)}
    if kind is None and len(gloo):
        rows = np.isin(t.cpu["name"], gloo)
        if rows.any():
            kind = "gloo"
            ts, dur, names = t.cpu["ts"][rows], np.maximum(t.cpu["dur"][rows], 0), t.cpu["name"][rows]
            ref = ts
    if kind is None:
        return {"kind": None, "rows": [], "outside": 0, "compute_s": compute}
    order = np.argsort(ts, kind="stable")
    ts, dur, names, ref = ts[order], dur[order], names[order], ref[order]
    at = np.searchsorted(a, ref, side="right") - 1
    inside = (at >= 0) & (ref < b[np.maximum(at, 0)]) if len(a) else np.zeros(len(ref), dtype=bool)
    rows = [(nums[int(i)], S[int(n)], float(x), float(d)) for i, n, x, d, ok in zip(at, names, ts, dur, inside) if ok]
    return {"kind": kind, "rows": rows, "outside": int((~inside).sum()), "compute_s": compute}


def match(tables: dict) -> dict | None:
    """Matches the ranks' collectives (module docstring).

    Args:
        tables: rank → :func:`collective_table`.
    Returns:
        None with fewer than two ranks holding collectives, else ``{kind, waits, matched,
        skipped, missing}``: ``kind`` ``"nccl"``/``"gloo"`` (``"mixed"`` when ranks differ);
        ``waits`` rank → (step → seconds inside the matched collectives of that step: the length of
        their union), over the steps
        with a matched collective (empty maps when nothing matched); ``matched``: collectives
        compared per rank; ``skipped``: (step, name) groups left out (not every rank holds the
        same number of them); ``missing``: ranks without any collective in their steps.
    """
    kinds = {t["kind"] for t in tables.values() if t.get("rows")}
    if sum(1 for t in tables.values() if t.get("rows")) < 2:
        return None
    groups: dict = {}
    for r, t in tables.items():
        mine: dict = {}
        for step, name, start, dur in t.get("rows") or ():
            mine.setdefault((step, name), []).append((start, start + dur))
        groups[r] = mine
    keys = set().union(*groups.values())
    same = [k for k in keys if len({len(m.get(k, ())) for m in groups.values()}) == 1]
    spans: dict = {r: {} for r in groups}
    for step, name in same:
        for r, m in groups.items():
            spans[r].setdefault(step, []).extend(m[(step, name)])
    waits = {r: {step: _union_s(iv) for step, iv in by_step.items()} for r, by_step in spans.items()}
    first = next(iter(groups.values()))
    return {"kind": kinds.pop() if len(kinds) == 1 else "mixed", "waits": waits,
            "matched": sum(len(first[k]) for k in same), "skipped": len(keys) - len(same),
            "missing": sorted(r for r, t in tables.items() if not t.get("rows"))}


def _union_s(intervals: list) -> float:
    """Seconds covered by ``(start_us, end_us)`` intervals (overlaps counted once)."""
    iv = np.asarray(intervals, dtype=np.float64).reshape(-1, 2)
    starts, ends = _merge(iv[:, 0], iv[:, 1])
    return float((ends - starts).sum()) / 1e6


def late_cause(rank, steps: list, data_s: dict, compute_s: dict, caused_s: float) -> dict | None:
    """Why the culprit arrives late: what it does more per step than the other ranks.

    Args:
        rank: the culprit.
        steps: the compared step numbers.
        data_s: rank → (step → seconds its host spent in the DataLoader in that step).
        compute_s: rank → (step → seconds its device ran non-collective work,
            :func:`collective_table` ``compute_s``).
        caused_s: the wait per step it causes each other rank (seconds).
    Returns:
        ``{part, extra_s, others_s}`` or None without other ranks or steps: ``part`` is
        ``"data_wait"`` (its DataLoader takes longer) or ``"compute"`` (its device computes longer:
        more work, or a slower or throttled device; CPU-only, its operators) when that part exceeds the other ranks'
        median by ≥ :data:`CAUSE_MIN_SHARE` of ``caused_s`` (the larger of the two), else
        ``"host"`` (neither: host work the others do not do, or do faster — Python, logging,
        evaluation, checkpoints); ``extra_s`` the culprit's excess in that part (seconds per
        step; for ``host``, ``caused_s``); ``others_s`` the others' median in it.
    """
    others = [r for r in data_s if r != rank]
    if not others or not steps:
        return None

    def mean(series: dict, r) -> float | None:
        vals = [series.get(r, {}).get(i) for i in steps]
        vals = [v for v in vals if v is not None]
        return statistics.fmean(vals) if vals else None

    best = None
    for part, series in (("data_wait", data_s), ("compute", compute_s)):
        mine = mean(series, rank)
        theirs = [v for v in (mean(series, r) for r in others) if v is not None]
        if mine is None or not theirs:
            continue
        extra, base = mine - statistics.median(theirs), statistics.median(theirs)
        if extra >= CAUSE_MIN_SHARE * caused_s and (best is None or extra > best["extra_s"]):
            best = {"part": part, "extra_s": extra, "others_s": base}
    return best or {"part": "host", "extra_s": caused_s, "others_s": None}
