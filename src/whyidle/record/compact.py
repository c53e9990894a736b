"""Stack samples of a long run kept as coarser records while they are read (pure).

The agent flushes a ``stacks`` record every 0.5 s: 172,800 a day, ~5 KB each once parsed (a day's
records alone took ~1 GB). Every consumer sums the sampled sites over a time window
(:func:`whyidle.analysis.stacks.sampled_sites`): the analyzed steps' window, the teardown after
the last step. :class:`StacksMerger` sums each run of ``group`` consecutive records into one (its
``t`` the run's last flush, the samples of identical sites added), except the records of the
first and last :data:`RAW_EDGE_NS` of the run, kept as they were, so the windows that start or end
near the run's edges (warm-up, teardown) see exactly the samples they did. Inside, a window's edge
moves by at most one group (``group`` × 0.5 s): 4.5 s of a day's samples at 20,000 records.
"""

from __future__ import annotations

import collections
from typing import Annotated, Optional, Union

import msgspec

#: Most ``stacks`` records a report keeps of one process (~2.8 hours of 0.5 s flushes unmerged).
STACKS_MAX = 20_000
#: The first and last stretch of the run whose records stay as written (ns).
RAW_EDGE_NS = 600 * 1_000_000_000


#: How the agent's writer starts a ``stacks`` line (compact JSON, ``k`` first).
STACKS_PREFIX = b'{"k":"stacks",'
_L = 2**63
#: :data:`whyidle.record.schema.NUM` as a type: an int or a float (not a bool) within ±2**63.
_NUM = Union[Annotated[int, msgspec.Meta(ge=-_L + 1, le=_L - 1)], Annotated[float, msgspec.Meta(gt=-_L, lt=_L)]]


class _Stacks(msgspec.Struct):
    """A ``stacks`` record as the agent writes it (docs/run-format.md): the schema's checks as
    types, each site row the six items ``[phase, user, leaf, count, ms, callers]``."""

    t: _NUM
    sites: list[tuple[str, Optional[str], Optional[str], _NUM, _NUM, list[str]]]
    hz: Optional[_NUM] = None
    n: Optional[_NUM] = None
    mode: Optional[str] = None
    lost: Optional[_NUM] = None
    lost_s: Optional[_NUM] = None


_STACKS = msgspec.json.Decoder(_Stacks)


def decode_stacks(raw: bytes) -> dict | None:
    """A ``stacks`` line as its record (site rows as tuples), decoded and checked in one typed
    pass (3× ``json.loads`` plus :func:`whyidle.record.schema.problem`); None when the line is
    not such a record or a value does not fit (the caller reads it the general way, which says
    what it leaves out). Fields the agent does not write are not kept: for the merged records of
    a long run, which read only these."""
    try:
        s = _STACKS.decode(raw)
    except msgspec.DecodeError:
        return None
    return {"k": "stacks", "t": s.t, "hz": s.hz, "n": s.n, "mode": s.mode, "lost": s.lost, "lost_s": s.lost_s,
            "sites": s.sites}


class StacksMerger:
    """Takes a process's ``stacks`` records in time order (:meth:`add`, already checked by
    :mod:`whyidle.record.schema`) and gives them back, merged by ``group`` outside the run's edges
    (:meth:`finish`), as ``stacks`` records of the same format (each site row
    ``[phase, user, leaf, count, ms, callers]``)."""

    def __init__(self, group: int) -> None:
        self.group = max(1, group)
        self.out: list[dict] = []
        self.recent: collections.deque = collections.deque()  # the last RAW_EDGE_NS, unmerged
        self.first_t: int | None = None
        self.batch: list[dict] = []
        self.names: dict[str, str] = {}  # one copy of each site name across the merged records

    def add(self, rec: dict) -> None:
        t = rec["t"]
        if self.first_t is None:
            self.first_t = t
        if t - self.first_t <= RAW_EDGE_NS or self.group == 1:
            self.out.append(rec)
            return
        self.recent.append(rec)
        while self.recent and self.recent[0]["t"] < t - RAW_EDGE_NS:
            self.batch.append(self.recent.popleft())
            if len(self.batch) == self.group:
                self.out.append(merged(self.batch, self.names))
                self.batch = []

    def finish(self) -> list[dict]:
        """The records, in time order (the last stretch unmerged)."""
        if self.batch:
            self.out.append(merged(self.batch, self.names))
            self.batch = []
        self.out.extend(self.recent)
        self.recent.clear()
        return self.out


def merged(records: list[dict], names: dict[str, str] | None = None) -> dict:
    """One ``stacks`` record holding the samples of ``records`` (consecutive, in time order): ``t``
    the last one's, ``n``/``lost``/``lost_s`` summed, each distinct site (phase, user site, leaf,
    callers) once with its count and milliseconds summed (a row without ``ms`` counts
    ``count / hz``). ``names``: a pool the merged rows take their strings from (one copy each)."""
    sites: dict[tuple, list] = {}
    pool = {} if names is None else names

    def one(s):
        return s if s is None else pool.setdefault(s, s)
    n = lost = 0
    lost_s = 0.0
    for rec in records:
        hz = rec.get("hz") or 100.0
        n += rec.get("n") or 0
        lost += rec.get("lost") or 0
        lost_s += rec.get("lost_s") or 0.0
        for site in rec["sites"]:
            if len(site) == 6:  # as the agent writes it
                phase, user, leaf, count, ms, callers = site
                callers = tuple(callers)
            else:
                phase, user, leaf, count = site[:4]
                callers = tuple(site[5]) if len(site) > 5 else ()
                ms = site[4] if len(site) > 4 else count / hz * 1000.0
            key = (phase, user, leaf, callers)
            acc = sites.get(key)
            if acc is None:
                sites[key] = [one(phase), one(user), one(leaf), count, ms, [one(c) for c in callers]]
            else:
                acc[3] += count
                acc[4] += ms
    last = records[-1]
    out = {k: v for k, v in last.items() if k != "sites"}
    out.update(n=n, lost=lost, lost_s=lost_s, sites=list(sites.values()), merged=len(records))
    return out
