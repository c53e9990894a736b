"""A job's rank traces: each rank read and reduced to a summary in its own process, then the job.

HTA's ``TraceAnalysis`` holds every rank's events in memory at once (~950 GB of RAM for 200 GB of
traces, HTA issue #250). Here a rank's trace is read, reduced to a :class:`RankSummary` (its
metrics and its collectives, a few kB) and dropped, in worker processes: peak memory is the
number of workers × the largest rank's columns, not the job's size. Workers: one per core, fewer
when :data:`MEMORY_SHARE` of the available memory would not hold that many of the largest rank
(:func:`plan_workers`). A rank file that cannot be read is skipped with its reason
(``RankSummary.error``); the report says which.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import numpy as np

from whyidle.analysis import collectives as coll_analysis
from whyidle.analysis import ranks as rank_analysis
from whyidle.analysis import trace_collectives as tc
from whyidle.analysis.trace import rank_metrics
from whyidle.record.trace_data import TraceData

#: Peak resident memory of a worker per byte of trace JSON it reads (columns, interned strings,
#: one decoded block), measured with ``benchmarks/trace_ranks.py``; plus the worker's own base.
PEAK_PER_JSON_BYTE = 0.6
WORKER_BASE_BYTES = 64 * 2**20

#: Fraction of the available memory the workers may take together.
MEMORY_SHARE = 0.5

#: A rank whose median step exceeds the other ranks' median by this share is the step-time
#: straggler that a report without matched collectives describes: 5 % is 1.05× for the job,
#: above the step-time noise between ranks.
STEP_STRAGGLER_MIN_SHARE = 0.05


@dataclass
class RankSummary:
    """What the job analysis needs of one rank's trace (``metrics``:
    :func:`whyidle.analysis.trace.rank_metrics`; ``collectives``:
    :func:`whyidle.analysis.trace_collectives.collective_table`; ``loader``: the DataLoader
    iterator its strings name, :func:`whyidle.record.kineto.loader_kind`; ``start_s``: wall-clock
    seconds at which its first ``ProfilerStep`` began, None without steps; ``skipped``: events
    left out for unusable fields or damage, :attr:`TraceData.skipped`; ``cut``: where the events
    ended early, :attr:`TraceData.cut`). ``error``: why the
    file could not be read (one line); then the other fields are empty."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device_properties: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    collectives: dict = field(default_factory=dict)
    loader: str | None = None
    step_numbers: tuple = ()
    start_s: float | None = None
    error: str | None = None
    skipped: int = 0
    cut: str | None = None


def summarize(t: TraceData) -> RankSummary:
    """The summary of one rank's trace."""
    from whyidle.record.kineto import loader_kind

    m = rank_metrics(t)
    return RankSummary(path=t.path, rank=t.rank, world_size=t.world_size, backend=t.backend,
                       device_properties=t.device_properties, metrics=m,
                       collectives=tc.collective_table(t, m["device"]), loader=loader_kind([t]),
                       step_numbers=tuple(s[0] for s in t.steps), skipped=t.skipped, cut=t.cut,
                       start_s=(t.base_ns or 0) / 1e9 + min(s[1] for s in t.steps) / 1e6 if t.steps else None)


def summarize_file(path: str, workers: int | None = 1, reading=None) -> RankSummary:
    """Reads and summarizes one trace file (``workers``: processes for one large uncompressed
    file, :func:`whyidle.record.kineto.read_trace`; ``reading``: its
    :class:`~whyidle.record.kineto.TraceReading` already started). An unreadable file gives a
    summary with ``error`` set, never an exception."""
    from whyidle.record.kineto import TraceError, TraceReading

    try:
        return summarize((reading or TraceReading(path, workers=workers)).result())
    except TraceError as exc:
        return RankSummary(path=path, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - one rank's odd trace must not cost the job's report
        return RankSummary(path=path, error=f"{path}: cannot analyze ({type(exc).__name__}: {exc})"[:300])


def json_bytes(path: str) -> int:
    """The size of a trace's JSON text, bytes: the file's size, or for gzip the size its trailer
    records (modulo 4 GiB; a 20× ratio when that is smaller than the file)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b" or size < 18:
            return size
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    return isize if isize >= size else 20 * size


def plan_workers(paths: list[str], workers: int | None = None, available: int | None = None) -> int:
    """Processes to read ``paths`` with: ``workers`` when given, else one per usable core, at most
    one per file, and no more than :data:`MEMORY_SHARE` of ``available`` bytes (default: the
    machine's available memory) holds at the largest file's peak (:data:`PEAK_PER_JSON_BYTE`)."""
    if workers:
        return max(1, workers)
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    from whyidle.sampling.limits import own_usable_cores

    cores = int(own_usable_cores() + 1e-9) or 1  # the affinity mask and a cgroup CPU quota
    peak = max(json_bytes(p) for p in paths) * PEAK_PER_JSON_BYTE + WORKER_BASE_BYTES
    return max(1, min(cores, len(paths), int(available * MEMORY_SHARE // peak)))


def read_ranks(paths: list[str], workers: int | None = None, reading=None) -> list[RankSummary]:
    """Every file of ``paths`` summarized, in order: one file in this process (a large
    uncompressed one split into byte ranges read by ``workers`` processes, default one per usable
    core: :func:`whyidle.record.kineto.read_trace`; ``reading``: that file's
    :class:`~whyidle.record.kineto.TraceReading`, started by the caller), several in
    :func:`plan_workers` worker processes, each file read whole by one of them."""
    if len(paths) == 1:
        return [summarize_file(paths[0], workers=workers, reading=reading)]
    n = plan_workers(paths, workers)
    if n <= 1:
        return [summarize_file(p) for p in paths]
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx) as pool:
        return list(pool.map(summarize_file, paths, chunksize=1))


#: Ranks of one job start profiling within a step of each other (their collectives keep them in
#: step); traces whose first ``ProfilerStep`` began further apart than this, or than twice the
#: longer first step, come from separate runs.
RUN_GAP_S = 5.0


def newest_run(summaries: list[RankSummary]) -> list[RankSummary] | None:
    """The ranks of the newest run among traces of several runs of one script (a
    ``tensorboard_trace_handler`` folder written to twice): the traces grouped by when their first
    ``ProfilerStep`` began (:data:`RUN_GAP_S`), the latest group when it holds distinct ranks.
    None when that cannot tell (a trace without rank or steps, one group, or repeated ranks in
    the latest)."""
    if any(s.rank is None or s.start_s is None for s in summaries):
        return None

    def first_step(s: RankSummary) -> float:
        rows = s.metrics["steps"]["per_step"]
        return rows[0]["dur_s"] if rows else 0.0

    ordered = sorted(summaries, key=lambda s: s.start_s)
    groups = [[ordered[0]]]
    for prev, cur in zip(ordered, ordered[1:]):
        if cur.start_s - prev.start_s > max(RUN_GAP_S, 2 * max(first_step(prev), first_step(cur))):
            groups.append([])
        groups[-1].append(cur)
    last = groups[-1]
    if len(groups) < 2 or len({s.rank for s in last}) < len(last):
        return None
    return last


def job_metrics(summaries: list[RankSummary]) -> dict:
    """The job of every rank's summary.

    Returns ``{ranks, step_s_by_rank, straggler, collectives, described, described_is_straggler,
    steps_differ}``:

    * ``ranks``: ``[{rank, metrics, collective_s, wait_s}]`` (``rank``: ``distributedInfo.rank``,
      else the position; ``collective_s`` / ``wait_s``: mean seconds per compared step in matched
      collectives and waiting in them, None when not measured).
    * ``step_s_by_rank``: ``[{rank, count, p50, mean}]``, step seconds.
    * ``collectives``: the measurement (:mod:`whyidle.analysis.trace_collectives`): ``{kind,
      matched, skipped, missing, steps, late_steps}``, None when fewer than two ranks hold
      collectives.
    * ``straggler``: measured when the ranks' collectives matched in at least
      :data:`~whyidle.analysis.trace_collectives.TRACE_MIN_STEPS` steps —
      :func:`whyidle.analysis.ranks.straggler` of the culprit
      (:func:`whyidle.analysis.collectives.culprit`: the rank whose late arrivals cost the others
      the most, ≥ 10 % of their step and ≥ 1 ms), with ``cause``
      (:func:`~whyidle.analysis.trace_collectives.late_cause`), or None when none stands out.
      Otherwise from step times: the rank with the largest median step, ``excess_s`` = its median
      − the median of the other ranks' medians, ``excess_share`` = that / the others' median,
      ``measured: false`` (None with fewer than two ranks with steps).
    * ``described``: the rank whose metrics the report shows: the straggler when measured, or
      when its ``excess_share`` ≥ :data:`STEP_STRAGGLER_MIN_SHARE` (``described_is_straggler``);
      else the first rank with GPU activity, else the first.
    * ``steps_differ``: the ranks do not all hold the same step numbers.
    """
    ranks, by_rank = [], []
    for i, s in enumerate(summaries):
        r = s.rank if s.rank is not None else i
        ranks.append({"rank": r, "metrics": s.metrics, "collective_s": None, "wait_s": None})
        st = s.metrics["steps"]
        if st["count"]:
            by_rank.append({"rank": r, "count": st["count"], "p50": st["step_s"]["p50"], "mean": st["step_s"]["mean"]})
    straggler, coll = None, None
    matched = tc.match({row["rank"]: s.collectives for row, s in zip(ranks, summaries)}) if len(ranks) >= 2 else None
    measured = None
    if matched:
        mean_step = {b["rank"]: b["mean"] for b in by_rank}
        measured = coll_analysis.culprit(matched["waits"], mean_step, skip=0, min_steps=tc.TRACE_MIN_STEPS)
        coll = {k: matched[k] for k in ("kind", "matched", "skipped", "missing")}
        coll.update({"steps": measured["steps"] if measured else 0,
                     "late_steps": measured["late_steps"] if measured else None})
    if measured:
        for row in ranks:
            row["collective_s"] = measured["collective_s_by_rank"].get(str(row["rank"]))
            row["wait_s"] = measured["wait_s_by_rank"].get(str(row["rank"]))
        straggler = rank_analysis.straggler([{"rank": row["rank"], "pid": None} for row in ranks], measured=measured)
        if straggler:
            straggler.pop("pid")
            straggler.pop("late_cause")
            per_step = {row["rank"]: row["metrics"]["steps"]["per_step"] for row in ranks}
            data = {r: {p["step"]: p["dataloader_s"] for p in rows} for r, rows in per_step.items()}
            compute = {row["rank"]: s.collectives.get("compute_s") or {} for row, s in zip(ranks, summaries)}
            straggler["cause"] = tc.late_cause(straggler["rank"], measured["compared"], data, compute,
                                               measured["caused_s"])
    elif len(by_rank) >= 2:
        straggler = _step_straggler(by_rank)
    stands_out = straggler and (straggler["measured"] or (straggler["excess_share"] or 0) >= STEP_STRAGGLER_MIN_SHARE)
    first_gpu = next((row["rank"] for row in ranks if row["metrics"].get("has_gpu")), None)
    described = straggler["rank"] if stands_out else (first_gpu if first_gpu is not None
                                                      else (ranks[0]["rank"] if ranks else None))
    return {"ranks": ranks, "step_s_by_rank": by_rank, "straggler": straggler, "collectives": coll,
            "described": described, "described_is_straggler": bool(stands_out),
            "steps_differ": len({s.step_numbers for s in summaries}) > 1}


def _step_straggler(by_rank: list[dict]) -> dict:
    p50 = np.array([b["p50"] for b in by_rank])
    j = int(np.argmax(p50))
    others = float(statistics.median(np.delete(p50, j)))
    excess = float(p50[j]) - others
    return {"rank": by_rank[j]["rank"], "measured": False, "excess_s": excess,
            "excess_share": excess / others if others > 0 else None}
