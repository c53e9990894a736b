"""The samplers of a run, and the helper process that runs them beside an observed process.

``whyidle run`` polls from its own process, the parent of the command. ``whyidle.watch()`` and
the ``%%whyidle`` cell magic observe the process they run in (a notebook kernel, a script): they
start this module as a helper process (``python -m whyidle.sampling.helper RUN_DIR PID INTERVAL``),
which polls that process's tree (DataLoader workers included), the machine and the GPUs from
outside, so that no psutil or NVML call takes the training process's GIL. The helper starts its
own session (a kernel interrupt, sent to the kernel's process group, does not reach it), prints
``ready`` once its first tick is written, and stops (one last tick, files closed) when its stdin
says ``stop`` or closes: the observed process ended, or was killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from whyidle.record.writer import JsonlWriter
from whyidle.sampling.loop import SamplerLoop

#: NVML's sample buffer is drained at most this often (seconds); its own period is 1/6–1 s, so
#: faster polling only re-reads the same samples (../shared/sampling.md §1.2, §5).
GPU_POLL_MIN_S = 1.0


def start_sampler(run_dir: str, tree_root_pid: int, interval_s: float) -> SamplerLoop:
    """Starts host sampling of ``tree_root_pid``'s tree every ``interval_s`` seconds and GPU
    sampling (NVML, every max(:data:`GPU_POLL_MIN_S`, ``interval_s``) s) into ``run_dir``; without
    a GPU, ``gpu.jsonl`` holds one ``gpu_notice`` saying why. Returns the running loop
    (:meth:`SamplerLoop.stop` ends it). Errors: ``psutil.NoSuchProcess`` when the root is gone."""
    from whyidle.sampling.host import HostPoller
    from whyidle.sampling.nvml import open_gpu_poller

    pollers = [HostPoller(tree_root_pid, interval_s)]
    gpu, gpu_reason = open_gpu_poller(max(GPU_POLL_MIN_S, interval_s))
    if gpu is not None:
        pollers.append(gpu)
    sampler = SamplerLoop(run_dir, pollers)
    if gpu is None:
        notes = JsonlWriter(os.path.join(run_dir, "gpu.jsonl"))
        notes.add({"k": "gpu_notice", "t": time.monotonic_ns(), "msg": gpu_reason or "no GPU"})
        with contextlib.suppress(OSError):  # the sampler meets the same problem and says it
            notes.close()
    sampler.start()
    return sampler


def off_the_job_cores(pid: int) -> None:
    """Moves this process to the machine's CPUs that the observed process ``pid`` may not use (the
    helper inherits the affinity of a pinned kernel): as ``whyidle run``'s sampler, which the job's
    pinning does not bind, it then takes no time from the job's cores. Nothing where there are no
    such CPUs (the job may use them all: the usual case), none is allowed (a cgroup's cpuset) or
    affinity is unsupported."""
    try:
        others = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(pid)
        if others:
            os.sched_setaffinity(0, others)  # the kernel keeps to the CPUs its cgroup allows (EINVAL: none)
    except (AttributeError, OSError):
        pass


def main(argv: list[str]) -> int:
    """``RUN_DIR PID INTERVAL_S``: samples until stdin says ``stop`` or closes. Exit code 0, or 2
    for bad arguments (one line on stderr)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopped by its stdin only
    try:
        run_dir, pid, interval_s = argv[0], int(argv[1]), float(argv[2])
        off_the_job_cores(pid)
        sampler = start_sampler(run_dir, pid, interval_s)
    except Exception as exc:
        sys.stderr.write(f"whyidle sampler: cannot start: {exc}\n")
        return 2
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
    finally:
        sampler.stop()
    if sampler.problem:
        sys.stderr.write(f"whyidle: {sampler.problem}\n")
    with contextlib.suppress(OSError):
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
