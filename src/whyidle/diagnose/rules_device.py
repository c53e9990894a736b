"""Diagnosis rules about the device's own state (pure; no framework or pynvml imports).

* :func:`throttling`: the GPU's clocks were cut by power or thermal limits.

Each takes the facts of :func:`whyidle.analysis.run.analyze` and returns a finding of the report
contract (:func:`whyidle.diagnose.rules.finding`) or ``None``; thresholds are in
:mod:`whyidle.diagnose.thresholds`. A missing or ``None`` fact counts as unknown, and an unknown fact
keeps a rule silent.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.analysis.gpu import CLOCK_LIMITING_REASONS
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import _round, bound_of, finding

DOCS_REASONS = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksThrottleReasons.html"
DOCS_NVIDIA_SMI = "https://docs.nvidia.com/deploy/nvidia-smi/index.html"

#: How each clock-limiting reason reads in a summary (nvml.h comments of the reason bits).
REASON_TEXT = {
    "SwPowerCap": "the power limit (SwPowerCap)",
    "HwPowerBrakeSlowdown": "an external power brake (HwPowerBrakeSlowdown)",
    "SwThermalSlowdown": "the driver's thermal limit (SwThermalSlowdown)",
    "HwThermalSlowdown": "hardware thermal protection (HwThermalSlowdown)",
    "HwSlowdown": "a hardware slowdown (HwSlowdown: overheating or a power-supply alarm)",
}
POWER_REASONS = frozenset({"SwPowerCap", "HwPowerBrakeSlowdown"})

#: Power limits within this many watts of each other are the same setting (NVML reports mW and
#: nvidia-smi sets whole watts).
_SAME_LIMIT_W = 1.0


def _observed(device: dict, reason: str) -> bool:
    """Whether the reason's share rests on enough observation: counter coverage for a reason the
    driver counts, else enough bitmask snapshots."""
    if reason in (device.get("throttle_s") or {}):
        return (device.get("throttle_observed_s") or 0.0) >= T.THROTTLE_MIN_OBSERVED_S
    return (device.get("throttle_snapshots") or 0) >= T.THROTTLE_MIN_SNAPSHOTS


def _worst_device(gpu: dict) -> tuple[dict, dict[str, float]] | None:
    """The device the command could use with the largest well-observed clock-limiting share, and
    those shares (reason → fraction of the window), or ``None``."""
    chosen = set(gpu.get("device_indices") or [])
    best = None
    for d in gpu.get("devices") or []:
        if chosen and d.get("index") not in chosen:
            continue
        shares = {name: s for name, s in (d.get("throttle_share") or {}).items()
                  if name in CLOCK_LIMITING_REASONS and s and _observed(d, name)}
        if shares and (best is None or max(shares.values()) > max(best[1].values())):
            best = (d, shares)
    return best


def _power_limit_at_max(d: dict) -> bool | None:
    """Whether the enforced power limit is already the largest settable one (``None``: unknown)."""
    limit, top = d.get("power_limit_w"), d.get("power_limit_max_w")
    if limit is None or top is None:
        return None
    return limit >= top - _SAME_LIMIT_W


def throttling(facts: RunFacts) -> dict | None:
    """The GPU's clocks were cut by power or thermal limits for a meaningful share of the window.

    Reads ``facts.gpu`` (:func:`whyidle.analysis.gpu.gpu_metrics` over the analyzed steps'
    window): per device (``devices``, restricted to ``device_indices``) ``throttle_share`` (from
    NVML's cumulative throttle-time counters where the driver has them, else the share of
    clocks-event bitmask snapshots), ``throttle_s``, ``throttle_observed_s``,
    ``throttle_snapshots``, ``throttle_source``, ``sm_clock_throttled_mean_mhz``,
    ``sm_clock_mean_mhz``, ``sm_clock_max_mhz``, ``util_mean``, ``gr_active_mean``,
    ``power_mean_w``, ``power_limit_w``, ``power_limit_default_w``, ``power_limit_max_w``.

    Fires (severity ``warning``) when a clock-limiting reason (:data:`CLOCK_LIMITING_REASONS`:
    SwPowerCap, HwSlowdown, SwThermalSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown; never
    GpuIdle, ApplicationsClocksSetting, SyncBoost or DisplayClockSetting) covers at least
    ``THROTTLE_SHARE_WARN`` of the window on some device, observed long enough
    (``THROTTLE_MIN_OBSERVED_S`` of counters, or ``THROTTLE_MIN_SNAPSHOTS`` snapshots).

    ``est_speedup``: while throttled the SM clock runs at ``r`` = throttled mean clock / maximum
    clock, and work that scales with the clock takes 1/r as long. Throttled work is at most the
    throttled share ``s`` (the largest reason's share: reasons overlap, so the largest is a lower
    bound of their union) and at most the busy share ``b`` (NVML utilization, else GPM graphics
    activity, else 1), so removing the limit gives at most ``1 / (1 − min(s, b)·(1 − r))``, bounded
    by 1/r. It is an upper bound: memory-bound kernels gain less than the clock ratio. ``None``
    when the throttled clock or the maximum clock is unknown, and when the only cause is the power
    cap with the limit already at its maximum (nothing the user can raise).
    """
    gpu = facts.gpu
    if not gpu:
        return None
    worst = _worst_device(gpu)
    if worst is None:
        return None
    d, shares = worst
    # the largest share; on a tie the specific reason, not the HwSlowdown umbrella it sets too
    reason, share = max(shares.items(), key=lambda kv: (kv[1], kv[0] != "HwSlowdown"))
    if share < T.THROTTLE_SHARE_WARN:
        return None
    share = min(1.0, share)

    clock, clock_max = d.get("sm_clock_throttled_mean_mhz"), d.get("sm_clock_max_mhz")
    ratio = min(1.0, clock / clock_max) if clock and clock_max else None
    busy = d["util_mean"] / 100 if d.get("util_mean") is not None else d.get("gr_active_mean")
    at_max = _power_limit_at_max(d)
    power_only = set(shares) <= {"SwPowerCap"}
    est = None
    if ratio is not None and not (power_only and at_max):
        est = 1.0 / (1.0 - min(share, 1.0 if busy is None else busy) * (1.0 - ratio))

    several = len(gpu.get("device_indices") or []) > 1
    who = f"GPU {d.get('index')}'s clocks" if several else "The GPU's clocks"
    source = "NVML throttle-time counters" if reason in (d.get("throttle_s") or {}) else "NVML clock-event snapshots"
    others = sorted(((n, s) for n, s in shares.items() if n != reason), key=lambda kv: -kv[1])
    also = "; also " + ", ".join(f"{n} {s:.0%}" for n, s in others) if others else ""
    summary = f"{who} were cut by {REASON_TEXT[reason]} {share:.0%} of the analyzed time ({source}{also})"
    shown_clock = clock or d.get("sm_clock_mean_mhz")
    if shown_clock and clock_max:
        when = "while throttled" if clock else "on average"
        summary += f"; the SM clock ran at {shown_clock:,.0f} MHz {when}, of a {clock_max:,.0f} MHz maximum"
    if power_only and at_max:
        summary += f", with the power limit already at its maximum ({d['power_limit_w']:.0f} W)"
    summary += "."

    fix, code = _fix(d, set(shares), at_max)
    evidence = _round({
        "device": d.get("index"), "reason": reason, "share": share,
        "source": d.get("throttle_source"), "observed_s": d.get("throttle_observed_s"),
        "snapshots": d.get("throttle_snapshots"),
        "sm_clock_throttled_mean_mhz": clock, "sm_clock_mean_mhz": d.get("sm_clock_mean_mhz"),
        "sm_clock_max_mhz": clock_max, "clock_ratio": ratio, "busy_share": busy,
        "power_mean_w": d.get("power_mean_w"), "power_limit_w": d.get("power_limit_w"),
        "power_limit_max_w": d.get("power_limit_max_w"),
    })
    evidence["shares"] = _round(shares)
    evidence["throttle_s"] = _round(d["throttle_s"]) if d.get("throttle_s") else None
    return finding("throttling", "warning", "GPU clocks throttled", summary, evidence, est,
                   fix, code=code, docs=[DOCS_REASONS, DOCS_NVIDIA_SMI], bound=bound_of(est))


def _fix(d: dict, reasons: set[str], at_max: bool | None) -> tuple[str, str]:
    """Fix text and shell commands for the reasons seen on device ``d``."""
    i = d.get("index", 0)
    parts = []
    code = ["nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE   # why the clocks are cut, limits, temperatures",
            ("nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu "
             "--format=csv -l 1   # watch them while training")]
    if "SwPowerCap" in reasons:
        limit, top = d.get("power_limit_w"), d.get("power_limit_max_w")
        if at_max is False:
            parts.append(f"The power limit is set to {limit:.0f} W of a possible {top:.0f} W: raise it "
                         f"(root needed; it resets at reboot), and check that no other job shares this GPU.")
            code.append(f"sudo nvidia-smi -i {i} -pl {top:.0f}   # raise the power limit to its maximum")
        elif at_max:
            parts.append("The GPU already draws the most power it may: it is working flat out. Check that no "
                         "other job shares this GPU (nvidia-smi lists its processes); otherwise this is the "
                         "hardware's ceiling.")
        else:
            parts.append("Check the power limit (power.limit vs power.max_limit) and raise it if it was "
                         f"lowered: sudo nvidia-smi -i {i} -pl WATTS. Check that no other job shares this GPU.")
    if "HwPowerBrakeSlowdown" in reasons:
        parts.append("An external power brake is asserted by the system (power supply or chassis): ask the "
                     "administrator to check the node's power delivery.")
    if reasons & {"SwThermalSlowdown", "HwThermalSlowdown", "HwSlowdown"}:
        parts.append("The GPU runs too hot: check its temperature, fans and airflow, the inlet/room "
                     "temperature, and other busy GPUs or jobs heating the same chassis.")
    return " ".join(parts), "\n".join(code)
