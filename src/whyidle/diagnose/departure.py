"""Has the running job departed from its own baseline? The rolling diagnosis's trigger
(:mod:`whyidle.run.rolling`): a window that departs gets a deep profiler trace.

A step is *slow* past the baseline's median + :data:`MAD_K` × MAD (Google's
ml-goodput-measurement flags step anomalies at median + 3·MAD); a window departs when a share of
its steps past :data:`SLOW_SHARE` is slow, when its data-wait, host or GPU-idle share rose past
:data:`SHARE_RISE` over the baseline's, when its samples/s fell below :data:`SPS_FALL` of the
baseline's, when a new culprit rank appears in a distributed job, or when its verdict turns from
a healthy one to a finding.
"""

from __future__ import annotations

from whyidle.analysis.baseline import Baseline

#: Slow step: longer than median + MAD_K × MAD of the baseline (ml-goodput-measurement's 3·MAD).
MAD_K = 3.0
#: MAD floor as a fraction of the median: a job whose steps are all equal (MAD 0) would call every
#: step 1 % longer slow; 5 % of the median is below any slowdown worth a trace.
MAD_FLOOR = 0.05
#: Share of a window's steps that must be slow for the window to depart.
SLOW_SHARE = 0.25
#: Rise of a share of step time (data wait, host) or of wall time (GPU idle), in fraction points,
#: that departs: 10 points is where the input_bound rule warns (DATA_WAIT_WARN).
SHARE_RISE = 0.10
#: Samples/s below this fraction of the baseline's departs (a 20 % throughput loss).
SPS_FALL = 0.80
#: Steps a baseline needs before anything departs from it.
MIN_BASELINE_STEPS = 20
#: Steps a window needs to be judged.
MIN_WINDOW_STEPS = 5
#: Healthy verdicts: nothing upstream of the device holds the job.
HEALTHY = ("device_bound", "small_workload", "no_steps")


def slow_share(durations: list[float], baseline: Baseline) -> float | None:
    """Fraction of ``durations`` (seconds) past the baseline's median + MAD_K·MAD; None without a
    baseline."""
    stats = baseline.step_stats()
    if not durations or stats is None or baseline.steps < MIN_BASELINE_STEPS:
        return None
    med, mad = stats
    limit = med + MAD_K * max(mad, MAD_FLOOR * med)
    return sum(d > limit for d in durations) / len(durations)


def departures(window: dict, durations: list[float], baseline: Baseline) -> list[str]:
    """Why ``window`` (a ``window`` record, docs/run-format.md) departs from ``baseline``: one short
    sentence per reason, empty when it does not (or when there is too little to judge)."""
    if window.get("steps", 0) < MIN_WINDOW_STEPS or baseline.steps < MIN_BASELINE_STEPS:
        return []
    out = []
    slow = slow_share(durations, baseline)
    if slow is not None and slow >= SLOW_SHARE:
        med, mad = baseline.step_stats()
        out.append(f"{slow:.0%} of the steps slower than the baseline's median + {MAD_K:g}·MAD "
                   f"({1000 * (med + MAD_K * max(mad, MAD_FLOOR * med)):.1f} ms)")
    for key, name in (("data_wait", "data wait"), ("other_host", "host work")):
        now, base = (window.get("shares") or {}).get(key), baseline.figure("shares", key)
        if now is not None and base is not None and now - base >= SHARE_RISE:
            out.append(f"{name} rose from {base:.0%} to {now:.0%} of the step")
    idle, base_idle = _gpu_idle(window), _median_idle(baseline)
    if idle is not None and base_idle is not None and idle - base_idle >= SHARE_RISE:
        out.append(f"GPU idle rose from {base_idle:.0%} to {idle:.0%}")
    sps, base_sps = window.get("samples_per_s"), baseline.figure("samples_per_s")
    if sps is not None and base_sps and sps < SPS_FALL * base_sps:
        out.append(f"samples/s fell from {base_sps:.0f} to {sps:.0f}")
    culprit = (window.get("collective") or {}).get("culprit_rank")
    if culprit is not None and culprit != baseline.culprit():
        out.append(f"rank {culprit} became the rank the others wait for")
    if baseline.verdict() in HEALTHY and window.get("verdict") not in HEALTHY:
        out.append(f"verdict {baseline.verdict()} → {window.get('verdict')}")
    return out


def _gpu_idle(window: dict) -> float | None:
    gpu = window.get("gpu") or {}
    if gpu.get("idle_share") is not None:
        return gpu["idle_share"]
    return None if gpu.get("util_mean") is None else 1.0 - gpu["util_mean"] / 100.0


def _median_idle(baseline: Baseline) -> float | None:
    vals = sorted(v for v in (_gpu_idle(w) for w in baseline.windows) if v is not None)
    return vals[len(vals) // 2] if vals else None
