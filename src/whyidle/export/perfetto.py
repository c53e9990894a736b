"""A saved run → ``timeline.json``: Chrome Trace Event Format for ui.perfetto.dev and chrome://tracing.

The layout (tracks, names, units, the clock) is documented in ``docs/run-format.md``
(section ``timeline.json``). In short:

- **Clock.** ``ts`` and ``dur`` are integer **microseconds** on the wall clock, counted from
  ``baseTimeNanoseconds`` exactly as PyTorch's profiler (Kineto) writes its traces: Kineto stamps
  events with Unix-epoch nanoseconds (``CLOCK_REALTIME``) and writes ``ts = (epoch_ns −
  baseTimeNanoseconds) / 1000`` with the base at the start of the current "trimonth" (epoch
  seconds floored to a multiple of :data:`KINETO_BASE_PERIOD_S`). A run's monotonic times become
  epoch ns through ``meta.json``'s first clock anchor (``time_ns − monotonic_ns``), so this file and
  a ``torch.profiler`` trace of the same job share one time axis: concatenate the two
  ``traceEvents`` arrays (same base) and the slices overlay.
- **Tracks.** Each trainer process keeps its real pid; its tracks are virtual threads (tids
  above any real Linux tid, unique per process) named ``steps``, ``phases``, ``GPU starved
  (CUDA timeline)``, ``DataLoader``, ``Keras``, ``TensorFlow profiler``. Slices on a track
  follow one another or nest, never partly overlap (a record that would is cut at the enclosing
  slice's end), so viewers never have to guess. Counters sit on two kinds of pseudo-processes (pids above any real pid): one
  per GPU and one for the machine.
- **Size.** Bounded for any length of job by :mod:`whyidle.export.timeline_law`: past its budget
  a trainer's per-step detail is kept for a bounded set of steps (start, end, anomalies) and the
  rest is drawn as summary windows; long counter series are bucketed; shorter runs are unchanged.

Pure: :func:`build_timeline` takes the facts of :func:`whyidle.analysis.run.analyze` and the
:class:`~whyidle.record.reader.RunData` they came from and returns a dict; :func:`write_timeline`
writes the same object atomically, streaming: a 100,000-step run has ~10^6 events, which as
Python dicts would take ~0.5 GB, so events are encoded with msgspec a few thousand at a time as
they are made (:class:`_Timeline` makes them for both). Only the small tracks (DataLoader, Keras,
TensorFlow profiler, and steps that overlap, which never happens by construction) are kept in
memory until the end, to be sorted and nested.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import msgspec
import numpy as np

from whyidle import __version__
from whyidle.gcpause import gc_paused
from whyidle.analysis import gpu_idle as gpu_idle_analysis
from whyidle.analysis import keras as keras_analysis
from whyidle.analysis import series
from whyidle.analysis import steps as step_analysis
from whyidle.analysis.facts import RunFacts
from whyidle.export import timeline_law
from whyidle.record.reader import RunData
from whyidle.record.steptable import MAX_PH_VALUES, phase_spans
from whyidle.record.writer import atomic_file

#: Format tag written into ``otherData.format``.
FORMAT = "whyidle.timeline/1"

#: Kineto's ``baseTimeNanoseconds`` period: it floors the epoch seconds at profiler start to a
#: multiple of this ("3 months in seconds", libkineto ``ChromeTraceBaseTime``), so a run and a
#: profiler trace taken in the same ~91-day interval share the base.
KINETO_BASE_PERIOD_S = 7_889_238

#: Pseudo-process pids for counters: above Linux's largest pid (``pid_max`` ≤ 2**22), below 2**31
#: (viewers read pids as 32-bit integers).
MACHINE_PID = 1_000_000_000
GPU_PID_BASE = 1_000_000_100

#: Virtual thread ids of a process's tracks: ``VTID_BASE + pid * VTID_STRIDE + track``. Above any
#: real tid (a torch.profiler trace of the same process uses real tids) and unique across
#: processes (Perfetto keys threads by tid alone).
VTID_BASE = 1_100_000_000
VTID_STRIDE = 8

#: Track index → thread name, in display order.
TRACKS = ("steps", "phases", "GPU starved (CUDA timeline)", "DataLoader", "Keras", "TensorFlow profiler",
          "outside the step")
STEPS, PHASES, STARVED, LOADER, KERAS, TF, REGIONS = range(len(TRACKS))

#: Slice names of the step phases (``PHASE_CODES``); data waits say what they are.
PHASE_NAMES = {"setup": "setup", "data": "data wait", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer", "eval": "eval", "other": "other host", "compute": "compute"}

#: Step columns (``analysis.series.STEP_PHASES`` names, ``other_host``) → phase codes of
#: :data:`PHASE_NAMES`, where they differ: the summary windows' phase-share slices.
COLUMN_PHASES = {"data_wait": "data", "other_host": "other"}

#: Slice names of GPU starvation by cause (:data:`whyidle.analysis.gpu_idle.CAUSES`).
STARVED_NAMES = {"data": "GPU starved: data wait", "sync": "GPU starved: sync", "host": "GPU starved: host",
                 "launch": "GPU starved: launch-bound", "other": "GPU starved: before first step"}

#: CPU counter series (keys of :func:`whyidle.analysis.series.cpu_series`) → counter arg names.
CPU_ROLES = (("trainer", "trainer"), ("workers", "workers"), ("tree_other", "rest of command"),
             ("other", "other processes"), ("whyidle", "whyidle"))

#: Steps converted from numpy columns to Python values at a time, and events encoded per write.
STEP_CHUNK = 4096
WRITE_CHUNK = 4096

GIB = 2**30


def kineto_base_ns(epoch_ns: int) -> int:
    """Kineto's ``baseTimeNanoseconds`` for a trace started at ``epoch_ns`` (Unix ns)."""
    period = KINETO_BASE_PERIOD_S * 1_000_000_000
    return epoch_ns // period * period


class _Clock:
    """Monotonic ns → trace µs (ints): ``(t + wall_minus_mono − base) // 1000`` rounded."""

    def __init__(self, meta: dict, origin_ns: int, base_ns: int | None) -> None:
        anchors = [a for a in meta.get("anchors") or []
                   if isinstance(a.get("monotonic_ns"), int) and isinstance(a.get("time_ns"), int)]
        self.anchors = anchors
        if anchors:
            self.offset = anchors[0]["time_ns"] - anchors[0]["monotonic_ns"]
            self.base = kineto_base_ns(anchors[0]["time_ns"]) if base_ns is None else base_ns
            self.clock = "wall"
        else:  # no anchor: the run's own clock, from its origin
            self.offset = 0
            self.base = origin_ns if base_ns is None else base_ns
            self.clock = "monotonic"
        self.shift = self.offset - self.base + 500  # + 500: round half up in us()

    def us(self, t_ns: int) -> int:
        return (int(t_ns) + self.shift) // 1000


def _ms(ns) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _vtid(pid: int, track: int) -> int:
    return VTID_BASE + pid * VTID_STRIDE + track


def _meta_event(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _slice(pid: int, tid: int, ts: int, end: int, name: str, cat: str | None = None, args: dict | None = None) -> dict:
    ev = {"name": name, "ph": "X", "ts": ts, "dur": max(0, end - ts), "pid": pid, "tid": tid}
    if cat:
        ev["cat"] = cat
    if args:
        ev["args"] = args
    return ev


class _Track:
    """The slices of one (pid, tid) track, emitted properly nested: a slice that starts inside
    another and ends after it is cut at the other's end (``args.cut``), so slices either nest or
    follow one another.

    Two ways in, one rule: :meth:`put` takes slices already in ``(ts, -dur)`` order and returns each
    at once (long sequential tracks — steps, phases — stream to the file without being kept);
    :meth:`add` keeps them and :meth:`flush` sorts and emits them (small tracks of any order).
    """

    __slots__ = ("items", "open_ends", "used")

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.open_ends: list[int] = []
        self.used = False

    def put(self, ev: dict) -> dict:
        ts = ev["ts"]
        open_ends = self.open_ends
        while open_ends and open_ends[-1] <= ts:
            open_ends.pop()
        if open_ends and ts + ev["dur"] > open_ends[-1]:
            ev["dur"] = open_ends[-1] - ts
            ev["args"] = dict(ev.get("args") or {}, cut=True)
        open_ends.append(ts + ev["dur"])
        self.used = True
        return ev

    def add(self, ev: dict) -> None:
        self.items.append(ev)
        self.used = True

    def flush(self) -> Iterator[dict]:
        items, self.items = self.items, []
        if any(a["ts"] > b["ts"] for a, b in zip(items, items[1:])):
            items.sort(key=lambda e: (e["ts"], -e["dur"]))
        for ev in items:
            yield self.put(ev)


def _sequential(t0, t1) -> bool:
    """Whether int ns ranges follow one another in order without overlapping (then their slices
    are in ``(ts, -dur)`` order and can stream)."""
    t0, t1 = np.asarray(t0, dtype=np.int64), np.asarray(t1, dtype=np.int64)
    return bool(np.all(t0 <= t1) and np.all(t1[:-1] <= t0[1:]))


def _bucketed(times: list, values: list, reduce, digits: int, buckets: dict, key: str) -> tuple[list, list]:
    """A counter series as written: unchanged up to :data:`timeline_law.COUNTER_POINTS` values,
    else one value per bucket of k (``reduce``: :func:`timeline_law.reduce_mean` or ``reduce_max``,
    rounded to ``digits``) at its first value's time; ``buckets[key]`` = k then."""
    k = timeline_law.bucket(len(values))
    if k == 1:
        return times, values
    buckets[key] = k
    return times[::k], [round(v, digits) for v in reduce(values, k).tolist()]


def _every_kth_tick(records: list[dict]) -> tuple[list[dict], int]:
    """``(records, k)``: the ``host.jsonl`` records with only every k-th ``host`` tick and the last
    kept, k = :func:`timeline_law.bucket` of the intervals between ticks; the other records
    (process starts, limits) all kept, in order. k = 1: ``records`` itself."""
    is_tick = [r.get("k") == "host" for r in records]
    ticks = list(itertools.compress(range(len(records)), is_tick))
    k = timeline_law.bucket(max(0, len(ticks) - 1))
    if k == 1:
        return records, 1
    keep = [not t for t in is_tick]
    for i in ticks[::k]:
        keep[i] = True
    keep[ticks[-1]] = True
    return list(itertools.compress(records, keep)), k


class _Timeline:
    """One run's timeline: :meth:`events` yields every trace event once, in an order that lets the
    long tracks stream (steps and phase slices of each trainer as they are made; the small tracks,
    kept and nested, after them; name metadata last: viewers read events in any order), counting
    what it wrote; then :meth:`header` gives the rest of the object. :func:`build_timeline` and
    :func:`write_timeline` both use it."""

    def __init__(self, facts: RunFacts, run: RunData, base_ns: int | None) -> None:
        self.facts, self.run = facts, run
        self.meta = run.meta or {}
        self.origin = series.run_origin(self.meta, run.host, run.gpu)
        self.clock = _Clock(self.meta, self.origin, base_ns)
        self.primary = facts.primary
        self.trainers = list(facts.trainers or [])
        self.tracks: dict[tuple[int, int], _Track] = {}
        self.counts: dict = {"trainers": {}}
        self.machine = False  # an event was written on the machine pseudo-process
        self.machine_bucket = 1  # host ticks per machine counter value (timeline_law.bucket)
        self.done = False

    def track(self, pid: int, tid: int) -> _Track:
        t = self.tracks.get((pid, tid))
        if t is None:
            t = self.tracks[(pid, tid)] = _Track()
        return t

    def events(self) -> Iterator[dict]:
        run = self.run
        for pid in self.trainers:
            recs = run.procs.get(pid, [])
            if pid == self.primary:
                steps = self.facts.step_rows or []
                analyzed = self.facts.analyzed_steps or []
                warmup = (self.facts.steps_info or {}).get("warmup", 0)
            else:
                steps = step_analysis.steps_of(run.steps.get(pid, recs))
                steps, _ = keras_analysis.input_wait(steps, recs)
                analyzed, info = step_analysis.select_steps(steps)
                warmup = info.get("warmup", 0)
            ranges = gpu_idle_analysis.starved_ranges(recs)
            c = yield from self._steps(pid, steps, analyzed, warmup, ranges)
            c["starved_slices"] = yield from self._starved(pid, ranges, c.pop("_bounds"))
            self._host_regions(pid, recs)
            if pid == self.primary:
                self._startup(pid, recs, steps)
            self.counts["trainers"][str(pid)] = c
        for pid in run.procs:
            if pid not in self.trainers:
                self._host_regions(pid, run.procs[pid])
        self.counts["loader_worker_batches"] = yield from self._loader_workers()
        self.counts["notices"] = yield from self._notices()
        self.counts["cpu_intervals"] = yield from self._cpu_counters()
        self.counts["gpus"] = yield from self._gpu_counters()
        for t in self.tracks.values():
            yield from t.flush()
        yield from self._names()
        self.done = True

    # -- slices ------------------------------------------------------------------------------------

    def _steps(self, pid: int, steps: list, analyzed: list, warmup: int, ranges: dict | None):
        """Step and phase slices of one trainer (streamed when the steps follow one another, as
        they do by construction); returns counts. Past :data:`timeline_law.DETAIL_STEPS` steps only
        the steps of :func:`timeline_law.plan_steps` get their own slices; the others are shown
        as summary windows (:meth:`_summaries`). ``ranges``: the trainer's GPU-starved ranges
        (:func:`whyidle.analysis.gpu_idle.starved_ranges`), summed into the windows' args."""
        clock = self.clock
        n_steps = len(steps)
        keys = ("i", "t0", "t1", "step_s", "samples", "gpu_ms", "boundary", "profiled")
        # whole: what the plan and the windows' bounds read; the other columns are made one at a
        # time (a day of steps is 8 MB a column) and only their detailed steps' values kept
        cols = series.step_columns(steps, self.origin, ("t0", "t1", "step_s", "boundary", "profiled"))
        is_analyzed = series.among(steps, analyzed)
        has = cols["has"]
        plan = timeline_law.plan_steps(cols["step_s"], warmup, cols["boundary"], ~is_analyzed | cols["profiled"])
        tid_s, tid_p = _vtid(pid, STEPS), _vtid(pid, PHASES)
        step_track, phase_track = self.track(pid, tid_s), self.track(pid, tid_p)
        stream = _sequential(cols["t0"], cols["t1"])
        phase_names = [(name + "_ms", name) for name in has]
        detail_idx = np.flatnonzero(plan.detail)
        detail = {}  # column -> its detailed steps' values

        def column(name: str) -> np.ndarray:
            """One column of every step (:func:`series.step_columns`); its detailed steps' values are kept."""
            col = cols[name] if name in cols else series.step_columns(steps, self.origin, (name,))[name]
            detail[name] = col[detail_idx]
            return col

        w_starts, make_window = (self._summaries(pid, cols, column, is_analyzed, plan, phase_names, ranges)
                                 if plan.summarized else ([], None))
        for name in list(keys) + [name for _, name in phase_names] + ["other_host"]:
            if name not in detail:
                column(name)
        n_phase = with_ph = n_step_slices = n_summary_phase = 0
        w = 0

        def emit(track: _Track, ev: dict):
            if stream:
                yield track.put(ev)
            else:
                track.add(ev)

        def windows_before(n: int):  # the summary windows that start before step n
            nonlocal w, n_step_slices, n_summary_phase
            while w < len(w_starts) and (n is None or w_starts[w] < n):
                step_ev, phase_evs = make_window(w)
                yield from emit(step_track, step_ev)
                n_step_slices += 1
                for ev in phase_evs:
                    yield from emit(phase_track, ev)
                n_summary_phase += len(phase_evs)
                w += 1

        for a in range(0, len(detail_idx), STEP_CHUNK):
            sel = detail_idx[a:a + STEP_CHUNK]
            ch = {k: detail[k][a:a + STEP_CHUNK].tolist() for k in keys + ("other_host",)}
            ch_phases = [(key, detail[name][a:a + STEP_CHUNK].tolist()) for key, name in phase_names]
            ch_analyzed = is_analyzed[sel].tolist()
            for m, n in enumerate(sel.tolist()):
                if w < len(w_starts) and w_starts[w] < n:
                    yield from windows_before(n)
                args = {"step_ms": round(ch["step_s"][m] * 1e3, 3)}
                if ch["samples"][m] >= 0:
                    args["samples"] = ch["samples"][m]
                for key, values in ch_phases:
                    v = values[m]
                    if v and not math.isnan(v):  # measured (NaN: a lite step's phases were not tracked)
                        args[key] = round(v * 1e3, 3)
                v = ch["other_host"][m]
                if v and not math.isnan(v):
                    args["other_host_ms"] = round(v * 1e3, 3)
                if ch["gpu_ms"][m] == ch["gpu_ms"][m]:  # not NaN
                    args["gpu_ms"] = round(ch["gpu_ms"][m], 3)
                args["analyzed"] = ch_analyzed[m]
                if n < warmup:
                    args["warmup"] = True
                if ch["boundary"][m]:
                    args["boundary"] = True
                if ch["profiled"][m]:
                    args["profiled"] = True
                t0, t1 = clock.us(ch["t0"][m]), clock.us(ch["t1"][m])
                ph = steps[n].get("ph")
                if ph:
                    with_ph += 1
                    if len(ph) >= MAX_PH_VALUES:
                        args["phases_cut"] = True  # later phase changes of this step were not recorded
                    for ts, end, phase in phase_spans(t0, t1, ph, 1):
                        n_phase += 1
                        yield from emit(phase_track, {"name": PHASE_NAMES[phase], "ph": "X", "ts": ts,
                                                      "dur": end - ts, "pid": pid, "tid": tid_p})
                n_step_slices += 1
                yield from emit(step_track, _slice(pid, tid_s, t0, t1, f"step {ch['i'][m]}", "step", args))
        if w_starts:
            yield from windows_before(None)
        out = {"steps": n_steps, "steps_with_phases": with_ph, "phase_slices": n_phase, "phase_stride": 1,
               "step_slices": n_step_slices, "step_group": plan.window if plan.summarized else 1}
        if plan.summarized:
            out["summary"] = self._summary_note(detail["i"], detail_idx, plan, len(w_starts), n_summary_phase)
        out["_bounds"] = (cols["t0"], cols["t1"], plan.detail) if plan.summarized and stream else None
        return out

    @staticmethod
    def _summary_note(ids: np.ndarray, detail_idx: np.ndarray, plan, windows: int, phase_slices: int) -> dict:
        """What ``otherData.counts.trainers[pid].summary`` says of a summarized trainer: the steps
        kept in full (how many, why, as ranges of step numbers) and the windows of the rest.
        ``ids``: the ``i`` of the detailed steps, whose positions are ``detail_idx``."""
        d = plan.detail
        edge = np.zeros(1, np.int8)
        edges = np.flatnonzero(np.diff(np.concatenate((edge, d.view(np.int8), edge))))
        first = np.searchsorted(detail_idx, edges[0::2])  # as indexes into ids
        last = np.searchsorted(detail_idx, edges[1::2] - 1)
        return {"detailed_steps": int(d.sum()), "summarized_steps": int(len(d) - d.sum()),
                "windows": windows, "window_steps": plan.window, "phase_share_slices": phase_slices,
                "detailed_by_reason": plan.reasons, "slow_step_ms": plan.slow_ms,
                "budget": {"detail_steps": timeline_law.DETAIL_STEPS, "head_steps": timeline_law.HEAD_STEPS,
                           "tail_steps": timeline_law.TAIL_STEPS, "context_steps": timeline_law.CONTEXT_STEPS,
                           "summary_slices": timeline_law.SUMMARY_SLICES},
                "detailed_ranges": [[a, b] for a, b in zip(ids[first].tolist(), ids[last].tolist())]}

    def _summaries(self, pid: int, cols: dict, column, is_analyzed, plan, phase_names: list,
                   ranges: dict | None) -> tuple:
        """The summary windows of ``plan`` (:func:`timeline_law.plan_steps`): ``(starts, make)``,
        ``starts`` the windows' first step indexes (a list, ascending), ``make(w)`` the window's
        ``(step slice, phase-share slices)``.

        The step slice is ``steps <first>–<last>`` (cat ``step_summary``), args: ``steps`` (how
        many), ``step_ms`` (their mean), ``step_ms_min``/``step_ms_max``, the mean of each phase, of
        ``other_host_ms`` and of ``gpu_ms`` over the steps that measured it (ms), ``analyzed_steps``,
        ``slow_steps`` (past the plan's ``slow_step_ms``), ``boundary_steps``/``profiled_steps``
        when any, ``gpu_starved_ms`` (per step, when the CUDA timeline ran) and ``summary: true``.
        The phase-share slices (cat ``phase_summary``) tile the window's span on the ``phases``
        track in proportion to each phase's share of the window's step time (args ``share``,
        ``mean_ms``), so a phase's total time on the track stays what it was. The windows' values
        stay in numpy arrays (a few MB) until a slice is made. ``cols``: the whole ``t0``, ``t1``,
        ``step_s``, ``boundary`` and ``profiled`` columns; ``column(name)``: any column of
        :func:`series.step_columns`, asked for one at a time."""
        count = plan.ends - plan.starts
        step_s = cols["step_s"]
        # each window is a run of consecutive summarized steps: reduced over [start, end) of the
        # whole columns (the same elements in the same order as a gathered copy of the summarized
        # steps, so the same sums, without three day-long copies); the odd results, over the
        # detailed steps between windows, are dropped
        bounds = np.empty(2 * len(count), np.int64)
        bounds[0::2], bounds[1::2] = plan.starts, plan.ends
        if len(bounds) and bounds[-1] >= len(step_s):
            bounds = bounds[:-1]

        def per_window(x: np.ndarray, how=np.add, dtype=None) -> np.ndarray:
            return how.reduceat(x, bounds, dtype=dtype)[0::2]

        step_sum = per_window(step_s)

        def mean(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # mean over measured steps; their step time
            measured = ~np.isnan(x)
            with np.errstate(invalid="ignore", divide="ignore"):
                if measured.all():  # no copies: the same sums as of the copies below
                    return per_window(x) / count, step_sum / count
                if not measured.any():  # (a CPU run's gpu_ms) 0 / 0 below
                    return np.full(len(count), np.nan), np.full(len(count), np.nan)
                k = per_window(measured, dtype=np.int64)
                return (per_window(np.where(measured, x, 0.0)) / k,
                        per_window(np.where(measured, step_s, 0.0)) / k)

        phases = [(key, name) for key, name in phase_names] + [("other_host_ms", "other_host")]
        means = []
        for key, name in phases:
            m, base = mean(column(name))
            means.append((key, name, m, base))
        slow_limit = (plan.slow_ms or math.inf) / 1e3
        ids = column("i")
        first_ids, last_ids = ids[plan.starts], ids[plan.ends - 1]
        del ids
        columns = [count, step_sum / count, per_window(step_s, np.minimum), per_window(step_s, np.maximum),
                   mean(column("gpu_ms"))[0], per_window(is_analyzed, dtype=np.int64),
                   per_window(step_s > slow_limit, dtype=np.int64),
                   per_window(cols["boundary"], dtype=np.int64), per_window(cols["profiled"], dtype=np.int64),
                   first_ids, last_ids, cols["t0"][plan.starts], cols["t1"][plan.ends - 1],
                   self._starved_per_window(cols, plan, ranges)]
        columns += [c for _, _, m, base in means for c in (m, base)]
        us = self.clock.us
        tid_s, tid_p = _vtid(pid, STEPS), _vtid(pid, PHASES)
        block: list = [-1, []]  # the windows' values as Python lists, STEP_CHUNK windows at a time

        def make(g: int):
            b, r = divmod(g, STEP_CHUNK)
            if b != block[0]:
                block[:] = [b, [c[b * STEP_CHUNK:(b + 1) * STEP_CHUNK].tolist() for c in columns]]
            (k, step_mean, step_min, step_max, gpu, n_analyzed, n_slow, n_boundary, n_profiled, first, last,
             t0, t1, starved, *phase_values) = (c[r] for c in block[1])
            args = {"steps": k, "step_ms": round(step_mean * 1e3, 3), "step_ms_min": round(step_min * 1e3, 3),
                    "step_ms_max": round(step_max * 1e3, 3)}
            ts, end = us(t0), us(t1)
            phase_evs = []
            at = ts
            for j, (key, name, _, _) in enumerate(means):
                v, base = phase_values[2 * j], phase_values[2 * j + 1]
                if not v or math.isnan(v):
                    continue
                args[key] = round(v * 1e3, 3)
                share = v / base if base else 0.0
                dur = min(end - at, round(share * (end - ts)))
                if dur > 0:
                    phase_evs.append(_slice(pid, tid_p, at, at + dur, PHASE_NAMES[COLUMN_PHASES.get(name, name)],
                                            "phase_summary", {"share": round(share, 4), "mean_ms": round(v * 1e3, 3)}))
                    at += dur
            if not math.isnan(gpu):
                args["gpu_ms"] = round(gpu, 3)
            if starved is not None and not math.isnan(starved):
                args["gpu_starved_ms"] = round(starved / k * 1e3, 3)
            args["analyzed_steps"] = n_analyzed
            args["slow_steps"] = n_slow
            if n_boundary:
                args["boundary_steps"] = n_boundary
            if n_profiled:
                args["profiled_steps"] = n_profiled
            args["summary"] = True
            return _slice(pid, tid_s, ts, end, f"steps {first}–{last}", "step_summary", args), phase_evs

        return plan.starts.tolist(), make

    @staticmethod
    def _starved_per_window(cols: dict, plan, ranges: dict | None) -> np.ndarray:
        """Seconds of GPU starvation per summary window: the ranges ending inside one of its steps
        (NaN for every window when the CUDA timeline did not run)."""
        n_windows = len(plan.starts)
        if ranges is None or not len(cols["t0"]):
            return np.full(n_windows, np.nan)
        t1s = ranges["t1"]
        step = np.searchsorted(cols["t0"], t1s, side="left") - 1
        inside = (step >= 0) & (t1s <= cols["t1"][np.maximum(step, 0)])
        win = np.searchsorted(plan.starts, step, side="right") - 1
        ok = inside & (win >= 0) & (step < plan.ends[np.maximum(win, 0)]) & ~plan.detail[np.maximum(step, 0)]
        return np.bincount(win[ok], weights=(t1s - ranges["t0"])[ok] / 1e9, minlength=n_windows)

    def _starved(self, pid: int, ranges: dict | None, bounds: tuple | None = None):
        """GPU-starved slices from the CUDA timeline (adjacent ranges of one cause merged); returns
        their number. ``bounds``: ``(t0, t1, detail)`` of the trainer's steps (sequential) when
        only some are written in full (:func:`timeline_law.plan_steps`): then so are these (the
        ranges ending inside a summarized step are left out, their time is in the window's
        ``gpu_starved_ms``; those outside any step are kept)."""
        if ranges is None:
            return 0
        tid = _vtid(pid, STARVED)
        track = self.track(pid, tid)
        t0s, t1s, causes = ranges["t0"], ranges["t1"], ranges["cause"]
        if bounds is not None and len(bounds[0]):
            step_t0, step_t1, detail = bounds
            step = np.searchsorted(step_t0, t1s, side="left") - 1  # the step a range ends in, if any
            inside = (step >= 0) & (t1s <= step_t1[np.maximum(step, 0)])
            keep = ~inside | detail[np.maximum(step, 0)]
            t0s, t1s = t0s[keep], t1s[keep]
            causes = [c for c, k in zip(causes, keep.tolist()) if k]
        stream = _sequential(t0s, t1s)
        n = 0
        for a, b, cause in self._merged_ranges(t0s, t1s, causes):
            ev = _slice(pid, tid, a, b, STARVED_NAMES.get(cause, "GPU starved"), "gpu_starved", {"cause": cause})
            n += 1
            if stream:
                yield track.put(ev)
            else:
                track.add(ev)
        return n

    def _merged_ranges(self, t0s, t1s, causes):
        """``(ts, end, cause)`` in µs, empty ranges dropped, adjacent ranges of one cause merged."""
        pending: list | None = None
        for lo in range(0, len(causes), STEP_CHUNK):
            hi = lo + STEP_CHUNK
            for a, b, cause in zip(t0s[lo:hi].tolist(), t1s[lo:hi].tolist(), causes[lo:hi]):
                a, b = self.clock.us(a), self.clock.us(b)
                if b <= a:
                    continue
                if pending and pending[2] == cause and a <= pending[1]:
                    pending[1] = max(pending[1], b)
                    continue
                if pending:
                    yield tuple(pending)
                pending = [a, b, cause]
        if pending:
            yield tuple(pending)

    def _host_regions(self, pid: int, records: list) -> None:
        """DataLoader iterator creations, Keras fit/evaluate/predict, the TensorFlow profiler window,
        and evaluation / checkpoint / logging regions (time outside the training step)."""
        clock = self.clock
        loaders = {r.get("id"): r for r in records if r.get("k") == "loader"}
        for r in records:
            k = r.get("k")
            if k == "iter" and r.get("t0") is not None and r.get("t1") is not None:
                ld = loaders.get(r.get("loader")) or {}
                workers = ld.get("num_workers") or 0
                starting = workers and not ld.get("persistent_workers")
                name = "DataLoader iter" + (f" ({workers} worker{'s' if workers > 1 else ''} start)" if starting else "")
                self.track(pid, _vtid(pid, LOADER)).add(_slice(
                    pid, _vtid(pid, LOADER), clock.us(r["t0"]), clock.us(r["t1"]), name, "loader",
                    {"loader": r.get("loader"), "num_workers": workers,
                     "persistent_workers": ld.get("persistent_workers"), "ms": _ms(r["t1"] - r["t0"])}))
            elif k == "keras_call" and r.get("t0") is not None and r.get("t1") is not None:
                args = {key: r.get(key) for key in ("fn", "input", "epochs", "batch_size", "steps_per_epoch",
                                                    "steps_per_execution", "validation", "batches")
                        if r.get(key) is not None}
                self.track(pid, _vtid(pid, KERAS)).add(_slice(
                    pid, _vtid(pid, KERAS), clock.us(r["t0"]), clock.us(r["t1"]), f"keras {r.get('fn')}", "keras",
                    args))
            elif k == "region" and r.get("t0") is not None and r.get("t1") is not None:
                self.track(pid, _vtid(pid, REGIONS)).add(_slice(
                    pid, _vtid(pid, REGIONS), clock.us(r["t0"]), clock.us(r["t1"]), f"{r.get('kind')}: {r.get('entry')}",
                    str(r.get("kind")), {"site": r.get("site"), "ms": _ms(r["t1"] - r["t0"])}))
            elif k == "tf_window" and r.get("t0") is not None and r.get("t1") is not None:
                args = {"calls": len(r.get("calls") or []), "file": r.get("file"), "first_call": r.get("first_call")}
                if r.get("error"):
                    args["error"] = r["error"]
                self.track(pid, _vtid(pid, TF)).add(_slice(
                    pid, _vtid(pid, TF), clock.us(r["t0"]), clock.us(r["t1"]), "TensorFlow profiler window",
                    "tf_profiler", args))

    def _loader_workers(self):
        """One track per DataLoader worker process: its last batches (``WorkerTally.spans``), each a
        slice from the fetch's start to the collated batch; returns how many."""
        clock = self.clock
        n = 0
        for tally in self.run.loader_workers.values():
            track = self.track(tally.pid, tally.pid)
            for i, t0, t1, samples, fetch_ns, collate_ns in tally.spans.tolist():
                n += 1
                yield track.put(_slice(tally.pid, tally.pid, clock.us(t0), clock.us(t1), f"batch {i}", "loader_worker",
                                       {"samples": samples, "fetch_ms": _ms(fetch_ns), "collate_ms": _ms(collate_ns)}))
        return n

    def _startup(self, pid: int, records: list, steps: list) -> None:
        """The start-up on the ``outside the step`` track: one ``start-up`` slice (the command's
        start to the first step's end, args: ``metrics.time.parts.startup.split``) holding
        ``start-up: to the framework's import``, ``start-up: set-up`` (the framework's import to the
        first step: the program's own set-up and later imports) and ``start-up: first step``."""
        split = (((self.facts.time or {}).get("parts") or {}).get("startup") or {}).get("split")
        window = (self.facts.time or {}).get("window")
        installed = min((r["t"] for r in records if r.get("k") == "proc" and isinstance(r.get("t"), int)), default=None)
        if not split or not window or not steps or installed is None:
            return
        clock, tid = self.clock, _vtid(pid, REGIONS)
        w0, s0, s1 = int(window[0]), int(steps[0]["t0"]), int(steps[0]["t1"])
        args = {k: round(v, 3) for k, v in split.items() if isinstance(v, float)}
        track = self.track(pid, tid)
        track.add(_slice(pid, tid, clock.us(w0), clock.us(s1), "start-up", "startup", args))
        for a, b, name in ((w0, installed, "start-up: to the framework's import"),
                           (installed, s0, "start-up: set-up (the program's, and later imports)"),
                           (s0, s1, "start-up: first step")):
            if b > a:
                track.add(_slice(pid, tid, clock.us(a), clock.us(b), name, "startup", {"ms": _ms(b - a)}))

    # -- counters and instants ---------------------------------------------------------------------

    def _counter(self, name: str, pid: int, ts: int, args: dict) -> dict:
        if pid == MACHINE_PID:
            self.machine = True
        return {"name": name, "ph": "C", "ts": ts, "pid": pid, "tid": pid, "args": args}

    def _cpu_counters(self):
        """CPU by role (cores, per interval, at the interval's start) and memory (GiB, per tick).
        Past :data:`timeline_law.COUNTER_POINTS` intervals, the intervals between every k-th host
        tick (:func:`timeline_law.bucket`): the processes' CPU times are cumulative, so each value
        is the exact mean over its k intervals, and the scan costs 1/k; memory at those ticks."""
        run, clock, origin_ns = self.run, self.clock, self.origin
        host, self.machine_bucket = _every_kth_tick(run.host)
        cpu = series.cpu_series(host, self.trainers, run.meta.get("whyidle_pid"), origin_ns)
        if not cpu["t_s"]:
            return 0
        first = next((r["t"] for r in host if r.get("k") == "host"), None)
        starts = [first] + [origin_ns + round(t * 1e9) for t in cpu["t_s"][:-1]]
        for n, start in enumerate(starts):
            yield self._counter("CPU cores", MACHINE_PID, clock.us(start),
                                {label: round(cpu[key][n], 3) for key, label in CPU_ROLES})
        for n, t in enumerate(cpu["t_s"]):
            args = {}
            if cpu["mem_used_bytes"][n] is not None:
                args["machine used GiB"] = round(cpu["mem_used_bytes"][n] / GIB, 3)
            args["command RSS GiB"] = round(cpu["tree_rss_bytes"][n] / GIB, 3)
            yield self._counter("memory", MACHINE_PID, clock.us(origin_ns + round(t * 1e9)), args)
        return len(starts)

    def _gpu_counters(self):
        """Per GPU: NVML utilization (%), GPM SM / tensor activity (%), memory used (GiB), power (W);
        returns the per-GPU counts."""
        run, clock, origin_ns = self.run, self.clock, self.origin
        devices = series.gpu_series(run.gpu, origin_ns)
        out = []

        def us(t_s: float) -> int:
            return clock.us(origin_ns + round(t_s * 1e9))

        for d in devices:
            pid = GPU_PID_BASE + int(d["index"] or 0)
            from_buffer = any(r.get("k") == "gpu_util" and r.get("dev") == d["index"] and r.get("samples")
                              for r in run.gpu)
            counts, buckets = {}, {}
            for key, name in (("util", "GPU util"), ("mem_util", "memory read/write")):
                pts = d[key]
                if from_buffer and len(pts) >= 2:
                    # a driver sample is the duty cycle over the period *before* it: start it there
                    gaps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:]) if b[0] > a[0])
                    period = gaps[len(gaps) // 2] if gaps else 0.0
                    starts = [pts[0][0] - period] + [max(a[0], b[0] - period) for a, b in zip(pts, pts[1:])]
                else:
                    starts = [p[0] for p in pts]
                values = [p[1] for p in pts]
                starts, values = _bucketed(starts, values, timeline_law.reduce_mean, 2, buckets, key)
                for start, v in zip(starts, values):
                    yield self._counter(name, pid, us(start), {"%": v})
                counts[key] = len(pts)
            for key, name in (("sm_active", "SM active (GPM)"), ("tensor_active", "tensor active (GPM)")):
                pts = d[key]
                k = timeline_law.bucket(len(pts))
                t0s, values = [p[0] for p in pts], [round(p[2] * 100, 2) for p in pts]
                if k > 1:  # windows of different lengths: weighted by their seconds
                    buckets[key] = k
                    values = [round(v, 2) for v in timeline_law.reduce_mean(
                        values, k, [p[1] - p[0] for p in pts]).tolist()]
                    t0s = t0s[::k]
                for t0, v in zip(t0s, values):
                    yield self._counter(name, pid, us(t0), {"%": v})
                counts[key] = len(pts)
            for key, name, unit, scale, reduce in (("mem_used_bytes", "memory used", "GiB", GIB, timeline_law.reduce_max),
                                                   ("power_w", "power", "W", None, timeline_law.reduce_mean)):
                pts = d[key]
                times, values = _bucketed([p[0] for p in pts], [p[1] for p in pts], reduce, 3 if scale else 2,
                                          buckets, key)
                for t, v in zip(times, values):
                    yield self._counter(name, pid, us(t), {unit: round(v / scale, 3) if scale else v})
                counts[key] = len(pts)
            gpu = {"index": d["index"], "name": d["name"], "pid": pid, "samples": counts}
            if buckets:
                gpu["samples_per_value"] = buckets
            out.append(gpu)
        return out

    def _notices(self):
        clock = self.clock
        n = 0
        for pid, records in self.run.procs.items():
            for r in records:
                if r.get("k") == "notice" and r.get("t") is not None:
                    msg = str(r.get("msg"))
                    yield {"name": "notice: " + msg[:80], "ph": "i", "s": "p", "ts": clock.us(r["t"]),
                           "pid": pid, "tid": pid, "cat": "notice", "args": {"msg": msg}}
                    n += 1
        for r in self.run.gpu:
            if r.get("k") == "gpu_notice" and r.get("t") is not None:
                msg = str(r.get("msg"))
                self.machine = True
                yield {"name": "GPU notice: " + msg[:80], "ph": "i", "s": "p", "ts": clock.us(r["t"]),
                       "pid": MACHINE_PID, "tid": MACHINE_PID, "cat": "notice", "args": {"msg": msg}}
                n += 1
        return n

    # -- names and the header ----------------------------------------------------------------------

    def _names(self) -> Iterator[dict]:
        """Process and track names and their order: trainers first (primary first), then other
        processes, then the machine, then the GPUs."""
        framework = self.facts.framework or "none"
        trainers, primary = self.trainers, self.primary
        workers = {t.pid: t for t in self.run.loader_workers.values() if t.spans.size}
        pids = trainers + sorted(p for p in self.run.procs if p not in trainers)
        pids += sorted((p for p in workers if p not in pids), key=lambda p: (workers[p].loader or 0, workers[p].worker, p))
        for order, pid in enumerate(pids):
            role = "trainer" if pid in trainers else "python"
            label = f"{role} {pid}" + (f" ({framework})" if pid == primary and framework != "none" else "")
            if pid in workers and pid not in trainers:
                label = f"DataLoader worker {workers[pid].worker} ({pid})"
            yield _meta_event("process_name", pid, pid, {"name": label})
            yield _meta_event("process_sort_index", pid, pid, {"sort_index": order})
        for pid in pids:
            if pid in workers:  # a worker's batches (_loader_workers)
                yield _meta_event("thread_name", pid, pid, {"name": "DataLoader batches"})
            for k, tname in enumerate(TRACKS):
                t = self.tracks.get((pid, _vtid(pid, k)))
                if t is not None and t.used:
                    yield _meta_event("thread_name", pid, _vtid(pid, k), {"name": tname})
                    yield _meta_event("thread_sort_index", pid, _vtid(pid, k), {"sort_index": k})
        if self.counts["cpu_intervals"] or self.machine:
            host = self.meta.get("hostname")
            yield _meta_event("process_name", MACHINE_PID, MACHINE_PID,
                              {"name": f"machine ({host})" if host else "machine"})
            yield _meta_event("process_sort_index", MACHINE_PID, MACHINE_PID, {"sort_index": len(pids)})
        for g in self.counts["gpus"]:
            yield _meta_event("process_name", g["pid"], g["pid"], {"name": f"GPU {g['index']}: {g['name']}"})
            yield _meta_event("process_sort_index", g["pid"], g["pid"],
                              {"sort_index": len(pids) + 1 + int(g["index"] or 0)})

    def size_note(self) -> str | None:
        """One sentence saying what the size law (:mod:`whyidle.export.timeline_law`) left out of
        this timeline, or None when it left out nothing (after :meth:`events` has run)."""
        parts = []
        for pid, c in self.counts["trainers"].items():
            summary = c.get("summary")
            if summary:
                parts.append(f"trainer {pid}: {summary['detailed_steps']:,} of {c['steps']:,} steps in full (warm-up, "
                             f"the first {timeline_law.HEAD_STEPS:,} after it, the last {timeline_law.TAIL_STEPS:,}, "
                             "around left-out, epoch-boundary and slow steps, and evenly spaced stretches), the other "
                             f"{summary['summarized_steps']:,} as {summary['windows']:,} summary slices of up to "
                             f"{summary['window_steps']:,} steps")
        if self.machine_bucket > 1 or any(g.get("samples_per_value") for g in self.counts.get("gpus") or []):
            parts.append(f"counter series longer than {timeline_law.COUNTER_POINTS:,} values reduced to buckets")
        if not parts:
            return None
        return ("timeline.json is bounded (size law, docs/run-format.md): " + "; ".join(parts)
                + "; otherData.counts.trainers[pid].summary lists the steps in full.")

    def header(self) -> dict:
        """The object's keys other than ``traceEvents`` (after :meth:`events` has run)."""
        assert self.done, "events() first"
        meta, clock = self.meta, self.clock
        other = {
            "format": FORMAT, "tool_version": __version__, "run_name": meta.get("name"),
            "command": meta.get("command"), "framework": self.facts.framework or "none",
            "primary_pid": self.primary, "trainers": self.trainers,
            "clock": ("ts = (monotonic_ns + wall_minus_monotonic_ns - baseTimeNanoseconds) / 1000, integer us; "
                      "wall clock = CLOCK_REALTIME as torch.profiler/Kineto stamps its events")
            if clock.clock == "wall" else
            "ts = (monotonic_ns - baseTimeNanoseconds) / 1000, integer us (no clock anchors: the run's own clock)",
            "ts_unit": "us", "base_time_ns": clock.base, "origin_monotonic_ns": self.origin,
            "wall_minus_monotonic_ns": clock.offset if clock.clock == "wall" else None,
            "anchors": clock.anchors, "machine_pid": MACHINE_PID,
            "vtid": f"{VTID_BASE} + pid * {VTID_STRIDE} + track ({', '.join(TRACKS)})",
            "counts": self.counts,
        }
        note = self.size_note()
        if note:  # only past the size law's budgets: a shorter run's file is as it was before the law
            other["size_law"] = note
            if self.machine_bucket > 1:
                other["machine_ticks_per_counter_value"] = self.machine_bucket
        if len(clock.anchors) > 1:
            offs = [a["time_ns"] - a["monotonic_ns"] for a in clock.anchors]
            other["anchor_spread_ns"] = max(offs) - min(offs)  # wall-clock steps during the run show here
        return {"displayTimeUnit": "ms", "baseTimeNanoseconds": clock.base, "otherData": other}


def build_timeline(facts: RunFacts, run: RunData, base_ns: int | None = None) -> dict:
    """The run as a Chrome Trace Event Format object (pure), all in memory: for small runs and
    tests; :func:`write_timeline` streams the same events to a file instead.

    Args:
        facts: :func:`whyidle.analysis.run.analyze` of ``run`` (``primary``, ``trainers``,
            ``step_rows``, ``analyzed_steps``, ``steps_info``, ``framework``).
        run: the loaded run directory.
        base_ns: Unix ns that ``ts`` counts from; default Kineto's base for the run's start
            (:func:`kineto_base_ns`). ``0`` gives absolute epoch µs, as PyTorch traces written
            before ``baseTimeNanoseconds`` existed have them.
    Returns:
        ``{"displayTimeUnit": "ms", "baseTimeNanoseconds": int, "otherData": {...},
        "traceEvents": [...]}``: ``ts``/``dur`` in integer µs since ``baseTimeNanoseconds`` on the
        wall clock; ``otherData`` holds the clock (``origin_monotonic_ns``,
        ``wall_minus_monotonic_ns``, ``anchors``), the pids and the counts of what was written.
    """
    tl = _Timeline(facts, run, base_ns)
    with gc_paused():  # ~10^6 short-lived acyclic dicts for a long run: collections only cost time
        events = list(tl.events())
    return {**tl.header(), "traceEvents": events}


def write_timeline(path: str, facts: RunFacts, run: RunData, base_ns: int | None = None) -> dict:
    """Writes the timeline of :func:`build_timeline` to ``path`` atomically (temporary file +
    ``os.replace``), streaming: events are encoded in chunks of :data:`WRITE_CHUNK` as they are
    made, so memory stays flat however long the run (``traceEvents`` comes before ``otherData``
    in the file, whose counts are known at the end). Returns the object written without its
    ``traceEvents``, plus ``"events"``: how many were written."""
    tl = _Timeline(facts, run, base_ns)
    enc = msgspec.json.Encoder()
    n = 0
    with atomic_file(path) as f, gc_paused():
        f.write(b'{"displayTimeUnit":"ms","baseTimeNanoseconds":%d,"traceEvents":[' % tl.clock.base)
        chunk: list[dict] = []
        for ev in tl.events():
            chunk.append(ev)
            if len(chunk) >= WRITE_CHUNK:
                f.write((b"," if n else b"") + enc.encode(chunk)[1:-1])
                n += len(chunk)
                chunk.clear()
        if chunk:
            f.write((b"," if n else b"") + enc.encode(chunk)[1:-1])
            n += len(chunk)
        header = tl.header()
        f.write(b'],"otherData":' + enc.encode(header["otherData"]) + b"}")
    return {**header, "events": n}
