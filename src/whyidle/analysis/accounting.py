"""Whole-job time accounting: the command's wall time split into parts (pure; no framework imports).

Parts (seconds, each second of the window in exactly one part, so they add up to the wall time):

- ``startup``: from the command's start to the end of the training process's first step
  (interpreter and framework imports, dataset and model construction, a launcher's own start-up,
  and the first step's one-time costs: compilation or tracing, the DataLoader workers' first start);
- ``training``: the training steps after the first (its end to the last step's end), less the parts
  below that happen inside that span;
- ``evaluation``: ``evaluation`` regions (``model.eval()`` … ``model.train()``, ``trainer.validate``,
  HF ``Trainer.evaluate``, Keras ``evaluate``/``predict`` and epoch-end callbacks,
  :mod:`whyidle.instrument.regions`);
- ``checkpoint``: ``checkpoint`` regions (``torch.save``, ``save_pretrained``, ``save_checkpoint``,
  Keras ``save``);
- ``logging``: ``logging`` regions (wandb, TensorBoard ``SummaryWriter``, MLflow);
- ``epoch_boundary``: DataLoader iterator start-ups after each loader's first (``iter()``: workers
  start again each epoch unless ``persistent_workers``), the excess of each new iterator's first
  batch over a steady batch, and the previous iterator's workers stopping before it; a loader's
  first iterator is ``startup``;
- ``compile``: torch.compile's recompilations anywhere, and its first compilations of frames that
  end after the first step (:func:`whyidle.analysis.compile.training_intervals`); the first
  compilations before that are start-up (its split's ``compile_s``);
- ``teardown``: after the last step to the command's end.

Where parts overlap, the first in :data:`PRIORITY` takes the time (a checkpoint saved by a
validation callback is checkpoint time, a validation loader's iterator start-up is evaluation).
"""

from __future__ import annotations

import bisect
import os
from collections import Counter

import numpy as np

from whyidle import mounts, vocab
from whyidle.analysis import stacks as stack_analysis
from whyidle.analysis.startup import startup_split
from whyidle.analysis.stepcols import StepCols
from whyidle.analysis.facts import TimeAccounting

#: Overlapping parts: the first listed takes the time. ``startup`` here is a loader's first
#: iterator (its workers' first start), which is start-up cost even inside the first step.
PRIORITY = ("compile", "checkpoint", "logging", "evaluation", "epoch_boundary", "startup")
PARTS = ("startup", "training", "compile", "evaluation", "checkpoint", "logging", "epoch_boundary", "teardown")
#: Stack-sample phases that name each part's lines: samples taken inside a region are labelled
#: ``"<kind>:<step phase>"`` (``evaluation:eval``, ``evaluation:data``, ...), before the first step
#: ``setup``.
PART_PHASES = {"startup": "setup", "evaluation": "evaluation", "checkpoint": "checkpoint", "logging": "logging"}
SITES_PER_PART = 3
#: What a region's inner step phase ran: the model, the data loader, or the program's own host work.
MIX_OF_PHASE = {"forward": "model", "backward": "model", "optimizer": "model", "eval": "model", "compute": "model",
                "data": "data"}


#: Innermost frames that run the model (or load data) although the step phase says other host
#: work: a Keras callback's ``predict_on_batch``, a module called outside the hooks' phases.
MODEL_LEAVES = ("torch/nn/", "torch/_ops", "keras/src/", "tensorflow/python/", "tf_keras/")
DATA_LEAVES = ("torch/utils/data/",)


def mix_of_leaf(leaf) -> str:
    """``"model"``, ``"data"`` or ``"host"``: what a stack sample's innermost frame (``"path:line
    func"``) ran, by its package (:data:`MODEL_LEAVES`, :data:`DATA_LEAVES`; the rest, the
    program's own lines and other libraries, is host work)."""
    leaf = leaf or ""
    if any(p in leaf for p in DATA_LEAVES):
        return "data"
    return "model" if any(p in leaf for p in MODEL_LEAVES) else "host"


def _part_phases(records: list[dict], phase: str) -> tuple[set[str], dict[str, float]]:
    """The stack-sample phases of one part (``phase`` itself and ``phase:*``) and the sampled
    seconds of its ``mix`` (``model``, ``data``, ``host``)."""
    phases: set[str] = set()
    mix = {"model": 0.0, "data": 0.0, "host": 0.0}
    prefix = phase + ":"
    for r in records:
        if r.get("k") != "stacks":
            continue
        for site in r.get("sites") or []:
            p = site[0]
            if p == phase or (isinstance(p, str) and p.startswith(prefix)):
                phases.add(p)
                mix[MIX_OF_PHASE.get(p[len(prefix):]) or mix_of_leaf(site[2])] += (site[4] or 0) / 1000
    return phases, mix


#: Region kinds called from the training loop's own body (not a loop of their own, like an
#: evaluation): their time inside a step is left out of the step's shares (and of the hooks' time,
#: which the instrument counts without them).
OUTSIDE_STEP = vocab.OUTSIDE_STEP


def merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(t0, t1)`` intervals sorted and merged where they overlap or touch."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _inside(merged: list[tuple[int, int]], t: int) -> bool:
    i = bisect.bisect_right(merged, (t, float("inf"))) - 1
    return i >= 0 and merged[i][0] <= t < merged[i][1]


def _every_steps(steps: list, intervals: list[tuple[int, int]]) -> float | None:
    """Median number of training steps between the starts of consecutive ``intervals`` (sorted),
    or None with fewer than two: how often the program evaluates / saves / logs."""
    if len(intervals) < 2:
        return None
    ends = [int(s["t1"]) for s in steps]
    at = [bisect.bisect_left(ends, a) for a, _ in intervals]  # the step each one starts in
    gaps = sorted(b - a for a, b in zip(at, at[1:]))
    return float(gaps[len(gaps) // 2])


def _by_site(sites: list[dict]) -> list[dict]:
    """Sampled lines merged by ``site`` (one line may have several innermost frames under it)."""
    out: dict[str, dict] = {}
    for s in sites:
        if s["site"] in out:
            out[s["site"]]["seconds"] += s["seconds"]
        else:
            out[s["site"]] = dict(s)
    return sorted(out.values(), key=lambda s: -s["seconds"])


#: Teardowns shorter than this (seconds) get no sites: interpreter shutdown and the report's own
#: flush take ~0.5 s in every run.
TEARDOWN_SITES_MIN_S = 2.0
#: The stack records flushed within this long after the last step also hold samples from before it
#: (the agent flushes every 0.5 s, ``whyidle.instrument.agent.FLUSH_PERIOD_S``): left out.
TEARDOWN_SKIP_NS = 500_000_000


def _teardown_sites(records: list[dict], window: tuple[int, int], s: float, source_root, entry_sites) -> list[dict]:
    """The busiest lines of the training thread after the last step (any phase, from the stack
    records flushed in ``window``), their seconds scaled to the part's ``s``."""
    phases = {site[0] for r in records if r.get("k") == "stacks" and window[0] <= r["t"] <= window[1]
              for site in r.get("sites") or ()}
    if not phases:
        return []
    spots = stack_analysis.hotspots(records, phases, window, None, limit=len(phases) * 1000, source_root=source_root,
                                    entry_sites=entry_sites)
    total = sum(h["seconds"] for h in spots) or 1.0
    return [{"site": h["site"], "function": h["function"], "leaf": h["leaf"], "seconds": h["seconds"] * s / total}
            for h in spots[:SITES_PER_PART]]


def save_storage(regions: list[dict], w0: int, w1: int) -> dict | None:
    """Where the checkpoints of ``regions`` (``checkpoint`` records that name their target:
    ``path``, ``bytes``, ``fs``; :mod:`whyidle.instrument.saves`) inside ``[w0, w1]`` (ns) went:
    ``{"saves", "bytes" (summed), "mean_bytes", "bytes_per_s" (summed bytes ÷ summed save
    seconds), "fs_type" (of the most saves), "fs_class" (``network``, ``parallel``, ``fuse``,
    ``local`` or ``unknown``: :func:`whyidle.mounts.classify_fs`), "folder" (the most common
    folder)}``; None when no save recorded its size."""
    rows = [r for r in regions if r.get("kind") == "checkpoint" and isinstance(r.get("bytes"), int)
            and w0 <= int(r["t1"]) and int(r["t0"]) <= w1]
    if not rows:
        return None
    total_b = sum(r["bytes"] for r in rows)
    total_s = sum(max(0, int(r["t1"]) - int(r["t0"])) for r in rows) / 1e9
    fs_type = Counter(r.get("fs") for r in rows).most_common(1)[0][0]
    folder = Counter(os.path.dirname(r.get("path") or "") for r in rows).most_common(1)[0][0]
    return {"saves": len(rows), "bytes": total_b, "mean_bytes": total_b / len(rows),
            "bytes_per_s": total_b / total_s if total_s > 0 else None, "fs_type": fs_type,
            "fs_class": mounts.classify_fs(fs_type) if fs_type else "unknown", "folder": folder or None}


#: A batch whose data wait exceeds a steady one's by this much (s) or more still waits for a
#: new iterator's workers to start (each worker's first batch comes after its start-up).
RAMP_EXCESS_S = 0.005
#: Batches after a new iterator's first that may still be its workers' first ones.
RAMP_MAX_STEPS = 8


def _ramp(steps: list, starts: np.ndarray, after: int, steady_fetch_s: float, w1: int) -> list[tuple[int, int]]:
    """The data waits of the steps right after a new iterator's first batch (``after``, ns) that
    exceed a steady fetch by :data:`RAMP_EXCESS_S` or more, until the first one that does not (at
    most :data:`RAMP_MAX_STEPS`): the other workers' first batches (spawned workers each import
    the program again; measured 0.25-0.34 s for the second of 2 spawn workers on 2 cores), as
    ``(t0, t0 + excess)`` intervals (ns); a step's data phase opens it. ``starts``: the steps'
    ``t0`` in order (ns, an int64 array)."""
    out = []
    i = int(np.searchsorted(starts, after))
    for j in range(i, min(len(steps), i + RAMP_MAX_STEPS)):
        r = steps[j]
        excess = (r.get("data") or 0) / 1e9 - steady_fetch_s
        if excess < RAMP_EXCESS_S:
            break
        a = int(r["t0"])
        out.append((a, min(w1, a + int(excess * 1e9))))
    return out


def time_accounting(window: tuple[int, int], steps: list, regions: list[dict], iters: list[dict],
                    firsts: list[dict], steady_fetch_s: float = 0.0, records: list[dict] | None = None,
                    source_root: str | None = None, entry_sites: frozenset = frozenset(),
                    compiles: tuple[list, list] = ((), ()), ends: list[dict] = ()) -> TimeAccounting:
    """Splits ``window`` into the parts of the module docstring.

    Args:
        window: ``(t0, t1)`` monotonic ns: the command's start and end (``meta.json`` ``start_t`` /
            ``exit_t``), or the process's own when those are missing.
        steps: all steps of the training process in order (warm-up and boundaries included), rows
            with ``t0``/``t1`` (ns); may be empty (then no ``training`` part: the rest is start-up).
            The first step ends the start-up.
        regions: ``region`` records (``kind``, ``t0``, ``t1``, ``site``).
        iters: ``iter`` records (``t0``, ``t1``, ``loader``); firsts: ``iter_first`` records (the
            new iterator's first ``__next__``, ``t0``, ``t1``, ``loader``).
        steady_fetch_s: seconds a steady batch takes to fetch (mean data wait per batch of the
            analyzed steps): the part of a first batch that is not epoch-boundary cost.
        records: the process's records, for the lines that held each part (stack samples).
        source_root, entry_sites: as for :func:`whyidle.analysis.stacks.hotspots`.
        compiles: ``(compile part, start-up compilations)``: torch.compile's ``(t0, t1)`` ns
            intervals that are the ``compile`` part, and those that are start-up
            (:mod:`whyidle.analysis.compile`).
        ends: ``iter_end`` records (``t0``, ``t1``, ``loader``): an iterator's workers stopped and
            joined when it ran out (no ``persistent_workers``); the one before the same loader's
            next iterator is that epoch boundary's too.
    Returns:
        ``{"wall_s", "window", "parts": {part: {"s", "share", "count", "every_steps", "sites",
        "host_sites", "mix", "callers"}}, "training_span_s"}``: seconds, share of ``wall_s`` (0–1), how many regions /
        iterators made it (start-up, training and teardown: 1 or 0), ``sites`` (the busiest lines
        inside it, ``[{"site", "function", "leaf", "seconds"}]``, from stack samples), ``host_sites``
        (the same for its samples outside the model and the data loader), ``mix`` (seconds by what
        ran: ``model``, ``data``, ``host``, from the samples' step phase, else their innermost
        frame; None without samples), ``every_steps`` (evaluation, checkpoint, logging: median
        training steps between two of them; None with fewer than two),
        ``callers`` (the program's lines that opened it, ``[{"site", "count", "seconds", "code"}]``,
        ``code`` the line's text when readable; for epoch boundaries the line that created the
        DataLoader, from its ``loader`` record, else ``"DataLoader <id>"``);
        ``storage`` (checkpoint part only, else None): where the saves went, :func:`save_storage`;
        ``split`` (start-up part only): :func:`whyidle.analysis.startup.startup_split`, or None;
        ``devices`` (evaluation part only, else None): ``model.eval()`` regions by the device type
        of the evaluated model's weights (``{"cpu": 3}``); ``gpu_util_pct``: None here (filled
        from the GPU samples by :func:`whyidle.analysis.run.analyze` for evaluation and training);
        ``training_span_s`` the first step's end to the last step's end. A ``teardown`` of at least
        ``TEARDOWN_SITES_MIN_S`` gets ``sites`` too: the training thread's busiest lines after
        the last step, whatever their phase.
    Errors: ``ValueError`` when the window is empty.
    """
    w0, w1 = int(window[0]), int(window[1])
    if w1 <= w0:
        raise ValueError("empty accounting window")
    # the first step's one-time costs (compilation, the workers' first start) are start-up
    first = max(w0, min(w1, int(steps[0]["t1"]))) if steps else w1
    last = max(first, min(w1, int(steps[-1]["t1"]))) if steps else w1

    by_kind: dict[str, list[tuple[int, int]]] = {k: [] for k in PRIORITY}
    callers: dict[str, dict[str, list]] = {k: {} for k in PRIORITY if k != "startup"}
    by_kind["compile"] = [(max(w0, int(a)), min(w1, int(b))) for a, b in compiles[0] if min(w1, int(b)) > max(w0, int(a))]
    for r in regions:
        kind = r.get("kind")
        if kind not in by_kind:
            continue
        a, b = max(w0, int(r["t0"])), min(w1, int(r["t1"]))
        if b > a:
            by_kind[kind].append((a, b))
            c = callers[kind].setdefault(r.get("site") or "(unknown)", [0, 0.0])
            c[0] += 1
            c[1] += (b - a) / 1e9
    eval_devices = Counter(r["device"] for r in regions if r.get("kind") == "evaluation" and r.get("device"))
    evals = merged(by_kind["evaluation"])
    first_by_loader: dict = {}
    for f in sorted(firsts, key=lambda r: r["t0"]):
        first_by_loader.setdefault(f.get("loader"), []).append(f)
    ordered = sorted(iters, key=lambda r: r["t0"])
    created = {r.get("id"): (r.get("created") or [None])[0] for r in records or () if r.get("k") == "loader"}
    seen_loaders = set()
    starts = None  # the steps' starts, for the iterators' ramps (read once, when one restarts)
    for n, it in enumerate(ordered):
        a, b = max(w0, int(it["t0"])), min(w1, int(it["t1"]))
        loader = it.get("loader")
        again = loader in seen_loaders
        seen_loaders.add(loader)
        if _inside(evals, a):
            continue  # a validation loader's start-up is evaluation time
        # this iterator's first batch (the same loader's next iter_first before its next iterator),
        # less what a steady batch takes
        nxt = next((int(o["t0"]) for o in ordered[n + 1:] if o.get("loader") == loader), None)
        f = next((f for f in first_by_loader.get(loader, ())
                  if int(f["t0"]) >= int(it["t1"]) and (nxt is None or int(f["t0"]) < nxt)), None)
        if f is not None:
            b = max(b, min(w1, int(f["t1"]) - int(steady_fetch_s * 1e9)))
        if b <= a:
            continue
        if not again:  # the loader's first iterator: its workers' first start is start-up
            by_kind["startup"].append((a, b))
            continue
        # the previous iterator's workers stopping (after its last batch, before this iter())
        prev = next((o for o in reversed(ordered[:n]) if o.get("loader") == loader), None)
        stop = next((e for e in ends if e.get("loader") == loader and prev is not None
                     and int(prev["t1"]) <= int(e["t0"]) <= int(it["t0"])), None)
        if starts is None:
            starts = StepCols(steps).ints("t0")  # an int64 array: a day of steps as ints took ~110 MB
        spans = [(a, b)] + _ramp(steps, starts, b, steady_fetch_s, w1)
        if stop is not None and min(w1, int(stop["t1"])) > max(w0, int(stop["t0"])):
            spans.append((max(w0, int(stop["t0"])), min(w1, int(stop["t1"]))))
        by_kind["epoch_boundary"].extend(spans)
        c = callers["epoch_boundary"].setdefault(created.get(loader) or f"DataLoader {loader}", [0, 0.0])
        c[0] += 1
        c[1] += sum(y - x for x, y in spans) / 1e9

    # sweep: at every instant the highest-priority open part takes the time, else start-up /
    # training / teardown by position
    events: list[tuple[int, int, int]] = [(first, 2, -1), (last, 2, -1)]
    for p, kind in enumerate(PRIORITY):
        for a, b in by_kind[kind]:
            events.append((a, 1, p))
            events.append((b, 0, p))
    events.sort()
    active = [0] * len(PRIORITY)
    seconds = dict.fromkeys(PARTS, 0.0)
    cur = w0
    for t, what, p in events:
        t = min(max(t, w0), w1)
        if t > cur:
            top = next((PRIORITY[i] for i, n in enumerate(active) if n > 0), None)
            if top is None:
                top = "startup" if cur < first else ("training" if cur < last else "teardown")
            seconds[top] += (t - cur) / 1e9
            cur = t
        if what == 1:
            active[p] += 1
        elif what == 0:
            active[p] -= 1
    if w1 > cur:
        top = next((PRIORITY[i] for i, n in enumerate(active) if n > 0), None)
        seconds[top or ("teardown" if steps else "startup")] += (w1 - cur) / 1e9

    wall = (w1 - w0) / 1e9
    parts = {}
    for part in PARTS:
        s = seconds[part]
        if part in ("evaluation", "checkpoint", "logging", "compile"):  # nested or overlapping records count once
            count = len(merged(by_kind[part]))
        elif part in callers:
            count = sum(c[0] for c in callers[part].values())
        else:
            count = 1 if s > 0 else 0
        every = None
        if part in ("evaluation", "checkpoint", "logging") and steps:
            every = _every_steps(steps, merged(by_kind[part]))
        sites, host_sites, mix = [], [], None
        phase = PART_PHASES.get(part)
        if phase and records and s > 0:
            phases, sampled = _part_phases(records, phase)
            total = sum(sampled.values())
            # a region's samples are scaled to its measured seconds; start-up samples cover only
            # the framework's import to the first step (startup_split), in wall seconds already
            scale = (min(1.0, s / total) if part == "startup" else s / total) if total > 0 else 0.0
            mix = {k: v * scale for k, v in sampled.items()}
            for which, out in ((phases, sites), ({p for p in phases if MIX_OF_PHASE.get(p.partition(":")[2])
                                                  is None}, host_sites)):  # host sites: see the filter below
                if not which:
                    continue
                for h in stack_analysis.hotspots(records, which, None, s, limit=SITES_PER_PART + 2,
                                                 source_root=source_root, entry_sites=entry_sites):
                    if out is host_sites and mix_of_leaf(h["leaf"]) != "host":
                        continue  # the model or the loader called from the program's own lines
                    out.append({"site": h["site"], "function": h["function"], "leaf": h["leaf"],
                                "seconds": h["seconds"] * scale})
                del out[SITES_PER_PART:]
        elif part == "teardown" and records and steps and s >= TEARDOWN_SITES_MIN_S:
            sites = _teardown_sites(records, (last + TEARDOWN_SKIP_NS, w1), s, source_root, entry_sites)
        top_callers = sorted(callers.get(part, {}).items(), key=lambda kv: -kv[1][1])[:SITES_PER_PART]
        parts[part] = {"s": s, "share": s / wall, "count": count, "every_steps": every, "sites": _by_site(sites),
                       "host_sites": _by_site(host_sites), "mix": mix,
                       "callers": [{"site": k, "count": n, "seconds": v, "code": stack_analysis.source_line(k, source_root)} for k, (n, v) in top_callers],
                       "storage": save_storage(regions, w0, w1) if part == "checkpoint" else None, "split": None,
                       "devices": dict(eval_devices) if part == "evaluation" and eval_devices else None,
                       "gpu_util_pct": None}
    parts["startup"]["split"] = startup_split(records or [], (w0, w1), steps, parts["startup"]["s"], source_root,
                                              list(compiles[1]))
    return {"wall_s": wall, "window": [w0, w1], "parts": parts,
            "training_span_s": (last - first) / 1e9 if steps else 0.0}
