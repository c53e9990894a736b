"""A synthetic run directory (``docs/run-format.md``) for renderer tests and benchmarks.

:func:`write_run` writes ``meta.json``, ``host.jsonl``, ``proc-<pid>.jsonl`` and ``gpu.jsonl``
for an input-bound PyTorch-like loop (data wait ~half the step, one DataLoader worker), fast
enough for 100,000 steps. Nothing here runs a framework.
"""

from __future__ import annotations

import json
import os
import random

MS = 1_000_000
T0 = 1_000_000_000_000  # monotonic ns of the run's origin
TRAINER, WORKER, WHYIDLE = 4242, 4243, 4240


def _dump(f, rec: dict) -> None:
    f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def write_run(path, steps: int = 60, gpu: bool = False, command: list[str] | None = None,
              site: str = "train.py:40 __getitem__", interval_s: float = 0.25, seed: int = 0,
              epoch_steps: int = 25, workers: int = 0, ph: bool = False) -> str:
    """Writes a run directory at ``path`` and returns it.

    Steps take ~50 ms (data ~25, forward 12, backward 9, optimizer 1, rest 3 ms, with noise);
    every ``epoch_steps``-th step holds an epoch boundary (slower). ``workers``: DataLoader worker
    processes (0 or 1; with 0 the trainer loads and uses about one core). ``gpu`` adds one fake H200 with
    NVML utilization samples every 1/6 s and GPM windows every 0.25 s. ``site`` names the
    hottest data-loading source line of the stack samples. ``ph`` gives each step phase spans like a
    real PyTorch step's (8 per step: data, other, forward, other, backward, other, optimizer, other).
    """
    rng = random.Random(seed)
    path = str(path)
    os.makedirs(path, exist_ok=True)
    command = command or ["python", "train.py"]
    t = T0 + 400 * MS  # the trainer starts after imports
    step_recs = []
    for i in range(steps):
        data = int((25 + rng.gauss(0, 3)) * MS)
        fwd, bwd, opt = int((12 + rng.gauss(0, 1)) * MS), int((9 + rng.gauss(0, 1)) * MS), 1 * MS
        rest = int(3 * MS)
        boundary = i > 0 and i % epoch_steps == 0
        if i == 0:
            data += 300 * MS  # the first batch starts the worker
        if boundary:
            data += 60 * MS
        dur = data + fwd + bwd + opt + rest
        rec = {"k": "step", "t": t + dur, "i": i, "t0": t, "t1": t + dur, "by": "optimizer",
               "data": max(0, data), "fwd": fwd, "bwd": bwd, "opt": opt, "eval": 0, "batches": 1,
               "samples": 32, "cpu": dur // 2, "data_cpu": 0, "boundary": boundary}
        if ph:  # [code, µs after t0, ...]: 1 data, 2 forward, 3 backward, 4 optimizer, 6 other
            spans, off = [], 0
            for code, d in ((1, max(0, data)), (6, rest // 6), (2, fwd), (6, rest // 6), (3, bwd), (6, rest // 6), (4, opt),
                            (6, None)):
                spans += [code, off // 1000]
                off += d or 0
            rec["ph"] = spans
        step_recs.append(rec)
        t += dur
    end = t + 200 * MS
    meta = {"format": "whyidle.run/1", "tool_version": "0.1.0", "name": "synthetic", "command": command,
            "run_dir": path, "cwd": "/work/project", "hostname": "vm", "cpu_count": 2,
            "started_utc": "2026-01-01T00:00:00+00:00",
            "anchors": [{"monotonic_ns": T0, "time_ns": 1_767_225_600_000_000_000}], "interval_s": interval_s,
            "stack_hz": 100.0, "whyidle_pid": WHYIDLE, "python": "3.11.7", "root_pid": TRAINER,
            "ended_utc": "2026-01-01T00:01:00+00:00", "end_t": end, "wall_s": round((end - T0) / 1e9, 3),
            "exit_code": 0, "signal": None, "interrupted": False}
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f)

    with open(os.path.join(path, "proc-%d.jsonl" % TRAINER), "w") as f:
        _dump(f, {"k": "proc", "t": T0 + 300 * MS, "pid": TRAINER, "ppid": WHYIDLE, "argv": command[1:],
                  "python": "3.11.7", "framework": "torch", "framework_version": "2.13.0+cpu", "cuda_build": None,
                  "threads": 2})
        _dump(f, {"k": "loader", "t": T0 + 400 * MS, "id": 1, "num_workers": workers, "pin_memory": False,
                  "persistent_workers": False, "prefetch_factor": 2, "batch_size": 32, "dataset": "Images",
                  "dataset_len": 3200, "mp_context": None, "worker_init_fn": False, "iterable": False,
                  "sampler": "RandomSampler", "collate_fn": "default_collate", "drop_last": True})
        flush_every = max(1, steps // 50)
        for n, rec in enumerate(step_recs):
            _dump(f, rec)
            if n % flush_every == flush_every - 1:
                k = flush_every
                _dump(f, {"k": "stacks", "t": rec["t1"], "hz": 100.0, "n": 5 * k, "mode": "signal", "sites": [
                    ["data", site, "PIL/Image.py:2440 resize", 3 * k, 30.0 * k, ["train.py:90 main"]],
                    ["forward", "model.py:12 forward", "torch/nn/modules/conv.py:560 _conv_forward", k, 10.0 * k, []],
                    ["other", "train.py:95 main", "train.py:95 main", k, 3.0 * k, []]]})
        _dump(f, {"k": "exit", "t": end})

    ticks = []
    tt = T0
    busy = [0.0, 0.0]
    cpu = {TRAINER: 0.0, WORKER: 0.0, WHYIDLE: 0.0}
    user = 0.0
    while tt <= end:
        dt = interval_s
        started = tt > T0 + 300 * MS
        cpu[WHYIDLE] += 0.01 * dt
        if started:
            cpu[TRAINER] += (0.55 if workers else 0.95) * dt * (1 + rng.uniform(-0.05, 0.05))
            cpu[WORKER] += 0.9 * dt * (1 + rng.uniform(-0.1, 0.1)) if workers else 0.0
        other = 0.05 * dt
        used = cpu[TRAINER] + cpu[WORKER] + cpu[WHYIDLE]
        busy = [used * 0.5 + other * tt / end, used * 0.5]
        user = sum(busy)
        procs = [[WHYIDLE, 1, round(cpu[WHYIDLE], 3), 30_000_000, 2, 10, 0, 0, 0, 0, 0, 0.0]]
        if started:
            procs.append([TRAINER, WHYIDLE, round(cpu[TRAINER], 3), 400_000_000 + int(tt - T0) // 100, 3, 10, 2,
                          0, 0, 1000, 1000, 0.0])
            if workers:
                procs.append([WORKER, TRAINER, round(cpu[WORKER], 3), 200_000_000, 1, 10, 2, 1000, 1000, 0, 0, 0.0])
        ticks.append({"k": "host", "t": tt, "cpu": {"user": user, "system": 0.0, "idle": 100.0, "iowait": 0.0},
                      "percpu_busy_s": [round(b, 4) for b in busy], "ctx": 0, "disk_read_bytes": 0,
                      "mem_used_bytes": 2_000_000_000 + int(tt - T0) // 50, "psi_cpu_us": None, "psi_io_us": None,
                      "procs": procs})
        tt += int(dt * 1e9)
    with open(os.path.join(path, "host.jsonl"), "w") as f:
        _dump(f, {"k": "host_static", "t": T0, "cpu_count": 2, "cpu_count_physical": 2,
                  "mem_total_bytes": 16 * 2**30, "clk_tck": 100, "boot_time_s": 1.0})
        _dump(f, {"k": "host_proc", "t": T0, "pid": WHYIDLE, "ppid": 1, "name": "whyidle", "cmdline": ["whyidle"]})
        _dump(f, {"k": "host_proc", "t": T0 + 300 * MS, "pid": TRAINER, "ppid": WHYIDLE, "name": "python",
                  "cmdline": command[:12]})
        if workers:
            _dump(f, {"k": "host_proc", "t": T0 + 300 * MS, "pid": WORKER, "ppid": TRAINER, "name": "python",
                      "cmdline": command[:12]})
        for rec in ticks:
            _dump(f, rec)

    with open(os.path.join(path, "gpu.jsonl"), "w") as f:
        if not gpu:
            _dump(f, {"k": "gpu_notice", "t": T0, "msg": "NVML not available: NVML Shared Library Not Found"})
            return path
        _dump(f, {"k": "gpu_static", "t": T0, "ts_domain": "epoch", "cuda_visible_devices": None, "devices": [
            {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "memory_total_bytes": 141 * 2**30,
             "compute_capability": [9, 0], "driver_version": "560.35", "cuda_driver_version": 12060,
             "gpm_supported": True}]})
        tt, last = T0, T0
        samples = []
        while tt <= end:
            samples.append([tt, 30 + int(40 * rng.random()), 0])
            tt += int(1e9 / 6)
            if tt - last >= 1e9 or tt > end:
                _dump(f, {"k": "gpu_util", "t": tt, "dev": 0, "type": "gpu", "samples": samples})
                _dump(f, {"k": "gpu_state", "t": tt, "dev": 0, "mem_used_bytes": 20 * 2**30,
                          "mem_total_bytes": 141 * 2**30, "sm_clock_mhz": 1980, "power_w": 300.0,
                          "clocks_event_reasons": 0, "util_pct": samples[-1][1], "mem_util_pct": 10})
                samples, last = [], tt
        tt = T0
        while tt + 250 * MS <= end:
            _dump(f, {"k": "gpm", "t": tt + 250 * MS, "dev": 0, "t0": tt, "t1": tt + 250 * MS,
                      "sm_active": round(0.2 + 0.2 * rng.random(), 3), "sm_occupancy": 0.1,
                      "tensor_active": round(0.05 * rng.random(), 3), "dram_active": 0.1, "gr_active": 0.5,
                      "fp16_active": 0.0, "fp32_active": 0.1, "pcie_tx_mib_per_s": 1.0, "pcie_rx_mib_per_s": 1.0})
            tt += 250 * MS
    return path


def write_job(root, nodes: int, ranks_per_node: int, steps: int = 60, late: int | None = None,
              late_ms: float = 20.0, summaries: bool = False, full=None) -> list[str]:
    """The node run directories of one synthetic multi-node ``torchrun`` job (one per node under
    ``root``; :func:`write_run`'s trainer as every rank, with the same pids on every node as on
    separate machines), each rank's ``proc`` record with its ``dist`` identity and a ``colls``
    record: ``late`` (a rank) arrives ``late_ms`` late at every step's gradient all-reduce, so
    every other rank waits that long in it. Returns the directories, node 0 first.

    ``summaries``: each node also gets the rank summaries whyidle writes at the end of a node's
    run (``ranks.json``, ``ranks.npy``: :func:`whyidle.pipeline.summarize_ranks` of the node's
    records, written by :func:`whyidle.record.rank_summary.write`). ``full``: the ranks written
    with all their records (default every rank); the others (with ``summaries`` only) keep their
    records but the steps, stack samples and collectives on disk (a few hundred bytes instead of
    ~480 bytes per step: 1,024 ranks of 36,000 steps would be 18 GB), and their summaries stand for
    the rest: the summary whyidle makes of the node's trainer (:func:`whyidle.analysis.ranks.summary`
    of its step records, which every rank of a node shares here) with the rank's own records
    and its time in collectives per step (``late_ms`` less for the late rank, as its ``colls`` rows say).
    """
    if full is not None and not summaries:
        raise ValueError("ranks without their step records need summaries=True")
    world = nodes * ranks_per_node
    dirs = []
    for node in range(nodes):
        path = write_run(os.path.join(str(root), f"node{node}"), steps=steps, seed=node)
        src = os.path.join(path, "proc-%d.jsonl" % TRAINER)
        with open(src) as f:
            lines = [json.loads(line) for line in f]
        template = _node_summary(src, lines) if full is not None else None
        os.remove(src)
        made, kept = [], []
        for local in range(ranks_per_node):
            rank = node * ranks_per_node + local
            pid = TRAINER + 10 * local
            dist = {"rank": rank, "local_rank": local, "world_size": world, "node": node,
                    "local_world_size": ranks_per_node, "run_id": "job-1", "master_addr": "10.0.0.1",
                    "master_port": 29500}
            lag = int((0.5 + (0 if rank == late or late is None else late_ms)) * MS)
            whole = full is None or rank in full
            with open(os.path.join(path, "proc-%d.jsonl" % pid), "w") as f:
                for rec in lines:
                    if rec["k"] == "proc":
                        rec = dict(rec, pid=pid, dist=dist)
                    if rec["k"] == "exit" and whole:
                        _dump(f, {"k": "colls", "t": rec["t"], "rows": [[i, 0, 0, -1, 0, 1, lag] for i in range(steps)]})
                    if whole or rec["k"] not in ("step", "stacks"):
                        _dump(f, rec)
            if whole:
                kept.append(pid)
            else:
                made.append(_rank_summary(path, pid, dist, lines, template, steps, lag))
        if summaries:
            _write_summaries(path, kept, made)
        dirs.append(path)
    return dirs


def _node_summary(src: str, lines: list[dict]) -> dict:
    """whyidle's summary of the node's trainer (:func:`whyidle.analysis.ranks.summary`), from its
    step records as the reader takes them."""
    from whyidle.analysis import ranks, steps
    from whyidle.record.reader import read_jsonl
    from whyidle.record.steptable import StepTable

    table = StepTable()
    records, _ = read_jsonl(src, steps=table)
    return ranks.summary(records, steps.steps_of(table))


def _rank_summary(path: str, pid: int, dist: dict, lines: list[dict], template: dict, steps: int, lag: int):
    """The summary of a rank written without its step records: ``template``'s figures, the rank's
    own records (:func:`whyidle.analysis.ranks.summary` of them), ``lag`` ns in collectives per step."""
    import numpy as np

    from whyidle.analysis import ranks
    from whyidle.record import rank_summary

    own = ranks.summary([dict(r, pid=pid, dist=dist) if r["k"] == "proc" else r for r in lines if r["k"] != "step"], [])
    size, mtime_ns = rank_summary.source_stamp(rank_summary.proc_file(path, pid))
    return rank_summary.RankSummary(
        pid=pid, size=size, mtime_ns=mtime_ns, records=own["records"], problems=[], figures=template["figures"],
        other=template["other"], steps=template["steps"], trains=template["trains"],
        wait_steps=np.arange(steps, dtype=np.int64), wait_ns=np.full(steps, lag, dtype=np.int64))


def _write_summaries(path: str, kept: list[int], made: list) -> None:
    """The node's rank summaries as whyidle writes them (those of the ranks in ``kept`` from their
    records, :func:`whyidle.pipeline.summarize_ranks`) beside ``made``."""
    from whyidle.analysis.ranks import SUMMARY_VERSION
    from whyidle.pipeline import summarize_ranks
    from whyidle.record import rank_summary
    from whyidle.record.reader import load_run

    if kept:
        made = summarize_ranks(load_run(path, read_proc=lambda pid: pid in kept, samples=False)) + made
    rank_summary.write(path, made, SUMMARY_VERSION)
