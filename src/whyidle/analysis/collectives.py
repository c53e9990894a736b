"""The rank the others wait for, from the collectives each rank timed (pure; no framework imports).

Every rank of a DDP job meets the others at the step's collectives (the buffer broadcast, the
gradient all-reduce, the program's own all-reduces and barriers). Per step, a rank's time in them
(``colls`` rows, :mod:`whyidle.instrument.collectives`) is the transfer plus its wait for the
last rank to arrive; the transfer is the same on every rank, so the rank with the least time
arrived last (the step's *culprit*) and each other rank's time above that least is its wait for
it. Each rank measures on its own clock, so ranks on different nodes compare without aligning
clocks. The job's culprit is the rank whose late arrivals cost the others the most wait in all;
``culprit_share`` says how stable that is (TraceLens reports "rank 4 arrived last 86 % of the time").
"""

from __future__ import annotations

import statistics

from whyidle.analysis.stepcols import StepCols
from whyidle.record.steptable import NULL_INT

#: Steps at the start left out (start-up: the first collectives meet ranks still starting), as
#: the step analysis leaves out its warm-up steps (analysis/steps.py).
SKIP_STEPS = 2

#: Elements up to which a collective's largest tensor is a metric (a few scalars), not model state.
METRIC_MAX_NUMEL = 64

#: Fewest steps every rank timed for a measured culprit; fewer, the ranks' phases tell it.
MIN_STEPS = 5

#: A step has a late rank when another rank waited for it at least this long: ``LATE_MIN_S``
#: seconds and ``LATE_MIN_SHARE`` of the step. Below, the jitter of a loopback all-reduce on a
#: shared 2-core box (measured 0.5–2 ms between two gloo ranks with identical work).
LATE_MIN_S = 0.002
LATE_MIN_SHARE = 0.05

#: Least wait per step a culprit must cost each other rank beyond what they cost (``caused_s``),
#: seconds: half a late step's floor. Below it, scheduling hiccups of a shared box: a balanced
#: 2-rank gloo job with 4 ms steps showed 0.5 ms per step (10 %) in 1 run of 8 here.
CAUSED_MIN_S = 0.001

#: The culprit's late arrivals must cost at least this fraction of all the waiting at late steps:
#: with two ranks and only jitter each causes about half (late 42/58 % of the time on a balanced
#: job here). Weighted by the wait, not counted: rank-0-only validation late 8 times by 80 ms
#: beside 6 hiccups of 2 ms on the other rank is one culprit (a count said 57 %: none).
MIN_CULPRIT_SHARE = 2 / 3


def _rows(records: list[dict], width: int = 7):
    """The ``colls`` rows of a rank's records that are lists of at least ``width`` values with an
    integer step index (damaged ones are skipped)."""
    for rec in records:
        if rec.get("k") == "colls" and isinstance(rec.get("rows"), list):
            for row in rec["rows"]:
                if isinstance(row, list) and len(row) >= width and isinstance(row[0], int):
                    yield row


def step_waits(records: list[dict]) -> dict[int, float]:
    """Step index → seconds the rank spent in collectives in that step: the program's blocking
    collectives, DDP's buffer broadcast and its first gradient bucket's arrival-to-completion time
    (``colls`` rows; a row that is not a list of numbers is skipped)."""
    out: dict[int, float] = {}
    for row in _rows(records):
        try:
            _i, _n, ns, _numel, bcast, _buckets, lag = row[:7]
            out[row[0]] = (int(ns) + int(bcast) + int(lag or 0)) / 1e9
        except (TypeError, ValueError):
            continue
    return out


def program_collectives(records: list[dict]) -> dict | None:
    """The program's own blocking collectives per step: ``{steps, per_step, s_per_step,
    small_share}`` (``per_step``: mean count over the steps with a row and steps after
    ``SKIP_STEPS``; ``s_per_step``: seconds; ``small_share``: fraction of those steps whose largest
    tensor had ≤ ``METRIC_MAX_NUMEL`` elements — scalar metrics), or None without any."""
    rows = [r for r in _rows(records) if r[0] >= SKIP_STEPS and isinstance(r[1], int) and r[1] > 0]
    if not rows:
        return None
    return {"steps": len(rows), "per_step": sum(r[1] for r in rows) / len(rows),
            "s_per_step": sum(r[2] for r in rows if isinstance(r[2], int)) / 1e9 / len(rows),
            "small_share": sum(1 for r in rows if isinstance(r[3], int) and 0 <= r[3] <= METRIC_MAX_NUMEL) / len(rows)}


def culprit(waits: dict, step_s: dict, skip: int = SKIP_STEPS, min_steps: int = MIN_STEPS) -> dict | None:
    """The rank the others wait for at the collectives, measured.

    Args:
        waits: rank → (step index → seconds in collectives), :func:`step_waits` of each rank.
        step_s: rank → its mean step time (seconds), for the shares.
        skip: steps with an index below it are left out (start-up).
        min_steps: fewest steps compared for a result.
    Returns:
        None when fewer than two ranks or fewer than ``min_steps`` steps (from index ``skip``)
        that every rank timed: the measurement does not decide. Else ``{rank, steps, late_steps,
        late_at, compared, culprit_share, caused_share, wait_s_by_rank, collective_s_by_rank, wait_share}``: ``rank`` is the rank
        whose late arrivals cost the others the most wait, when that is at least
        ``MIN_CULPRIT_SHARE`` of what all late arrivals cost (None when no step had a late rank:
        a balanced job, or when no rank's share is that large); ``late_steps`` the steps with a late rank, ``late_at`` those where ``rank`` was late
        (index → the others' wait it caused, seconds) and ``compared`` of every compared step; ``culprit_share`` the fraction
        of those in which ``rank`` was the late one, ``caused_share`` the fraction of all late
        arrivals' wait that its late arrivals caused (≥ ``MIN_CULPRIT_SHARE``); ``wait_s_by_rank`` rank → its mean wait per
        step (seconds, over every compared step); ``collective_s_by_rank`` rank → its mean time in
        collectives per step; ``caused_s`` the wait per step the culprit's late arrivals
        cost each other rank, less what the other ranks' late arrivals cost (the median over
        them); ``wait_share`` that as a fraction of the other ranks' mean step (0 without culprit). Keys of the ``*_by_rank`` maps are strings.
    """
    if len(waits) < 2:
        return None
    common = set.intersection(*(set(w) for w in waits.values()))
    steps = sorted(i for i in common if i >= skip)
    if len(steps) < min_steps:
        return None
    ranks = list(waits)
    wait_sum = dict.fromkeys(ranks, 0.0)
    caused = dict.fromkeys(ranks, 0.0)
    late_count = dict.fromkeys(ranks, 0)
    late_at: dict = {r: {} for r in ranks}
    late_steps = 0
    typical = statistics.median(v for v in step_s.values() if v) if any(step_s.values()) else 0.0
    for i in steps:
        step = {r: waits[r][i] for r in ranks}
        last = min(step, key=step.get)
        excess = {r: v - step[last] for r, v in step.items()}
        for r, e in excess.items():
            wait_sum[r] += e
        if max(excess.values()) >= max(LATE_MIN_S, LATE_MIN_SHARE * typical):
            late_steps += 1
            late_count[last] += 1
            late_at[last][i] = sum(excess.values())
            caused[last] += sum(excess.values())
    n = len(steps)
    top = max(ranks, key=lambda r: caused[r]) if late_steps else None
    if top is not None and caused[top] / sum(caused.values()) < MIN_CULPRIT_SHARE:
        top = None  # late now one rank, now another: jitter, or no single culprit
    others = [r for r in ranks if r != top]
    # the wait it causes beyond what the others cause too (a balanced job's jitter cancels out)
    net = ((caused[top] - statistics.median(caused[r] for r in others)) / n / len(others)
           if top is not None else 0.0)
    mean_step = statistics.fmean(step_s[r] for r in others if step_s.get(r)) if any(step_s.get(r) for r in others) else 0.0
    return {"rank": top, "steps": n, "late_steps": late_steps, "late_at": late_at.get(top, {}), "compared": steps,
            "culprit_share": late_count[top] / late_steps if top is not None else None,
            "caused_share": caused[top] / sum(caused.values()) if top is not None else None,
            "wait_s_by_rank": {str(r): wait_sum[r] / n for r in ranks},
            "collective_s_by_rank": {str(r): sum(waits[r][i] for i in steps) / n for r in ranks},
            "caused_s": net, "wait_share": net / mean_step if mean_step > 0 else 0.0}


def accumulation(records: list[dict], steps: list) -> dict | None:
    """Gradient accumulation that reduces the gradients on every micro-batch (cases.md C27): DDP
    all-reduces at every backward outside ``no_sync()``, so with k micro-batches per optimizer step
    the gradient crosses the wire k times where once would do.

    ``records``: the rank's records (``colls`` rows with ``rounds``); ``steps``: its step rows
    (``mb``: backward calls per step). Over the steps after ``SKIP_STEPS`` with both: returns
    ``{steps, micro, rounds, exposed_s, redundant_s}`` (medians of micro-batches and reductions per
    step; mean seconds per step of reduction not hidden by backward compute, over the steps where
    it was timed; ``redundant_s`` = exposed_s × (rounds − 1) / rounds, what reducing once saves), or
    None when the medians are below 2 (no accumulation, or ``no_sync`` used) or nothing matched.
    """
    c = StepCols(steps)
    micro_batches = c.ints("mb")
    has = (micro_batches != NULL_INT) & (micro_batches != 0)
    mb = dict(zip(c.ints("i")[has].tolist(), micro_batches[has].tolist()))
    rows = [r for r in _rows(records, 9) if r[0] >= SKIP_STEPS and isinstance(r[7], int) and r[7] > 0 and r[0] in mb]
    if not rows:
        return None
    micro = statistics.median(mb[r[0]] for r in rows)
    rounds = statistics.median(r[7] for r in rows)
    if micro < 2 or rounds < 2:
        return None
    timed = [r for r in rows if isinstance(r[8], int)]
    exposed = sum(r[8] for r in timed) / len(timed) / 1e9 if timed else None
    return {"steps": len(rows), "micro": micro, "rounds": rounds, "exposed_s": exposed,
            "redundant_s": exposed * (rounds - 1) / rounds if exposed is not None else None}
