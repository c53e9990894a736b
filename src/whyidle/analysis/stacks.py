"""Stack samples → hotspots: which source lines hold a phase of the step (pure).

Each ``stacks`` record holds sites ``[phase, user_site, leaf_site, count, ms]``: ``count``
samples standing for ``ms`` milliseconds of wall time (older records without ``ms``: ``count /
hz`` seconds). When the measured seconds of each phase are known (from the step hooks), sampled
time is rescaled to them per phase, so the split *within* a phase comes from the samples and the
phase totals stay exact. Hotspots are grouped by the user's function (file + function name): a
Python loop spreads its samples over several lines of one function. Sites are
``"file:line function"`` strings.

Under a training framework (Lightning's ``trainer.fit(...)``, the HF ``trainer.train()``) the
innermost user frame of the framework's own work is the line that called the framework: such
*entry sites* (from the ``api`` records, :mod:`whyidle.analysis.api`) are not the user's code. Their
samples form ``framework`` hotspots, one per package of the innermost frame (``lightning``: the loop
itself, ``tqdm`` / ``rich``: its progress bar, ``torch``: what it calls in PyTorch), and they never
count as a caller for :func:`focus`.
"""

from __future__ import annotations

import linecache
import os

from whyidle.record import cells

#: Library modules (a sample's innermost frame) that are logging / output / formatting / progress
#: code: time there is logging work, whoever called it.
OUTPUT_MODULES = ("logging/", "tqdm/", "rich/", "wandb/", "tensorboard/", "torch/utils/tensorboard/",
                  "tensorboardX/", "json/", "csv.py", "pprint.py", "_pyio.py", "codecs.py", "string.py",
                  "lightning/pytorch/callbacks/progress", "lightning/pytorch/loggers", "pytorch_lightning/loggers",
                  "pytorch_lightning/callbacks/progress", "transformers/trainer_callback.py",
                  "transformers/integrations/", "mlflow/", "comet_ml/")

#: Lines of one hotspot's function listed in its ``lines`` (the most-sampled first).
LINES_PER_HOTSPOT = 3

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
    working directory) for relative paths; None when the file is not readable here. A notebook
    cell's site (``"train.ipynb cell 5:28 f"``) reads the cell's text recorded in the run
    (:func:`whyidle.record.cells.cell_line`), never a file."""
    path, line, _func = split_site(site)
    if line is None or path.startswith("<"):
        return None
    cell = cells.cell_line(path, line, root)
    if cell is not None:
        return cell[:200] or None
    if not os.path.isabs(path):
        if root is None:
            return None
        path = os.path.join(root, path)
    text = linecache.getline(path, line).strip()
    return text[:200] or None


def sampled_sites(records: list[dict], phases: set[str], window: tuple[int, int] | None,
           entry_sites: frozenset = frozenset()):
    """Yields ``(phase, user_site, leaf_site, count, seconds, callers)`` of the sampled sites in
    ``phases`` whose record was flushed inside ``window`` (plus :data:`FLUSH_SLACK_NS`). Entry sites
    are taken out of ``callers``; a sample whose user site is one keeps it (see the module
    docstring)."""
    for rec in records:
        if rec.get("k") != "stacks":
            continue
        if window is not None and not (window[0] <= rec["t"] <= window[1] + FLUSH_SLACK_NS):
            continue
        hz = rec.get("hz") or 100.0
        for site in rec["sites"]:
            if site[0] in phases:
                seconds = site[4] / 1000.0 if len(site) > 4 else site[3] / hz
                callers = site[5] if len(site) > 5 else []
                if entry_sites and callers:
                    callers = [c for c in callers if c not in entry_sites]
                yield site[0], site[1], site[2], site[3], seconds, callers


#: Innermost frames of a DataLoader batch crossing from a worker to the training process: reading
#: the pickled batch, unpickling it (``multiprocessing/queues.py`` ``get`` calls the C unpickler:
#: a batch of Python lists is rebuilt element by element there), fetching each tensor's
#: shared-memory file descriptor from the worker's resource sharer, rebuilding the storages
#: (PyTorch's ``file_descriptor`` sharing strategy). Waiting for a batch runs in ``selectors.py``.
IPC_LEAVES = ("multiprocessing/connection.py", "multiprocessing/queues.py", "multiprocessing/reduction.py",
              "multiprocessing/resource_sharer.py", "torch/multiprocessing/reductions.py", "torch/_utils.py",
              "torch/storage.py")


#: Innermost frames of decoding images: what caching the decoded arrays once takes out of every
#: batch (PIL's whole-image work counts: decoding, colour conversion, resizing).
DECODE_LEAVES = ("PIL/", "imageio/", "cv2", "torchvision/io/", "turbojpeg", "simplejpeg")


#: Innermost frames of reading and decoding an encoded image (PIL's decoder loop and format
#: plugins, torchvision's and the JPEG libraries' decoders): not resizing or colour work.
IMAGE_READ_LEAVES = ("PIL/ImageFile.py", "PIL/JpegImagePlugin.py", "PIL/PngImagePlugin.py", "PIL/WebPImagePlugin.py",
                     "torchvision/io/", "turbojpeg", "simplejpeg", "imageio/")

#: Innermost frames of torchdata's ``StatefulDataLoader`` bookkeeping in the training process:
#: applying the workers' state deltas and rebuilding their nested state at every snapshot.
SNAPSHOT_LEAVES = ("torchdata/stateful_dataloader/",)


#: What the training thread does in a multi-worker DataLoader's data wait, by its innermost frame
#: (first match wins): waiting for a batch (``selectors.py`` under the data queue's poll, or
#: ``threading.py`` under the pin-memory thread's queue), receiving one (:data:`IPC_LEAVES`),
#: torchdata's snapshots (:data:`SNAPSHOT_LEAVES`), the iterator's own Python
#: (``torch/utils/data/``); the rest is ``other`` (the program's code, e.g. a sampler).
WAIT_GROUPS = (("receiving", IPC_LEAVES), ("waiting", ("selectors.py", "threading.py", "/queue.py")),
               ("snapshot", SNAPSHOT_LEAVES), ("loader", ("torch/utils/data/",)))


def leaf_split(records: list[dict], phase: str, groups=WAIT_GROUPS, window: tuple[int, int] | None = None
               ) -> dict | None:
    """The fraction (0–1) of ``phase``'s sampled time in each group of innermost frames (``groups``:
    ``(name, path fragments)`` pairs, first match wins), plus ``other``: ``{name: share}`` summing
    to 1; None without samples in ``phase``."""
    seconds = {name: 0.0 for name, _ in groups}
    seconds["other"] = 0.0
    for _phase, _user, leaf, _count, secs, _callers in sampled_sites(records, {phase}, window):
        name = next((n for n, parts in groups if leaf and any(p in leaf for p in parts)), "other")
        seconds[name] += secs
    total = sum(seconds.values())
    return {name: s / total for name, s in seconds.items()} if total > 0 else None


def function_leaf_share(records: list[dict], phase: str, leaves: tuple[str, ...],
                        window: tuple[int, int] | None = None) -> float | None:
    """The fraction (0–1) of ``phase``'s sampled time inside the program's functions that mostly
    (half their time or more) run ``leaves``: the whole of such a function counts, its own lines
    around the library call too (a ``decode(data)`` that opens the bytes with PIL and copies the
    pixels with ``np.asarray``: the copy runs under the function's own line). Time whose innermost
    user frame is not known counts by its leaf. None without samples in ``phase``."""
    by_func: dict[tuple, list[float]] = {}
    total = 0.0
    for _phase, user, leaf, _count, seconds, _callers in sampled_sites(records, {phase}, window):
        total += seconds
        path, _line, func = split_site(user) if user else (leaf, None, "")
        acc = by_func.setdefault((path, func), [0.0, 0.0])
        acc[0] += seconds
        if leaf and any(p in leaf for p in leaves):
            acc[1] += seconds
    if total <= 0:
        return None
    return sum(s for s, hit in by_func.values() if hit >= 0.5 * s) / total


def leaf_share(records: list[dict], phase: str, leaves: tuple[str, ...], window: tuple[int, int] | None = None
               ) -> float | None:
    """The fraction (0–1) of ``phase``'s sampled time whose innermost frame's path contains one of
    ``leaves`` (e.g. :data:`IPC_LEAVES` in ``"data"``: the data wait spent receiving batches from
    the workers rather than waiting for them), or None without samples in ``phase``."""
    total = hit = 0.0
    for _phase, _user, leaf, _count, seconds, _callers in sampled_sites(records, {phase}, window):
        total += seconds
        if leaf and any(p in leaf for p in leaves):
            hit += seconds
    return hit / total if total > 0 else None


def _top(seconds_by_key: dict | None):
    """The key holding the most seconds, or None for an empty or missing dict."""
    return max(seconds_by_key, key=seconds_by_key.get) if seconds_by_key else None


def _package(site: str | None) -> str:
    """What a library site is part of: ``"logging and progress"`` for :data:`OUTPUT_MODULES`, else
    its top-level package or module file (``"lightning"`` for ``"lightning/pytorch/loops/x.py:1 f"``,
    ``"csv.py"``)."""
    if not site:
        return "(unknown)"
    path = split_site(site)[0]
    if any(m in path for m in OUTPUT_MODULES):
        return "logging and progress"
    return path.split("/", 1)[0]


def hotspots(records: list[dict], phases: set[str], window: tuple[int, int] | None = None,
             total_s: float | None = None, limit: int = 5, source_root: str | None = None,
             phase_seconds: dict[str, float] | None = None, entry_sites: frozenset = frozenset()) -> list[dict]:
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
        entry_sites: user sites that called a training framework's entry point (see the module
            docstring); their samples are grouped by the innermost frame's package as
            ``framework`` hotspots.
    Returns:
        Busiest first: ``{"function", "site", "code", "seconds", "share", "samples", "leaf",
        "library": bool, "framework": bool}``; ``code`` is the source text of ``site`` (None if
        unreadable); ``site`` is the function's most-sampled line, ``leaf`` the most common innermost
        frame under it (e.g. a library call), ``library`` True when no frame of the user's code was
        on the stack (the time is inside a library called from elsewhere), ``framework`` True for
        the framework's own work (``function`` is then ``"<package> inside <entry site>"``, e.g.
        ``"tqdm inside train.py:80 main"``; ``library`` True); ``lines``: the function's
        most-sampled lines (at most :data:`LINES_PER_HOTSPOT`), each ``{site, seconds, share,
        leaf, code}`` as the function's own (a ``__getitem__`` whose decode line and augmentation
        line hold different parts of it).
    """
    groups: dict[tuple, dict] = {}
    sampled: dict[str, float] = {}
    # two passes over the records, not a list of their sites (a day's merged records hold millions)
    for phase, *_rest, seconds, _callers in sampled_sites(records, phases, window, entry_sites):
        sampled[phase] = sampled.get(phase, 0.0) + seconds
    scale = {p: (phase_seconds[p] / v if phase_seconds and phase_seconds.get(p) is not None and v > 0 else 1.0)
             for p, v in sampled.items()}
    n_phase = 0.0
    for phase, user, leaf, count, seconds, _callers in sampled_sites(records, phases, window, entry_sites):
        seconds *= scale[phase]
        n_phase += seconds
        framework = user in entry_sites
        site = user or leaf or "(unknown)"
        path, _line, func = split_site(site)
        key = ("", f"{_package(leaf)} inside {user}", True) if framework else (path, func, user is None)
        g = groups.setdefault(key, {"lines": {}, "leaves": {}, "seconds": 0.0, "samples": 0})
        g["seconds"] += seconds
        g["samples"] += count
        g["lines"][site] = g["lines"].get(site, 0) + seconds
        if leaf:
            g["leaves"][leaf] = g["leaves"].get(leaf, 0) + seconds
            by_leaf = g.setdefault("line_leaves", {}).setdefault(site, {})
            by_leaf[leaf] = by_leaf.get(leaf, 0) + seconds
    denom = total_s if total_s else n_phase
    out = []
    for (path, func, library), g in groups.items():
        framework = path == ""
        out.append({
            "function": func if framework else f"{os.path.basename(path)} {func}".strip(),
            "site": max(g["lines"], key=g["lines"].get),
            "seconds": g["seconds"],
            "share": g["seconds"] / denom if denom else None,
            "samples": g["samples"],
            "leaf": max(g["leaves"], key=g["leaves"].get) if g["leaves"] else None,
            "library": library,
            "framework": framework,
            "lines": [{"site": site, "seconds": s, "share": s / denom if denom else None,
                       "leaf": _top(g.get("line_leaves", {}).get(site))}
                      for site, s in sorted(g["lines"].items(), key=lambda kv: -kv[1])[:LINES_PER_HOTSPOT]],
        })
    out.sort(key=lambda h: -h["seconds"])
    out = out[:limit]
    for h in out:
        h["code"] = None if h["library"] else source_line(h["site"], source_root)
        for line in h["lines"]:
            line["code"] = None if h["library"] or h["framework"] else source_line(line["site"], source_root)
    return out


def _inside_count(key: tuple, candidates: list[tuple], nestings: dict[tuple, float]) -> int:
    """How many other ``candidates`` ``key`` sits inside: below them in the sampled chains
    (``nestings``: functions innermost first → seconds) for more time than above them."""
    count = 0
    for other in candidates:
        if other == key:
            continue
        below = above = 0.0
        for nest, seconds in nestings.items():
            if key in nest and other in nest:
                if nest.index(key) < nest.index(other):
                    below += seconds
                else:
                    above += seconds
        count += below > above
    return count


def focus(records: list[dict], phase: str, window: tuple[int, int] | None = None,
          phase_seconds: float | None = None, source_root: str | None = None,
          min_share: float = 0.5, entry_sites: frozenset = frozenset()) -> dict | None:
    """The most specific user function that holds most of a phase, counted inclusively.

    Every user function on a sample's stack (the innermost and its recorded callers) gets the
    sample's time once. The answer is the innermost function whose inclusive time is at least
    ``min_share`` of the phase's sampled time: for a tokenizer called from ``__getitem__`` it is
    the tokenizer's entry point rather than one of its many small helpers. Which of two candidates
    is inside the other is read from the sampled call chains (the one found below the other for
    more of their shared time), not from their inclusive times: a function called from two places
    (a metric from ``training_step`` and ``validation_step``) can hold more time than either
    caller. The answer is the candidate inside the most others; ties go to the least inclusive
    time. A function whose innermost frame is a framework entry site (``entry_sites``) is never a
    candidate: its time is the framework's.

    Returns ``{"function", "site", "code", "seconds", "share_of_phase", "samples", "callers"}``
    (seconds scaled to ``phase_seconds`` when given; ``samples``: the stack samples behind it;
    ``callers``: the names of the user functions it was most often called from, innermost first),
    or None without samples or when no function reaches ``min_share``.
    """
    inclusive: dict[tuple, float] = {}
    counts: dict[tuple, int] = {}
    depth: dict[tuple, list] = {}
    lines: dict[tuple, dict] = {}
    outer: dict[tuple, dict] = {}  # key -> {enclosing function names: seconds}
    nestings: dict[tuple, float] = {}  # the functions of a sample, innermost first -> seconds
    total = 0.0
    for _phase, user, _leaf, count, seconds, callers in sampled_sites(records, {phase}, window, entry_sites):
        total += seconds
        seen: dict[tuple, None] = {}
        chain = ([user] if user and user not in entry_sites else []) + list(callers)
        for level, s in enumerate(chain):
            path, _line, func = split_site(s)
            key = (path, func)
            if key in seen:
                continue
            seen[key] = None
            inclusive[key] = inclusive.get(key, 0.0) + seconds
            counts[key] = counts.get(key, 0) + count
            depth.setdefault(key, []).append(level)
            by_line = lines.setdefault(key, {})
            by_line[s] = by_line.get(s, 0.0) + seconds
            up = tuple(split_site(c)[2] for c in chain[level + 1:])
            outer.setdefault(key, {})[up] = outer.get(key, {}).get(up, 0.0) + seconds
        nest = tuple(seen)
        nestings[nest] = nestings.get(nest, 0.0) + seconds
    if total <= 0:
        return None
    candidates = [k for k, v in inclusive.items() if v >= min_share * total]
    if not candidates:
        return None
    best = min(candidates, key=lambda k: (-_inside_count(k, candidates, nestings), inclusive[k],
                                          sorted(depth[k])[len(depth[k]) // 2]))
    site = max(lines[best], key=lines[best].get)
    scale = (phase_seconds / total) if phase_seconds else 1.0
    callers = max(outer[best], key=outer[best].get) if outer.get(best) else ()
    return {"function": f"{os.path.basename(best[0])} {best[1]}".strip(), "site": site,
            "code": source_line(site, source_root), "seconds": inclusive[best] * scale,
            "share_of_phase": inclusive[best] / total, "samples": counts[best], "callers": list(callers)}
