"""``whyidle tune`` end to end: real trials of real training scripts, as a user runs it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import SCENARIOS, needs, observe, run_whyidle, whyidle_cmd

#: A loader whose samples wait on I/O (a sleep, as a network read would): worker processes overlap
#: the waits, so any worker count beats the main process by far, on any machine. The script also
#: saves a "checkpoint" in its working directory every 50 steps, as training scripts do, and appends
#: to a log file there.
SLEEPY = """\
import time, torch
from torch.utils.data import DataLoader, Dataset

class Reads(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep({sleep})
        return torch.randn(16), i % 2

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Reads(), batch_size=16, shuffle=True)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        torch.save(model.state_dict(), "ckpt.pt")
        with open("progress.log", "a") as f:
            f.write(f"{{step}}\\n")
"""


def _script(tmp_path, sleep=0.001) -> str:
    path = tmp_path / "sleepy.py"
    path.write_text(SLEEPY.format(sleep=sleep))
    return str(path)


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.slow
@pytest.mark.timing
def test_tune_finds_and_proves_the_worker_fix(tmp_path):
    script = _script(tmp_path)
    before = _digest(script)
    (tmp_path / "ckpt.pt").write_bytes(b"the user's own checkpoint")
    (tmp_path / "progress.log").write_text("")
    out = tmp_path / "tune"
    t0 = time.monotonic()
    proc = run_whyidle(["tune", "--budget", "50", "--trial-seconds", "10", "--out", str(out), "--json",
                        str(tmp_path / "t.json"), "--", sys.executable, script], timeout=200, cwd=str(tmp_path))
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "t.json").read_text())
    assert res["schema"] == "whyidle.tune/1" and res["baseline"]["status"] == "ok"
    assert res["baseline"]["verdict"] == "input_bound"
    win = res["winner"]
    assert win and win["settings"]["num_workers"] >= 1 and win["ratio"] > 1.5 and win["ci"][0] > 1.05
    assert "num_workers=" in win["code"] and "sleepy.py:14" in win["code"]
    first = res["trials"][0]
    assert first["applied"].get("num_workers") is True and first["claim"] == "faster"
    assert all(t["status"] in ("ok", "skipped") for t in res["trials"])
    # the estimate of the fix it printed is checked against the trial that applied it
    assert any(e["finding"] == "input_bound" and e["measured"] > 1 for e in res["estimates"])
    assert res["elapsed_s"] <= 50 + 10 and wall < 50 + 40  # the budget, its last trial's stop and report
    assert _digest(script) == before  # the program is unchanged on disk
    # its checkpoint went to each trial's folder, the user's own is untouched; a plain write is named
    assert (tmp_path / "ckpt.pt").read_bytes() == b"the user's own checkpoint"
    assert (out / "00-baseline" / "outputs" / "ckpt.pt").exists()
    assert all(t["outputs_redirected"] == ["ckpt.pt"] for t in res["trials"] if t["status"] == "ok")
    assert res["outputs_changed"]["the baseline"]["modified"] == ["progress.log"]
    assert any("progress.log" in n and "changed during it" in n for n in res["notes"])
    assert (out / "tune.html").exists() and (out / "tune.json").exists()
    assert "Best: " in proc.stdout and "The change to make" in proc.stdout
    # every trial is an ordinary run directory: whyidle report and compare read them
    trial_dirs = sorted(p for p in os.listdir(out) if (out / p).is_dir())
    assert trial_dirs[0] == "00-baseline" and len(trial_dirs) >= 3
    assert json.loads((out / "00-baseline" / "meta.json").read_text())["stopped"].startswith(("measured", "time"))


@pytest.mark.slow
def test_ctrl_c_stops_the_trial_and_prints_the_results_so_far(tmp_path):
    script = _script(tmp_path, sleep=0.002)
    out = tmp_path / "tune"
    proc = subprocess.Popen(whyidle_cmd("tune", "--budget", "120", "--trial-seconds", "10", "--out", str(out), "--",
                                        sys.executable, script),
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while not list(out.glob("01-*")) and time.monotonic() < deadline:  # the first trial after the baseline
        time.sleep(0.5)
    time.sleep(4)  # the second trial's program is running
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr  # the program's own KeyboardInterrupt went to its trial's output.log
    res = json.loads((out / "tune.json").read_text())
    assert res["interrupted"] is True and res["baseline"]["status"] == "ok"
    assert "whyidle tune" in stdout and "Interrupted" in stdout
    assert not any(t["status"] == "ok" and t["ratio"] is None for t in res["trials"])


def test_bad_tune_arguments_get_one_line():
    for args, text in ((["tune", "--try", "workers=2", "--", "python", "x.py"], "expected NAME=V1"),
                       (["tune", "--try", "num_workers=two", "--", "python", "x.py"], "not a valid value"),
                       (["tune"], "no command given"),
                       (["tune", "--", "no-such-command-xyz"], "command not found")):
        proc = run_whyidle(args, timeout=60)
        assert proc.returncode in (2, 127) and text in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@needs("tensorflow")
def test_tfdata_and_fit_settings_apply_in_a_keras_program(tmp_path):
    """The tf.data trial settings of the c03 scenario (a sequential map, no prefetch) take effect
    inside the unchanged program, and are recorded where they applied."""
    env = dict(os.environ, WHYIDLE_OVERRIDES=json.dumps({"tfdata_parallel_map": True, "tfdata_prefetch": True,
                                                          "batch_size": 16}))
    proc, report, _ = observe(tmp_path, [sys.executable, os.path.join(SCENARIOS, "c03_tfdata_sequential_map.py"),
                                         "--steps", "12"], env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = {o["name"]: o for o in report["overrides"]}
    assert got["tfdata_parallel_map"]["applied"] and got["tfdata_parallel_map"]["site"].startswith("c03_")
    assert got["tfdata_prefetch"]["applied"] and got["batch_size"]["applied"] and got["batch_size"]["was"] == 32
    stages = report["keras"]["pipeline"]
    assert any(s["op"] == "map" and s["parallel"] == -1 for s in stages)
    assert report["metrics"]["batch_size"] == 16


FINITE = """\
import time, torch
from torch.utils.data import DataLoader, Dataset
from whyidle import log_metric

class Reads(Dataset):
    def __len__(self):
        return 6400

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.randn(16), i % 2

model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Reads(), batch_size=16, shuffle=True):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
log_metric("val_accuracy", 0.5, n=1000)
"""


@pytest.mark.slow
def test_validate_runs_baseline_and_winner_to_the_end(tmp_path):
    script = tmp_path / "finite.py"
    script.write_text(FINITE)
    out = tmp_path / "tune"
    proc = run_whyidle(["tune", "--budget", "40", "--trial-seconds", "6", "--validate", "--out", str(out), "--json",
                        "-", "--", sys.executable, str(script)], timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert res["winner"] is not None, [(t["label"], t["status"], t["ratio"], t["ratio_ci"]) for t in res["trials"]]
    val = res["validation"]
    assert val["status"] == "ok" and set(val["runs"]) == {"baseline", "winner"}
    metric = val["comparison"]["comparisons"][0]["metrics"][0]
    assert metric["name"] == "val_accuracy" and metric["unchanged"]
    for key in ("baseline", "winner"):  # run to the command's end, not stopped
        meta = json.loads((out / os.path.basename(val["runs"][key]) / "meta.json").read_text())
        assert "stopped" not in meta and meta["exit_code"] == 0


#: A loader doing per-field Python work in the training process (~3 ms a batch) beside a tiny
#: model (one intra-op thread, so the step is the loader's): the ceiling with the loader out of
#: the step is several times the baseline.
PARSED = """\
import torch
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)

class Parsed(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        row = [float((i * 7 + k) % 13) for k in range(3000)]  # per-field Python conversion
        return torch.tensor(row[:16]), i % 2

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Parsed(), batch_size=16, shuffle=True)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.slow
@pytest.mark.timing
def test_tune_measures_the_input_ceiling_by_replaying_batches(tmp_path):
    script = tmp_path / "parsed.py"
    script.write_text(PARSED)
    proc = run_whyidle(["tune", "--budget", "45", "--trial-seconds", "8", "--out", str(tmp_path / "tune"), "--json",
                        str(tmp_path / "t.json"), "--", sys.executable, str(script)], timeout=200, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "t.json").read_text())
    assert res["baseline"]["verdict"] == "input_bound"
    ceiling = res["input_ceiling"]
    trial = next(t for t in res["trials"] if t["origin"] == "ceiling")
    assert trial["settings"] == {"replay": 16} and trial["applied"] == {"replay": True}
    assert ceiling["status"] == "ok" and ceiling["ratio"] > 1.5 and ceiling["predicted"] > 1.5
    # the loader is out of the step (a replayed __next__ still costs ~0.1 ms beside a 0.2 ms step)
    assert trial["data_wait_share"] < res["baseline"]["data_wait_share"] - 0.3
    assert res["winner"] is None or res["winner"]["settings"] != {"replay": 16}  # a measurement, never a fix
    assert all(f["of_ceiling"] is None or f["of_ceiling"] < 1.5 for f in ceiling["fixes"])
    assert "Input ceiling (the DataLoader out of the step" in proc.stdout
