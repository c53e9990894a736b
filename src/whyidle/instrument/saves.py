"""Where a checkpoint went: its path, its size and the file system it was written to.

A ``checkpoint`` region (:mod:`whyidle.instrument.regions`) that ends adds these to its record, so
the analysis can tell a save that is slow because it is large or frequent from one that is slow
because of where it is written (a network or FUSE mount: every byte crosses a network before the
call returns). Read after the save returned: one ``stat`` for a file, a bounded listing for a
folder (``save_pretrained``), and the mount table once per process. Standard library only.
"""

from __future__ import annotations

import os
import time

#: Keyword arguments naming the destination in the wrapped savers (``torch.save(obj, f)``,
#: safetensors ``save_file(tensors, filename)``, ``save_pretrained(save_directory)``,
#: Lightning ``save_checkpoint(filepath)``, Keras ``save(filepath)``).
DEST_KWARGS = ("f", "filename", "filepath", "save_directory", "path", "file_path")

#: Folder entries listed at most to size a saved folder.
MAX_FOLDER_ENTRIES = 2000

_mounts: list | None = None


def destination(args: tuple, kwargs: dict):
    """The path (``str``) or file object a saver call writes to, or None: the first destination
    keyword, else the first positional argument that is a path or a file object with a name.
    Errors: none raised."""
    try:
        for key in DEST_KWARGS:
            if key in kwargs:
                return kwargs[key]
        for a in args:
            if isinstance(a, (str, os.PathLike)) or (hasattr(a, "write") and isinstance(getattr(a, "name", None), str)):
                return a
    except Exception:  # a property that raises: never in the program's way
        pass
    return None


def _size(path: str, since_s: float) -> int | None:
    """Bytes of a saved file, or of the regular files in a saved folder written since ``since_s``
    (epoch seconds; one level of subfolders, at most ``MAX_FOLDER_ENTRIES`` entries)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    if not os.path.isdir(path):
        return None
    total, seen = 0, 0
    stack = [(path, 0)]
    while stack and seen < MAX_FOLDER_ENTRIES:
        folder, depth = stack.pop()
        with os.scandir(folder) as it:
            for e in it:
                seen += 1
                if seen > MAX_FOLDER_ENTRIES:
                    break
                if e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    if st.st_mtime >= since_s:
                        total += st.st_size
                elif e.is_dir(follow_symlinks=False) and depth < 1:
                    stack.append((e.path, depth + 1))
    return total


def describe(dest, duration_ns: int) -> dict:
    """``{"path", "bytes", "fs"}`` of a finished save to ``dest`` (see :func:`destination`) that
    took ``duration_ns``: the absolute path, its size (None when unreadable), the file system type
    of its mount (``/proc/self/mountinfo``; None when unknown). Empty for an in-memory buffer.

    Errors: none raised (an unreadable destination gives what could be read).
    """
    global _mounts
    name = dest if isinstance(dest, (str, os.PathLike)) else getattr(dest, "name", None)
    if not isinstance(name, (str, os.PathLike)):
        return {}
    try:
        path = os.path.abspath(os.fspath(name))
    except (TypeError, ValueError):
        return {}
    out: dict = {"path": path, "bytes": None, "fs": None}
    try:
        out["bytes"] = _size(path, time.time() - duration_ns / 1e9 - 1.0)
        if out["bytes"] is not None and not isinstance(dest, (str, os.PathLike)) and hasattr(dest, "tell"):
            out["bytes"] = max(out["bytes"], dest.tell())  # an open file not flushed yet
    except (OSError, ValueError):
        pass
    try:
        from whyidle import mounts

        if _mounts is None:
            _mounts = mounts.read_mounts()
        mount = mounts.find_mount(os.path.realpath(path), _mounts)
        out["fs"] = mount["fstype"] if mount else None
    except Exception:
        pass
    return out
