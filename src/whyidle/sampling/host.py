"""Host sampler: CPU, memory, disk and scheduler counters of the machine and the observed tree.

Polled from the whyidle process (never the trainer), see :mod:`whyidle.sampling.loop`. Records
raw cumulative counters (``docs/run-format.md``, ``host.jsonl``); rates are derived later for any
window by :mod:`whyidle.analysis.host`. Uses psutil for everything psutil offers; reads
``/proc/<pid>/task/*/schedstat`` (run-queue wait) and ``/proc/pressure/*`` (PSI) directly, since
psutil has neither (kernel Documentation/scheduler/sched-stats.rst, accounting/psi.rst). The CPU
and memory limits of each process of the tree (affinity, cgroup quota and memory limit) and the
throttling of the cgroups whose quota binds come from :mod:`whyidle.sampling.limits`.
"""

from __future__ import annotations

import os
import platform

import psutil

from whyidle.cmdline import program_and_script
from whyidle.redact import redact_argv
from whyidle.sampling import limits

#: Seconds between scans of all other processes for the top CPU users (a full process scan costs
#: milliseconds, so it runs far less often than the tick; ../shared/sampling.md §4.1).
TOP_SCAN_PERIOD_S = 2.0
#: Seconds between two full searches of the observed tree for new processes. psutil finds a
#: process's descendants by reading every process's ``/proc/<pid>/stat`` on the machine (2.8 ms of
#: CPU per search with 66 processes on a 2-core VM: at every 0.25 s tick, 1.1 % of a core, taken
#: from a distributed job whose ranks fill the cores). At the other ticks the children of each
#: known process's main thread (``/proc/<pid>/task/<pid>/children``, one read per process, where
#: the kernel has it) are added: DataLoader workers and ranks are started from there, and a short
#: job's workers, alive for less than a second, are not missed. That file may skip a child while
#: another exits (proc_tid_children(5)); the full search catches it. Processes never leave the
#: tree but by exiting: whyidle is a child subreaper, so orphans are re-parented to it.
TREE_SCAN_PERIOD_S = 1.0
TOP_PROCESSES = 5
#: A process niced at least this much above the job yields its core whenever the job wants it:
#: Linux CFS weights nice +15 at 36 against 1024 for nice 0 (kernel/sched/core.c,
#: sched_prio_to_weight), 3.4 % of a contended core. Its CPU is the cores' spare time, not a
#: competitor's (a ``nice -n 19`` backup, a BOINC client, a low-priority test suite).
YIELDING_NICE_GAP = 15


def _schedstat_run_delay(pid: int) -> tuple[int | None, int | None]:
    """(run-queue wait of all threads, of the main thread) in ns, from schedstat field 2."""
    total = 0
    main = None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None, None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            delay = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        total += delay
        if tid == str(pid):
            main = delay
    return total, main


#: ``/proc/<pid>/stat`` can be read for the tree's rows (Linux); elsewhere psutil reads them.
_PROC_STAT = os.path.exists("/proc/self/stat")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_row(pid: int) -> list | None:
    """One ``procs`` row (docs/run-format.md) read from ``/proc/<pid>/{stat,status,io,task}``.

    The same kernel counters psutil reads (``cpu_times``: stat fields 14–17 in clock ticks;
    ``memory_info().rss``: field 24 in pages; ``num_threads``: field 20; ``num_ctx_switches``:
    status ``voluntary_ctxt_switches``/``nonvoluntary_ctxt_switches``; ``io_counters``: io
    ``read_bytes``/``rchar``), in three reads instead of psutil's per-call bookkeeping (70 µs
    against 270 µs per process per tick on a 2-core VM: a node's ranks and their DataLoader
    workers are polled four times a second). Returns None once the process is gone; ``io``
    fields are None where the file cannot be read (another user's process).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except (OSError, IndexError):
        return None
    try:
        ppid, threads = int(fields[1]), int(fields[17])
        cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK
        children = (int(fields[13]) + int(fields[14])) / _CLK_TCK
        rss = int(fields[21]) * _PAGE
        vol = int(status.split(b"\nvoluntary_ctxt_switches:", 1)[1].split(None, 1)[0])
        invol = int(status.split(b"\nnonvoluntary_ctxt_switches:", 1)[1].split(None, 1)[0])
    except (IndexError, ValueError):
        return None
    read_bytes = read_chars = None
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            io = f.read()
        read_chars = int(io.split(b"rchar:", 1)[1].split(None, 1)[0])
        read_bytes = int(io.split(b"\nread_bytes:", 1)[1].split(None, 1)[0])
    except (OSError, IndexError, ValueError):
        pass
    delay, main_delay = _schedstat_run_delay(pid)
    return [pid, ppid, round(cpu, 4), rss, threads, vol, invol, read_bytes, read_chars, delay, main_delay,
            round(children, 4)]


def _main_thread_children(pid: int) -> list[int]:
    """pids of the children that ``pid``'s main thread started (``/proc/<pid>/task/<pid>/children``,
    Linux ≥ 3.5 with ``CONFIG_PROC_CHILDREN``); empty when unreadable."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _psutil_row(p: psutil.Process) -> list | None:
    """One ``procs`` row through psutil (where ``/proc/<pid>/stat`` is not there); None once the
    process is gone."""
    try:
        with p.oneshot():
            ct = p.cpu_times()
            ppid = p.ppid()
            rss = p.memory_info().rss
            threads = p.num_threads()
            ctx = p.num_ctx_switches()
            try:
                io = p.io_counters()
                rb, rc = io.read_bytes, getattr(io, "read_chars", None)
            except (psutil.Error, AttributeError, NotImplementedError):
                rb = rc = None
    except psutil.Error:
        return None
    delay, main_delay = _schedstat_run_delay(p.pid)
    children = getattr(ct, "children_user", 0.0) + getattr(ct, "children_system", 0.0)
    return [p.pid, ppid, round(ct.user + ct.system, 4), rss, threads, ctx.voluntary, ctx.involuntary, rb, rc,
            delay, main_delay, round(children, 4)]


def _psi_some_total_us(resource: str) -> int | None:
    """Cumulative µs in which some task stalled on ``resource`` (``/proc/pressure``, Linux ≥ 4.20)."""
    try:
        with open(f"/proc/pressure/{resource}", "rb") as f:
            for line in f.read().decode().splitlines():
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def process_label(cmdline: list[str], name: str | None, uid: int | None, own_uid: int | None = None) -> str:
    """How a process outside the observed tree is named in ``host_top`` (and so in the
    ``cpu_contention`` finding): its program and script only
    (:func:`whyidle.cmdline.program_and_script`: ``python burn.py``, ``sshpass``) when it belongs
    to ``own_uid`` (default: whyidle's real user id), else only its program name (``name``, the
    kernel's ``comm``, else the last part of ``cmdline[0]``). No other argument of a process outside
    the job is kept, redacted or not: a secret passed as a bare argument (``sshpass -p SECRET``,
    ``mysql -pSECRET``) matches no redaction rule. Another user's script name is theirs too.

    Args:
        cmdline: the process's arguments.
        name: its program name (psutil ``name()``), None when unknown.
        uid: its real user id, None when unreadable (treated as another user's).
        own_uid: the user whose processes are named with their script (tests pass one).
    """
    if own_uid is None:
        own_uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and uid == own_uid:
        return program_and_script(cmdline, name)
    return name or (program_and_script(cmdline[:1]) if cmdline else "") or "?"


def cpu_model() -> str | None:
    """This machine's CPU model name (``/proc/cpuinfo`` "model name", else ``platform.processor()``),
    recorded at run time so a report rendered elsewhere names the machine that ran the job."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _command_of(proc: psutil.Process) -> str:
    """:func:`process_label` of a process, ``"?"`` once it is gone or unreadable."""
    try:
        with proc.oneshot():
            name = proc.name()
            try:
                uid = proc.uids().real
            except (psutil.Error, AttributeError):
                uid = None
            own = hasattr(os, "getuid") and uid == os.getuid()  # another user's arguments are not read
            return process_label(proc.cmdline() if own else [], name, uid)
    except psutil.Error:
        return "?"


class HostPoller:
    """Samples the host and the process tree under ``tree_root_pid`` (see the Poller protocol).

    Args:
        tree_root_pid: the process whose descendants form the observed tree (whyidle itself, a
            child subreaper, so orphaned descendants stay in the tree).
        period_s: seconds between polls.
    """

    name = "host"

    def __init__(self, tree_root_pid: int, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.root_pid = tree_root_pid
        self._root = psutil.Process(tree_root_pid)
        self._procs: dict[int, psutil.Process] = {}
        self._seen: set[int] = set()
        self._top_prev: dict[int, float] = {}
        try:
            self._job_nice = os.getpriority(os.PRIO_PROCESS, 0)  # the job inherits whyidle's
        except OSError:
            self._job_nice = 0
        self._top_t = None
        self._top_due = 0
        self._tree_due = 0
        self._limits: dict[int, dict] = {}  # pid → the limits last recorded for it
        self._cgroups: dict[str, dict] = {}  # /proc/<pid>/cgroup text → its limits, read again every tree search
        self._quota_dirs: set[str] = set()  # cgroups whose CPU quota binds a process of the tree
        self._recheck = False  # a full tree search ran: look at every process's limits again

    def start(self, now_ns: int) -> list[dict]:
        try:
            physical = psutil.cpu_count(logical=False)
        except Exception:
            physical = None
        try:
            affinity = len(os.sched_getaffinity(self.root_pid))
        except (AttributeError, OSError):
            affinity = None
        return [{
            "k": "host_static", "t": now_ns, "cpu_count": psutil.cpu_count() or 1,
            "cpu_model": cpu_model(), "cpu_affinity": affinity,
            "cpu_count_physical": physical, "mem_total_bytes": psutil.virtual_memory().total,
            "clk_tck": os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else None,
            "boot_time_s": psutil.boot_time(),
        }]

    def _tree(self, now_ns: int) -> list[psutil.Process]:
        """The root and its known descendants, searched in full for new ones every
        :data:`TREE_SCAN_PERIOD_S` and through the known processes' main-thread children at the
        other ticks (a process that exited is dropped by :meth:`poll`)."""
        if now_ns >= self._tree_due:
            self._tree_due = now_ns + int(TREE_SCAN_PERIOD_S * 1e9)
            self._recheck = True
            self._cgroups.clear()
            try:
                children = self._root.children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                cached = self._procs.get(child.pid)
                try:
                    if cached is None or cached.create_time() != child.create_time():
                        self._procs[child.pid] = child
                except psutil.Error:  # exited since the search
                    self._procs.pop(child.pid, None)
        elif _PROC_STAT:
            for pid in [self.root_pid, *self._procs]:
                for child in _main_thread_children(pid):
                    if child not in self._procs:
                        try:
                            self._procs[child] = psutil.Process(child)
                        except psutil.Error:
                            pass
        return [self._root, *self._procs.values()]

    def _limits_of(self, pid: int) -> dict | None:
        """The CPU and memory limits ``pid`` runs under (:func:`whyidle.sampling.limits.cgroup_limits`
        with ``cpu_affinity``); the cgroup's files are read once per tree search for all the
        processes in it. None once the process is exiting (a zombie's ``/proc/<pid>/cgroup`` is
        empty) or gone."""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                text = f.read()
        except OSError:
            return None
        if not text.strip():
            return None
        cg = self._cgroups.get(text)
        if cg is None:
            cg = self._cgroups[text] = limits.cgroup_limits(text)
        if cg["cpu_quota_cgroup"]:
            self._quota_dirs.add(cg["cpu_quota_cgroup"])
        return {"cpu_affinity": limits.affinity(pid), **cg}

    def poll(self, now_ns: int) -> list[dict]:
        out: list[dict] = []
        rows = []
        tree = self._tree(now_ns)
        recheck, self._recheck = self._recheck, False
        for p in tree:
            row = _proc_row(p.pid) if _PROC_STAT else _psutil_row(p)
            if row is None:
                self._procs.pop(p.pid, None)
                self._limits.pop(p.pid, None)
                continue
            if p.pid not in self._seen or recheck:
                # a launcher or the program itself may narrow the affinity or move the process to
                # another cgroup after it started (taskset, numactl, a wrapper writing cgroup.procs)
                lim = self._limits_of(p.pid)
                new = p.pid not in self._seen
                if new or (lim is not None and lim != self._limits.get(p.pid)):
                    try:
                        with p.oneshot():
                            name, cmdline = p.name(), redact_argv(p.cmdline())[:12]
                    except psutil.Error:
                        name, cmdline = None, []
                    # an exiting process is moved to the root cgroup and has no command line left:
                    # its limits did not change
                    if new or cmdline:
                        self._seen.add(p.pid)
                        self._limits[p.pid] = lim
                        out.append({"k": "host_proc", "t": now_ns, "pid": p.pid, "ppid": row[1], "name": name,
                                    "cmdline": cmdline, **(lim or {})})
            rows.append(row)
        cpu = psutil.cpu_times()
        percpu = psutil.cpu_times(percpu=True)
        try:
            disk = psutil.disk_io_counters()
            disk_read = disk.read_bytes if disk else None
        except Exception:
            disk_read = None
        out.append({
            "k": "host", "t": now_ns,
            "cpu": {k: round(v, 3) for k, v in cpu._asdict().items()},
            "percpu_busy_s": [round(sum(c) - c.idle - getattr(c, "iowait", 0.0), 3) for c in percpu],
            "ctx": psutil.cpu_stats().ctx_switches,
            "disk_read_bytes": disk_read,
            "mem_used_bytes": psutil.virtual_memory().used,
            "psi_cpu_us": _psi_some_total_us("cpu"),
            "psi_io_us": _psi_some_total_us("io"),
            "procs": rows,
        })
        throttle = [[d, *c] for d in sorted(self._quota_dirs) if (c := limits.cpu_throttling(d))]
        if throttle:
            out[-1]["cpu_throttle"] = throttle
        if now_ns >= self._top_due:
            self._top_due = now_ns + int(TOP_SCAN_PERIOD_S * 1e9)
            top = self._scan_top({r[0] for r in rows}, now_ns)
            if top is not None:
                out.append(top)
        return out

    def _scan_top(self, exclude: set[int], now_ns: int) -> dict | None:
        """Top CPU users outside the observed tree since the previous scan, and the CPU seconds
        all of them used (processes alive at both scans; kernel threads included); those niced
        ``YIELDING_NICE_GAP`` or more above the job apart (``yielding_*``)."""
        current: dict[int, float] = {}
        procs: dict[int, psutil.Process] = {}
        yielding: set[int] = set()
        for p in psutil.process_iter(["cpu_times", "nice"]):  # names only for the few reported
            if p.pid in exclude:
                continue
            ct = p.info.get("cpu_times")
            if ct is None:
                continue
            current[p.pid] = ct.user + ct.system
            procs[p.pid] = p
            if (p.info.get("nice") or 0) >= self._job_nice + YIELDING_NICE_GAP:
                yielding.add(p.pid)
        previous, t_prev = self._top_prev, self._top_t
        self._top_prev, self._top_t = current, now_ns
        if t_prev is None:
            return None
        deltas = sorted(((cpu - previous[pid], pid) for pid, cpu in current.items()
                         if pid in previous and cpu > previous[pid]), reverse=True)
        competing = [(d, pid) for d, pid in deltas if pid not in yielding]
        spare = [(d, pid) for d, pid in deltas if pid in yielding]
        names = {pid: _command_of(procs[pid]) for _d, pid in competing[:TOP_PROCESSES] + spare[:TOP_PROCESSES]}
        return {"k": "host_top", "t": now_ns, "t0": t_prev, "t1": now_ns,
                "total_cpu_s": round(sum(d for d, _pid in competing), 3),
                "procs": [[pid, names[pid], round(d, 3)] for d, pid in competing[:TOP_PROCESSES]],
                "yielding_cpu_s": round(sum(d for d, _pid in spare), 3),
                "yielding_procs": [[pid, names[pid], round(d, 3)] for d, pid in spare[:TOP_PROCESSES]]}

    def close(self) -> None:
        pass
