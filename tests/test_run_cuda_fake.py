"""`whyidle run` end to end with a fake CUDA surface on a CPU-build PyTorch.

The training script replaces ``torch.cuda.Event``, the sync debug mode functions and
``torch.cuda.synchronize`` with fakes before it trains, then starts whyidle's CUDA timeline as
the device audit would once the model is on CUDA. Fake events complete the moment they are
recorded (a GPU with no work queued), so the GPU is starved all the time and the analysis must
charge each phase's time to its cause exactly as the host spent it. The script also emits
PyTorch's sync warning from two "reads" per step, as ``.item()`` does in sync debug mode.

It also proves that the instrumentation never synchronizes: ``synchronize()`` on the fakes, or
``torch.cuda.synchronize()``, ends the script with an error.
"""

from __future__ import annotations

import os
import sys

import pytest

from conftest import finding, observe, write_script

pytestmark = pytest.mark.slow

PRE = r"""
import warnings
from whyidle.instrument import torch as wt

class FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None
    def record(self, stream=None):
        self.t = time.monotonic_ns()
    def query(self):
        return self.t is not None
    def elapsed_time(self, end):
        return (end.t - self.t) / 1e6
    def synchronize(self):
        raise SystemExit("whyidle called Event.synchronize")
    def wait(self, stream=None):
        raise SystemExit("whyidle made a stream wait")

def never_sync(*args, **kwargs):
    raise SystemExit("torch.cuda.synchronize was called")

mode = [0]
torch.cuda.Event = FakeEvent
torch.cuda.synchronize = never_sync
torch.cuda.get_sync_debug_mode = lambda: mode[0]
torch.cuda.set_sync_debug_mode = lambda m: mode.__setitem__(0, m)
torch.cuda.is_current_stream_capturing = lambda: False
wt._INSTANCE._start_gpu_timeline()
assert mode[0] == 1, "sync debug mode not turned on"

def read(t):  # what .item() does in sync debug mode: PyTorch warns from C++ after the copy
    value = t.item(); warnings.warn("called a synchronizing CUDA operation")  # one line, as in C++
    return value
"""

IN_STEP = "read(loss); read(loss); time.sleep(0.004)"


def test_fake_cuda_run_measures_idle_by_cause_and_counts_syncs(tmp_path):
    script = write_script(tmp_path / "train.py", steps=60, pre=PRE, in_step=IN_STEP)
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert "synchronizing" not in proc.stdout + proc.stderr  # consumed, never printed
    gpu = report["metrics"]["gpu"]
    assert gpu is not None and gpu["idle_method"] == "cuda_events"
    assert gpu["util_mean"] is None  # no NVML here: that part stays null, not zero
    # events complete at once: the GPU is starved for the whole step
    assert gpu["idle_share"] == pytest.approx(1.0, abs=0.02)
    by = gpu["idle_share_by_cause"]
    assert sum(by.values()) == pytest.approx(gpu["idle_share"], abs=1e-3)
    shares = report["metrics"]["shares"]
    # data waits are charged to data exactly as long as the host waited
    assert by["data"] == pytest.approx(shares["data_wait"], abs=0.02)
    # forward/backward/optimizer time is launch time here
    assert by["launch"] == pytest.approx(shares["forward"] + shares["backward"] + shares["optimizer"], abs=0.03)
    syncs = gpu["syncs"]
    assert syncs["per_step"] == pytest.approx(2.0, abs=0.05)
    site = syncs["sites"][0]
    assert os.path.basename(site["site"]).startswith("train.py:") and site["site"].endswith(" read")
    assert site["op"] == "item"
    # after each read the host sleeps 4 ms with an empty queue: that is the syncs' idle
    assert by["sync"] > 0.2
    sb = finding(report, "sync_bound")
    assert sb is not None and sb["evidence"]["sites"][0]["site"] == site["site"]
    assert report["verdict"] == "sync_bound"


def test_a_program_that_set_its_own_sync_debug_mode_is_left_alone(tmp_path):
    pre = PRE.replace("mode = [0]", "mode = [2]").replace(
        'assert mode[0] == 1, "sync debug mode not turned on"', 'assert mode[0] == 2')
    script = write_script(tmp_path / "train.py", steps=20, pre=pre, in_step="pass")
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert any("sync counting off" in n for n in report["notes"])
    assert report["metrics"]["gpu"]["syncs"]["count"] == 0


def test_cpu_run_has_null_gpu_metrics(tmp_path):
    script = write_script(tmp_path / "train.py", steps=20)
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert report["metrics"]["gpu"] is None
