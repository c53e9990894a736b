"""The host sampler against this real machine (psutil and /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from whyidle.analysis.host import host_metrics
from whyidle.sampling import host as host_mod
from whyidle.sampling.host import HostPoller


@pytest.mark.timing  # asserts the spinner's measured cores: beside other tests it gets less than one
def test_poller_samples_the_tree_and_the_machine():
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1.5: pass"])
    try:
        poller = HostPoller(os.getpid(), period_s=0.2)
        now = time.monotonic_ns()
        (static,) = poller.start(now)
        assert static["k"] == "host_static" and static["cpu_count"] == os.cpu_count()
        records = [static]
        for _ in range(5):
            time.sleep(0.2)
            records += poller.poll(time.monotonic_ns())
    finally:
        child.wait()
    ticks = [r for r in records if r["k"] == "host"]
    assert len(ticks) == 5
    pids = {row[0] for row in ticks[-1]["procs"]}
    assert {os.getpid(), child.pid} <= pids
    assert all(len(row) == 12 for t in ticks for row in t["procs"])
    seen = {r["pid"] for r in records if r["k"] == "host_proc"}
    assert child.pid in seen
    m = host_metrics(records, None, {child.pid}, child.pid, os.getpid())
    assert 0.5 <= m["trainer_cores"] <= 1.1  # the child spins one core
    assert m["cores"] == os.cpu_count()
    assert m["trainer_run_delay_share"] is not None


@pytest.mark.timing  # a nice-19 spinner gets ~1.5 % of a core while other tests keep both busy
def test_a_process_niced_far_below_the_job_is_counted_apart():
    """A ``nice -n 19`` spinner outside the observed tree yields its core to the job: the scan
    counts its CPU as ``yielding_cpu_s`` and names it there, not as a competitor."""
    spin = "import time\nt=time.time()\nwhile time.time()-t<3: pass"
    niced = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", spin])
    try:
        poller = HostPoller(os.getpid(), period_s=0.2)
        poller._job_nice = min(poller._job_nice, 4)  # the job at nice <= 4: 19 is >= 15 above it
        first = poller._scan_top({os.getpid()}, time.monotonic_ns())
        time.sleep(1.0)
        scan = poller._scan_top({os.getpid()}, time.monotonic_ns())
    finally:
        niced.kill()
        niced.wait()
    assert first is None and scan["yielding_cpu_s"] >= 0.3
    assert niced.pid in [row[0] for row in scan["yielding_procs"]]
    assert niced.pid not in [row[0] for row in scan["procs"]]


def _sleeping_child(tmp_path):
    """A child that burns a little CPU, reads a file, then sleeps (its counters hold still)."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 300_000)
    code = (f"import time\nwhile time.process_time()<0.2: pass\nopen({str(data)!r},'rb').read()\n"
            "print('ready', flush=True)\ntime.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


@pytest.mark.skipif(not host_mod._PROC_STAT, reason="reads /proc")
def test_proc_rows_hold_the_counters_psutil_reads(tmp_path):
    child = _sleeping_child(tmp_path)
    try:
        mine = host_mod._proc_row(child.pid)
        theirs = host_mod._psutil_row(psutil.Process(child.pid))
    finally:
        child.kill()
        child.wait()
    pid, ppid, cpu, rss, threads, vol, invol, rb, rc, delay, main_delay, children = mine
    assert (pid, ppid, threads) == (child.pid, os.getpid(), theirs[4])
    assert cpu == pytest.approx(theirs[2], abs=0.02) and cpu >= 0.1
    assert rss == pytest.approx(theirs[3], rel=0.02)
    assert (vol, invol) == (theirs[5], theirs[6])
    assert (rb, rc) == (theirs[7], theirs[8]) and rc >= 300_000
    assert delay is not None and main_delay is not None and children == theirs[11]
    assert host_mod._proc_row(child.pid) is None  # gone once reaped


def test_new_processes_join_the_tree_at_the_next_tick_and_exited_ones_leave_it(tmp_path):
    """A child of a known process's main thread is found at the next tick (a short job's
    DataLoader workers live less than a second); one started from another thread at the next
    full search; an exited one is dropped."""
    import threading

    poller = HostPoller(os.getpid(), period_s=0.25)
    t = 10**12
    poller.start(t)
    poller.poll(t)

    def pids(now):
        recs = poller.poll(now)
        return {row[0] for r in recs if r["k"] == "host" for row in r["procs"]}, recs

    main_child = _sleeping_child(tmp_path)
    box, started, done = [], threading.Event(), threading.Event()

    def spawn():  # the thread stays alive: an exiting thread's children pass to the main thread
        box.append(_sleeping_child(tmp_path))
        started.set()
        done.wait(30)

    spawner = threading.Thread(target=spawn)
    spawner.start()
    started.wait(30)
    thread_child = box[0]
    try:
        tick, recs = pids(t + int(0.25e9))  # between two full searches
        full, _ = pids(t + int(host_mod.TREE_SCAN_PERIOD_S * 1e9))
    finally:
        done.set()
        spawner.join()
        for child in (main_child, thread_child):
            child.kill()
            child.wait()
    if os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        assert main_child.pid in tick and thread_child.pid not in tick
        assert any(r["k"] == "host_proc" and r["pid"] == main_child.pid and r["ppid"] == os.getpid() for r in recs)
    assert {main_child.pid, thread_child.pid} <= full
    after, _ = pids(t + int(host_mod.TREE_SCAN_PERIOD_S * 1e9) + int(0.25e9))
    assert main_child.pid not in after and thread_child.pid not in after and os.getpid() in after
