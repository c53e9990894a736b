"""The file system holding a dataset (``whyidle env --data PATH``).

Small-file datasets (one image or clip per file) read fine from a local disk but starve the GPU on a
network or FUSE file system, where every file costs at least one round trip before its first byte.
This module finds the mount holding a path and classifies its file system type (both by
:mod:`whyidle.mounts`, re-exported here), and counts the files under it with a bounded scan. Pure
reading; the verdict is in :mod:`whyidle.diagnose.rules_env`.
"""

from __future__ import annotations

import os
import stat
import time

from whyidle.mounts import LOCAL_FS, NETWORK_FS, PARALLEL_FS, find_mount, parse_mountinfo, read_mounts  # noqa: F401
from whyidle.mounts import classify_fs as classify

#: Files the scan looks at before it stops (a sample is enough to tell the mean file size).
MAX_SCAN_FILES = 20_000

#: Seconds the scan may take before it stops: on a network file system each directory entry can
#: cost a round trip, and ``whyidle env`` should answer in seconds.
MAX_SCAN_S = 2.0

#: Mean file size below which a dataset counts as "small files": on a network or FUSE file system a
#: file costs at least one open/stat round trip (≈0.5–5 ms on NFS/SMB, tens of ms on object-store
#: FUSE mounts such as s3fs or gcsfuse) while 1 MiB streams in about 1 ms at 1 GB/s, so below this
#: the per-file latency, not the bandwidth, sets the read rate.
SMALL_FILE_MEAN_BYTES = 1 << 20

#: Fewer files than this are not a small-file dataset: they stay in the page cache after the first
#: epoch and their summed latency is seconds at most.
SMALL_FILE_MIN_COUNT = 1000


class DataPathError(ValueError):
    """The ``--data`` path does not exist or cannot be examined (message is one line)."""


def scan(path: str, max_files: int = MAX_SCAN_FILES, max_s: float = MAX_SCAN_S) -> dict:
    """Counts regular files (symlinks followed) and their bytes under ``path``, breadth first.

    Stops after ``max_files`` files or ``max_s`` seconds. Returns ``{files, total_bytes,
    mean_file_bytes (None without files), truncated (bool: stopped early, so counts are a sample),
    stopped_by ("files", "time" or None), scan_s, unreadable (entries that could not be read)}``.
    """
    t0 = time.monotonic()
    files = total = unreadable = 0
    stopped_by = None
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        files, total = 1, st.st_size
    else:
        queue = [path]
        while queue and stopped_by is None:
            folder = queue.pop(0)
            try:
                it = os.scandir(folder)
            except OSError:
                unreadable += 1
                continue
            with it:
                for entry in it:
                    if files >= max_files or time.monotonic() - t0 > max_s:
                        stopped_by = "files" if files >= max_files else "time"
                        break
                    try:
                        if entry.is_dir():
                            queue.append(entry.path)
                        elif entry.is_file():
                            total += entry.stat().st_size
                            files += 1
                    except OSError:
                        unreadable += 1
    return {"files": files, "total_bytes": total, "mean_file_bytes": round(total / files) if files else None,
            "truncated": stopped_by is not None, "stopped_by": stopped_by, "scan_s": round(time.monotonic() - t0, 3), "unreadable": unreadable}


def resolve(path: str) -> str:
    """The real path of ``path`` (``~`` expanded, symlinks resolved).

    Raises:
        DataPathError: ``path`` does not exist or is not readable.
    """
    real = os.path.realpath(os.path.expanduser(path))
    if not os.path.exists(real):
        raise DataPathError(f"data path not found: {path}")
    if not os.access(real, os.R_OK):
        raise DataPathError(f"data path not readable: {path}")
    return real


def describe(path: str, mounts: list[dict] | None = None, max_files: int = MAX_SCAN_FILES,
             max_s: float = MAX_SCAN_S) -> dict:
    """Where a dataset lives and what it is made of.

    Args:
        path: a dataset folder or file.
        mounts: the mount table (default: :func:`read_mounts`), for tests.
        max_files, max_s: bounds of the file scan (see :func:`scan`).

    Returns:
        ``{path, realpath, mount_point, fstype, source, kind (see :func:`classify`), files,
        total_bytes, mean_file_bytes, truncated, scan_s, unreadable, small_files}``; ``small_files``
        is True when at least :data:`SMALL_FILE_MIN_COUNT` files were seen (or the scan stopped
        early) and their mean size is below :data:`SMALL_FILE_MEAN_BYTES`.

    Raises:
        DataPathError: ``path`` does not exist or is not readable.
    """
    real = resolve(path)
    mount = find_mount(real, read_mounts() if mounts is None else mounts) or {}
    counts = scan(real, max_files=max_files, max_s=max_s)
    mean = counts["mean_file_bytes"]
    many = counts["files"] >= SMALL_FILE_MIN_COUNT or (counts["truncated"] and counts["files"] > 0)
    return {"path": path, "realpath": real, "mount_point": mount.get("mount_point"), "fstype": mount.get("fstype"),
            "source": mount.get("source"), "kind": classify(mount.get("fstype")), **counts,
            "small_files": bool(many and mean is not None and mean < SMALL_FILE_MEAN_BYTES)}
