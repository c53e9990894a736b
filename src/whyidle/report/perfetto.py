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

Pure: :func:`build_timeline` takes the facts of :func:`whyidle.analysis.run.analyze` and the
:class:`~whyidle.record.reader.RunData` they came from and returns a dict; :func:`write_timeline`
writes it atomically with msgspec.
"""

from __future__ import annotations

import gc
import os

import msgspec

from whyidle import __version__
from whyidle.analysis import gpu_idle as gpu_idle_analysis
from whyidle.analysis import keras as keras_analysis
from whyidle.analysis import series
from whyidle.analysis import steps as step_analysis
from whyidle.record.reader import RunData
from whyidle.record.steptable import MAX_PH_VALUES, PHASE_CODES

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
TRACKS = ("steps", "phases", "GPU starved (CUDA timeline)", "DataLoader", "Keras", "TensorFlow profiler")
STEPS, PHASES, STARVED, LOADER, KERAS, TF = range(len(TRACKS))

#: Slice names of the step phases (``PHASE_CODES``); data waits say what they are.
PHASE_NAMES = {"setup": "setup", "data": "data wait", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer", "eval": "eval", "other": "other host", "compute": "compute"}

#: Slice names of GPU starvation by cause (:data:`whyidle.analysis.gpu_idle.CAUSES`).
STARVED_NAMES = {"data": "GPU starved: data wait", "sync": "GPU starved: sync", "host": "GPU starved: host",
                 "launch": "GPU starved: launch-bound", "other": "GPU starved: before first step"}

#: CPU counter series (keys of :func:`whyidle.analysis.series.cpu_series`) → counter arg names.
CPU_ROLES = (("trainer", "trainer"), ("workers", "workers"), ("tree_other", "rest of command"),
             ("other", "other processes"), ("whyidle", "whyidle"))

#: Steps of one trainer whose phase slices are written in full; a longer run gets them for every
#: k-th step only (``phase_stride``), so a million-step run stays near the size of a 100,000-step
#: one (~100 bytes per phase slice, 6–9 slices per step).
MAX_PHASE_STEPS = 100_000

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


class _Tracks:
    """Collects slices per (pid, tid) and emits them properly nested on each track."""

    def __init__(self) -> None:
        self.slices: dict[tuple[int, int], list[dict]] = {}

    def add(self, pid: int, tid: int, ts: int, end: int, name: str, cat: str | None = None,
            args: dict | None = None) -> None:
        ev = {"name": name, "ph": "X", "ts": ts, "dur": max(0, end - ts), "pid": pid, "tid": tid}
        if cat:
            ev["cat"] = cat
        if args:
            ev["args"] = args
        self.slices.setdefault((pid, tid), []).append(ev)

    def events(self) -> list[dict]:
        """All slices; on each track a slice that starts inside another and ends after it is cut
        at the other's end (``args.cut``), so slices either nest or follow one another."""
        out: list[dict] = []
        for items in self.slices.values():
            if any(a["ts"] > b["ts"] for a, b in zip(items, items[1:])):
                items.sort(key=lambda e: (e["ts"], -e["dur"]))
            open_ends: list[int] = []
            for ev in items:
                ts = ev["ts"]
                while open_ends and open_ends[-1] <= ts:
                    open_ends.pop()
                if open_ends and ts + ev["dur"] > open_ends[-1]:
                    ev["dur"] = open_ends[-1] - ts
                    ev["args"] = dict(ev.get("args") or {}, cut=True)
                out.append(ev)
                open_ends.append(ts + ev["dur"])
        return out


def _phase_spans(t0_us: int, t1_us: int, ph: list[int]) -> list[tuple[int, int, str]]:
    """``(ts, end, phase)`` µs spans of one step from its ``ph`` values (docs/run-format.md)."""
    spans = []
    code, start = "other", 0
    dur = t1_us - t0_us
    for k in range(0, len(ph) - 1, 2):
        off = min(max(int(ph[k + 1]), start), dur)  # offsets never go back, never past the step
        if off > start:
            spans.append((t0_us + start, t0_us + off, code))
        c = int(ph[k])
        code, start = (PHASE_CODES[c] if 0 <= c < len(PHASE_CODES) else "other"), off
    if dur > start:
        spans.append((t0_us + start, t1_us, code))
    return spans


def _steps(tracks: _Tracks, clock: _Clock, pid: int, steps: list, analyzed_ids: set, warmup: int,
           origin_ns: int) -> dict:
    """Step and phase slices of one trainer; returns counts."""
    cols = series.step_series(steps, origin_ns)
    has = cols["has"]
    stride = -(-len(steps) // MAX_PHASE_STEPS) if len(steps) > MAX_PHASE_STEPS else 1
    n_phase = 0
    with_ph = 0
    tid_s, tid_p = _vtid(pid, STEPS), _vtid(pid, PHASES)
    for n, s in enumerate(steps):
        i = s["i"]
        t0, t1 = clock.us(s["t0"]), clock.us(s["t1"])
        args = {"step_ms": round(cols["step_s"][n] * 1e3, 3)}
        if s.get("samples") is not None:
            args["samples"] = s["samples"]
        for name in has:
            v = cols[name][n]
            if v:
                args[name + "_ms"] = round(v * 1e3, 3)
        if cols["other_host"][n]:
            args["other_host_ms"] = round(cols["other_host"][n] * 1e3, 3)
        if s.get("gpu_ms") is not None:
            args["gpu_ms"] = round(s["gpu_ms"], 3)
        args["analyzed"] = i in analyzed_ids
        if n < warmup:
            args["warmup"] = True
        if s.get("boundary"):
            args["boundary"] = True
        if s.get("profiled"):
            args["profiled"] = True
        ph = s.get("ph")
        if ph and n % stride:
            args["phases"] = False  # left out to keep the file small (``phase_stride``)
        elif ph:
            with_ph += 1
            if len(ph) >= MAX_PH_VALUES:
                args["phases_cut"] = True  # later phase changes of this step were not recorded
            for ts, end, phase in _phase_spans(t0, t1, ph):
                tracks.add(pid, tid_p, ts, end, PHASE_NAMES[phase])
                n_phase += 1
        tracks.add(pid, tid_s, t0, t1, f"step {i}", "step", args)
    return {"steps": len(steps), "steps_with_phases": with_ph, "phase_slices": n_phase, "phase_stride": stride}


def _starved(tracks: _Tracks, clock: _Clock, pid: int, records: list) -> int:
    """GPU-starved slices from the CUDA timeline (adjacent ranges of one cause merged)."""
    ranges = gpu_idle_analysis.starved_ranges(records)
    if ranges is None:
        return 0
    tid = _vtid(pid, STARVED)
    merged: list[list] = []
    for a, b, cause in zip(ranges["t0"].tolist(), ranges["t1"].tolist(), ranges["cause"]):
        a, b = clock.us(a), clock.us(b)
        if b <= a:
            continue
        if merged and merged[-1][2] == cause and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b, cause])
    for a, b, cause in merged:
        tracks.add(pid, tid, a, b, STARVED_NAMES.get(cause, "GPU starved"), "gpu_starved", {"cause": cause})
    return len(merged)


def _host_regions(tracks: _Tracks, clock: _Clock, pid: int, records: list) -> None:
    """DataLoader iterator creations, Keras fit/evaluate/predict, the TensorFlow profiler window."""
    loaders = {r.get("id"): r for r in records if r.get("k") == "loader"}
    for r in records:
        k = r.get("k")
        if k == "iter" and r.get("t0") is not None and r.get("t1") is not None:
            ld = loaders.get(r.get("loader")) or {}
            workers = ld.get("num_workers") or 0
            starting = workers and not ld.get("persistent_workers")
            name = "DataLoader iter" + (f" ({workers} worker{'s' if workers > 1 else ''} start)" if starting else "")
            tracks.add(pid, _vtid(pid, LOADER), clock.us(r["t0"]), clock.us(r["t1"]), name, "loader",
                       {"loader": r.get("loader"), "num_workers": workers,
                        "persistent_workers": ld.get("persistent_workers"), "ms": _ms(r["t1"] - r["t0"])})
        elif k == "keras_call" and r.get("t0") is not None and r.get("t1") is not None:
            args = {key: r.get(key) for key in ("fn", "input", "epochs", "batch_size", "steps_per_epoch",
                                                "steps_per_execution", "validation", "batches")
                    if r.get(key) is not None}
            tracks.add(pid, _vtid(pid, KERAS), clock.us(r["t0"]), clock.us(r["t1"]), f"keras {r.get('fn')}",
                       "keras", args)
        elif k == "tf_window" and r.get("t0") is not None and r.get("t1") is not None:
            args = {"calls": len(r.get("calls") or []), "file": r.get("file"), "first_call": r.get("first_call")}
            if r.get("error"):
                args["error"] = r["error"]
            tracks.add(pid, _vtid(pid, TF), clock.us(r["t0"]), clock.us(r["t1"]), "TensorFlow profiler window",
                       "tf_profiler", args)


def _counter(events: list, name: str, pid: int, ts: int, args: dict) -> None:
    events.append({"name": name, "ph": "C", "ts": ts, "pid": pid, "tid": pid, "args": args})


def _cpu_counters(events: list, clock: _Clock, run: RunData, trainers: list, origin_ns: int) -> int:
    """CPU by role (cores, per interval, at the interval's start) and memory (GiB, per tick)."""
    cpu = series.cpu_series(run.host, trainers, run.meta.get("whyidle_pid"), origin_ns)
    if not cpu["t_s"]:
        return 0
    first = next((r["t"] for r in run.host if r.get("k") == "host"), None)
    starts = [first] + [origin_ns + round(t * 1e9) for t in cpu["t_s"][:-1]]
    for n, start in enumerate(starts):
        _counter(events, "CPU cores", MACHINE_PID, clock.us(start),
                 {label: round(cpu[key][n], 3) for key, label in CPU_ROLES})
    for n, t in enumerate(cpu["t_s"]):
        args = {}
        if cpu["mem_used_bytes"][n] is not None:
            args["machine used GiB"] = round(cpu["mem_used_bytes"][n] / GIB, 3)
        args["command RSS GiB"] = round(cpu["tree_rss_bytes"][n] / GIB, 3)
        _counter(events, "memory", MACHINE_PID, clock.us(origin_ns + round(t * 1e9)), args)
    return len(starts)


def _gpu_counters(events: list, clock: _Clock, run: RunData, origin_ns: int) -> list[dict]:
    """Per GPU: NVML utilization (%), GPM SM / tensor activity (%), memory used (GiB), power (W)."""
    devices = series.gpu_series(run.gpu, origin_ns)
    out = []

    def us(t_s: float) -> int:
        return clock.us(origin_ns + round(t_s * 1e9))

    for d in devices:
        pid = GPU_PID_BASE + int(d["index"] or 0)
        from_buffer = any(r.get("k") == "gpu_util" and r.get("dev") == d["index"] and r.get("samples")
                          for r in run.gpu)
        counts = {}
        for key, name in (("util", "GPU util"), ("mem_util", "memory read/write")):
            pts = d[key]
            if from_buffer and len(pts) >= 2:
                # a driver sample is the duty cycle over the period *before* it: start it there
                gaps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:]) if b[0] > a[0])
                period = gaps[len(gaps) // 2] if gaps else 0.0
                starts = [pts[0][0] - period] + [max(a[0], b[0] - period) for a, b in zip(pts, pts[1:])]
            else:
                starts = [p[0] for p in pts]
            for start, (_, v) in zip(starts, pts):
                _counter(events, name, pid, us(start), {"%": v})
            counts[key] = len(pts)
        for key, name in (("sm_active", "SM active (GPM)"), ("tensor_active", "tensor active (GPM)")):
            for t0, _t1, v in d[key]:
                _counter(events, name, pid, us(t0), {"%": round(v * 100, 2)})
            counts[key] = len(d[key])
        for t, v in d["mem_used_bytes"]:
            _counter(events, "memory used", pid, us(t), {"GiB": round(v / GIB, 3)})
        counts["mem_used_bytes"] = len(d["mem_used_bytes"])
        for t, v in d["power_w"]:
            _counter(events, "power", pid, us(t), {"W": v})
        counts["power_w"] = len(d["power_w"])
        out.append({"index": d["index"], "name": d["name"], "pid": pid, "samples": counts})
    return out


def _notices(events: list, clock: _Clock, run: RunData) -> int:
    n = 0
    for pid, records in run.procs.items():
        for r in records:
            if r.get("k") == "notice" and r.get("t") is not None:
                msg = str(r.get("msg"))
                events.append({"name": "notice: " + msg[:80], "ph": "i", "s": "p", "ts": clock.us(r["t"]),
                               "pid": pid, "tid": pid, "cat": "notice", "args": {"msg": msg}})
                n += 1
    for r in run.gpu:
        if r.get("k") == "gpu_notice" and r.get("t") is not None:
            msg = str(r.get("msg"))
            events.append({"name": "GPU notice: " + msg[:80], "ph": "i", "s": "p", "ts": clock.us(r["t"]),
                           "pid": MACHINE_PID, "tid": MACHINE_PID, "cat": "notice", "args": {"msg": msg}})
            n += 1
    return n


def build_timeline(facts: dict, run: RunData, base_ns: int | None = None) -> dict:
    """The run as a Chrome Trace Event Format object (pure).

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
    enabled = gc.isenabled()
    gc.disable()  # ~10^6 small acyclic dicts for a long run: collections would only cost time
    try:
        return _build(facts, run, base_ns)
    finally:
        if enabled:
            gc.enable()


def _build(facts: dict, run: RunData, base_ns: int | None) -> dict:
    meta = run.meta or {}
    origin = series.run_origin(meta, run.host, run.gpu)
    clock = _Clock(meta, origin, base_ns)
    tracks = _Tracks()
    events: list[dict] = []
    primary = facts.get("primary")
    trainers = list(facts.get("trainers") or [])
    counts: dict = {"trainers": {}}

    for pid in trainers:
        recs = run.procs.get(pid, [])
        if pid == primary:
            steps = list(facts.get("step_rows") or [])
            analyzed = facts.get("analyzed_steps") or []
            warmup = (facts.get("steps_info") or {}).get("warmup", 0)
        else:
            steps = step_analysis.steps_of(run.steps.get(pid, recs))
            steps, _ = keras_analysis.input_wait(steps, recs)
            analyzed, info = step_analysis.select_steps(steps)
            warmup = info.get("warmup", 0)
        c = _steps(tracks, clock, pid, steps, {s["i"] for s in analyzed}, warmup, origin)
        c["starved_slices"] = _starved(tracks, clock, pid, recs)
        _host_regions(tracks, clock, pid, recs)
        counts["trainers"][str(pid)] = c

    for pid in run.procs:
        if pid not in trainers:
            _host_regions(tracks, clock, pid, run.procs[pid])
    counts["notices"] = _notices(events, clock, run)
    counts["cpu_intervals"] = _cpu_counters(events, clock, run, trainers, origin)
    gpus = _gpu_counters(events, clock, run, origin)
    slices = tracks.events()

    # names and order: trainers first (primary first), then other processes, then counters
    framework = facts.get("framework") or "none"
    named: list[dict] = []
    pids = trainers + sorted(p for p in run.procs if p not in trainers)
    for order, pid in enumerate(pids):
        role = "trainer" if pid in trainers else "python"
        label = f"{role} {pid}" + (f" ({framework})" if pid == primary and framework != "none" else "")
        named.append(_meta_event("process_name", pid, pid, {"name": label}))
        named.append(_meta_event("process_sort_index", pid, pid, {"sort_index": order}))
    used_tids = {key for key in tracks.slices}
    for pid in pids:
        for k, tname in enumerate(TRACKS):
            if (pid, _vtid(pid, k)) in used_tids:
                named.append(_meta_event("thread_name", pid, _vtid(pid, k), {"name": tname}))
                named.append(_meta_event("thread_sort_index", pid, _vtid(pid, k), {"sort_index": k}))
    if counts["cpu_intervals"] or any(e["pid"] == MACHINE_PID for e in events):
        host = meta.get("hostname")
        named.append(_meta_event("process_name", MACHINE_PID, MACHINE_PID,
                                 {"name": f"machine ({host})" if host else "machine"}))
        named.append(_meta_event("process_sort_index", MACHINE_PID, MACHINE_PID, {"sort_index": len(pids)}))
    for g in gpus:
        named.append(_meta_event("process_name", g["pid"], g["pid"], {"name": f"GPU {g['index']}: {g['name']}"}))
        named.append(_meta_event("process_sort_index", g["pid"], g["pid"],
                                 {"sort_index": len(pids) + 1 + int(g["index"] or 0)}))
    counts["gpus"] = gpus

    other = {
        "format": FORMAT, "tool_version": __version__, "run_name": meta.get("name"),
        "command": meta.get("command"), "framework": framework, "primary_pid": primary, "trainers": trainers,
        "clock": ("ts = (monotonic_ns + wall_minus_monotonic_ns - baseTimeNanoseconds) / 1000, integer us; "
                  "wall clock = CLOCK_REALTIME as torch.profiler/Kineto stamps its events")
        if clock.clock == "wall" else
        "ts = (monotonic_ns - baseTimeNanoseconds) / 1000, integer us (no clock anchors: the run's own clock)",
        "ts_unit": "us", "base_time_ns": clock.base, "origin_monotonic_ns": origin,
        "wall_minus_monotonic_ns": clock.offset if clock.clock == "wall" else None,
        "anchors": clock.anchors, "machine_pid": MACHINE_PID,
        "vtid": f"{VTID_BASE} + pid * {VTID_STRIDE} + track ({', '.join(TRACKS)})",
        "counts": counts,
    }
    if len(clock.anchors) > 1:
        offs = [a["time_ns"] - a["monotonic_ns"] for a in clock.anchors]
        other["anchor_spread_ns"] = max(offs) - min(offs)  # wall-clock steps during the run show here
    return {"displayTimeUnit": "ms", "baseTimeNanoseconds": clock.base, "otherData": other,
            "traceEvents": named + slices + events}


def write_timeline(path: str, facts: dict, run: RunData, base_ns: int | None = None) -> dict:
    """Builds the timeline (:func:`build_timeline`) and writes it to ``path`` atomically
    (temporary file + ``os.replace``); returns the object written."""
    obj = build_timeline(facts, run, base_ns)
    data = msgspec.json.encode(obj)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return obj
