"""Run records → time series on the run's clock, for plots and timelines (pure; numpy only).

Every time here is **seconds since the run's origin**: the first clock anchor of ``meta.json``
(``whyidle run`` took it just before starting the command), or the earliest record when the
anchor is missing. The origin in monotonic ns is returned with each series so a renderer can go
back to the recorded clock (``t_ns = origin_ns + t_s * 1e9``).

Series are *per interval* between two consecutive samples, never one snapshot: a CPU value is
the CPU-seconds used between two host ticks divided by the seconds between them (``cores``,
1.0 = one core busy), plotted at the end of the interval.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from whyidle.analysis import host as host_analysis
from whyidle.analysis.facts import RunFacts
from whyidle.analysis.steps import COMPUTE_KEY, PHASE_KEYS
from whyidle.analysis import stepcols
from whyidle.analysis.stepcols import StepCols
from whyidle.record.steptable import NULL_INT

#: Phase columns of a step series, in the order a step runs them: name → step record key.
STEP_PHASES = tuple((name, key) for name, key in PHASE_KEYS) + (COMPUTE_KEY,)


def run_origin(meta: dict, *record_lists: list[dict]) -> int:
    """The run's time origin in monotonic ns: ``meta["anchors"][0]["monotonic_ns"]``, else the
    smallest ``t`` of the given records, else 0."""
    anchors = meta.get("anchors") or []
    if anchors and anchors[0].get("monotonic_ns") is not None:
        return int(anchors[0]["monotonic_ns"])
    ts = [r["t"] for records in record_lists for r in records if isinstance(r.get("t"), int)]
    return min(ts) if ts else 0


def step_series(steps: list, origin_ns: int) -> dict:
    """Per-step columns of a step list (records or :class:`~whyidle.record.steptable.StepView`).

    Returns a dict of equal-length lists: ``i``; ``t0_s`` (start, s since origin); ``step_s``
    (step time, s); one column per phase in :data:`STEP_PHASES` (``data_wait``, ``forward``,
    ``backward``, ``optimizer``, ``eval``, ``compute``; seconds, 0 when not measured);
    ``other_host`` (the rest of the step, s); ``samples`` (None when unknown); ``boundary`` and
    ``profiled`` (bools); ``gpu_ms`` (GPU time of the step, ms, None when not measured). Empty
    lists for no steps. ``has`` lists the phase names measured in at least one step.
    For long runs prefer :func:`step_columns` (numpy arrays: ~8 bytes per value instead of ~32).
    """
    cols = step_columns(steps, origin_ns)
    out: dict = {k: cols[k].tolist() for k in ("i", "t0_s", "step_s", "other_host", "boundary", "profiled")}
    for name, _ in STEP_PHASES:
        out[name] = cols[name].tolist()
    out["samples"] = [None if v < 0 else v for v in cols["samples"].tolist()]
    out["gpu_ms"] = [None if math.isnan(v) else v for v in cols["gpu_ms"].tolist()]
    out["has"] = cols["has"]
    return out


_PHASE_RECORD_KEYS = tuple(key for _, key in STEP_PHASES)


def step_ids(steps: list) -> np.ndarray:
    """The ``i`` of each step (int64 array), without a Python loop for ``StepView`` rows."""
    return StepCols(steps).ints("i")


def among(steps: list, others: list) -> np.ndarray:
    """Bool per step of ``steps``: its ``i`` is one of ``others``' (``np.isin`` of the step ids),
    a block of steps at a time when ``others``' ids increase (steps in order, as analyzed steps
    are: a day of steps otherwise sorts 50 MB). When ``steps`` are one run of rows of a step table
    and ``others`` rows of the same table (:class:`~whyidle.record.steptable.StepRows`, as a
    trainer's steps and its analyzed steps are), by row number, a block of ``others`` at a time:
    the same where a table's ids are unique, without gathering a day of ids (~100 MB at once)."""
    first = _first_row(steps, others)
    if first is not None:
        out = np.zeros(len(steps), bool)
        at, block = others.positions, stepcols.STEP_BLOCK
        for a in range(0, len(at), block):
            pos = at.numpy(a, a + block) - first
            out[pos[(pos >= 0) & (pos < len(out))]] = True
        return out
    theirs = step_ids(others)
    if len(theirs) > 1 and not bool((np.diff(theirs) > 0).all()):
        return np.isin(step_ids(steps), theirs)
    cols = StepCols(steps)
    out = np.zeros(cols.n, bool)
    if not len(theirs):
        return out
    for a, b in cols.blocks():
        mine = b.ints("i")
        at = np.minimum(np.searchsorted(theirs, mine), len(theirs) - 1)
        out[a:a + b.n] = theirs[at] == mine
    return out


def _first_row(rows, others) -> int | None:
    """The first row number when ``rows`` are consecutive rows of the step table that ``others``'
    rows are of (both :class:`~whyidle.record.steptable.StepRows`), else None."""
    table = getattr(rows, "table", None)
    if table is None or getattr(others, "table", None) is not table:
        return None
    return rows.positions.consecutive()


#: Columns of :func:`step_columns`.
STEP_COLUMNS = ("i", "t0", "t1", "t0_s", "step_s") + tuple(name for name, _ in STEP_PHASES) + (
    "other_host", "samples", "boundary", "profiled", "gpu_ms")


def step_columns(steps: list, origin_ns: int, keys=None, dtype=np.float64) -> dict:
    """:func:`step_series` as numpy arrays (same values), plus the exact times; for long runs
    (8 bytes per value, no Python loop over ``StepView`` rows), made a block of steps at a time
    (:meth:`StepCols.blocks`): only the arrays asked for are whole.

    Args:
        steps: step records or ``StepView`` rows.
        origin_ns: the run's origin (:func:`run_origin`).
        keys: the columns wanted (default all of :data:`STEP_COLUMNS`); the others are not made.
        dtype: of the seconds columns (``np.float32`` for plots: half the memory, what a plot
            draws; each value is the float64 value rounded).
    Returns:
        A dict of equal-length arrays: ``i``, ``t0``, ``t1`` (int64, monotonic ns), ``t0_s``,
        ``step_s``, the phases of :data:`STEP_PHASES` and ``other_host`` (seconds, 0 when
        not measured; NaN on lite steps whose phases were not tracked), ``samples`` (int64, -1 when
        unknown), ``boundary``, ``profiled`` (bool), ``gpu_ms`` (float64, NaN when not measured);
        and ``has`` (list of the phase names measured in at least one step, whatever ``keys``).
    """
    want = set(STEP_COLUMNS if keys is None else keys)
    cols = StepCols(steps)
    n = cols.n
    kinds = {"i": np.int64, "t0": np.int64, "t1": np.int64, "samples": np.int64, "boundary": bool,
             "profiled": bool, "gpu_ms": np.float64}
    out: dict = {k: np.zeros(n, kinds.get(k, dtype)) for k in STEP_COLUMNS if k in want}
    measured = dict.fromkeys((name for name, _ in STEP_PHASES), False)
    unphased = np.zeros(n, bool)  # lite steps whose phases were not tracked (the detail stride)
    for a, b in cols.blocks():
        at = slice(a, a + b.n)
        if "i" in want:
            out["i"][at] = b.ints("i")
        dur = None
        if want & {"t0", "t1", "t0_s", "step_s", "other_host"}:
            t0, t1 = b.ints("t0"), b.ints("t1")
            dur = (t1 - t0) / 1e9
            for key, value in (("t0", t0), ("t1", t1), ("step_s", dur), ("t0_s", (t0 - origin_ns) / 1e9)):
                if key in want:
                    out[key][at] = value
        used = np.zeros(b.n) if "other_host" in want else None
        for name, key in STEP_PHASES:
            v = b.ints(key)
            missing = v == NULL_INT
            if missing.all():
                continue
            measured[name] = True
            if used is None and name not in want:
                continue
            sec = v.astype(np.float64)  # ns as float64, 0 when null
            sec[missing] = 0.0
            sec /= 1e9
            if used is not None:
                used += sec
            if name in want:
                out[name][at] = sec
        if used is not None:
            np.subtract(dur, used, out=used)
            out["other_host"][at] = np.maximum(0.0, used, out=used)
        unphased[at] = b.flags("lite") & (b.ints("data") == NULL_INT)
        if "samples" in want:
            samples = b.ints("samples")
            out["samples"][at] = np.where(samples == NULL_INT, -1, samples)
        for key in ("boundary", "profiled"):
            if key in want:
                out[key][at] = b.flags(key)
        if "gpu_ms" in want:
            out["gpu_ms"][at] = b.gpu_ms()
    has = [name for name, _ in STEP_PHASES if measured[name]]
    if has and unphased.any():  # lite steps whose phases were not tracked: NaN, not zeros
        for name in [name for name, _ in STEP_PHASES if name in out] + (["other_host"] if "other_host" in out else []):
            out[name][unphased] = np.nan
    out["has"] = has
    return out


def cpu_series(records: list[dict], trainers, whyidle_pid: int | None, origin_ns: int) -> dict:
    """CPU and memory between consecutive host ticks, by role.

    Args:
        records: ``host.jsonl`` records.
        trainers: pids that ran training steps (the roles are those of
            :func:`whyidle.analysis.host.process_roles`).
        whyidle_pid: the whyidle process, reported apart.
        origin_ns: the run's origin (:func:`run_origin`).
    Returns:
        A dict of equal-length lists, one entry per interval, at its end time: ``t_s``;
        ``trainer``, ``workers`` (DataLoader workers and other descendants of the trainers),
        ``tree_other`` (the rest of the observed command), ``whyidle``, ``other`` (the rest of the
        machine: busy time of all cores minus the above, floored at 0) — all in cores;
        ``mem_used_bytes`` (machine), ``tree_rss_bytes`` (resident memory of the observed
        command's processes); ``cores`` (logical CPUs, an int), ``cores_usable`` and
        ``cores_limit_by`` (the cores the job may use and why, :func:`whyidle.analysis.host.job_limits`). A worker that exits between
        two ticks loses the CPU of its last interval here (the run's totals recover it,
        :func:`whyidle.analysis.host.host_metrics`).
    """
    P = host_analysis
    ticks = [r for r in records if r.get("k") == "host"]
    keys = ("t_s", "trainer", "workers", "tree_other", "whyidle", "other", "mem_used_bytes", "tree_rss_bytes")
    out: dict = {k: [] for k in keys}
    limits = P.job_limits(records, sorted(trainers))
    out.update(cores=limits["cores"], cores_usable=limits["cores_usable"], cores_limit_by=limits["cores_limit_by"])
    if len(ticks) < 2:
        return out
    trainer_set = set(trainers)
    _, workers, _ = P.process_roles(records, trainer_set)
    prev = {r[P.PID]: r[P.CPU_S] for r in ticks[0]["procs"]}
    for a, b in zip(ticks, ticks[1:]):
        dt = (b["t"] - a["t"]) / 1e9
        if dt <= 0:
            continue
        roles = {"trainer": 0.0, "workers": 0.0, "tree_other": 0.0, "whyidle": 0.0}
        now = {}
        for r in b["procs"]:
            pid, cpu = r[P.PID], r[P.CPU_S]
            now[pid] = cpu
            used = max(0.0, cpu - prev.get(pid, 0.0))
            role = ("whyidle" if pid == whyidle_pid else "trainer" if pid in trainer_set
                    else "workers" if pid in workers else "tree_other")
            roles[role] += used
        prev = now
        busy = sum(max(0.0, y - x) for x, y in zip(a.get("percpu_busy_s") or [], b.get("percpu_busy_s") or []))
        out["t_s"].append((b["t"] - origin_ns) / 1e9)
        for role, used in roles.items():
            out[role].append(used / dt)
        out["other"].append(max(0.0, busy - sum(roles.values())) / dt)
        out["mem_used_bytes"].append(b.get("mem_used_bytes"))
        out["tree_rss_bytes"].append(sum(r[P.RSS] or 0 for r in b["procs"] if r[P.PID] != whyidle_pid))
    return out


def gpu_series(records: list[dict], origin_ns: int) -> list[dict]:
    """Per GPU device, its recorded time series at the finest resolution recorded.

    Returns a list (one per device of ``gpu_static``) of ``{"index", "name", "util"`` (NVML
    duty-cycle samples from the driver's buffer: list of ``[t_s, percent]``, time-sorted; the
    ``gpu_state`` snapshots when the buffer gave none), ``"mem_util"`` (same for memory
    read/write activity, percent), ``"sm_active"`` (GPM windows: list of ``[t0_s, t1_s,
    fraction]``), ``"tensor_active"`` (same), ``"mem_used_bytes"`` (list of ``[t_s, bytes]``),
    ``"power_w"`` (list of ``[t_s, watts]``)``}``. Empty list without NVML.
    """
    static = next((r for r in records if r.get("k") == "gpu_static"), None)
    if static is None:
        return []

    def sec(t: int) -> float:
        return (t - origin_ns) / 1e9

    devices = []
    for d in static.get("devices") or []:
        dev = d.get("index")
        util: dict[str, set] = {"gpu": set(), "mem": set()}
        snaps: dict[str, list] = {"gpu": [], "mem": []}
        sm, tensor, mem, power = [], [], [], []
        for r in records:
            if r.get("dev") != dev:
                continue
            k = r.get("k")
            if k == "gpu_util" and r.get("type") in util:
                util[r["type"]].update((s[0], s[1]) for s in r.get("samples") or [])
            elif k == "gpu_state":
                if r.get("util_pct") is not None:
                    snaps["gpu"].append([sec(r["t"]), r["util_pct"]])
                if r.get("mem_util_pct") is not None:
                    snaps["mem"].append([sec(r["t"]), r["mem_util_pct"]])
                if r.get("mem_used_bytes") is not None:
                    mem.append([sec(r["t"]), r["mem_used_bytes"]])
                if r.get("power_w") is not None:
                    power.append([sec(r["t"]), r["power_w"]])
            elif k == "gpm":
                if r.get("sm_active") is not None:
                    sm.append([sec(r["t0"]), sec(r["t1"]), r["sm_active"]])
                if r.get("tensor_active") is not None:
                    tensor.append([sec(r["t0"]), sec(r["t1"]), r["tensor_active"]])

        def series(kind: str) -> list:
            pts = sorted(util[kind])
            return [[sec(t), v] for t, v in pts] if pts else sorted(snaps[kind])

        devices.append({"index": dev, "name": d.get("name"), "util": series("gpu"), "mem_util": series("mem"),
                        "sm_active": sorted(sm), "tensor_active": sorted(tensor), "mem_used_bytes": mem,
                        "power_w": power})
    return devices


def left_out_steps(rows: list, analyzed: list, warmup: int = 0) -> list[str | None]:
    """Why each step of ``rows`` is not among the ``analyzed`` steps (:func:`among`), one entry per
    row: ``"warm-up"`` (the first ``warmup`` rows, see :func:`whyidle.analysis.steps.select_steps`),
    ``"boundary"`` (holds an epoch boundary or evaluation), ``"profiled"`` (ran under whyidle's
    TensorFlow profiler window), ``"other"``; None for an analyzed step."""
    return [LEFT_OUT_REASONS[c] for c in left_out_codes(rows, analyzed, warmup).tolist()]


def left_out_codes(rows: list, analyzed: list, warmup: int = 0) -> np.ndarray:
    """:func:`left_out_steps` as one int8 per row, an index into :data:`LEFT_OUT_REASONS` (0: an
    analyzed step): a day of steps is 1 MB, not a list of 8 MB."""
    n = len(rows)
    code = np.full(n, 4, dtype=np.int8)
    if not n:
        return code
    cols = step_columns(rows, 0, ("boundary", "profiled"))
    code[cols["profiled"]] = 3
    code[cols["boundary"]] = 2
    code[:warmup] = 1
    code[among(rows, analyzed)] = 0
    return code


#: What each :func:`left_out_codes` code means (None: analyzed).
LEFT_OUT_REASONS = (None, "warm-up", "boundary", "profiled", "other")


#: Most bars of the page's per-step phase plot: beyond a few hundred, bars get thinner than a pixel.
PHASE_BARS = 300
#: The phase columns of the page (:func:`phase_bars`), in the order of :data:`STEP_PHASES`, then
#: the rest of the step.
PAGE_PHASES = tuple(name for name, _ in STEP_PHASES) + ("other_host",)


def phase_bars(rows: list, origin_ns: int, codes: np.ndarray, max_bars: int = PHASE_BARS) -> dict:
    """The per-step phase plot's bars of a run with more than ``max_bars`` steps: consecutive steps
    binned ``k = ceil(n / max_bars)`` to a bar, each bar the mean step of its analyzed steps (all
    of its steps when none is), made one phase column at a time (a whole run's phases as float32
    are 12 MB a column for 3 million steps; the page holds the bars, not the columns).

    Args:
        rows: the primary trainer's steps (records or ``StepView`` rows), n of them.
        origin_ns: the run's origin (:func:`run_origin`).
        codes: :func:`left_out_codes` of ``rows`` (int8, n).
    Returns:
        ``{"k": k, "start": [first step position of each bar], "stop": [one past its last],
        "used": [steps each bar's mean is of], "analyzed": [whether it has an analyzed step],
        "ms": {phase: [mean ms of each bar]}}`` for each of :data:`PAGE_PHASES` measured (``has``
        of :func:`step_columns`; ``other_host`` always), seconds as float32 (as the page draws
        them) averaged in float64; NaN where a bar holds a lite step whose phases were not tracked.
    """
    n = len(rows)
    k = max(1, math.ceil(n / max_bars))
    start = np.arange(0, n, k)
    stop = np.minimum(start + k, n)
    keep = codes == 0
    analyzed = np.add.reduceat(keep, start) > 0 if n else np.zeros(0, bool)
    out = {"k": k, "start": start.tolist(), "stop": stop.tolist(), "analyzed": analyzed.tolist(), "used": [], "ms": {}}
    has = None
    for name in PAGE_PHASES:
        if has is not None and name not in has and name != "other_host":
            continue
        col = step_columns(rows, origin_ns, (name,), np.float32)
        has = col["has"]
        if name not in has and name != "other_host":
            continue
        values = col[name]
        means, used = [], []
        for a, b, any_kept in zip(start.tolist(), stop.tolist(), analyzed.tolist()):
            part = values[a:b]
            if any_kept:
                part = part[keep[a:b]]
            means.append(float((np.asarray(part, float) * 1000).mean()))
            used.append(len(part))
        out["ms"][name], out["used"] = means, used
    return out


@dataclasses.dataclass
class RunSeries:
    """The time series a report's plots draw, computed once from a loaded run and its facts
    (:func:`run_series`); renderers read these, never the records.

    Fields: ``origin_ns`` (the run's origin, monotonic ns, :func:`run_origin`); ``window_s``
    (the analyzed steps' ``(start, end)`` in s since the origin, or None); ``steps``
    (:func:`step_columns` of every step of the primary trainer: ``i``, ``step_s`` and
    ``data_wait``, seconds as float32); ``left_out`` (:func:`left_out_codes`, one int8
    per step, an index into :data:`LEFT_OUT_REASONS`); ``phase_bars`` (:func:`phase_bars`: the
    phases of every step, or of bins of steps in a long run); ``gpus`` (:func:`gpu_series`, one dict per GPU, empty without one); ``cpu``
    (:func:`cpu_series`); ``gpu_notices`` (texts of the sampler's ``gpu_notice`` records, why
    no GPU was sampled); ``interval_s`` (the host sampling period, s, or None);
    ``worker_batches`` (:func:`worker_batches`: each DataLoader worker's last batches).
    """

    origin_ns: int
    window_s: tuple[float, float] | None
    steps: dict
    left_out: np.ndarray
    phase_bars: dict
    gpus: list[dict]
    cpu: dict
    gpu_notices: list[str]
    interval_s: float | None
    worker_batches: list = dataclasses.field(default_factory=list)
    queue_depth: dict | None = None


#: Batches of one DataLoader worker the page draws at most (its last ones).
WORKER_BARS = 2000


def worker_batches(tallies: dict, origin: int) -> list[dict]:
    """Each DataLoader worker's last :data:`WORKER_BARS` batches (the reader's
    :class:`~whyidle.record.loader_workers.WorkerTally` spans), by loader then worker id:
    ``{worker, pid, loader, start_s, dur_s, samples, i}`` (seconds since ``origin``, float32 arrays;
    ``samples`` and ``i`` int arrays). [] without worker records."""
    out = []
    for t in sorted(tallies.values(), key=lambda t: (t.loader or 0, t.worker, t.pid)):
        spans = t.spans[-WORKER_BARS:]
        if not len(spans):
            continue
        out.append({"worker": t.worker, "pid": t.pid, "loader": t.loader, "i": spans[:, 0],
                    "start_s": ((spans[:, 1] - origin) / 1e9).astype(np.float32),
                    "dur_s": ((spans[:, 2] - spans[:, 1]) / 1e9).astype(np.float32), "samples": spans[:, 3]})
    return out


def queue_depth(records: list[dict], origin: int) -> dict | None:
    """The training loop's view of its DataLoader's queue over time, one point per flush of the
    trainer's ``loader_queue`` records (half a second apart, agent.FLUSH_PERIOD_S; the loader fetched from most):
    ``{t_s, ready, wait_ms, behind, cap}``: seconds since ``origin``, the batches ready at the fetches
    since the last point (mean), their mean wait (milliseconds; NaN for runs recorded before it
    was counted), the share (0–1) of that wait spent behind a slow batch (NaN likewise), all
    float32 arrays, and the most batches the loader may hold (``prefetch_factor × num_workers``).
    None without such records."""
    by_loader: dict = {}
    for rec in records:
        if rec.get("k") != "loader_queue" or not isinstance(rec.get("t"), int):
            continue
        for row in rec.get("counts") or []:
            if isinstance(row, list) and len(row) in (5, 7) and all(isinstance(v, int) for v in row[1:]):
                by_loader.setdefault(row[0], {}).setdefault(rec["t"], []).append(row)
    if not by_loader:
        return None
    points = max(by_loader.values(), key=lambda p: sum(r[-2] if len(r) == 7 else r[4] for rows in p.values()
                                                       for r in rows))
    t_s, ready, wait_ms, behind, cap = [], [], [], [], 0
    for t in sorted(points):
        rows = points[t]
        n = sum(r[5] if len(r) == 7 else r[4] for r in rows)
        if n <= 0:
            continue
        timed = all(len(r) == 7 for r in rows)
        wait = sum(r[6] for r in rows) if timed else 0
        t_s.append((t - origin) / 1e9)
        ready.append(sum(r[2] * (r[5] if len(r) == 7 else r[4]) for r in rows) / n)
        wait_ms.append(wait / n / 1e6 if timed else float("nan"))
        behind.append((sum(r[6] for r in rows if r[4]) / wait if wait else 0.0) if timed else float("nan"))
        cap = max(cap, *(r[1] for r in rows))
    if not t_s:
        return None
    return {"t_s": np.asarray(t_s, np.float32), "ready": np.asarray(ready, np.float32),
            "wait_ms": np.asarray(wait_ms, np.float32), "behind": np.asarray(behind, np.float32), "cap": cap}


def run_series(run, facts: RunFacts) -> RunSeries:
    """The :class:`RunSeries` of a loaded run (:class:`whyidle.record.reader.RunData`) and its
    facts (:func:`whyidle.analysis.run.analyze`)."""
    meta = run.meta or {}
    origin = run_origin(meta, run.host, run.gpu)
    window = (facts.step or {}).get("window")
    rows = facts.step_rows or []
    codes = left_out_codes(rows, facts.analyzed_steps or [], (facts.steps_info or {}).get("warmup") or 0)
    return RunSeries(
        origin_ns=origin,
        window_s=((window[0] - origin) / 1e9, (window[1] - origin) / 1e9) if window else None,
        steps=step_columns(rows, origin, ("i", "step_s", "data_wait"), np.float32),
        left_out=codes,
        phase_bars=phase_bars(rows, origin, codes),
        gpus=gpu_series(run.gpu, origin),
        cpu=cpu_series(run.host, facts.trainers or [], meta.get("whyidle_pid"), origin),
        gpu_notices=[r["msg"] for r in run.gpu if r.get("k") == "gpu_notice" and r.get("msg")],
        interval_s=meta.get("interval_s"),
        worker_batches=worker_batches(run.loader_workers, origin),
        queue_depth=queue_depth(run.procs.get(facts.primary) or [], origin) if facts.primary is not None else None,
    )
