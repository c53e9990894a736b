"""The CPU and memory a process may use: its affinity mask and its cgroup's CPU quota, memory limit
and CPU throttling counters (cgroup v2, else v1).

One place for ``whyidle env`` (:mod:`whyidle.env.probe`), the host sampler, which records them per
process of the observed job (:mod:`whyidle.sampling.host`), and the analysis
(:func:`usable_cores`). Only reads; never raises.

* Affinity: ``os.sched_getaffinity`` (a cpuset cgroup, ``taskset``, Slurm's binding all show here).
* CPU quota, in CPUs: cgroup v2 ``cpu.max`` (``"<quota> <period>"``, ``max`` = none), v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = none); the smallest along the path from the
  process's cgroup to the root, as the kernel enforces each level (Documentation/scheduler/sched-bwc.rst).
* Memory limit, bytes: v2 ``memory.max``, v1 ``memory.limit_in_bytes``; the smallest along the path.
* Throttling, from the ``cpu.stat`` of the cgroup whose quota binds: ``nr_periods`` (enforcement
  periods in which the cgroup ran), ``nr_throttled`` (periods it used up its quota and was stopped
  until the next one), ``throttled_usec`` (v2) / ``throttled_time`` (v1, ns): time its run queues
  spent throttled, summed over the CPUs.

The paths in ``/proc/<pid>/cgroup`` are those of the cgroup namespace the reader is in; in a
container without its own namespace the recorded path may not exist in the container's view of
``/sys/fs/cgroup``: the walk up still reaches its root, which is the container's own cgroup.
"""

from __future__ import annotations

import os

#: Where the cgroup file systems are mounted (v2: the unified hierarchy; v1: one folder per controller).
CGROUP_ROOT = "/sys/fs/cgroup"

#: cgroup v1 writes a number near 2**63 for "no memory limit".
_V1_UNLIMITED = 1 << 60


def read_text(path: str) -> str | None:
    """The stripped text of a small file (sysfs, cgroupfs), or None when it cannot be read."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _cgroup_dirs(root: str, cgroup_text: str, v1_controller: str | None = None) -> list[str]:
    """The process's cgroup folder and its ancestors (nearest first): cgroup v2 (``0::/path``
    in ``/proc/<pid>/cgroup``, under ``root``) or, with ``v1_controller``, that v1 hierarchy
    (``N:cpu,cpuacct:/path``, under ``root/<controllers>``)."""
    base = rel = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if v1_controller is None and parts[0] == "0" and parts[1] == "":
            base, rel = root, parts[2]
        elif v1_controller is not None and v1_controller in parts[1].split(","):
            base = os.path.join(root, parts[1])
            if not os.path.isdir(base):
                base = os.path.join(root, v1_controller)
            rel = parts[2]
    if base is None or rel is None:
        return []
    dirs = []
    path = os.path.normpath(os.path.join(base, rel.strip().lstrip("/")))
    while True:
        dirs.append(path)
        if path == base or not path.startswith(base + os.sep):
            break
        path = os.path.dirname(path)
    return dirs


def _cpu_quotas(root: str, cgroup_text: str) -> list[tuple[float, str]]:
    """``(CPUs, folder)`` of every CPU quota along the path: v2, else v1."""
    quotas = []
    for d in _cgroup_dirs(root, cgroup_text):
        parts = (read_text(os.path.join(d, "cpu.max")) or "").split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quotas.append((int(parts[0]) / int(parts[1]), d))
            except (ValueError, ZeroDivisionError):
                pass
    if not quotas:
        for d in _cgroup_dirs(root, cgroup_text, "cpu"):
            try:
                q = int(read_text(os.path.join(d, "cpu.cfs_quota_us")) or -1)
                if q > 0:
                    quotas.append((q / int(read_text(os.path.join(d, "cpu.cfs_period_us")) or 0), d))
            except (ValueError, ZeroDivisionError):
                pass
    return quotas


def cgroup_limits(cgroup_text: str, root: str = CGROUP_ROOT) -> dict:
    """The limits of the cgroup a process is in.

    Args:
        cgroup_text: the content of ``/proc/<pid>/cgroup``.
        root: where the cgroup file systems are mounted (a folder of test files in tests).
    Returns:
        ``{"cpu_quota": CPUs per second (float, 2 decimals) or None (no quota),
        "cpu_quota_cgroup": the folder whose quota binds (its ``cpu.stat`` counts the throttling)
        or None, "mem_limit_bytes": int or None (no limit)}``: each the smallest along the path.
    """
    quotas = _cpu_quotas(root, cgroup_text)
    quota, where = min(quotas) if quotas else (None, None)
    limits = []
    for d in _cgroup_dirs(root, cgroup_text):
        v = read_text(os.path.join(d, "memory.max"))
        if v and v.isdigit():
            limits.append(int(v))
    if not limits:
        for d in _cgroup_dirs(root, cgroup_text, "memory"):
            v = read_text(os.path.join(d, "memory.limit_in_bytes"))
            if v and v.isdigit() and int(v) < _V1_UNLIMITED:
                limits.append(int(v))
    return {"cpu_quota": round(quota, 2) if quota is not None else None, "cpu_quota_cgroup": where,
            "mem_limit_bytes": min(limits) if limits else None}


def cgroup_cpu_quota(root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs per second the cgroup of the process whose ``/proc/<pid>/cgroup`` is ``proc_cgroup``
    may use (:func:`cgroup_limits`); ``None`` when there is no quota or no cgroup file."""
    return cgroup_limits(read_text(proc_cgroup) or "", root)["cpu_quota"]


def cgroup_memory_limit(root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """Bytes that cgroup may use (:func:`cgroup_limits`); ``None`` when unlimited or unknown."""
    return cgroup_limits(read_text(proc_cgroup) or "", root)["mem_limit_bytes"]


def cpu_throttling(folder: str) -> list | None:
    """``[nr_periods, nr_throttled, throttled_s]`` from ``folder/cpu.stat`` (cumulative since the
    cgroup was made; ``throttled_s`` in seconds, summed over CPUs), None when unreadable or
    without those fields."""
    stat = {}
    for line in (read_text(os.path.join(folder, "cpu.stat")) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            stat[parts[0]] = int(parts[1])
    if "nr_periods" not in stat or "nr_throttled" not in stat:
        return None
    if "throttled_usec" in stat:
        seconds = stat["throttled_usec"] / 1e6
    else:
        seconds = stat.get("throttled_time", 0) / 1e9
    return [stat["nr_periods"], stat["nr_throttled"], round(seconds, 6)]


def affinity(pid: int = 0) -> int | None:
    """Number of CPUs ``pid`` (0: this process) may run on (``sched_getaffinity``), None where
    unknown (not Linux, the process is gone)."""
    try:
        return len(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def process_limits(pid: int | None = None, root: str = CGROUP_ROOT) -> dict:
    """:func:`cgroup_limits` of ``pid`` (None: this process) with ``cpu_affinity`` (:func:`affinity`)."""
    text = read_text(f"/proc/{'self' if pid is None else pid}/cgroup") or ""
    return {"cpu_affinity": affinity(pid or 0), **cgroup_limits(text, root)}


def own_usable_cores() -> float:
    """:func:`usable_cores` of this process (the machine's logical CPUs, its affinity, its cgroup
    quota); at least 1."""
    own = process_limits()
    return usable_cores(os.cpu_count(), own["cpu_affinity"], own["cpu_quota"])[0] or 1


def usable_cores(logical: int | None, cpu_affinity: int | None, cpu_quota: float | None) -> tuple[float | None, str | None]:
    """Cores a process may use: the smallest of the machine's logical CPUs, its affinity mask and
    its cgroup CPU quota (a quota of 1.5 CPUs is 1.5 cores of time per second).

    Returns:
        ``(cores, limited_by)``: cores as a number (None when all three are unknown) and what
        limits them below the machine: ``"affinity"``, ``"cgroup quota"``, ``"affinity and
        cgroup quota"`` (both at the same value), or None (the machine's cores).
    """
    known = [c for c in (logical, cpu_affinity, cpu_quota) if c]
    if not known:
        return None, None
    cores = min(known)
    why = [name for name, c in (("affinity", cpu_affinity), ("cgroup quota", cpu_quota))
           if c and c == cores and (not logical or c < logical)]
    return cores, " and ".join(why) or None
