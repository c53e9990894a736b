"""The rolling diagnosis's pure parts: windows of a run's records, the incremental follower, the
baseline and its departures, goodput, the report's over-time keys, and trace-now's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from synthetic_run import MS, T0, write_run
from whyidle.analysis.baseline import Baseline
from whyidle.diagnose.departure import departures, slow_share
from whyidle.pipeline import window_record
from whyidle.record.follow import RunFollower
from whyidle.record.reader import load_run
from whyidle.record.window import slice_run
from whyidle.report.windows import changes, clock, goodput, over_time_lines
from whyidle.run.rolling import Rolling, RollingOptions, request_trace


def _bounds(run):
    """The synthetic run's first step start and last step end (its meta has no start_t/exit_t)."""
    t0 = min(min(t.cols["t0"]) for t in run.steps.values() if len(t))
    t1 = max(max(t.cols["t1"]) for t in run.steps.values() if len(t))
    return t0 - 1, t1


def _steps(run):
    return sum(len(t) for t in run.steps.values())


def test_windows_partition_the_steps_and_keep_the_setup_records(tmp_path):
    run = load_run(write_run(tmp_path / "r", steps=200))
    start, end = _bounds(run)
    cuts = [start + (end - start) * k // 4 for k in range(5)]
    cuts[-1] += 1
    parts = [slice_run(run, a, b) for a, b in zip(cuts, cuts[1:])]
    assert sum(_steps(p) for p in parts) == _steps(run) == 200
    for p, (a, b) in zip(parts, zip(cuts, cuts[1:])):
        assert p.meta["start_t"] == a and p.meta["exit_t"] == b
        kinds = {r["k"] for recs in p.procs.values() for r in recs}
        assert "proc" in kinds and "loader" in kinds  # setup records in every window
        for table in p.steps.values():
            assert all(a <= t < b for t in table.cols["t1"])
        assert all(a <= r["t"] < b for r in p.host if r["k"] == "host")


def test_a_window_of_a_run_is_diagnosed_like_the_run(tmp_path):
    run = load_run(write_run(tmp_path / "r", steps=300))
    start, end = _bounds(run)
    mid = (start + end) // 2
    rec = window_record(slice_run(run, mid, end + 1), 1, start)
    assert rec["k"] == "window" and rec["i"] == 1 and rec["verdict"] == "input_bound"
    assert rec["start_s"] == pytest.approx((mid - start) / 1e9, abs=1e-3)
    assert 0.35 < rec["shares"]["data_wait"] < 0.65  # the synthetic loop waits ~half of each step
    g = rec["goodput"]
    assert g["productive_s"] + sum(g["lost_s"].values()) == pytest.approx(g["wall_s"], rel=0.01)
    assert g["lost_s"]["startup"] == 0  # a later window holds no start-up


def test_the_follower_reads_appended_lines_once_and_waits_for_a_line_being_written(tmp_path):
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    path = run_dir / "proc-7.jsonl"
    recs = [{"k": "proc", "t": T0, "pid": 7}] + [
        {"k": "step", "t": T0 + (i + 1) * 10 * MS, "i": i, "t0": T0 + i * 10 * MS, "t1": T0 + (i + 1) * 10 * MS,
         "data": 2 * MS} for i in range(10)]
    text = "".join(json.dumps(r) + "\n" for r in recs)
    path.write_text(text[:-20])  # the last line still being written
    f = RunFollower(str(run_dir), {"start_t": T0})
    f.poll()
    assert len(f.steps[7]) == 9 and [r["k"] for r in f.procs[7]] == ["proc"]
    with open(path, "a") as out:
        out.write(text[-20:] + "not json\n")
    f.poll()
    assert len(f.steps[7]) == 10 and f.skipped == 1
    assert [r["i"] for _, r in f.take_new()] == list(range(10)) and f.take_new() == []
    w = f.window(T0, T0 + 55 * MS)
    assert len(w.steps[7]) == 5
    f.prune(T0 + 55 * MS)
    assert len(f.steps[7]) == 5 and [r["k"] for r in f.procs[7]] == ["proc"]


def _baseline(n=1000, step=0.010):
    b = Baseline()
    durations = [step * (1 + 0.02 * ((i * 7) % 5 - 2)) for i in range(n)]
    b.add({"steps": n, "samples_per_s": 3200.0, "verdict": "device_bound",
           "shares": {"data_wait": 0.02, "other_host": 0.03}}, durations)
    return b


def test_slow_steps_past_median_plus_three_mad_depart():
    b = _baseline()
    med, mad = b.step_stats()
    assert med == pytest.approx(0.010, rel=0.01)
    normal = {"steps": 100, "samples_per_s": 3150.0, "verdict": "device_bound",
              "shares": {"data_wait": 0.03, "other_host": 0.03}}
    assert departures(normal, [0.0101] * 100, b) == []
    slow = [0.010] * 60 + [0.030] * 40
    assert slow_share(slow, b) == pytest.approx(0.40)
    why = departures({**normal, "samples_per_s": 2000.0}, slow, b)
    assert any("40% of the steps slower" in w for w in why) and any("samples/s fell" in w for w in why)


def test_a_rising_data_wait_and_a_new_verdict_depart_without_slow_steps():
    b = _baseline()
    w = {"steps": 100, "samples_per_s": 3100.0, "verdict": "input_bound",
         "shares": {"data_wait": 0.18, "other_host": 0.03}}
    why = departures(w, [0.0101] * 100, b)
    assert "data wait rose from 2% to 18% of the step" in why
    assert "verdict device_bound → input_bound" in why


def test_too_little_to_judge_departs_from_nothing():
    assert departures({"steps": 100, "verdict": "input_bound"}, [1.0] * 100, Baseline()) == []
    assert departures({"steps": 2, "verdict": "input_bound"}, [1.0] * 2, _baseline()) == []


def test_the_baseline_keeps_a_bounded_sample():
    b = Baseline()
    b.add({"steps": 50_000}, [0.01] * 50_000)
    assert len(b.durations) == 20_000 and b.steps == 50_000


def test_changes_group_windows_by_verdict_and_the_terminal_names_the_change():
    ws = [{"t0": i, "start_s": 10.0 * i, "end_s": 10.0 * (i + 1), "steps": 5,
           "verdict": "device_bound" if i < 3 else "input_bound",
           "title": "Input-bound: the step waits for data" if i >= 3 else None} for i in range(5)]
    runs = changes(ws)
    assert [(r["verdict"], r["start_s"], r["end_s"], r["windows"]) for r in runs] == [
        ("device_bound", 0.0, 30.0, 3), ("input_bound", 30.0, 50.0, 2)]
    report = {"windows": ws, "over_time": runs, "run": {"started_utc": "2026-12-05T01:00:00+00:00"},
              "metrics": {"goodput": {"ratio": 0.5, "wall_s": 50.0, "productive_s": 25.0,
                                      "lost_s": {"data_wait": 20.0, "startup": 5.0}}}}
    lines = dict(over_time_lines(report))
    assert "from 30 s (2026-12-05 01:00:30 UTC) input_bound" in lines["over time"]
    assert lines["goodput"].startswith("50% of 50 s")
    assert clock(3 * 3600 + 65) == "3h01m" and clock(125) == "2m05s"


def test_goodput_adds_up_to_the_wall_time():
    m = {"shares": {"data_wait": 0.25}, "time": {"wall_s": 100.0, "parts": {
        "startup": {"s": 10.0}, "training": {"s": 80.0}, "evaluation": {"s": 5.0}, "teardown": {"s": 5.0}}}}
    g = goodput(m)
    assert g["productive_s"] == 60.0 and g["lost_s"]["data_wait"] == 20.0 and g["lost_s"]["idle"] == 5.0
    assert g["ratio"] == 0.6 and goodput({}) is None


def test_rolling_closes_windows_and_requests_a_trace_when_the_job_departs(tmp_path):
    """A synthetic job: healthy, then its data wait jumps; the rolling driver, ticked with a clock
    of its own, writes windows, requests a trace once, and the report reads them back."""
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    meta = {"format": "whyidle.run/1", "start_t": T0, "command": ["python", "t.py"], "cpu_count": 2}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    said = []
    rolling = Rolling(str(run_dir), meta, RollingOptions(window_s=10, trace_every_s=0), say=said.append)
    proc = run_dir / "proc-9.jsonl"
    with open(proc, "w") as f:
        f.write(json.dumps({"k": "proc", "t": T0, "pid": 9, "framework": "torch", "started": T0}) + "\n")
    t, i = T0 + 100 * MS, 0
    for second in range(1, 41):
        with open(proc, "a") as f:
            while t < T0 + second * 1000 * MS:
                wait = 2 * MS if second <= 20 else 30 * MS
                f.write(json.dumps({"k": "step", "t": t + 20 * MS + wait, "i": i, "t0": t, "t1": t + 20 * MS + wait,
                                    "by": "optimizer", "data": wait, "fwd": 10 * MS, "bwd": 7 * MS, "opt": MS,
                                    "eval": 0, "batches": 1, "samples": 32, "cpu": 18 * MS, "data_cpu": MS}) + "\n")
                t, i = t + 20 * MS + wait, i + 1
        rolling.tick(T0 + second * 1000 * MS)
    rolling.finish(T0 + 41_000 * MS)
    ws = [json.loads(line) for line in open(run_dir / "windows.jsonl")]
    assert [w["verdict"] for w in ws][:2] == ["device_bound", "device_bound"]
    assert ws[2]["verdict"] == "input_bound" and ws[2]["departed"]
    req = json.loads((run_dir / "control" / "trace.json").read_text())
    assert req["id"] == "t1" and req["steps"] == 10 and "data wait rose" in req["reason"]
    assert any("deep trace t1 requested" in s for s in said)
    assert rolling.pending is not None  # one at a time: window 3 departed too, no second request
    assert any("window 3 (30–40 s)" in s and "no deep trace: t1 is being taken" in s for s in said), said
    rolling.pending = None
    rolling._request(5, 7, "asked for", manual=True)  # trace-now --rank 7 in a one-process job
    assert "no process of rank 7 is training here (ranks: 0)" in said[-1] and rolling.pending is None
    report = json.loads(subprocess.run([sys.executable, "-m", "whyidle", "report", str(run_dir), "--json", "-"],
                                       capture_output=True, text=True, check=True).stdout)
    assert [r["verdict"] for r in report["over_time"]] == ["device_bound", "input_bound"]
    assert report["over_time"][1]["start_s"] == pytest.approx(20.0, abs=0.1)


def test_trace_now_refuses_a_run_that_is_not_running(tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        request_trace(str(tmp_path), None, None)
    ended = tmp_path / "ended"
    ended.mkdir()
    (ended / "meta.json").write_text(json.dumps({"format": "whyidle.run/1", "whyidle_pid": os.getpid(),
                                                 "exit_t": 5}))
    with pytest.raises(ValueError, match="has ended"):
        request_trace(str(ended), None, None)
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "meta.json").write_text(json.dumps({"format": "whyidle.run/1", "whyidle_pid": 2**22 + 12345}))
    with pytest.raises(ValueError, match="is gone"):
        request_trace(str(gone), None, None)
    out = subprocess.run([sys.executable, "-m", "whyidle", "trace-now", str(ended)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    other = tmp_path / "other"  # the pid is alive, but not a whyidle (a pid taken again)
    other.mkdir()
    (other / "meta.json").write_text(json.dumps({"format": "whyidle.run/1", "whyidle_pid": os.getpid()}))
    with pytest.raises(ValueError, match="is gone"):
        request_trace(str(other), None, None)
    with pytest.raises(ValueError, match="no such run directory"):
        request_trace(str(tmp_path / "nope"), None, None)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "whyidle"])
    try:
        live = tmp_path / "live"
        live.mkdir()
        (live / "meta.json").write_text(json.dumps({"format": "whyidle.run/1", "whyidle_pid": stand_in.pid}))
        path = request_trace(str(live), 5, 1)
        assert json.loads(open(path).read())["steps"] == 5 and os.path.dirname(path).endswith("control")
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_run_directory_that_cannot_take_the_windows_costs_nothing_but_them(tmp_path):
    """A full or removed disk for windows.jsonl: said once, the windows go on in memory, nothing raises."""
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    meta = {"format": "whyidle.run/1", "start_t": T0}
    said = []
    rolling = Rolling(str(run_dir), meta, RollingOptions(window_s=1, triggers=False), say=said.append)
    rolling.windows_out.path = str(tmp_path / "not-a-folder" / "windows.jsonl")
    (tmp_path / "not-a-folder").write_text("a file")
    with open(run_dir / "proc-3.jsonl", "w") as f:
        for i in range(100):
            t = T0 + i * 20 * MS
            f.write(json.dumps({"k": "step", "t": t + 20 * MS, "i": i, "t0": t, "t1": t + 20 * MS, "data": MS,
                                "fwd": 10 * MS, "bwd": 8 * MS, "opt": MS, "eval": 0, "batches": 1}) + "\n")
    for second in (1, 2, 3):
        rolling.tick(T0 + second * 1000 * MS)
    rolling.finish(T0 + 3500 * MS)
    assert len(rolling.windows) == 4 and rolling.problem is None  # 3 windows and the last half second
    assert len([s for s in said if "windows.jsonl not written" in s]) == 1


def test_a_keras_trace_window_is_read_from_its_calls(tmp_path):
    """A Keras (TensorFlow) deep trace has no Kineto file: its train-function calls say how much of
    them waited for the input; traces.jsonl gets the verdict."""
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    rolling = Rolling(str(run_dir), {"start_t": T0}, RollingOptions(window_s=100))
    calls = [[20 * MS, 9 * MS]] * 8
    with open(run_dir / "proc-5.jsonl", "w") as f:
        f.write(json.dumps({"k": "trace_window", "t": T0 + 2000 * MS, "id": "t1", "t0": T0 + 1000 * MS,
                            "t1": T0 + 1200 * MS, "steps": 8, "file": "traces/t1-5/x.xplane.pb", "rank": None,
                            "method": "tf_profiler", "calls": calls,
                            "iterators": [["Iterator::Map", 8, 70.0]], "error": None}) + "\n")
    rolling.tick(T0 + 3000 * MS)
    rolling.finish(T0 + 3500 * MS)
    rec = json.loads((run_dir / "traces.jsonl").read_text())
    assert rec["verdict"] == "input_bound" and rec["input_wait_share"] == 0.45
    assert "Iterator::Map 70 ms" in rec["summary"] and rec["start_s"] == 1.0
