"""Does the training loop wait behind one slow batch while the DataLoader's other batches are ready?
(head-of-line blocking, issue 36 part 3; pure).

A multi-worker DataLoader hands batches over in the sampler's order: when one worker's batch is
slow (a huge image, a remote read that stalls), the batches other workers finished are received
and held for order while the loop waits for that one (a study of the PyTorch DataLoader traced
76 % GPU idleness to it, and reordering raised utilization from 46 % to 90 %: MinatoLoader,
arXiv 2509.10712). The queue sampler (:mod:`whyidle.instrument.loader_queue`) says, for each timed
fetch, whether later batches were held for order when it ended (``queue.behind_wait_share``: the
share of the wait spent so); the workers' own tallies (:mod:`whyidle.analysis.loader_workers`)
say how fast each builds batches.

The estimates bound what each fix can give by the loop's own work and the workers' throughput:

- ``in_order=False`` (PyTorch ≥ 2.6) hands batches over as they finish and sends new indices to the
  workers with the fewest outstanding: the wait behind slow batches goes, and the loop runs at
  the pace of the workers together (one batch per step every ``1 / Σ (1 / mean batch time)``).
- More prefetch keeps the order but lets a stall be covered by batches built ahead: each worker
  still delivers every ``num_workers``-th batch, so the loop can run no faster than the slowest
  worker's mean batch time ÷ ``num_workers``.
- Making the slow samples cheap (cached, pre-resized, bucketed, a timeout on the remote read)
  removes their time: assumed to bring every worker to the others' pace.
"""

from __future__ import annotations

import math

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.loader_call import Change
from whyidle.diagnose.types import FixOption, fix_option

DOCS_IN_ORDER = "https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"
#: Most batches per worker the prefetch fix asks for (``prefetch_factor``): each is a batch in memory.
PREFETCH_MAX = 16


def _version_at_least(version: str | None, major: int, minor: int) -> bool | None:
    """``version`` ("2.13.0+cpu") is at least ``major.minor``; None when unknown."""
    try:
        parts = [int(p) for p in (version or "").split("+")[0].split(".")[:2]]
        return tuple(parts) >= (major, minor)
    except ValueError:
        return None


def _workers(lw: dict) -> list[dict]:
    """The worker rows of the loader the queue was sampled on (all rows when the ids differ: a
    loader built again every epoch)."""
    q = lw.get("queue") or {}
    rows = [w for w in lw.get("workers") or [] if w["batches"] and (w["batch_ms"] or {}).get("mean")]
    return [w for w in rows if w["loader"] == q.get("loader")] or rows


def head_of_line(facts: RunFacts) -> dict | None:
    """The head-of-line reading of the run's data wait, or None when the loop does not mostly wait
    behind a slow batch (``queue.behind_wait_share`` < ``T.HOL_MIN_SHARE_OF_WAIT``), the queue or
    the workers were not recorded, or removing that wait would gain less than
    ``T.VERDICT_MIN_SPEEDUP`` here.

    Returns ``{behind_s, step_s, rest_s, pace_s, slowest_pace_s, est_in_order, est_prefetch,
    est_cheap, prefetch, slow_worker, reason}``: seconds per step waited behind slow batches, the
    mean step, the step without its data wait, the step's floor at the workers' combined pace and
    at the slowest worker's pace (see the module docstring), the step-time ratios of the three
    fixes, the ``prefetch_factor`` that covers a slow batch, the slowest worker's row, and the
    sentence for the finding's summary.
    """
    lw = facts.loader_workers or {}
    q = lw.get("queue") or {}
    step = facts.step or {}
    nw = (facts.loader or {}).get("num_workers") or 0
    share = q.get("behind_wait_share")
    workers = _workers(lw)
    if not nw or share is None or share < T.HOL_MIN_SHARE_OF_WAIT or not workers or not step:
        return None
    mean = step["step_time_s"]["mean"]
    wait = step["data_wait_s_per_step"]
    behind = share * wait * (1.0 - (facts.data_ipc_share or 0.0))  # receiving later batches is no waiting
    rest = max(0.0, mean - wait)
    means = [w["batch_ms"]["mean"] / 1e3 for w in workers]
    pace = 1.0 / sum(1.0 / m for m in means) * len(means) / nw  # workers not seen count at the mean
    slow = max(workers, key=lambda w: w["batch_ms"]["mean"])
    slowest_pace = max(means) / nw
    median = sorted(means)[(len(means) - 1) // 2] / nw  # every worker at the typical (lower-median) worker's pace
    left = mean - behind

    def ratio(floor: float) -> float:
        return mean / max(left, rest, floor, 1e-9)
    est_in_order = ratio(pace)
    if est_in_order < T.VERDICT_MIN_SPEEDUP:
        return None
    tail = (slow["batch_ms"].get("p99") or slow["batch_ms"]["mean"]) / 1e3
    prefetch = min(PREFETCH_MAX, max(2, math.ceil(tail / (nw * max(left, rest, pace, 1e-9))) + 1))
    pf_now = (facts.loader or {}).get("prefetch_factor") or 2
    slowest = [e for e in lw.get("slowest") or [] if e.get("loader") in (None, slow["loader"])]
    tail_share = lw.get("slowest_1pct_share")
    sample = (lw.get("sample_ms") or {}).get("p50")
    names = ", ".join(f"{e['index']} ({e['ms']:.0f} ms)" for e in slowest[:3])
    reason = (f"the loop waits behind one slow batch while the others are ready: {behind / wait:.0%} of the wait "
              f"came with later batches already received and held for order; worker {slow['worker']}'s batches take "
              f"{slow['batch_ms']['mean']:.1f} ms on average (p99 {slow['batch_ms'].get('p99') or 0:.0f} ms)"
              + (f", the slowest 1 % of samples hold {tail_share:.0%} of the loading time" if tail_share else "")
              + (f" (slowest: {names}" + (f"; a median sample {sample:.2g} ms" if sample else "") + ")" if names else ""))
    return {"behind_s": behind, "step_s": mean, "rest_s": rest, "pace_s": pace, "slowest_pace_s": slowest_pace,
            "est_in_order": est_in_order, "est_prefetch": ratio(slowest_pace) if prefetch > pf_now else 1.0,
            "est_cheap": ratio(median), "prefetch": prefetch, "prefetch_now": pf_now, "slow_worker": slow,
            "slowest": slowest[:3], "reason": reason}


def options(facts: RunFacts, hol: dict) -> list[FixOption]:
    """The head-of-line fixes in the program's API, each with its estimate (:func:`head_of_line`):
    ``in_order=False``, a larger ``prefetch_factor``, the slow samples made cheap (assumed)."""
    def code(changes: list[Change]) -> str | None:
        if fixes.api_name(facts) == "hf_trainer":
            return None  # the Trainer builds the DataLoader: no TrainingArguments field for in_order
        return "\n".join(fixes.in_api(facts, fixes.loader_lines(facts, changes)))

    version = (facts.proc or {}).get("framework_version")
    new = _version_at_least(version, 2, 6)
    hf = fixes.api_name(facts) == "hf_trainer"
    where = " (override Trainer.get_train_dataloader to build it)" if hf else ""
    order_text = ("Hand batches over as they finish: DataLoader(..., in_order=False)" + where + ", so the batches "
                  "other workers finished are not held behind a slow one, and new indices go to the workers with "
                  "the fewest outstanding" + (f" (PyTorch 2.6 or later; this run has {version})" if new is False else "")
                  + ".")
    opts = [fix_option(order_text, round(hol["est_in_order"], 3),
                       "batches arrive in completion order, not the sampler's (fine for shuffled training; keep the "
                       "order for evaluation)",
                       code([Change("in_order", "False", now=True, note="a slow batch no longer holds the others")]))]
    if hol["est_prefetch"] >= T.VERDICT_MIN_SPEEDUP:
        opts.append(fix_option(
            f"Keep the order and queue more batches per worker: prefetch_factor={hol['prefetch']} (now "
            f"{hol['prefetch_now']}) covers a slow batch of {hol['slow_worker']['batch_ms'].get('p99') or 0:.0f} ms "
            f"with batches built ahead{where}.", round(hol["est_prefetch"], 3),
            f"holds prefetch_factor × num_workers batches in memory; no faster than worker "
            f"{hol['slow_worker']['worker']}'s own pace",
            code([Change("prefetch_factor", str(hol["prefetch"]), now=hol["prefetch_now"], off="None")])))
    named = ", ".join(str(e["index"]) for e in hol["slowest"])
    opts.append(fix_option(
        "Make the slow samples cheap" + (f" (indices {named})" if named else "") + ": cache or pre-resize them once, "
        "bucket samples by cost so a batch does not mix one slow sample with fast ones, and give remote reads a "
        "timeout with a retry.", round(hol["est_cheap"], 3),
        "if every worker then builds batches at the typical worker's pace", None, assumed=True))
    return opts
