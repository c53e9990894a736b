"""Recorded run directories (``tests/data/runs``, made by ``tests/data/record_runs.py`` from the
scenarios in ``tests/scenarios`` under a real ``whyidle run``) taken through the whole pipeline
in-process: load → analyze → diagnose → report, in well under a second each. The diagnosis of each
is the one the slow scenario test asserts on a fresh run; here it is checked against fixed records,
so a rule change that flips a verdict fails in the fast tier."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from test_diagnose import assert_contract
from whyidle import pipeline
from whyidle.analysis.facts import RunFacts
from whyidle.cli import main
from whyidle.diagnose import thresholds as T

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "runs")

#: run → (verdict, {finding id: evidence items it must carry}).
EXPECTED = {
    "image_decode_main": ("input_bound", {"input_bound": {"cause": "loader_in_main_process"}}),
    "python_loop_loss": ("host_bound", {"host_bound": {"kind": "python_compute"}}),
    "batch1": ("small_batch", {"small_batch": {"batch_size": 1}}),
    "compute_heavy": ("device_bound", {}),
    "keras_sequential_map": ("input_bound", {"input_bound": {"cause": "sequential_map",
                                                             "input_wait_method": "tf_profiler"}}),
}


def test_every_recorded_run_has_an_expectation():
    assert sorted(os.listdir(RUNS)) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_run_diagnosis(name):
    verdict, evidence = EXPECTED[name]
    a = pipeline.analyze_run(os.path.join(RUNS, name))
    assert isinstance(a.facts, RunFacts)
    ids = [f["id"] for f in a.findings]
    assert a.verdict == verdict, [(f["id"], f["severity"], f["bound"]) for f in a.findings]
    assert ids[0] == verdict  # the verdict's finding comes first
    for f in a.findings:
        assert_contract(f)
    for fid, items in evidence.items():
        f = next(f for f in a.findings if f["id"] == fid)
        assert items.items() <= f["evidence"].items(), f["evidence"]
    head = a.findings[0]
    if verdict == "device_bound":  # no warning/critical cause holds the warn share of the step
        assert all(f["bound"] is None or f["bound"] < T.VERDICT_MIN_BOUND
                   for f in a.findings[1:] if f["severity"] != "info")
    else:  # the verdict names the largest measured limit, and its first fix gains here or says it cannot tell
        assert head["bound"] >= T.VERDICT_MIN_BOUND
        assert all((f["bound"] or 0) <= head["bound"] for f in a.findings if f["severity"] != "info")
        assert head["est_speedup"] is None or head["est_speedup"] >= T.VERDICT_MIN_SPEEDUP


def test_image_decode_run_names_the_decoding_and_ranks_what_works_here():
    a = pipeline.analyze_run(os.path.join(RUNS, "image_decode_main"))
    f = a.findings[0]
    assert f["id"] == "input_bound" and f["bound"] >= 0.85 and f["severity"] == "critical"
    texts = [o["text"] for o in f["fix"]["options"]]
    assert len(texts) >= 2 and any("cheaper" in t for t in texts)


def test_saved_run_report_is_reproducible_and_the_cli_agrees(tmp_path):
    """``whyidle report`` of a copied run gives the same report twice and the same as the pipeline;
    a run recorded with ``--no-html`` gets its page only where ``--html`` asks for it."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(os.path.join(RUNS, "python_loop_loss"), run_dir)
    first = pipeline.report_run(run_dir)
    out = tmp_path / "again.json"
    result = CliRunner().invoke(main, ["report", run_dir, "--json", str(out), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert f"HTML report (--html): {tmp_path / 'r.html'}" in result.output  # the page asked for is named
    again = json.loads(out.read_text())
    assert again == json.loads(json.dumps(first))
    assert os.path.getsize(tmp_path / "r.html") > 100_000 and not os.path.exists(os.path.join(run_dir, "report.html"))
    assert os.path.exists(os.path.join(run_dir, "timeline.json"))


def test_fix_code_and_paths_are_never_wrapped_at_80_columns(tmp_path):
    """Output that is not a terminal is 80 columns wide: the fix's code and the run directory
    (with its re-render command) are still printed one line each, to be copied as they are."""
    import io

    from whyidle.report.terminal import render

    run_dir = str(tmp_path / "run")
    shutil.copytree(os.path.join(RUNS, "image_decode_main"), run_dir)
    report = pipeline.report_run(run_dir)
    buf = io.StringIO()
    render(report, file=buf, width=80)
    lines = buf.getvalue().splitlines()
    code = next(f for f in report["findings"] if f["id"] == "input_bound")["fix"]["code"]
    for line in code.splitlines():
        assert " " * 5 + line in lines, line
    assert f"run directory: {report['run']['run_dir']}  (re-render: whyidle report {report['run']['run_dir']})" in lines
