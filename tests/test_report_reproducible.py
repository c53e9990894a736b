"""`whyidle report RUN_DIR` of a saved run reproduces the run's report.json, also where the
analyzing machine differs from the one that ran the job (the CPU model is recorded at run time)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from conftest import observe, write_script
from whyidle.cli import main
from whyidle.sampling import host as host_sampling

pytestmark = pytest.mark.slow


def test_saved_run_renders_the_same_report_elsewhere(tmp_path, monkeypatch):
    script = write_script(tmp_path / "train.py", steps=40)
    proc, report, run_dir = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(run_dir, "report.json")) as f:
        saved = json.load(f)
    assert saved == report and saved["device"]["name"] == host_sampling.cpu_model()
    # another machine: a different CPU, and the run directory read from another working directory
    monkeypatch.setattr(host_sampling, "cpu_model", lambda: "Some Other CPU")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "again.json"
    result = CliRunner().invoke(main, ["report", run_dir, "--json", str(out)])
    assert result.exit_code == 0, result.output
    again = json.loads(out.read_text())
    for key in ("tool_version",):
        again.pop(key, None), saved.pop(key, None)
    assert again == saved, differences(saved, again)


def differences(a, b, path="") -> list[str]:
    """The paths where two JSON values differ, with both values (the assertion's message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"[:300]]
