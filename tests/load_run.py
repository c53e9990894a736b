"""A run directory as whyidle records a long training job, for load tests and benchmarks/load.py.

:func:`write_run` writes what ``whyidle run`` would leave for ``steps`` training steps of
``step_ms``: the trainer's ``proc-<pid>.jsonl`` is written by whyidle's own agent code, not by an
imitation of it: :class:`whyidle.instrument.torch.TorchInstrument` runs each step's phase calls
(``enter``/``leave`` data, forward, backward, optimizer; ``end_step("optimizer")``) on a simulated
monotonic clock (its ``monotonic_ns`` and ``thread_time_ns`` are replaced while it runs), so the
detail stride (one full ``step`` record per k = ⌈20 ms ÷ step time⌉ steps, the other k − 1 as rows
of ``steps`` records), the ``detail`` records and the order of records are the agent's. Records go
through :class:`whyidle.record.writer.JsonlWriter`, flushed every 0.5 s of simulated time as the
agent's flusher does, with a ``stacks`` record (100 Hz, a dozen sites, as a real 1 ms loop gives)
per flush. The phases follow a real 1.5 ms CPU loop scaled to ``step_ms`` (data 22 %, forward 7 %,
backward 23 %, optimizer 7 %, the rest host code) with ±5 % noise; an epoch ends every 10,000 steps
(``iter`` record, a boundary step). ``cuda`` adds the CUDA timeline the agent keeps once the model is
on a GPU (:class:`whyidle.instrument.cuda.CudaTimeline` with events on the simulated clock: every
step then keeps its phases, full steps and the ones after them get marks, read at each flush as
``gpu_marks`` and ``gpu_step`` records) and a ``gpu.jsonl`` as the NVML sampler writes it (1 s
polls: ``gpu_util`` gpu and mem with 6 driver samples each, ``gpu_state``, ``gpu_counters``, a GPM
window). ``host.jsonl`` holds a ``host`` tick every 0.25 s for whyidle, the trainer and ``workers``
DataLoader workers (real-size values, from a real run) and a ``host_top`` every 2 s; its span is the
steps' span (1,000,000 steps of 1 ms: 1000 s, 4000 ticks; of 86.4 ms: a real 24 h, 345,600 ticks).
Nothing here runs a framework; ~10 µs per simulated step.
"""

from __future__ import annotations

import json
import os
import random
import types

from whyidle.record.writer import JsonlWriter

MS = 1_000_000
S = 1_000_000_000
T0 = 1_000_000_000_000  # monotonic ns of the run's origin (whyidle's start)
WALL0 = 1_767_225_600_000_000_000  # its wall clock (2026-01-01)
WHYIDLE, TRAINER = 4240, 4242
LOADER = 139_868_673_466_960  # id() of the DataLoader, as the agent writes it
FLUSH_S = 0.5  # the agent's flush period (instrument/agent.py FLUSH_PERIOD_S)
HOST_S = 0.25  # the sampler's tick (meta interval_s)
EPOCH_STEPS = 10_000
#: A step's phases as shares of its time, from a real 1.5 ms CPU loop (instrument/torch.py order).
PHASES = (("other", 0.05), ("data", 0.22), ("other", 0.05), ("forward", 0.07), ("other", 0.05),
          ("backward", 0.23), ("other", 0.05), ("optimizer", 0.07))
#: Stack sites of a real short-step loop: (phase, user site, leaf site, weight).
SITES = (("data", "train.py:41 main", "torch/utils/data/_utils/collate.py:275 collate_tensor_fn", 4),
         ("data", "train.py:41 main", "torch/utils/data/dataset.py:206 __getitem__", 3),
         ("data", "train.py:41 main", "torch/utils/data/dataloader.py:757 _next_data", 2),
         ("forward", "train.py:44 main", "torch/nn/modules/linear.py:134 forward", 3),
         ("forward", "model.py:18 forward", "torch/nn/functional.py:1704 relu", 1),
         ("backward", "train.py:46 main", "torch/autograd/graph.py:979 _engine_run_backward", 6),
         ("backward", "train.py:46 main", "torch/autograd/__init__.py:91 _make_grads", 1),
         ("optimizer", "train.py:47 main", "torch/optim/sgd.py:378 _single_tensor_sgd", 3),
         ("optimizer", "train.py:47 main", "torch/optim/optimizer.py:538 wrapper", 1),
         ("other", "train.py:45 main", "torch/_tensor.py:32 wrapped", 2),
         ("other", "train.py:48 main", "train.py:48 main", 3),
         ("other", "train.py:46 main", "torch/utils/hooks.py:36 remove", 1))


def _static_records(t: int, workers: int) -> list[dict]:
    """The trainer's one-off records of a plain PyTorch loop, as a real run writes them."""
    return [
        {"k": "proc", "t": t, "pid": TRAINER, "ppid": WHYIDLE, "argv": ["train.py"], "python": "3.11.7",
         "framework": "torch", "framework_version": "2.13.0+cpu", "cuda_build": None, "threads": 2,
         "started": T0 + 5 * MS, "dist": None},
        {"k": "loader", "t": t, "id": LOADER, "num_workers": workers, "pin_memory": False,
         "persistent_workers": False, "prefetch_factor": 2 if workers else None, "batch_size": 8,
         "dataset": "TensorDataset", "dataset_len": EPOCH_STEPS * 8, "mp_context": None, "worker_init_fn": False,
         "iterable": False, "sampler": "RandomSampler", "collate_fn": "default_collate", "drop_last": False,
         "shard": None, "created": ["train.py:30 main", "train.py:30 main"], "args": {"dataset": "ds", "batch_size": "8"},
         "collate_user": False},
    ]


def _audit_records(t: int, step: int, cuda: bool) -> list[dict]:
    """The records of the first optimizer steps' audits (devices, graph, transfers)."""
    dev = "cuda" if cuda else "cpu"
    recs = [{"k": "devices", "t": t, "step": step, "params": {dev: 4160}, "batch": [dev], "inputs": [dev],
             "cuda_initialized": cuda, "pinned": None, "threads": 1, "param_dtypes": {"float32": 4160},
             "autocast": False, "matmul_tf32": False, "compiled": False, "autocast_dtypes": {}, "cpu_matmul": None,
             "autocast_share": 0.0, "autocast_site": None, "dist": None, "batch_tensors": 2, "batch_bytes": 4096,
             "anomaly_detection": False, "launch_blocking": False, "wrappers": [], "nccl_env": None},
            {"k": "graph", "t": t, "step": step, "nodes": 7},
            {"k": "transfers", "t": t, "step": step, "by": "optimizer", "mb": 1,
             "items": [["train.py:42 main", "train.py:42 main", dev, False, False, True, 2, 4096, 30000]] if cuda else [],
             "reads": [["train.py:49 main", "train.py:49 main", "item", 1]]}]
    return recs


class _FakeEvent:
    """A CUDA event on the simulated clock: the GPU runs ``lag`` behind the host."""

    clock = None

    def record(self) -> None:
        self.g = _FakeEvent.clock[0] + 300_000

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return (other.g - self.g) / 1e6


def _rss_mb() -> float:
    """This process's resident memory now (MB, ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def write_trainer(path: str, steps: int, step_ms: float, cuda: bool, workers: int, seed: int) -> tuple[int, list]:
    """Writes ``proc-<TRAINER>.jsonl`` with the agent's own step recording on a simulated clock.

    Returns the monotonic ns of the last record (the trainer's exit) and this process's RSS (MB)
    after the first 10,000 steps and at the end: the agent's own memory growth over the run."""
    from whyidle.instrument import regions as region_mod
    from whyidle.instrument import torch as tmod
    from whyidle.instrument.cuda import CudaTimeline

    rng = random.Random(seed)
    clock = [T0 + 2 * S]  # imports take 2 s
    cpu = [0]
    writer = JsonlWriter(os.path.join(path, f"proc-{TRAINER}.jsonl"), max_buffered=10**9)

    class Agent:
        run_dir = path

        def __init__(self) -> None:
            self.collectors: list = []
            self.on_exit: list = []

        def record(self, rec: dict) -> None:
            writer.add(rec)

        def notice(self, msg: str) -> None:
            writer.add({"k": "notice", "t": clock[0], "msg": msg})

    fake_torch = types.SimpleNamespace(compiler=types.SimpleNamespace(is_compiling=lambda: False),
                                       is_grad_enabled=lambda: True, __file__="/site-packages/torch/__init__.py")
    saved = tmod.monotonic_ns, tmod.thread_time_ns, region_mod._REGIONS
    tmod.monotonic_ns, tmod.thread_time_ns = (lambda: clock[0]), (lambda: cpu[0])
    region_mod._REGIONS = None
    try:
        agent = Agent()
        for rec in _static_records(clock[0], workers):
            writer.add(rec)
        inst = tmod.TorchInstrument(agent, fake_torch)
        inst.marker = "optimizer"
        if cuda:
            _FakeEvent.clock = clock
            inst.timeline = CudaTimeline(_FakeEvent, clock=lambda: clock[0])
        step_ns = step_ms * MS
        writer.add({"k": "iter", "t": clock[0] + 2 * MS, "loader": LOADER, "t0": clock[0], "t1": clock[0] + 2 * MS})
        clock[0] += 2 * MS
        first = clock[0] + 4 * MS
        writer.add({"k": "iter_first", "t": first, "loader": LOADER, "t0": clock[0], "t1": first})
        inst._begin_step(clock[0])
        next_flush = clock[0] + int(FLUSH_S * S)
        sites = [s for s in SITES]
        weights = [s[3] for s in sites]
        samples_per_flush = int(100 * FLUSH_S)
        for i in range(steps):
            dur = step_ns * (1 + rng.uniform(-0.05, 0.05)) * (1.5 if i % EPOCH_STEPS == 0 else 1.0)
            if i and i % EPOCH_STEPS == 0:  # a new epoch's iterator, inside this step
                writer.add({"k": "iter", "t": clock[0] + 1000, "loader": LOADER, "t0": clock[0], "t1": clock[0] + 1000})
                inst.mark_boundary()
            t_end = clock[0] + int(dur)
            for phase, share in PHASES:
                if phase != "other":
                    inst.enter(phase)
                    if phase == "data" and inst.tracking:  # the DataLoader wrapper, when in
                        inst.batches, inst.samples, inst.loader_key = 1, 8, LOADER
                    if phase == "backward" and inst.tracking:
                        inst.micro = 1
                clock[0] += int(dur * share)
                cpu[0] += int(dur * share * 0.9)
                if phase != "other":
                    inst.leave()
            cpu[0] += int((t_end - clock[0]) * 0.9)
            clock[0] = t_end
            inst.end_step("optimizer")
            if i < 3:
                for rec in _audit_records(clock[0], i, cuda):
                    writer.add(rec)
            if i == min(steps - 1, 10_000):
                rss = [_rss_mb()]
            if i == 2:
                writer.add({"k": "module_calls", "t": clock[0], "steps": 3, "step_s": step_ms / 1000,
                            "preamble_s": 0.0, "root": None, "modules": []})
            if clock[0] >= next_flush:  # the agent's flusher: stacks, CUDA marks, then the file
                counts = [0] * len(sites)
                for k in rng.choices(range(len(sites)), weights, k=samples_per_flush):
                    counts[k] += 1
                writer.add({"k": "stacks", "t": clock[0], "hz": 100.0, "n": samples_per_flush, "mode": "signal",
                            "lost": 0, "lost_s": 0.0, "sites": [
                                [s[0], s[1], s[2], c, round(c * 10.0 + rng.uniform(-0.3, 0.3), 3), []]
                                for s, c in zip(sites, counts) if c]})
                if inst.timeline is not None:
                    for rec in inst.timeline.poll():
                        writer.add(rec)
                writer.flush()
                next_flush += int(FLUSH_S * S)
        inst.flush_lite()  # at exit, as the agent's on_exit does
        if inst.timeline is not None:
            for rec in inst.timeline.poll():
                writer.add(rec)
        clock[0] += 50 * MS
        writer.add({"k": "exit", "t": clock[0]})
        writer.close()
        return clock[0], rss + [_rss_mb()]
    finally:
        tmod.monotonic_ns, tmod.thread_time_ns, region_mod._REGIONS = saved


def write_host(path: str, end: int, workers: int, seed: int) -> None:
    """``host.jsonl`` from T0 to ``end``: the sampler's records with real-size values."""
    rng = random.Random(seed + 1)
    w = JsonlWriter(os.path.join(path, "host.jsonl"))
    pids = [WHYIDLE, TRAINER] + [TRAINER + 1 + k for k in range(workers)]
    w.add({"k": "host_static", "t": T0, "cpu_count": 2, "cpu_model": "AMD EPYC", "cpu_affinity": 2,
           "cpu_count_physical": 2, "mem_total_bytes": 25_275_990_016, "clk_tck": 100, "boot_time_s": 1796230142.0})
    w.add({"k": "host_proc", "t": T0, "pid": WHYIDLE, "ppid": 1, "name": "whyidle",
           "cmdline": ["/work/.venv/bin/python", "/work/.venv/bin/whyidle", "run", "--", "python", "train.py"]})
    for pid in pids[1:]:
        w.add({"k": "host_proc", "t": T0 + 2 * S, "pid": pid, "ppid": WHYIDLE if pid == TRAINER else TRAINER,
               "name": "python", "cmdline": ["python", "train.py"]})
    cpu = {"user": 44136.3, "nice": 29.91, "system": 5960.54, "idle": 86500.5, "iowait": 268.06, "irq": 0.0,
           "softirq": 238.92, "steal": 208.25, "guest": 0.0, "guest_nice": 0.0}
    busy = [20969.14, 29604.74]
    ctx, disk, psi_cpu, psi_io = 70_973_877, 65_101_431_808, 7_488_769_523, 295_593_849
    proc = {pid: [pid, 1 if pid == WHYIDLE else (WHYIDLE if pid == TRAINER else TRAINER), 0.11, 142_934_016, 2,
                  30, 5, 831_488, 3_185_714, 72_677, 72_677, 0.0] for pid in pids}
    t, n = T0, 0
    while t <= end:
        dt = HOST_S
        for key, rate in (("user", 1.6), ("system", 0.2), ("idle", 0.2), ("iowait", 0.01), ("softirq", 0.01)):
            cpu[key] = round(cpu[key] + rate * dt * (1 + rng.uniform(-0.1, 0.1)), 2)
        busy = [round(b + 0.9 * dt * (1 + rng.uniform(-0.1, 0.1)), 2) for b in busy]
        ctx += int(8000 * dt * (1 + rng.uniform(-0.2, 0.2)))
        disk += int(3e7 * dt * rng.random())
        psi_cpu += int(80_000 * dt * rng.random())
        psi_io += int(300_000 * dt * rng.random())
        running = t >= T0 + 2 * S
        for pid, r in proc.items():
            if pid != WHYIDLE and not running:
                continue
            r[2] = round(r[2] + (0.02 if pid == WHYIDLE else 0.9) * dt * (1 + rng.uniform(-0.05, 0.05)), 2)
            r[3] = 142_934_016 + rng.randrange(0, 4096) * 4096
            r[5] += rng.randrange(5, 40)
            r[6] += rng.randrange(0, 300)
            r[8] += rng.randrange(10_000, 2_000_000)
            r[9] += rng.randrange(100_000, 20_000_000)
            r[10] = r[9] - rng.randrange(0, 100_000)
        w.add({"k": "host", "t": t, "cpu": dict(cpu), "percpu_busy_s": busy, "ctx": ctx, "disk_read_bytes": disk,
               "mem_used_bytes": 607_784_960 + rng.randrange(0, 10_000) * 4096, "psi_cpu_us": psi_cpu,
               "psi_io_us": psi_io,
               "procs": [list(proc[pid]) for pid in pids if pid == WHYIDLE or running]})
        if n % 8 == 7:  # host_top every 2 s
            w.add({"k": "host_top", "t": t, "t0": t - 2 * S, "t1": t, "total_cpu_s": 0.05,
                   "procs": [[73, "kdamond.0", 0.02], [25926, "bash 3", 0.01], [22, "ksoftirqd/1", 0.01]],
                   "yielding_cpu_s": 0, "yielding_procs": []})
        if n % 400 == 0:
            w.flush()
        t += int(dt * S)
        n += 1
    w.close()


def write_gpu(path: str, end: int, cuda: bool, seed: int) -> None:
    """``gpu.jsonl``: one notice without a GPU, else the NVML sampler's 1 s polls of one H200."""
    rng = random.Random(seed + 2)
    w = JsonlWriter(os.path.join(path, "gpu.jsonl"))
    if not cuda:
        w.add({"k": "gpu_notice", "t": T0, "msg": "NVML not available: NVML Shared Library Not Found"})
        w.close()
        return
    w.add({"k": "gpu_static", "t": T0, "ts_domain": "epoch", "cuda_visible_devices": None, "devices": [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-5f0e3c1a-7b2d-4c1e-9a8f-0d1c2b3a4e5f",
         "memory_total_bytes": 150_754_820_096, "compute_capability": [9, 0], "driver_version": "560.35.03",
         "cuda_driver_version": 12060, "gpm_supported": True}]})
    w.add({"k": "gpu_limits", "t": T0, "dev": 0, "sm_clock_max_mhz": 1980, "power_limit_w": 700.0,
           "power_limit_default_w": 700.0, "power_limit_max_w": 700.0})
    t, n, throttle = T0 + S, 0, 0
    while t <= end:
        for kind in ("gpu", "mem"):
            w.add({"k": "gpu_util", "t": t, "dev": 0, "type": kind, "samples": [
                [t - S + j * S // 6, 30 + rng.randrange(40), (WALL0 + t - S + j * S // 6) // 1000] for j in range(6)]})
        w.add({"k": "gpu_state", "t": t, "dev": 0, "mem_used_bytes": 21_474_836_480 + rng.randrange(1000) * 2**20,
               "mem_total_bytes": 150_754_820_096, "sm_clock_mhz": 1980, "power_w": round(300 + 50 * rng.random(), 3),
               "clocks_event_reasons": 0, "util_pct": 30 + rng.randrange(40), "mem_util_pct": 10 + rng.randrange(10)})
        throttle += rng.randrange(0, 1000)
        w.add({"k": "gpu_counters", "t": t, "dev": 0, "throttle_ns": {"SwPowerCap": throttle, "SyncBoost": 0,
               "SwThermalSlowdown": 0, "HwThermalSlowdown": 0, "HwPowerBrakeSlowdown": 0},
               "nvml_ts_us": (WALL0 + t) // 1000})
        w.add({"k": "gpm", "t": t, "dev": 0, "t0": t - S, "t1": t, "sm_active": round(0.2 + 0.2 * rng.random(), 4),
               "sm_occupancy": round(0.1 * rng.random(), 4), "tensor_active": round(0.05 * rng.random(), 4),
               "dram_active": round(0.1 * rng.random(), 4), "gr_active": round(0.5 * rng.random(), 4),
               "fp16_active": 0.0, "fp32_active": round(0.1 * rng.random(), 4), "pcie_tx_mib_per_s": 12.5,
               "pcie_rx_mib_per_s": 40.25})
        if n % 100 == 0:
            w.flush()
        t += S
        n += 1
    w.close()


def write_run(path: str, steps: int, step_ms: float = 1.0, cuda: bool = False, workers: int = 2,
              seed: int = 0) -> str:
    """Writes the run directory (see the module's docstring) and returns its path."""
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        os.remove(os.path.join(path, name))
    exit_t, rss = write_trainer(path, steps, step_ms, cuda, workers, seed)
    with open(os.path.join(path, "load-agent.json"), "w") as f:  # not a run file: the readers skip it
        json.dump({"agent_rss_mb": rss}, f)
    end = exit_t + 20 * MS
    write_host(path, end, workers, seed)
    write_gpu(path, end, cuda, seed)
    meta = {"format": "whyidle.run/1", "tool_version": "0.1.0", "name": "load", "command": ["python", "train.py"],
            "run_dir": path, "cwd": "/work/project", "hostname": "vm", "cpu_count": 2,
            "started_utc": "2026-01-01T00:00:00+00:00",
            "anchors": [{"monotonic_ns": T0, "time_ns": WALL0}, {"monotonic_ns": end, "time_ns": WALL0 + end - T0}],
            "interval_s": HOST_S, "stack_hz": 100.0, "whyidle_pid": WHYIDLE, "python": "3.11.7", "html": True,
            "start_t": T0 + 10 * MS, "root_pid": TRAINER, "exit_t": exit_t + 5 * MS,
            "ended_utc": "2026-01-01T00:00:00+00:00", "end_t": end, "wall_s": round((end - T0) / S, 3),
            "exit_code": 0, "signal": None, "interrupted": False}
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return path
