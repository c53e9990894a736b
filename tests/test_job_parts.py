"""Time outside the training step (issue 14): evaluation, checkpoints and epoch boundaries.

Scenario runs of tests/scenarios/job_parts.py under ``whyidle run``: the faulty variant's verdict
names the kind, the fix is the one the fixed variant applies, the fixed variant no longer reports
it, and the wall-time split adds up to the command's wall time. Timing tier: a busy neighbour (a
parallel test) would be CPU contention, a verdict of its own. Speed ratios between runs are
asserted loosely (tests/scenarios/README.md has the measured ones).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import SCENARIOS, finding, observe

pytestmark = [pytest.mark.slow, pytest.mark.timing]

SCRIPT = os.path.join(SCENARIOS, "job_parts.py")
JOB_FINDINGS = ("eval_bound", "checkpoint_bound", "logging_bound", "epoch_boundary")


def run(tmp_path, kind, variant="faulty", steps=60):
    proc, report, run_dir = observe(tmp_path, [sys.executable, SCRIPT, "--kind", kind, "--variant", variant,
                                         "--steps", str(steps)], timeout=240, name=f"{kind}-{variant}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = report["metrics"]["time"]
    # every second of the command in exactly one part: the split adds up to the wall time
    assert sum(p["s"] for p in t["parts"].values()) == pytest.approx(t["wall_s"], rel=0.02)
    assert t["wall_s"] == pytest.approx(report["metrics"]["wall_s"], rel=0.02, abs=0.05)
    report["run_dir"] = run_dir
    return report


def warned(report) -> set[str]:
    return {f["id"] for f in report["findings"] if f["severity"] != "info" and f["id"] in JOB_FINDINGS}


def test_validation_every_few_steps_is_eval_bound_and_evaluating_less_often_fixes_it(tmp_path):
    faulty = run(tmp_path, "eval")
    assert faulty["verdict"] == "eval_bound"
    f = finding(faulty, "eval_bound")
    assert f["evidence"]["cause"] == "too_often"
    assert f["evidence"]["count"] == 6  # model.eval() ... model.train() every 10 of 60 steps
    assert f["evidence"]["callers"][0]["site"].split(":")[0].endswith("job_parts.py")
    assert f["bound"] == pytest.approx(faulty["metrics"]["time"]["parts"]["evaluation"]["share"], abs=1e-3)
    assert "EVAL_EVERY = 40" in f["fix"]["code"] and "was 10" in f["fix"]["code"]
    assert f["est_speedup"] > 1.2
    # the timeline shows each evaluation on the trainer's "outside the step" track
    with open(os.path.join(faulty["run_dir"], "timeline.json")) as fh:
        events = json.load(fh)["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "evaluation: Module.eval") == 6
    # the validation batches are not training samples: the job's samples/s is below the steady one
    m = faulty["metrics"]
    assert m["samples_per_s"] < 0.6 * m["steady_samples_per_s"]

    fixed = run(tmp_path, "eval", "fixed")
    assert "eval_bound" not in warned(fixed)
    assert fixed["metrics"]["samples_per_s"] > 1.5 * m["samples_per_s"]  # measured 3.4x (README)


def test_python_metric_in_the_evaluation_is_named_and_vectorizing_is_the_fix(tmp_path):
    faulty = run(tmp_path, "eval_metric")
    assert faulty["verdict"] == "eval_bound"
    f = finding(faulty, "eval_bound")
    assert f["evidence"]["cause"] == "host_work"
    assert f["evidence"]["host_sites"][0]["function"].endswith("pr_curve_loop")
    assert "pr_curve_loop" in f["fix"]["text"]
    fixed = run(tmp_path, "eval_metric", "fixed")
    assert "eval_bound" not in warned(fixed) or finding(fixed, "eval_bound")["evidence"]["cause"] != "host_work"


def test_saving_model_and_optimizer_every_few_steps_is_checkpoint_bound(tmp_path):
    faulty = run(tmp_path, "checkpoint", steps=150)
    assert faulty["verdict"] == "checkpoint_bound"
    f = finding(faulty, "checkpoint_bound")
    assert f["evidence"]["count"] == 30
    assert f["evidence"]["callers"][0]["site"].split(":")[0].endswith("job_parts.py")
    assert "SAVE_EVERY" in f["fix"]["code"] and "state_dict()" in f["fix"]["code"]
    fixed = run(tmp_path, "checkpoint", "fixed", steps=150)
    assert "checkpoint_bound" not in warned(fixed)
    assert fixed["metrics"]["samples_per_s"] > 1.15 * faulty["metrics"]["samples_per_s"]  # measured 1.55x


def test_spawned_workers_restarted_every_epoch_is_epoch_boundary_and_persistent_workers_fix_it(tmp_path):
    faulty = run(tmp_path, "epoch", steps=24)
    assert faulty["verdict"] == "epoch_boundary"
    f = finding(faulty, "epoch_boundary")
    assert f["evidence"]["count"] == 2 and f["evidence"]["mp_context"] == "spawn"  # 3 epochs: 2 restarts
    assert "persistent_workers=True" in f["fix"]["code"]
    fixed = run(tmp_path, "epoch", "fixed", steps=24)
    assert "epoch_boundary" not in warned(fixed)
    assert fixed["metrics"]["samples_per_s"] > 1.5 * faulty["metrics"]["samples_per_s"]  # measured 2.8x


def test_one_short_evaluation_and_one_checkpoint_at_the_end_raise_no_warning(tmp_path):
    report = run(tmp_path, "healthy", "faulty", steps=30)
    assert warned(report) == set()
    assert report["verdict"] == "device_bound"
    parts = report["metrics"]["time"]["parts"]
    assert parts["evaluation"]["count"] == 1 and parts["checkpoint"]["count"] == 1
