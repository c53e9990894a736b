"""Throttle time from NVML counters and snapshots (whyidle.analysis.gpu) and the ``throttling`` rule
(whyidle.diagnose.rules_device)."""

from __future__ import annotations

import pytest

from whyidle.analysis.gpu import gpu_metrics
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules_device import throttling
from whyidle.analysis.facts import RunFacts
from test_diagnose import assert_contract  # the one report-contract check

S = 1_000_000_000
MS = 1_000_000


def static(n: int = 1, cvd: str | None = None) -> dict:
    return {"k": "gpu_static", "t": 0, "ts_domain": "epoch", "cuda_visible_devices": cvd,
            "devices": [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "memory_total_bytes": 10,
                         "compute_capability": [9, 0], "driver_version": "550", "cuda_driver_version": "12.4",
                         "gpm_supported": True} for i in range(n)]}


def counters(t: int, dev: int = 0, **ns) -> dict:
    return {"k": "gpu_counters", "t": t, "dev": dev, "throttle_ns": ns, "nvml_ts_us": None}


def state(t: int, dev: int = 0, reasons: int | None = 0, clock: int | None = 1980, util: int | None = 100) -> dict:
    return {"k": "gpu_state", "t": t, "dev": dev, "mem_used_bytes": None, "mem_total_bytes": None,
            "sm_clock_mhz": clock, "power_w": None, "clocks_event_reasons": reasons, "util_pct": util,
            "mem_util_pct": None}


def limits(dev: int = 0, clock_max: int = 1980, limit: float = 700.0, limit_max: float = 700.0) -> dict:
    return {"k": "gpu_limits", "t": 0, "dev": dev, "sm_clock_max_mhz": clock_max, "power_limit_w": limit,
            "power_limit_default_w": 700.0, "power_limit_max_w": limit_max}


# -- analysis --------------------------------------------------------------------------------------

def test_counter_seconds_inside_the_window():
    recs = [static(), counters(0, SwPowerCap=0, SyncBoost=0), counters(S, SwPowerCap=S // 2, SyncBoost=0),
            counters(2 * S, SwPowerCap=3 * S // 2, SyncBoost=0), counters(3 * S, SwPowerCap=3 * S // 2, SyncBoost=0)]
    m = gpu_metrics(recs)
    assert m["throttle_s"] == {"SwPowerCap": pytest.approx(1.5), "SyncBoost": 0.0}  # 0.0 is a measured zero
    assert m["throttle_share"] == {"SwPowerCap": pytest.approx(0.5)}
    assert (m["throttle_source"], m["throttle_observed_s"]) == ("counters", pytest.approx(3.0))
    # each read interval's increment is spread over it: half of [0, 1] s and half of [2, 3] s
    w = gpu_metrics(recs, (S // 2, 5 * S // 2))
    assert w["throttle_s"]["SwPowerCap"] == pytest.approx(0.25 + 1.0)
    assert w["throttle_share"]["SwPowerCap"] == pytest.approx(1.25 / 2)
    assert w["throttle_observed_s"] == pytest.approx(2.0)
    # the window starts after the last read: not observed
    late = gpu_metrics(recs, (4 * S, 5 * S))
    assert (late["throttle_s"], late["throttle_observed_s"], late["throttle_source"]) == (None, None, None)


def test_counter_reset_and_impossible_increment():
    recs = [static(), counters(0, HwThermalSlowdown=10 * S), counters(S, HwThermalSlowdown=0),  # driver reload
            counters(2 * S, HwThermalSlowdown=5 * S)]  # 5 s of throttling in 1 s: capped at 1 s
    m = gpu_metrics(recs)
    assert m["throttle_s"] == {"HwThermalSlowdown": pytest.approx(1.0)}
    assert m["throttle_observed_s"] == pytest.approx(1.0)  # the reset interval is unobserved
    assert m["throttle_share"] == {"HwThermalSlowdown": pytest.approx(1.0)}


def test_counters_win_over_snapshots_and_snapshots_fill_the_rest():
    # snapshots say SwPowerCap half the time, HwSlowdown (no counter) a quarter; the counters say
    # SwPowerCap never happened
    masks = [0x4 | 0x8, 0x4, 0x0, 0x0]
    recs = [static()] + [state(i * S, reasons=mk) for i, mk in enumerate(masks)]
    recs += [counters(i * S, SwPowerCap=0) for i in range(4)]
    m = gpu_metrics(recs)
    assert m["throttle_share"] == {"HwSlowdown": 0.25}
    assert m["throttle_reasons"] == ["HwSlowdown"] and m["throttle_s"] == {"SwPowerCap": 0.0}
    assert m["throttle_source"] == "counters" and m["throttle_snapshots"] == 4


def test_snapshots_only_keep_their_meaning():
    recs = [static()] + [state(i * S, reasons=0x4 if i < 3 else 0x1) for i in range(6)]
    m = gpu_metrics(recs)
    assert m["throttle_share"] == {"SwPowerCap": 0.5}  # GpuIdle is not a throttle
    assert (m["throttle_s"], m["throttle_source"], m["throttle_snapshots"]) == (None, "snapshots", 6)
    bare = gpu_metrics([static()])
    assert (bare["throttle_s"], bare["throttle_source"], bare["throttle_snapshots"]) == (None, None, 0)


def test_clock_while_throttled_and_limits():
    recs = [static(), limits(clock_max=1980, limit=450.0),
            state(0, reasons=0x4, clock=1400), state(S, reasons=0x4 | 0x1, clock=1200),
            state(2 * S, reasons=0x1, clock=345), state(3 * S, reasons=0x2, clock=1980)]
    m = gpu_metrics(recs)
    assert m["sm_clock_throttled_mean_mhz"] == 1300  # only snapshots with a power/thermal reason
    assert m["sm_clock_mean_mhz"] == pytest.approx((1400 + 1200 + 345 + 1980) / 4)
    assert (m["sm_clock_max_mhz"], m["power_limit_w"], m["power_limit_max_w"]) == (1980, 450.0, 700.0)
    none = gpu_metrics([static(), state(0, reasons=0x0)])
    assert (none["sm_clock_throttled_mean_mhz"], none["sm_clock_max_mhz"], none["power_limit_w"]) == (None,) * 3


def test_throttle_across_devices():
    recs = [static(3, cvd="0,1")]
    for dev, ns in ((0, S // 4), (1, S // 2), (2, S)):
        recs += [counters(0, dev, SwThermalSlowdown=0), counters(S, dev, SwThermalSlowdown=ns)]
    recs += [state(0, dev=0, reasons=0x4)]
    m = gpu_metrics(recs)
    assert m["throttle_s"] == {"SwThermalSlowdown": pytest.approx(0.5)}  # the worst used device
    assert m["throttle_share"]["SwThermalSlowdown"] == pytest.approx(0.5)
    assert m["throttle_source"] == "counters" and m["devices"][2]["throttle_s"]["SwThermalSlowdown"] == 1.0


# -- the rule --------------------------------------------------------------------------------------

def power_capped_run(share: float = 0.4, seconds: int = 10, limit: float = 700.0, util: int = 100,
                     clock: int = 1410) -> list[dict]:
    """``seconds`` of 1 s reads with SwPowerCap covering ``share`` of each, snapshots agreeing."""
    recs = [static(), limits(limit=limit)]
    for i in range(seconds + 1):
        recs.append(counters(i * S, SwPowerCap=int(i * share * S), SyncBoost=i * S))
        recs.append(state(i * S, reasons=0x4 | 0x10, clock=clock, util=util))
    return recs


def facts_of(records: list[dict], window=None) -> dict:
    return RunFacts(gpu=gpu_metrics(records, window))


def test_power_cap_below_the_maximum_limit():
    f = throttling(facts_of(power_capped_run(limit=450.0, util=80)))
    assert_contract(f)
    assert (f["id"], f["severity"]) == ("throttling", "warning")
    assert "the power limit (SwPowerCap) 40% of the analyzed time" in f["summary"]
    assert "1,410 MHz while throttled, of a 1,980 MHz maximum" in f["summary"]
    assert f["summary"].count(".") <= 2 and f["summary"].endswith(".")
    # s = 0.4 ≤ busy 0.8; r = 1410/1980
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.4 * (1 - 1410 / 1980)), abs=1e-3)
    assert "sudo nvidia-smi -i 0 -pl 700" in f["fix"]["code"] and "450 W of a possible 700 W" in f["fix"]["text"]
    ev = f["evidence"]
    assert (ev["reason"], ev["source"], ev["share"]) == ("SwPowerCap", "counters", pytest.approx(0.4))
    assert ev["throttle_s"]["SwPowerCap"] == pytest.approx(4.0) and ev["shares"] == {"SwPowerCap": 0.4}


def test_power_cap_at_the_maximum_limit_has_no_estimate():
    f = throttling(facts_of(power_capped_run(limit=700.0)))
    assert f["est_speedup"] is None
    assert "power limit already at its maximum (700 W)" in f["summary"]
    assert "flat out" in f["fix"]["text"] and "-pl" not in f["fix"]["code"]


def test_busy_share_bounds_the_estimate():
    f = throttling(facts_of(power_capped_run(share=0.9, limit=450.0, util=30)))
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.3 * (1 - 1410 / 1980)), abs=1e-3)


def test_thermal_from_snapshots():
    recs = [static(), limits()] + [state(i * S, reasons=0x40 | 0x8 if i % 2 else 0x0, clock=990 if i % 2 else 1980)
                                   for i in range(10)]
    f = throttling(facts_of(recs))
    assert (f["evidence"]["source"], f["evidence"]["reason"]) == ("snapshots", "HwThermalSlowdown")
    assert ("hardware thermal protection (HwThermalSlowdown) 50% of the analyzed time (NVML clock-event "
            "snapshots; also HwSlowdown 50%)") in f["summary"]
    assert "990 MHz while throttled" in f["summary"]
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.5 * 0.5), abs=1e-3)  # half the time at half clock
    assert "too hot" in f["fix"]["text"] and "-pl" not in f["fix"]["code"]


@pytest.mark.parametrize("mask", [0x1, 0x2, 0x10, 0x100, 0x1 | 0x2 | 0x10])
def test_not_a_throttle(mask):
    recs = [static(), limits()] + [state(i * S, reasons=mask, clock=1000) for i in range(10)]
    assert throttling(facts_of(recs)) is None


def test_quiet_when_small_unobserved_or_unknown():
    assert throttling(RunFacts(gpu=None)) is None and throttling(RunFacts()) is None
    assert throttling(facts_of([static()])) is None
    small = power_capped_run(share=T.THROTTLE_SHARE_WARN / 2)
    assert throttling(facts_of(small)) is None
    short = power_capped_run(seconds=1)  # counters cover 1 s < THROTTLE_MIN_OBSERVED_S
    assert throttling(facts_of(short)) is None
    few = [static()] + [state(i * S, reasons=0x20) for i in range(T.THROTTLE_MIN_SNAPSHOTS - 1)]
    assert throttling(facts_of(few)) is None


def test_unknown_clocks_give_no_estimate():
    recs = [static()] + [state(i * S, reasons=0x20, clock=None) for i in range(6)]
    f = throttling(facts_of(recs))
    assert f["est_speedup"] is None and "MHz" not in f["summary"]
    assert "the driver's thermal limit (SwThermalSlowdown) 100%" in f["summary"]


def test_worst_used_device_is_named():
    recs = [static(3, cvd="0,1"), limits(0), limits(1), limits(2)]
    for dev, share in ((0, 0.2), (1, 0.6), (2, 1.0)):  # device 2 is not the command's
        for i in range(6):
            recs.append(counters(i * S, dev, HwPowerBrakeSlowdown=int(i * share * S)))
            recs.append(state(i * S, dev, reasons=0x80, clock=1000))
    f = throttling(facts_of(recs))
    assert f["evidence"]["device"] == 1 and f["summary"].startswith("GPU 1's clocks were cut by an external power brake")
    assert "power delivery" in f["fix"]["text"]


def test_window_of_the_analyzed_steps():
    recs = power_capped_run(seconds=20)
    for r in recs:  # throttling only in the second half
        if r["k"] == "gpu_counters":
            r["throttle_ns"]["SwPowerCap"] = max(0, r["t"] - 10 * S)
    assert throttling(facts_of(recs, (0, 10 * S))) is None
    f = throttling(facts_of(recs, (10 * S, 20 * S)))
    assert f["evidence"]["share"] == pytest.approx(1.0)
