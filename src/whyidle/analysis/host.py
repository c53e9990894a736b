"""Host samples → CPU, scheduler, disk and memory metrics over a time window (pure).

Each ``host`` record holds cumulative counters (``docs/run-format.md``); a metric over a window is
the difference between the record at (or just before) the window start and the one at (or just
after) its end, divided by the elapsed time. Process roles come from the caller: the *trainer* is
the process that ran the training steps, *workers* are its descendants (DataLoader workers), the
rest of the observed tree is *tree other*, and *other processes* are everything else on the
machine (system busy time minus the tree and whyidle itself).

Units: ``*_cores`` are CPU-seconds per second (1.0 = one core fully busy); ``*_share`` fractions
0–1; ``*_per_s`` per second of wall time.
"""

from __future__ import annotations

from whyidle.analysis.facts import HostMetrics
from whyidle.sampling.limits import usable_cores

# Indexes into a ``procs`` row of a host record (docs/run-format.md).
PID, PPID, CPU_S, RSS, THREADS, CTX_VOL, CTX_INVOL, READ_BYTES, READ_CHARS, RUN_DELAY, MAIN_RUN_DELAY, CHILDREN_CPU = range(12)


def _bracket(records: list[dict], window: tuple[int, int] | None) -> tuple[dict, dict] | None:
    """The two host ticks a window's deltas are taken between.

    Ticks inside the window when there are at least two (so start-up work such as imports just
    before the first step does not leak in); otherwise the ticks just outside it.
    """
    ticks = [r for r in records if r.get("k") == "host"]
    if len(ticks) < 2:
        return None
    if window is None:
        return ticks[0], ticks[-1]
    t0, t1 = window
    inside = [r for r in ticks if t0 <= r["t"] <= t1]
    if len(inside) >= 2:
        return inside[0], inside[-1]
    before = [r for r in ticks if r["t"] <= t0]
    after = [r for r in ticks if r["t"] >= t1]
    a = before[-1] if before else ticks[0]
    b = after[0] if after else ticks[-1]
    if b["t"] <= a["t"]:
        return None
    return a, b


def descendants(parents: dict[int, int], roots: set[int]) -> set[int]:
    """All pids whose parent chain (``parents``: pid → ppid) reaches one of ``roots``."""
    out: set[int] = set()
    for pid in parents:
        seen = set()
        p = parents.get(pid)
        while p is not None and p not in seen:
            if p in roots:
                out.add(pid)
                break
            seen.add(p)
            p = parents.get(p)
    return out - roots


#: Command-line markers of multiprocessing's helper processes, which are descendants of the
#: trainer but not DataLoader workers.
_TRACKERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker")
_FORKSERVER = "multiprocessing.forkserver"


def _mp_helpers(records: list[dict], parents: dict[int, int], trainers: set[int]) -> set[int]:
    """pids of multiprocessing helpers: resource trackers, and forkservers (a forkserver is a
    direct child of the trainer; the workers it forks are its children and share its command
    line, so only the server itself is excluded)."""
    helpers = set()
    for rec in records:
        if rec.get("k") != "host_proc":
            continue
        cmd = " ".join(rec.get("cmdline") or [])
        if any(t in cmd for t in _TRACKERS) or (_FORKSERVER in cmd and parents.get(rec["pid"]) in trainers):
            helpers.add(rec["pid"])
    return helpers


def process_roles(records: list[dict], trainers) -> tuple[dict[int, int], set[int], set[int]]:
    """Who is who in the observed tree: ``(parents, workers, helpers)``.

    ``parents`` maps pid → the first parent seen (a process orphaned later is re-parented to
    whyidle, a subreaper, and a DataLoader worker whose trainer exited first must still count as
    that trainer's worker); ``workers`` are the trainers' descendants (DataLoader workers) less
    ``helpers``, multiprocessing's resource trackers and forkservers.
    """
    parents: dict[int, int] = {}
    for rec in records:
        if rec.get("k") in ("host", "host_proc"):
            for pid, ppid in ([(rec["pid"], rec["ppid"])] if rec["k"] == "host_proc"
                              else [(r[PID], r[PPID]) for r in rec["procs"]]):
                parents.setdefault(pid, ppid)
    helpers = _mp_helpers(records, parents, set(trainers))
    return parents, descendants(parents, set(trainers)) - helpers, helpers


def job_limits(records: list[dict], pids) -> dict:
    """The CPU and memory limits the job runs under: those last recorded (``host_proc``) for the
    first of ``pids`` that has them (the primary trainer first: its DataLoader workers inherit
    them), else whyidle's own affinity (``host_static``; older runs).

    Returns:
        ``{"cores": logical CPUs of the machine, "cores_usable": cores the job may use (float: a
        quota of 1.5 CPUs is 1.5), "cores_limit_by": "affinity" | "cgroup quota" | "affinity and
        cgroup quota" | None (the machine's cores), "cpu_affinity", "cpu_quota" (CPUs, None = no
        quota), "cpu_quota_cgroup", "mem_limit_bytes" (None = no limit below the machine's
        memory)}`` (:func:`whyidle.sampling.limits.usable_cores`).
    """
    static = next((r for r in records if r.get("k") == "host_static"), {})
    last: dict[int, dict] = {}
    for rec in records:
        if rec.get("k") == "host_proc" and "cpu_affinity" in rec:
            last[rec["pid"]] = rec
    rec = next((last[p] for p in pids if p in last), {})
    cores = static.get("cpu_count") or next((len(r.get("percpu_busy_s") or []) for r in records
                                             if r.get("k") == "host"), 0) or 1
    affinity = rec.get("cpu_affinity") if rec else static.get("cpu_affinity")
    usable, why = usable_cores(cores, affinity, rec.get("cpu_quota"))
    mem = rec.get("mem_limit_bytes")
    total = static.get("mem_total_bytes")
    return {"cores": cores, "cores_usable": usable, "cores_limit_by": why, "cpu_affinity": affinity,
            "cpu_quota": rec.get("cpu_quota"), "cpu_quota_cgroup": rec.get("cpu_quota_cgroup"),
            "mem_limit_bytes": mem if mem and not (total and mem >= total) else None}


def _throttling(span: list[dict], folder: str | None) -> tuple[float | None, float | None]:
    """(share of the quota's enforcement periods in which it ran out, seconds throttled) between
    the first and last ticks of ``span`` that sampled ``folder``'s ``cpu.stat``; Nones without."""
    rows = [row for rec in span for row in rec.get("cpu_throttle") or [] if folder and row[0] == folder]
    if len(rows) < 2 or rows[-1][1] <= rows[0][1]:
        return None, None
    return (rows[-1][2] - rows[0][2]) / (rows[-1][1] - rows[0][1]), max(0.0, rows[-1][3] - rows[0][3])


def host_metrics(records: list[dict], window: tuple[int, int] | None, trainers: set[int],
                 primary: int | None, whyidle_pid: int | None, samples_in_window: float | None = None,
                 loader_in_main: bool = True, num_workers: int | None = None) -> HostMetrics | None:
    """CPU, scheduler, I/O and memory metrics over ``window`` (monotonic ns) or the whole run.

    Args:
        records: ``host.jsonl`` records.
        window: [t0, t1] in monotonic ns, or None for the whole recording.
        trainers: pids of the processes that ran training steps; ``primary`` the main one.
        whyidle_pid: the whyidle process (its own CPU is reported apart, not as "other").
        samples_in_window: samples trained in the window, for bytes read per sample.
        loader_in_main: True when the primary loader runs in the trainer (``num_workers=0``);
            the loader processes for I/O per sample are then the trainer, else its workers.
        num_workers: the DataLoader's ``num_workers``; ``worker_busy_share`` divides by it
            (workers re-spawned every epoch would otherwise count several times).
    Returns:
        None when fewer than two host ticks exist; otherwise a dict with ``cores`` (the machine's
        logical CPUs), the limits of :func:`job_limits`: ``cores_usable``, ``cores_limit_by``,
        ``cpu_affinity`` (CPUs the job may run on, None when not recorded), ``cpu_quota``,
        ``mem_limit_bytes``; ``cpu_throttled_share`` (fraction of the cgroup quota's enforcement
        periods in the window in which the quota ran out and the job was stopped until the next
        period; None without a quota) and ``cpu_throttled_s`` (seconds its run queues spent
        throttled, summed over CPUs),
        ``cpu_busy_share``, ``percpu_busy_share`` (list; both count CPU time stolen by the hypervisor as busy:
        the guest cannot use it; ``cpu_busy_share`` leaves out the CPU of yielding processes, see
        ``yielding_procs_cores``), ``iowait_share``, ``steal_share`` (fraction of the machine's CPU
        time the hypervisor gave to other guests while this one's threads were ready: Linux
        ``/proc/stat`` steal; a process's own CPU time excludes it), ``trainer_cores``,
        ``workers`` (count alive at the window's end), ``workers_cores``, ``worker_busy_share`` (per
        worker, fraction of a core), ``tree_other_cores``, ``whyidle_cores``,
        ``other_procs_cores`` (measured by the scans of other processes when there are any;
        processes niced far below the job are left out: they yield their core whenever the job
        wants it), ``yielding_procs_cores`` (the CPU those used: the cores' spare time),
        ``trainer_run_delay_share`` (fraction of wall time the trainer's main thread was runnable
        but waiting for a CPU), ``workers_run_delay_share`` (the same, averaged over the workers), ``tree_run_delay_cores`` (thread-seconds waiting per second),
        ``invol_ctx_per_s``, ``disk_read_bytes_per_s``, ``loader_read_bytes_per_s`` and
        ``loader_read_bytes_per_sample`` (``read_chars``: bytes returned by read(), page-cache
        hits and pipes included), ``trainer_rss_max_bytes``, ``tree_rss_max_bytes``,
        ``worker_rss_max_bytes`` (the largest resident memory of one loader worker; shared pages
        count in each, so it is an upper bound of what one more worker costs),
        ``tree_threads``, ``psi_cpu_share``, ``psi_io_share``, ``window_s``.
    """
    pair = _bracket(records, window)
    if pair is None:
        return None
    a, b = pair
    dt = (b["t"] - a["t"]) / 1e9
    limits = job_limits(records, [p for p in (primary, *sorted(trainers)) if p is not None])
    cores = limits["cores"]

    rows_a = {r[PID]: r for r in a["procs"]}
    # Each process's last row in [a, b]: a worker that exited mid-window keeps its CPU time.
    span = [rec for rec in records if rec.get("k") == "host" and a["t"] <= rec["t"] <= b["t"]]
    rows_b: dict[int, list] = {}
    for rec in span:
        for r in rec["procs"]:
            rows_b[r[PID]] = r
    alive = {r[PID] for r in b["procs"]}
    parents, workers, helpers = process_roles(records, trainers)

    def delta(pid: int, idx: int) -> float:
        """Counter growth of ``pid`` in the window; a process born inside it counts from 0."""
        rb = rows_b.get(pid)
        if rb is None or len(rb) <= idx or rb[idx] is None:
            return 0.0
        ra = rows_a.get(pid)
        base = ra[idx] if ra is not None and len(ra) > idx and ra[idx] is not None else 0
        return max(0.0, rb[idx] - base)

    in_window = set(rows_b)
    tree = in_window - ({whyidle_pid} if whyidle_pid else set())
    trainer_set = set(trainers) & tree
    worker_set = workers & tree
    tree_other = tree - trainer_set - worker_set

    # CPU a child used after its last tick is lost from its own rows but reaches its parent's
    # children time once reaped (short-lived DataLoader workers, subprocesses).
    tail = {"workers": 0.0, "other": 0.0}
    for parent in tree:
        reaped = delta(parent, CHILDREN_CPU)
        if reaped <= 0:
            continue
        kids = [c for c in in_window - alive if parents.get(c) == parent]
        missing = max(0.0, reaped - sum(rows_b[c][CPU_S] for c in kids))
        role = "workers" if parent in trainer_set | worker_set | helpers else "other"
        tail[role] += missing

    def cores_of(pids) -> float:
        return sum(delta(p, CPU_S) for p in pids) / dt

    busy_a, busy_b = a.get("percpu_busy_s") or [], b.get("percpu_busy_s") or []
    percpu = [max(0.0, (y - x) / dt) for x, y in zip(busy_a, busy_b)]
    busy_cores = sum(percpu)
    iowait = (b["cpu"].get("iowait", 0.0) - a["cpu"].get("iowait", 0.0)) / dt / cores
    steal = (b["cpu"].get("steal", 0.0) - a["cpu"].get("steal", 0.0)) / dt / cores
    tree_cores = cores_of(tree) + (tail["workers"] + tail["other"]) / dt
    whyidle_cores = cores_of({whyidle_pid}) if whyidle_pid in rows_b else 0.0
    live_workers = [p for p in worker_set if p in alive]

    worker_delays = [delta(p, MAIN_RUN_DELAY) / 1e9 / dt for p in live_workers]
    main_delay = None
    if primary is not None and primary in rows_b and len(rows_b[primary]) > MAIN_RUN_DELAY \
            and rows_b[primary][MAIN_RUN_DELAY] is not None:
        main_delay = delta(primary, MAIN_RUN_DELAY) / 1e9 / dt

    loader = trainer_set if loader_in_main else worker_set
    read_chars = sum(delta(p, READ_CHARS) for p in loader)
    disk_a, disk_b = a.get("disk_read_bytes"), b.get("disk_read_bytes")

    def psi(key: str) -> float | None:
        if a.get(key) is None or b.get(key) is None:
            return None
        return (b[key] - a[key]) / 1e6 / dt

    rss_trainer = [r[RSS] for rec in records if rec.get("k") == "host" and (window is None or a["t"] <= rec["t"] <= b["t"])
                   for r in rec["procs"] if r[PID] in trainer_set]
    rss_tree = [sum(r[RSS] for r in rec["procs"] if r[PID] in tree) for rec in records
                if rec.get("k") == "host" and (window is None or a["t"] <= rec["t"] <= b["t"])]
    rss_worker = [r[RSS] for rec in span for r in rec["procs"] if r[PID] in worker_set]
    throttled_share, throttled_s = _throttling(span, limits["cpu_quota_cgroup"])
    workers_cores = cores_of(worker_set) + tail["workers"] / dt
    measured_other = _other_cores(records, a["t"], b["t"])
    yielding = _other_cores(records, a["t"], b["t"], "yielding_cpu_s") or 0.0
    per_worker = num_workers or len(live_workers)
    return {
        "window_s": dt,
        "cores": cores,
        "cores_usable": limits["cores_usable"],
        "cores_limit_by": limits["cores_limit_by"],
        "cpu_affinity": limits["cpu_affinity"],
        "cpu_quota": limits["cpu_quota"],
        "cpu_throttled_share": throttled_share,
        "cpu_throttled_s": throttled_s,
        "mem_limit_bytes": limits["mem_limit_bytes"],
        # the scans' window differs from the ticks': never below what the job itself used
        "cpu_busy_share": min(1.0, max(busy_cores - yielding, min(busy_cores, tree_cores + whyidle_cores)) / cores),
        "percpu_busy_share": [min(1.0, x) for x in percpu],
        "iowait_share": max(0.0, iowait),
        "steal_share": min(1.0, max(0.0, steal)),
        "trainer_cores": cores_of(trainer_set),
        "workers": len(live_workers),
        "workers_cores": workers_cores,
        "worker_busy_share": (workers_cores / per_worker) if per_worker and (live_workers or workers_cores) else None,
        "tree_other_cores": cores_of(tree_other) + tail["other"] / dt,
        "whyidle_cores": whyidle_cores,
        "other_procs_cores": measured_other if measured_other is not None
        else max(0.0, busy_cores - tree_cores - whyidle_cores),
        "yielding_procs_cores": yielding,
        "trainer_run_delay_share": main_delay,
        "workers_run_delay_share": (sum(worker_delays) / len(worker_delays)) if worker_delays else None,
        "tree_run_delay_cores": sum(delta(p, RUN_DELAY) for p in tree) / 1e9 / dt,
        "invol_ctx_per_s": sum(delta(p, CTX_INVOL) for p in tree) / dt,
        "disk_read_bytes_per_s": (disk_b - disk_a) / dt if disk_a is not None and disk_b is not None else None,
        "loader_read_bytes_per_s": read_chars / dt,
        "loader_read_bytes_per_sample": (read_chars / samples_in_window) if samples_in_window else None,
        "trainer_rss_max_bytes": max(rss_trainer) if rss_trainer else None,
        "tree_rss_max_bytes": max(rss_tree) if rss_tree else None,
        "worker_rss_max_bytes": max(rss_worker) if rss_worker else None,
        "tree_threads": sum(r[THREADS] for r in b["procs"] if r[PID] in tree),
        "psi_cpu_share": psi("psi_cpu_us"),
        "psi_io_share": psi("psi_io_us"),
    }


def _other_cores(records: list[dict], t0: int, t1: int, key: str = "total_cpu_s") -> float | None:
    """CPU-seconds per second used outside the tree, from the scans overlapping [t0, t1]
    (``host_top.total_cpu_s``: processes that compete with the job; ``key="yielding_cpu_s"``:
    those niced far below it, 0 in runs recorded before it was kept); None without such scans
    (the caller then subtracts the tree's CPU from the machine's, which over-counts processes of
    the tree that exit between ticks)."""
    scans = [r for r in records if r.get("k") == "host_top" and "total_cpu_s" in r and r["t1"] > t0 and r["t0"] < t1]
    span = sum(r["t1"] - r["t0"] for r in scans) / 1e9
    return sum(r.get(key) or 0.0 for r in scans) / span if span > 0 else None


#: Processes below this many cores are not worth naming as competitors.
MIN_TOP_CORES = 0.05


def top_other_processes(records: list[dict], window: tuple[int, int] | None, limit: int = 3) -> list[dict]:
    """The busiest processes outside the observed tree in ``window``.

    Returns a list of ``{"pid", "command", "cores"}`` (cores = CPU-seconds per second over the
    scans that overlap the window), busiest first, leaving out those under
    :data:`MIN_TOP_CORES`.
    """
    scans = [r for r in records if r.get("k") == "host_top"]
    if window is not None:
        t0, t1 = window
        scans = [r for r in scans if r["t1"] > t0 and r["t0"] < t1]
    if not scans:
        return []
    span = sum(r["t1"] - r["t0"] for r in scans) / 1e9
    totals: dict[int, list] = {}
    for r in scans:
        for pid, cmd, cpu in r["procs"]:
            entry = totals.setdefault(pid, [cmd, 0.0])
            entry[1] += cpu
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:limit]
    return [{"pid": pid, "command": cmd, "cores": cpu / span} for pid, (cmd, cpu) in ranked
            if span > 0 and cpu / span >= MIN_TOP_CORES]
