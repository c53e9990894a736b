"""Time outside the training step (issue 14): evaluation, checkpoints, epoch boundaries, start-up.

Scenario runs of tests/scenarios/job_parts.py under ``whyidle run``: the faulty variant's verdict
names the kind, the fix is the one the fixed variant applies, the fixed variant no longer reports
it, and the wall-time split adds up to the command's wall time. The verdicts compare seconds of one
process's own time (evaluation vs training in the same thread), which a busy neighbour stretches
alike: with two busy burners beside it the eval scenario's verdict stays ``eval_bound`` (run-queue
wait 68 %, evaluation 19 s vs training 4 s), so the scenarios whose part holds at least twice the
training time run in the parallel tier. Where it holds less (a checkpoint share of ~15 %, a module
loop inside the step, the healthy control) the parallel tier's CPU contention would be the bigger
cause, rightly: those verdicts are asserted in the timing tier. Speed ratios between runs are
asserted only where the measured one is large (tests/scenarios/README.md has them all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SCENARIOS, finding, needs, observe

pytestmark = [pytest.mark.slow]

SCRIPT = os.path.join(SCENARIOS, "job_parts.py")
JOB_FINDINGS = ("eval_bound", "checkpoint_bound", "logging_bound", "epoch_boundary", "startup_bound")
STARTUP = os.path.join(SCENARIOS, "startup_prep.py")


def run(tmp_path, kind, variant="faulty", steps=60, script=SCRIPT, args=()):
    args = (["--kind", kind] if script == SCRIPT else []) + list(args)
    proc, report, run_dir = observe(tmp_path, [sys.executable, script, *args, "--variant", variant,
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
    faulty = run(tmp_path, "eval", steps=40)
    assert faulty["verdict"] == "eval_bound"
    f = finding(faulty, "eval_bound")
    assert f["evidence"]["cause"] == "too_often"
    assert f["evidence"]["count"] == 4  # model.eval() ... model.train() every 10 of 40 steps
    assert f["evidence"]["callers"][0]["site"].split(":")[0].endswith("job_parts.py")
    assert f["bound"] == pytest.approx(faulty["metrics"]["time"]["parts"]["evaluation"]["share"], abs=1e-3)
    assert "EVAL_EVERY = 40" in f["fix"]["code"] and "was 10" in f["fix"]["code"]
    assert f["est_speedup"] > 1.2
    # the timeline shows each evaluation on the trainer's "outside the step" track
    with open(os.path.join(faulty["run_dir"], "timeline.json")) as fh:
        events = json.load(fh)["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "evaluation: Module.eval") == 4
    # the validation batches are not training samples: the job's samples/s is below the steady one
    m = faulty["metrics"]
    assert m["samples_per_s"] < 0.6 * m["steady_samples_per_s"]

    fixed = run(tmp_path, "eval", "fixed", steps=40)  # one evaluation, at step 40
    assert "eval_bound" not in warned(fixed)
    assert fixed["metrics"]["samples_per_s"] > 1.5 * m["samples_per_s"]  # measured 3.1x (README)


def test_validation_under_no_grad_alone_is_evaluation_too(tmp_path):
    """A custom loop that evaluates under torch.no_grad() without model.eval(): the validation
    DataLoader started between training steps opens the region, the training loader's next batch
    closes it."""
    report = run(tmp_path, "eval", steps=40, args=["--no-eval-mode"])
    assert report["verdict"] == "eval_bound"
    f = finding(report, "eval_bound")
    assert f["evidence"]["count"] == 4 and f["evidence"]["interval_steps"] == 10
    assert f["evidence"]["callers"][0]["code"] == "for x, y in loader:"  # the evaluation loop's line
    m = report["metrics"]
    assert m["samples_per_s"] < 0.6 * m["steady_samples_per_s"]  # validation batches are not trained on
    assert m["time"]["parts"]["training"]["s"] < m["time"]["parts"]["evaluation"]["s"]


@pytest.mark.timing
def test_python_metric_in_the_evaluation_is_named_and_vectorizing_is_the_fix(tmp_path):
    faulty = run(tmp_path, "eval_metric", steps=60)  # 3 evaluations
    assert faulty["verdict"] == "eval_bound"
    f = finding(faulty, "eval_bound")
    assert f["evidence"]["cause"] == "host_work"
    assert f["evidence"]["host_sites"][0]["function"].endswith("pr_curve_loop")
    assert "pr_curve_loop" in f["fix"]["text"]


def test_the_vectorized_metric_is_not_host_work(tmp_path):
    fixed = run(tmp_path, "eval_metric", "fixed", steps=60)
    assert "eval_bound" not in warned(fixed) or finding(fixed, "eval_bound")["evidence"]["cause"] != "host_work"


@pytest.mark.timing
def test_saving_model_and_optimizer_every_few_steps_is_checkpoint_bound(tmp_path):
    faulty = run(tmp_path, "checkpoint", steps=150)
    assert faulty["verdict"] == "checkpoint_bound"
    f = finding(faulty, "checkpoint_bound")
    assert f["evidence"]["count"] == 30
    assert f["evidence"]["callers"][0]["site"].split(":")[0].endswith("job_parts.py")
    assert "SAVE_EVERY" in f["fix"]["code"] and "state_dict()" in f["fix"]["code"]


def test_saving_weights_only_and_less_often_is_not_checkpoint_bound(tmp_path):
    fixed = run(tmp_path, "checkpoint", "fixed", steps=150)
    assert "checkpoint_bound" not in warned(fixed)  # measured 1.36x faster (README): too close to assert here
    assert fixed["metrics"]["time"]["parts"]["checkpoint"]["count"] == 3


def test_spawned_workers_restarted_every_epoch_is_epoch_boundary_and_persistent_workers_fix_it(tmp_path):
    faulty = run(tmp_path, "epoch", steps=16)
    assert faulty["verdict"] == "epoch_boundary"
    f = finding(faulty, "epoch_boundary")
    assert f["evidence"]["count"] == 1 and f["evidence"]["mp_context"] == "spawn"  # 2 epochs: 1 restart
    assert f["evidence"]["callers"][0]["site"].split(":")[0].endswith("job_parts.py")  # the DataLoader's line
    # the program passes persistent_workers=fixed (False here): its variable is kept, with what to make it
    assert "persistent_workers=fixed,   # False here: make it True" in f["fix"]["code"]
    assert 'multiprocessing_context="spawn"' in f["fix"]["code"]  # the program's own choice is kept
    # the steps after each restart wait for the workers' start-up: that input wait is not the verdict
    assert all(g["severity"] == "info" for g in faulty["findings"] if g["id"] == "input_bound")
    fixed = run(tmp_path, "epoch", "fixed", steps=16)
    assert "epoch_boundary" not in warned(fixed)
    assert fixed["metrics"]["samples_per_s"] > 1.5 * faulty["metrics"]["samples_per_s"]  # measured 2.9x


@pytest.mark.timing
def test_one_short_evaluation_and_one_checkpoint_at_the_end_raise_no_warning(tmp_path):
    report = run(tmp_path, "healthy", "faulty", steps=30)
    assert warned(report) == set()
    assert report["verdict"] == "device_bound"
    parts = report["metrics"]["time"]["parts"]
    assert parts["evaluation"]["count"] == 1 and parts["checkpoint"]["count"] == 1


@pytest.mark.timing
def test_encoder_called_in_a_loop_over_views_is_a_module_loop(tmp_path):
    faulty = run(tmp_path, "views", steps=40, script=os.path.join(SCENARIOS, "module_loop.py"))
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    ev = f["evidence"]
    assert ev["kind"] == "module_loop" and ev["module"] == "Encoder"
    assert ev["calls_per_step"] == 24 and ev["batch"] == 8
    assert ev["site"].split(":")[0].endswith("module_loop.py")
    assert "x.flatten(0, 1)" in f["fix"]["code"] and "self.encoder(" in f["fix"]["code"]


def test_the_folded_encoder_is_not_a_module_loop(tmp_path):
    fixed = run(tmp_path, "views", "fixed", steps=40, script=os.path.join(SCENARIOS, "module_loop.py"))
    assert all(g["evidence"].get("kind") != "module_loop" for g in fixed["findings"] if g["id"] == "host_bound")


@pytest.mark.timing
def test_a_loss_called_per_sample_in_a_loop_is_a_module_loop_and_one_call_fixes_it(tmp_path):
    faulty = run(tmp_path, "loss", steps=100, script=os.path.join(SCENARIOS, "loss_loop.py"))
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    ev = f["evidence"]
    assert ev["kind"] == "module_loop" and ev["module"] == "CrossEntropyLoss" and ev["calls_per_step"] == 32
    assert ev["params"] == 0 and ev["site"].split(":")[0].endswith("loss_loop.py")
    assert "losses.append(criterion(" in f["fix"]["code"] and f["est_speedup"] > 1.2
    fixed = run(tmp_path, "loss", "fixed", steps=100, script=os.path.join(SCENARIOS, "loss_loop.py"))
    assert all(g["evidence"].get("kind") != "module_loop" for g in fixed["findings"] if g["id"] == "host_bound")


@needs("lightning")
def test_lightning_validation_every_few_steps_is_eval_bound_in_trainer_terms(tmp_path):
    faulty = run(tmp_path, "lightning", steps=60, script=os.path.join(SCENARIOS, "lightning_eval.py"))
    assert faulty["verdict"] == "eval_bound"
    f = finding(faulty, "eval_bound")
    assert f["evidence"]["count"] == 7  # the sanity check and 6 validations (EvaluationLoop.run)
    assert "val_check_interval=40" in f["fix"]["code"] and "# was 10" in f["fix"]["code"]


@pytest.mark.timing  # its verdict reads measured shares: with 3 test processes on 2 cores a CI run's was
@needs("keras")      # cpu_contention (correctly: others held the cores), so it runs in the serial tier
def test_keras_epoch_end_callback_predicting_per_image_is_eval_bound(tmp_path):
    proc, report, _ = observe(tmp_path, [sys.executable, os.path.join(SCENARIOS, "keras_eval_callback.py"),
                                         "--epochs", "3"], timeout=240, name="keras-callback")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "eval_bound"
    f = finding(report, "eval_bound")
    assert f["evidence"]["cause"] == "host_work" and f["evidence"]["count"] == 3
    assert any(s["function"].endswith(("iou", "nms_python")) for s in f["evidence"]["host_sites"])
    assert "model.predict(" in f["fix"]["code"]


@pytest.mark.timing
def test_preprocessing_inside_forward_is_host_bound_and_the_collate_fixes_it(tmp_path):
    script = os.path.join(SCENARIOS, "c36_preprocess_in_forward.py")
    faulty = run(tmp_path, "c36", steps=40, script=script)
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    ev = f["evidence"]
    assert ev["kind"] == "preprocess_in_forward" and ev["module"] == "VisionLanguageModel"
    assert ev["site"].split(":")[0].endswith("c36_preprocess_in_forward.py")  # the line calling the model
    assert any(h["function"].endswith(("preprocess", "encode", "_wordpiece", "_clean_text")) for h in ev["hotspots"])
    assert "collate_fn=Preprocess()" in f["fix"]["code"]
    fixed = run(tmp_path, "c36", "fixed", steps=40, script=script)
    assert all(g["evidence"].get("kind") != "preprocess_in_forward" for g in fixed["findings"] if g["id"] == "host_bound")
    assert fixed["metrics"]["steady_samples_per_s"] > 1.2 * faulty["metrics"]["steady_samples_per_s"]


def test_hundreds_of_tiny_tensors_per_batch_are_the_worker_hand_off_and_packing_fixes_it(tmp_path):
    script = os.path.join(SCENARIOS, "c34_many_tiny_tensors.py")
    faulty = run(tmp_path, "c34", steps=20, script=script)
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    ev = f["evidence"]
    assert ev["cause"] == "many_tensors" and ev["batch_tensors"] == 64 * 7 + 2  # targets, images, labels
    assert ev["ipc_share_of_wait"] >= 0.5  # receiving, not waiting for the workers (measured 0.9)
    code = f["fix"]["code"]
    assert "torch.cat" in code and "num_workers=2," in code  # the program's own call, its workers kept:
    assert "make it" not in code and "num_workers=2,   # was" not in code  # not "more workers"
    compile(f["fix"]["code"].replace("...", "batch_size=64"), "fix", "exec")  # the fix parses
    assert f["est_speedup"] == pytest.approx(ev["est_speedup_if_removed"], rel=0.01)  # packing removes the wait
    fixed = run(tmp_path, "c34", "fixed", steps=20, script=script)
    assert all(g["evidence"].get("cause") != "many_tensors" for g in fixed["findings"] if g["id"] == "input_bound")
    assert fixed["metrics"]["steady_samples_per_s"] > 1.5 * faulty["metrics"]["steady_samples_per_s"]  # 4.1x here


def test_tokenizing_the_corpus_at_every_launch_is_startup_bound_and_a_saved_corpus_fixes_it(tmp_path):
    faulty = run(tmp_path, "startup", script=STARTUP, steps=30, args=["--docs", "700"])
    assert faulty["verdict"] == "startup_bound"
    f = finding(faulty, "startup_bound")
    ev = f["evidence"]
    split = faulty["metrics"]["time"]["parts"]["startup"]["split"]
    assert ev["cause"] == "data_preparation" and ev["part_s"] == pytest.approx(split["program_s"], abs=1e-3)
    assert ev["part_s"] >= 2.0 and ev["imports_s"] > 0.5  # torch's import is not the program's set-up
    assert ev["block"]["function"] == "main" and ev["block"]["names"] == ["ids", "labels"]
    assert ev["block"]["source"].strip() == "ids, labels = tokenize_corpus(args.docs, args.seed)"
    assert any("c07_tokenize_on_the_fly.py" in s["site"] for s in ev["sites"])  # the tokenizer's own lines
    assert "ids, labels = torch.load(CACHE" in f["fix"]["code"] and f["est_speedup"] > 1.1
    with open(os.path.join(faulty["run_dir"], "timeline.json")) as fh:  # the split on the timeline
        slices = {e["name"]: e for e in json.load(fh)["traceEvents"] if e.get("cat") == "startup"}
    assert slices["start-up"]["args"]["program_s"] == pytest.approx(split["program_s"], abs=1e-3)
    assert "start-up: set-up (the program's, and later imports)" in slices
    cache = str(tmp_path / "corpus.pt")
    made = subprocess.run([sys.executable, STARTUP, "--fixed", "--docs", "700", "--cache", cache, "--steps", "1"],
                          capture_output=True, text=True, timeout=240)
    assert made.returncode == 0, made.stderr[-2000:]
    fixed = run(tmp_path, "startup", variant="fixed", script=STARTUP, steps=30, args=["--docs", "700", "--cache", cache])
    assert "startup_bound" not in warned(fixed)
    assert fixed["metrics"]["time"]["parts"]["startup"]["split"]["program_s"] < 0.25 * split["program_s"]
    assert fixed["metrics"]["time"]["wall_s"] < faulty["metrics"]["time"]["wall_s"]


REBUILT = '''
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    ds = TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
    model = nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(12):
        loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)  # built again every epoch
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
'''


def test_a_dataloader_built_again_every_epoch_is_the_training_loader_and_its_restarts_epoch_boundaries(tmp_path):
    # each epoch's new DataLoader (often in the old one's memory) is the training loader built again,
    # not a validation loader: its start-ups are epoch boundaries, and persistent_workers=True on the
    # same line would change nothing
    script = tmp_path / "rebuilt.py"
    script.write_text(REBUILT)
    proc, report, _ = observe(tmp_path, [sys.executable, str(script)], timeout=240, name="rebuilt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = report["metrics"]["time"]["parts"]
    assert parts["evaluation"]["s"] == 0 and parts["epoch_boundary"]["count"] >= 8
    assert finding(report, "eval_bound") is None
    f = finding(report, "epoch_boundary")
    if f is not None:  # a warning when the restarts reach 10 % of the wall time (they do on 2 cores)
        assert f["evidence"]["rebuilt"] >= 5 and "Build the DataLoader once" in f["fix"]["text"]
