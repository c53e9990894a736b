"""The ranks of a ``torch.distributed`` job observed in one run (pure; no framework imports).

Each rank is a training process whose ``proc`` record carries the launcher's ``dist`` identity
(:func:`whyidle.instrument.torch.dist_identity`). Per rank: its steps, throughput and phase
shares, from the same step analysis as the primary trainer (:mod:`whyidle.analysis.steps`). The
job's throughput is the sum over ranks: each rank trains on its own shard of the samples (DDP,
FSDP), so the job's samples/s is what every rank does together ("measure global throughput, not
just individual device percentages").
"""

from __future__ import annotations

import statistics

from whyidle.analysis import collectives as coll_analysis
from whyidle.analysis import loop as loop_analysis
from whyidle.analysis import steps as step_analysis
from whyidle.analysis.stepcols import StepCols
from whyidle.record.steptable import NULL_INT

SHARE_KEYS = ("data_wait", "forward", "backward", "optimizer", "eval", "other_host")


def training_rate(rows: list) -> float | None:
    """Samples per second over a rank's training span: the samples of every step after the first
    over the first step's end to the last one's (the first step is start-up), or None without two
    steps, a positive span or a read batch size. Steps whose batch size was not read count as the
    median of those that were."""
    if len(rows) < 2:
        return None
    span = (rows[-1]["t1"] - rows[0]["t1"]) / 1e9
    samples = samples_after_first(rows)
    return samples / span if span > 0 and samples is not None else None


def samples_after_first(rows: list) -> float | None:
    """The samples of every step after the first; steps whose batch size was not read count as the
    median of those that were. None when no batch size was read."""
    total, counts = 0, step_analysis.ValueCounts()
    for a, b in StepCols(rows).blocks():  # a block of steps at a time (a day of steps as ints: ~100 MB)
        samples = b.ints("samples")[1 if a == 0 else 0:]
        known = samples[samples != NULL_INT]
        total += int(known.sum())
        counts.add(known)
    if not counts.n:
        return None
    return total + counts.percentile(50) * (len(rows) - 1 - counts.n)


def ranks(identities: dict[int, dict], step_lists: dict[int, list],
          figures: dict[int, dict] | None = None) -> list[dict]:
    """One row per rank with steps, sorted by (node, rank).

    ``identities``: pid → the ``dist`` identity of its ``proc`` record; ``step_lists``: pid → its
    step rows; ``figures``: pid → its :func:`rank_figures` made before (a rank summary read
    instead of its records in a merge of node runs, :mod:`whyidle.record.rank_summary`), used
    instead of its step rows. Row: ``rank``, ``local_rank``, ``node``, ``world_size``, ``pid``, and
    :func:`rank_figures`. Empty outside a distributed job.
    """
    out = []
    figures = figures or {}
    for pid, ident in identities.items():
        fig = figures[pid] if pid in figures else rank_figures(step_lists.get(pid) or [])
        if not fig:
            continue
        out.append({
            "rank": ident.get("rank"), "local_rank": ident.get("local_rank"), "node": ident.get("node"),
            "world_size": ident.get("world_size"), "pid": pid, **fig,
        })
    return sorted(out, key=lambda r: (r["node"] if isinstance(r["node"], int) else 0,
                                      r["rank"] if isinstance(r["rank"], int) else 0))


def rank_figures(rows: list) -> dict | None:
    """A rank's figures from its step rows: ``steps`` (all of them), ``samples_per_s`` (over its
    training span, :func:`training_rate`), ``steady_samples_per_s`` and ``step_time_s`` (``p50``,
    ``mean``, seconds) over its analyzed steps, ``shares`` (fractions of the step:
    ``SHARE_KEYS``); None without analyzed steps."""
    return _measured(rows)[0]


def _measured(rows: list) -> tuple[dict | None, dict | None]:
    """:func:`rank_figures` and the step metrics of the analyzed steps (None, None without)."""
    analyzed, info = step_analysis.select_steps(rows) if rows else ([], {"total": 0})
    if not analyzed:
        return None, None
    m = step_analysis.step_metrics(analyzed)
    return {"steps": info.get("total", len(rows)), "samples_per_s": training_rate(rows),
            "steady_samples_per_s": m.get("samples_per_s"),
            "step_time_s": {k: m["step_time_s"][k] for k in ("p50", "mean")},
            "shares": {k: m["shares"].get(k, 0.0) for k in SHARE_KEYS}}, m


#: Kinds of a rank's records the analysis of a job reads from every process, not only from the
#: one it describes (analysis/run.py: the ``dist`` identity, ``instrumented``, the notices, the
#: logged metrics, a tune trial's overrides); a rank summary keeps them (and the last ``devices``
#: record with a ``dist`` group, the rest of the identity).
SUMMARY_KINDS = ("proc", "notice", "metric", "override")

#: The version of what :func:`summary` holds and how its figures are computed: a summary of another
#: version is not used (its rank is read in full). Raise it with any change to either.
SUMMARY_VERSION = 1


def summary(records: list[dict], rows: list) -> dict:
    """What a merge of node runs needs of a rank it does not describe, instead of its records
    (the summary file: record/rank_summary.py; the figures are those :func:`ranks` and the
    analysis of the run would make of them):

    ``records``: its records of :data:`SUMMARY_KINDS` (and its last ``devices`` record with a
    ``dist`` group), in file order; ``figures``: :func:`rank_figures` (None without analyzed
    steps); ``other``: its line of ``other_trainers`` without the pid (``steps`` analyzed,
    ``samples_per_s``, ``step_time_p50_s``; None without analyzed steps); ``steps``: its step rows;
    ``trains``: they are a training loop (:func:`whyidle.analysis.loop.trains`); ``waits``: its
    time in collectives per step (:func:`whyidle.analysis.collectives.wait_arrays`).
    """
    figures, m = _measured(rows)
    group = next((r for r in reversed(records) if r.get("k") == "devices" and r.get("dist")), None)
    kept = [r for r in records if r.get("k") in SUMMARY_KINDS or r is group]
    other = ({"steps": m["steps"], "samples_per_s": m["samples_per_s"], "step_time_p50_s": m["step_time_s"]["p50"]}
             if m else None)
    return {"records": kept, "figures": figures, "other": other, "steps": len(rows),
            "trains": loop_analysis.trains(rows), "waits": coll_analysis.wait_arrays(records)}


def measure_collectives(rows: list[dict], waits: dict, step_lists: dict, regions: dict) -> dict | None:
    """The measured culprit of the ranks' rows (:func:`whyidle.analysis.collectives.culprit`;
    ``waits``: pid → :func:`~whyidle.analysis.collectives.step_waits`; ``step_lists``: pid → its
    step rows; ``regions``: pid → its ``region`` records), setting on each row ``collective_s``
    (its mean time in collectives per step, seconds) and ``wait_s`` (its mean wait for the other ranks per step), None where not measured.
    The culprit's ``late_cause`` (:func:`late_cause`) is added; its step lists are dropped."""
    by_rank = {r["rank"]: waits.get(r["pid"]) or {} for r in rows}
    measured = coll_analysis.culprit({k: v for k, v in by_rank.items() if v},
                                     {r["rank"]: r["step_time_s"]["mean"] for r in rows})
    for r in rows:
        r["collective_s"] = (measured or {}).get("collective_s_by_rank", {}).get(str(r["rank"]))
        r["wait_s"] = (measured or {}).get("wait_s_by_rank", {}).get(str(r["rank"]))
    if measured is None:
        return None
    late_at, compared = measured.pop("late_at"), measured.pop("compared")
    pid = next((r["pid"] for r in rows if r["rank"] == measured["rank"]), None)
    measured["late_cause"] = (late_cause(step_lists.get(pid) or [], late_at, compared, regions.get(pid) or [])
                              if pid is not None else None)
    return measured


def late_cause(rows: list, late_at: dict, compared: list, regions: list[dict] = ()) -> dict | None:
    """What a rank that is late only now and then does in the steps it is late (``late_at``: step
    index → the wait it caused then, seconds): per phase, its mean time in those steps (weighted by
    that wait: the steps that cost most say most) minus in its other compared steps
    (``other_host``: the step's time outside the timed phases), and the same for the time inside its ``evaluation``,
    ``checkpoint`` and ``logging`` regions (``region`` records, instrument/regions.py). A region
    that grew by at least half as much as the phase that grew most names the cause (it is the more
    precise name: rank-0-only validation shows as host time when it calls the inner module), else
    that phase. The steady shares leave such steps out; this names them.

    Returns ``{phase, extra_s, steps}`` (seconds more per late step; ``steps``: late steps with a
    detailed row), or None when it is late in more than half of the compared steps (then its
    steady shares are its cause) or fewer than 2 late or 3 other steps have detailed rows."""
    if not late_at or len(late_at) > len(compared) / 2:
        return None
    keep = set(compared)
    spans = [(r.get("kind"), r.get("t0"), r.get("t1")) for r in regions
             if isinstance(r.get("t0"), int) and isinstance(r.get("t1"), int)]
    late, other = [], []
    for row in rows:
        i = row.get("i")
        if i not in keep or row.get("bwd") is None or row.get("t1") is None:
            continue
        t0, t1 = row["t0"], row["t1"]
        phases = {k: (row.get(f) or 0) / 1e9 for k, f in step_analysis.PHASE_KEYS}
        phases["other_host"] = max(0.0, (t1 - t0) / 1e9 - sum(phases.values()))
        for kind in REGION_KINDS:
            phases[kind] = sum(max(0, min(t1, b) - max(t0, a)) for k, a, b in spans if k == kind) / 1e9
        (late if i in late_at else other).append((phases, late_at.get(i, 1.0)))
    if len(late) < 2 or len(other) < 3:
        return None
    total = sum(w for _, w in late) or 1.0
    grew = {k: sum(p[k] * w for p, w in late) / total - statistics.fmean(p[k] for p, _ in other) for k in late[0][0]}
    phase = max((k for k in grew if k not in REGION_KINDS), key=grew.get)
    region = max(REGION_KINDS, key=grew.get)
    if grew[region] >= 0.5 * grew[phase] > 0:
        phase = region
    return {"phase": phase, "extra_s": grew[phase], "steps": len(late)} if grew[phase] > 0 else None


#: Region kinds a late step's extra time can be named by (instrument/regions.py).
REGION_KINDS = ("evaluation", "checkpoint", "logging")


def job_rate(rows: list[dict], key: str) -> float | None:
    """The job's samples/s: the sum of the ranks' ``key`` (``samples_per_s`` or
    ``steady_samples_per_s``), or None when fewer than two ranks have it."""
    rates = [r[key] for r in rows if r.get(key) is not None]
    return sum(rates) if len(rates) >= 2 else None


#: Excess of the slowest rank's own work (outside backward) over the other ranks' median, as a
#: fraction of its step, from which it is the straggler; also the least wait a measured culprit
#: causes (live and in traces, analysis/trace_job.py). Below it, rank-to-rank noise of a shared box.
STRAGGLER_MIN_SHARE = 0.10


def straggler(rows: list[dict], min_share: float = STRAGGLER_MIN_SHARE, measured: dict | None = None) -> dict | None:
    """The rank the others wait for, from the ranks' rows (:func:`ranks`).

    ``measured``: :func:`whyidle.analysis.collectives.culprit` of the ranks' timed collectives
    (host-synchronous backends, enough steps), which decides when given: its culprit is the
    straggler when the other ranks wait for it at least ``min_share`` of their step and
    :data:`~whyidle.analysis.collectives.CAUSED_MIN_S`, else there is none. Returns ``{rank, pid, measured: True, culprit_share, caused_share, late_cause, late_steps, steps,
    excess_s, excess_share, wait_s_by_rank}`` (``excess_s``: the wait per step it causes each other
    rank beyond what they cause, seconds, the culprit's ``caused_s``; ``excess_share``: as a
    fraction of their step; ``wait_s_by_rank``: other rank → its mean wait per step).

    Without it, from the phases: DDP synchronizes every step at the gradient all-reduce, which it waits for at the end of
    backward: a rank that reaches it early waits *inside its backward*, so every rank's step lasts
    as long as the slowest, and the slowest is the one with the most work *outside* backward
    (data wait, forward, optimizer, evaluation, other host). ``own_s`` = mean step × (1 − backward
    share); the straggler's excess is its ``own_s`` minus the other ranks' median. When no rank
    stands out so, the waits are taken to lie in forward too (DDP broadcasts the module's buffers
    at the start of forward by default, ``broadcast_buffers=True``: BatchNorm statistics, BERT's
    ``position_ids``; a waiting rank then waits in its forward) and ``own_s`` leaves forward out as
    well (``waits_in`` says which). A straggler whose extra work is inside backward itself is not
    seen this way, nor one whose extra work is in forward when the waits are in forward too.

    Returns ``{rank, pid, waits_in, own_s, others_own_s, excess_s, excess_share, wait_s_by_rank}`` (seconds per
    step; ``excess_share`` a fraction of the straggler's mean step; ``wait_s_by_rank``: rank → the
    straggler's own_s minus that rank's, ≥ 0: the time it waits per step) when the excess is ≥
    ``min_share``, else None; None with fewer than two ranks.
    """
    if len(rows) < 2:
        return None
    if measured is not None:
        row = next((r for r in rows if r["rank"] == measured["rank"]), None)
        if row is None or measured["wait_share"] < min_share or measured["caused_s"] < coll_analysis.CAUSED_MIN_S:
            return None
        waits = {k: v for k, v in measured["wait_s_by_rank"].items() if k != str(row["rank"])}
        return {"rank": row["rank"], "pid": row["pid"], "measured": True, "culprit_share": measured["culprit_share"],
                "caused_share": measured.get("caused_share"), "late_cause": measured.get("late_cause"),
                "late_steps": measured["late_steps"], "steps": measured["steps"],
                "excess_s": measured["caused_s"], "excess_share": measured["wait_share"],
                "wait_s_by_rank": waits}
    for waits_in in (("backward",), ("forward", "backward")):
        late = _late(rows, waits_in, min_share)
        if late:
            return late
    return None


def _late(rows: list[dict], waits_in: tuple[str, ...], min_share: float) -> dict | None:
    """:func:`straggler` with the waits taken to lie in the phases ``waits_in``."""
    own = [(r["step_time_s"]["mean"] * (1.0 - sum(r["shares"].get(k, 0.0) for k in waits_in)), r) for r in rows]
    top_s, top = max(own, key=lambda x: x[0])
    median = statistics.median(s for s, r in own if r is not top)
    step_s = top["step_time_s"]["mean"]
    excess = top_s - median
    if step_s <= 0 or excess / step_s < min_share:
        return None
    return {"rank": top["rank"], "pid": top["pid"], "waits_in": list(waits_in), "own_s": top_s, "others_own_s": median, "excess_s": excess,
            "excess_share": excess / step_s,
            "wait_s_by_rank": {str(r["rank"]): max(0.0, top_s - s) for s, r in own if r is not top}}


def lead_pid(rows: list[dict], late: dict | None) -> int | None:
    """The rank a job's report describes: the straggler's process, else the lowest rank's; None
    with fewer than two ranks."""
    if len(rows) < 2:
        return None
    return late["pid"] if late else rows[0]["pid"]
