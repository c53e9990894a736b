"""Issue 32 item 2: a trial for every fix that is a setting, and the winner as a diff.

In-process and fast: the trial settings each finding gives (:mod:`whyidle.tune.job_settings`,
:func:`whyidle.tune.plan.candidates`), the findings left to code (``code_fixes``), the in-process
overrides of Lightning / HF / Keras / ``torch.autocast``, and the diff writer
(:mod:`whyidle.tune.patch`), checked with ``git apply`` and ``patch -p1``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from whyidle.diagnose import thresholds as T
from whyidle.instrument import overrides
from whyidle.tune import job_settings, plan, result
from whyidle.tune.patch import PatchError, change_source, settings_patch, unified
from whyidle.tune.plan import Candidate, Outcome


from test_tune import _ov  # the overrides under a recording agent


def _finding(fid, severity="critical", est=1.5, code=None, **evidence):
    return {"id": fid, "severity": severity, "title": fid, "est_speedup": est, "est_speedup_if_removed": 2.0,
            "evidence": evidence, "fix": {"text": f"fix {fid}", "code": code, "options": []}}


def _report(api="lightning", config=None, findings=(), framework="torch", loader=None, cores=2):
    return {"framework": framework, "api": {"name": api, "config": config or {}}, "findings": list(findings),
            "loader": loader, "metrics": {"host": {"cores_usable": cores}}}


# --- the trials each finding gives -------------------------------------------------------------

def test_eval_bound_lightning_every_n_steps_is_the_printed_fix():
    f = _finding("eval_bound", code="trainer = Trainer(..., val_check_interval=40,", count=6)
    t = job_settings.evaluation(_report(config={"val_check_interval": 10, "limit_val_batches": 1.0}), f)
    assert t.settings == {"val_check_interval": 10 * T.EVAL_LESS_OFTEN, "limit_val_batches": 0.25}
    assert t.predicted == 1.5
    # a fraction of the epoch grows up to the whole epoch; a batch count limit is kept
    t = job_settings.evaluation(_report(config={"val_check_interval": 0.5, "limit_val_batches": 10}), f)
    assert t.settings == {"val_check_interval": 1.0}
    # every epoch (Lightning's default): every k epochs
    t = job_settings.evaluation(_report(config={"val_check_interval": 1.0, "check_val_every_n_epoch": 1,
                                                "limit_val_batches": 0.5}), f)
    assert t.settings == {"check_val_every_n_epoch": T.EVAL_LESS_OFTEN}


def test_eval_bound_hf_keras_and_plain_torch():
    f = _finding("eval_bound", code="eval_steps=", count=2)
    hf = job_settings.evaluation(_report("hf_trainer", {"eval_strategy": "steps", "eval_steps": 20}), f)
    assert hf.settings == {"eval_steps": 40}  # 2 evaluations: 2x less often
    assert job_settings.evaluation(_report("hf_trainer", {"eval_strategy": "epoch"}), f) is None
    keras = job_settings.evaluation(_report("keras", framework="keras"), _finding("eval_bound", count=8))
    assert keras.settings == {"validation_freq": T.EVAL_LESS_OFTEN}
    assert job_settings.evaluation(_report("torch"), f) is None  # EVAL_EVERY in the program's loop: code


def test_checkpoint_logging_epoch_precision_and_contention_trials():
    ck = _finding("checkpoint_bound", code="ModelCheckpoint(every_n_train_steps=", count=10, interval_steps=5,
                  share_of_wall=0.2)
    assert job_settings.checkpoint(_report(), ck).settings == {"every_n_train_steps": 50}
    assert job_settings.checkpoint(_report("hf_trainer", {"save_strategy": "steps", "save_steps": 5}), ck).settings \
        == {"save_steps": 50}
    assert job_settings.checkpoint(_report("torch"), ck) is None
    lg = _finding("logging_bound", code="trainer = Trainer(..., log_every_n_steps=50)")
    assert job_settings.logging(_report(), lg).settings == {"log_every_n_steps": T.LOG_EVERY}
    # self.log in a hook: the printed fix is code (a guard), no setting
    assert job_settings.logging(_report(), _finding("logging_bound", code="if batch_idx % 50 == 0:")) is None
    ep = _finding("epoch_boundary", est=2.9, num_workers=2, persistent_workers=False)
    t = job_settings.epoch_restarts(_report("torch"), ep)
    assert t.settings == {"persistent_workers": True} and t.predicted == 2.9
    assert job_settings.epoch_restarts(_report("torch"), _finding("epoch_boundary", num_workers=0)) is None
    em = job_settings.autocast_off(_report("torch"), _finding("emulated_precision", est=1.9))
    assert em.settings == {"autocast": "off"} and em.predicted == 1.9
    busy = _finding("cpu_contention", est=None, workers=4, processes=1, cause="oversubscription")
    counts = [t.settings for t in job_settings.fewer_workers(_report("torch", loader={"num_workers": 4}), busy, 2)]
    assert counts == [{"num_workers": 1}, {"num_workers": 0}]
    assert job_settings.fewer_workers(_report("torch", loader={"num_workers": 1}),
                                      _finding("cpu_contention", workers=1, processes=1, cause="oversubscription"), 2) == []
    other = _finding("cpu_contention", workers=4, processes=1, cause="other_processes")  # not the job's own count
    assert job_settings.fewer_workers(_report("torch", loader={"num_workers": 4}), other, 2) == []


def test_candidates_take_the_job_settings_and_code_fixes_list_the_rest():
    rep = _report("torch", loader={"num_workers": 2, "persistent_workers": False, "batch_size": 32}, findings=[
        _finding("epoch_boundary", est=2.9, num_workers=2, persistent_workers=False),
        _finding("python_loop", severity="warning", est=1.3),
        _finding("eval_bound", severity="info", count=9)])
    cands = plan.candidates(rep, 2)
    assert [(c.settings, c.origin, c.predicted) for c in cands] == [({"persistent_workers": True}, "epoch_boundary", 2.9)]
    assert Candidate({"val_check_interval": 40}, "eval_bound").family == "evaluation"
    out = Outcome(cands[0], "ok", 2.5, [2.2, 2.8], "faster")
    code = result.code_fixes(rep, [out])
    assert [(c["finding"], c["est_speedup"], c["fix"]) for c in code] == [("python_loop", 1.3, "fix python_loop")]


# --- applied in the program, the user's file untouched -----------------------------------------

def test_parse_takes_the_frequency_knobs():
    settings, problems = overrides.parse(json.dumps({"val_check_interval": 0.5, "eval_steps": 40, "save_steps": 0,
                                                     "validation_freq": True, "autocast": "off"}))
    assert settings == {"val_check_interval": 0.5, "eval_steps": 40, "autocast": "off"}
    assert len(problems) == 2  # save_steps 0, validation_freq as a bool


def test_wrapped_init_replaces_or_adds_and_records():
    class Trainer:
        def __init__(self, *, max_steps=-1, val_check_interval=None, limit_val_batches=None):
            self.args = (max_steps, val_check_interval, limit_val_batches)

    ov = _ov(val_check_interval=40, limit_val_batches=0.25, log_every_n_steps=50)
    overrides._wrap_init(ov, Trainer, overrides.LIGHTNING_TRAINER_KNOBS)
    assert Trainer(max_steps=60, val_check_interval=10).args == (60, 40, 0.25)
    recs = {(r["name"], r["applied"]): r for r in ov.agent.records}
    assert recs[("val_check_interval", True)]["was"] == 10 and recs[("limit_val_batches", True)]["was"] is None
    assert "takes no log_every_n_steps" in recs[("log_every_n_steps", False)]["why"]

    class ModelCheckpoint:
        def __init__(self, dirpath=None, every_n_train_steps=None, every_n_epochs=None, train_time_interval=None):
            self.args = (every_n_train_steps, every_n_epochs)

    ov = _ov(every_n_train_steps=100)
    overrides._wrap_init(ov, ModelCheckpoint, overrides.LIGHTNING_CHECKPOINT_KNOBS, overrides._one_checkpoint_trigger)
    assert ModelCheckpoint("ckpt", every_n_epochs=1).args == (100, None)  # one trigger: Lightning raises for two


def test_keras_fit_takes_validation_freq():
    ov = _ov(validation_freq=4)
    arguments = {"x": [1, 2], "validation_data": ([1], [1])}
    overrides.fit_arguments(ov, arguments, "train.py:30")
    assert arguments["validation_freq"] == 4 and ov.agent.records[0]["was"] == 1


def test_autocast_off_disables_the_programs_own_regions():
    import torch

    cls = torch.amp.autocast_mode.autocast
    orig = cls.__init__
    ov = _ov(autocast="off")
    try:
        overrides._disable_autocast(ov, torch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.ones(4, 4) @ torch.ones(4, 4)
        assert y.dtype == torch.float32
    finally:
        cls.__init__ = orig
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.bfloat16
    rec = ov.agent.records[0]
    assert rec["name"] == "autocast" and rec["applied"] and rec["was"] == "torch.bfloat16"


# --- the diff ------------------------------------------------------------------------------------

SCRIPT = '''import torch
from torch.utils.data import DataLoader

train = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2,
                   multiprocessing_context="spawn", persistent_workers=fixed)
val = DataLoader(ds, 32)
trainer = L.Trainer(max_steps=60, val_check_interval=10, **extra,
                    accelerator="cpu")
ckpt = ModelCheckpoint(every_n_epochs=1)
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native):
    pass
model.fit(x, y, epochs=3)'''


@pytest.mark.parametrize("settings, sites, changed", [
    ({"persistent_workers": True}, {"persistent_workers": "train.py:5 main"},
     ['multiprocessing_context="spawn", persistent_workers=True)']),
    ({"batch_size": 64}, {"batch_size": "train.py:6"}, ["val = DataLoader(ds, 64)"]),
    ({"val_check_interval": 40, "limit_val_batches": 0.25}, {},
     ['trainer = L.Trainer(max_steps=60, val_check_interval=40, **{**extra, "limit_val_batches": 0.25},']),
    ({"every_n_train_steps": 50}, {}, ["ckpt = ModelCheckpoint(every_n_train_steps=50)"]),
    ({"autocast": "off"}, {}, ['with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):']),
    ({"threads": 1}, {}, ["torch.set_num_threads(1)"]),
    ({"validation_freq": 4}, {}, ["model.fit(x, y, epochs=3, validation_freq=4)"]),
])
def test_change_source_writes_the_setting_on_the_programs_line(settings, sites, changed):
    new, placed, unplaced = change_source(SCRIPT, "train.py", settings, sites)
    compile(new, "train.py", "exec")
    added = [line[1:].strip() for line in unified(SCRIPT, new, "train.py").splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    assert added == changed and set(placed) == set(settings) and not unplaced


def test_change_source_says_what_it_cannot_place():
    _, placed, unplaced = change_source(SCRIPT, "train.py", {"num_workers": 1, "autocast": "bf16", "tf32": True})
    assert not placed
    assert "2 calls" in unplaced["num_workers"] and "code change" in unplaced["autocast"] and "tf32" in unplaced
    with pytest.raises(PatchError):
        change_source("def (:", "train.py", {"threads": 1})


@pytest.mark.skipif(not (shutil.which("git") and shutil.which("patch")), reason="needs git and patch")
def test_the_diff_applies_with_git_apply_and_patch_p1(tmp_path):
    for tool in ("git", "patch"):
        root = tmp_path / tool
        (root / "src").mkdir(parents=True)
        (root / "src" / "train.py").write_text(SCRIPT)  # no newline at the end: the marker must be right
        p = settings_patch([sys.executable, "src/train.py", "--epochs", "1"],
                           {"persistent_workers": True, "validation_freq": 4},
                           {"persistent_workers": "train.py:4"}, root=str(root))
        assert p.path == os.path.join("src", "train.py") and p.text.startswith("--- a/src/train.py\n+++ b/src/train.py")
        (root / "fix.diff").write_text(p.text)
        if tool == "git":
            cmd = ["git", "apply", "fix.diff"]
        else:
            cmd = ["patch", "-p1", "-i", "fix.diff"]
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
        text = (root / "src" / "train.py").read_text()
        assert "persistent_workers=True)" in text and "validation_freq=4)" in text
        assert text.count("\n") == SCRIPT.count("\n")  # nothing else changed
    with pytest.raises(PatchError, match="no Python script"):
        settings_patch(["python", "-m", "pkg"], {"threads": 1}, root=str(tmp_path))


def test_first_fix_patch_for_run_diff(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT + "\n")
    monkeypatch.chdir(tmp_path)
    rep = _report("torch", loader={"num_workers": 2, "persistent_workers": False,
                                   "created": ["train.py:4 main", "train.py:4 main"]},
                  findings=[_finding("epoch_boundary", num_workers=2, persistent_workers=False)])
    out = result.first_fix_patch(rep, ["python", "train.py"])
    assert out["finding"] == "epoch_boundary" and out["settings"] == {"persistent_workers": True}
    assert "+                   multiprocessing_context=\"spawn\", persistent_workers=True)" in out["diff"]
    rep["findings"] = [_finding("python_loop")]
    assert "code change" in result.first_fix_patch(rep, ["python", "train.py"])["error"]


def test_terminal_lists_the_fixes_that_need_code_with_their_estimates():
    import io

    from whyidle.report.tune_terminal import render

    res = {"baseline": {"samples_per_s": 100.0, "ci": None, "verdict": "host_bound"}, "trials": [], "elapsed_s": 12,
           "budget_s": 60, "tune_dir": "t", "winner": None, "batch": None, "estimates": [], "notes": [],
           "code_fixes": [{"finding": "python_loop", "severity": "critical", "title": "t", "est_speedup": 1.8,
                           "est_speedup_if_removed": 2.5, "fix": "Vectorize the loop."},
                          {"finding": "module_loop", "severity": "warning", "title": "t", "est_speedup": None,
                           "est_speedup_if_removed": None, "fix": "One call."}]}
    out = io.StringIO()
    render(res, out)
    text = " ".join(out.getvalue().split())
    assert "Not tried — the fix needs code: python_loop (critical, est. 1.80×): Vectorize the loop." in text
    assert "module_loop (warning, no estimate): One call." in text
