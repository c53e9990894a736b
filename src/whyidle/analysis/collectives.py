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

import dataclasses
import statistics

import numpy as np

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
    return {i: ns / 1e9 for i, ns in _wait_ns(records).items()}


def _wait_ns(records: list[dict]) -> dict[int, int]:
    """Step index → nanoseconds in collectives (:func:`step_waits`; a later row of a step wins)."""
    out: dict[int, int] = {}
    for row in _rows(records):
        try:
            _i, _n, ns, _numel, bcast, _buckets, lag = row[:7]
            out[row[0]] = int(ns) + int(bcast) + int(lag or 0)
        except (TypeError, ValueError):
            continue
    return out


@dataclasses.dataclass
class StepWaits:
    """One rank's time in collectives per step as arrays (what :func:`culprit` compares; a merge
    of node runs reads them from the ranks' summaries, record/rank_summary.py).

    ``steps``: step indexes, increasing (int64); ``ns``: nanoseconds in collectives at each
    (:func:`step_waits`' seconds × 1e9; any integer dtype)."""

    steps: np.ndarray
    ns: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)


def wait_arrays(records: list[dict]) -> StepWaits:
    """:func:`step_waits` of a rank's records as :class:`StepWaits` (steps in increasing order)."""
    waits = _wait_ns(records)
    steps = np.fromiter(waits, dtype=np.int64, count=len(waits))
    ns = np.fromiter(waits.values(), dtype=np.int64, count=len(waits))
    order = np.argsort(steps, kind="stable")
    return StepWaits(steps[order], ns[order])


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
        waits: rank → (step index → seconds in collectives), :func:`step_waits` of each rank, or
            its :class:`StepWaits` (the same figures as arrays; a thousand ranks of an hour's
            steps are compared in column blocks of :data:`BLOCK_CELLS` values).
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
    ranks = list(waits)
    cols = [_as_arrays(w) for w in waits.values()]
    steps = _common_steps([c[0] for c in cols])
    steps = steps[steps >= skip]
    if len(steps) < min_steps:
        return None
    n, width = len(steps), len(ranks)
    typical = statistics.median(v for v in step_s.values() if v) if any(step_s.values()) else 0.0
    floor = max(LATE_MIN_S, LATE_MIN_SHARE * typical)
    # the sums run in the order the per-step loop they replace ran them (rank after rank, step
    # after step: a reduction over the rows of a block adds them one by one, a cumulative sum along
    # a row too; never pairwise), so the figures equal it to the last bit (tests/test_rank_summary.py)
    wait_sum = np.zeros(width)
    coll_sum = np.zeros(width)
    last = np.empty(n, dtype=np.int64)
    total = np.empty(n)
    late = np.empty(n, dtype=bool)
    block = max(1, BLOCK_CELLS // width)
    for a in range(0, n, block):
        at = steps[a:a + block]
        cut = slice(a, a + len(at))
        m = np.empty((width, len(at)))  # ranks × steps
        for r, (idx, values, scale) in enumerate(cols):
            picked = values[_positions(idx, at)]
            m[r] = picked / scale if scale else picked
        least = m.min(axis=0)
        last[cut] = (m == least).argmax(axis=0)  # the first rank with the least time arrived last
        excess = m - least
        total[cut] = np.add.reduce(excess, axis=0)
        late[cut] = excess.max(axis=0) >= floor
        coll_sum = _running(coll_sum, m)
        wait_sum = _running(wait_sum, excess)
    late_steps = int(late.sum())
    caused = np.zeros(width)
    np.add.at(caused, last[late], total[late])  # in step order, one addition at a time
    late_count = np.bincount(last[late], minlength=width)
    caused_list = caused.tolist()
    top = max(range(width), key=lambda r: caused_list[r]) if late_steps else None
    if top is not None and caused_list[top] / sum(caused_list) < MIN_CULPRIT_SHARE:
        top = None  # late now one rank, now another: jitter, or no single culprit
    others = [r for r in range(width) if r != top]
    # the wait it causes beyond what the others cause too (a balanced job's jitter cancels out)
    net = ((caused_list[top] - statistics.median(caused_list[r] for r in others)) / n / len(others)
           if top is not None else 0.0)
    named = [ranks[r] for r in others]
    mean_step = (statistics.fmean(step_s[r] for r in named if step_s.get(r))
                 if any(step_s.get(r) for r in named) else 0.0)
    mine = late & (last == top) if top is not None else np.zeros(n, dtype=bool)
    return {"rank": ranks[top] if top is not None else None, "steps": n, "late_steps": late_steps,
            "late_at": dict(zip(steps[mine].tolist(), total[mine].tolist())), "compared": steps.tolist(),
            "culprit_share": int(late_count[top]) / late_steps if top is not None else None,
            "caused_share": caused_list[top] / sum(caused_list) if top is not None else None,
            "wait_s_by_rank": {str(r): v / n for r, v in zip(ranks, wait_sum.tolist())},
            "collective_s_by_rank": {str(r): v / n for r, v in zip(ranks, coll_sum.tolist())},
            "caused_s": net, "wait_share": net / mean_step if mean_step > 0 else 0.0}


#: Values (ranks × steps) :func:`culprit` holds per block of compared steps: 1M, 8 MB of float64
#: (a 1,024-rank hour of 100 ms steps is 37M values, compared in 36 blocks).
BLOCK_CELLS = 1 << 20


def _as_arrays(w) -> tuple[np.ndarray, np.ndarray, float]:
    """``(steps, values, scale)`` of one rank's waits: seconds = values / scale (scale 0: values
    are seconds already). A dict's steps are sorted."""
    if isinstance(w, StepWaits):
        return np.asarray(w.steps, dtype=np.int64), w.ns, 1e9
    steps = sorted(w)
    return np.array(steps, dtype=np.int64), np.array([w[i] for i in steps], dtype=np.float64), 0.0


def _contiguous(idx: np.ndarray) -> bool:
    return len(idx) > 0 and int(idx[-1]) - int(idx[0]) == len(idx) - 1


def _common_steps(all_steps: list[np.ndarray]) -> np.ndarray:
    """The step indexes every rank holds (each array increasing and unique), increasing."""
    common = all_steps[0]
    for idx in all_steps[1:]:
        if not len(common):
            break
        if _contiguous(idx):
            common = common[(common >= idx[0]) & (common <= idx[-1])]
        else:
            pos = np.minimum(np.searchsorted(idx, common), len(idx) - 1) if len(idx) else None
            common = common[idx[pos] == common] if pos is not None else common[:0]
    return common


def _positions(idx: np.ndarray, at: np.ndarray):
    """Where the steps ``at`` (all held by ``idx``) sit in ``idx``: a slice when they are one run."""
    first = int(at[0]) - int(idx[0])
    if _contiguous(idx) and int(at[-1]) - int(at[0]) == len(at) - 1:
        return slice(first, first + len(at))
    return np.searchsorted(idx, at)


def _running(carry: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``carry`` plus each row of ``m`` added value after value, left to right (``m`` is
    overwritten)."""
    if not m.shape[1]:
        return carry
    m[:, 0] += carry
    return np.cumsum(m, axis=1, out=m)[:, -1].copy()


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
    rows = [r for r in _rows(records, 9) if r[0] >= SKIP_STEPS and isinstance(r[7], int) and r[7] > 0]
    if not rows:
        return None
    c = StepCols(steps)
    micro_batches = c.ints("mb")
    has = (micro_batches != NULL_INT) & (micro_batches != 0)
    ids = c.ints("i")[has]
    mine = np.isin(ids, np.array([r[0] for r in rows], dtype=np.int64))  # the steps of these rows only
    mb = dict(zip(ids[mine].tolist(), micro_batches[has][mine].tolist()))
    rows = [r for r in rows if r[0] in mb]
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
