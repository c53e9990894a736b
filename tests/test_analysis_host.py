"""Host samples → CPU / scheduler / I/O metrics (whyidle.analysis.host), on synthetic ticks."""

from __future__ import annotations

import pytest

from whyidle.analysis.host import descendants, host_metrics, top_other_processes

S = 1_000_000_000  # ns per second

WHYIDLE, LAUNCHER, TRAINER, WORKER, GRANDCHILD = 40, 50, 100, 101, 103


def row(pid, ppid, cpu_s, rss=0, threads=1, ctx_vol=0, ctx_invol=0, read_bytes=0, read_chars=0,
        run_delay=0, main_delay=None):
    """A ``procs`` row of a host record (cumulative counters)."""
    return [pid, ppid, cpu_s, rss, threads, ctx_vol, ctx_invol, read_bytes, read_chars, run_delay, main_delay]


def tick(t_s, percpu, iowait, procs, disk=None, psi_cpu=None, psi_io=None, steal=0.0):
    return {"k": "host", "t": int(t_s * S),
            "cpu": {"user": 100.0, "system": 20.0, "idle": 500.0, "iowait": iowait, "steal": steal},
            "percpu_busy_s": percpu, "ctx": 0, "disk_read_bytes": disk, "mem_used_bytes": 0,
            "psi_cpu_us": psi_cpu, "psi_io_us": psi_io, "procs": procs}


STATIC = {"k": "host_static", "t": 0, "cpu_count": 4, "cpu_count_physical": 2, "mem_total_bytes": 16 * 2**30,
          "clk_tck": 100, "boot_time_s": 0}


def two_ticks():
    """Ticks at 10 s and 12 s (dt = 2 s) on a 4-core machine.

    Tree: launcher 50 → trainer 100 → worker 101 → worker 103 (a worker's child, new in the second
    tick); whyidle 40 beside it.
    """
    a = tick(10, [10.0, 20.0, 30.0, 40.0], 10.0, [
        row(WHYIDLE, 1, 3.0, rss=50, threads=3),
        row(LAUNCHER, 1, 1.0, rss=10, threads=1),
        row(TRAINER, LAUNCHER, 5.0, rss=1_000, threads=10, ctx_invol=100, read_chars=1_000,
            run_delay=1_000_000_000, main_delay=500_000_000),
        row(WORKER, TRAINER, 2.0, rss=200, threads=2, ctx_invol=10, read_chars=5_000, run_delay=0),
    ], disk=1_000, psi_cpu=1_000_000, psi_io=0)
    b = tick(12, [11.5, 21.5, 31.5, 41.5], 11.6, [
        row(WHYIDLE, 1, 3.2, rss=60, threads=3),
        row(LAUNCHER, 1, 1.1, rss=10, threads=1),
        row(TRAINER, LAUNCHER, 7.0, rss=1_200, threads=10, ctx_invol=300, read_chars=3_000,
            run_delay=1_600_000_000, main_delay=900_000_000),
        row(WORKER, TRAINER, 3.0, rss=300, threads=2, ctx_invol=50, read_chars=3_005_000,
            run_delay=200_000_000),
        row(GRANDCHILD, WORKER, 0.4, rss=100, threads=1, ctx_invol=20, read_chars=1_000_000,
            run_delay=200_000_000),
    ], disk=4_001_000, psi_cpu=1_500_000, psi_io=200_000)
    return [STATIC, a, b]


def test_exact_values_between_two_ticks():
    m = host_metrics(two_ticks(), None, {TRAINER}, TRAINER, WHYIDLE, samples_in_window=1000, loader_in_main=False)
    assert m["window_s"] == pytest.approx(2.0)
    assert m["cores"] == 4
    # each core +1.5 busy-seconds in 2 s
    assert m["percpu_busy_share"] == pytest.approx([0.75] * 4)
    assert m["cpu_busy_share"] == pytest.approx(0.75)
    # iowait +1.6 s over 2 s and 4 cores
    assert m["iowait_share"] == pytest.approx(0.2)
    assert m["trainer_cores"] == pytest.approx(1.0)
    # workers: 101 (+1.0 s) and 103 (new: +0.4 s from zero) → 0.7 cores, 2 live workers
    assert m["workers"] == 2
    assert m["workers_cores"] == pytest.approx(0.7)
    assert m["worker_busy_share"] == pytest.approx(0.35)
    assert m["tree_other_cores"] == pytest.approx(0.05)  # the launcher
    assert m["whyidle_cores"] == pytest.approx(0.1)
    # machine busy 3.0 cores − tree 1.75 − whyidle 0.1
    assert m["other_procs_cores"] == pytest.approx(1.15)
    # main thread waited 0.4 s of 2 s
    assert m["trainer_run_delay_share"] == pytest.approx(0.2)
    # tree threads waited 0.6 + 0.2 + 0.2 s in 2 s
    assert m["tree_run_delay_cores"] == pytest.approx(0.5)
    # forced switches 200 + 40 + 20 in 2 s
    assert m["invol_ctx_per_s"] == pytest.approx(130.0)
    assert m["disk_read_bytes_per_s"] == pytest.approx(2_000_000.0)
    # loader = workers: 3,000,000 + 1,000,000 read_chars
    assert m["loader_read_bytes_per_s"] == pytest.approx(2_000_000.0)
    assert m["loader_read_bytes_per_sample"] == pytest.approx(4_000.0)
    assert m["trainer_rss_max_bytes"] == 1_200
    assert m["tree_rss_max_bytes"] == 10 + 1_200 + 300 + 100
    assert m["tree_threads"] == 1 + 10 + 2 + 1
    assert m["psi_cpu_share"] == pytest.approx(0.25)
    assert m["psi_io_share"] == pytest.approx(0.1)


def test_loader_in_main_reads_the_trainer():
    m = host_metrics(two_ticks(), None, {TRAINER}, TRAINER, WHYIDLE, samples_in_window=1000, loader_in_main=True)
    assert m["loader_read_bytes_per_s"] == pytest.approx(1_000.0)
    assert m["loader_read_bytes_per_sample"] == pytest.approx(2.0)


def test_no_samples_no_bytes_per_sample():
    m = host_metrics(two_ticks(), None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["loader_read_bytes_per_sample"] is None
    m = host_metrics(two_ticks(), None, {TRAINER}, TRAINER, WHYIDLE, samples_in_window=0)
    assert m["loader_read_bytes_per_sample"] is None


def test_unknown_counters_are_none_not_zero():
    recs = two_ticks()
    for r in recs[1:]:
        r["disk_read_bytes"] = None
        r["psi_cpu_us"] = None
        r["psi_io_us"] = None
        for p in r["procs"]:
            p[10] = None  # no per-thread schedstat
    m = host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["disk_read_bytes_per_s"] is None
    assert m["psi_cpu_share"] is None and m["psi_io_share"] is None
    assert m["trainer_run_delay_share"] is None


def test_no_primary_no_run_delay_share():
    m = host_metrics(two_ticks(), None, {TRAINER}, None, WHYIDLE)
    assert m["trainer_run_delay_share"] is None


def test_without_whyidle_pid_whyidle_counts_as_tree():
    m = host_metrics(two_ticks(), None, {TRAINER}, TRAINER, None)
    assert m["whyidle_cores"] == 0.0
    assert m["tree_other_cores"] == pytest.approx(0.05 + 0.1)
    assert m["other_procs_cores"] == pytest.approx(1.15)


def test_no_workers():
    m = host_metrics(two_ticks(), None, {LAUNCHER, TRAINER, WORKER, GRANDCHILD}, TRAINER, WHYIDLE)
    assert m["workers"] == 0
    assert m["workers_cores"] == 0.0
    assert m["worker_busy_share"] is None
    assert m["trainer_cores"] == pytest.approx(1.0 + 0.05 + 0.5 + 0.2)


def test_cores_falls_back_to_percpu_length_then_one():
    recs = two_ticks()[1:]  # no host_static
    assert host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)["cores"] == 4
    for r in recs:
        r["percpu_busy_s"] = []
    m = host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["cores"] == 1
    assert m["iowait_share"] == pytest.approx(0.8)
    assert m["percpu_busy_share"] == []
    assert m["cpu_busy_share"] == 0.0


def test_per_core_share_capped_at_one_and_never_negative():
    recs = two_ticks()
    recs[2]["percpu_busy_s"] = [14.0, 19.0, 31.0, 41.0]  # +4 s in 2 s (clock skew), −1 s (counter reset)
    m = host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["percpu_busy_share"] == pytest.approx([1.0, 0.0, 0.5, 0.5])


def test_fewer_than_two_ticks_is_none():
    assert host_metrics([], None, {TRAINER}, TRAINER, WHYIDLE) is None
    assert host_metrics([STATIC], None, {TRAINER}, TRAINER, WHYIDLE) is None
    assert host_metrics([STATIC, two_ticks()[1]], None, {TRAINER}, TRAINER, WHYIDLE) is None
    assert host_metrics([STATIC, two_ticks()[1]], (0, 100 * S), {TRAINER}, TRAINER, WHYIDLE) is None


# -- window bracketing ---------------------------------------------------------------------------

def ticks_every_second(times_s, trainer_cpu):
    """Host ticks at ``times_s`` with the trainer's cumulative CPU seconds ``trainer_cpu``."""
    out = [STATIC]
    for t, c in zip(times_s, trainer_cpu):
        out.append(tick(t, [t * 1.0] * 4, 0.0, [row(TRAINER, 1, c)]))
    return out


def test_inside_window_ticks_are_used_when_two_or_more():
    # start-up burst (3 CPU-s between t=9 and t=10) happens before the window at 10 s
    recs = ticks_every_second([9, 10, 11, 12, 13], [0.0, 3.0, 3.5, 4.0, 4.5])
    m = host_metrics(recs, (10 * S, 12 * S), {TRAINER}, TRAINER, None)
    assert m["window_s"] == pytest.approx(2.0)  # ticks 10 → 12
    assert m["trainer_cores"] == pytest.approx(0.5)
    m = host_metrics(recs, (int(10.5 * S), 100 * S), {TRAINER}, TRAINER, None)
    assert m["window_s"] == pytest.approx(2.0)  # ticks 11 → 13
    assert m["trainer_cores"] == pytest.approx(0.5)


def test_outside_ticks_bracket_a_short_window():
    recs = ticks_every_second([9, 10, 11, 12, 13], [0.0, 3.0, 3.5, 4.0, 4.5])
    # no tick inside [10.2, 10.8]: the ticks just before (10) and just after (11)
    m = host_metrics(recs, (int(10.2 * S), int(10.8 * S)), {TRAINER}, TRAINER, None)
    assert m["window_s"] == pytest.approx(1.0)
    assert m["trainer_cores"] == pytest.approx(0.5)
    # one tick inside [10.5, 11.5] (11): still not two → 10 and 12
    m = host_metrics(recs, (int(10.5 * S), int(11.5 * S)), {TRAINER}, TRAINER, None)
    assert m["window_s"] == pytest.approx(2.0)
    # a window starting before the first tick: the first tick stands in for "before"
    m = host_metrics(recs, (int(8.0 * S), int(9.5 * S)), {TRAINER}, TRAINER, None)
    assert m["window_s"] == pytest.approx(1.0)
    assert m["trainer_cores"] == pytest.approx(3.0)


def test_window_after_all_ticks_is_none():
    recs = ticks_every_second([9, 10, 11], [0.0, 1.0, 2.0])
    assert host_metrics(recs, (20 * S, 30 * S), {TRAINER}, TRAINER, None) is None


def test_rss_max_limited_to_the_bracketing_ticks():
    recs = [STATIC]
    for t, rss in zip([9, 10, 11, 12, 13], [9_000, 100, 300, 200, 8_000]):
        recs.append(tick(t, [0.0] * 4, 0.0, [row(TRAINER, 1, float(t), rss=rss)]))
    m = host_metrics(recs, (10 * S, 12 * S), {TRAINER}, TRAINER, None)
    assert m["trainer_rss_max_bytes"] == 300
    assert m["tree_rss_max_bytes"] == 300
    m = host_metrics(recs, None, {TRAINER}, TRAINER, None)
    assert m["trainer_rss_max_bytes"] == 9_000


# -- descendants ---------------------------------------------------------------------------------

def test_descendants_follow_the_parent_chain():
    parents = {WHYIDLE: 1, LAUNCHER: 1, TRAINER: LAUNCHER, WORKER: TRAINER, GRANDCHILD: WORKER, 7: 1}
    assert descendants(parents, {TRAINER}) == {WORKER, GRANDCHILD}
    assert descendants(parents, {LAUNCHER}) == {TRAINER, WORKER, GRANDCHILD}
    assert descendants(parents, {TRAINER, WORKER}) == {GRANDCHILD}  # roots are not their own descendants
    assert descendants(parents, {999}) == set()
    assert descendants({}, {TRAINER}) == set()


def test_descendants_survive_a_parent_cycle():
    assert descendants({1: 2, 2: 1, 3: 1}, {5}) == set()
    assert descendants({1: 2, 2: 1, 3: 1}, {2}) == {1, 3}


# -- top_other_processes -------------------------------------------------------------------------

def scan(t0_s, t1_s, procs):
    return {"k": "host_top", "t": int(t1_s * S), "t0": int(t0_s * S), "t1": int(t1_s * S), "procs": procs}


SCANS = [scan(0, 2, [[7, "stress -c 2", 1.8], [8, "cc1", 0.4]]),
         scan(2, 4, [[7, "stress -c 2", 1.6], [9, "python other.py", 1.0]])]


def test_top_other_processes_whole_run():
    out = top_other_processes([STATIC] + SCANS, None)
    assert [p["pid"] for p in out] == [7, 9, 8]
    assert out[0] == {"pid": 7, "command": "stress -c 2", "cores": pytest.approx(3.4 / 4)}
    assert out[1]["cores"] == pytest.approx(1.0 / 4)
    assert out[2]["cores"] == pytest.approx(0.4 / 4)
    assert [p["pid"] for p in top_other_processes(SCANS, None, limit=2)] == [7, 9]


def test_top_other_processes_in_window():
    out = top_other_processes(SCANS, (int(2.5 * S), int(3.5 * S)))
    assert [(p["pid"], p["cores"]) for p in out] == [(7, pytest.approx(0.8)), (9, pytest.approx(0.5))]


def test_top_other_processes_without_scans():
    assert top_other_processes([STATIC], None) == []
    assert top_other_processes([], (0, S)) == []


def test_worker_that_exits_inside_the_window_still_counts_as_a_worker():
    # 4 cores; trainer 100 runs 1 core throughout; worker 101 runs 1 core from 0 to 1 s, then exits
    # (epoch end); worker 102 starts after 1 s and uses 0.8 s. Nothing else runs on the machine.
    recs = [STATIC,
            tick(0, [0.0, 0.0, 0.0, 0.0], 0.0, [row(TRAINER, 1, 0.0), row(WORKER, TRAINER, 0.0)]),
            tick(1, [0.5, 0.5, 0.5, 0.5], 0.0, [row(TRAINER, 1, 1.0), row(WORKER, TRAINER, 1.0)]),
            tick(2, [0.95, 0.95, 0.95, 0.95], 0.0, [row(TRAINER, 1, 2.0), row(102, TRAINER, 0.8)])]
    m = host_metrics(recs, None, {TRAINER}, TRAINER, None)
    assert m["trainer_cores"] == pytest.approx(1.0)
    assert m["workers_cores"] == pytest.approx((1.0 + 0.8) / 2)
    assert m["other_procs_cores"] == pytest.approx(0.0, abs=1e-9)


def test_reparented_worker_keeps_its_first_parent_and_helpers_are_not_workers():
    """A forkserver DataLoader setup: trainer → forkserver → 2 workers, plus a resource tracker.
    At the last tick the trainer has exited and the survivors show whyidle (a subreaper) as
    parent; roles still follow the first parent seen, and the helpers are not workers."""
    fs, tracker, w1, w2 = 110, 111, 120, 121
    procs_meta = [
        {"k": "host_proc", "t": 0, "pid": fs, "ppid": TRAINER, "name": "python",
         "cmdline": ["python", "-c", "from multiprocessing.forkserver import main; main(10, 11)"]},
        {"k": "host_proc", "t": 0, "pid": tracker, "ppid": TRAINER, "name": "python",
         "cmdline": ["python", "-c", "from multiprocessing.resource_tracker import main;main(6)"]},
        {"k": "host_proc", "t": 0, "pid": w1, "ppid": fs, "name": "pt_data_worker",
         "cmdline": ["python", "-c", "from multiprocessing.forkserver import main; main(10, 11)"]},
    ]
    a = tick(10, [0.0, 0.0], 0.0, [row(TRAINER, LAUNCHER, 1.0, main_delay=0), row(fs, TRAINER, 0.5),
                                   row(tracker, TRAINER, 0.1), row(w1, fs, 1.0, main_delay=0),
                                   row(w2, fs, 1.0, main_delay=0)])
    b = tick(12, [2.0, 2.0], 0.0, [row(fs, WHYIDLE, 0.5), row(tracker, WHYIDLE, 0.3),
                                   row(w1, WHYIDLE, 2.0, main_delay=400_000_000),
                                   row(w2, WHYIDLE, 2.6, main_delay=0)])
    m = host_metrics([STATIC, *procs_meta, a, b], None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["workers"] == 2
    assert m["workers_cores"] == pytest.approx((1.0 + 1.6) / 2)
    assert m["worker_busy_share"] == pytest.approx(1.3 / 2)
    assert m["workers_run_delay_share"] == pytest.approx((0.4 / 2 + 0.0) / 2)
    assert m["tree_other_cores"] == pytest.approx(0.2 / 2)  # the tracker; the forkserver used nothing


def test_cpu_of_a_worker_that_exits_between_ticks_is_recovered_from_children_time():
    """Worker 101 used 1.0 s until its last tick and 1.5 s in all (0.5 s after it). When the
    trainer reaps it, the trainer's children time grows by the whole 1.5 s: the missing 0.5 s
    goes to the workers, not to "other processes"."""
    row12 = lambda *a, children=0.0, **k: row(*a, **k) + [children]  # noqa: E731
    a = tick(10, [0.0, 0.0, 0.0, 0.0], 0.0, [row12(TRAINER, LAUNCHER, 1.0, main_delay=0),
                                             row12(WORKER, TRAINER, 0.2, main_delay=0)])
    mid = tick(11, [0.0, 0.0, 0.0, 0.0], 0.0, [row12(TRAINER, LAUNCHER, 1.5, main_delay=0),
                                               row12(WORKER, TRAINER, 1.0, main_delay=0)])
    b = tick(12, [1.0, 1.0, 0.5, 0.0], 0.0, [row12(TRAINER, LAUNCHER, 2.0, main_delay=0, children=1.5)])
    top = {"k": "host_top", "t": int(12 * S), "t0": int(10 * S), "t1": int(12 * S), "total_cpu_s": 0.1, "procs": []}
    m = host_metrics([STATIC, a, mid, b, top], None, {TRAINER}, TRAINER, WHYIDLE, num_workers=1)
    assert m["workers_cores"] == pytest.approx((0.8 + 0.5) / 2)  # seen 0.2 → 1.0, then the 0.5 s tail
    assert m["worker_busy_share"] == pytest.approx(0.65)  # per configured worker
    assert m["other_procs_cores"] == pytest.approx(0.05)  # measured by the scan, not busy − tree


def test_other_processes_fall_back_to_busy_minus_tree_without_scans():
    m = host_metrics(two_ticks(), None, {TRAINER}, TRAINER, WHYIDLE)
    # 3 cores busy (6 CPU-s over 2 s) minus the tree's and whyidle's CPU
    assert m["other_procs_cores"] == pytest.approx(3.0 - (0.1 + 2.0 + 1.0 + 0.4) / 2 - 0.1)


def test_steal_share_is_the_hypervisors_part_of_the_machines_cpu_time():
    recs = two_ticks()
    recs[1]["cpu"]["steal"], recs[2]["cpu"]["steal"] = 7.0, 8.2  # +1.2 s over 2 s and 4 cores
    m = host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["steal_share"] == pytest.approx(0.15)
    del recs[1]["cpu"]["steal"], recs[2]["cpu"]["steal"]  # a kernel without the column
    assert host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)["steal_share"] == 0.0


def test_yielding_processes_are_spare_time_not_competitors():
    recs = two_ticks()
    recs.append({"k": "host_top", "t": int(12 * S), "t0": int(10 * S), "t1": int(12 * S), "total_cpu_s": 0.2,
                 "procs": [], "yielding_cpu_s": 1.6, "yielding_procs": [[9, "nice python suite", 1.6]]})
    m = host_metrics(recs, None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["other_procs_cores"] == pytest.approx(0.1)
    assert m["yielding_procs_cores"] == pytest.approx(0.8)
    assert m["cpu_busy_share"] == pytest.approx((3.0 - 0.8) / 4)  # 3 busy cores, 0.8 of them spare time
