"""``whyidle tune`` on fixes that are settings outside the input pipeline (issue 32 item 2), end to
end: the workers started again every epoch win with ``persistent_workers=True``, a Lightning job
validating every 10 steps wins with its evaluation frequency; each winner's ``--diff`` applies to a
copy of the script with ``git apply`` and with ``patch -p1``, and the patched copy runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import SCENARIOS, needs, run_whyidle

pytestmark = [pytest.mark.slow, pytest.mark.timing,
              pytest.mark.skipif(not (shutil.which("git") and shutil.which("patch")), reason="needs git and patch")]


def _copy(tmp_path, names) -> None:
    for name in names:
        shutil.copy(f"{SCENARIOS}/{name}", tmp_path / name)


def _apply_both(tmp_path, script: str, diff: str) -> str:
    """Applies ``diff`` to two copies of the folder's ``script``: ``git apply`` in a fresh git
    repository, ``patch -p1`` in a plain folder; both must give the same file. Returns its text."""
    texts = []
    for tool, cmd in (("git", ["git", "apply", "--whitespace=nowarn", "../fix.diff"]),
                      ("patch", ["patch", "-p1", "-i", "../fix.diff"])):
        where = tmp_path / tool
        where.mkdir()
        shutil.copy(tmp_path / script, where / script)
        (tmp_path / "fix.diff").write_text(diff)
        if tool == "git":
            subprocess.run(["git", "init", "-q"], cwd=where, check=True)
        proc = subprocess.run(cmd, cwd=where, capture_output=True, text=True)
        assert proc.returncode == 0, f"{tool}: {proc.stdout}{proc.stderr}"
        texts.append((where / script).read_text())
    assert texts[0] == texts[1]
    return texts[0]


def _rerun(tmp_path, script: str, *args) -> dict:
    """Runs the patched copy (the ``git`` one) plainly; returns its RESULT line."""
    for helper in ("common.py", "fw_meter.py"):
        shutil.copy(f"{SCENARIOS}/{helper}", tmp_path / "git" / helper)
    proc = subprocess.run([sys.executable, script, *args], cwd=tmp_path / "git", capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _tune(tmp_path, script: str, *args, budget="60") -> dict:
    proc = run_whyidle(["tune", "--budget", budget, "--out", str(tmp_path / "tune"), "--json",
                        str(tmp_path / "t.json"), "--diff", str(tmp_path / "win.diff"), "--", sys.executable, script,
                        *args], timeout=200, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / "t.json").read_text())


def test_workers_started_every_epoch_win_with_persistent_workers(tmp_path):
    _copy(tmp_path, ["respawn_workers.py", "common.py"])
    before = (tmp_path / "respawn_workers.py").read_text()
    res = _tune(tmp_path, "respawn_workers.py", "--steps", "64")
    assert res["baseline"]["verdict"] == "epoch_boundary"
    trial = next(t for t in res["trials"] if t["settings"] == {"persistent_workers": True})
    assert trial["origin"] == "epoch_boundary" and trial["predicted"] and trial["applied"] == {"persistent_workers": True}
    win = res["winner"]
    assert win and win["settings"].get("persistent_workers") is True and win["ratio"] > 1.5 and win["ci"][0] > 1.05
    assert (tmp_path / "respawn_workers.py").read_text() == before  # the user's file untouched
    diff = (tmp_path / "win.diff").read_text()
    assert diff == win["patch"]["diff"] and diff.startswith("--- a/respawn_workers.py\n+++ b/respawn_workers.py\n")
    text = _apply_both(tmp_path, "respawn_workers.py", diff)
    assert 'multiprocessing_context="spawn", persistent_workers=True)' in text
    assert _rerun(tmp_path, "respawn_workers.py", "--steps", "32")["steps"] == 32


@needs("lightning")
def test_lightning_validating_every_10_steps_wins_with_its_evaluation_frequency(tmp_path):
    _copy(tmp_path, ["lightning_eval.py", "common.py", "fw_meter.py"])
    res = _tune(tmp_path, "lightning_eval.py")
    assert res["baseline"]["verdict"] == "eval_bound"
    win = res["winner"]
    assert win and win["settings"] == {"val_check_interval": 40, "limit_val_batches": 0.25} and win["ratio"] > 1.5 and win["ci"][0] > 1.05
    assert win["patch"]["placed"] == {"val_check_interval": "lightning_eval.py:75", "limit_val_batches": "lightning_eval.py:75"}
    assert "Trainer(..., val_check_interval=40, limit_val_batches=0.25)" in win["code"]
    text = _apply_both(tmp_path, "lightning_eval.py", (tmp_path / "win.diff").read_text())
    # the program's **subset may hold limit_val_batches (its fixed variant): merged, never given twice
    assert 'val_check_interval=40, check_val_every_n_epoch=None, **{**subset, "limit_val_batches": 0.25},' in text
    assert _rerun(tmp_path, "lightning_eval.py", "--steps", "20")["steps"] >= 1
