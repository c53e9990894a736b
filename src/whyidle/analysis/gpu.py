"""GPU metrics from ``gpu.jsonl`` records (pure: plain dicts in, plain dicts out; no pynvml).

Definitions (sampling.md §1.1, §1.2):

* A driver utilization sample (``gpu_util``) is the percent of the driver's sample period, ending at
  the sample's timestamp, in which at least one kernel ran (``type="gpu"``) or device memory was read
  or written (``type="mem"``). It covers ``(previous sample, this sample]``; the first sample of a
  device covers one median spacing before it; a sample after a gap longer than
  :data:`MAX_GAP_FACTOR` spacings covers only that many spacings (the rest is unobserved).
* The mean over a window is weighted by the time each sample covers inside the window, so a window
  shorter than the driver period still gets the value of the sample that covers it.
* Without any buffer sample in the window, the mean falls back to the ``util_pct`` snapshots of
  ``gpu_state`` taken inside it (each one is ``nvmlDeviceGetUtilizationRates`` over the last driver
  period before the poll), as a plain mean.
* A GPM window (``gpm``, sampling.md §1.8) covers ``[t0, t1]``, the window's metric is its mean
  over that time; a mean over the analysis window weights each GPM window by its overlap with it.
* Throttle counters (``gpu_counters``, cumulative ns per clocks-event reason, sampling.md §1.5)
  between two reads are spread evenly over the time between them, so the throttled time inside the
  analysis window is the counter difference times the overlapping fraction of each interval. An
  interval whose counter went down (driver reload) is unobserved; an increment is capped at the
  interval's length.

All times are monotonic nanoseconds (``docs/run-format.md``); windows are inclusive ``(t0, t1)``.
"""

from __future__ import annotations

import itertools

import numpy as np

from whyidle.analysis.facts import DeviceInfo, GpuMetrics

#: A sample covers at most this many median spacings. Longer gaps are buffer overruns or buffers that
#: ran dry (sampling.md §1.2, polarsignals report), not one long driver period.
MAX_GAP_FACTOR = 4

#: Period assumed for a device's only sample: 1/6 s, the shortest driver period (nvml.h
#: ``nvmlUtilization_t``; gpustat's mock uses 167 000 µs).
DEFAULT_SAMPLE_PERIOD_NS = 166_666_667

#: ``nvmlClocksEventReason*`` bits (nvml.h; sampling.md §1.5). GpuIdle is not a throttle.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",
    0x400: "Reliability",
}

#: Reasons that mean the clocks were cut below what the work asked for: power or thermal limits
#: (nvml.h comments of the ``nvmlClocksEventReason*`` bits). Not GpuIdle (no work), nor
#: ApplicationsClocksSetting / DisplayClockSetting (a configured clock), nor SyncBoost (held to
#: match the slowest GPU of a sync-boost group), nor BoardLimit / Reliability (rare, undocumented
#: meaning for training).
CLOCK_LIMITING_REASONS = frozenset(
    {"SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})

#: GPM record keys averaged over the window (fractions 0–1) → metric name.
GPM_FRACTIONS: dict[str, str] = {
    "sm_active": "sm_active_mean",
    "sm_occupancy": "sm_occupancy_mean",
    "tensor_active": "tensor_active_mean",
    "dram_active": "dram_active_mean",
    "gr_active": "gr_active_mean",
    "fp16_active": "fp16_active_mean",
    "fp32_active": "fp32_active_mean",
}

Window = tuple[int, int] | None


def throttle_reason_names(mask: int) -> list[str]:
    """Names of the clocks-event reason bits set in ``mask``, GpuIdle excluded, in bit order."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit and name != "GpuIdle"]


def _static(records: list[dict]) -> dict | None:
    for r in records:
        if r.get("k") == "gpu_static" and r.get("devices"):
            return r
    return None


def selected_devices(static: dict) -> list[dict]:
    """The devices the observed command could use: those named by ``CUDA_VISIBLE_DEVICES`` (NVML
    index or UUID prefix) when it was set and names at least one known device, else all.

    Integer entries are taken as NVML indices, which equal CUDA's order on machines of identical
    GPUs (CUDA orders fastest first, then by PCI bus id). As in CUDA, parsing stops at the first
    entry that names no device. ``MIG-`` entries cannot be mapped and select all devices.
    """
    devices = static["devices"]
    cvd = static.get("cuda_visible_devices")
    if not cvd:
        return devices
    chosen: list[dict] = []
    for token in (t.strip() for t in cvd.split(",")):
        match = [d for d in devices
                 if (token.isdigit() and d.get("index") == int(token))
                 or (token.startswith("GPU-") and str(d.get("uuid") or "").startswith(token))]
        if not match or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen or devices


def _in(t: int, window: Window) -> bool:
    return window is None or window[0] <= t <= window[1]


def _samples(records: list[dict], dev: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """All buffer samples of one device and type: (t_ns, value) sorted by time, duplicates dropped."""
    pts = {(s[0], s[1]) for r in records
           if r.get("k") == "gpu_util" and r.get("dev") == dev and r.get("type") == kind
           for s in r["samples"]}
    if not pts:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    t, v = zip(*sorted(pts))
    return np.asarray(t, dtype=np.int64), np.asarray(v, dtype=float)


def _coverage(t: np.ndarray) -> np.ndarray:
    """Start time of the period each sample covers (see the module docstring)."""
    if len(t) == 1:
        return t - DEFAULT_SAMPLE_PERIOD_NS
    spacing = float(np.median(np.diff(t)))
    prev = np.concatenate(([t[0] - spacing], t[:-1]))
    return np.maximum(prev, t - MAX_GAP_FACTOR * spacing)


def _time_weighted(t: np.ndarray, v: np.ndarray, window: Window) -> tuple[float | None, int]:
    """(time-weighted mean over the window, number of samples with time inside it)."""
    if len(t) == 0:
        return None, 0
    start, end = _coverage(t).astype(float), t.astype(float)
    if window is not None:
        start, end = np.maximum(start, window[0]), np.minimum(end, window[1])
    w = np.clip(end - start, 0.0, None)
    if w.sum() <= 0:
        return None, 0
    return float(np.dot(w, v) / w.sum()), int(np.count_nonzero(w))


def util_over(records: list[dict], windows: list[tuple[int, int]]) -> float | None:
    """The selected devices' mean kernel-activity percent (driver ``gpu`` samples, 0–100) over the
    union of ``windows`` (monotonic ns, disjoint), each sample weighted by the time it covers inside
    them; None without samples there (e.g. evaluation vs training time of one run)."""
    static = _static(records)
    if static is None or not windows:
        return None
    acc = covered = 0.0
    for device in selected_devices(static):
        t, v = _samples(records, device.get("index"), "gpu")
        if not len(t):
            continue
        start, end = _coverage(t).astype(float), t.astype(float)
        for a, b in windows:
            w = np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None)
            acc += float(np.dot(w, v))
            covered += float(w.sum())
    return acc / covered if covered > 0 else None


def _mean(values: list) -> float | None:
    vals = [x for x in values if x is not None]
    return float(np.mean(vals)) if vals else None


def _util(records: list[dict], states: list[dict], dev: int, kind: str,
          window: Window) -> tuple[float | None, int, str | None]:
    """(mean percent, count used, source) for one device: buffer samples, else snapshots."""
    mean, n = _time_weighted(*_samples(records, dev, kind), window)
    if mean is not None:
        return mean, n, "samples"
    key = "util_pct" if kind == "gpu" else "mem_util_pct"
    snaps = [s.get(key) for s in states if s.get(key) is not None]
    if snaps:
        return _mean(snaps), len(snaps), "snapshots"
    return None, 0, None


def _overlap(a: int, b: int, window: Window) -> int:
    """Nanoseconds of ``[a, b]`` inside the window (all of it without one)."""
    if window is not None:
        a, b = max(a, window[0]), min(b, window[1])
    return max(0, b - a)


def _gpm(records: list[dict], dev: int, window: Window) -> dict:
    """Time-weighted GPM means of one device (``None`` where no window measured the metric) and
    ``gpm_windows``, the number of GPM windows overlapping the analysis window."""
    weights: dict[str, float] = {k: 0.0 for k in GPM_FRACTIONS}
    sums: dict[str, float] = {k: 0.0 for k in GPM_FRACTIONS}
    n = 0
    for r in records:
        if r.get("k") != "gpm" or r.get("dev") != dev:
            continue
        w = _overlap(r["t0"], r["t1"], window)
        if w <= 0:
            continue
        n += 1
        for key in GPM_FRACTIONS:
            if r.get(key) is not None:
                weights[key] += w
                sums[key] += w * r[key]
    out: dict = {name: (sums[key] / weights[key] if weights[key] > 0 else None)
                 for key, name in GPM_FRACTIONS.items()}
    out["gpm_windows"] = n
    return out


def _counter_throttle(records: list[dict], dev: int, window: Window) -> tuple[dict[str, float], float]:
    """(reason → seconds throttled inside the window, seconds the counters observed of it).

    Only reasons the counters reported; ``({}, 0.0)`` without counter reads covering the window.
    The observed time is that of the best-covered reason (all are read in one call).
    """
    series: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        if r.get("k") == "gpu_counters" and r.get("dev") == dev:
            for name, ns in (r.get("throttle_ns") or {}).items():
                if ns is not None:
                    series.setdefault(name, []).append((r["t"], ns))
    seconds: dict[str, float] = {}
    observed = 0.0
    for name, pts in series.items():
        pts.sort()
        throttled = covered = 0.0
        for (ta, va), (tb, vb) in itertools.pairwise(pts):
            dt, dv = tb - ta, vb - va
            if dt <= 0 or dv < 0:  # same instant, or a counter reset: unobserved
                continue
            o = _overlap(ta, tb, window)
            if o > 0:
                throttled += min(dv, dt) * o / dt
                covered += o
        if covered > 0:
            seconds[name] = throttled / 1e9
            observed = max(observed, covered / 1e9)
    return seconds, observed


def _limits(records: list[dict], dev: int) -> dict:
    """The newest ``gpu_limits`` record of a device, or ``{}``."""
    found = [r for r in records if r.get("k") == "gpu_limits" and r.get("dev") == dev]
    return found[-1] if found else {}


def _device_metrics(records: list[dict], device: dict, window: Window) -> dict:
    dev = device.get("index")
    states = [r for r in records
              if r.get("k") == "gpu_state" and r.get("dev") == dev and _in(r.get("t", 0), window)]
    util, n, source = _util(records, states, dev, "gpu", window)
    mem_util, _, _ = _util(records, states, dev, "mem", window)
    used = [s["mem_used_bytes"] for s in states if s.get("mem_used_bytes") is not None]
    masks = [s["clocks_event_reasons"] for s in states if s.get("clocks_event_reasons") is not None]
    share = {}
    for name in THROTTLE_REASONS.values():
        hits = sum(1 for m in masks if name in throttle_reason_names(m))
        if hits:
            share[name] = hits / len(masks)
    throttle_s, observed = _counter_throttle(records, dev, window)
    for name, secs in throttle_s.items():  # counters see every ns; snapshots only poll instants
        share.pop(name, None)
        if secs > 0:
            share[name] = min(1.0, secs / observed)
    limited = [s.get("sm_clock_mhz") for s in states if s.get("clocks_event_reasons") is not None
               and CLOCK_LIMITING_REASONS & set(throttle_reason_names(s["clocks_event_reasons"]))]
    total = device.get("memory_total_bytes")
    if total is None:
        total = next((s["mem_total_bytes"] for s in states if s.get("mem_total_bytes")), None)
    limits = _limits(records, dev)
    return {
        "index": dev, "name": device.get("name"),
        "util_mean": util, "util_source": source, "util_samples": n,
        "mem_util_mean": mem_util,
        "memory_used_max_bytes": max(used) if used else None,
        "memory_total_bytes": total,
        "sm_clock_mean_mhz": _mean([s.get("sm_clock_mhz") for s in states]),
        "sm_clock_throttled_mean_mhz": _mean(limited),
        "sm_clock_max_mhz": limits.get("sm_clock_max_mhz"),
        "power_mean_w": _mean([s.get("power_w") for s in states]),
        "power_limit_w": limits.get("power_limit_w"),
        "power_limit_default_w": limits.get("power_limit_default_w"),
        "power_limit_max_w": limits.get("power_limit_max_w"),
        "throttle_reasons": sorted(share),
        "throttle_share": share,
        "throttle_s": throttle_s or None,
        "throttle_source": "counters" if throttle_s else ("snapshots" if masks else None),
        "throttle_observed_s": observed if throttle_s else None,
        "throttle_snapshots": len(masks),
        **_gpm(records, dev, window),
    }


def gpu_metrics(records: list[dict], window: tuple[int, int] | None = None) -> GpuMetrics | None:
    """GPU metrics of a run over ``window`` (monotonic ns, inclusive; ``None`` = everything).

    Args:
        records: ``gpu.jsonl`` records (``gpu_static``, ``gpu_util``, ``gpu_state``, ...).
        window: ``(t0, t1)`` in monotonic ns.

    Returns:
        ``None`` when no ``gpu_static`` record lists a device (the report then shows
        ``metrics.gpu = null``, never zeros). Otherwise a dict:

        * ``util_mean``: percent of time a kernel ran (NVML duty cycle), time-weighted over the
          window; ``util_source``: ``"samples"`` (driver buffer) or ``"snapshots"``
          (``nvmlDeviceGetUtilizationRates`` at each poll), ``"mixed"`` across devices;
          ``util_samples``: samples or snapshots used;
        * ``mem_util_mean``: percent of time device memory was read or written (not capacity);
        * ``memory_used_max_bytes``, ``memory_total_bytes``: peak used and capacity of one device;
        * ``sm_clock_mean_mhz``, ``power_mean_w``: means of the per-poll snapshots;
          ``sm_clock_throttled_mean_mhz``: mean SM clock of the snapshots whose bitmask held a
          :data:`CLOCK_LIMITING_REASONS` reason; ``sm_clock_max_mhz`` (MHz), ``power_limit_w``,
          ``power_limit_default_w``, ``power_limit_max_w`` (W): from ``gpu_limits``;
        * ``throttle_reasons``: sorted clocks-event reason names seen (GpuIdle excluded);
          ``throttle_share``: name → fraction of the window with that reason: from the counters
          (throttled seconds / seconds the counters observed) where the driver has a counter for
          it, else the fraction of ``gpu_state`` snapshots with its bit set; only reasons > 0;
        * ``throttle_s``: reason → seconds of throttling inside the window from the cumulative
          counters (``SwPowerCap``, ``SyncBoost``, ``SwThermalSlowdown``, ``HwThermalSlowdown``,
          ``HwPowerBrakeSlowdown``; 0.0 is a measured zero), ``None`` without counters;
          ``throttle_observed_s``: seconds of the window the counters covered (``None`` without);
          ``throttle_snapshots``: bitmask snapshots in the window; ``throttle_source``:
          ``"counters"``, ``"snapshots"``, ``"mixed"`` across devices, or ``None``;
        * GPM (Hopper and newer), fractions 0–1 time-weighted by each GPM window's overlap with the
          window: ``sm_active_mean`` (share of SMs busy, ≈ DCGM SM_ACTIVE), ``sm_occupancy_mean``
          (active warps / maximum), ``tensor_active_mean`` (any tensor pipe), ``dram_active_mean``
          (DRAM bandwidth / peak), ``gr_active_mean`` (time any kernel ran), ``fp16_active_mean``,
          ``fp32_active_mean`` (non-tensor pipes); ``None`` when no GPM window measured them;
          ``gpm_windows``: GPM windows overlapping the window;
        * ``devices``: the same per device, with ``index`` and ``name``.

        With several devices, the top level covers the devices the command could use (see
        :func:`selected_devices`): means of the per-device means, the largest peak memory and the
        smallest capacity, the union of reasons (share, ``throttle_s``, ``throttle_observed_s`` and
        ``throttle_snapshots``: the largest), summed sample and window counts, the smallest limits.
        A value is ``None`` when nothing measured it (never 0 as a stand-in).
    """
    static = _static(records)
    if static is None:
        return None
    chosen = {d.get("index") for d in selected_devices(static)}
    devices = [_device_metrics(records, d, window) for d in static["devices"]]
    top = [d for d in devices if d["index"] in chosen]
    sources = {d["util_source"] for d in top if d["util_source"]}
    used = [d["memory_used_max_bytes"] for d in top if d["memory_used_max_bytes"] is not None]
    totals = [d["memory_total_bytes"] for d in top if d["memory_total_bytes"] is not None]
    share: dict[str, float] = {}
    throttle_s: dict[str, float] = {}
    for d in top:
        for name, s in d["throttle_share"].items():
            share[name] = max(s, share.get(name, 0.0))
        for name, secs in (d["throttle_s"] or {}).items():
            throttle_s[name] = max(secs, throttle_s.get(name, 0.0))
    throttle_sources = {d["throttle_source"] for d in top if d["throttle_source"]}

    def smallest(key: str) -> float | None:
        vals = [d[key] for d in top if d[key] is not None]
        return min(vals) if vals else None

    def largest(key: str) -> float | None:
        vals = [d[key] for d in top if d[key] is not None]
        return max(vals) if vals else None

    return {
        "util_mean": _mean([d["util_mean"] for d in top]),
        "util_source": sources.pop() if len(sources) == 1 else ("mixed" if sources else None),
        "util_samples": sum(d["util_samples"] for d in top),
        "mem_util_mean": _mean([d["mem_util_mean"] for d in top]),
        "memory_used_max_bytes": max(used) if used else None,
        "memory_total_bytes": min(totals) if totals else None,
        "sm_clock_mean_mhz": _mean([d["sm_clock_mean_mhz"] for d in top]),
        "sm_clock_throttled_mean_mhz": _mean([d["sm_clock_throttled_mean_mhz"] for d in top]),
        "sm_clock_max_mhz": smallest("sm_clock_max_mhz"),
        "power_mean_w": _mean([d["power_mean_w"] for d in top]),
        "power_limit_w": smallest("power_limit_w"),
        "power_limit_default_w": smallest("power_limit_default_w"),
        "power_limit_max_w": smallest("power_limit_max_w"),
        "throttle_reasons": sorted(share),
        "throttle_share": share,
        "throttle_s": throttle_s or None,
        "throttle_source": (throttle_sources.pop() if len(throttle_sources) == 1
                            else ("mixed" if throttle_sources else None)),
        "throttle_observed_s": largest("throttle_observed_s"),
        "throttle_snapshots": max((d["throttle_snapshots"] for d in top), default=0),
        **{name: _mean([d[name] for d in top]) for name in GPM_FRACTIONS.values()},
        "gpm_windows": sum(d["gpm_windows"] for d in top),
        "device_indices": sorted(chosen),
        "devices": devices,
    }


def device_info(records: list[dict]) -> DeviceInfo | None:
    """The report's ``device`` field from ``gpu_static``, or ``None`` without a GPU.

    Returns ``{"kind": "cuda", "name", "compute_capability": "9.0", "memory_total_bytes", "count"}``
    for the first device the command could use (NVML index 0 unless ``CUDA_VISIBLE_DEVICES`` says
    otherwise); ``count`` is how many it could use.
    """
    static = _static(records)
    if static is None:
        return None
    chosen = selected_devices(static)
    first = chosen[0]
    cc = first.get("compute_capability")
    return {
        "kind": "cuda",
        "name": first.get("name"),
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "memory_total_bytes": first.get("memory_total_bytes"),
        "count": len(chosen),
    }


def util_series(records: list[dict], window: tuple[int, int] | None = None,
                max_points: int = 600) -> list[tuple[float, float]]:
    """GPU utilization over time for plots: ``(monotonic seconds, percent)`` pairs, oldest first.

    Uses each selected device's buffer samples (its ``gpu_state`` snapshots if it has none) with
    time in ``window``. Points are averaged into equal-time bins, at most ``max_points`` and at most
    one per sample of the busiest device, so several devices give their mean.
    """
    static = _static(records)
    if static is None or max_points < 1:
        return []
    per_dev = []
    for d in selected_devices(static):
        t, v = _samples(records, d.get("index"), "gpu")
        if len(t) == 0:
            snaps = [(r["t"], r["util_pct"]) for r in records
                     if r.get("k") == "gpu_state" and r.get("dev") == d.get("index")
                     and r.get("util_pct") is not None]
            if snaps:
                t, v = np.array([s[0] for s in snaps], dtype=np.int64), np.array(
                    [s[1] for s in snaps], dtype=float)
        keep = np.ones(len(t), dtype=bool) if window is None else (t >= window[0]) & (t <= window[1])
        if keep.any():
            per_dev.append((t[keep], v[keep]))
    if not per_dev:
        return []
    t = np.concatenate([p[0] for p in per_dev])
    v = np.concatenate([p[1] for p in per_dev])
    n_bins = min(max_points, max(len(p[0]) for p in per_dev))
    lo, hi = int(t.min()), int(t.max())
    if hi == lo:
        n_bins = 1
    edges = np.linspace(lo, hi, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    t_mean = np.bincount(idx, weights=t - lo, minlength=n_bins)[count > 0] / count[count > 0] + lo
    v_mean = np.bincount(idx, weights=v, minlength=n_bins)[count > 0] / count[count > 0]
    return [(float(a) / 1e9, float(b)) for a, b in zip(t_mean, v_mean)]
