"""GPU field cases C09, C21 and C23 (../shared/cases.md) under `whyidle run` on a CPU-only box.

The scripts (tests/scenarios/c09_item_sync.py, c21_pageable_copy.py, c23_model_on_cpu.py) pick
CUDA when PyTorch can use it, so here they run on the CPU (``--device cpu`` makes that explicit).
What a CPU run can show is what the same script would do on a GPU: the host reads per step
(C09), that nothing is copied to an accelerator (C21), and a model that is never moved to the
device its batches go to (C23). tests/test_gpu_real.py runs the same scripts on a real GPU.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import SCENARIOS, finding, observe

pytestmark = pytest.mark.slow  # counts and configuration, no speeds: may run beside other tests


def scenario(tmp_path, script, *args, timeout=240, pick_device=False):
    """Runs a scenario under whyidle on the CPU: ``--device cpu``, or with ``pick_device`` the
    script's own ``"cuda" if torch.cuda.is_available() else "cpu"`` (which resolves to the CPU here)."""
    name = os.path.splitext(script)[0] + "".join(a.strip("-") for a in args)[:40]
    device = [] if pick_device else ["--device", "cpu"]
    proc, report, _ = observe(tmp_path, [sys.executable, os.path.join(SCENARIOS, script), *device, *args],
                              timeout=timeout, name=name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None, proc.stderr[-3000:]
    assert report["device"]["kind"] == "cpu"
    assert report["metrics"]["gpu"] is None  # no GPU observed: null, never zeros
    return report


def lines_of(script: str, *needles: str) -> list[int]:
    """Line numbers (1-based) of the first code line starting with each needle, in the scenario's source."""
    with open(os.path.join(SCENARIOS, script)) as f:
        src = f.read().splitlines()
    return [next(i for i, line in enumerate(src, 1) if line.strip().startswith(needle)) for needle in needles]


def site_line(site: str | None, script: str) -> int | None:
    """``"…/script.py:72 func"`` → 72 (None for another file)."""
    m = re.search(re.escape(script) + r":(\d+)\b", site or "")
    return int(m.group(1)) if m else None


# -- C09: .item() / .cpu().numpy() every step ------------------------------------------------------

C09 = "c09_item_sync.py"
C09_READS = ("loss_v = loss.item()", "acc_v = acc.item()", "summary = logits.detach().mean(0).cpu().numpy()")


def assert_c09_reads(report):
    f = finding(report, "sync_bound")
    assert f is not None, [x["id"] for x in report["findings"]]
    # CPU-only run: host reads that would be syncs on a GPU, reported as info (no speed-up claim)
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert report["verdict"] != "sync_bound"
    ev = f["evidence"]
    assert ev["per_step"] == pytest.approx(3.0, abs=0.1)  # measured 3.0
    # the three read lines, x.cpu().numpy() counted once
    expected = dict(zip(lines_of(C09, *C09_READS), ("item", "item", "cpu+numpy")))
    got = {site_line(s["site"], C09): s["op"] for s in ev["sites"]}
    assert got == expected, ev["sites"]
    assert all(s["per_step"] == pytest.approx(1.0, abs=0.05) for s in ev["sites"])
    assert "read_every_step" in f["summary"]


def test_c09_host_reads_every_step(tmp_path):
    faulty = scenario(tmp_path, C09, "--variant", "faulty")
    assert_c09_reads(faulty)
    fixed = scenario(tmp_path, C09, "--variant", "fixed")
    f = finding(fixed, "sync_bound")
    assert f is None or f["evidence"]["per_step"] <= 0.2  # 3 reads every 25 steps


def test_c09_reads_after_optimizer_step_are_counted_per_step(tmp_path):
    # the same three reads placed after optimizer.step(), where most loops log: still 3 per step
    # (a step ends at optimizer.step(), so these reads fall in the next step's audit)
    assert_c09_reads(scenario(tmp_path, C09, "--variant", "faulty", "--read-at", "step"))


# -- C21: pageable host→device copies --------------------------------------------------------------

C21 = "c21_pageable_copy.py"


@pytest.mark.parametrize("variant", ["faulty", "fixed"])
def test_c21_on_a_cpu_box_reports_the_configuration_only(tmp_path, variant):
    # device resolves to "cpu": .to(device) copies nothing, so no pageable-copy finding; but the
    # script asks for CUDA, so its pin_memory=False + blocking .to(device) is reported as the
    # configuration it would be on a GPU (cases.md C21, "CPU-side check")
    report = scenario(tmp_path, C21, "--variant", variant, pick_device=True)
    assert finding(report, "pageable_transfers") is None
    assert finding(report, "wrong_device") is None  # the model is moved with model.to(device)
    config = finding(report, "input_pipeline_config")
    smells = [s for s in (config or {"evidence": {"smells": []}})["evidence"]["smells"] if "pin_memory" in s]
    if variant == "faulty":
        assert len(smells) == 1 and "blocking .to(device)" in smells[0], config
        [move] = lines_of(C21, "x = x.to(device)")
        assert f"c21_pageable_copy.py:{move} " in smells[0]
    else:
        assert smells == []
    assert report["verdict"] not in ("pageable_transfers", "wrong_device")


# -- C23: model never moved --------------------------------------------------------------------------

C23 = "c23_model_on_cpu.py"


def test_c23_model_never_moved(tmp_path):
    faulty = scenario(tmp_path, C23, "--variant", "faulty")
    f = finding(faulty, "wrong_device")
    assert f is not None, [x["id"] for x in faulty["findings"]]
    ev = f["evidence"]
    assert ev["kind"] == "model_not_moved"
    # no GPU here: an info finding about the script (a move inside `if torch.cuda.is_available():`
    # cannot be seen on a CPU box), not the verdict-forcing critical placement finding
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert faulty["verdict"] != "wrong_device"
    assert set(ev["params"]) == {"cpu"} and ev["params"]["cpu"] == 24_234  # the S-CNN
    assert ev["module_moves"] == []
    [loop_move] = lines_of(C23, "x, y = x.to(device), y.to(device)")
    assert site_line(ev["batch_moves"][0]["site"], C23) == loop_move
    [query] = lines_of(C23, 'device = "cuda" if torch.cuda.is_available() else "cpu"')
    assert ev["cuda_queries"][0]["result"] is False
    assert site_line(ev["cuda_queries"][0]["site"], C23) == query
    assert "24,234 parameters" in f["summary"] and "torch.cuda.is_available()" in f["summary"]

    fixed = scenario(tmp_path, C23, "--variant", "fixed")
    assert finding(fixed, "wrong_device") is None, finding(fixed, "wrong_device")
