"""`whyidle run` on a real CUDA GPU (marked ``gpu``; skipped unless PyTorch can use CUDA).

Run on a GPU machine with ``python -m pytest -m gpu`` (benchmarks/gpu_check.sh does). What only a
real GPU can prove:

- the instrumentation adds no synchronization: a loop that runs with PyTorch's sync debug mode
  set to ``"error"`` (any sync raises) trains to the end under whyidle, with the CUDA timeline
  measuring GPU starvation all the while;
- C09 (cases.md): three host reads per step are measured as three syncs per step at the right
  lines, and ``sync_bound`` reports them; the fixed variant syncs every 25 steps only;
- C23: a model left on the CPU while the batches go to the GPU is the critical ``wrong_device``;
- C21: batches copied from pageable memory are ``pageable_transfers`` with the bytes per step;
  pinned ``non_blocking`` copies are not.
"""

from __future__ import annotations

import os
import sys

import pytest

from conftest import SCENARIOS, finding, observe
from test_scenarios_gpu_cases import lines_of, site_line

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU usable by PyTorch")]

TIMEOUT = 240


def run(tmp_path, script_args, name):
    proc, report, _ = observe(tmp_path, [sys.executable, *script_args], timeout=TIMEOUT, name=name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None, proc.stderr[-3000:]
    assert report["device"]["kind"] == "cuda", report["device"]
    return proc, report


def scenario(tmp_path, script, *args):
    name = os.path.splitext(script)[0] + "".join(a.strip("-") for a in args)[:40]
    return run(tmp_path, [os.path.join(SCENARIOS, script), "--device", "cuda", *args], name)[1]


# -- (a) whyidle adds no sync ---------------------------------------------------------------------

NO_SYNC_SCRIPT = r'''
import sys, time
sys.path.insert(0, {scenarios!r})
import torch
import torch.nn.functional as F
from common import SCNN

STEPS = 60
torch.manual_seed(0)
dev = torch.device("cuda")
model = SCNN().to(dev)                      # set-up copies happen before the debug mode is set
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(8 * 64, 3, 32, 32, device=dev)
labels = torch.randint(0, 10, (8 * 64,), device=dev)
torch.cuda.synchronize()

# From here any synchronizing CUDA operation raises. The loop itself makes none (batches are
# slices of GPU tensors, no value is read), so an error can only come from the instrumentation.
torch.cuda.set_sync_debug_mode("error")
for step in range(STEPS):
    i = (step % 8) * 64
    x, y = images[i:i + 64], labels[i:i + 64]
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    time.sleep(0.002)                       # host work between steps: the GPU idles here
torch.cuda.set_sync_debug_mode(0)
torch.cuda.synchronize()
print("trained", STEPS, "steps with sync debug mode 'error'")
'''


def test_instrumentation_adds_no_sync(tmp_path):
    import subprocess

    script = tmp_path / "no_sync.py"
    script.write_text(NO_SYNC_SCRIPT.format(scenarios=SCENARIOS))
    # the loop is sync-free by itself (else a failure below would not be whyidle's)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT)
    assert plain.returncode == 0, plain.stderr[-3000:]

    proc, report = run(tmp_path, [str(script)], "no_sync")
    assert "trained 60 steps" in proc.stdout
    notes = " ".join(report["notes"])
    # the error (or warning) PyTorch raises at a sync under the debug mode; its own UserWarning when the
    # mode is set ("... does not yet detect all synchronizing operations", torch 2.11 on an H200) is not one
    assert "called a synchronizing" not in proc.stderr + notes, proc.stderr[-3000:]
    assert "disabled" not in notes, notes  # no part of the instrumentation hit an error
    assert "sync counting off" in notes  # the program's own debug mode wins: the watch steps aside
    assert report["metrics"]["steps"] == 60
    gpu = report["metrics"]["gpu"]
    assert gpu is not None and gpu["idle_method"] == "cuda_events"
    assert gpu["idle_share"] is not None and 0.0 < gpu["idle_share"] <= 1.0
    assert gpu["idle_s_by_cause"]["host"] > 0  # the 2 ms sleep after each step
    assert not (gpu["syncs"] or {}).get("count")


# -- (b) C09: three syncs per step ----------------------------------------------------------------

C09 = "c09_item_sync.py"
C09_READS = ("loss_v = loss.item()", "acc_v = acc.item()", "summary = logits.detach().mean(0).cpu().numpy()")


def test_c09_syncs_every_step_on_cuda(tmp_path):
    faulty = scenario(tmp_path, C09, "--variant", "faulty")
    gpu = faulty["metrics"]["gpu"]
    assert gpu is not None and gpu["syncs"] is not None, gpu
    syncs = gpu["syncs"]
    assert syncs["per_step"] == pytest.approx(3.0, abs=0.3), syncs  # measured by the sync watch
    top = {site_line(s["site"], C09) for s in syncs["sites"] if (s["per_step"] or 0) >= 0.5}
    assert top == set(lines_of(C09, *C09_READS)), syncs["sites"]

    f = finding(faulty, "sync_bound")
    assert f is not None, {"verdict": faulty["verdict"], "findings": [x["id"] for x in faulty["findings"]],
                           "idle_share": gpu["idle_share"], "idle_s_by_cause": gpu["idle_s_by_cause"],
                           "syncs_idle_s": syncs["idle_s"]}
    assert f["severity"] in ("warning", "critical")
    assert f["evidence"]["per_step"] == pytest.approx(3.0, abs=0.3)
    assert f["est_speedup"] is not None and f["est_speedup"] > 1.0

    fixed = scenario(tmp_path, C09, "--variant", "fixed")
    fsyncs = (fixed["metrics"]["gpu"] or {}).get("syncs") or {}
    assert (fsyncs.get("per_step") or 0.0) <= 0.3, fsyncs  # 3 reads every 25 steps: 0.12
    assert finding(fixed, "sync_bound") is None or finding(fixed, "sync_bound")["severity"] == "info"


# -- (c) C23: the model stays on the CPU ----------------------------------------------------------

def test_c23_model_on_cpu_is_critical_wrong_device(tmp_path):
    report = scenario(tmp_path, "c23_model_on_cpu.py", "--variant", "faulty")
    assert report["verdict"] == "wrong_device"
    f = finding(report, "wrong_device")
    assert f["severity"] == "critical"
    assert set(f["evidence"]["params"]) == {"cpu"}
    assert "cuda" in f["evidence"]["inputs"]  # the batch reached the model's wrapper on the GPU
    assert not any(x["evidence"].get("kind") == "model_not_moved" for x in report["findings"] if x["id"] == "wrong_device")
    gpu = report["metrics"]["gpu"]
    assert gpu is not None  # NVML sees the GPU
    if gpu.get("util_mean") is not None:
        assert gpu["util_mean"] < 30  # cases.md: GPU util ~0 % (the CPU does the compute)


# -- (d) C21: pageable vs pinned copies -----------------------------------------------------------

def test_c21_pageable_copies_on_cuda(tmp_path):
    faulty = scenario(tmp_path, "c21_pageable_copy.py", "--variant", "faulty")
    f = finding(faulty, "pageable_transfers")
    assert f is not None, [x["id"] for x in faulty["findings"]]
    # batch 32 of float32 3x32x32 plus 32 int64 labels, every step
    assert f["evidence"]["pageable_bytes_per_step"] == 32 * 3 * 32 * 32 * 4 + 32 * 8
    assert f["evidence"]["pin_memory"] is False
    assert f["evidence"]["pageable_host_s_per_step"] > 0
    fixed = scenario(tmp_path, "c21_pageable_copy.py", "--variant", "fixed")
    assert finding(fixed, "pageable_transfers") is None
