"""Step records → step-time metrics (pure; no framework imports).

Definitions (all over the *analyzed* steps, see :func:`select_steps`):

- step time: ``t1 - t0`` of each step record, seconds.
- shares: each phase's summed time divided by the summed step time (fractions, 0–1):
  ``data_wait`` (blocked in the DataLoader, or in tf.data's ``GetNext``), ``forward``,
  ``backward``, ``optimizer``, ``eval`` (forward with grad disabled), ``compute`` (Keras /
  TensorFlow only: the compiled train step, forward + backward + optimizer fused by
  ``tf.function``, less its input wait; present only when steps have it) and ``other_host`` (the
  rest of the step: Python, logging, callbacks, loss functions written outside modules, ...).
- samples/s: summed samples divided by summed step time, over the steps whose samples were
  counted (when steps are short, every k-th; the others are ``lite``).
- ``data_cpu_share``: main-thread CPU time during data wait / data wait (near 1: the main process
  computes its batches; near 0: it sleeps on I/O or on worker queues).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from whyidle.analysis.facts import StepMetrics
from whyidle.analysis.stepcols import StepCols, positions, take
from whyidle.record.steptable import BY_CODES, NULL_INT, expand_lite, phase_spans

#: Steps skipped at the start of a run: the first steps include worker start-up, lazy
#: initialization and allocator warm-up, and would skew per-step shares (PyTorch profiler
#: schedules use ``wait``/``warmup`` steps for the same reason).
WARMUP_STEPS_LONG = 2  # when the run has at least MIN_STEPS_FOR_LONG_WARMUP steps
WARMUP_STEPS_SHORT = 1
MIN_STEPS_FOR_LONG_WARMUP = 10

#: Steps that contain an epoch boundary (iterator creation, StopIteration, eval forwards) are left
#: out of the steady-state shares unless they are this common (then they *are* the steady state).
MAX_BOUNDARY_FRACTION_TO_EXCLUDE = 0.3

#: Share name of each ``ph`` phase code name (``whyidle.record.steptable.PHASE_CODES``).
SHARE_OF_PHASE = {"data": "data_wait", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
                  "eval": "eval", "compute": "compute"}

PHASE_KEYS = (("data_wait", "data"), ("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt"), ("eval", "eval"))
#: The fused compiled step of Keras / TensorFlow (see the module docstring).
COMPUTE_KEY = ("compute", "comp")

#: Step markers, most specific first: a process that has Keras steps (``fit``'s batches) keeps
#: only those; then optimizer steps, backward-marked ones (a loop without ``torch.optim``), batches,
#: and forward calls (inference over tensors); iterator-marked steps are what is left otherwise.
PREFERRED_BY = ("keras", "optimizer", "backward", "loader", "forward")


def steps_of(records) -> list:
    """The ``step`` records of one process, using one boundary kind.

    Args:
        records: a process's records (dicts), or a :class:`whyidle.record.steptable.StepTable`
            (what :func:`whyidle.record.reader.load_run` builds; its rows read like dicts).
    Keras-marked steps win when there are any, then optimizer-marked ones (a process that started
    with loader- or backward-marked steps and later stepped an optimizer keeps only the optimizer ones), see
    ``PREFERRED_BY``; GPU times from ``gpu_step`` records are merged in as ``gpu_ms``.
    """
    if hasattr(records, "rows"):  # a StepTable: the marker chosen over its ``by`` column
        codes = np.frombuffer(records.by, dtype=np.int8)
        for by in PREFERRED_BY:
            rows = np.flatnonzero(codes == BY_CODES.index(by))
            if len(rows):
                return records.rows(positions(rows))
        return records.rows()
    else:
        steps = []
        for r in records:
            if r.get("k") == "step":
                steps.append(r)
            elif r.get("k") == "steps":
                steps.extend(expand_lite(r))
        gpu = {r["i"]: r["gpu_ms"] for r in records if r.get("k") == "gpu_step"}
        if gpu:
            steps = [dict(s, gpu_ms=gpu.get(s["i"])) for s in steps]
    for by in PREFERRED_BY:
        if any(s.get("by") == by for s in steps):
            return [s for s in steps if s.get("by") == by]
    return steps


def select_steps(steps: list[dict], compile_spans: list[tuple[int, int]] | None = None) -> tuple[list[dict], dict]:
    """Chooses the steady-state steps to analyze.

    Args:
        steps: the process's steps in order (``t0``/``t1`` ns).
        compile_spans: ``(t0, t1)`` ns of the process's torch.compile compilations: the steps that
            overlap one hold a compilation and are left out (when at least 3 others remain), like
            warm-up; their time is the wall time's ``compile`` part
            (:mod:`whyidle.analysis.compile`).
    Returns:
        (analyzed, info) where info = ``{"total", "warmup", "boundary_excluded",
        "boundary_s", "boundary_data_s", "profiled_excluded", "compile_excluded"}`` (counts, and seconds spent
        in excluded boundary steps, and of those in their data wait: a new epoch's iterator and its
        workers' first batches). Steps run under whyidle's TensorFlow profiler window (``profiled``) are left out
        like boundary steps when at least 3 others remain: the profiler slows them a little; they
        only give the input-wait ratio (:mod:`whyidle.analysis.keras`).
    """
    n = len(steps)
    warmup = WARMUP_STEPS_LONG if n >= MIN_STEPS_FOR_LONG_WARMUP else (WARMUP_STEPS_SHORT if n >= 3 else 0)
    c = StepCols(steps)
    keep = np.zeros(n, dtype=bool)
    keep[warmup:] = True
    compiling = np.zeros(n, dtype=bool)
    if compile_spans:
        t0, t1 = c.ints("t0"), c.ints("t1")
        for a, b in compile_spans:
            compiling |= (a < t1) & (b > t0)
        compiling &= keep
        if compiling.any() and keep.sum() - compiling.sum() >= 3:
            keep &= ~compiling
        else:
            compiling[:] = False
    boundary = c.flags("boundary") & keep
    excluded = np.zeros(n, dtype=bool)
    left = int(keep.sum())
    if boundary.any() and boundary.sum() <= MAX_BOUNDARY_FRACTION_TO_EXCLUDE * left and left - boundary.sum() >= 3:
        excluded = boundary
        keep &= ~boundary
    profiled = c.flags("profiled") & keep
    if profiled.any() and keep.sum() - profiled.sum() >= 3:
        keep &= ~profiled
    else:
        profiled[:] = False
    boundary_ns = boundary_data_ns = 0
    if excluded.any():
        for a, b in c.blocks():  # a block of steps at a time (a day of steps: 25 MB a column)
            out = excluded[a:a + b.n]
            data = b.ints("data")[out]
            boundary_ns += int(b.durations()[out].sum())
            boundary_data_ns += int(data[data != NULL_INT].sum())
    info = {
        "total": n,
        "warmup": warmup,
        "boundary_excluded": int(excluded.sum()),
        "boundary_s": boundary_ns / 1e9,
        "boundary_data_s": boundary_data_ns / 1e9,
        "profiled_excluded": int(profiled.sum()),
        "compile_excluded": int(compiling.sum()),
    }
    return take(steps, keep), info


def in_spans(step, spans: list[tuple[int, int]]) -> bool:
    a, b = int(step["t0"]), int(step["t1"])
    return any(s < b and e > a for s, e in spans)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0–100) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentile_of(values: np.ndarray, q: float):
    """:func:`percentile` of a non-empty numeric array (the same value), without a Python number
    per value: a day of steps as a list of floats took ~40 MB."""
    n = len(values)
    if n == 1:
        return values[0].item()
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    part = np.partition(values, [lo, hi])
    a, b = part[lo].item(), part[hi].item()
    return a + (b - a) * (pos - lo)


class ValueCounts:
    """The values of a numeric field gathered a block at a time as value counts, for
    :func:`percentile_of`'s value without keeping every value (batch sizes: a few distinct ones).
    ``add(values)`` takes an array; ``n`` counts the values added."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.n = 0

    def add(self, values: np.ndarray) -> None:
        if len(values):
            self.parts.append(np.unique(values, return_counts=True))
            self.n += len(values)

    def percentile(self, q: float):
        """:func:`percentile_of` of all the values added (``ValueError`` when none were)."""
        if not self.n:
            raise ValueError("no values")
        values = np.concatenate([v for v, _ in self.parts])
        counts = np.concatenate([k for _, k in self.parts])
        order = np.argsort(values, kind="stable")
        values, ends = values[order], np.cumsum(counts[order])  # sorted value k ends at ends[k]
        pos = (self.n - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, self.n - 1)
        a, b = (values[np.searchsorted(ends, k, side="right")].item() for k in (lo, hi))
        if self.n == 1:
            return a
        return a + (b - a) * (pos - lo)


def field_percentile(rows: list, key: str, q: float):
    """:func:`percentile` of an int field's non-null values over ``rows`` (step dicts or rows of a
    table), read a block of steps at a time; None when no step has it."""
    cols, counts = StepCols(rows), ValueCounts()
    for _, b in cols.blocks():
        counts.add(b.values(key))
    return counts.percentile(q) if counts.n else None


def _overlaps(steps: list, intervals: list[tuple[int, int]]) -> list[int]:
    """Per step, the ns of ``intervals`` (sorted, disjoint) inside ``[t0, t1]`` (steps in order)."""
    out, j = [], 0
    for s in steps:
        t0, t1 = s["t0"], s["t1"]
        while j < len(intervals) and intervals[j][1] <= t0:
            j += 1
        ns, k = 0, j
        while k < len(intervals) and intervals[k][0] < t1:
            ns += max(0, min(t1, intervals[k][1]) - max(t0, intervals[k][0]))
            k += 1
        out.append(ns)
    return out


def _outside_by_phase(steps: list, per_step: list[int], intervals: list[tuple[int, int]]) -> dict[str, int]:
    """ns of ``intervals`` (sorted, disjoint) inside each phase (share names) of the steps that
    hold some (``per_step``: :func:`_overlaps`), from the steps' ``ph`` spans; a step without spans
    counts none (its interval time is left to ``other_host``)."""
    starts = [a for a, _ in intervals]
    ends = [b for _, b in intervals]
    out: dict[str, int] = {}
    for s, ns in zip(steps, per_step):
        ph = s.get("ph")
        if not ns or not ph:
            continue
        # the intervals ending after the step starts and starting before it ends
        mine = intervals[bisect.bisect_right(ends, s["t0"]):bisect.bisect_left(starts, s["t1"])]
        for t0, t1, phase in phase_spans(s["t0"], s["t1"], ph, 1000):
            name = SHARE_OF_PHASE.get(phase)
            if name is not None:
                out[name] = out.get(name, 0) + sum(max(0, min(t1, b) - max(t0, a)) for a, b in mine)
    return out


def step_metrics(steps: list[dict], outside: list[tuple[int, int]] | None = None) -> StepMetrics:
    """Metrics of the analyzed steps (see the module docstring for definitions).

    Returns a dict with ``steps``, ``window`` ([t0, t1] monotonic ns), ``wall_s`` (window length,
    s), ``samples_per_s``, ``steps_per_s``, ``batch_size`` (median samples per step),
    ``step_time_s`` {p50, p90, mean, min, max}, ``shares``, ``data_wait_s_per_step`` (mean),
    ``compute_s_per_step`` (mean of step minus data wait), ``data_cpu_share``,
    ``main_cpu_share`` (main-thread CPU / step time), ``lite_steps`` (steps recorded with less
    detail: shares, samples and CPU times come from the others), ``whyidle_share`` (fraction of the
    detailed steps' time that was whyidle's own step-boundary work, the step records' ``wi``,
    which the shares leave out),
    ``gpu_ms`` {p50, mean} or None; ``outside_share``: fraction of the detailed steps' time inside
    ``outside`` intervals (sorted, disjoint ``(t0, t1)`` ns: checkpoint saving and tracker logging
    called from the loop, which the whole-job accounting reports as parts of their own), left out
    of the shares like whyidle's own work (it would otherwise read as the program's host work), and
    out of the phase it fell in (a tracker logging from a forward hook: ``forward``) where the step
    has phase spans; the shares never sum above 1.
    Errors: ``ValueError`` for an empty list.
    """
    if not steps:
        raise ValueError("no steps to analyze")
    c = StepCols(steps)
    n = c.n
    # a long run is read a block of steps at a time: its sums are exact ints (ns, counts), its
    # medians come from value counts (percentile_of's value), only the step times are kept whole
    blocks = list(c.blocks())
    # phase shares over the steps whose phases were timed (lite steps without hooks have none)
    phased_mask = np.concatenate([~(b.flags("lite") & (b.ints("data") == NULL_INT)) for _, b in blocks])
    if not phased_mask.any():
        phased_mask[:] = True
    times = np.empty(n)  # float64 seconds: no Python float per step
    sums = dict.fromkeys(("own", "phased_wall", "samples", "samples_dur", "timed_data", "data_cpu", "timed_dur",
                          "cpu", "lite"), 0)
    keys = PHASE_KEYS + (COMPUTE_KEY,)
    phase_ns = dict.fromkeys((key for _, key in keys), 0)
    has_compute = False
    batch, known_batches, micro, gpu_parts = ValueCounts(), ValueCounts(), ValueCounts(), []

    def total_of(v: np.ndarray, mask=None) -> int:
        """The sum of an int field's non-null values (ns, counts) over ``mask``."""
        v = v if mask is None else v[mask]
        return int(v[v != NULL_INT].sum())

    for a, b in blocks:
        dur = b.ints("t1") - b.ints("t0")  # ns
        times[a:a + b.n] = dur / 1e9
        phased = phased_mask[a:a + b.n]
        sums["own"] += total_of(b.ints("wi"), phased)
        sums["phased_wall"] += int(dur[phased].sum())
        for _, key in keys:
            v = b.ints(key)
            if key == COMPUTE_KEY[1]:
                has_compute = has_compute or bool((v != NULL_INT).any())
            phase_ns[key] += total_of(v, phased)
        samples, batches = b.ints("samples"), b.ints("batches")
        known = samples != NULL_INT
        if known.any():
            sums["samples"] += int(samples[known].sum())
            sums["samples_dur"] += int(dur[known].sum())
            batch.add(samples[known] / np.maximum(1, np.where(batches == NULL_INT, 1, batches))[known])
        known_batches.add(batches[batches != NULL_INT])
        # CPU times are on fully recorded steps only (lite steps have none): shares over those steps
        cpu = b.ints("cpu")
        timed = cpu != NULL_INT
        sums["timed_data"] += total_of(b.ints("data"), timed)
        sums["data_cpu"] += total_of(b.ints("data_cpu"), timed)
        sums["timed_dur"] += int(dur[timed].sum())
        sums["cpu"] += int(cpu[timed].sum())
        gpu = b.gpu_ms()
        gpu_parts.append(gpu[~np.isnan(gpu)])
        mb = b.ints("mb")
        micro.add(mb[mb != NULL_INT])
        sums["lite"] += int(b.flags("lite").sum())
        del dur, samples, batches, cpu, gpu, mb
    total = float(times.sum()) or 1e-12
    # whyidle's own step-boundary work ("wi": record building, hook switching) is not the program's
    # host work: shares are of the step time without it
    own_s = sums["own"] / 1e9
    phased = [steps[j] for j in np.flatnonzero(phased_mask).tolist()] if outside else []
    per_step = _overlaps(phased, outside) if outside else []
    outside_s = sum(per_step) / 1e9
    in_phase = _outside_by_phase(phased, per_step, outside) if outside_s else {}
    phased_wall_s = sums["phased_wall"] / 1e9
    phased_s = (phased_wall_s - own_s - outside_s) or 1e-12
    shares = {}
    for name, key in PHASE_KEYS + ((COMPUTE_KEY,) if has_compute else ()):
        shares[name] = max(0.0, phase_ns[key] - in_phase.get(name, 0)) / 1e9 / phased_s
    over = sum(shares.values())
    if over > 1.0:  # interval time inside phases of steps without spans: scaled back to the step
        shares = {k: v / over for k, v in shares.items()}
    shares["other_host"] = max(0.0, 1.0 - sum(shares.values()))
    samples_per_s = sums["samples"] / (sums["samples_dur"] / 1e9) if batch.n else None
    data_s = shares["data_wait"] * total  # the phased steps' share, over all steps
    timed_data_s = sums["timed_data"] / 1e9
    data_cpu = sums["data_cpu"] / 1e9
    timed_s = sums["timed_dur"] / 1e9
    gpu = np.concatenate(gpu_parts)
    del gpu_parts
    lite_steps = sums["lite"]
    batch = batch.percentile(50) if batch.n else None
    return {
        "steps": len(steps),
        "window": [steps[0]["t0"], steps[-1]["t1"]],
        "wall_s": (steps[-1]["t1"] - steps[0]["t0"]) / 1e9,
        "samples_per_s": samples_per_s,
        "steps_per_s": len(steps) / total,
        "batch_size": batch,
        "batches_per_step": known_batches.percentile(50) if known_batches.n else 0,
        "micro_batches_per_step": micro.percentile(50) if micro.n else None,  # loop.py refines it
        "backward_per_step": micro.percentile(50) if micro.n else None,
        "step_time_s": {
            "p50": float(np.percentile(times, 50)), "p90": float(np.percentile(times, 90)),
            "mean": total / len(times), "min": float(times.min()), "max": float(times.max()),
        },
        "shares": shares,
        "data_wait_s_per_step": data_s / len(steps),
        "compute_s_per_step": (total - data_s) / len(steps),
        "data_cpu_share": (data_cpu / timed_data_s) if timed_data_s > 0 else None,
        "main_cpu_share": sums["cpu"] / 1e9 / timed_s if timed_s > 0 else None,
        "lite_steps": lite_steps,
        "whyidle_share": own_s / phased_wall_s if phased_wall_s > 0 else 0.0,
        "outside_share": outside_s / phased_wall_s if phased_wall_s > 0 else 0.0,
        "gpu_ms": {"p50": percentile_of(gpu, 50), "mean": float(gpu.sum()) / len(gpu)} if len(gpu) else None,
    }
