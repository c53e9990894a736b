"""Shared helpers: run ``whyidle`` as a user would (a subprocess) and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = os.path.join(REPO, "tests", "scenarios")

#: A tiny PyTorch training loop used by the process-level tests. ``{steps}``, ``{pre}`` and
#: ``{in_step}`` are filled in per test.
TRAIN_TEMPLATE = """
import os, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
{pre}
data = TensorDataset(torch.randn(512, 16), torch.randint(0, 2, (512,)))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while step < {steps}:
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        step += 1
        {in_step}
        if step >= {steps}:
            break
print("trained", step)
"""


def write_script(path, steps=40, pre="", in_step="pass") -> str:
    """Writes a training script from :data:`TRAIN_TEMPLATE`; returns its path."""
    code = TRAIN_TEMPLATE.format(steps=steps, pre=textwrap.dedent(pre), in_step=in_step)
    path = str(path)
    with open(path, "w") as f:
        f.write(code)
    return path


def whyidle_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "whyidle", *args]


def invoke(args) -> subprocess.CompletedProcess:
    """``whyidle ARGS`` in this process (click's ``CliRunner``: no interpreter start-up), as a
    ``CompletedProcess`` with ``returncode``, ``stdout`` and ``stderr`` (text). For commands that
    read files (``report``, ``trace``, ``compare``); ``run`` needs :func:`run_whyidle`."""
    from click.testing import CliRunner

    from whyidle.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def run_whyidle(args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """Runs ``python -m whyidle ARGS`` and returns the completed process (text mode)."""
    return subprocess.run(whyidle_cmd(*args), capture_output=True, text=True, timeout=timeout, **kwargs)


def observe(tmp_path, cmd, *options, timeout=180, name="run", html=False, **kwargs):
    """``whyidle run -q --out DIR --json FILE [--no-html] [options] -- CMD``; returns (proc, report,
    run_dir). The page (~5 MB, a second or so to render) is written only when a test asks for it
    (``html=True``); the report and timeline are the same either way."""
    run_dir = os.path.join(str(tmp_path), name)
    report_path = os.path.join(str(tmp_path), f"{name}.json")
    no_html = () if html else ("--no-html",)
    proc = run_whyidle(["run", "-q", "--out", run_dir, "--json", report_path, *no_html, *options, "--", *cmd],
                       timeout=timeout, **kwargs)
    report = None
    if os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    return proc, report, run_dir


def finding(report: dict, fid: str) -> dict | None:
    return next((f for f in report["findings"] if f["id"] == fid), None)
