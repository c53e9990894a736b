"""torch.compile as a part of the job (issue 31): compile time from the compiler's own callbacks,
recompilations and their reasons, the recompile limit, graph breaks; the scenarios' measured fixes
are in their docstrings (tests/scenarios/compile_varlen.py, compile_graph_break.py,
compiled_model.py). ``aot_eager`` keeps the compilations cheap (no C++ code generation); the
compiler's events are the same as under inductor.

The facts (what was compiled, why, where) do not depend on timing; the verdicts do
(``timing`` tests, run alone).
"""

from __future__ import annotations

import os
import sys

import pytest
from conftest import SCENARIOS, finding, observe

pytestmark = pytest.mark.slow


def run(tmp_path, script, *args):
    proc, report, _ = observe(tmp_path, [sys.executable, os.path.join(SCENARIOS, script), *args], timeout=300,
                              name=os.path.splitext(script)[0] + "".join(args).replace("-", "_"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None, proc.stderr[-3000:]
    return report


def test_variable_lengths_recompile_with_the_reason_and_the_dimension(tmp_path):
    report = run(tmp_path, "compile_varlen.py", "--backend", "aot_eager", "--steps", "40")
    c = report["metrics"]["compile"]
    assert c["recompilations"] >= 1 and c["recompile_s"] > 0 and c["startup_compile_s"] > 0, c
    assert c["call"]["backend"] == "aot_eager" and c["call"]["site"].endswith(" main"), c
    parts = report["metrics"]["time"]["parts"]
    assert parts["compile"]["s"] > 0 and parts["startup"]["split"]["compile_s"] > 0, parts
    f = finding(report, "recompiles")
    assert f is not None, [x["id"] for x in report["findings"]]
    frame = f["evidence"]["frames"][0]
    assert frame["frame"] == "forward" and "compile_varlen.py" in frame["site"], frame
    assert (frame["reasons"][0]["tensor"], frame["reasons"][0]["dim"]) == ("x", 1), frame["reasons"]
    assert "mark_dynamic(x, 1)" in f["fix"]["code"]
    assert any("dynamic=True" in (o["code"] or "") for o in f["fix"]["options"])
    assert finding(report, "recompile_limit") is None


def test_one_dynamic_compilation_does_not_recompile(tmp_path):
    report = run(tmp_path, "compile_varlen.py", "--backend", "aot_eager", "--steps", "40", "--dynamic", "true")
    assert report["metrics"]["compile"]["recompilations"] == 0
    assert finding(report, "recompiles") is None


@pytest.mark.timing
def test_dynamic_false_hits_the_recompile_limit_and_runs_eagerly(tmp_path):
    report = run(tmp_path, "compile_varlen.py", "--backend", "aot_eager", "--steps", "40", "--dynamic", "false")
    c = report["metrics"]["compile"]
    assert c["recompilations"] >= 7 and c["recompile_limit_hit"], c
    lim = finding(report, "recompile_limit")
    assert lim is not None and lim["severity"] in ("warning", "critical"), report["findings"]
    assert lim["evidence"]["steps_after"] >= 20, lim["evidence"]
    rec = finding(report, "recompiles")
    # the program's own compile line without dynamic=..., its backend kept, then the mark
    first, mark = rec["fix"]["code"].split("\n")
    assert first.startswith("model = torch.compile(model, backend=args.backend)") and "mark_dynamic(x, 1)" in mark, rec["fix"]
    assert report["verdict"] in ("recompiles", "recompile_limit"), [(x["id"], x["bound"]) for x in report["findings"]]


def test_graph_break_is_named_at_its_line_with_its_reason(tmp_path):
    report = run(tmp_path, "compile_graph_break.py", "--backend", "aot_eager", "--steps", "60")
    f = finding(report, "graph_breaks")
    assert f is not None, [x["id"] for x in report["findings"]]
    site = f["evidence"]["breaks"][0]
    source = open(os.path.join(SCENARIOS, "compile_graph_break.py")).read().splitlines()
    assert ".item()" in source[site["line"] - 1], site
    assert "item()" in f["summary"] and "capture_scalar_outputs" in f["fix"]["code"], f
    assert report["metrics"]["compile"]["recompilations"] == 0
    fixed = run(tmp_path, "compile_graph_break.py", "--backend", "aot_eager", "--steps", "60", "--fixed")
    assert finding(fixed, "graph_breaks") is None


@pytest.mark.timing
def test_healthy_compiled_model_compiles_at_start_up_only(tmp_path):
    report = run(tmp_path, "compiled_model.py", "--backend", "aot_eager", "--steps", "60")
    c = report["metrics"]["compile"]
    assert c["compilations"] >= 1 and c["recompilations"] == 0 and c["startup_compile_s"] > 0, c
    assert report["metrics"]["time"]["parts"]["compile"]["s"] == 0
    for fid in ("recompiles", "recompile_limit", "graph_breaks"):
        assert finding(report, fid) is None, fid
    assert report["verdict"] == "device_bound", [(x["id"], x["bound"]) for x in report["findings"]]
