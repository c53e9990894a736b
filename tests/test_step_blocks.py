"""A long run is analyzed a block of steps at a time (StepCols.blocks, STEP_BLOCK steps): every
figure read that way equals the figure read over the whole columns at once, exactly — reports,
the HTML page's step series and the Perfetto timeline of the golden runs and the synthetic long
runs, with blocks far smaller than the runs (so every block edge is crossed)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import report_parity

from whyidle import pipeline
from whyidle.analysis import series, stepcols
from whyidle.analysis.steps import ValueCounts, field_percentile, percentile_of, steps_of
from whyidle.record.reader import load_run
from whyidle.report.build import build_report


def _views(run_dir: str, out: str) -> dict:
    """The report (JSON text), the step series of the page and the timeline (bytes) of a run."""
    a = pipeline.analyze_run(run_dir)
    report = build_report(a.facts, a.verdict, a.findings, a.run.problems)
    path = os.path.join(out, "timeline.json")
    pipeline.write_timeline(a, path)
    with open(path, "rb") as f:
        timeline = f.read()
    rows = a.facts.step_rows or []
    cols = series.step_columns(rows, 0)
    return {"report": json.dumps(report, sort_keys=True, default=str), "timeline": timeline,
            "left_out": series.left_out_steps(rows, a.facts.analyzed_steps or [], 2),
            "steps": cols}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b


@pytest.mark.parametrize("block", [7, 1000])
def test_figures_read_in_blocks_equal_whole_reads(tmp_path, monkeypatch, block):
    runs = [os.path.join(report_parity.RUNS, name) for name in sorted(os.listdir(report_parity.RUNS))]
    import load_run
    runs.append(load_run.write_run(str(tmp_path / "long"), 5000, 1.0, True))  # CUDA records, lite steps
    for run_dir in runs:
        whole = _views(run_dir, str(tmp_path))
        with monkeypatch.context() as m:
            m.setattr(stepcols, "STEP_BLOCK", block)
            blocks = _views(run_dir, str(tmp_path))
        for key in whole:
            assert _same(blocks[key], whole[key]), (run_dir, key)


@pytest.mark.parametrize("values", [[3], [1, 1, 2], [5.5, 2.0, 2.0, 9.0, 1.0], list(range(37)) * 3])
def test_value_counts_give_percentile_of_the_values(values):
    for parts in (1, 2, 5):
        counts = ValueCounts()
        for chunk in np.array_split(np.array(values), parts):
            counts.add(chunk)
        for q in (0, 10, 50, 90, 100):
            want = percentile_of(np.array(values), q)
            assert counts.percentile(q) == want and type(counts.percentile(q)) is type(want)


def test_field_percentile_of_rows_skips_nulls(tmp_path, monkeypatch):
    run = load_run(os.path.join(report_parity.RUNS, "batch1"))
    rows = steps_of(next(iter(run.steps.values())))
    samples = [r["samples"] for r in rows if r.get("samples") is not None]
    monkeypatch.setattr(stepcols, "STEP_BLOCK", 16)
    assert field_percentile(rows, "samples", 50) == percentile_of(np.array(samples), 50)
    assert field_percentile(rows[:0], "samples", 50) is None


@pytest.mark.parametrize("block", [3, 1 << 18])
def test_among_is_isin_of_the_step_ids(monkeypatch, block):
    monkeypatch.setattr(stepcols, "STEP_BLOCK", block)
    rng = np.random.default_rng(1)
    rows = [{"i": int(i), "t0": 0, "t1": 1} for i in np.cumsum(rng.integers(1, 3, 40))]
    for others in ([], rows[:1], rows[5:30:2], rows, [{"i": -4}, {"i": 10**6}], rows[::-1][:7]):
        want = np.isin([r["i"] for r in rows], [r["i"] for r in others])
        assert series.among(rows, others).tolist() == want.tolist()


@pytest.mark.parametrize("block", [3, 1 << 18])
def test_among_rows_of_one_table_is_isin_of_the_step_ids(tmp_path, monkeypatch, block):
    import load_run as synthetic
    from whyidle.analysis.steps import select_steps
    from whyidle.record.steptable import StepRows
    monkeypatch.setattr(stepcols, "STEP_BLOCK", block)
    run = load_run(synthetic.write_run(str(tmp_path / "r"), 500, 1.0, False))
    rows = steps_of(next(iter(run.steps.values())))
    analyzed, _ = select_steps(rows)
    assert type(rows) is StepRows and type(analyzed) is StepRows and analyzed.table is rows.table
    for others in (analyzed, rows[3:40], rows[:0], rows[10:11], rows):
        want = np.isin([r["i"] for r in rows], [r["i"] for r in others])
        assert 0 < len(want)
        assert series.among(rows, others).tolist() == want.tolist()
    part = rows[100:200]  # rows that are not the table's whole: only those of ``part`` are marked
    assert series.among(part, analyzed).tolist() == np.isin([r["i"] for r in part], [r["i"] for r in analyzed]).tolist()


@pytest.mark.parametrize("bars", [1, 7, 300, 10_000])
def test_phase_bars_are_the_mean_step_of_each_bins_analyzed_steps(tmp_path, bars):
    import load_run as synthetic
    a = pipeline.analyze_run(synthetic.write_run(str(tmp_path / "r"), 2000, 1.0, True))  # lite steps: NaN phases
    rows = a.facts.step_rows
    codes = series.left_out_codes(rows, a.facts.analyzed_steps, a.facts.steps_info["warmup"])
    assert 0 < (codes == 0).sum() < len(rows)
    got = series.phase_bars(rows, 0, codes, bars)
    cols = series.step_columns(rows, 0, dtype=np.float32)
    k = -(-len(rows) // bars)
    assert got["k"] == k and len(got["start"]) == -(-len(rows) // k)
    assert set(got["ms"]) == set(cols["has"]) | {"other_host"}
    for j, (lo, hi) in enumerate(zip(got["start"], got["stop"])):
        use = np.arange(lo, hi)
        if (codes[lo:hi] == 0).any():
            use = use[codes[lo:hi] == 0]
        assert got["used"][j] == len(use) and got["analyzed"][j] == bool((codes[lo:hi] == 0).any())
        for name, values in got["ms"].items():
            want = float((cols[name][use].astype(float) * 1000).mean())
            assert values[j] == want or (np.isnan(want) and np.isnan(values[j])), (name, j)
