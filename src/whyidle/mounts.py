"""The file system a path lives on: the mount table and what kind of file system each type is.

Read by ``whyidle env --data`` (:mod:`whyidle.env.fs`), by the checkpoint instrument inside the
observed program (:mod:`whyidle.instrument.saves`, each save's file system) and by the analysis
(:mod:`whyidle.analysis.accounting`, where the checkpoints went), so it sits below all three.
Standard library only (psutil as a fallback where ``/proc`` has no mount table).
"""

from __future__ import annotations

import re

#: Network file systems (a server answers every open/stat).
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "afs", "ncpfs", "coda"})

#: Parallel/cluster file systems: high bandwidth, but every file open goes to a metadata server.
PARALLEL_FS = frozenset({"lustre", "gpfs", "beegfs", "glusterfs", "wekafs", "orangefs", "pvfs2", "panfs",
                         "cvfs", "scalefs"})

#: Local file systems (block devices, memory, container layers).
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "overlay", "tmpfs", "ramfs", "f2fs",
                      "vfat", "exfat", "ntfs", "ntfs3", "jfs", "reiserfs", "bcachefs", "squashfs", "iso9660",
                      "devtmpfs", "erofs", "aufs"})


def classify_fs(fstype: str | None) -> str:
    """File system type → ``"network"``, ``"parallel"``, ``"fuse"``, ``"local"`` or ``"unknown"``.

    ``fuse``, ``fuse.*`` (sshfs, s3fs, gcsfuse, rclone, goofys, blobfuse, juicefs, ...),
    ``fuseblk`` and ``virtiofs`` (the FUSE protocol over virtio) are FUSE. The type is the
    mount's as ``/proc/self/mountinfo`` gives it (:func:`read_mounts`; the checkpoint instrument
    records it with each save).
    """
    t = (fstype or "").lower()
    if t in NETWORK_FS:
        return "network"
    if t in PARALLEL_FS:
        return "parallel"
    if t in ("fuse", "fuseblk", "virtiofs") or t.startswith("fuse."):
        return "fuse"
    if t in LOCAL_FS:
        return "local"
    return "unknown"


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo`` (proc_pid_mountinfo(5))."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[dict]:
    """Lines of ``/proc/self/mountinfo`` → ``[{mount_point, fstype, source}]`` in file order.

    Format (proc_pid_mountinfo(5)): ``id parent major:minor root mount_point options
    [optional fields...] - fstype source super_options``.
    """
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or not rf:
            continue
        mounts.append({"mount_point": _unescape(lf[4]), "fstype": rf[0],
                       "source": _unescape(rf[1]) if len(rf) > 1 else None})
    return mounts


def read_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[dict]:
    """The mounts this process sees: ``/proc/self/mountinfo``, else ``psutil.disk_partitions(all=True)``."""
    try:
        with open(mountinfo) as fh:
            return parse_mountinfo(fh.read())
    except OSError:
        import psutil

        return [{"mount_point": p.mountpoint, "fstype": p.fstype, "source": p.device}
                for p in psutil.disk_partitions(all=True)]


def find_mount(path: str, mounts: list[dict]) -> dict | None:
    """The mount holding the absolute ``path``: the longest mount point that is ``path`` or a
    folder above it; of several mounts on one point, the last (it hides the earlier ones)."""
    best: dict | None = None
    for m in mounts:
        mp = m["mount_point"]
        if path == mp or mp == "/" or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best["mount_point"]):
                best = m
    return best
