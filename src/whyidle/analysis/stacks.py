"""Stack samples → hotspots: which source lines hold a phase of the step (pure).

Each ``stacks`` record holds sites ``[phase, user_site, leaf_site, count, ms]``: ``count``
samples standing for ``ms`` milliseconds of wall time (older records without ``ms``: ``count /
hz`` seconds). When the measured seconds of each phase are known (from the step hooks), sampled
time is rescaled to them per phase, so the split *within* a phase comes from the samples and the
phase totals stay exact. Hotspots are grouped by the user's function (file + function name): a
Python loop spreads its samples over several lines of one function. Sites are
``"file:line function"`` strings.
"""

from __future__ import annotations

import linecache
import os

#: Stack records are flushed every 0.5 s and cover the preceding interval; a record whose flush
#: time falls this long after the window end still describes time inside it.
FLUSH_SLACK_NS = 1_000_000_000


def split_site(site: str) -> tuple[str, int | None, str]:
    """``"path:line func"`` → (path, line, func); tolerant of odd input."""
    loc, _, func = site.rpartition(" ")
    if not loc:
        return site, None, ""
    path, _, line = loc.rpartition(":")
    try:
        return path, int(line), func
    except ValueError:
        return loc, None, func


def source_line(site: str, root: str | None) -> str | None:
    """The source text of a user site (``"file:line function"``), read from ``root`` (the run's
    working directory) for relative paths; None when the file is not readable here."""
    path, line, _func = split_site(site)
    if line is None or path.startswith("<"):
        return None
    if not os.path.isabs(path):
        if root is None:
            return None
        path = os.path.join(root, path)
    text = linecache.getline(path, line).strip()
    return text[:200] or None


def _sites(records: list[dict], phases: set[str], window: tuple[int, int] | None):
    """Yields ``(phase, user_site, leaf_site, count, seconds, callers)`` of the sampled sites in
    ``phases`` whose record was flushed inside ``window`` (plus :data:`FLUSH_SLACK_NS`)."""
    for rec in records:
        if rec.get("k") != "stacks":
            continue
        if window is not None and not (window[0] <= rec["t"] <= window[1] + FLUSH_SLACK_NS):
            continue
        hz = rec.get("hz") or 100.0
        for site in rec["sites"]:
            if site[0] in phases:
                seconds = site[4] / 1000.0 if len(site) > 4 else site[3] / hz
                yield site[0], site[1], site[2], site[3], seconds, (site[5] if len(site) > 5 else [])


def hotspots(records: list[dict], phases: set[str], window: tuple[int, int] | None = None,
             total_s: float | None = None, limit: int = 5, source_root: str | None = None,
             phase_seconds: dict[str, float] | None = None) -> list[dict]:
    """The functions where the training thread spent the given phases.

    Args:
        records: one process's records (only ``stacks`` records are read).
        phases: phase names to include (e.g. ``{"other"}`` or ``{"data"}``).
        window: [t0, t1] monotonic ns; records flushed inside it (plus
            :data:`FLUSH_SLACK_NS`) count. None: all.
        total_s: seconds to express ``share`` against (e.g. summed step time); None: shares of
            the samples in ``phases``.
        limit: how many to return.
        source_root: directory relative user paths are read from to fill ``code``.
        phase_seconds: measured seconds per phase in the window; sampled time of each phase is
            scaled to it.
    Returns:
        Busiest first: ``{"function", "site", "code", "seconds", "share", "samples", "leaf",
        "library": bool}``; ``code`` is the source text of ``site`` (None if unreadable);
        ``site`` is the function's most-sampled line, ``leaf`` the most common innermost frame
        under it (e.g. a library call), ``library`` True when no frame of
        the user's code was on the stack (the time is inside a library called from elsewhere).
    """
    groups: dict[tuple, dict] = {}
    sampled: dict[str, float] = {}
    entries = list(_sites(records, phases, window))
    for phase, *_rest, seconds, _callers in entries:
        sampled[phase] = sampled.get(phase, 0.0) + seconds
    scale = {p: (phase_seconds[p] / v if phase_seconds and phase_seconds.get(p) is not None and v > 0 else 1.0)
             for p, v in sampled.items()}
    n_phase = 0.0
    for phase, user, leaf, count, seconds, _callers in entries:
        seconds *= scale[phase]
        n_phase += seconds
        site = user or leaf or "(unknown)"
        path, _line, func = split_site(site)
        g = groups.setdefault((path, func, user is None), {"lines": {}, "leaves": {}, "seconds": 0.0, "samples": 0})
        g["seconds"] += seconds
        g["samples"] += count
        g["lines"][site] = g["lines"].get(site, 0) + seconds
        if leaf:
            g["leaves"][leaf] = g["leaves"].get(leaf, 0) + seconds
    denom = total_s if total_s else n_phase
    out = []
    for (path, func, library), g in groups.items():
        out.append({
            "function": f"{os.path.basename(path)} {func}".strip(),
            "site": max(g["lines"], key=g["lines"].get),
            "seconds": g["seconds"],
            "share": g["seconds"] / denom if denom else None,
            "samples": g["samples"],
            "leaf": max(g["leaves"], key=g["leaves"].get) if g["leaves"] else None,
            "library": library,
        })
    out.sort(key=lambda h: -h["seconds"])
    out = out[:limit]
    for h in out:
        h["code"] = None if h["library"] else source_line(h["site"], source_root)
    return out


def focus(records: list[dict], phase: str, window: tuple[int, int] | None = None,
          phase_seconds: float | None = None, source_root: str | None = None,
          min_share: float = 0.5) -> dict | None:
    """The most specific user function that holds most of a phase, counted inclusively.

    Every user function on a sample's stack (the innermost and its recorded callers) gets the
    sample's time once. The answer is the deepest function whose inclusive time is at least
    ``min_share`` of the phase's sampled time: for a tokenizer called from ``__getitem__`` it is
    the tokenizer's entry point rather than one of its many small helpers.

    Returns ``{"function", "site", "code", "seconds", "share_of_phase"}`` (seconds scaled to
    ``phase_seconds`` when given), or None without samples or when no function reaches
    ``min_share``.
    """
    inclusive: dict[tuple, float] = {}
    depth: dict[tuple, list] = {}
    lines: dict[tuple, dict] = {}
    total = 0.0
    for _phase, user, _leaf, _count, seconds, callers in _sites(records, {phase}, window):
        total += seconds
        seen = set()
        for level, s in enumerate(([user] if user else []) + list(callers)):
            path, _line, func = split_site(s)
            key = (path, func)
            if key in seen:
                continue
            seen.add(key)
            inclusive[key] = inclusive.get(key, 0.0) + seconds
            depth.setdefault(key, []).append(level)
            by_line = lines.setdefault(key, {})
            by_line[s] = by_line.get(s, 0.0) + seconds
    if total <= 0:
        return None
    candidates = [k for k, v in inclusive.items() if v >= min_share * total]
    if not candidates:
        return None
    # deepest = smallest typical distance from the innermost user frame
    best = min(candidates, key=lambda k: (sorted(depth[k])[len(depth[k]) // 2], -inclusive[k]))
    site = max(lines[best], key=lines[best].get)
    scale = (phase_seconds / total) if phase_seconds else 1.0
    return {"function": f"{os.path.basename(best[0])} {best[1]}".strip(), "site": site,
            "code": source_line(site, source_root), "seconds": inclusive[best] * scale,
            "share_of_phase": inclusive[best] / total}
