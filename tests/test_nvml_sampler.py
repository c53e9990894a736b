"""The NVML sampler, run through the real pynvml wrappers against a fake driver (fake_nvml.py)."""

from __future__ import annotations

import ctypes
import json
import time

import pynvml
import pytest

from whyidle.analysis.gpu import gpu_metrics
from whyidle.sampling.nvml import GpuPoller, detect_ts_domain, open_gpu_poller

try:
    from fake_nvml import FakeDevice, FakeNvml, now_us
except ImportError:  # tests/ became a package
    from tests.fake_nvml import FakeDevice, FakeNvml, now_us

GPU = pynvml.NVML_GPU_UTILIZATION_SAMPLES
MEM = pynvml.NVML_MEMORY_UTILIZATION_SAMPLES
# Tolerance for converting NVML µs to monotonic ns: the test and the poller read the clocks at
# slightly different instants.
CLOCK_SLACK_NS = 50_000_000
needs_boottime = pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux clock")


def _open(monkeypatch, devices=None, **kwargs) -> tuple[FakeNvml, GpuPoller]:
    fake = FakeNvml(devices, **kwargs).install(monkeypatch)
    poller, reason = open_gpu_poller(period_s=0.5)
    assert reason is None and poller is not None
    return fake, poller


def _of(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["k"] == kind]


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


# -- opening -------------------------------------------------------------------------------------

@pytest.mark.skipif(_nvml_library_present(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_driver_returns_reason(monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlLib", None)  # as on a fresh import: nothing loaded yet
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert open_gpu_poller() == (None, "NVML not available: NVML Shared Library Not Found")


def test_library_not_found(monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    assert open_gpu_poller() == (None, "NVML not available: NVML Shared Library Not Found")


def test_driver_not_loaded(monkeypatch):
    FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    assert open_gpu_poller() == (None, "NVML not available: Driver Not Loaded")


def test_no_device_shuts_nvml_down(monkeypatch):
    fake = FakeNvml([]).install(monkeypatch)
    assert open_gpu_poller() == (None, "no NVIDIA GPU found")
    assert fake.calls["nvmlShutdown"] == 1 and fake.initialized == 0


def test_no_accessible_device(monkeypatch):
    FakeNvml([FakeDevice(), FakeDevice()], unsupported=("nvmlDeviceGetHandleByIndex_v2",)).install(
        monkeypatch)
    assert open_gpu_poller() == (None, "no accessible NVIDIA GPU (2 found)")


def test_unexpected_exception_is_a_reason(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    assert open_gpu_poller() == (None, "NVML not available: RuntimeError: boom")


# -- static info ---------------------------------------------------------------------------------

def test_static_info(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    devices = [FakeDevice(name="NVIDIA H200", uuid="GPU-aaa", memory_total=150_000_000_000,
                          compute_capability=(9, 0)),
               FakeDevice(name="NVIDIA A100-SXM4-80GB", uuid="GPU-bbb", memory_total=80_000_000_000,
                          compute_capability=(8, 0), gpm_supported=False)]
    fake, poller = _open(monkeypatch, devices, driver_version="560.35.03", cuda_driver_version=12060)
    assert poller.name == "gpu" and poller.period_s == 0.5
    [static] = poller.start(123)
    assert static == {
        "k": "gpu_static", "t": 123, "ts_domain": "epoch", "cuda_visible_devices": "1",
        "devices": [
            {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaa",
             "memory_total_bytes": 150_000_000_000, "compute_capability": [9, 0],
             "driver_version": "560.35.03", "cuda_driver_version": "12.6", "gpm_supported": True},
            {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-bbb",
             "memory_total_bytes": 80_000_000_000, "compute_capability": [8, 0],
             "driver_version": "560.35.03", "cuda_driver_version": "12.6", "gpm_supported": False},
        ]}
    assert fake.calls["nvmlInitWithFlags"] == 1
    json.dumps(static)


def test_static_info_with_missing_functions(monkeypatch):
    fake, poller = _open(monkeypatch, missing=("nvmlGpmQueryDeviceSupport",),
                         unsupported=("nvmlDeviceGetCudaComputeCapability",))
    [static] = poller.start(0)
    dev = static["devices"][0]
    assert dev["gpm_supported"] is False and dev["compute_capability"] is None
    assert dev["name"] == "NVIDIA H200"
    assert fake.lookups["nvmlGpmQueryDeviceSupport"] == 1
    assert _of(poller.poll(1), "gpu_notice") == []  # static nulls are not news


# -- sample buffers ------------------------------------------------------------------------------

def test_samples_are_drained_incrementally(monkeypatch):
    dev = FakeDevice()
    fake, poller = _open(monkeypatch, [dev])
    t = now_us() - 5_000_000
    history = [(t + i * 100_000, 7) for i in range(10)]  # before the run: not emitted
    dev.add_samples(GPU, history)
    dev.add_samples(MEM, [(t, 3)])
    poller.start(0)

    n = now_us()
    new = [(n - 300_000, 100), (n - 200_000, 0), (n - 100_000, 100)]
    dev.add_samples(GPU, new)
    mono = time.monotonic_ns()
    records = poller.poll(mono)

    [util] = _of(records, "gpu_util")  # no new MEM samples: NOT_FOUND, no record
    assert (util["k"], util["t"], util["dev"], util["type"]) == ("gpu_util", mono, 0, "gpu")
    assert [(s[2], s[1]) for s in util["samples"]] == new
    for (t_ns, _, ts), (ts_exp, _) in zip(util["samples"], new):
        expected = mono - (n - ts_exp) * 1000
        assert abs(t_ns - expected) < CLOCK_SLACK_NS
    assert util["samples"][1][0] - util["samples"][0][0] == 100_000_000  # spacing kept exactly

    # lastSeen passed back is the newest NVML timestamp (NVML's clock, never a host clock).
    gpu_queries = [q for q in fake.sample_queries if q[1] == GPU]
    assert [q[2] for q in gpu_queries] == [0, 0, history[-1][0], history[-1][0]]

    assert _of(poller.poll(mono + 1), "gpu_util") == []  # empty since lastSeen: NOT_FOUND
    assert [q[2] for q in fake.sample_queries if q[1] == GPU][-1] == new[-1][0]

    dev.add_samples(GPU, [(n + 67_000, 50)])
    [util] = _of(poller.poll(mono + 2), "gpu_util")
    assert [s[1:] for s in util["samples"]] == [[50, n + 67_000]]


def test_empty_buffer_when_idle(monkeypatch):
    fake, poller = _open(monkeypatch)
    poller.start(0)
    records = poller.poll(5)
    assert _of(records, "gpu_util") == [] and _of(records, "gpu_notice") == []
    assert len(_of(records, "gpu_state")) == 1
    # NOT_FOUND on pynvml's first (size) call: one call per type per tick
    assert fake.calls["nvmlDeviceGetSamples"] == 4


def test_samples_arriving_between_count_and_fetch(monkeypatch):
    dev = FakeDevice()
    fake, poller = _open(monkeypatch, [dev])
    poller.start(0)
    n = now_us()
    dev.add_samples(GPU, [(n - 200_000, 10)])
    real = fake._nvmlDeviceGetSamples

    def racing(handle, stype, last, vtype, count, buf):
        ret = real(handle, stype, last, vtype, count, buf)
        if buf is None and stype.value == GPU and len(dev.samples[GPU]) == 1:
            dev.add_samples(GPU, [(n - 100_000, 20)])  # the driver took a sample meanwhile
        return ret

    monkeypatch.setattr(fake, "_nvmlDeviceGetSamples", racing)
    records = poller.poll(1)
    assert _of(records, "gpu_util") == [] and _of(records, "gpu_notice") == []
    [util] = _of(poller.poll(2), "gpu_util")
    assert [s[1] for s in util["samples"]] == [10, 20]


@needs_boottime
def test_boottime_domain_detected_at_start(monkeypatch):
    dev = FakeDevice()
    dev.add_samples(GPU, [(now_us("boottime") - 400_000, 5)])
    fake, poller = _open(monkeypatch, [dev])
    [static] = poller.start(0)
    assert static["ts_domain"] == "boottime"
    n = now_us("boottime")
    dev.add_samples(GPU, [(n - 250_000, 60)])
    mono = time.monotonic_ns()
    records = poller.poll(mono)
    assert _of(records, "gpu_notice") == []
    [util] = _of(records, "gpu_util")
    assert abs(util["samples"][0][0] - (mono - 250_000_000)) < CLOCK_SLACK_NS
    assert util["samples"][0][2] == n - 250_000


@needs_boottime
def test_domain_switch_is_noticed_and_converted(monkeypatch):
    dev = FakeDevice()
    fake, poller = _open(monkeypatch, [dev])
    assert poller.start(0)[0]["ts_domain"] == "epoch"  # no sample yet: the default
    n = now_us("boottime")
    dev.add_samples(GPU, [(n - 100_000, 1)])
    mono = time.monotonic_ns()
    records = poller.poll(mono)
    assert [r["msg"] for r in _of(records, "gpu_notice")] == [
        "NVML sample timestamps are in the boottime clock, not epoch"]
    assert poller.ts_domain == "boottime"
    [util] = _of(records, "gpu_util")
    assert abs(util["samples"][0][0] - (mono - 100_000_000)) < CLOCK_SLACK_NS


def test_detect_ts_domain():
    now = {"epoch": 1_764_000_000_000_000, "boottime": 90_000_000_000}
    assert detect_ts_domain(now["epoch"] - 200_000, now) == "epoch"
    assert detect_ts_domain(now["boottime"] - 200_000, now) == "boottime"
    # a stale buffer (60 s old) or a slightly skewed one: the nearest clock
    assert detect_ts_domain(now["boottime"] - 60_000_000, now) == "boottime"
    assert detect_ts_domain(now["epoch"] + 1_000, now) == "epoch"
    assert detect_ts_domain(now["epoch"] - 200_000, {"epoch": now["epoch"]}) == "epoch"


# -- per-tick state and unavailable functions ----------------------------------------------------

def test_state_record(monkeypatch):
    dev = FakeDevice(memory_total=80_000_000_000, memory_used=12_345_678_912, sm_clock_mhz=1410,
                     power_mw=301_250, clocks_event_reasons=0x4 | 0x1, util=(87, 33))
    fake, poller = _open(monkeypatch, [dev, FakeDevice(util=(5, 1))])
    poller.start(0)
    states = _of(poller.poll(42), "gpu_state")
    assert states[0] == {
        "k": "gpu_state", "t": 42, "dev": 0, "mem_used_bytes": 12_345_678_912,
        "mem_total_bytes": 80_000_000_000, "sm_clock_mhz": 1410, "power_w": 301.25,
        "clocks_event_reasons": 0x5, "util_pct": 87, "mem_util_pct": 33}
    assert (states[1]["dev"], states[1]["util_pct"], states[1]["mem_util_pct"]) == (1, 5, 1)
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 4 and fake.calls["nvmlDeviceGetMemoryInfo"] == 0


def test_unsupported_function_gives_none_and_is_not_called_again(monkeypatch):
    fake, poller = _open(monkeypatch, unsupported=("nvmlDeviceGetPowerUsage",
                                                   "nvmlDeviceGetCurrentClocksEventReasons"))
    poller.start(0)
    first, second = poller.poll(1), poller.poll(2)
    for records in (first, second):
        [state] = _of(records, "gpu_state")
        assert state["power_w"] is None and state["clocks_event_reasons"] is None
        assert state["sm_clock_mhz"] == 1980
    assert [r["msg"] for r in _of(first, "gpu_notice")] == [
        "GPU 0: nvmlDeviceGetPowerUsage not available (Not Supported); no longer read",
        "GPU 0: nvmlDeviceGetCurrentClocksEventReasons not available (Not Supported); no longer read"]
    assert _of(second, "gpu_notice") == []
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetClockInfo"] == 2


def test_memory_info_falls_back_to_v1(monkeypatch):
    fake, poller = _open(monkeypatch, [FakeDevice(memory_total=1000, memory_used=250)],
                         missing=("nvmlDeviceGetMemoryInfo_v2",))
    [static] = poller.start(0)
    assert static["devices"][0]["memory_total_bytes"] == 1000
    for t in (1, 2):
        [state] = _of(poller.poll(t), "gpu_state")
        assert (state["mem_used_bytes"], state["mem_total_bytes"]) == (250, 1000)
    assert fake.lookups["nvmlDeviceGetMemoryInfo_v2"] == 1  # never asked for again
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 3


def test_samples_not_supported_mig(monkeypatch):
    fake, poller = _open(monkeypatch, [FakeDevice(util=(64, 12))],
                         unsupported=("nvmlDeviceGetSamples",))
    poller.start(0)
    first = poller.poll(1)
    assert _of(first, "gpu_util") == []
    assert _of(first, "gpu_state")[0]["util_pct"] == 64
    assert len(_of(first, "gpu_notice")) == 2  # gpu and mem buffers, said once each
    assert _of(poller.poll(2), "gpu_notice") == []
    assert fake.calls["nvmlDeviceGetSamples"] == 2  # once per type, at start


def test_library_mismatch_and_transient_errors(monkeypatch):
    fake, poller = _open(monkeypatch)
    calls = []

    def mismatch():
        calls.append(1)
        raise pynvml.NVMLLibraryMismatchError("unversioned")

    def timeout():
        calls.append(2)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    assert poller._call(0, "x", mismatch) is None and poller._call(0, "x", mismatch) is None
    assert poller._call(0, "y", timeout) is None and poller._call(0, "y", timeout) is None
    assert calls == [1, 2, 2]  # a mismatch disables the call; a timeout does not
    assert [r["msg"] for r in poller.poll(0) if r["k"] == "gpu_notice"] == [
        "GPU 0: x not available (unversioned); no longer read", "GPU 0: y failed (Timeout)"]


def test_close_shuts_down_once_and_never_raises(monkeypatch):
    fake, poller = _open(monkeypatch)
    poller.start(0)
    poller.close()
    poller.close()
    assert fake.calls["nvmlShutdown"] == 1 and fake.initialized == 0

    fake, poller = _open(monkeypatch, missing=("nvmlShutdown",))
    poller.close()  # pynvml raises FunctionNotFound: swallowed


def test_records_feed_the_analysis(monkeypatch):
    dev = FakeDevice(util=(50, 10))
    fake, poller = _open(monkeypatch, [dev])
    records = poller.start(time.monotonic_ns())
    n = now_us()
    dev.add_samples(GPU, [(n - 1_000_000 + i * 100_000, 100 * (i % 2)) for i in range(10)])
    records += poller.poll(time.monotonic_ns())
    records = [json.loads(json.dumps(r)) for r in records]  # as read back from gpu.jsonl
    m = gpu_metrics(records)
    assert (m["util_mean"], m["util_source"], m["util_samples"]) == (50.0, "samples", 10)
    assert m["devices"][0]["name"] == "NVIDIA H200"


# -- real GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_real_gpu_poller():
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as e:
        pytest.skip(f"no NVIDIA driver: {e}")
    pynvml.nvmlShutdown()
    poller, reason = open_gpu_poller(period_s=0.5)
    assert reason is None, reason
    try:
        t_start = time.monotonic_ns()
        records = poller.start(t_start)
        for _ in range(4):
            time.sleep(0.5)
            records += poller.poll(time.monotonic_ns())
        t_end = time.monotonic_ns()
    finally:
        poller.close()
    records = [json.loads(json.dumps(r)) for r in records]
    [static] = _of(records, "gpu_static")
    assert static["ts_domain"] in ("epoch", "boottime")
    for d in static["devices"]:
        assert isinstance(d["name"], str) and d["uuid"].startswith(("GPU-", "MIG-"))
        assert d["memory_total_bytes"] > 0
        assert d["cuda_driver_version"].count(".") == 1
    states = _of(records, "gpu_state")
    assert len(states) == 4 * len(static["devices"])
    for s in states:
        assert 0 < s["mem_used_bytes"] <= s["mem_total_bytes"]
        assert s["util_pct"] is None or 0 <= s["util_pct"] <= 100
    for u in _of(records, "gpu_util"):
        ts = [s[0] for s in u["samples"]]
        assert ts == sorted(ts) and all(0 <= s[1] <= 100 for s in u["samples"])
        # samples are from this run, converted to the monotonic clock
        assert t_start - 3_000_000_000 < ts[0] and ts[-1] <= t_end + CLOCK_SLACK_NS
    m = gpu_metrics(records)
    assert m is not None and m["util_mean"] is not None and 0 <= m["util_mean"] <= 100
    print(json.dumps({"static": static, "util": _of(records, "gpu_util")[:2],
                      "notices": _of(records, "gpu_notice"), "metrics": m}))
