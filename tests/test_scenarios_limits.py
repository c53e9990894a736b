"""Jobs that may use fewer cores than the machine has (issue 31, part 3), under ``whyidle run``.

C01's input-bound loop (one DataLoader worker that cannot keep up; its samples mostly sleep on a
read latency, so more workers overlap it even on one core) run twice on one CPU:

- ``taskset -c 0`` put inside the observed command (``whyidle run -- taskset -c 0 python ...``):
  whyidle itself may use both cores; the trainer, recorded per process, one.
- a cgroup CPU quota of 1 CPU (v1 ``cpu.cfs_quota_us`` = ``cpu.cfs_period_us``, or v2 ``cpu.max``)
  holding ``whyidle run`` and so the whole job, as a one-CPU container does.

Each report must say 1 usable core with its reason, keep its worker and thread advice to that
core, and the suggested worker count, run under the same limit, must measure about the estimated
gain. Measured on the 2-core dev box (2026-12-04), 60 steps, ``--tc 0.02`` (a fixed 2 ms read per
sample), faulty and fixed both under ``whyidle run``, while other sessions' jobs used 0.7-1.4 cores:

- ``taskset -c 0``: input_bound, 3 workers suggested (no thread change), est. 2.43× / 2.33×,
  measured 2.47× / 2.85× (+2 %, +22 %).
- 1-CPU quota: input_bound, 3 workers, est. 2.57× / 2.76×, measured 2.80× / 2.99× (+9 %, +8 %).
- In a third round other processes took 1.3 cores: both runs' verdict was cpu_contention (the
  workers waited for the core), whose fix input_bound then prints.

Before ``ONE_CORE_EFFICIENCY`` (the cores term divided by 0.85 as on several cores) the estimates
were 3-38 % (taskset, 5 runs) and 8-21 % (quota, 3 runs) below the measured fix.

contention.py's 2-thread loop in a cgroup allowed 0.5 CPU: ``cpu_contention`` cause ``cpu_quota``
in 7 of 7 runs (throttled in 51-100 % of the quota's periods, other processes 0.8-1.4 cores busy,
which the finding named instead before), run-queue wait 75 %, "up to 4.0×" with a limit that
covers the threads; run without the quota: 4.4× (twice, idle box), 1.2-1.6× with the box busy.

The ratios are asserted loosely (shared, noisy machine); the cgroup tests are skipped where no
cgroup with a CPU controller can be made (not root, or neither hierarchy writable).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time

import pytest

from conftest import SCENARIOS, finding, observe

pytestmark = [pytest.mark.slow, pytest.mark.timing]

C01 = os.path.join(SCENARIOS, "c01_too_few_workers.py")
CONTENTION = os.path.join(SCENARIOS, "contention.py")
#: T_c for C01's read latency (0.1 × T_c per sample): fixed, so both variants read alike.
TC = "0.02"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def cpu_quota_cgroup(cpus: float = 1.0):
    """A new cgroup allowed ``cpus`` CPUs per second (v1 ``cpu`` hierarchy, else v2); yields its
    ``cgroup.procs`` file. Processes left in it are moved to its parent and it is removed after.
    Skips the test with the reason where none can be made."""
    name = f"whyidle-test-{os.getpid()}"
    v1 = next((os.path.join("/sys/fs/cgroup", d) for d in ("cpu", "cpu,cpuacct")
               if os.path.exists(os.path.join("/sys/fs/cgroup", d, "cpu.cfs_quota_us"))), None)
    v2 = "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/cgroup.subtree_control") else None
    parent = v1 or v2
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no writable cgroup CPU controller (v1 /sys/fs/cgroup/cpu or a v2 /sys/fs/cgroup): "
                    "making a CPU quota needs root and a cgroup file system this process may write")
    path = os.path.join(parent, name)
    try:
        if v1:
            os.mkdir(path)
            _write(os.path.join(path, "cpu.cfs_period_us"), "100000")
            _write(os.path.join(path, "cpu.cfs_quota_us"), str(int(cpus * 100000)))
        else:
            _write(os.path.join(parent, "cgroup.subtree_control"), "+cpu")
            os.mkdir(path)
            _write(os.path.join(path, "cpu.max"), f"{int(cpus * 100000)} 100000")
    except OSError as e:
        if os.path.isdir(path):
            os.rmdir(path)
        pytest.skip(f"could not make a cgroup with a CPU quota under {parent}: {e}")
    try:
        yield os.path.join(path, "cgroup.procs")
    finally:
        for _ in range(50):
            with open(os.path.join(path, "cgroup.procs")) as f:
                left = f.read().split()
            for pid in left:
                with contextlib.suppress(OSError):
                    _write(os.path.join(parent, "cgroup.procs"), pid)
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)


def _run(tmp_path, args, name, **kwargs):
    proc, report, _ = observe(tmp_path, args, name=name, timeout=240, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None
    return report


def _check_one_core(report, why: str) -> dict:
    """The report says 1 usable core (``why``) and its advice keeps to it; returns input_bound."""
    host = report["metrics"]["host"]
    assert host["cores"] == os.cpu_count() and host["cores_usable"] == 1 and host["cores_limit_by"] == why
    assert report["verdict"] == "input_bound"
    f = finding(report, "input_bound")
    assert f["evidence"]["cause"] == "too_few_workers" and f["evidence"]["cores"] == 1
    # the workers mostly sleep on reads: a few overlap them on one core, not 4 per machine core
    assert 2 <= f["evidence"]["suggested_num_workers"] <= 4
    assert not f["evidence"]["suggested_threads"] or f["evidence"]["suggested_threads"] == 1
    assert f"num_workers={f['evidence']['suggested_num_workers']}" in f["fix"]["code"]
    condition = next(o["condition"] for o in f["fix"]["options"] if "num_workers" in (o["code"] or ""))
    assert condition is None or "the job may use 1 core here" in condition
    return f


def _measured(f, faulty, fixed) -> float:
    ratio = fixed["metrics"]["samples_per_s"] / faulty["metrics"]["samples_per_s"]
    assert fixed["metrics"]["host"]["cores_usable"] == 1
    assert ratio >= 1.5
    assert 0.6 <= ratio / f["est_speedup"] <= 1.6, (ratio, f["est_speedup"])  # measured 0.8-1.0 (docstring)
    return ratio


@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and at least 2 CPUs")
def test_c01_under_taskset_one_core(tmp_path):
    cpu = str(min(os.sched_getaffinity(0)))
    faulty = _run(tmp_path, ["taskset", "-c", cpu, sys.executable, C01, "--steps", "60", "--tc", TC], "faulty")
    f = _check_one_core(faulty, "affinity")
    workers = str(f["evidence"]["suggested_num_workers"])
    fixed = _run(tmp_path, ["taskset", "-c", cpu, sys.executable, C01, "--fixed", "--workers", workers, "--steps", "60",
                            "--tc", TC], "fixed")
    _measured(f, faulty, fixed)


@pytest.mark.skipif(os.cpu_count() < 2, reason="a 1-CPU quota limits nothing on a 1-CPU machine")
def test_c01_under_a_one_cpu_cgroup_quota(tmp_path):
    with cpu_quota_cgroup(1.0) as procs:
        def enter():  # whyidle and the job in the cgroup, as in a one-CPU container
            _write(procs, str(os.getpid()))

        faulty = _run(tmp_path, [sys.executable, C01, "--steps", "60", "--tc", TC], "faulty", preexec_fn=enter)
        f = _check_one_core(faulty, "cgroup quota")
        assert faulty["metrics"]["host"]["cpu_quota"] == 1.0
        workers = str(f["evidence"]["suggested_num_workers"])
        fixed = _run(tmp_path, [sys.executable, C01, "--fixed", "--workers", workers, "--steps", "60", "--tc", TC],
                     "fixed", preexec_fn=enter)
    _measured(f, faulty, fixed)


@pytest.mark.skipif(os.cpu_count() < 2, reason="needs 2 CPUs for the job's 2 threads")
def test_a_job_throttled_by_its_quota_is_told_from_other_processes(tmp_path):
    """contention.py's healthy 2-thread loop, moved by a wrapper into a cgroup allowed half a CPU
    (whyidle outside it): its training thread waits most of the time, and on this shared machine
    other processes are busy too; the wait is the quota's (cpu.stat: throttled in most periods)."""
    with cpu_quota_cgroup(0.5) as procs:
        report = _run(tmp_path, ["sh", "-c", f'echo $$ > {procs} && exec "$0" "$@"', sys.executable, CONTENTION,
                                 "--steps", "60"], "throttled")
    host = report["metrics"]["host"]
    assert host["cores_usable"] == 0.5 and host["cores_limit_by"] == "cgroup quota"
    assert host["cpu_throttled_share"] >= 0.5
    assert report["verdict"] == "cpu_contention"
    f = finding(report, "cpu_contention")
    assert f["evidence"]["cause"] == "cpu_quota" and f["est_speedup"] is None
    assert "allows 0.5 CPUs" in f["summary"] and "1 busy thread in all" in f["fix"]["text"]
