"""Load: what whyidle keeps and writes grows at most linearly with the steps, and the views stay bounded.

Small versions of benchmarks/load.py (a 24-hour-equivalent run: 1,000,000 steps; figures in
docs/run-format.md, "Size and growth"), on runs written by whyidle's own agent code on a
simulated clock (tests/load_run.py, 1 ms steps: one full ``step`` record per 20 steps, the rest as
``steps`` rows). The caps of the views are lowered so that both sizes pass them.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import time
import tracemalloc

import load_run
import pytest

from whyidle import pipeline
from whyidle.export import perfetto as pf
from whyidle.export import timeline_law
from whyidle.record import tail as tail_mod
from whyidle.record.reader import load_run as read_run
from whyidle.report import plots

SMALL, BIG = 15_000, 60_000
CAPS = {"DETAIL_STEPS": 1_000, "HEAD_STEPS": 100, "TAIL_STEPS": 250, "SUMMARY_SLICES": 500, "COUNTER_POINTS": 2_000}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{steps: (run dir, report seconds, the report's timeline counts)} for SMALL and BIG steps,
    reported with the timeline's caps lowered."""
    root = tmp_path_factory.mktemp("load")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in CAPS.items():
            mp.setattr(timeline_law, name, value)
        for n in (SMALL, BIG):
            run_dir = load_run.write_run(str(root / f"run-{n}"), n)
            t = time.perf_counter()
            report = pipeline.report_run(run_dir)
            elapsed = time.perf_counter() - t
            assert report["metrics"]["steps"] == n and report["metrics"]["detailed_steps"] < n / 10
            with open(os.path.join(run_dir, "timeline.json"), "rb") as f:
                counts = json.load(f)["otherData"]["counts"]["trainers"][str(load_run.TRAINER)]
            out[n] = (run_dir, elapsed, counts)
    return out


def test_views_stay_bounded(reports):
    """timeline.json and report.html hardly grow from SMALL to BIG steps once past their caps:
    the timeline's size law (:mod:`whyidle.export.timeline_law`: detail for ``DETAIL_STEPS`` steps,
    summary windows for the rest, counters bucketed), plot traces reduced to ``plots.MAX_POINTS``."""
    (small, _, c_small), (big, _, c_big) = reports[SMALL], reports[BIG]
    for c, n in ((c_small, SMALL), (c_big, BIG)):
        assert c["steps"] == n and c["step_group"] == -(-n // CAPS["SUMMARY_SLICES"])
        assert c["summary"]["detailed_steps"] <= CAPS["DETAIL_STEPS"]
        assert c["step_slices"] <= CAPS["DETAIL_STEPS"] + CAPS["SUMMARY_SLICES"] + len(c["summary"]["detailed_ranges"])
        assert c["steps_with_phases"] <= CAPS["DETAIL_STEPS"]

    def size(run_dir, name):
        return os.path.getsize(os.path.join(run_dir, name))

    # 4× the steps (and host ticks, past COUNTER_POINTS): < 1.25× the file
    assert size(big, "timeline.json") < 1.25 * size(small, "timeline.json")
    with open(os.path.join(big, "report.html"), encoding="utf-8") as f:
        figures = re.findall(r'<script type="application/json" id="[^"]+-json">(.*?)</script>', f.read(), re.DOTALL)
    points = [len(trace.get("x") or []) for text in figures for trace in json.loads(text)["data"]]
    assert points and max(points) <= plots.MAX_POINTS
    # below the cap the per-step and per-tick traces grow a little (~40 KB here), never past it
    assert size(big, "report.html") - size(small, "report.html") < 100_000


def test_records_on_disk_grow_linearly_with_steps(reports):
    """~100 bytes of trainer records per 1 ms step (one full record per 20 steps, 19 ``steps`` rows)."""
    per_step = {n: os.path.getsize(os.path.join(reports[n][0], f"proc-{load_run.TRAINER}.jsonl")) / n
                for n in (SMALL, BIG)}
    assert 60 < per_step[BIG] < 140, per_step
    assert abs(per_step[BIG] - per_step[SMALL]) < 0.1 * per_step[SMALL]


@pytest.mark.timing
def test_report_time_grows_linearly(reports):
    """The end-of-run report (load, analysis, report.json, report.html, timeline.json) of 4× the
    steps takes < 10× as long (linear: 4×; quadratic would be 16×), loose for a busy machine."""
    ratio = reports[BIG][1] / reports[SMALL][1]
    assert ratio < 10, f"{reports[SMALL][1]:.2f} s → {reports[BIG][1]:.2f} s"


def test_loaded_run_memory_per_step(reports, tmp_path):
    """A loaded run holds its steps in columns (no Python object per step): the memory it keeps
    grows by < 280 bytes per step (measured ~210; a dict entry per step, as before, made it ~305)."""
    small = load_run.write_run(str(tmp_path / "small"), 4_000)
    big = load_run.write_run(str(tmp_path / "big"), 16_000)
    kept = {}
    for run_dir in (small, big):
        tracemalloc.start()
        try:
            run = read_run(run_dir)
            kept[run_dir] = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        del run
    per_step = (kept[big] - kept[small]) / 12_000
    assert 0 < per_step < 280, per_step


def test_live_tail_reads_only_what_was_appended(reports, tmp_path, monkeypatch):
    """A poll of the live line's reader parses the new lines only, and keeps 2,000 steps at most."""
    src = os.path.join(reports[BIG][0], f"proc-{load_run.TRAINER}.jsonl")
    with open(src, "rb") as f:
        lines = f.readlines()
    half = len(lines) // 2
    dst = tmp_path / f"proc-{load_run.TRAINER}.jsonl"
    dst.write_bytes(b"".join(lines[:half]))
    tail = tail_mod.StepTail(str(tmp_path))
    tail.poll()
    parsed = []
    real = tail_mod.json.loads
    monkeypatch.setattr(tail_mod.json, "loads", lambda raw: parsed.append(raw) or real(raw))
    new = lines[half:half + 20]
    with open(dst, "ab") as f:
        f.write(b"".join(new))
    tail.poll()
    assert len(parsed) == sum(b'"k":"step' in line for line in new) > 0
    monkeypatch.undo()
    shutil.copy(src, dst)
    tail.poll()
    assert tail.total[str(dst)] == BIG
    assert len(tail.recent[str(dst)]) <= 2000


def test_gpu_starved_slices_follow_the_size_law(tmp_path, monkeypatch):
    """Past ``DETAIL_STEPS`` steps the GPU-starved slices (several per step on a GPU run) are
    written inside the steps kept in full only (or outside any step), like the phase slices."""
    run_dir = load_run.write_run(str(tmp_path / "run"), 3_000, step_ms=30.0, cuda=True)  # every step in full
    a = pipeline.analyze_run(run_dir)
    counts = pf.build_timeline(a.facts, a.run)["otherData"]["counts"]["trainers"][str(load_run.TRAINER)]
    assert "summary" not in counts and counts["starved_slices"] > 3 * 3_000
    for name, value in (("DETAIL_STEPS", 1_000), ("HEAD_STEPS", 100), ("TAIL_STEPS", 250)):
        monkeypatch.setattr(timeline_law, name, value)
    obj = pf.build_timeline(a.facts, a.run)
    summed = obj["otherData"]["counts"]["trainers"][str(load_run.TRAINER)]
    detailed = summed["summary"]["detailed_steps"]
    assert detailed <= 1_000
    # the detailed steps' share of the ranges (a kept step's last range no longer merges with the next's first)
    share = detailed / 3_000
    assert 0.8 * share * counts["starved_slices"] < summed["starved_slices"] < 1.2 * share * counts["starved_slices"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in obj["traceEvents"] if e.get("cat") == "step")
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in obj["traceEvents"] if e.get("cat") == "step_summary")
    starts = [s[0] for s in windows]
    for e in obj["traceEvents"]:
        if e.get("cat") == "gpu_starved":
            end = e["ts"] + e["dur"]
            w = bisect.bisect_left(starts, end) - 1  # the window it ends in, if any
            assert w < 0 or end > windows[w][1], e
