"""Always-on (issue 34) on real jobs that change behaviour mid-run: the verdict per window with the
change's time, an automatic deep trace within two windows of the change, analyzed in the report,
``whyidle trace-now`` on demand, and a real Prometheus server scraping ``whyidle run
--metrics-port`` (the PromQL figures match the report's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import SCENARIOS, whyidle_cmd

pytestmark = pytest.mark.slow

MIDRUN = os.path.join(SCENARIOS, "midrun_regression.py")
HEALTHY = ("device_bound", "small_workload")


def _start(tmp_path, cmd, *options, name="run"):
    run_dir = os.path.join(str(tmp_path), name)
    report_path = os.path.join(str(tmp_path), f"{name}.json")
    proc = subprocess.Popen(whyidle_cmd("run", "--out", run_dir, "--json", report_path, "--no-html", *options,
                                        "--", *cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, run_dir, report_path


def _wait_for_steps(run_dir, steps=50, timeout=60):
    """Waits until a trainer of the run wrote ``steps`` step records (the loop is running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in os.listdir(run_dir) if os.path.isdir(run_dir) else ():
            if name.startswith("proc-"):
                with open(os.path.join(run_dir, name), "rb") as f:
                    text = f.read()
                if text.count(b'"k":"step"') + text.count(b'"k":"steps"') * 4 >= steps:
                    return
        time.sleep(0.3)
    raise AssertionError(f"no steps in {run_dir} after {timeout} s")


def _finish(proc, report_path, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    with open(report_path) as f:
        return json.load(f), err


@pytest.mark.timing  # healthy windows must read healthy: run alone, as the scenario verdict tests are
def test_a_job_that_goes_input_bound_mid_run_says_when_and_takes_a_trace(tmp_path):
    """Healthy for ~13 s of the command (the script's 11 s after its start-up), then every sample
    read waits 2 ms: 4-second windows, automatic traces allowed at once; a trace-now during the
    healthy part."""
    proc, run_dir, report_path = _start(tmp_path, [sys.executable, MIDRUN, "--seconds", "26", "--after", "11"],
                                        "--window", "4", "--trace-every", "0")
    _wait_for_steps(run_dir)
    asked = subprocess.run(whyidle_cmd("trace-now", run_dir, "--steps", "5"), capture_output=True, text=True)
    assert asked.returncode == 0, asked.stderr
    report, err = _finish(proc, report_path)
    runs = report["over_time"]
    assert runs[0]["verdict"] in HEALTHY and runs[-1]["verdict"] == "input_bound", runs
    change = next(r for r in runs if r["verdict"] == "input_bound")
    assert 8 <= change["start_s"] <= 20, runs  # the window that holds the switch (~13 s)
    assert "over time" in err and "input_bound" in err
    traces = report["deep_traces"]
    manual = [t for t in traces if t.get("trigger") == "request"]
    auto = [t for t in traces if t.get("trigger") == "departure"]
    assert manual and manual[0]["steps"] == 5 and not manual[0]["error"], traces
    assert manual[0]["start_s"] < change["start_s"] and manual[0]["verdict"]
    assert auto and not auto[0]["error"], traces
    # within two windows of the change: requested when the window holding it closed
    assert auto[0]["start_s"] <= change["start_s"] + 2 * 4 + 3, (auto[0], change)
    assert auto[0]["verdict"] == "input_bound" and "data wait rose" in auto[0]["reason"]
    assert auto[0]["cost"] and auto[0]["cost"]["ratio"] > 0
    for t in manual + auto:
        assert os.path.isfile(os.path.join(run_dir, t["file"]))
    windows = [json.loads(line) for line in open(os.path.join(run_dir, "windows.jsonl"))]
    assert len(windows) == len(report["windows"]) >= 6
    departed = [w for w in windows if w["departed"]]
    assert departed and departed[0]["start_s"] == change["start_s"]


@pytest.mark.timing
def test_two_ranks_one_turning_slow_mid_run(tmp_path):
    """2 gloo ranks; after 10 s rank 1's samples cost 2 ms each: the windows turn input_bound with
    rank 1 the culprit, and the trace request is answered by both ranks, each trace with its rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(SCENARIOS, "ddp_straggler.py"), "--seconds", "24", "--slow-after", "10"]
    proc, run_dir, report_path = _start(tmp_path, cmd, "--window", "4", "--trace-every", "0")
    report, err = _finish(proc, report_path)
    runs = report["over_time"]
    # the first windows: no straggler yet (2 ranks on 2 cores may read cpu_contention on a busy box)
    assert runs[0]["verdict"] not in ("input_bound", "imbalance"), runs
    assert any(r["verdict"] in ("input_bound", "imbalance") for r in runs[1:]), runs
    late = [w for w in report["windows"] if (w.get("collective") or {}).get("culprit_rank") == 1]
    assert late and late[0]["start_s"] >= 6, report["windows"]
    # the trace the straggler triggered (a busy box may have triggered one before: cpu_contention)
    tid = next(t["id"] for t in report["deep_traces"] if "rank 1 became the rank" in (t.get("reason") or ""))
    first = [t for t in report["deep_traces"] if t["id"] == tid and not t.get("job")]
    assert sorted(t["rank"] for t in first) == [0, 1], report["deep_traces"]
    job = next(t for t in report["deep_traces"] if t["id"] == tid and t.get("job"))
    assert job["ranks"] == [0, 1] and job["culprit_rank"] == 1 and os.path.isdir(os.path.join(run_dir, job["file"]))
    assert all(t["world_size"] == 2 and not t["error"] for t in first)
    slow = next(t for t in first if t["rank"] == 1)
    assert slow["verdict"] == "input_bound"


def test_a_real_prometheus_server_scrapes_the_job(tmp_path):
    """``whyidle run --metrics-port``: Prometheus (Debian's package) scrapes it every second; its
    HTTP API's samples/s and data-wait ratio match the report within 10 %."""
    from test_prometheus_server import free_port, prometheus_against

    port = free_port()
    cmd = [sys.executable, MIDRUN, "--seconds", "22", "--after", "0"]  # input-bound from the start: steady
    proc, run_dir, report_path = _start(tmp_path, cmd, "--metrics-port", f"127.0.0.1:{port}", "--window", "4")
    try:
        with prometheus_against(f"127.0.0.1:{port}", tmp_path) as query:
            _wait_for_steps(run_dir, 100)
            time.sleep(11)  # two windows closed, a [10s] rate window filled
            sps = query('rate(whyidle_samples_total[10s])')
            wait = query('whyidle_data_wait_ratio')
            stuck = query('time() - whyidle_last_step_timestamp_seconds')
    finally:
        report, _ = _finish(proc, report_path)
    assert sps and wait and stuck, (sps, wait, stuck)
    assert stuck[0][1] < 10  # the last step is recent: no stuck-job alert
    steady = report["metrics"]["steady_samples_per_s"]
    assert sps[0][1] == pytest.approx(steady, rel=0.10), (sps, steady)
    assert wait[0][1] == pytest.approx(report["metrics"]["shares"]["data_wait"], rel=0.10)
