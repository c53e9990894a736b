"""Shared helpers: run ``whyidle`` as a user would (a subprocess) and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = os.path.join(REPO, "tests", "scenarios")


def needs(module: str):
    """A skip mark for tests whose programs need ``module`` installed, found without importing it
    (``pytest.importorskip`` at module level imported Lightning or TensorFlow, 7-11 s each, in
    every process that collected the module, even in sessions that ran none of its tests)."""
    import importlib.util

    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


def pytest_collection_modifyitems(config, items):
    """Tests that start real processes (``slow``) run first, in their collected order: under
    ``-n 3`` the long ones start early and the short in-process ones even out the workers at the
    end, instead of a 40-second test starting last beside an idle worker.

    A ``timing`` test that fails runs once more (pytest-rerunfailures; the report shows an ``R``
    and the first failure): its assertions compare speeds measured on a shared 2-core machine,
    where another tenant's burst can slow one of its runs (seen in CI: the demo's fixed run at
    1.06x the faulty one, 1.8x on every rerun). A real fault fails both runs."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if item.get_closest_marker("timing") is not None and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(reruns=1))


def pytest_ignore_collect(collection_path, config):
    """A ``-m timing`` session imports only the test modules that hold a timing test: the others'
    imports (TensorFlow for the in-process tf.data tests) cost the session without a test to run.
    A module holds one when its source marks one (``pytest.mark.timing``)."""
    if config.getoption("markexpr") != "timing" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "mark.timing" not in collection_path.read_text(encoding="utf-8")


def pytest_configure(config):
    """Bytecode is cached for the repo's own modules, which every test process imports.

    The suite starts a few hundred processes (``whyidle run``, the instrumented training scripts,
    framework probes) that import whyidle from the editable install. Under
    ``PYTHONDONTWRITEBYTECODE=1`` (set on the CI machines) Python never caches that bytecode, so
    each process compiled ~100 modules from source (~0.5 s per ``whyidle run`` on 2 cores), and
    pytest re-did its assertion rewriting of every test module in every session and xdist worker
    (~5 s each). The session byte-compiles ``src/`` and ``tests/`` once (reading an existing
    ``.pyc`` is allowed under that variable; only writing at import is off) and lets pytest cache
    its rewritten test modules. The processes the tests start keep the variable as they got it.
    """
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):
        return
    import compileall

    for path in (os.path.join(REPO, "src"), os.path.join(REPO, "tests")):
        compileall.compile_dir(path, quiet=2, workers=1)


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
