"""The verdict of a short run (issue 32): a one-time part (the set-up before the first step) that
leads only because the run was short is named with the verdict a longer run would get
(``steady_verdict``), in the JSON, the terminal and the HTML page."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest
from conftest import SCENARIOS, finding, run_whyidle
from synthetic_run import write_run
from whyidle import pipeline
from whyidle.analysis.series import run_series
from whyidle.diagnose.rules import finding as make_finding
from whyidle.diagnose.verdict import choose_verdict, steady_verdict
from whyidle.report import html, terminal
from whyidle.report.build import build_report, steady_line


def startup(share=0.32, seconds=9.6, severity="warning"):
    """A ``startup_bound`` finding as rules_startup writes it: ``bound`` a share of the wall time."""
    return make_finding("startup_bound", severity, "Start-up set-up holds the job", "The set-up took 9.6 s.",
                   {"part_s": seconds, "share_of_wall": share}, 1.4, "Prepare the data once.", bound=share)


def step_finding(fid="input_bound", bound=0.49, severity="critical", gain=1.9):
    """A step-level finding: ``bound`` a share of every training step, no ``part_s``."""
    return make_finding(fid, severity, "Input-bound: the data loader", "The step waits for data.", {}, gain,
                   "Use workers.", bound=bound)


def whole_job(fid="eval_bound", share=0.2, seconds=6.0):
    return make_finding(fid, "warning", "Evaluation holds the job", "Evaluation took 6 s.", {"part_s": seconds}, 1.2,
                   "Evaluate less often.", bound=share)


def test_start_up_that_leads_a_short_run_names_the_step_verdict_of_a_longer_one():
    # a 30 s run: 9.6 s of set-up against an input wait of 49 % of 15 s of steps (7.4 s)
    findings = [startup(), step_finding()]
    verdict = choose_verdict(findings, training_s=15.0)
    assert verdict == "startup_bound"
    assert steady_verdict(findings, verdict, training_s=15.0) == "input_bound"


def test_a_verdict_that_holds_in_a_longer_run_has_no_steady_verdict():
    findings = [startup(share=0.2, seconds=3.0), step_finding(bound=0.6)]
    verdict = choose_verdict(findings, training_s=15.0)
    assert verdict == "input_bound"  # the step already leads: nothing to add
    assert steady_verdict(findings, verdict, training_s=15.0) is None
    # periodic parts outside the step are not one-time: they grow with the run as the steps do
    periodic = [whole_job(seconds=12.0), step_finding()]
    assert steady_verdict(periodic, choose_verdict(periodic, training_s=15.0), training_s=15.0) is None


def test_start_up_alone_keeps_its_verdict():
    # nothing else qualifies (under VERDICT_MIN_BOUND, or info): the set-up is all there is to fix
    for others in ([], [step_finding(bound=0.05)], [step_finding(severity="info")]):
        findings = [startup()] + others
        assert steady_verdict(findings, choose_verdict(findings, training_s=15.0), training_s=15.0) is None


def test_the_steady_verdict_is_chosen_by_the_same_rule_without_the_one_time_part():
    # evaluation 6 s against an input wait of 49 % of 15 s (7.35 s): the input wait holds more
    findings = [startup(seconds=12.0), whole_job(seconds=6.0), step_finding()]
    assert steady_verdict(findings, "startup_bound", training_s=15.0) == "input_bound"
    findings = [startup(seconds=12.0), whole_job(seconds=9.0), step_finding()]
    assert steady_verdict(findings, "startup_bound", training_s=15.0) == "eval_bound"


def test_the_verdict_line_says_the_run_was_short_and_names_the_longer_runs_verdict():
    report = {"verdict": "startup_bound", "steady_verdict": "input_bound", "metrics": {"wall_s": 30.2},
              "findings": [startup(), step_finding()]}
    assert steady_line(report) == ("only because this run was short: start-up 32% of this 30 s run; in a longer "
                                   "run: INPUT-BOUND, 49% of every step (fixing it: ~1.90× faster)")
    report["steady_verdict"], report["findings"][1] = "eval_bound", whole_job(share=0.25)
    assert "in a longer run: EVAL-BOUND, 25% of the wall time" in steady_line(report)
    assert steady_line({**report, "steady_verdict": None}) is None


def _report_with_a_short_run_verdict(tmp_path) -> tuple[dict, object]:
    """A synthetic run's real report, its findings replaced by a short run's."""
    a = pipeline.analyze_run(write_run(tmp_path / "run", steps=60))
    findings = [startup(), step_finding()]
    report = build_report(a.facts, "startup_bound", findings, a.run.problems)
    return report, run_series(a.run, a.facts)


def test_the_report_json_terminal_and_page_carry_the_steady_verdict(tmp_path):
    report, series = _report_with_a_short_run_verdict(tmp_path)
    assert report["steady_verdict"] == "input_bound"
    out = io.StringIO()
    terminal.render(report, file=out, width=200)
    text = out.getvalue()
    first = text[text.index("Verdict:"):]
    assert "only because this run was short: start-up 32% of this" in first.split("\n", 2)[1]
    assert "in a longer run: INPUT-BOUND, 49% of every step" in text
    page = html.render_html(report, series)
    assert 'id="steady-verdict"' in page and "in a longer run: INPUT-BOUND, 49% of every step" in page


def test_a_report_whose_verdict_holds_has_a_null_steady_verdict(tmp_path):
    a = pipeline.analyze_run(write_run(tmp_path / "run", steps=60))
    report = build_report(a.facts, a.verdict, a.findings, a.run.problems)
    assert "steady_verdict" in report and report["steady_verdict"] is None
    assert 'id="steady-verdict"' not in html.render_html(report, run_series(a.run, a.facts))


@pytest.mark.slow
def test_a_short_try_whose_dataset_build_leads_names_the_input_bound_step(tmp_path):
    """startup_prep.py --raw-loader: 2,000 documents tokenized before training (~30 % of a 30-step
    run) and a DataLoader that tokenizes every sample (about half of each step): the verdict is
    the set-up, and the report says that a longer run is input-bound, in the JSON, the terminal
    and the page."""
    run_dir = str(tmp_path / "run")
    json_path = str(tmp_path / "report.json")
    proc = run_whyidle(["run", "--out", run_dir, "--json", json_path, "--", sys.executable,
                        os.path.join(SCENARIOS, "startup_prep.py"), "--raw-loader", "--docs", "2000", "--steps", "30"],
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(json_path) as f:
        report = json.load(f)
    lead, steady = finding(report, "startup_bound"), finding(report, "input_bound")
    assert report["verdict"] == "startup_bound", [(f["id"], f["bound"]) for f in report["findings"]]
    assert report["steady_verdict"] == "input_bound"
    assert steady["severity"] in ("warning", "critical") and steady["bound"] >= 0.3
    assert lead["bound"] >= 0.2  # ~30 % on a quiet 2-core box; more when neighbours slow the tokenizer
    line = f"in a longer run: INPUT-BOUND, {steady['bound']:.0%} of every step"
    terminal_text = " ".join((proc.stdout + proc.stderr).split())  # the report, wrapped at 80 columns
    assert "only because this run was short: start-up" in terminal_text and line in terminal_text
    with open(os.path.join(run_dir, "report.html"), encoding="utf-8") as f:
        assert line in f.read()
