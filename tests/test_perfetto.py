"""``timeline.json``: the run in Chrome Trace Event Format, for ui.perfetto.dev and chrome://tracing.

Structure is checked here the way Perfetto's JSON importer reads it (every event has the keys its
``ph`` needs, slices on one thread track never partially overlap, counters are numbers, every
process and track is named, counter tracks are ``"<name> <arg>"`` per process), on real runs
(a CPU PyTorch run with phase spans, a fake-CUDA run, a fake-NVML run) and on synthetic ones
(GPU counters, Keras, two trainers, an old run without ``ph``, 100,000 steps). The last test
loads the file into Perfetto's own trace processor when its binary is on this machine.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import math
import os
import platform
import re
import shutil
import sys
import threading
import time

import msgspec
import pytest

import synthetic_run
from conftest import REPO, observe, write_script
from whyidle.analysis import series
from whyidle.analysis.run import analyze
from whyidle.record.reader import load_run
from whyidle.export import perfetto as pf

SHARED_TRACES = os.path.join(os.path.dirname(REPO), "shared", "traces")

#: Keys each event kind must carry (Trace Event Format; what Perfetto's importer reads).
REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "C": ("name", "ts", "pid", "args"),
            "i": ("name", "ts", "pid", "tid", "s"), "M": ("name", "pid", "args")}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
PHASE_KEY = {"data wait": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "eval": "eval"}


def check_trace(obj: dict) -> dict:
    """Asserts the structure of a timeline object; returns what a viewer would show.

    Returns ``{"tracks": {(pid, thread name): [(ts, end, name, args)]}, "counters": {(pid,
    track name): [(ts, value)]}, "instants": [event], "processes": {pid: name}, "sort":
    {pid: index}}``.
    """
    assert obj["displayTimeUnit"] == "ms"
    assert isinstance(obj["baseTimeNanoseconds"], int) and obj["baseTimeNanoseconds"] >= 0
    assert obj["otherData"]["format"] == pf.FORMAT
    events = obj["traceEvents"]
    assert isinstance(events, list)
    procs, threads, sort = {}, {}, {}
    slices = collections.defaultdict(list)
    counters = collections.defaultdict(list)
    instants = []
    for e in events:
        ph = e["ph"]
        assert ph in REQUIRED, e
        for key in REQUIRED[ph]:
            assert key in e, (key, e)
        assert isinstance(e["name"], str) and e["name"], e
        for key in ("pid", "tid"):
            if key in e:
                assert isinstance(e[key], int) and not isinstance(e[key], bool) and 0 < e[key] < 2**31, e
        if ph != "M":
            assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        if ph == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"], e.get("args") or {}))
        elif ph == "C":
            assert isinstance(e["args"], dict) and e["args"], e
            for key, v in e["args"].items():
                assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), e
                counters[(e["pid"], f"{e['name']} {key}")].append((e["ts"], v))
        elif ph == "i":
            assert e["s"] in ("g", "p", "t"), e
            instants.append(e)
        else:
            assert e["name"] in METADATA, e
            if e["name"] == "process_name":
                procs[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                assert (e["tid"]) not in {t for _, t in threads} or (e["pid"], e["tid"]) in threads, \
                    "a track's tid is used by two processes (Perfetto keys threads by tid)"
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
            elif e["name"] == "process_sort_index":
                sort[e["pid"]] = e["args"]["sort_index"]
    tracks = {}
    for key, items in slices.items():
        items.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        for a, b, name, _ in items:
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1], f"{name} [{a}, {b}] partly overlaps a slice on {key}"
            stack.append(b)
        assert key in threads, f"track {key} has no thread_name"
        tracks[(key[0], threads[key])] = items
    for pid in {e["pid"] for e in events}:
        assert pid in procs, f"pid {pid} has no process_name"
    for key, pts in counters.items():
        assert [t for t, _ in pts] == sorted(t for t, _ in pts), key
    return {"tracks": tracks, "counters": dict(counters), "instants": instants, "processes": procs, "sort": sort}


def timeline(run_dir: str, **kwargs):
    run = load_run(run_dir)
    facts = analyze(run)
    obj = pf.build_timeline(facts, run, **kwargs)
    return obj, check_trace(obj), facts, run


def wall_us(t_ns: int, meta: dict, base_ns: int) -> float:
    """The expected ``ts`` of monotonic ``t_ns``, computed from the anchors independently."""
    a = meta["anchors"][0]
    return (t_ns + a["time_ns"] - a["monotonic_ns"] - base_ns) / 1000


def add_ph(run_dir: str, pid: int = synthetic_run.TRAINER) -> None:
    """Gives a synthetic run's steps ``ph`` spans: data, forward, backward, other, optimizer, other."""
    path = os.path.join(run_dir, f"proc-{pid}.jsonl")
    lines = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("k") == "step":
                off, ph = 0, []
                for code, key in ((1, "data"), (2, "fwd"), (3, "bwd"), (6, None), (4, "opt"), (6, None)):
                    ph += [code, off // 1000]
                    off += r[key] if key else 1_000_000
                r["ph"] = ph
            lines.append(json.dumps(r, separators=(",", ":")))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def append_records(run_dir: str, pid: int, records: list[dict]) -> None:
    with open(os.path.join(run_dir, f"proc-{pid}.jsonl"), "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def steps_and_phases(shown: dict, pid: int):
    tracks = shown["tracks"]
    return tracks.get((pid, "steps"), []), tracks.get((pid, "phases"), [])


def check_phases_tile_steps(steps_shown, phases_shown, rows) -> None:
    """Each step's phase slices cover it end to end, and add up per phase to what the step
    record measured (within the µs resolution of the ``ph`` offsets)."""
    j = 0
    for (a, b, name, args), row in zip(steps_shown, rows):
        assert name == f"step {row['i']}"
        mine = []
        while j < len(phases_shown) and phases_shown[j][0] < b:
            mine.append(phases_shown[j])
            j += 1
        assert mine, name
        assert mine[0][0] == a and mine[-1][1] == b, name
        assert all(x[1] == y[0] for x, y in zip(mine, mine[1:])), f"{name}: gap between its phases"
        per = collections.Counter()
        for pa, pb, pname, _ in mine:
            per[pname] += pb - pa
        for pname, key in PHASE_KEY.items():
            assert abs(per[pname] * 1000 - (row[key] or 0)) <= (len(mine) + 2) * 1000, (name, pname)


# ------------------------------------------------------------------------------------------------
# real runs


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    """A real CPU PyTorch run under ``whyidle run`` (steps record ``ph``), two DataLoader epochs."""
    tmp = tmp_path_factory.mktemp("torch")
    script = write_script(tmp / "train.py", steps=40, in_step="time.sleep(0.002)")
    proc, report, run_dir = observe(tmp, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    return run_dir


@pytest.mark.slow
def test_real_torch_run_steps_phases_and_counters(torch_run, tmp_path):
    obj, shown, facts, run = timeline(torch_run)
    pid = facts.primary
    rows = facts.step_rows
    steps, phases = steps_and_phases(shown, pid)
    assert len(steps) == len(rows) == 40
    assert all(r.get("ph") for r in rows)
    check_phases_tile_steps(steps, phases, rows)
    assert {name for _, _, name, _ in phases} >= {"data wait", "forward", "backward", "optimizer", "other host"}
    counts = obj["otherData"]["counts"]["trainers"][str(pid)]
    assert counts["steps"] == 40 and counts["steps_with_phases"] == 40 and counts["phase_slices"] == len(phases)
    # the analyzed steps, the warm-up and the boundaries are marked
    assert sum(a["analyzed"] for *_, a in steps) == len(facts.analyzed_steps)
    assert sum(bool(a.get("warmup")) for *_, a in steps) == facts.steps_info["warmup"] == 2
    assert sum(bool(a.get("boundary")) for *_, a in steps) == sum(bool(r["boundary"]) for r in rows)
    assert steps[5][3]["step_ms"] == pytest.approx((rows[5]["t1"] - rows[5]["t0"]) / 1e6, abs=1e-3)
    # the trace clock: wall-clock µs since Kineto's base, from the first anchor
    base = obj["baseTimeNanoseconds"]
    assert base == pf.kineto_base_ns(run.meta["anchors"][0]["time_ns"])
    for (a, b, _, _), row in zip(steps, rows):
        assert abs(a - wall_us(row["t0"], run.meta, base)) <= 0.5
        assert abs(b - wall_us(row["t1"], run.meta, base)) <= 0.5
    assert obj["otherData"]["origin_monotonic_ns"] == run.meta["anchors"][0]["monotonic_ns"]
    assert obj["otherData"]["anchors"] == run.meta["anchors"]
    # DataLoader iterator creations: one per epoch started
    iters = [r for r in run.procs[pid] if r.get("k") == "iter"]
    loader = shown["tracks"][(pid, "DataLoader")]
    assert len(loader) == len(iters) == 2
    assert abs(loader[0][0] - wall_us(iters[0]["t0"], run.meta, base)) <= 0.5
    # CPU by role and memory: one value per interval between host ticks
    ticks = [r for r in run.host if r.get("k") == "host"]
    machine = pf.MACHINE_PID
    for label in ("trainer", "workers", "rest of command", "other processes", "whyidle"):
        assert len(shown["counters"][(machine, f"CPU cores {label}")]) == len(ticks) - 1
    assert len(shown["counters"][(machine, "memory command RSS GiB")]) == len(ticks) - 1
    assert max(v for _, v in shown["counters"][(machine, "CPU cores trainer")]) > 0.1
    # names and order: the trainer first
    assert shown["processes"][pid] == f"trainer {pid} (torch)"
    assert shown["sort"][pid] == 0 and shown["sort"][machine] > 0
    # no GPU here: no GPU process, no starved track
    assert not any(p >= pf.GPU_PID_BASE for p in shown["processes"])
    assert (pid, "GPU starved (CUDA timeline)") not in shown["tracks"]
    # written atomically, and what is streamed to the file is what was built
    path = str(tmp_path / "timeline.json")
    written = pf.write_timeline(path, facts, run)
    with open(path) as f:
        assert json.load(f) == json.loads(msgspec.json.encode(obj))
    assert written == {**{k: v for k, v in obj.items() if k != "traceEvents"}, "events": len(obj["traceEvents"])}
    assert os.listdir(tmp_path) == ["timeline.json"]


PROFILED = """
sched = torch.profiler.schedule(wait=3, warmup=1, active=8, repeat=1)
prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                              on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1]))
prof.start()
"""


@pytest.mark.slow
def test_overlays_a_torch_profiler_trace_of_the_same_run(tmp_path):
    """torch.profiler (Kineto) in the observed program: its trace has the same base, and its ops
    fall inside our phase slices of the same moments (µs apart, not ms)."""
    trace = str(tmp_path / "kineto.json")
    script = write_script(tmp_path / "train.py", steps=20, pre=PROFILED, in_step="prof.step()")
    proc, _, run_dir = observe(tmp_path, [sys.executable, script, trace])
    assert proc.returncode == 0, proc.stderr
    with open(trace) as f:
        kineto = json.load(f)
    obj, shown, facts, run = timeline(run_dir)
    assert obj["baseTimeNanoseconds"] == kineto["baseTimeNanoseconds"]
    phases = shown["tracks"][(facts.primary, "phases")]
    starts = [a for a, *_ in phases]
    import bisect

    checked = collections.Counter()
    for e in kineto["traceEvents"]:
        name = e.get("name", "")
        phase = ("forward" if name == "aten::linear" else "backward" if name == "AddmmBackward0"
                 else "data wait" if name.startswith("enumerate(DataLoader)") else None)
        if e.get("ph") != "X" or phase is None:
            continue
        t0, t1 = e["ts"], e["ts"] + max(e["dur"], 1)
        j = max(0, bisect.bisect_right(starts, t0) - 1)
        overlap = collections.Counter()
        while j < len(phases) and phases[j][0] < t1:  # the phases this op overlaps, and by how much
            a, b, got, _ = phases[j]
            overlap[got] += max(0, min(b, t1) - max(a, t0))
            j += 1
        # µs apart at most: within 50 µs (the two clocks meet through the run's anchors, which
        # jitter by tens of µs on a loaded box); an op longer than twice that lies mostly in its phase
        assert overlap[phase] >= (t1 - t0) - 50, (name, t0, t1, overlap)
        if t1 - t0 > 100:
            assert overlap.most_common(1)[0][0] == phase, (name, t0, t1, overlap)
        checked[phase] += 1
    assert min(checked.values()) >= 5 and len(checked) == 3


@pytest.mark.slow
def test_fake_cuda_run_has_gpu_starved_slices_by_cause(tmp_path):
    from test_run_cuda_fake import IN_STEP, PRE

    script = write_script(tmp_path / "train.py", steps=30, pre=PRE, in_step=IN_STEP)
    proc, _, run_dir = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    obj, shown, facts, run = timeline(run_dir)
    pid = facts.primary
    starved = shown["tracks"][(pid, "GPU starved (CUDA timeline)")]
    assert {name for *_, name, _ in starved} <= set(pf.STARVED_NAMES.values())
    assert {a["cause"] for *_, a in starved} >= {"data", "sync"}
    # over the analyzed window the slices add up to what the analysis reports
    base = obj["baseTimeNanoseconds"]
    w0, w1 = (wall_us(t, run.meta, base) for t in facts.step["window"])
    by_cause = collections.Counter()
    for a, b, _, args in starved:
        by_cause[args["cause"]] += max(0.0, min(b, w1) - max(a, w0)) / 1e6
    idle = facts.gpu_idle
    tol = 1e-6 * (len(starved) + 2)  # µs rounding of each slice's ends
    assert sum(by_cause.values()) == pytest.approx(idle["starved_s"], abs=tol)
    for cause, seconds in idle["idle_s_by_cause"].items():
        assert by_cause[cause] == pytest.approx(seconds, abs=tol), cause
    steps, phases = steps_and_phases(shown, pid)
    check_phases_tile_steps(steps, phases, facts.step_rows)


@pytest.mark.slow
def test_fake_nvml_run_has_gpu_utilization_samples(tmp_path, monkeypatch):
    import pynvml
    from fake_nvml import FakeDevice, FakeNvml, now_us
    from whyidle.run.session import RunOptions
    from whyidle.run.session import observe as observe_in_process

    device = FakeDevice(name="NVIDIA H200", util=(30, 5))
    FakeNvml([device], cuda_driver_version=12040).install(monkeypatch)
    stop = threading.Event()

    def driver_samples():
        while not stop.wait(1 / 6):
            device.add_samples(pynvml.NVML_GPU_UTILIZATION_SAMPLES, [(now_us(), 30)])

    feeder = threading.Thread(target=driver_samples, daemon=True)
    feeder.start()
    script = write_script(tmp_path / "t.py", steps=30, in_step="time.sleep(0.02)")
    try:
        _, status, run_dir = observe_in_process([sys.executable, script],
                                                RunOptions(out=str(tmp_path / "run"), quiet=True), stream=sys.stderr)
    finally:
        stop.set()
        feeder.join()
    assert status.exit_code == 0
    obj, shown, facts, run = timeline(run_dir)
    gpu_pid = pf.GPU_PID_BASE
    assert shown["processes"][gpu_pid] == "GPU 0: NVIDIA H200"
    recorded = {tuple(s) for r in run.gpu if r.get("k") == "gpu_util" and r.get("type") == "gpu"
                for s in r["samples"]}
    util = shown["counters"][(gpu_pid, "GPU util %")]
    assert len(util) == len(recorded) >= 3
    assert {v for _, v in util} == {30}
    states = [r for r in run.gpu if r.get("k") == "gpu_state"]
    assert len(shown["counters"][(gpu_pid, "memory used GiB")]) == len(states)
    gpm = [r for r in run.gpu if r.get("k") == "gpm" and r.get("sm_active") is not None]
    assert len(shown["counters"].get((gpu_pid, "SM active (GPM) %"), [])) == len(gpm)


# ------------------------------------------------------------------------------------------------
# synthetic runs


def test_synthetic_gpu_run_counter_tracks(tmp_path):
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=120, gpu=True)
    obj, shown, facts, run = timeline(run_dir)
    gpu_pid = pf.GPU_PID_BASE
    names = {name for pid, name in shown["counters"] if pid == gpu_pid}
    assert names == {"GPU util %", "memory read/write %", "SM active (GPM) %", "tensor active (GPM) %",
                     "memory used GiB", "power W"}
    machine = {name for pid, name in shown["counters"] if pid == pf.MACHINE_PID}
    assert machine == {"CPU cores trainer", "CPU cores workers", "CPU cores rest of command",
                       "CPU cores other processes", "CPU cores whyidle", "memory machine used GiB",
                       "memory command RSS GiB"}
    util_samples = [s for r in run.gpu if r.get("k") == "gpu_util" for s in r["samples"]]
    gpm = [r for r in run.gpu if r.get("k") == "gpm"]
    assert len(shown["counters"][(gpu_pid, "GPU util %")]) == len(util_samples)
    sm = shown["counters"][(gpu_pid, "SM active (GPM) %")]
    assert len(sm) == len(gpm)
    base = obj["baseTimeNanoseconds"]
    for (ts, v), r in zip(sm, gpm):  # a GPM window's value starts at its t0, in percent
        assert abs(ts - wall_us(r["t0"], run.meta, base)) <= 1
        assert v == pytest.approx(r["sm_active"] * 100)
    # a driver sample covers the period before it: it starts one period (1/6 s) earlier
    first = util_samples[1]
    assert shown["counters"][(gpu_pid, "GPU util %")][1][0] == pytest.approx(
        wall_us(util_samples[0][0], run.meta, base), abs=1)
    assert first[1] == shown["counters"][(gpu_pid, "GPU util %")][1][1]
    cpu = series.cpu_series(run.host, facts.trainers, run.meta["whyidle_pid"], series.run_origin(run.meta))
    workers = [v for _, v in shown["counters"][(pf.MACHINE_PID, "CPU cores workers")]]
    assert workers == [round(v, 3) for v in cpu["workers"]]
    assert shown["processes"][pf.MACHINE_PID] == "machine (vm)"
    assert shown["sort"][synthetic_run.TRAINER] < shown["sort"][pf.MACHINE_PID] < shown["sort"][gpu_pid]
    counts = obj["otherData"]["counts"]["gpus"][0]["samples"]
    assert counts["util"] == len(util_samples) and counts["sm_active"] == len(gpm)


def test_run_recorded_before_phase_spans_has_step_slices_only(tmp_path):
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=60)  # no "ph": an older run
    obj, shown, facts, run = timeline(run_dir)
    steps, phases = steps_and_phases(shown, synthetic_run.TRAINER)
    assert len(steps) == 60 and phases == []
    args = steps[10][3]
    row = facts.step_rows[10]
    assert args["data_wait_ms"] == pytest.approx(row["data"] / 1e6, abs=1e-3)
    assert args["forward_ms"] == pytest.approx(row["fwd"] / 1e6, abs=1e-3)
    assert args["samples"] == 32 and args["analyzed"] is True
    assert "phases" not in args and "warmup" not in args
    assert obj["otherData"]["counts"]["trainers"][str(synthetic_run.TRAINER)]["phase_slices"] == 0
    # the boundary steps are marked and not analyzed
    marked = [a for *_, a in steps if a.get("boundary")]
    assert len(marked) == 2 and not any(a["analyzed"] for a in marked)


@pytest.mark.skipif(not glob.glob("/tmp/runs/demo/*-demo-before"), reason="no sample demo runs in /tmp/runs")
def test_sample_demo_runs_load_when_present():
    for run_dir in glob.glob("/tmp/runs/demo/*-demo-*"):
        obj, shown, facts, _ = timeline(run_dir)
        steps, phases = steps_and_phases(shown, facts.primary)
        assert len(steps) == len(facts.step_rows) and phases == []


def test_two_trainers_notices_and_overlapping_regions(tmp_path):
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=30)
    add_ph(run_dir)
    other = synthetic_run.TRAINER + 100
    shutil.copy(os.path.join(run_dir, f"proc-{synthetic_run.TRAINER}.jsonl"), os.path.join(run_dir, f"proc-{other}.jsonl"))
    t = synthetic_run.T0 + 500 * synthetic_run.MS
    append_records(run_dir, synthetic_run.TRAINER, [
        {"k": "notice", "t": t, "msg": "whyidle: stack sampling disabled (test)"},
        {"k": "loader", "t": t, "id": 2, "num_workers": 3, "persistent_workers": False},
        {"k": "iter", "t": t + 50_000_000, "loader": 2, "t0": t, "t1": t + 50_000_000},
        {"k": "iter", "t": t + 60_000_000, "loader": 2, "t0": t + 20_000_000, "t1": t + 60_000_000},  # overlaps
    ])
    obj, shown, facts, run = timeline(run_dir)
    assert set(facts.trainers) == {synthetic_run.TRAINER, other}
    for pid in facts.trainers:
        steps, phases = steps_and_phases(shown, pid)
        assert len(steps) == 30 and len(phases) == 30 * 6
        check_phases_tile_steps(steps, phases, facts.step_rows)
    assert shown["sort"][facts.primary] == 0
    loader = shown["tracks"][(synthetic_run.TRAINER, "DataLoader")]
    assert len(loader) == 2 and loader[1][1] == loader[0][1] and loader[1][3]["cut"]  # cut at the first's end
    assert loader[0][2] == "DataLoader iter (3 workers start)" and loader[0][3]["num_workers"] == 3
    notice = [e for e in shown["instants"] if e["pid"] == synthetic_run.TRAINER]
    assert len(notice) == 1 and notice[0]["s"] == "p" and "stack sampling" in notice[0]["args"]["msg"]
    assert obj["otherData"]["counts"]["notices"] == 2  # plus the NVML notice of gpu.jsonl
    assert any(e["pid"] == pf.MACHINE_PID and e["name"].startswith("GPU notice") for e in shown["instants"])


def test_keras_run_regions_and_profiled_steps(tmp_path):
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=1)
    pid, MS = 5151, synthetic_run.MS
    t = synthetic_run.T0 + 1000 * MS
    recs = [{"k": "proc", "t": t - 500 * MS, "pid": pid, "ppid": synthetic_run.WHYIDLE, "argv": ["fit.py"],
             "python": "3.11.7", "framework": "keras", "backend": "tensorflow", "tf_version": "2.20.0",
             "framework_version": "3.10.0", "cuda_build": None, "threads": 2}]
    steps, calls = [], []
    for i in range(20):
        fn = 8 * MS
        t0, t1 = t + i * 10 * MS, t + (i + 1) * 10 * MS
        profiled = 5 <= i < 9
        steps.append({"k": "step", "t": t1, "i": i, "t0": t0, "t1": t1, "by": "keras", "fn": fn, "batches": 1,
                      "samples": 64, "cpu": 5 * MS, "boundary": i in (0, 19), "profiled": profiled,
                      "ph": [7, 1000, 6, 9000]})
        if profiled:
            calls.append([fn, 2 * MS])
    recs += steps
    recs.append({"k": "tf_window", "t": t + 95 * MS, "method": "tf_profiler", "t0": t + 50 * MS, "t1": t + 90 * MS,
                 "first_call": 5, "fn_name": "train_function", "calls": calls, "iterators": [],
                 "file": "tfprof-5151/x.xplane.pb", "parse_s": 0.1})
    recs.append({"k": "keras_call", "t": t + 200 * MS, "fn": "fit", "t0": t - 5 * MS, "t1": t + 200 * MS,
                 "steps_per_execution": 1, "input": "tf.data", "epochs": 1, "batch_size": 64, "steps_per_epoch": 20,
                 "validation": False})
    os.remove(os.path.join(run_dir, f"proc-{synthetic_run.TRAINER}.jsonl"))
    append_records(run_dir, pid, recs)
    obj, shown, facts, run = timeline(run_dir)
    assert facts.primary == pid and facts.framework == "keras"
    assert shown["processes"][pid] == f"trainer {pid} (keras)"
    fit = shown["tracks"][(pid, "Keras")]
    assert [(name, a["epochs"], a["input"]) for *_, name, a in fit] == [("keras fit", 1, "tf.data")]
    window = shown["tracks"][(pid, "TensorFlow profiler")]
    assert len(window) == 1 and window[0][3]["calls"] == 4
    steps_shown, phases = steps_and_phases(shown, pid)
    assert [bool(a.get("profiled")) for *_, a in steps_shown] == [s["profiled"] for s in steps]
    assert all(a["data_wait_ms"] == pytest.approx(2.0) for *_, a in steps_shown)  # from the profiler window
    assert {name for *_, name, _ in phases} == {"other host", "compute"}
    assert sum(1 for *_, name, _ in phases if name == "compute") == 20


def test_clock_without_anchors_and_with_epoch_base(tmp_path):
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=20)
    obj, shown, facts, run = timeline(run_dir, base_ns=0)  # PyTorch traces before baseTimeNanoseconds
    steps, _ = steps_and_phases(shown, synthetic_run.TRAINER)
    a = run.meta["anchors"][0]
    assert obj["baseTimeNanoseconds"] == 0
    assert steps[0][0] == round((facts.step_rows[0]["t0"] + a["time_ns"] - a["monotonic_ns"]) / 1000)
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    meta["anchors"] = []
    with open(os.path.join(run_dir, "meta.json"), "w") as f:
        json.dump(meta, f)
    obj, shown, facts, run = timeline(run_dir)
    steps, _ = steps_and_phases(shown, synthetic_run.TRAINER)
    origin = obj["otherData"]["origin_monotonic_ns"]
    assert obj["baseTimeNanoseconds"] == origin and obj["otherData"]["wall_minus_monotonic_ns"] is None
    assert steps[0][0] == round((facts.step_rows[0]["t0"] - origin) / 1000)


def test_run_without_steps_or_meta(tmp_path):
    """A command that never trained, then the same with whyidle killed before meta.json was
    written: still a valid trace (the machine's counters, on the run's own clock)."""
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=20)
    os.remove(os.path.join(run_dir, f"proc-{synthetic_run.TRAINER}.jsonl"))
    obj, shown, facts, run = timeline(run_dir)
    assert facts.trainers == [] and shown["tracks"] == {}
    assert (pf.MACHINE_PID, "CPU cores whyidle") in shown["counters"]
    os.remove(os.path.join(run_dir, "meta.json"))
    obj, shown, facts, run = timeline(run_dir)
    assert obj["otherData"]["wall_minus_monotonic_ns"] is None and obj["otherData"]["anchors"] == []
    first_tick = min(r["t"] for r in run.host)
    assert obj["baseTimeNanoseconds"] == first_tick
    assert min(ts for pts in shown["counters"].values() for ts, _ in pts) >= 0


@pytest.mark.skipif(not os.path.isdir(SHARED_TRACES), reason="../shared/traces not present")
def test_kineto_traces_use_the_same_base():
    """Every real PyTorch trace that has ``baseTimeNanoseconds`` has Kineto's trimonth base, the
    one :func:`kineto_base_ns` gives for the wall time of its events: our ts line up with theirs."""
    seen = 0
    for path in sorted(glob.glob(os.path.join(SHARED_TRACES, "*", "*.json.gz"))):
        with gzip.open(path, "rb") as f:
            head = f.read(1 << 16)
        m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', head)
        if not m:
            with gzip.open(path, "rb") as f:
                tail = f.read()[-4096:]
            m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', tail)
        if not m:
            continue
        with gzip.open(path, "rb") as f:
            events = json.load(f)["traceEvents"]
        first = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") == "X")
        base = int(m.group(1))
        assert pf.kineto_base_ns(base + int(first * 1000)) == base, path
        seen += 1
    assert seen >= 2


@pytest.mark.slow
def test_large_run_size_and_time(tmp_path):
    """100,000 steps with phase spans and a GPU, past the size law's budget
    (:mod:`whyidle.export.timeline_law`): at most ``DETAIL_STEPS`` steps with their phases, the rest
    in summary windows, in a file of ~40 MB at most, in seconds (numbers for the record: ~93 MB,
    ~3-4 s on 2 cores before the law)."""
    from whyidle.export import timeline_law

    run_dir = synthetic_run.write_run(tmp_path / "run", steps=100_000, gpu=True)
    add_ph(run_dir)
    run = load_run(run_dir)
    facts = analyze(run)
    path = os.path.join(run_dir, "timeline.json")
    t = time.perf_counter()
    obj = pf.write_timeline(path, facts, run)
    elapsed = time.perf_counter() - t
    size = os.path.getsize(path)
    counts = obj["otherData"]["counts"]["trainers"][str(synthetic_run.TRAINER)]
    detailed = counts["summary"]["detailed_steps"]
    assert counts["steps"] == 100_000 and detailed <= timeline_law.DETAIL_STEPS
    assert counts["phase_slices"] == 6 * detailed
    print(f"100k steps: {size / 1e6:.1f} MB, {elapsed:.1f} s, {obj['events']} events")
    assert size < 40e6
    assert elapsed < 60
    with open(path, "rb") as f:
        written = msgspec.json.decode(f.read())
    assert written["otherData"] == obj["otherData"] and len(written["traceEvents"]) == obj["events"]
    shown = check_trace(written)
    slices = shown["tracks"][(synthetic_run.TRAINER, "steps")]
    assert sum(a.get("steps", 1) for *_, a in slices) == 100_000


@pytest.mark.slow
def test_write_timeline_memory_stays_flat(tmp_path):
    """Streaming: writing 20,000 steps with 8 phase slices each (~200,000 events, ~80 MB as dicts)
    allocates a few MB at a time."""
    import tracemalloc

    run_dir = synthetic_run.write_run(tmp_path / "run", steps=20_000, gpu=True, ph=True)
    run = load_run(run_dir)
    facts = analyze(run)
    path = os.path.join(run_dir, "timeline.json")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        obj = pf.write_timeline(path, facts, run)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert obj["otherData"]["counts"]["trainers"][str(synthetic_run.TRAINER)]["phase_slices"] == 20_000 * 8
    assert obj["events"] > 180_000
    assert peak < 15e6, f"{peak / 1e6:.1f} MB"


def test_streamed_file_equals_the_built_object(tmp_path, monkeypatch):
    """``write_timeline`` streams in chunks; what it writes parses to :func:`build_timeline`'s
    object, on a run with every kind of event: sequential steps and phases (streamed), a trainer
    whose steps overlap (kept, sorted and cut), DataLoader regions, notices, CPU and GPU counters."""
    monkeypatch.setattr(pf, "STEP_CHUNK", 7)
    monkeypatch.setattr(pf, "WRITE_CHUNK", 5)
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=40, gpu=True, ph=True)
    other = synthetic_run.TRAINER + 100
    with open(os.path.join(run_dir, f"proc-{synthetic_run.TRAINER}.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    for r in recs:
        if r.get("k") == "step" and r["i"] % 5 == 3:  # every 5th step ends 2 ms into the next one
            r["t1"] += 2_000_000
    append_records(run_dir, other, recs)
    append_records(run_dir, synthetic_run.TRAINER, [
        {"k": "notice", "t": synthetic_run.T0 + 10**9, "msg": "a notice"},
        {"k": "iter", "t": synthetic_run.T0 + 10**9, "loader": 1, "t0": synthetic_run.T0 + 5 * 10**8,
         "t1": synthetic_run.T0 + 10**9}])
    run = load_run(run_dir)
    facts = analyze(run)
    kept = collections.Counter()
    add = pf._Track.add
    monkeypatch.setattr(pf._Track, "add", lambda self, ev: (kept.update([(ev["pid"], ev["name"].split()[0])]),
                                                            add(self, ev)))
    built = pf.build_timeline(facts, run)
    shown = check_trace(built)
    assert facts.primary == synthetic_run.TRAINER
    assert not kept[(synthetic_run.TRAINER, "step")] and not kept[(synthetic_run.TRAINER, "forward")]  # streamed
    assert kept[(other, "step")] == 40 and kept[(other, "forward")] == 40  # overlapping: kept and sorted
    cut = [a for *_, a in shown["tracks"][(other, "steps")] if a.get("cut")]
    assert len(cut) == 8  # each step after one that ends late is cut at that one's end
    path = str(tmp_path / "timeline.json")
    written = pf.write_timeline(path, facts, run)
    with open(path, "rb") as f:
        assert msgspec.json.decode(f.read()) == built
    assert written["events"] == len(built["traceEvents"]) and written["otherData"] == built["otherData"]
    kinds = collections.Counter(e["ph"] for e in built["traceEvents"])
    assert kinds["X"] > 40 * 9 and kinds["C"] > 0 and kinds["i"] == 1 and kinds["M"] > 0


# ------------------------------------------------------------------------------------------------
# Perfetto's trace processor


def trace_processor_binary() -> tuple[str | None, str]:
    """``(path, why not)``: ``$WHYIDLE_TRACE_PROCESSOR_BIN``, else the ``perfetto`` package's cached
    prebuilt (``~/.local/share/perfetto/prebuilts``). Never downloads (the package would fetch it
    from Google storage on first use, which test machines cannot reach; no PyPI, npm or Debian
    package ships the binary)."""
    env = os.environ.get("WHYIDLE_TRACE_PROCESSOR_BIN")
    if env:
        return (env, "") if os.access(env, os.X_OK) else (None, f"WHYIDLE_TRACE_PROCESSOR_BIN={env} is not executable")
    try:
        from perfetto.prebuilts.manifests.trace_processor_shell import TRACE_PROCESSOR_SHELL_MANIFEST
    except ImportError:
        return None, "the perfetto package is not installed (pip install perfetto)"
    folder = os.path.join(os.path.expanduser("~"), ".local", "share", "perfetto", "prebuilts")
    plat, machine = sys.platform.lower(), platform.machine().lower()
    for entry in TRACE_PROCESSOR_SHELL_MANIFEST:
        if entry.get("platform") == plat and machine in entry.get("machine", []):
            root, ext = os.path.splitext(entry["file_name"])
            for name in (f"{root}-{entry['sha256'][:16]}{ext}", entry["file_name"]):
                path = os.path.join(folder, name)
                if os.access(path, os.X_OK):
                    return path, ""
    return None, ("no trace_processor_shell binary: set WHYIDLE_TRACE_PROCESSOR_BIN, or let the perfetto "
                  f"package download it once into {folder} (needs access to commondatastorage.googleapis.com)")


def test_trace_processor_loads_the_timeline(tmp_path):
    binary, why = trace_processor_binary()
    if binary is None:
        pytest.skip(why)
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    run_dir = synthetic_run.write_run(tmp_path / "run", steps=50, gpu=True)
    add_ph(run_dir)
    run = load_run(run_dir)
    facts = analyze(run)
    path = os.path.join(run_dir, "timeline.json")
    pf.write_timeline(path, facts, run)
    with open(path) as f:
        obj = json.load(f)
    shown = check_trace(obj)
    events = obj["traceEvents"]
    n_slices = sum(1 for e in events if e["ph"] in ("X", "i"))  # instants are 0-length slices
    n_counter_values = sum(len(e["args"]) for e in events if e["ph"] == "C")
    tp = TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=binary))
    try:
        def one(sql):
            return next(iter(tp.query(sql)))

        assert one("select count(*) as n from slice").n == n_slices
        assert one("select count(*) as n from counter").n == n_counter_values
        assert one("select count(distinct track_id) as n from counter").n == len(shown["counters"])
        steps = one("select count(*) as n from slice join thread_track on slice.track_id = thread_track.id "
                    "join thread using (utid) where thread.name = 'steps'").n
        assert steps == 50
        phases = one("select count(*) as n from slice join thread_track on slice.track_id = thread_track.id "
                     "join thread using (utid) where thread.name = 'phases'").n
        assert phases == 50 * 6
        ts = one("select ts from slice where name = 'step 0'").ts
        first = shown["tracks"][(synthetic_run.TRAINER, "steps")][0][0]
        assert ts == (first * 1000)  # ns in the trace processor, µs in the file
        names = {r.name for r in tp.query("select name from counter_track")}
        assert {"GPU util %", "CPU cores trainer", "SM active (GPM) %"} <= names
        procs = {r.name for r in tp.query("select name from process where name is not null")}
        assert {f"trainer {synthetic_run.TRAINER} (torch)", "GPU 0: NVIDIA H200"} <= procs
    finally:
        tp.close()
