"""One job's node runs as one run: ``whyidle report DIR DIR ...`` (pure; no framework imports).

A multi-node ``torchrun`` job observed with ``whyidle run`` on each node leaves one run directory
per node, each with that node's ranks. The merged run holds every rank's process records; the
machine samples (``host.jsonl``, ``gpu.jsonl``) and ``meta.json`` stay per node, and the caller
picks the node whose rank the report describes (:func:`with_node_of`). Each node's clock is its
own: nothing here compares times across nodes (the job analysis needs none, see
:mod:`whyidle.analysis.collectives`).

The directories must be one job's nodes: every one has ranks, they agree on the launcher's
rendezvous (``run_id``, ``master_addr``, ``master_port``, ``world_size``) and no node appears
twice; otherwise :class:`~whyidle.record.reader.RunDirError` says which differs.

A node run whose report was made holds rank summaries (:mod:`whyidle.record.rank_summary`):
:func:`load_node` reads those instead of the ranks' records, and the records of the rank the
report describes only, so a thousand ranks of an hour's steps merge in seconds.
"""

from __future__ import annotations

import dataclasses
import os

from whyidle.record import rank_summary
from whyidle.record.reader import RunData, RunDirError, load_run

#: The launcher's keys that name one job (``dist`` identity of the ``proc`` records).
JOB_KEYS = ("run_id", "master_addr", "master_port", "world_size")

#: Added to a pid that another node's run already holds (pids are below 2**22 on Linux).
PID_OFFSET = 10_000_000


def _identity(run: RunData) -> tuple[dict, set]:
    """The job keys of a run's ranks and the nodes it holds."""
    keys: dict = {}
    nodes: set = set()
    for recs in run.procs.values():
        proc = next((r for r in recs if r.get("k") == "proc" and isinstance(r.get("dist"), dict)), None)
        if proc is None:
            continue
        d = proc["dist"]
        for k in JOB_KEYS:
            keys.setdefault(k, d.get(k))
        nodes.add(d.get("node"))
    return keys, nodes


def load_node(path: str, version: int, described: int | None = None, samples: bool = False) -> RunData:
    """One node run of a job as a merge reads it: every rank with a fresh summary
    (:func:`whyidle.record.rank_summary.read`, of analysis ``version``) from it, except
    ``described`` (a pid of this run), and every other process from its records; the machine
    samples only with ``samples``. The summarized ranks' ``procs`` entries hold the records their
    summaries kept, in the order of their files, as :func:`~whyidle.record.reader.load_run` orders
    the processes; the summaries are under ``summaries`` and the reader's notes on their files
    under ``problems``.

    Errors: :class:`~whyidle.record.reader.RunDirError` as ``load_run``.
    """
    summaries = rank_summary.read(path, version) if os.path.isdir(path) else {}
    summaries.pop(described, None)
    run = load_run(path, read_proc=lambda pid: pid not in summaries, samples=samples)
    if not summaries:
        return run
    procs = {**run.procs, **{pid: s.records for pid, s in summaries.items()}}
    run.procs = {pid: procs[pid] for pid in sorted(procs, key=lambda p: f"proc-{p}.jsonl")}
    run.summaries = summaries
    run.problems += [p for s in summaries.values() for p in s.problems]
    return run


def merge_runs(runs: list[RunData]) -> tuple[RunData, dict[int, int]]:
    """The process records of one job's node runs together.

    Returns ``(merged, owner)``: ``merged`` has every run's processes (a pid seen in an earlier
    run gets ``PID_OFFSET`` × the run's position added) and rank summaries (``summaries``, under
    the same pids), ``problems`` of all, and ``path``, ``meta``,
    ``host`` and ``gpu`` of the first run; ``owner`` maps each merged pid to its run's position.
    Errors: RunDirError when a run has no ranks, the runs name different jobs, or two hold the
    same node.
    """
    seen_nodes: dict = {}
    job = None
    procs: dict = {}
    steps: dict = {}
    summaries: dict = {}
    owner: dict[int, int] = {}
    problems: list[str] = []
    for i, run in enumerate(runs):
        keys, nodes = _identity(run)
        if not nodes:
            raise RunDirError(f"{run.path}: no torch.distributed ranks in this run; only node runs of one job merge")
        if job is None:
            job = keys
        else:
            differ = [k for k in JOB_KEYS if keys.get(k) != job.get(k)]
            if differ:
                k = differ[0]
                raise RunDirError(f"{run.path}: not the same job as {runs[0].path} ({k} {keys.get(k)!r} here, "
                                  f"{job.get(k)!r} there)")
        for node in nodes:
            if node in seen_nodes:
                raise RunDirError(f"{run.path}: node {node} is also in {seen_nodes[node]}; give each node's run once")
            seen_nodes[node] = run.path
        for pid, recs in run.procs.items():
            key = pid if pid not in procs else pid + PID_OFFSET * i
            procs[key] = recs
            if pid in run.steps:
                steps[key] = run.steps[pid]
            if pid in run.summaries:
                summaries[key] = run.summaries[pid]
            owner[key] = i
        problems += [f"{run.path}: {p}" for p in run.problems]
    first = runs[0]
    merged = RunData(path=first.path, meta=first.meta, host=first.host, gpu=first.gpu, procs=procs,
                     problems=problems, steps=steps, summaries=summaries)
    return merged, owner


def node_pid(merged_pid: int, owner: dict[int, int]) -> int:
    """The pid in its own node run of a pid of :func:`merge_runs`' result."""
    i = owner.get(merged_pid, 0)
    return merged_pid - PID_OFFSET * i if i and merged_pid >= PID_OFFSET else merged_pid


def with_node_of(merged: RunData, runs: list[RunData], owner: dict[int, int], pid: int | None) -> RunData:
    """``merged`` with the ``meta``, machine samples and path of the node run holding ``pid``
    (the rank the report describes; the first run when None or unknown)."""
    run = runs[owner.get(pid, 0)] if pid is not None else runs[0]
    return dataclasses.replace(merged, path=run.path, meta=run.meta, host=run.host, gpu=run.gpu)
