"""GPM windows, throttle counters and limits in the NVML sampler, run through the real pynvml wrappers
against the fake driver (fake_nvml.py); their analysis (whyidle.analysis.gpu); replay scripts."""

from __future__ import annotations

import json
import math
import os

import pynvml
import pytest

from whyidle.analysis.gpu import gpu_metrics
from whyidle.sampling.nvml import (
    GPM_METRICS,
    GPM_WINDOW_S,
    THROTTLE_COUNTER_FIELDS,
    GpuPoller,
    open_gpu_poller,
)

try:
    from fake_nvml import (
        FakeDevice,
        FakeNvml,
        load_script,
        save_script,
        script_from_gpu_records,
    )
except ImportError:  # tests/ became a package
    from tests.fake_nvml import (
        FakeDevice,
        FakeNvml,
        load_script,
        save_script,
        script_from_gpu_records,
    )

S = 1_000_000_000
MS = 1_000_000
T0 = 5_000 * S  # the fake monotonic clock's start
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SM_UTIL, SM_OCC, TENSOR, DRAM, PCIE_TX = 2, 3, 5, 10, 20
POWER, SYNC, SW_THERM, HW_THERM, BRAKE = 74, 76, 269, 270, 271


class Clock:
    """A hand-driven monotonic clock for the poller's GPM and counter stamps."""

    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t

    def advance(self, ns: int) -> int:
        self.t += ns
        return self.t


def _open(monkeypatch, devices=None, gpm_window_s=None, period_s=1.0, **kwargs):
    fake = FakeNvml(devices, **kwargs).install(monkeypatch)
    poller, reason = open_gpu_poller(period_s=period_s, gpm_window_s=gpm_window_s)
    assert reason is None and poller is not None
    clock = Clock()
    poller.clock_ns = clock
    return fake, poller, clock


def _of(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["k"] == kind]


def _notices(records: list[dict]) -> list[str]:
    return [r["msg"] for r in records if r["k"] == "gpu_notice"]


# -- GPM windows -----------------------------------------------------------------------------------

def test_gpm_windows_ping_pong(monkeypatch):
    dev = FakeDevice(gpm_script=[{SM_UTIL: 40.0, SM_OCC: 20.0, TENSOR: 10.0, DRAM: 55.5, PCIE_TX: 12.5},
                                 {SM_UTIL: 80.0, SM_OCC: 35.0, TENSOR: 0.0, DRAM: 5.0}])
    fake, poller, clock = _open(monkeypatch, [dev])
    poller.start(0)
    t_start = clock.t
    assert fake.calls["nvmlGpmSampleAlloc"] == 2 and fake.calls["nvmlGpmSampleGet"] == 1

    t1 = clock.advance(300 * MS)
    records = poller.poll(1)
    assert _notices(records) == []
    [w] = _of(records, "gpm")
    assert (w["t"], w["dev"], w["t0"], w["t1"]) == (t1, 0, t_start, t1)
    assert (w["sm_active"], w["sm_occupancy"], w["tensor_active"]) == pytest.approx((0.40, 0.20, 0.10))
    assert w["dram_active"] == pytest.approx(0.555)
    assert (w["pcie_tx_mib_per_s"], w["pcie_rx_mib_per_s"]) == (12.5, 0.0)  # MiB/s kept as is
    assert set(GPM_METRICS) <= set(w)

    clock.advance(50 * MS)  # nvml.h: less than 100 ms since the last sample: no sample, no window
    assert _of(poller.poll(2), "gpm") == []
    assert fake.calls["nvmlGpmSampleGet"] == 2

    t2 = clock.advance(200 * MS)
    [w2] = _of(poller.poll(3), "gpm")
    assert (w2["t0"], w2["t1"]) == (t1, t2)  # contiguous: the window grew over the skipped poll
    assert (w2["sm_active"], w2["sm_occupancy"], w2["tensor_active"]) == pytest.approx((0.80, 0.35, 0.0))
    # sample1 is always the older sample of the same device: two samples, swapped every window
    assert fake.gpm_queries == [(0, 1, 2), (0, 2, 3)]
    assert fake.calls["nvmlGpmSampleAlloc"] == 2 and len(fake.gpm_samples) == 2
    json.dumps(w2)

    poller.close()
    assert fake.gpm_samples == {} and fake.calls["nvmlGpmSampleFree"] == 2
    assert fake.initialized == 0


def test_gpm_values_are_clamped_fractions(monkeypatch):
    dev = FakeDevice(gpm_values={SM_UTIL: 100.4, SM_OCC: -0.1, TENSOR: math.nan, PCIE_TX: -3.0})
    _, poller, clock = _open(monkeypatch, [dev])
    poller.start(0)
    clock.advance(200 * MS)
    [w] = _of(poller.poll(1), "gpm")
    assert (w["sm_active"], w["sm_occupancy"], w["tensor_active"], w["pcie_tx_mib_per_s"]) == (1.0, 0.0, None, 0.0)


def test_gpm_metric_error_is_null_with_one_notice(monkeypatch):
    dev = FakeDevice(gpm_values={SM_UTIL: 50.0},
                     gpm_metric_errors={SM_OCC: pynvml.NVML_ERROR_NOT_SUPPORTED})
    _, poller, clock = _open(monkeypatch, [dev])
    poller.start(0)
    clock.advance(200 * MS)
    first = poller.poll(1)
    clock.advance(200 * MS)
    second = poller.poll(2)
    for records in (first, second):
        [w] = _of(records, "gpm")
        assert w["sm_active"] == 0.5 and w["sm_occupancy"] is None
    assert _notices(first) == ["GPU 0: GPM metric sm_occupancy not available (Not Supported)"]
    assert _notices(second) == []


def test_gpm_unsupported_device_is_never_sampled(monkeypatch):
    fake, poller, clock = _open(monkeypatch, [FakeDevice(gpm_supported=False)])
    assert poller.start(0)[0]["devices"][0]["gpm_supported"] is False
    for i in range(3):
        clock.advance(300 * MS)
        records = poller.poll(i)
        assert _of(records, "gpm") == [] and _notices(records) == []
    assert fake.calls["nvmlGpmSampleAlloc"] == 0 and fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_query_missing_from_the_library_or_the_module(monkeypatch):
    fake, poller, _ = _open(monkeypatch, missing=("nvmlGpmQueryDeviceSupport",))
    assert poller.start(0)[0]["devices"][0]["gpm_supported"] is False
    assert _notices(poller.poll(1)) == [] and fake.calls["nvmlGpmSampleAlloc"] == 0

    monkeypatch.delattr(pynvml, "nvmlGpmQueryDeviceSupport")  # an nvidia-ml-py without GPM
    _, poller, _ = _open(monkeypatch)
    assert poller.start(0)[0]["devices"][0]["gpm_supported"] is False


@pytest.mark.parametrize("how", [
    ("errors", "nvmlGpmSampleAlloc", pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    ("errors", "nvmlGpmSampleGet", pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    ("errors", "nvmlGpmSampleGet", pynvml.NVML_ERROR_NOT_SUPPORTED, "Not Supported"),
    ("missing", "nvmlGpmSampleAlloc", None, "Function Not Found"),
    ("missing", "nvmlGpmSampleGet", None, "Function Not Found"),
    ("module", "nvmlGpmSampleAlloc", None, "has no attribute"),
])
def test_gpm_failing_at_start_degrades_with_one_notice(monkeypatch, how):
    kind, name, code, text = how
    kwargs = {"missing": (name,)} if kind == "missing" else {}
    fake, poller, clock = _open(monkeypatch, **kwargs)
    if kind == "errors":
        fake.errors[name] = code
    elif kind == "module":
        monkeypatch.delattr(pynvml, name)
    poller.start(0)
    notices = []
    for i in range(4):
        clock.advance(300 * MS)
        records = poller.poll(i)
        assert _of(records, "gpm") == [] and len(_of(records, "gpu_state")) == 1
        notices += _notices(records)
    [msg] = notices
    assert msg.startswith("GPU 0: GPM not available (") and text in msg
    assert fake.gpm_samples == {}  # whatever was allocated is freed
    assert fake.calls["nvmlGpmSampleGet"] <= 1 and fake.calls["nvmlGpmMetricsGet"] == 0
    poller.close()


@pytest.mark.parametrize("name", ["nvmlGpmSampleGet", "nvmlGpmMetricsGet"])
def test_gpm_error_mid_run_degrades_with_one_notice(monkeypatch, name):
    fake, poller, clock = _open(monkeypatch, [FakeDevice(gpm_values={SM_UTIL: 30.0}), FakeDevice()])
    poller.start(0)
    clock.advance(300 * MS)
    assert len(_of(poller.poll(1), "gpm")) == 2
    fake.errors[name] = pynvml.NVML_ERROR_GPU_IS_LOST
    clock.advance(300 * MS)
    records = poller.poll(2)
    assert _notices(records) == [
        "GPU 0: GPM not available (GPU is lost); SM activity, tensor-core and DRAM use are not measured",
        "GPU 1: GPM not available (GPU is lost); SM activity, tensor-core and DRAM use are not measured"]
    assert _of(records, "gpm") == [] and len(_of(records, "gpu_state")) == 2  # the rest goes on
    del fake.errors[name]
    calls = fake.calls["nvmlGpmSampleGet"]
    clock.advance(300 * MS)
    records = poller.poll(3)
    assert _notices(records) == [] and _of(records, "gpm") == []
    assert fake.calls["nvmlGpmSampleGet"] == calls  # not tried again
    assert fake.gpm_samples == {}
    poller.close()
    assert fake.calls["nvmlGpmSampleFree"] == 4


def test_all_gpm_metrics_failing_means_no_gpm(monkeypatch):
    errors = {mid: pynvml.NVML_ERROR_NOT_SUPPORTED for mid, _ in GPM_METRICS.values()}
    fake, poller, clock = _open(monkeypatch, [FakeDevice(gpm_metric_errors=errors)])
    poller.start(0)
    clock.advance(300 * MS)
    records = poller.poll(1)
    assert _of(records, "gpm") == []
    assert _notices(records) == [("GPU 0: GPM not available (Not Supported); SM activity, tensor-core and "
                                  "DRAM use are not measured")]
    assert fake.gpm_samples == {}


def test_gpm_period_tiers(monkeypatch):
    """With gpm_window_s the poller ticks at the GPM period; the slow work stays at 1 s."""
    fake, poller, clock = _open(monkeypatch, [FakeDevice(gpm_values={SM_UTIL: 25.0})],
                                gpm_window_s=GPM_WINDOW_S, period_s=1.0)
    assert poller.period_s == 1.0
    poller.start(0)
    assert poller.period_s == GPM_WINDOW_S
    step = int(GPM_WINDOW_S * S)
    states, windows = [], []
    for i in range(9):  # 0 .. 2 s in 0.25 s ticks, as the sampler loop would call it
        now = i * step
        clock.t = T0 + now
        records = poller.poll(now)
        states += [r["t"] for r in _of(records, "gpu_state")]
        windows += _of(records, "gpm")
    assert states == [0, S, 2 * S]
    assert len(windows) == 8 and all(w["t1"] - w["t0"] == step for w in windows)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 3

    fake.errors["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_GPU_IS_LOST
    clock.advance(step)
    poller.poll(9 * step)
    assert poller.period_s == 1.0  # no GPM left: back to the slow period


def test_gpm_period_without_gpm_device(monkeypatch):
    _, poller, _ = _open(monkeypatch, [FakeDevice(gpm_supported=False)], gpm_window_s=GPM_WINDOW_S)
    poller.start(0)
    assert poller.period_s == 1.0
    assert len(_of(poller.poll(1), "gpu_state")) == 1 and len(_of(poller.poll(2), "gpu_state")) == 1


def test_gpm_window_never_shorter_than_the_nvml_minimum():
    assert GpuPoller([], period_s=1.0, gpm_window_s=0.01)._gpm_window_s == 0.1
    assert GpuPoller([], period_s=0.2, gpm_window_s=0.25)._gpm_window_s is None  # not faster: one tier


# -- throttle counters and limits ------------------------------------------------------------------

def test_throttle_counters_one_call_per_slow_tick(monkeypatch):
    dev = FakeDevice(fields={POWER: [0, 400_000_000, 1_100_000_000], SYNC: 0, SW_THERM: 7, HW_THERM: 0,
                             BRAKE: [5, 5, 5]})
    fake, poller, clock = _open(monkeypatch, [dev])
    poller.start(0)
    stamps, counters = [], []
    for i in range(3):
        stamps.append(clock.advance(S))
        counters += _of(poller.poll(i), "gpu_counters")
    assert [c["t"] for c in counters] == stamps  # stamped right after the call
    assert [c["throttle_ns"]["SwPowerCap"] for c in counters] == [0, 400_000_000, 1_100_000_000]
    assert counters[0]["throttle_ns"] == {"SwPowerCap": 0, "SyncBoost": 0, "SwThermalSlowdown": 7,
                                          "HwThermalSlowdown": 0, "HwPowerBrakeSlowdown": 5}
    assert isinstance(counters[0]["nvml_ts_us"], int)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 3
    assert fake.field_queries[0] == (0, list(THROTTLE_COUNTER_FIELDS.values()))


def test_throttle_counter_return_codes_are_checked_per_value(monkeypatch):
    dev = FakeDevice(fields={POWER: [10, 20, 30]},
                     field_errors={SW_THERM: pynvml.NVML_ERROR_NO_PERMISSION,
                                   HW_THERM: pynvml.NVML_ERROR_TIMEOUT})
    fake, poller, clock = _open(monkeypatch, [dev])
    poller.start(0)
    records = []
    for i in range(3):
        clock.advance(S)
        records += poller.poll(i)
    assert [c["throttle_ns"] for c in _of(records, "gpu_counters")] == [
        {"SwPowerCap": 10}, {"SwPowerCap": 20}, {"SwPowerCap": 30}]
    assert _notices(records) == []  # silent: the bitmask snapshots remain
    # not supported (76, 271 absent from the fake) and no permission are not asked for again;
    # a transient error (timeout) is
    assert [q[1] for q in fake.field_queries] == [[POWER, SYNC, SW_THERM, HW_THERM, BRAKE],
                                                  [POWER, HW_THERM], [POWER, HW_THERM]]


@pytest.mark.parametrize("kwargs", [{"unsupported": ("nvmlDeviceGetFieldValues",)},
                                    {"missing": ("nvmlDeviceGetFieldValues",)}])
def test_no_field_values_falls_back_silently(monkeypatch, kwargs):
    fake, poller, clock = _open(monkeypatch, [FakeDevice(fields={POWER: 1}, clocks_event_reasons=0x4)], **kwargs)
    poller.start(0)
    for i in range(3):
        clock.advance(S)
        records = poller.poll(i)
        assert _of(records, "gpu_counters") == [] and _notices(records) == []
        assert _of(records, "gpu_state")[0]["clocks_event_reasons"] == 0x4
    assert fake.lookups["nvmlDeviceGetFieldValues"] == 1 and fake.calls["nvmlDeviceGetFieldValues"] <= 1


def test_device_without_counters_stops_asking(monkeypatch):
    fake, poller, clock = _open(monkeypatch, [FakeDevice()])  # no field is supported
    poller.start(0)
    for i in range(3):
        clock.advance(S)
        assert _of(poller.poll(i), "gpu_counters") == []
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1


def test_limits_once_at_the_first_poll(monkeypatch):
    dev = FakeDevice(sm_clock_max_mhz=1755, power_limit_mw=450_000, power_limit_default_mw=700_000,
                     power_limit_max_mw=700_000)
    fake, poller, _ = _open(monkeypatch, [dev, FakeDevice()],
                            unsupported=("nvmlDeviceGetPowerManagementDefaultLimit",))
    poller.start(7)
    first = poller.poll(8)
    assert _of(first, "gpu_limits")[0] == {"k": "gpu_limits", "t": 7, "dev": 0, "sm_clock_max_mhz": 1755,
                                           "power_limit_w": 450.0, "power_limit_default_w": None,
                                           "power_limit_max_w": 700.0}
    assert len(_of(first, "gpu_limits")) == 2 and _notices(first) == []
    assert _of(poller.poll(9), "gpu_limits") == []
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2


def test_sampler_records_feed_the_analysis(monkeypatch):
    dev = FakeDevice(gpm_script=[{SM_UTIL: 20.0, TENSOR: 50.0}, {SM_UTIL: 80.0, TENSOR: 50.0}],
                     fields={POWER: [0, 500_000_000, 1_500_000_000]}, clocks_event_reasons=0x4,
                     sm_clock_mhz=1500)
    _, poller, clock = _open(monkeypatch, [dev])
    records = poller.start(0)
    clock.advance(S)
    records += poller.poll(1)
    clock.advance(3 * S)
    records += poller.poll(2)
    clock.advance(S)
    records += poller.poll(3)
    records = [json.loads(json.dumps(r)) for r in records]  # as read back from gpu.jsonl
    m = gpu_metrics(records)
    # windows of 1 s (20 %) and 3 s (80 %), then 1 s (80 %, the script's last entry)
    assert m["sm_active_mean"] == pytest.approx((0.2 + 0.8 * 3 + 0.8) / 5)
    assert m["tensor_active_mean"] == pytest.approx(0.5) and m["gpm_windows"] == 3
    assert m["sm_occupancy_mean"] == 0.0  # measured zero: the fake's default
    assert m["throttle_s"]["SwPowerCap"] == pytest.approx(1.5)
    assert m["throttle_share"]["SwPowerCap"] == pytest.approx(1.5 / 4)  # counters observed 4 s
    assert m["throttle_source"] == "counters" and m["sm_clock_max_mhz"] == 1980
    assert m["sm_clock_throttled_mean_mhz"] == 1500


# -- analysis of GPM windows -----------------------------------------------------------------------

def _static(n: int = 1, cvd: str | None = None) -> dict:
    return {"k": "gpu_static", "t": 0, "ts_domain": "epoch", "cuda_visible_devices": cvd,
            "devices": [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "memory_total_bytes": 10,
                         "compute_capability": [9, 0], "driver_version": "550", "cuda_driver_version": "12.4",
                         "gpm_supported": True} for i in range(n)]}


def _window(t0: int, t1: int, dev: int = 0, **metrics) -> dict:
    r = {"k": "gpm", "t": t1, "dev": dev, "t0": t0, "t1": t1}
    r.update({k: None for k in GPM_METRICS})
    r.update(metrics)
    return r


def test_gpm_means_are_weighted_by_overlap():
    records = [_static(), _window(0, S, sm_active=0.2, dram_active=0.1),
               _window(S, 3 * S, sm_active=0.8, dram_active=0.4)]
    m = gpu_metrics(records)
    assert m["sm_active_mean"] == pytest.approx((0.2 * 1 + 0.8 * 2) / 3)
    assert m["dram_active_mean"] == pytest.approx((0.1 + 0.8) / 3) and m["gpm_windows"] == 2
    half = gpu_metrics(records, (S // 2, 3 * S // 2))
    assert half["sm_active_mean"] == pytest.approx(0.5) and half["gpm_windows"] == 2
    inside = gpu_metrics(records, (1200 * MS, 1300 * MS))  # shorter than a GPM window: its value
    assert (inside["sm_active_mean"], inside["gpm_windows"]) == (pytest.approx(0.8), 1)
    edge = gpu_metrics(records, (S, S))  # touches two windows, overlaps neither
    assert (edge["sm_active_mean"], edge["gpm_windows"]) == (None, 0)
    assert gpu_metrics(records, (4 * S, 5 * S))["sm_active_mean"] is None


def test_gpm_null_metric_is_left_out_of_its_own_mean_only():
    records = [_static(), _window(0, S, sm_active=0.2, sm_occupancy=None),
               _window(S, 2 * S, sm_active=0.4, sm_occupancy=0.3)]
    m = gpu_metrics(records)
    assert m["sm_active_mean"] == pytest.approx(0.3) and m["sm_occupancy_mean"] == pytest.approx(0.3)
    assert m["tensor_active_mean"] is None  # null in every window: not measured, not 0


def test_no_gpm_is_none_not_zero():
    m = gpu_metrics([_static()])
    for key in ("sm_active_mean", "sm_occupancy_mean", "tensor_active_mean", "dram_active_mean"):
        assert m[key] is None and m["devices"][0][key] is None
    assert m["gpm_windows"] == 0


def test_gpm_across_devices():
    records = [_static(3, cvd="0,1"), _window(0, S, dev=0, sm_active=0.2), _window(0, S, dev=1, sm_active=0.6),
               _window(0, S, dev=2, sm_active=1.0)]
    m = gpu_metrics(records)
    assert m["sm_active_mean"] == pytest.approx(0.4) and m["gpm_windows"] == 2  # device 2 not used
    assert [d["sm_active_mean"] for d in m["devices"]] == [0.2, 0.6, 1.0]


# -- replay scripts --------------------------------------------------------------------------------

def test_load_script_example(monkeypatch):
    fake = load_script(os.path.join(DATA, "fake_nvml_example.json")).install(monkeypatch)
    poller, reason = open_gpu_poller(period_s=1.0)
    assert reason is None
    clock = Clock()
    poller.clock_ns = clock
    [static] = poller.start(0)
    assert static["devices"][0]["name"] == "NVIDIA H200" and static["devices"][0]["cuda_driver_version"] == "12.4"
    windows, counters = [], []
    for i in range(3):
        clock.advance(S)
        records = poller.poll(i)
        windows += _of(records, "gpm")
        counters += _of(records, "gpu_counters")
    assert [w["sm_active"] for w in windows] == [0.5, 0.1, 0.1]
    assert windows[0]["sm_occupancy"] is None
    assert [c["throttle_ns"]["SwPowerCap"] for c in counters] == [0, 250_000_000, 900_000_000]
    assert fake.devices[0].fields[THROTTLE_COUNTER_FIELDS["SwPowerCap"]] == [0, 250_000_000, 900_000_000]


def test_load_script_rejects_other_formats():
    with pytest.raises(ValueError):
        load_script({"format": "something/1", "devices": []})


def test_script_from_records_replays_the_same_sequence(monkeypatch, tmp_path):
    dev = FakeDevice(name="NVIDIA H100 80GB HBM3", gpm_script=[{SM_UTIL: 12.0, DRAM: 30.0}, {SM_UTIL: 64.0}],
                     gpm_metric_errors={SM_OCC: pynvml.NVML_ERROR_NOT_SUPPORTED},
                     fields={POWER: [3, 9, 27], HW_THERM: [0, 0, 1]}, sm_clock_max_mhz=1830,
                     power_limit_mw=500_000)
    _, poller, clock = _open(monkeypatch, [dev], cuda_driver_version=12060)
    records = poller.start(0)
    pynvml_now = 1_800_000_000_000_000
    for i in range(3):
        dev.add_samples(pynvml.NVML_GPU_UTILIZATION_SAMPLES, [(pynvml_now + i * 100_000, 10 * i)])
        clock.advance(S)
        records += poller.poll(i)
    poller.close()
    records = [json.loads(json.dumps(r)) for r in records]

    script = script_from_gpu_records(records, source="synthetic: a fake driver (test)")
    path = tmp_path / "replay.json"
    save_script(script, path)
    fake2 = load_script(path).install(monkeypatch)
    poller2, _ = open_gpu_poller()
    clock2 = Clock()
    poller2.clock_ns = clock2
    replayed = poller2.start(0)
    for i in range(3):
        clock2.advance(S)
        replayed += poller2.poll(i)

    def strip(rs, kind, *keys):
        return [{k: r.get(k) for k in keys} for r in _of(rs, kind)]

    assert replayed[0]["devices"] == records[0]["devices"]
    assert strip(replayed, "gpm", *GPM_METRICS) == strip(records, "gpm", *GPM_METRICS)
    assert strip(replayed, "gpu_counters", "throttle_ns") == strip(records, "gpu_counters", "throttle_ns")
    assert strip(replayed, "gpu_limits", "sm_clock_max_mhz", "power_limit_w") == [
        {"sm_clock_max_mhz": 1830, "power_limit_w": 500.0}]
    # the recorded buffer samples are in the replayed driver's buffer, with NVML timestamps
    assert fake2.devices[0].samples[pynvml.NVML_GPU_UTILIZATION_SAMPLES] == [
        (pynvml_now + i * 100_000, 10 * i) for i in range(3)]
