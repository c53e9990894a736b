"""Do an ``IterableDataset``'s workers hold shards of unequal length? (issue 36, part 5; pure).

Every worker runs the dataset's ``__iter__`` over its own shard: when one shard is far longer than
the others, the other workers finish early and each epoch ends with that one worker alone feeding
the loop, at a fraction of the loader's pace. The workers' own tallies
(:mod:`whyidle.analysis.loader_workers`) give each worker id's batches and building time over the
run (workers of a loader built again every epoch summed by worker id): with shards of equal
work the loader would finish an epoch in ``Σ busy / num_workers`` instead of the longest worker's
``max busy``.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.types import FixOption, fix_option


def uneven(facts: RunFacts) -> dict | None:
    """The uneven-shard reading of the run's data wait, or None: not an ``IterableDataset`` with
    workers, fewer than two workers recorded, or the longest worker's building time is less than
    ``T.SHARD_MIN_IMBALANCE`` × the mean, or evening it out would gain less than
    ``T.VERDICT_MIN_SPEEDUP``.

    Returns ``{batches, busy_s, imbalance, est, reason}``: per worker id its batches and building
    seconds, max ÷ mean of the building time, the step-time ratio with the work evenly spread (the
    loop's own part of the step stays: ``T / max(T − wait, T × mean/max)``), and the sentence for
    the finding's summary.
    """
    loader = facts.loader or {}
    step = facts.step or {}
    rows = (facts.loader_workers or {}).get("workers") or []
    if not loader.get("iterable") or not loader.get("num_workers") or not step:
        return None
    batches: dict[int, int] = {}
    busy: dict[int, float] = {}
    for w in rows:
        if (w.get("batch_ms") or {}).get("mean") is None:
            continue
        batches[w["worker"]] = batches.get(w["worker"], 0) + w["batches"]
        busy[w["worker"]] = busy.get(w["worker"], 0.0) + w["batches"] * w["batch_ms"]["mean"] / 1e3
    if len(busy) < 2:
        return None
    mean_busy = sum(busy.values()) / len(busy)
    top = max(busy, key=busy.get)
    imbalance = busy[top] / mean_busy if mean_busy > 0 else 1.0
    if imbalance < T.SHARD_MIN_IMBALANCE:
        return None
    mean, wait = step["step_time_s"]["mean"], step["data_wait_s_per_step"]
    est = mean / max(mean - wait, mean / imbalance, 1e-9)
    if est < T.VERDICT_MIN_SPEEDUP:
        return None
    others = sorted(batches[w] for w in batches if w != top)
    reason = (f"the IterableDataset's shards are uneven: worker {top} built {batches[top]} batches, the others "
              f"{others[0]}–{others[-1]}" if others[0] != others[-1] else
              f"the IterableDataset's shards are uneven: worker {top} built {batches[top]} batches, the others "
              f"{others[0]} each")
    reason += (f" ({imbalance:.1f}× the mean building time), so each epoch ends with worker {top} alone feeding "
               "the loop")
    return {"batches": batches, "busy_s": busy, "imbalance": imbalance, "est": est, "reason": reason}


def options(shards: dict) -> list[FixOption]:
    """The fix for uneven shards, with its estimate (:func:`uneven`)."""
    return [fix_option(
        "Spread the samples evenly over the workers in the dataset's __iter__: interleave them (sample i to worker "
        "i % num_workers) or split every file, not whole files of different sizes, per worker; with several ranks, "
        "shard by rank × num_workers + worker id.", round(shards["est"], 3),
        "every worker then builds the same share of each epoch",
        "info = torch.utils.data.get_worker_info()\n"
        "for i, sample in enumerate(all_samples()):   # every worker walks the same stream...\n"
        "    if info is None or i % info.num_workers == info.id:   # ...and keeps its own interleaved share\n"
        "        yield prepare(sample)")]
