"""The cores and memory a job may use (issue 31, part 3): the cgroup (v1, v2) and affinity reads of
:mod:`whyidle.sampling.limits` on files laid out as the kernel does, the host sampler recording a
real child's affinity per process (and again once a launcher narrows it), the analysis turning the
records into usable cores, throttling and a memory limit, and the rules keeping to them: worker
counts, the quota throttle told from run-queue contention, the memory cap, tune's counts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_diagnose import make_facts, make_host, make_loader, make_step

from whyidle.analysis.host import host_metrics, job_limits
from whyidle.diagnose import rules
from whyidle.sampling import limits
from whyidle.sampling.host import HostPoller
from whyidle.tune import plan

GB = 10**9


# -- cgroup files --------------------------------------------------------------------------------

def test_cgroup_v2_quota_memory_and_throttling(tmp_path):
    root = tmp_path / "cgroup"
    leaf = root / "kubepods" / "pod1"
    leaf.mkdir(parents=True)
    (root / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (root / "kubepods" / "cpu.stat").write_text("usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n"
                                                "nr_periods 200\nnr_throttled 50\nthrottled_usec 2500000\n"
                                                "nr_bursts 0\nburst_usec 0\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    (leaf / "memory.max").write_text(f"{8 << 30}\n")
    (root / "kubepods" / "memory.max").write_text("max\n")
    text = "0::/kubepods/pod1\n"
    assert limits.cgroup_limits(text, str(root)) == {
        "cpu_quota": 4.0, "cpu_quota_cgroup": str(root / "kubepods"), "mem_limit_bytes": 8 << 30}
    assert limits.cpu_throttling(str(root / "kubepods")) == [200, 50, 2.5]
    assert limits.cpu_throttling(str(leaf)) is None  # no cpu.stat
    proc = tmp_path / "cgroup.txt"
    proc.write_text(text)
    assert limits.cgroup_cpu_quota(str(root), str(proc)) == 4.0
    assert limits.cgroup_memory_limit(str(root), str(proc)) == 8 << 30
    # the nearer, smaller quota binds
    (leaf / "cpu.max").write_text("150000 100000\n")
    assert limits.cgroup_limits(text, str(root))["cpu_quota"] == 1.5
    assert limits.cgroup_limits(text, str(root))["cpu_quota_cgroup"] == str(leaf)
    assert limits.cgroup_limits("0::/\n", str(root)) == {"cpu_quota": None, "cpu_quota_cgroup": None,
                                                         "mem_limit_bytes": None}


def test_cgroup_v1_quota_memory_and_throttling(tmp_path):
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("150000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cpu.stat").write_text("nr_periods 21\nnr_throttled 16\nthrottled_time 190554867\nnr_bursts 0\n"
                                  "burst_time 0\n")
    (root / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us").write_text("-1\n")
    mem = root / "memory" / "docker" / "abc"
    mem.mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (mem / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    # a hybrid machine: the v2 line is there too, without controllers
    text = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    got = limits.cgroup_limits(text, str(root))
    assert got == {"cpu_quota": 1.5, "cpu_quota_cgroup": str(cpu), "mem_limit_bytes": 2 << 30}
    assert limits.cpu_throttling(str(cpu)) == [21, 16, pytest.approx(0.190554867)]
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert limits.cgroup_limits(text, str(root))["mem_limit_bytes"] is None


def test_a_containers_own_view_is_its_cgroup_root(tmp_path):
    """In a container without its own cgroup namespace ``/proc/self/cgroup`` names the host's path,
    which its ``/sys/fs/cgroup`` (the container's cgroup mounted as the root) does not have: the
    walk up reaches the root and reads the container's own limits there."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("200000 100000\n")
    (root / "memory.max").write_text(f"{4 << 30}\n")
    got = limits.cgroup_limits("0::/kubepods.slice/kubepods-pod9.slice/cri-containerd-1.scope\n", str(root))
    assert got == {"cpu_quota": 2.0, "cpu_quota_cgroup": str(root), "mem_limit_bytes": 4 << 30}


def test_usable_cores_is_the_smallest_limit_and_says_which():
    assert limits.usable_cores(64, 64, None) == (64, None)
    assert limits.usable_cores(64, 64, 4.0) == (4.0, "cgroup quota")
    assert limits.usable_cores(64, 8, 16.0) == (8, "affinity")
    assert limits.usable_cores(2, 1, 1.0) == (1, "affinity and cgroup quota")
    assert limits.usable_cores(2, 2, 2.0) == (2, None)  # a quota of the whole machine limits nothing
    assert limits.usable_cores(None, None, None) == (None, None)
    assert 0 < limits.own_usable_cores() <= os.cpu_count()


# -- the sampler, on real processes --------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least 2 CPUs to narrow an affinity")
def test_sampler_records_each_processs_affinity_and_a_later_narrowing():
    """A child started on one CPU is recorded with it; a child that narrows its own affinity after
    the sampler first saw it (a launcher's wrapper, numactl, the program itself) is recorded again
    at the next full search of the tree."""
    cpu = min(os.sched_getaffinity(0))
    pinned = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    later = subprocess.Popen([sys.executable, "-c", f"import os, sys, time\nsys.stdin.readline()\n"
                              f"os.sched_setaffinity(0, {{{cpu}}})\nprint('narrowed', flush=True)\ntime.sleep(30)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        poller = HostPoller(os.getpid(), period_s=0.25)
        t = time.monotonic_ns()
        records = poller.start(t) + poller.poll(t)
        first = {r["pid"]: r for r in records if r["k"] == "host_proc"}
        assert first[pinned.pid]["cpu_affinity"] == 1
        assert first[later.pid]["cpu_affinity"] == len(os.sched_getaffinity(0))
        assert first[os.getpid()]["cpu_affinity"] == len(os.sched_getaffinity(0))
        later.stdin.write("go\n")
        later.stdin.flush()
        assert later.stdout.readline().strip() == "narrowed"
        between = poller.poll(t + int(0.25e9))  # not a full search: not looked at again
        assert not [r for r in between if r["k"] == "host_proc" and r["pid"] == later.pid]
        again = poller.poll(t + int(1.1e9))
        (rec,) = [r for r in again if r["k"] == "host_proc" and r["pid"] == later.pid]
        assert rec["cpu_affinity"] == 1 and rec["cmdline"]
        assert not [r for r in again if r["k"] == "host_proc" and r["pid"] == pinned.pid]  # unchanged
        records += between + again
        assert job_limits(records, [later.pid])["cores_usable"] == 1
        assert job_limits(records, [later.pid])["cores_limit_by"] == "affinity"
    finally:
        for p in (pinned, later):
            p.kill()
            p.wait()


# -- analysis ------------------------------------------------------------------------------------

S = 1_000_000_000
WHYIDLE, TRAINER, WORKER = 40, 100, 101
QUOTA_DIR = "/sys/fs/cgroup/cpu/job"


def _host_records(quota=None, affinity=4, throttle=((100, 10, 0.5), (120, 25, 1.7)), mem=None):
    """A 4-core machine, whyidle on all of it; the trainer (and its worker) under ``affinity`` and
    ``quota``; ticks at 10 s and 12 s with the quota cgroup's ``cpu.stat`` rows."""
    proc = {"cpu_affinity": affinity, "cpu_quota": quota, "cpu_quota_cgroup": QUOTA_DIR if quota else None,
            "mem_limit_bytes": mem}
    recs = [{"k": "host_static", "t": 0, "cpu_count": 4, "cpu_affinity": 4, "mem_total_bytes": 16 * GB},
            {"k": "host_proc", "t": 0, "pid": WHYIDLE, "ppid": 1, "cpu_affinity": 4, "cpu_quota": None,
             "cpu_quota_cgroup": None, "mem_limit_bytes": None},
            {"k": "host_proc", "t": 1, "pid": TRAINER, "ppid": WHYIDLE, **proc},
            {"k": "host_proc", "t": 1, "pid": WORKER, "ppid": TRAINER, **proc}]
    for t, cpu, stat in ((10, 1.0, throttle[0]), (12, 3.0, throttle[1])):
        tick = {"k": "host", "t": t * S, "cpu": {"user": 1.0, "idle": 1.0}, "percpu_busy_s": [t] * 4,
                "procs": [[WHYIDLE, 1, 0.1, 50, 3], [TRAINER, WHYIDLE, cpu, 2 * GB, 4],
                          [WORKER, TRAINER, cpu / 2, GB // 2, 1]]}
        if quota:
            tick["cpu_throttle"] = [[QUOTA_DIR, *stat]]
        recs.append(tick)
    return recs


def test_host_metrics_usable_cores_throttling_and_memory_limit():
    m = host_metrics(_host_records(quota=1.0, mem=4 * GB), None, {TRAINER}, TRAINER, WHYIDLE)
    assert m["cores"] == 4 and m["cores_usable"] == 1.0 and m["cores_limit_by"] == "cgroup quota"
    assert m["cpu_quota"] == 1.0 and m["cpu_affinity"] == 4
    assert m["cpu_throttled_share"] == pytest.approx(15 / 20) and m["cpu_throttled_s"] == pytest.approx(1.2)
    assert m["mem_limit_bytes"] == 4 * GB and m["worker_rss_max_bytes"] == GB // 2
    m = host_metrics(_host_records(affinity=2), None, {TRAINER}, TRAINER, WHYIDLE)
    assert (m["cores_usable"], m["cores_limit_by"], m["cpu_throttled_share"]) == (2, "affinity", None)
    m = host_metrics(_host_records(mem=64 * GB), None, {TRAINER}, TRAINER, WHYIDLE)
    assert (m["cores_usable"], m["cores_limit_by"], m["mem_limit_bytes"]) == (4, None, None)  # above the machine's
    # runs recorded before the limits were: whyidle's own affinity
    old = [r for r in _host_records() if r["k"] != "host_proc"]
    old[0]["cpu_affinity"] = 2
    m = host_metrics(old, None, {TRAINER}, TRAINER, WHYIDLE)
    assert (m["cores_usable"], m["cores_limit_by"]) == (2, "affinity")


# -- the rules -----------------------------------------------------------------------------------

def _limited(host: dict, usable, why, **more) -> dict:
    host.update(cores_usable=usable, cores_limit_by=why, **more)
    return host


def test_cpu_contention_tells_a_quota_throttle_from_run_queue_contention():
    # the same 30 % run-queue wait, other processes busy on the machine
    top = [{"pid": 7, "command": "stress -c 4", "cores": 3.2}]
    plain = rules.cpu_contention(make_facts(make_step(), make_host(cores=64, run_delay=0.3, others=3.5), top_others=top))
    assert plain["evidence"]["cause"] == "other_processes"
    host = _limited(make_host(cores=64, run_delay=0.3, others=3.5), 4.0, "cgroup quota", cpu_quota=4.0,
                    cpu_throttled_share=0.6, cpu_throttled_s=12.0)
    f = rules.cpu_contention(make_facts(make_step(), host, top_others=top))
    assert f["evidence"]["cause"] == "cpu_quota" and f["severity"] == "critical"
    assert f["evidence"]["cpu_throttled_share"] == 0.6 and f["evidence"]["cores"] == 4.0
    assert "allows 4 CPUs and used it up in 60% of the quota's periods (12.0 s throttled)" in f["summary"]
    assert "raise the limit" in f["fix"]["text"] and "4 busy threads in all" in f["fix"]["text"]
    assert "(up to 1.4×)" in f["fix"]["text"] and f["est_speedup"] is None  # depends on the limit set
    # a quota that was rarely used up: the wait is the run queue's
    host["cpu_throttled_share"] = 0.05
    assert rules.cpu_contention(make_facts(make_step(), host, top_others=top))["evidence"]["cause"] == "other_processes"
    # oversubscription on the usable cores, not the machine's: 8 threads on 64 cores would fit
    host = _limited(make_host(cores=64, run_delay=0.2), 4.0, "affinity")
    f = rules.cpu_contention(make_facts(make_step(), host))
    assert f["evidence"]["cause"] == "oversubscription"
    assert "compete for 4 usable cores (affinity)" in f["summary"]
    assert "torch.set_num_threads(4)" in f["fix"]["code"]


def test_worker_model_keeps_to_the_usable_cores():
    # a CPU-bound loader on a 64-core node with a 4-CPU quota: 4 workers, not 64
    step = make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, mean=1.0, data_cpu_share=0.9)
    facts = make_facts(step, make_host(cores=64), make_loader(nw=0))
    assert rules.suggested_workers(facts) == 12  # ⌈0.9 / 0.1 × 1.25⌉ below 64 cores
    facts.host = _limited(make_host(cores=64), 4.0, "cgroup quota")
    model = rules.loader_model(facts)
    assert model["workers"] == 4 and model["limit"] == "cores"
    f = rules.input_bound(facts)
    assert f["evidence"]["cores"] == 4.0 and f["evidence"]["cores_limit_by"] == "cgroup quota"
    assert f["evidence"]["suggested_num_workers"] == 4
    worker = next(o for o in f["fix"]["options"] if "num_workers" in (o["code"] or ""))
    assert "the job may use 4 cores here: its cgroup quota" in worker["condition"]
    # one usable core: one worker, and its estimate counts one core's CPU
    facts.host = _limited(make_host(cores=64), 1, "affinity")
    assert rules.suggested_workers(facts) == 1
    assert rules.loader_model(facts)["est_speedup"] < 1.2


def test_a_worker_count_over_the_memory_limit_is_not_suggested():
    # I/O-bound: 8 workers wanted; each worker up to 1 GB, the job 3 GB, the limit 8 GB: 0.9 × 8 − 3
    # leaves 4.2 GB, 4 more workers beside the 2 there are
    step = make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, mean=1.0)
    host = make_host(cores=16, workers=2, worker_busy=0.1)
    facts = make_facts(step, host, make_loader(nw=2))
    assert rules.suggested_workers(facts) > 6
    host.update(mem_limit_bytes=8 * GB, worker_rss_max_bytes=GB, tree_rss_max_bytes=3 * GB)
    model = rules.loader_model(facts)
    assert model["memory_cap"] == 6 and model["workers"] == 6
    f = rules.input_bound(facts)
    assert f["evidence"]["suggested_num_workers"] == 6 and f["evidence"]["max_workers_by_memory"] == 6
    assert "at most 6 workers fit" in f["fix"]["text"]
    # no room for one more: no worker advice
    host.update(tree_rss_max_bytes=7 * GB)
    f = rules.input_bound(facts)
    assert f["evidence"]["suggested_num_workers"] == 2
    assert "No more workers fit the memory" in f["summary"]
    assert not any("num_workers=3" in (o["code"] or "") for o in f["fix"]["options"])
    # no worker ran: its memory is unknown, said so, and not capped
    facts = make_facts(make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, mean=1.0),
                       make_host(cores=16), make_loader(nw=0))
    facts.host.update(mem_limit_bytes=8 * GB)
    model = rules.loader_model(facts)
    assert model["memory_cap"] is None and "not measured" in model["memory_note"]
    # and tune keeps its neighbouring counts under the cap too
    report = {"framework": "torch", "loader": {"num_workers": 2}, "metrics": {"host": {"cores_usable": 16}},
              "findings": [{"id": "input_bound", "severity": "critical", "est_speedup": 1.5, "fix": {"options": []},
                            "evidence": {"cause": "too_few_workers", "suggested_num_workers": 3,
                                         "max_workers_by_memory": 3}}]}
    cands = plan.candidates(report, plan.job_cores(report, 64), None)
    assert all(c.settings["num_workers"] <= 3 for c in cands if "num_workers" in c.settings)


def test_tune_keeps_counts_to_the_jobs_usable_cores():
    report = {"metrics": {"host": {"cores": 64, "cores_usable": 4.0}}}
    assert plan.job_cores(report, 64) == 4
    assert plan.job_cores({"metrics": {"host": {"cores": 64, "cores_usable": 1.5}}}, 64) == 1
    assert plan.job_cores({}, 2.0) == 2
    # a job throttled by a 2-CPU quota on 64 cores: tune tries the threads the quota covers
    report = {"framework": "torch", "metrics": {"host": {"cores": 64, "cores_usable": 2.0}},
              "findings": [{"id": "cpu_contention", "severity": "critical", "est_speedup": None,
                            "evidence": {"cause": "cpu_quota", "intra_op_threads": 64, "processes": 1}}]}
    (cand,) = plan.candidates(report, plan.job_cores(report, 64), None)
    assert cand.settings == {"threads": 2} and cand.origin == "cpu_contention"
