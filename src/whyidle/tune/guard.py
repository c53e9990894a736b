"""Which files under the working directory a trial wrote: ``whyidle tune`` re-runs the user's
command many times, and a program that saves checkpoints or results would overwrite its own.

Checkpoint writers are redirected inside each trial (:meth:`whyidle.instrument.overrides.Overrides.redirect`);
anything else the program writes is found here: the files are listed (path, size, modification
time) before the first trial and after each, and the tune result names the files a trial created
and, above all, those that existed before and a trial changed (the ones a user may need to
restore). Nothing is copied or moved.
"""

from __future__ import annotations

import os

#: Files listed at most (a dataset folder under the working directory can hold millions).
MAX_FILES = 20_000
#: Folders never listed: whyidle's own runs, version control, caches.
SKIP_DIRS = {"whyidle-runs", ".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache"}


def snapshot(root: str, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """``relative path → (size in bytes, mtime in ns)`` of the regular files under ``root``
    (:data:`MAX_FILES` at most, breadth first; :data:`SKIP_DIRS` and the absolute paths in ``skip``
    left out). Never raises: an unreadable folder is left out."""
    out: dict[str, tuple[int, int]] = {}
    skip_abs = {os.path.abspath(p) for p in skip}
    queue = [os.path.abspath(root)]
    while queue and len(out) < MAX_FILES:
        folder = queue.pop(0)
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in SKIP_DIRS and os.path.abspath(e.path) not in skip_abs:
                        queue.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    out[os.path.relpath(e.path, root)] = (st.st_size, st.st_mtime_ns)
            except OSError:
                continue
            if len(out) >= MAX_FILES:
                break
    return out


def changed(before: dict, after: dict) -> tuple[list[str], list[str]]:
    """``(created, modified)``: paths new in ``after``, and paths of ``before`` whose size or
    modification time differ (two :func:`snapshot` results), each sorted."""
    created = sorted(p for p in after if p not in before)
    modified = sorted(p for p, v in after.items() if p in before and before[p] != v)
    return created, modified
