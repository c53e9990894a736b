"""The DataLoader workers' own time: per worker process, how long its batches took (p50/p95/p99)
and which share of its life it was building one, from the tallies of
:mod:`whyidle.record.loader_workers` (issue 36, part 1).

A worker's *busy share* is the time spent building batches (Σ t1 − t0 of its batches) over the
span from its first batch's start to its last batch's end; the rest it waited — for an index to
fetch, which the training loop hands out only as it takes batches (``prefetch_factor ×
num_workers`` outstanding at most): workers busy near 100 % with the loop waiting for data are the
producer that holds the job; idle workers while the loop waits point elsewhere (the main process's
own part: receiving, collating in the main process, pinning).
"""

from __future__ import annotations

import numpy as np

from whyidle.record.loader_workers import BINS_PER_OCTAVE, WorkerTally

#: Batch-latency quantiles reported per worker.
QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
#: Slowest samples listed in the report.
SLOWEST_LISTED = 5


def _quantile_ms(bins: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile (milliseconds) of a latency histogram (:class:`WorkerTally` bins): the
    geometric middle of the bin that holds it (within ~4.4 %, half a bin)."""
    total = int(bins.sum())
    if not total:
        return None
    b = int(np.searchsorted(np.cumsum(bins), q * total, side="left"))
    return float(2.0 ** ((b + 0.5) / BINS_PER_OCTAVE)) / 1e6


def _sample_quantile_ms(hist: dict, q: float) -> float | None:
    """The ``q`` quantile (milliseconds) of the samples' power-of-two histogram (bucket b ≥ 1:
    [2^(b+9), 2^(b+10)) ns, instrument/loader_workers.py ``HIST_SHIFT``): the bucket's geometric
    middle (within a factor √2); bucket 0 (under ~1 µs) as 0.5 µs."""
    total = sum(hist.values())
    if not total:
        return None
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= q * total:
            return (2.0 ** (b + 9.5) if b else 512.0) / 1e6
    return None


def _tail_share(hist: dict, top: float = 0.01) -> float | None:
    """The fraction (0–1) of all samples' time held by the slowest ``top`` (fraction) of samples,
    from the power-of-two histogram (bucket middles, as :func:`_sample_quantile_ms`); None without
    samples."""
    total_n = sum(hist.values())
    if not total_n:
        return None
    mid = {b: (2.0 ** (b + 9.5) if b else 512.0) for b in hist}
    total = sum(mid[b] * n for b, n in hist.items())
    left, tail = max(1.0, top * total_n), 0.0
    for b in sorted(hist, reverse=True):
        take = min(hist[b], left)
        tail += take * mid[b]
        left -= take
        if left <= 0:
            break
    return tail / total if total > 0 else None


def queue_facts(records: list[dict]) -> dict | None:
    """The training loop's view of its multi-worker DataLoader's queue, from the trainer's
    ``loader_queue`` records (:mod:`whyidle.instrument.loader_queue`), for the loader sampled most:
    ``loader``, ``cap`` (``prefetch_factor × num_workers``), ``samples`` (fetches sampled),
    ``ready_mean`` (batches ready when the loop asked), ``empty_share`` (0–1: none was ready, the loop
    waited on the workers), ``full_share`` (0–1: ``cap`` were: the loader was as far ahead as it can
    be), ``outstanding_mean`` (tasks handed to the workers and not yet taken by the loop);
    ``wait_ms`` (the sampled fetches' mean wait, milliseconds), ``behind_share`` (0–1 of the
    fetches) and ``behind_wait_share`` (0–1 of their summed wait) of the fetches after which the
    loop held later batches for order: it waited behind one slow batch while others were ready
    (head-of-line blocking); ``empty_wait_share`` (0–1 of the wait: fetches that found none ready).
    The wait fields are None for records written before they were counted (rows of 5). None
    without samples."""
    by_loader: dict = {}
    for rec in records:
        for row in rec.get("counts") or []:
            if not (isinstance(row, list) and len(row) in (5, 7) and all(isinstance(v, int) for v in row[1:])):
                continue
            if len(row) == 5:  # [loader, cap, ready, outstanding, n]: no end-of-fetch state
                row = [*row[:4], 0, row[4], -1]
            loader, cap, ready, outstanding, behind, n, wait = row
            by_loader.setdefault(loader, []).append((cap, ready, outstanding, n, behind, wait))
    if not by_loader:
        return None
    loader, rows = max(by_loader.items(), key=lambda kv: sum(r[3] for r in kv[1]))
    n = sum(r[3] for r in rows)
    if n <= 0:
        return None
    cap = max(r[0] for r in rows)
    timed = all(r[5] >= 0 for r in rows)
    wait = sum(r[5] for r in rows) if timed else 0

    def wait_share(rows_in) -> float | None:
        return None if not timed else (sum(r[5] for r in rows_in) / wait if wait > 0 else 0.0)
    return {"loader": loader, "cap": cap, "samples": n,
            "ready_mean": sum(r[1] * r[3] for r in rows) / n,
            "empty_share": sum(r[3] for r in rows if r[1] == 0) / n,
            "full_share": sum(r[3] for r in rows if r[1] >= r[0] > 0) / n,
            "outstanding_mean": sum(r[2] * r[3] for r in rows) / n,
            "wait_ms": wait / n / 1e6 if timed else None,
            "behind_share": sum(r[3] for r in rows if r[4]) / n if timed else None,
            "behind_wait_share": wait_share([r for r in rows if r[4]]),
            "empty_wait_share": wait_share([r for r in rows if r[1] == 0])}


def worker_facts(tallies: dict[int, WorkerTally], queue_records: list[dict] = (),
                 wait_split: dict | None = None) -> dict | None:
    """``metrics.loader_workers`` (docs/report.md) from the run's worker tallies (pid → tally) and
    the trainer's ``loader_queue`` records; None when no worker recorded a batch and no queue was
    sampled.

    Returns ``{workers, batches, sample_ms, slowest}`` (times in milliseconds: a sample often takes microseconds): ``workers`` one entry per worker process,
    by loader then worker id: ``loader``, ``worker``, ``pid``, ``batches``, ``samples``,
    ``batch_ms`` (``{p50, p95, p99}``: how long a batch took in the worker, within ~4.4 %; ``mean``: exact), ``busy_share`` (0–1, see
    the module's docstring), ``fetch_share``, ``collate_share`` (of the busy time: the samples'
    ``dataset[index]``/``next()`` and ``collate_fn``), ``cpu_share`` (the worker thread's CPU ÷
    its busy time: low means it waited on I/O or a lock while building batches);
    ``batches`` (all workers); ``sample_ms`` (``{p50, p99}`` of one sample, all workers; within a
    factor √2); ``slowest_1pct_share`` (0–1: the samples' time held by their slowest 1 %, from the
    histogram; a head-of-line tail when large); ``slowest`` (the slowest samples: ``{index, ms, worker, loader}``; ``index`` as the
    sampler gave it, text when it is not an int); ``queue`` (:func:`queue_facts`, or None);
    ``wait_split`` (what the training thread did in its data wait, from its stack samples:
    ``{receiving, waiting, snapshot, loader, other}`` fractions 0–1,
    :func:`whyidle.analysis.stacks.leaf_split`; None without samples)."""
    rows = []
    hist: dict = {}
    slowest = []
    for tally in sorted(tallies.values(), key=lambda t: (t.loader or 0, t.worker, t.pid)):
        if not tally.batches:
            continue
        span = max(1, (tally.last_t1 or 0) - (tally.first_t0 or 0))
        busy = max(1, tally.busy_ns)
        rows.append({
            "loader": tally.loader, "worker": tally.worker, "pid": tally.pid, "batches": tally.batches,
            "samples": tally.samples,
            "batch_ms": {**{name: _quantile_ms(tally.latency_bins, q) for name, q in QUANTILES},
                         "mean": tally.busy_ns / tally.batches / 1e6},
            "busy_share": min(1.0, tally.busy_ns / span),
            "fetch_share": min(1.0, tally.samples_ns / busy), "collate_share": min(1.0, tally.collate_ns / busy),
            "cpu_share": min(1.0, tally.cpu_ns / busy),
        })
        for b, n in tally.sample_hist.items():
            hist[b] = hist.get(b, 0) + n
        slowest += [{"index": index, "ms": ns / 1e6, "worker": tally.worker, "loader": tally.loader}
                    for index, ns in tally.slowest]
    queue = queue_facts(list(queue_records))
    if not rows and queue is None:
        return None
    slowest.sort(key=lambda e: -e["ms"])
    return {"workers": rows, "batches": sum(r["batches"] for r in rows),
            "sample_ms": {"p50": _sample_quantile_ms(hist, 0.5), "p99": _sample_quantile_ms(hist, 0.99)},
            "slowest_1pct_share": _tail_share(hist),
            "slowest": slowest[:SLOWEST_LISTED], "queue": queue, "wait_split": wait_split}
