"""GPU metrics from synthetic gpu.jsonl records (whyidle.analysis.gpu)."""

from __future__ import annotations

import pytest

from whyidle.analysis.gpu import device_info, gpu_metrics, throttle_reason_names, util_series

S = 1_000_000_000  # ns per second
MS = 1_000_000


def static(n: int = 1, cvd: str | None = None) -> dict:
    names = ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]
    return {"k": "gpu_static", "t": 0, "ts_domain": "epoch", "cuda_visible_devices": cvd,
            "devices": [{"index": i, "name": names[i], "uuid": f"GPU-{'ab'[i] * 3}",
                         "memory_total_bytes": (150 - 70 * i) * 10**9,
                         "compute_capability": [9 - i, 0], "driver_version": "550.54.15",
                         "cuda_driver_version": "12.4", "gpm_supported": i == 0}
                        for i in range(n)]}


def util(points: list[tuple[int, float]], dev: int = 0, kind: str = "gpu") -> dict:
    """A gpu_util record from (t_ns, value) points."""
    return {"k": "gpu_util", "t": points[-1][0], "dev": dev, "type": kind,
            "samples": [[t, v, 1_700_000_000_000_000 + t // 1000] for t, v in points]}


def state(t: int, dev: int = 0, **kw) -> dict:
    r = {"k": "gpu_state", "t": t, "dev": dev, "mem_used_bytes": None, "mem_total_bytes": None,
         "sm_clock_mhz": None, "power_w": None, "clocks_event_reasons": None, "util_pct": None,
         "mem_util_pct": None}
    r.update(kw)
    return r


def step_pattern(t0: int, t1: int, value_until: int, period: int = 100 * MS) -> list:
    """Samples every ``period`` in (t0, t1]: 100 % up to ``value_until``, 0 % after."""
    return [(t, 100.0 if t <= value_until else 0.0) for t in range(t0 + period, t1 + 1, period)]


def test_no_gpu_static_means_no_gpu_metrics():
    assert gpu_metrics([]) is None
    assert gpu_metrics([{"k": "gpu_notice", "t": 0, "msg": "NVML not available"}]) is None
    assert gpu_metrics([{"k": "gpu_static", "t": 0, "devices": [], "ts_domain": "epoch"}]) is None
    assert device_info([]) is None
    assert util_series([]) == []


def test_alternating_pattern_mean_is_time_weighted():
    # 100 % samples cover 100 ms each, 0 % samples 300 ms each: busy 1/4 of the time.
    t, pts = 10 * S, []
    for _ in range(20):
        t += 100 * MS
        pts.append((t, 100.0))
        t += 300 * MS
        pts.append((t, 0.0))
    records = [static(), util(pts), state(11 * S, util_pct=90)]
    # from the first sample's time (its period is left out) to the last busy one
    m = gpu_metrics(records, window=(pts[0][0], pts[-2][0]))
    assert m["util_mean"] == pytest.approx(25.0, abs=1e-9)
    assert (m["util_source"], m["util_samples"]) == ("samples", 38)
    # a plain mean of the samples would say 50 %
    assert sum(v for _, v in pts) / len(pts) == 50.0


def test_equal_spacing_100_0_pattern_without_window():
    pts = [(10 * S + i * 167 * MS, 100.0 * (i % 2)) for i in range(60)]
    m = gpu_metrics([static(), util(pts)])
    assert m["util_mean"] == 50.0 and m["util_samples"] == 60


def test_window_cuts_sample_periods():
    records = [static(), util(step_pattern(10 * S, 12 * S, value_until=11 * S))]
    assert gpu_metrics(records)["util_mean"] == pytest.approx(50.0)
    assert gpu_metrics(records, (10 * S + 500 * MS, 11 * S + 500 * MS))["util_mean"] == \
        pytest.approx(50.0)
    # a window inside one sample period takes that sample's value
    m = gpu_metrics(records, (10 * S + 550 * MS, 10 * S + 590 * MS))
    assert (m["util_mean"], m["util_samples"]) == (100.0, 1)
    m = gpu_metrics(records, (11 * S + 10 * MS, 11 * S + 60 * MS))
    assert (m["util_mean"], m["util_samples"]) == (0.0, 1)
    # 75 ms busy + 25 ms idle inside (10.925 s, 11.025 s]
    assert gpu_metrics(records, (10 * S + 925 * MS, 11 * S + 25 * MS))["util_mean"] == \
        pytest.approx(75.0)


def test_gap_after_overrun_counts_at_most_four_periods():
    pts = [(10 * S + i * 100 * MS, 100.0) for i in range(10)] + [(30 * S, 0.0)]
    m = gpu_metrics([static(), util(pts)])
    # ten busy samples cover 1.0 s; the sample after the 19 s gap covers 4 × 100 ms
    assert m["util_mean"] == pytest.approx(100 * 1.0 / 1.4)


def test_samples_of_several_polls_are_merged():
    pts = step_pattern(10 * S, 12 * S, value_until=11 * S)
    records = [static(), util(pts[:7]), util(pts[7:13]), util(pts[13:])]
    assert gpu_metrics(records)["util_mean"] == pytest.approx(50.0)


def test_snapshot_fallback_without_buffer_samples():
    records = [static(), state(1 * S, util_pct=20, mem_util_pct=4),
               state(2 * S, util_pct=40, mem_util_pct=8), state(3 * S, util_pct=90, mem_util_pct=1)]
    m = gpu_metrics(records, window=(1 * S, 2 * S))  # inclusive ends
    assert (m["util_mean"], m["util_source"], m["util_samples"]) == (30.0, "snapshots", 2)
    assert m["mem_util_mean"] == 6.0
    # buffer samples outside the window do not stop the fallback inside it
    records.append(util([(5 * S, 100.0), (5 * S + 100 * MS, 100.0)]))
    m = gpu_metrics(records, window=(1 * S, 2 * S))
    assert (m["util_mean"], m["util_source"]) == (30.0, "snapshots")
    assert gpu_metrics(records, window=(4 * S, 6 * S))["util_source"] == "samples"


def test_memory_utilization_from_mem_samples():
    records = [static(), util([(S + i * 100 * MS, 10.0 * (i % 3)) for i in range(30)], kind="mem"),
               state(2 * S, util_pct=50, mem_util_pct=99)]
    m = gpu_metrics(records)
    assert m["mem_util_mean"] == pytest.approx(10.0)
    assert (m["util_mean"], m["util_source"]) == (50.0, "snapshots")


def test_state_fields_and_throttle_reasons():
    records = [static(),
               state(1 * S, mem_used_bytes=10, sm_clock_mhz=1980, power_w=500.0,
                     clocks_event_reasons=0x1),
               state(2 * S, mem_used_bytes=30, sm_clock_mhz=1500, power_w=None,
                     clocks_event_reasons=0x4 | 0x1),
               state(3 * S, mem_used_bytes=20, sm_clock_mhz=1200, power_w=700.0,
                     clocks_event_reasons=0x40),
               state(4 * S, mem_used_bytes=5, sm_clock_mhz=1980, power_w=300.0,
                     clocks_event_reasons=0),
               state(9 * S, mem_used_bytes=99, sm_clock_mhz=300, power_w=50.0,
                     clocks_event_reasons=0x8)]
    m = gpu_metrics(records, window=(1 * S, 4 * S))
    assert m["memory_used_max_bytes"] == 30 and m["memory_total_bytes"] == 150 * 10**9
    assert m["sm_clock_mean_mhz"] == pytest.approx(1665.0)
    assert m["power_mean_w"] == pytest.approx(500.0)
    assert m["throttle_reasons"] == ["HwThermalSlowdown", "SwPowerCap"]
    assert m["throttle_share"] == {"SwPowerCap": 0.25, "HwThermalSlowdown": 0.25}
    assert m["util_mean"] is None and m["util_source"] is None and m["util_samples"] == 0
    assert gpu_metrics(records)["throttle_reasons"] == [
        "HwSlowdown", "HwThermalSlowdown", "SwPowerCap"]


def test_throttle_reason_names():
    assert throttle_reason_names(0) == [] and throttle_reason_names(0x1) == []
    assert throttle_reason_names(0x601) == ["BoardLimit", "Reliability"]
    assert throttle_reason_names(0x84) == ["SwPowerCap", "HwPowerBrakeSlowdown"]


def test_two_devices():
    busy = [(10 * S + i * 100 * MS, 100.0) for i in range(20)]
    half = [(10 * S + i * 100 * MS + 30 * MS, 50.0) for i in range(20)]
    records = [static(2), util(busy, dev=0), util(half, dev=1),
               state(11 * S, dev=0, mem_used_bytes=100, power_w=600.0, clocks_event_reasons=0x4),
               state(11 * S, dev=1, mem_used_bytes=300, power_w=200.0)]
    m = gpu_metrics(records)
    assert m["util_mean"] == pytest.approx(75.0) and m["util_samples"] == 40
    assert (m["memory_used_max_bytes"], m["memory_total_bytes"]) == (300, 80 * 10**9)
    assert m["power_mean_w"] == pytest.approx(400.0)
    assert m["throttle_reasons"] == ["SwPowerCap"] and m["device_indices"] == [0, 1]
    d0, d1 = m["devices"]
    assert (d0["index"], d0["name"], d0["util_mean"]) == (0, "NVIDIA H200", pytest.approx(100.0))
    assert (d1["index"], d1["name"], d1["util_mean"]) == (
        1, "NVIDIA A100-SXM4-80GB", pytest.approx(50.0))
    assert (d0["memory_used_max_bytes"], d1["memory_total_bytes"]) == (100, 80 * 10**9)
    assert d0["throttle_reasons"] == ["SwPowerCap"] and d1["throttle_reasons"] == []


def test_two_devices_mixed_sources():
    records = [static(2), util([(S, 80.0), (S + 100 * MS, 80.0)], dev=0),
               state(S, dev=1, util_pct=20)]
    m = gpu_metrics(records)
    assert (m["util_mean"], m["util_source"]) == (pytest.approx(50.0), "mixed")


@pytest.mark.parametrize("cvd, indices", [("1", [1]), ("GPU-bb", [1]), ("0,1", [0, 1]),
                                          ("1,7", [1]), ("7", [0, 1]), ("", [0, 1]),
                                          ("MIG-abc", [0, 1])])
def test_cuda_visible_devices_selects_top_level(cvd, indices):
    records = [static(2, cvd=cvd), state(S, dev=0, util_pct=90), state(S, dev=1, util_pct=10)]
    m = gpu_metrics(records)
    assert m["device_indices"] == indices
    assert m["util_mean"] == pytest.approx(sum([90, 10][i] for i in indices) / len(indices))
    assert len(m["devices"]) == 2
    assert device_info(records)["count"] == len(indices)
    assert device_info(records)["name"] == static(2)["devices"][indices[0]]["name"]


def test_device_info():
    assert device_info([static(2)]) == {"kind": "cuda", "name": "NVIDIA H200",
                                        "compute_capability": "9.0",
                                        "memory_total_bytes": 150 * 10**9, "count": 2}
    s = static(1)
    s["devices"][0]["compute_capability"] = None
    assert device_info([s])["compute_capability"] is None


def test_util_series_downsamples_by_averaging():
    pts = [(10 * S + i * 100 * MS, 100.0 * (i % 2)) for i in range(1000)]
    series = util_series([static(), util(pts)], max_points=100)
    assert len(series) == 100
    assert all(v == pytest.approx(50.0) for _, v in series)
    times = [t for t, _ in series]
    assert times == sorted(times) and times[0] == pytest.approx(10.45) and times[-1] == pytest.approx(109.45)
    # fewer samples than max_points: one point per sample
    assert util_series([static(), util(pts[:10])]) == [(t / S, v) for t, v in pts[:10]]
    # window
    series = util_series([static(), util(pts)], window=(20 * S, 30 * S), max_points=1000)
    assert len(series) == 101 and series[0] == (20.0, 0.0) and series[-1] == (30.0, 0.0)


def test_util_series_two_devices_and_snapshots():
    busy = [(10 * S + i * 100 * MS, 100.0) for i in range(50)]
    idle = [(10 * S + i * 100 * MS + 40 * MS, 0.0) for i in range(50)]
    series = util_series([static(2), util(busy, dev=0), util(idle, dev=1)], max_points=10)
    assert len(series) == 10 and all(v == pytest.approx(50.0) for _, v in series)
    snaps = util_series([static(), state(S, util_pct=10), state(2 * S, util_pct=30)])
    assert snaps == [(1.0, 10.0), (2.0, 30.0)]


def test_util_over_windows_weights_each_sample_by_its_time_inside_them():
    from whyidle.analysis.gpu import util_over

    # 100 % busy for 5 s, then idle for 5 s (samples every 100 ms)
    recs = [static(), util(step_pattern(0, 10 * S, 5 * S))]
    assert util_over(recs, [(1 * S, 4 * S)]) == pytest.approx(100.0)
    assert util_over(recs, [(6 * S, 9 * S)]) == pytest.approx(0.0)
    assert util_over(recs, [(4 * S, 5 * S), (5 * S, 6 * S)]) == pytest.approx(50.0)
    assert util_over(recs, []) is None and util_over([static()], [(0, S)]) is None
