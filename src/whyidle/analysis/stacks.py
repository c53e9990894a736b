"""Stack samples → hotspots: which source lines hold a phase of the step (pure).

Each ``stacks`` record counts ``[phase, user_site, leaf_site, count]`` at ``hz`` samples per
second, so ``count / hz`` estimates seconds (sampling error about ``sqrt(count) / hz``). Hotspots
are grouped by the user's function (file + function name): a Python loop spreads its samples over
several lines of one function. Sites are ``"file:line function"`` strings.
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


def hotspots(records: list[dict], phases: set[str], window: tuple[int, int] | None = None,
             total_s: float | None = None, limit: int = 5, source_root: str | None = None) -> list[dict]:
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
    Returns:
        Busiest first: ``{"function", "site", "code", "seconds", "share", "samples", "leaf",
        "library": bool}``; ``code`` is the source text of ``site`` (None if unreadable); ``site`` is the function's most-sampled line, ``leaf`` the most
        common innermost frame under it (e.g. a library call), ``library`` True when no frame of
        the user's code was on the stack (the time is inside a library called from elsewhere).
    """
    groups: dict[tuple, dict] = {}
    n_phase = 0.0
    for rec in records:
        if rec.get("k") != "stacks":
            continue
        if window is not None and not (window[0] <= rec["t"] <= window[1] + FLUSH_SLACK_NS):
            continue
        hz = rec.get("hz") or 100.0
        for phase, user, leaf, count in rec["sites"]:
            if phase not in phases:
                continue
            seconds = count / hz
            n_phase += seconds
            site = user or leaf or "(unknown)"
            path, _line, func = split_site(site)
            g = groups.setdefault((path, func, user is None), {"lines": {}, "leaves": {}, "seconds": 0.0, "samples": 0})
            g["seconds"] += seconds
            g["samples"] += count
            g["lines"][site] = g["lines"].get(site, 0) + count
            if leaf:
                g["leaves"][leaf] = g["leaves"].get(leaf, 0) + count
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


def sampled_seconds(records: list[dict], window: tuple[int, int] | None = None) -> float:
    """Seconds covered by stack samples (all phases) in ``window``."""
    total = 0.0
    for rec in records:
        if rec.get("k") == "stacks" and (window is None or window[0] <= rec["t"] <= window[1] + FLUSH_SLACK_NS):
            total += rec["n"] / (rec.get("hz") or 100.0)
    return total
