"""The size law of ``timeline.json``: which steps of a long run are shown in full, and how the rest
and the counters are summarized, so the file's size and its writing time stay bounded however
long the job (docs/run-format.md, ``timeline.json``, "Size law").

A trainer with at most :data:`DETAIL_STEPS` steps is written in full, exactly as before the law.
A longer one keeps per-step detail (step slice and args, phase slices, GPU-starved slices) for a
bounded set of steps (:func:`plan_steps`): the warm-up and the first :data:`HEAD_STEPS` after it,
the last :data:`TAIL_STEPS`, and around anomalies, :data:`CONTEXT_STEPS` steps either side:
the steps the analysis left out other than warm-up (deep-trace or profiler windows, compilations),
epoch boundaries, and the slowest steps past the robust rule of the rolling diagnosis
(median + ``MAD_K`` × MAD, :mod:`whyidle.diagnose.departure`), slowest first; then, with what is
left, evenly spaced stretches of :data:`SAMPLE_STEPS` steps. Every other step is
in a summary window of at most ``window`` consecutive steps (``window`` = ⌈steps ÷
:data:`SUMMARY_SLICES`⌉, windows aligned to multiples of it and cut where detail starts). A
counter series longer than :data:`COUNTER_POINTS` values is reduced to buckets of k consecutive
values (:func:`bucket`). Pure numpy: no Python loop over steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from whyidle.diagnose.departure import MAD_FLOOR, MAD_K

#: Steps of one trainer whose detail is written in full. ~1 KB per detailed step (a step slice of
#: ~250 bytes and 6–9 phase slices of ~90) and ~20 µs to make and encode it on this 2-core box: 20,000
#: steps are ~20 MB and ~0.4 s, so with the summaries (:data:`SUMMARY_SLICES`) and the counters
#: (:data:`COUNTER_POINTS`) a file of any length stays under ~40 MB and ~1 s (measured: ≤ 21 MB,
#: ≤ 1 s up to 3,000,000 steps, docs/run-format.md), which Perfetto's UI and chrome://tracing load
#: in seconds (their JSON importers hold the whole file in memory: files of hundreds of MB load
#: slowly or not at all). Runs at or under this are written exactly as before the law.
DETAIL_STEPS = 20_000
#: Steps kept in full after the warm-up (the run's steady state as it began).
HEAD_STEPS = 2_000
#: Steps kept in full at the end (the run's last stretch: where a live run stands now).
TAIL_STEPS = 5_000
#: Steps kept either side of an anomaly (a slow step, an epoch boundary, a left-out step).
CONTEXT_STEPS = 4
#: Summary slices of one trainer (about: plus one per stretch of detail between them). ~1.5 KB
#: each with its phase-share slices: ~7 MB.
SUMMARY_SLICES = 5_000
#: Values of one counter series at most (~110–170 bytes each; the machine's CPU counter also costs
#: ~20 µs of scanning per value, cpu_series): 10,000 host ticks are 42 minutes at whyidle's 4 Hz, and
#: a 24-hour job is drawn at ~9 s resolution (~3 MB, ~0.2 s; the reader already keeps at most
#: ``record.reader.HOST_TICKS_MAX`` = 20,000 ticks of a run); longer series are reduced over k
#: consecutive values (perfetto: CPU read every k-th tick, GPU series averaged, memory used maximized).
COUNTER_POINTS = 10_000
#: Shares of the anomaly budget (what is left of :data:`DETAIL_STEPS` after the head and the tail)
#: that left-out steps and epoch boundaries may take at most; the slow steps get the rest, and
#: whatever one kind leaves unused passes to the next.
LEFT_OUT_SHARE = 0.25
BOUNDARY_SHARE = 0.25
#: Steps of each evenly spaced sample stretch, and the share of :data:`DETAIL_STEPS` the samples
#: may take of what the anomalies left: a viewer who zooms in anywhere in the job finds real steps
#: (their phases) within ~1/100 of the run, not only summaries.
SAMPLE_STEPS = 50
SAMPLE_SHARE = 0.25


@dataclass
class StepPlan:
    """Which steps of one trainer are written in full.

    ``detail``: bool per step; ``starts``/``ends``: the summary windows as step index ranges
    ``[start, end)`` (ascending, each of at most ``window`` steps, none holding a detailed step);
    ``reasons``: how many steps were kept in full for each reason (``warmup``, ``head``, ``tail``,
    ``left_out``, ``boundary``, ``slow``, ``sample``; a step counts under the first reason that
    took it);
    ``slow_ms``: the slow-step threshold in ms (None when the run is written in full)."""

    detail: np.ndarray
    window: int = 1
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    reasons: dict = field(default_factory=dict)
    slow_ms: float | None = None

    @property
    def summarized(self) -> bool:
        return bool(len(self.starts))


def slow_limit(step_s: np.ndarray) -> float:
    """The slow-step threshold in seconds: median + ``MAD_K`` × max(MAD, ``MAD_FLOOR`` × median)
    of ``step_s`` (seconds), the rolling diagnosis's rule (:mod:`whyidle.diagnose.departure`)."""
    med = float(np.median(step_s))
    mad = float(np.median(np.abs(step_s - med), overwrite_input=True))  # its own copy: partitioned in place
    return med + MAD_K * max(mad, MAD_FLOOR * med)


def _take(detail: np.ndarray, centers: np.ndarray, context: int, budget: int) -> int:
    """Adds to ``detail`` (in place) the steps around ``centers`` (step indexes, in priority order,
    ``context`` steps either side) while the new steps fit in ``budget``; returns how many were
    added. ``centers`` are taken in blocks of doubling size (a numpy pass over the block's
    steps each, never over the run); the block that would pass the budget is taken one center at
    a time, up to the first that does not fit."""
    added, k, pos, n = 0, 1, 0, len(detail)
    offsets = np.arange(-context, context + 1)
    while pos < len(centers) and added < budget:
        chunk = centers[pos:pos + k]
        pos += k
        k *= 2
        idx = np.unique(np.clip(chunk[:, None] + offsets, 0, n - 1))
        new = idx[~detail[idx]]
        if added + len(new) > budget:
            for c in chunk.tolist():
                lo, hi = max(0, c - context), min(n, c + context + 1)
                m = int(np.count_nonzero(~detail[lo:hi]))
                if added + m > budget:
                    return added
                detail[lo:hi] = True
                added += m
            return added
        detail[new] = True
        added += len(new)
    return added


def plan_steps(step_s: np.ndarray, warmup: int, boundary: np.ndarray, left_out: np.ndarray) -> StepPlan:
    """The steps of one trainer kept in full, and the summary windows of the rest.

    Args:
        step_s: step times (seconds), one per step in order.
        warmup: the warm-up steps at the start (:func:`whyidle.analysis.steps.select_steps`).
        boundary: bool per step: the first step of an epoch (``boundary``).
        left_out: bool per step: a step the analysis left out other than warm-up (deep-trace and
            profiler windows: ``profiled``; compilations; boundaries).
    Returns:
        A :class:`StepPlan`; every step detailed when there are at most :data:`DETAIL_STEPS`.
    """
    n = len(step_s)
    if n <= DETAIL_STEPS:
        return StepPlan(detail=np.ones(n, bool))
    detail = np.zeros(n, bool)
    reasons = {}
    warm = min(warmup, n)
    detail[:warm] = True
    reasons["warmup"] = warm
    head_end = min(n, warm + HEAD_STEPS)
    detail[warm:head_end] = True
    reasons["head"] = head_end - warm
    tail_start = max(head_end, n - TAIL_STEPS)
    detail[tail_start:] = True
    reasons["tail"] = n - tail_start
    budget = max(0, DETAIL_STEPS - int(detail.sum()))
    rest = np.zeros(n, bool)
    rest[head_end:] = True
    for name, share, centers in (
            ("left_out", LEFT_OUT_SHARE, np.flatnonzero(left_out & rest & ~boundary)),
            ("boundary", BOUNDARY_SHARE, np.flatnonzero(boundary & rest))):
        got = _take(detail, centers, CONTEXT_STEPS, int(budget * share))
        reasons[name] = got
        budget -= got
    limit = slow_limit(step_s)
    slow = np.flatnonzero((step_s > limit) & rest & ~detail)
    slow = slow[np.argsort(-step_s[slow], kind="stable")]
    reasons["slow"] = _take(detail, slow, CONTEXT_STEPS, budget)
    budget = min(budget - reasons["slow"], int(DETAIL_STEPS * SAMPLE_SHARE))
    half = SAMPLE_STEPS // 2
    stretches = budget // (2 * half + 1)
    if stretches and tail_start - head_end > 2 * half + 1:
        centers = np.linspace(head_end + half, tail_start - half - 1, stretches + 2)[1:-1].astype(np.int64)
        reasons["sample"] = _take(detail, np.unique(centers), half, budget)
    window = -(-n // SUMMARY_SLICES)
    # the windows: runs of summarized steps, cut where a multiple of ``window`` starts (bool masks
    # of the steps: a day's index arrays and their shifted copies were 50 MB at once)
    summarized = ~detail
    cut = np.zeros(n + 1, bool)
    cut[::window] = True
    cut[n] = True
    first = summarized.copy()
    first[1:] &= detail[:-1] | cut[1:n]
    last = summarized.copy()
    last[:-1] &= detail[1:] | cut[1:n]
    starts, ends = np.flatnonzero(first), np.flatnonzero(last) + 1
    return StepPlan(detail=detail, window=window, starts=starts, ends=ends, reasons=reasons,
                    slow_ms=round(limit * 1e3, 3))


def bucket(n: int) -> int:
    """Values per bucket for a counter series of ``n`` values: 1 up to :data:`COUNTER_POINTS`,
    else ⌈n ÷ COUNTER_POINTS⌉."""
    return 1 if n <= COUNTER_POINTS else -(-n // COUNTER_POINTS)


def reduce_mean(values, k: int, weights=None) -> np.ndarray:
    """Means of ``values`` over buckets of ``k`` consecutive values (weighted by ``weights`` when
    given, e.g. the intervals' seconds); NaN values are left out of their bucket's mean."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones(len(v)) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = ~np.isnan(v)
    w = np.where(ok, w, 0.0)
    starts = np.arange(0, len(v), k)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.add.reduceat(np.where(ok, v, 0.0) * w, starts) / np.add.reduceat(w, starts)
    if weights is not None:  # a bucket of zero-length intervals: the plain mean of its values
        plain = reduce_mean(values, k)
        out = np.where(np.isnan(out), plain, out)
    return out


def reduce_max(values, k: int) -> np.ndarray:
    """Largest of ``values`` over buckets of ``k`` consecutive values (NaN when all are NaN)."""
    v = np.asarray(values, dtype=np.float64)
    starts = np.arange(0, len(v), k)
    filled = np.where(np.isnan(v), -np.inf, v)
    out = np.maximum.reduceat(filled, starts)
    return np.where(np.isneginf(out), np.nan, out)
