"""GPU starvation from the CUDA timeline: how long the GPU queue was empty, why, and where.

Pure (numpy; plain records in, plain dicts out). Input: the ``gpu_marks`` records of one trainer
(``docs/run-format.md``): for each mark the host time ``h`` (monotonic ns) at which a CUDA event
was recorded on the training stream, the GPU time ``g`` (ns, chained ``elapsed_time``) at which the
stream reached it, the host phase that followed it, and its kind (phase boundary, step boundary,
stack-sample probe with its source line, sync with its source line).

Definitions:

* **Lag** of a mark: the GPU work queued ahead of it when it was recorded,
  ``lag = (g − h) − offset``, where ``offset`` (GPU clock minus host clock) is the smallest
  ``g − h`` among the marks within :data:`OFFSET_WINDOW_NS` (a mark recorded on an empty queue
  completes at once; a rolling window absorbs drift between the two clocks). Lags below
  :data:`LAG_EMPTY_NS` count as an empty queue.
* **Starved time** of the interval between two consecutive marks: the queue drains the lag of the
  first mark, then the GPU has nothing until the host's next mark:
  ``starved = clip(Δh − lag, 0, Δh)``, placed at the end of the interval. This is exact when the
  host launches no GPU work inside the interval (data wait, the wait for and the code after a
  sync, Python between steps) and an upper bound otherwise (work launched early in an interval
  whose queue then runs dry again); marks at every phase boundary and every stack sample keep
  intervals short. Reported as ``idle``/"GPU starved": the measured time the GPU waited, not
  NVML's utilization.
* **Cause** of an interval's starved time: ``data`` in the data-wait phase; ``sync`` from a
  synchronization until the queue holds work again (the idle a sync exposes: everything the host
  does after it — more reads, the optimizer's Python, the next forward's first launches — can no
  longer hide behind queued work), across phase boundaries but not into a data wait. When the
  queue does not refill before the end of the next step (a launch-bound loop, whose queue never
  builds up, sync or not), the sync is charged only up to the host's next phase boundary;
  ``launch`` in forward, backward, optimizer and eval (the host issues work more slowly than the
  GPU runs it: launch-bound); ``host`` in the rest of the step (Python, logging, metrics); ``other``
  before the first step.
* **Idle sites**: a probe's stack sample stands for the wall time since the previous sample; the
  starved time inside that span is attributed to the sample's source line (the innermost frame
  of the user's code).
"""

from __future__ import annotations

import re

import numpy as np

from whyidle.analysis.stacks import source_line
from whyidle.analysis.stepcols import StepCols

#: A queue holding less than this much work counts as empty: the jitter of recording an event
#: and having the GPU process it (a few µs on current GPUs) must not read as queued work.
LAG_EMPTY_NS = 20_000

#: Width of the rolling window for the GPU−host clock offset. Clocks drift by at most tens of ppm
#: (≤ 0.25 ms per 5 s at 50 ppm) and a training loop leaves its queue empty at least once every
#: few seconds (a sync, a data wait, the end of an epoch).
OFFSET_WINDOW_NS = 5_000_000_000

CAUSES = ("data", "sync", "host", "launch", "other")

#: Cause of starved time by host phase (when not in a sync's shadow).
PHASE_CAUSE = {"data": "data", "forward": "launch", "backward": "launch", "optimizer": "launch",
               "eval": "launch", "other": "host"}

#: Source-text patterns naming the operation behind a sync, first match wins.
SYNC_OPS = (
    (re.compile(r"\.item\(\)"), "item"),
    (re.compile(r"\.tolist\(\)"), "tolist"),
    (re.compile(r"\.cpu\(\)|\.to\(['\"]cpu['\"]|device=['\"]cpu"), "cpu"),
    (re.compile(r"\.numpy\(\)"), "numpy"),
    (re.compile(r"\bprint\(|\blog|f['\"]"), "print/format"),
    (re.compile(r"\.nonzero\(|\bnonzero\(|\bwhere\(\s*[^,()]+\)"), "nonzero"),
    (re.compile(r"synchronize\("), "synchronize"),
    (re.compile(r"\.to\(|\.cuda\(|\.copy_\("), "copy"),
    (re.compile(r"^\s*(if|elif|while|assert)\b"), "bool"),
)

#: Idle sites reported at most.
MAX_SITES = 10


def _marks(records: list[dict]) -> dict | None:
    """The ``gpu_marks`` records concatenated into columns, or None without any."""
    recs = [r for r in records if r.get("k") == "gpu_marks" and r.get("h")]
    if not recs:
        return None
    h = np.concatenate([np.asarray(r["h"], dtype=np.int64) for r in recs])
    g = np.concatenate([np.asarray(r["g"], dtype=np.float64) for r in recs])
    phase = [p for r in recs for p in r["phase"]]
    kind = [k for r in recs for k in r["kind"]]
    extra: dict[int, list] = {}
    base = 0
    for r in recs:
        for idx, value in r.get("extra") or []:
            extra[base + int(idx)] = value
        base += len(r["h"])
    return {"h": h, "g": g, "phase": phase, "kind": kind, "extra": extra}


def lags(h: np.ndarray, g: np.ndarray, window_ns: int = OFFSET_WINDOW_NS) -> np.ndarray:
    """Lag of each mark in ns (see the module docstring), ≥ 0, zero below :data:`LAG_EMPTY_NS`.

    Args:
        h: host times, ns, ascending. g: GPU times of the same marks, ns.
        window_ns: width of the rolling offset window.
    """
    d = g - h.astype(np.float64)
    n = len(d)
    if n == 0:
        return d
    half = window_ns // 2
    lo = np.searchsorted(h, h - half, side="left")
    hi = np.searchsorted(h, h + half, side="right")
    # rolling minimum over variable windows: a sparse table of minima over powers of two
    table = [d]
    k = 1
    while 2 * k <= n:
        prev = table[-1]
        table.append(np.minimum(prev[:-k], prev[k:]))
        k *= 2
    length = hi - lo
    level = np.floor(np.log2(np.maximum(length, 1))).astype(int)
    offset = np.empty(n)
    for lv in np.unique(level):
        sel = level == lv
        span = 1 << int(lv)
        tab = table[lv]
        offset[sel] = np.minimum(tab[lo[sel]], tab[hi[sel] - span])
    lag = d - offset
    lag[lag < LAG_EMPTY_NS] = 0.0
    return lag


def _intervals(m: dict, lag: np.ndarray) -> dict:
    """Per interval between consecutive marks: starved ns, cause, the sync it is charged to."""
    h, g, kind, phase = m["h"], m["g"], m["kind"], m["phase"]
    dh = np.diff(h).astype(np.float64)
    starved = np.clip(dh - lag[:-1], 0.0, dh)
    starved = np.minimum(starved, np.maximum(np.diff(g), 0.0))
    known = np.array([k != "gap" for k in kind[1:]], dtype=bool)
    starved[~known] = 0.0
    n = len(h)
    # next mark at which the queue holds work again, and the second step boundary ahead
    next_refill = np.full(n, n, dtype=np.int64)
    step_after_next = np.full(n, n, dtype=np.int64)
    refill, steps_ahead = n, [n, n]
    for i in range(n - 1, -1, -1):
        next_refill[i] = refill
        step_after_next[i] = steps_ahead[1]
        if lag[i] > 0.0:
            refill = i
        if kind[i] == "step":
            steps_ahead = [i, steps_ahead[0]]
    cause: list[str] = []
    charged: list[int] = []
    current = -1
    extended = False
    for i in range(len(dh)):
        k = kind[i]
        if k == "sync":
            current = i
            extended = next_refill[i] < step_after_next[i]
        elif current >= 0 and (lag[i] > 0.0 or phase[i] == "data"
                               or not (extended or (k == "probe" and lag[i] == 0.0))):
            current = -1
        ph = phase[i]
        if ph == "data":
            cause.append("data")
            charged.append(-1)
        elif current >= 0:
            cause.append("sync")
            charged.append(current)
        else:
            cause.append(PHASE_CAUSE.get(ph, "other"))
            charged.append(-1)
    return {"dh": dh, "starved": starved, "known": known, "cause": cause, "charged": np.asarray(charged, dtype=np.int64)}


class _Starved:
    """Cumulative starved time S(t) over the analysis window (starved ranges sit at the end of
    their intervals), for attributing time spans."""

    def __init__(self, h: np.ndarray, starved: np.ndarray, window: tuple[int, int]) -> None:
        b = h[1:].astype(np.float64)
        a = b - starved
        a = np.clip(a, window[0], window[1])
        b = np.clip(b, window[0], window[1])
        keep = b > a
        self.a, self.b = a[keep], b[keep]
        self.cum = np.concatenate(([0.0], np.cumsum(self.b - self.a)))

    def __call__(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        idx = np.searchsorted(self.b, t, side="right")  # ranges fully before t
        out = self.cum[idx].copy()
        inside = idx < len(self.a)
        j = idx[inside]
        out[inside] += np.clip(t[inside] - self.a[j], 0.0, None)
        return out


def _op_of(site: str | None, explicit: str | None, root: str | None) -> str | None:
    if explicit:
        return explicit
    text = source_line(site, root) if site else None
    if not text:
        return None
    for pattern, name in SYNC_OPS:
        if pattern.search(text):
            return name
    return "implicit"


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    arr = np.asarray(values)
    return {"p50": float(np.median(arr)), "mean": float(arr.mean()), "max": float(arr.max())}


def _prepare(records: list[dict]) -> tuple[dict, dict] | None:
    """The marks in host-time order and their intervals (:func:`_intervals`), or None with fewer
    than two marks."""
    m = _marks(records)
    if m is None or len(m["h"]) < 2:
        return None
    order = np.argsort(m["h"], kind="stable")
    if np.any(order != np.arange(len(order))):  # records from one thread are in order already
        new_index = np.empty_like(order)
        new_index[order] = np.arange(len(order))
        m = {"h": m["h"][order], "g": m["g"][order], "phase": [m["phase"][i] for i in order],
             "kind": [m["kind"][i] for i in order],
             "extra": {int(new_index[i]): v for i, v in m["extra"].items()}}
    return m, _intervals(m, lags(m["h"], m["g"]))


def starved_ranges(records: list[dict]) -> dict | None:
    """Where on the host clock the GPU was starved, and why, for timelines.

    Args:
        records: one trainer's ``proc-<pid>.jsonl`` records (only ``gpu_marks`` are read).
    Returns:
        None without at least two marks; else ``{"t0", "t1"`` (int64 arrays, monotonic ns: one
        range per interval between consecutive marks with starved time, placed at the interval's
        end as in :func:`gpu_idle`), ``"cause"`` (list of str, one of :data:`CAUSES`)``}``, in
        time order. Their sum over any window is what :func:`gpu_idle` reports for it.
    """
    prepared = _prepare(records)
    if prepared is None:
        return None
    m, iv = prepared
    b = m["h"][1:]
    starved = iv["starved"]
    keep = starved > 0
    t1 = b[keep].astype(np.int64)
    t0 = t1 - np.rint(starved[keep]).astype(np.int64)
    return {"t0": t0, "t1": t1, "cause": [c for c, k in zip(iv["cause"], keep.tolist()) if k]}


def gpu_idle(records: list[dict], window: tuple[int, int] | None = None, steps: list | None = None,
             source_root: str | None = None) -> dict | None:
    """GPU starvation of one trainer over ``window`` (monotonic ns; None = all marks).

    Args:
        records: the trainer's ``proc-<pid>.jsonl`` records (only ``gpu_marks`` are read).
        window: the analyzed steps' window.
        steps: the analyzed step records (``t0``, ``t1`` ns, optional ``gpu_ms``), for per-step
            figures.
        source_root: the run's working directory, to read sync source lines.

    Returns:
        None without marks (no CUDA timeline: CPU runs, or the model never reached CUDA). Else:

        * ``covered_s``: host time inside the window covered by observed intervals, seconds;
        * ``starved_s``, ``starved_share`` (fraction of ``covered_s``): time the GPU had no
          queued work from the training stream (module docstring);
        * ``idle_s_by_cause``: ``{data, sync, host, launch, other}`` seconds (sum = ``starved_s``)
          and ``idle_share_by_cause`` (fractions of ``covered_s``);
        * ``idle_sites``: up to :data:`MAX_SITES` ``{site, leaf, phase, seconds, share}``, share
          of ``starved_s``; ``probe_s``: the starved time the probes covered;
        * ``syncs``: ``{count, per_step, idle_s, sites: [{site, leaf, op, count, per_step, idle_s,
          wait_s}]}`` (``wait_s``: host time blocked, for explicit syncs only);
        * ``per_step``: ``{starved_s, gpu_span_s}`` statistics (p50, mean, max; seconds);
          ``gpu_span_s`` is the GPU time between the step's boundary marks (its work plus its
          idle); ``idle_s_by_cause``: mean seconds per step by cause;
        * ``steps``, ``marks``, ``method`` (``"cuda_events"``).
    """
    prepared = _prepare(records)
    if prepared is None:
        return None
    m, iv = prepared
    h = m["h"]
    if window is None:
        window = (int(h[0]), int(h[-1]))
    w0, w1 = window
    # host time of each interval inside the window, and its starved part (at the interval's end)
    a = h[:-1].astype(np.float64)
    b = h[1:].astype(np.float64)
    inside = np.clip(np.minimum(b, w1) - np.maximum(a, w0), 0.0, None)
    s_start = b - iv["starved"]
    starved_in = np.clip(np.minimum(b, w1) - np.maximum(s_start, w0), 0.0, None)
    starved_in = np.minimum(starved_in, iv["starved"])
    covered = float(inside[iv["known"]].sum())
    if covered <= 0:
        return None
    total = float(starved_in.sum())
    by_cause = dict.fromkeys(CAUSES, 0.0)
    for c, s in zip(iv["cause"], starved_in):
        by_cause[c] += float(s)

    cum = _Starved(h, iv["starved"], (w0, w1))
    # idle sites from probes
    sites: dict[str, dict] = {}
    probes = [(idx, value) for idx, value in m["extra"].items()
              if m["kind"][idx] == "probe" and w0 <= h[idx] <= w1]
    ends = np.array([float(h[idx]) for idx, _ in probes])
    weights = np.array([float(value[2] or 0.0) * 1e6 for _, value in probes])
    probe_idle = cum(ends) - cum(ends - weights) if probes else np.zeros(0)
    probe_s = float(probe_idle.sum())
    for (idx, value), idle in zip(probes, probe_idle.tolist()):
        if idle <= 0:
            continue
        user, leaf = value[0], value[1]
        key = user or leaf or "(unknown)"
        entry = sites.setdefault(key, {"site": user, "leaf": leaf, "phases": {}, "ns": 0.0})
        entry["ns"] += idle
        ph = m["phase"][idx]
        entry["phases"][ph] = entry["phases"].get(ph, 0.0) + idle
    idle_sites = [
        {"site": e["site"], "leaf": e["leaf"], "phase": max(e["phases"], key=e["phases"].get),
         "seconds": e["ns"] / 1e9, "share": e["ns"] / total if total else 0.0}
        for e in sorted(sites.values(), key=lambda e: -e["ns"])[:MAX_SITES]
    ]

    n_steps = len(steps) if steps else len({s for s in m["kind"] if s == "step"})
    # syncs
    sync_idle = np.zeros(len(h))
    np.add.at(sync_idle, iv["charged"][iv["charged"] >= 0], starved_in[iv["charged"] >= 0])
    groups: dict[tuple, dict] = {}
    count = 0
    for idx in range(len(h)):
        if m["kind"][idx] != "sync" or not (w0 <= h[idx] <= w1):
            continue
        count += 1
        user, leaf, explicit = (list(m["extra"].get(idx) or []) + [None, None, None])[:3]
        wait = None
        if explicit and idx > 0 and m["kind"][idx - 1] == "sync0":
            wait = float(h[idx] - h[idx - 1]) / 1e9
        key = (user or leaf, explicit)
        grp = groups.setdefault(key, {"site": user, "leaf": leaf, "explicit": explicit, "count": 0, "ns": 0.0,
                                      "wait_s": None})
        grp["count"] += 1
        grp["ns"] += float(sync_idle[idx])
        if wait is not None:
            grp["wait_s"] = (grp["wait_s"] or 0.0) + wait
    sync_sites = [
        {"site": g_["site"], "leaf": g_["leaf"], "op": _op_of(g_["site"] or g_["leaf"], g_["explicit"], source_root),
         "count": g_["count"], "per_step": g_["count"] / n_steps if n_steps else None,
         "idle_s": g_["ns"] / 1e9, "wait_s": g_["wait_s"]}
        for g_ in sorted(groups.values(), key=lambda g_: (-g_["ns"], -g_["count"]))
    ]

    per_step = None
    if steps:
        c = StepCols(steps)
        t0 = c.ints("t0").astype(np.float64)
        t1 = c.ints("t1").astype(np.float64)
        starved_steps = (cum(t1) - cum(t0)) / 1e9
        gpu_ms = c.gpu_ms()
        spans = (gpu_ms[~np.isnan(gpu_ms)] / 1e3).tolist()
        per_step = {"starved_s": _stats(starved_steps.tolist()), "gpu_span_s": _stats(spans),
                    "idle_s_by_cause": {c: v / 1e9 / len(steps) for c, v in by_cause.items()}}

    return {
        "method": "cuda_events",
        "marks": int(len(h)),
        "steps": n_steps,
        "covered_s": covered / 1e9,
        "starved_s": total / 1e9,
        "starved_share": total / covered,
        "idle_s_by_cause": {c: v / 1e9 for c, v in by_cause.items()},
        "idle_share_by_cause": {c: v / covered for c, v in by_cause.items()},
        "idle_sites": idle_sites,
        "probe_s": probe_s / 1e9,
        "syncs": {"count": count, "per_step": count / n_steps if n_steps else None,
                  "idle_s": float(sum(s["idle_s"] for s in sync_sites)), "sites": sync_sites},
        "per_step": per_step,
    }
