"""`whyidle run` end to end with a fake NVIDIA driver behind the real pynvml wrappers.

The command is a real CPU-build PyTorch training script; the fake driver reports one H200 whose
utilization samples arrive while it runs. That exercises the GPU path of the whole pipeline on a
machine without a GPU: sampler → gpu.jsonl → metrics.gpu → the device and the findings a CPU-only
PyTorch build next to a visible GPU deserves.
"""

from __future__ import annotations

import pytest
import os
import sys
import threading

import pynvml

from conftest import finding, write_script
from fake_nvml import FakeDevice, FakeNvml, now_us
from whyidle.run.session import RunOptions, observe

pytestmark = pytest.mark.slow


def test_run_with_a_gpu_and_a_cpu_only_torch_build(tmp_path, monkeypatch):
    device = FakeDevice(name="NVIDIA H200", util=(30, 5))
    FakeNvml([device], cuda_driver_version=12040).install(monkeypatch)
    stop = threading.Event()

    def driver_samples():  # the driver appends a 30 % sample every 1/6 s, as a datacenter GPU does
        while not stop.wait(1 / 6):
            device.add_samples(pynvml.NVML_GPU_UTILIZATION_SAMPLES, [(now_us(), 30)])

    feeder = threading.Thread(target=driver_samples, daemon=True)
    feeder.start()
    script = write_script(tmp_path / "t.py", steps=60, in_step="time.sleep(0.02)")
    try:
        report, status, run_dir = observe([sys.executable, script],
                                          RunOptions(out=str(tmp_path / "run"), quiet=True), stream=sys.stderr)
    finally:
        stop.set()
        feeder.join()
    assert status.exit_code == 0
    assert report["device"]["kind"] == "cuda" and report["device"]["name"] == "NVIDIA H200"
    assert report["device"]["compute_capability"] == "9.0"
    gpu = report["metrics"]["gpu"]
    assert gpu["util_source"] == "samples" and gpu["util_samples"] >= 3
    assert abs(gpu["util_mean"] - 30) < 0.01
    assert gpu["memory_total_bytes"] == device.memory_total
    # CPU-only PyTorch beside a visible GPU: nothing can run on it, and that is the verdict
    assert report["verdict"] == "gpu_not_visible"
    f = finding(report, "gpu_not_visible")
    assert "CUDA 12.4" in f["summary"] and "CPU-only build" in f["summary"]
    assert finding(report, "wrong_device") is None  # said once, by the more basic finding
    with open(os.path.join(run_dir, "gpu.jsonl")) as fh:
        assert '"k":"gpu_util"' in fh.read()


def test_observe_leaves_the_callers_signal_handlers_as_they_were(tmp_path):
    """observe() is used in-process (the demo runs it twice): a handler left behind would be
    inherited by later commands (an ignored SIGINT survives exec) and break their Ctrl-C."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    _report, status, _dir = observe([sys.executable, "-c", "pass"], RunOptions(out=str(tmp_path / "r"), quiet=True))
    assert status.exit_code == 0
    assert {s: signal.getsignal(s) for s in before} == before
