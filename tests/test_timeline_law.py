"""The size law of ``timeline.json`` (:mod:`whyidle.export.timeline_law`): past its budget a
trainer's per-step detail is kept for a bounded set of steps (warm-up and the first steps after it,
the last stretch, around left-out, boundary and slow steps, a few evenly spaced samples) and the
rest is shown as summary windows; long counter series are bucketed; shorter runs are unchanged.

The budgets are lowered here so that synthetic runs of a few hundred steps pass them.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import synthetic_run
from test_perfetto import steps_and_phases, timeline
from whyidle.export import perfetto as pf
from whyidle.export import timeline_law as law

SMALL_LAW = {"DETAIL_STEPS": 150, "HEAD_STEPS": 20, "TAIL_STEPS": 30, "CONTEXT_STEPS": 2,
             "SUMMARY_SLICES": 40, "SAMPLE_STEPS": 6}
PID = synthetic_run.TRAINER


def slow_down(run_dir: str, slow: dict[int, float]) -> None:
    """Makes step i take ``slow[i]`` times as long (its data wait grows; later steps shift)."""
    path = os.path.join(run_dir, f"proc-{PID}.jsonl")
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    shift = 0
    with open(path, "w") as f:
        for r in recs:
            if r.get("k") == "step":
                extra = int((slow.get(r["i"], 1.0) - 1) * (r["t1"] - r["t0"]))
                r["data"] += extra
                r["t0"] += shift
                shift += extra
                r["t1"] += shift
                r["t"] = r["t1"]
            f.write(json.dumps(r) + "\n")


@pytest.fixture
def small_law(monkeypatch):
    for name, value in SMALL_LAW.items():
        monkeypatch.setattr(law, name, value)


def shown_steps(shown) -> tuple[list[int], list[tuple]]:
    """(the step numbers with their own slice, the summary slices as (first, last, args, ts, end))."""
    steps, _ = steps_and_phases(shown, PID)
    alone, windows = [], []
    for a, b, name, args in steps:
        if name.startswith("steps "):
            first, last = map(int, name[len("steps "):].split("–"))
            windows.append((first, last, args, a, b))
        else:
            alone.append(int(name.split()[1]))
    return alone, windows


def test_long_run_keeps_detail_where_it_matters(tmp_path, small_law):
    """500 steps, budget 150: the warm-up and 20 after it, the last 30, the epoch boundaries and the
    slow steps (with 2 steps of context) keep their slices and phases; every other step is in
    exactly one summary window; the file says which."""
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=500, epoch_steps=125, ph=True)
    slow_down(run_dir, {200: 4.0, 333: 3.0, 410: 6.0})
    obj, shown, facts, _ = timeline(run_dir)
    alone, windows = shown_steps(shown)
    counts = obj["otherData"]["counts"]["trainers"][str(PID)]
    summary = counts["summary"]
    warmup = facts.steps_info["warmup"]
    assert len(alone) == summary["detailed_steps"] <= law.DETAIL_STEPS
    kept = set(alone)
    assert set(range(warmup + law.HEAD_STEPS)) <= kept and set(range(470, 500)) <= kept
    for i in (125, 250, 375, 200, 333, 410):  # boundaries, slow steps: with their context
        assert set(range(i - 2, i + 3)) <= kept, i
    assert summary["detailed_by_reason"]["slow"] >= 15 and summary["detailed_by_reason"]["boundary"] >= 15
    covered = sorted(alone + [i for first, last, *_ in windows for i in range(first, last + 1)])
    assert covered == list(range(500))  # every step once
    window = summary["window_steps"]
    assert window == -(-500 // law.SUMMARY_SLICES) and len(windows) == summary["windows"]
    for first, last, args, a, b in windows:
        assert args["steps"] == last - first + 1 <= window and first // window == last // window
        assert args["summary"] is True and args["analyzed_steps"] == args["steps"] and args["slow_steps"] == 0
        assert args["step_ms_min"] <= args["step_ms"] <= args["step_ms_max"]
        assert args["data_wait_ms"] > 0 and args["forward_ms"] > 0
    # the detailed steps have their phase slices; the windows, their phase shares tiling their span
    _, phases = steps_and_phases(shown, PID)
    per_step = [p for p in phases if p[3].get("share") is None]
    assert len(per_step) == 8 * len(alone)  # synthetic_run ph: 8 spans a step
    ranges = [tuple(r) for r in summary["detailed_ranges"]]
    assert sum(b - a + 1 for a, b in ranges) == len(alone)
    first, last, args, a, b = windows[len(windows) // 2]
    shares = [p for p in phases if a <= p[0] < b]
    assert {p[2] for p in shares} >= {"data wait", "forward", "backward"}
    assert all(p[3]["share"] > 0 for p in shares) and shares[-1][1] <= b
    assert sum(p[1] - p[0] for p in shares) == pytest.approx(b - a, rel=0.02)
    assert "size_law" in obj["otherData"] and f"{len(alone)} of 500 steps in full" in obj["otherData"]["size_law"]


def test_plan_is_bounded_at_any_length():
    """The steps kept in full and the summary windows stay within their budgets from 10^5 to
    10^6 steps, even when one step in 50 is slow and epochs are short."""
    rng = np.random.default_rng(0)
    sizes = {}
    for n in (100_000, 1_000_000):
        step_s = rng.normal(0.1, 0.002, n)
        step_s[rng.integers(0, n, n // 50)] *= 3
        boundary = np.zeros(n, bool)
        boundary[::500] = True
        left_out = np.zeros(n, bool)
        left_out[n // 2:n // 2 + 100] = True  # a deep-trace window
        plan = law.plan_steps(step_s, 10, boundary, left_out)
        assert plan.detail.sum() <= law.DETAIL_STEPS
        assert plan.detail[:10 + law.HEAD_STEPS].all() and plan.detail[-law.TAIL_STEPS:].all()
        assert plan.detail[n // 2:n // 2 + 100].all()
        slowest = np.argsort(-step_s[law.HEAD_STEPS + 10:n - law.TAIL_STEPS])[:100] + law.HEAD_STEPS + 10
        assert plan.detail[slowest].all()  # the slowest steps first
        runs = int(np.count_nonzero(np.diff(plan.detail.astype(np.int8)) == 1)) + 1
        assert len(plan.starts) <= law.SUMMARY_SLICES + runs
        assert not plan.detail[plan.starts].any() and (plan.ends - plan.starts <= plan.window).all()
        assert plan.detail.sum() + (plan.ends - plan.starts).sum() == n
        sizes[n] = (int(plan.detail.sum()), len(plan.starts))
    assert sizes[1_000_000][0] <= law.DETAIL_STEPS and sizes[1_000_000][1] < 2 * sizes[100_000][1]


def test_short_run_timeline_is_unchanged(tmp_path, monkeypatch):
    """At or under the budgets the law changes nothing: the same object with the law's budgets
    out of reach, every step in full, no summary and no ``size_law`` note."""
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=300, gpu=True, ph=True)
    obj, shown, _, _ = timeline(run_dir)
    for name in ("DETAIL_STEPS", "COUNTER_POINTS"):
        monkeypatch.setattr(law, name, 10**9)
    assert timeline(run_dir)[0] == obj
    alone, windows = shown_steps(shown)
    assert alone == list(range(300)) and not windows
    assert "size_law" not in obj["otherData"] and "summary" not in obj["otherData"]["counts"]["trainers"][str(PID)]
    assert not any(e.get("cat") in ("step_summary", "phase_summary") for e in obj["traceEvents"])


def test_long_counter_series_are_bucketed(tmp_path, monkeypatch):
    """Past ``COUNTER_POINTS`` values a counter series is reduced to buckets of k: the machine's
    CPU read at every k-th host tick (exact means: CPU times are cumulative), its memory sampled
    there; GPU series averaged (memory used: the bucket's largest). The mean CPU stays."""
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=300, gpu=True)
    full, shown_full, _, _ = timeline(run_dir)
    n_cpu = full["otherData"]["counts"]["cpu_intervals"]
    monkeypatch.setattr(law, "COUNTER_POINTS", n_cpu // 4)
    obj, shown, _, _ = timeline(run_dir)
    k = obj["otherData"]["machine_ticks_per_counter_value"]
    assert k == -(-n_cpu // (n_cpu // 4)) and "counter series" in obj["otherData"]["size_law"]
    machine = pf.MACHINE_PID
    cpu = shown["counters"][(machine, "CPU cores trainer")]
    assert len(cpu) == -(-n_cpu // k) <= law.COUNTER_POINTS
    before = [v for _, v in shown_full["counters"][(machine, "CPU cores trainer")]]
    assert np.mean([v for _, v in cpu]) == pytest.approx(np.mean(before), rel=0.1)
    full_rss = shown_full["counters"][(machine, "memory command RSS GiB")]
    ends = list(range(k - 1, n_cpu, k)) + ([n_cpu - 1] if n_cpu % k else [])  # every k-th tick and the last
    assert shown["counters"][(machine, "memory command RSS GiB")] == [full_rss[j] for j in ends]
    gpu = obj["otherData"]["counts"]["gpus"][0]
    assert gpu["samples_per_value"]["util"] > 1
    assert len(shown["counters"][(gpu["pid"], "GPU util %")]) <= law.COUNTER_POINTS


def test_gpu_starved_time_of_summarized_steps_goes_to_the_windows(tmp_path, monkeypatch):
    """A fake-CUDA run past the budget: starved ranges inside summarized steps are not written as
    slices; their time is each window's ``gpu_starved_ms`` (per step), so the total stays."""
    import load_run
    from whyidle import pipeline

    run_dir = load_run.write_run(str(tmp_path / "run"), 600, step_ms=30.0, cuda=True)
    a = pipeline.analyze_run(run_dir)
    full = pf.build_timeline(a.facts, a.run)
    total = sum(e["dur"] for e in full["traceEvents"] if e.get("cat") == "gpu_starved")
    for name, value in SMALL_LAW.items():
        monkeypatch.setattr(law, name, value)
    obj = pf.build_timeline(a.facts, a.run)
    kept = sum(e["dur"] for e in obj["traceEvents"] if e.get("cat") == "gpu_starved")
    windows = sum(e["args"]["gpu_starved_ms"] * e["args"]["steps"] * 1e3 for e in obj["traceEvents"]
                  if e.get("cat") == "step_summary")
    assert 0 < kept < total / 2
    assert kept + windows == pytest.approx(total, rel=0.01)


def test_report_notes_the_summarized_steps(tmp_path, small_law):
    """``whyidle report`` of a run past the budget: the report's notes carry the timeline's
    ``size_law`` sentence; a short run's report has no such note."""
    from whyidle import pipeline

    long_run = synthetic_run.write_run(tmp_path / "long", steps=500, ph=True)
    report = pipeline.report_run(long_run)
    with open(os.path.join(long_run, "timeline.json")) as f:
        sentence = json.load(f)["otherData"]["size_law"]
    assert sentence in report["notes"] and report["run"]["timeline"]
    short = pipeline.report_run(synthetic_run.write_run(tmp_path / "short", steps=100, ph=True))
    assert not [n for n in short["notes"] if "size law" in n]
