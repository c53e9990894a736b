"""Diagnosis rules and verdict (whyidle.diagnose) on hand-built facts shaped like
:func:`whyidle.analysis.run.analyze`'s output."""

from __future__ import annotations

import copy

import pytest

from whyidle.analysis.run import analyze
from whyidle.diagnose import diagnose, fixes, rules, rules_batch
from whyidle.diagnose import thresholds as T
from whyidle.record.reader import RunData
from whyidle.analysis.facts import RunFacts

CONTRACT_KEYS = {"id", "severity", "title", "summary", "evidence", "bound", "est_speedup_if_removed", "est_speedup",
                 "fix"}
PHASES = ("other", "data", "forward", "backward", "optimizer")


def assert_contract(f: dict) -> None:
    assert set(f) == CONTRACT_KEYS, f
    assert f["severity"] in ("critical", "warning", "info")
    assert isinstance(f["id"], str) and f["id"]
    assert isinstance(f["title"], str) and f["title"]
    assert isinstance(f["summary"], str) and f["summary"]
    assert "\n" not in f["summary"]
    assert isinstance(f["evidence"], dict)
    assert f["est_speedup"] is None or isinstance(f["est_speedup"], float)
    assert set(f["fix"]) == {"text", "code", "docs", "options"}
    assert f["bound"] is None or 0.0 <= f["bound"] <= 1.0
    if f["bound"] is not None:
        assert f["est_speedup_if_removed"] == pytest.approx(rules.speedup_if_removed(f["bound"]), rel=2e-3)
    for o in f["fix"]["options"]:
        assert set(o) == {"text", "code", "est_speedup", "condition", "assumed"} and o["text"]
    if f["fix"]["options"]:  # the printed fix is the first option
        assert f["fix"]["options"][0]["text"] == f["fix"]["text"]
        assert f["fix"]["options"][0]["est_speedup"] == f["est_speedup"]
    assert isinstance(f["fix"]["text"], str) and f["fix"]["text"]
    assert f["fix"]["code"] is None or isinstance(f["fix"]["code"], str)
    assert isinstance(f["fix"]["docs"], list)


def make_step(data=0.0, fwd=0.4, bwd=0.4, opt=0.1, ev=0.0, other=None, mean=0.1, steps=20, batch=32.0,
              data_cpu_share=None, batches_per_step=1.0):
    """A ``step_metrics``-shaped dict; ``other`` defaults to the rest of the step."""
    if other is None:
        other = max(0.0, 1.0 - (data + fwd + bwd + opt + ev))
    return {
        "steps": steps, "window": [0, int(steps * mean * 1e9)], "wall_s": steps * mean,
        "samples_per_s": batch / mean if batch is not None else None, "steps_per_s": 1 / mean,
        "batch_size": batch, "batches_per_step": batches_per_step,
        "step_time_s": {"p50": mean, "p90": mean, "mean": mean, "min": mean, "max": mean},
        "shares": {"data_wait": data, "forward": fwd, "backward": bwd, "optimizer": opt, "eval": ev,
                   "other_host": other},
        "data_wait_s_per_step": data * mean, "compute_s_per_step": (1 - data) * mean,
        "data_cpu_share": data_cpu_share, "main_cpu_share": 0.9, "gpu_ms": None,
    }


def make_host(cores=8, cpu_busy=0.3, iowait=0.0, workers=0, worker_busy=None, run_delay=0.0, others=0.0,
              per_sample=None):
    return {
        "window_s": 2.0, "cores": cores, "cpu_busy_share": cpu_busy, "percpu_busy_share": [cpu_busy] * cores,
        "iowait_share": iowait, "trainer_cores": 1.0, "workers": workers,
        "workers_cores": (worker_busy or 0.0) * workers, "worker_busy_share": worker_busy,
        "tree_other_cores": 0.0, "whyidle_cores": 0.05, "other_procs_cores": others,
        "trainer_run_delay_share": run_delay, "tree_run_delay_cores": run_delay, "invol_ctx_per_s": 40.0,
        "disk_read_bytes_per_s": 0.0, "loader_read_bytes_per_s": 0.0, "loader_read_bytes_per_sample": per_sample,
        "trainer_rss_max_bytes": 2 * 2**30, "tree_rss_max_bytes": 3 * 2**30, "tree_threads": 12,
        "psi_cpu_share": None, "psi_io_share": None,
    }


def make_loader(nw=0, pin=False, persistent=False, batch=32):
    return {"k": "loader", "t": 1, "id": 1, "num_workers": nw, "pin_memory": pin, "persistent_workers": persistent,
            "prefetch_factor": 2 if nw else None, "batch_size": batch, "dataset": "ImageFolder",
            "dataset_len": 10_000, "mp_context": None, "worker_init_fn": False}


def make_facts(step=None, host=None, loader=None, devices=None, gpus=0, cuda_build="12.4", hotspots=None,
               primary=100, iters=None, top_others=None, trainers=None):
    proc = {"k": "proc", "t": 0, "pid": primary, "ppid": 1, "argv": ["train.py"], "python": "3.11.7",
            "framework": "torch", "framework_version": "2.4.0", "cuda_build": cuda_build, "threads": 8}
    gpu_static = None
    if gpus:
        gpu_static = {"k": "gpu_static", "t": 0, "ts_domain": "epoch", "cuda_visible_devices": None,
                      "devices": [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}",
                                   "memory_total_bytes": 150 * 10**9, "compute_capability": [9, 0],
                                   "driver_version": "550.54.15", "cuda_driver_version": "12.4",
                                   "gpm_supported": True} for i in range(gpus)]}
    hs = {p: [] for p in PHASES}
    hs.update(hotspots or {})
    return RunFacts(
        framework="torch",
        trainers=trainers if trainers is not None else ([primary] if primary is not None else []),
        primary=primary,
        proc=proc if primary is not None else None,
        instrumented=[primary] if primary is not None else [],
        steps_info={"total": (step["steps"] + 2) if step else 0, "warmup": 2, "boundary_excluded": 0,
                    "boundary_s": 0.0},
        step=step,
        host=host,
        top_others=top_others or [],
        gpu=None,
        gpu_static=gpu_static,
        device={"kind": "cuda" if gpus else "cpu", "name": "NVIDIA H200" if gpus else "Some CPU",
                "compute_capability": "9.0" if gpus else None, "memory_total_bytes": None},
        loader=loader,
        loader_iters=iters or {"count": 1, "seconds": [0.01]},
        devices=devices,
        hotspots=hs,
        notices=[],
        gpu_records_notices=[],
        other_trainers=[],
        meta={"format": "whyidle.run/1", "command": ["python", "train.py"]},
    )


def hot(function, share, site=None, leaf=None, library=False, seconds=1.0):
    site = site or f"{function.split()[0]}:10 {function.split()[-1]}"
    return {"function": function, "site": site, "seconds": seconds, "share": share, "samples": int(seconds * 100),
            "leaf": leaf or site, "library": library}


# -- input_bound ---------------------------------------------------------------------------------

def test_input_bound_loader_in_main_process():
    # data wait 0.15 s of a 0.2 s step, computed on the main thread (CPU-bound)
    facts = make_facts(make_step(data=0.75, fwd=0.1, bwd=0.1, opt=0.05, mean=0.2, data_cpu_share=0.9),
                       make_host(cores=8), make_loader(nw=0))
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["id"] == "input_bound"
    assert f["evidence"]["cause"] == "loader_in_main_process"
    assert f["severity"] == "critical"
    assert f["est_speedup"] == pytest.approx(4.0)  # 1 / (1 − 0.75)
    # ⌈0.15 / 0.05 × 1.25⌉ = ⌈3.75⌉ = 4 workers (under the CPU-bound cap of 7)
    assert f["evidence"]["suggested_num_workers"] == 4
    assert "num_workers=4" in f["fix"]["code"]
    assert "4 worker processes" in f["fix"]["text"]
    assert f["evidence"]["data_wait_share"] == 0.75
    assert f["evidence"]["data_wait_s_per_step"] == pytest.approx(0.15)
    assert f["evidence"]["loader_cpu_busy_share"] == 0.9
    assert "75%" in f["summary"] and "150.0 ms of 200.0 ms" in f["summary"]


def test_input_bound_storage_with_reads_per_sample():
    host = make_host(cores=2, per_sample=64 * 1024)
    host["trainer_cores"] = 0.6  # 0.02 CPU-s of loading and 0.1 of compute per 0.2 s step
    facts = make_facts(make_step(data=0.5, mean=0.2, fwd=0.2, bwd=0.2, opt=0.05, data_cpu_share=0.2),
                       host, make_loader(nw=0))
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "storage"
    assert f["est_speedup"] == pytest.approx(2.0)  # the waiting overlaps the 0.1 s compute
    assert "64.0 KiB read per sample" in f["summary"]
    # I/O-bound loader: cap 4 × cores = 8; ⌈0.1 / 0.1 × 1.25⌉ = 2
    assert f["evidence"]["suggested_num_workers"] == 2


def test_input_bound_storage_with_iowait_and_workers():
    facts = make_facts(make_step(data=0.4, data_cpu_share=None),
                       make_host(cores=4, iowait=0.15, workers=4, worker_busy=0.1), make_loader(nw=4))
    f = rules.input_bound(facts)
    assert f["evidence"]["cause"] == "storage"
    assert f["evidence"]["loader_cpu_busy_share"] == 0.1
    assert f["evidence"]["iowait_share"] == 0.15


def test_storage_needs_the_loader_off_cpu():
    # lots of bytes read, but the main-process loader is CPU-bound: not storage
    facts = make_facts(make_step(data=0.4, data_cpu_share=0.8), make_host(per_sample=10**6), make_loader(nw=0))
    assert rules.input_bound(facts)["evidence"]["cause"] == "loader_in_main_process"
    # off-CPU but reading almost nothing (IPC only) and no iowait: not storage either
    facts = make_facts(make_step(data=0.4, data_cpu_share=0.1), make_host(per_sample=40), make_loader(nw=0))
    assert rules.input_bound(facts)["evidence"]["cause"] == "loader_in_main_process"


def test_input_bound_too_few_workers():
    facts = make_facts(make_step(data=0.3, fwd=0.3, bwd=0.3, opt=0.1, mean=0.1),
                       make_host(cores=8, cpu_busy=0.5, workers=2, worker_busy=0.95), make_loader(nw=2))
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "too_few_workers"
    assert f["severity"] == "critical"
    assert f["est_speedup"] == pytest.approx(1.429)  # 1 / 0.7, rounded to 3 places
    # fetch per batch = 2 workers × 0.1 s; compute 0.07 s: ⌈0.2 / 0.07 × 1.25⌉ = ⌈3.57⌉ = 4
    assert f["evidence"]["suggested_num_workers"] == 4
    assert "from 2 to 4" in f["fix"]["text"]


def test_input_bound_cpu_preprocessing():
    facts = make_facts(make_step(data=0.3, fwd=0.3, bwd=0.3, opt=0.1),
                       make_host(cores=8, cpu_busy=0.95, workers=7, worker_busy=0.9), make_loader(nw=7),
                       hotspots={"data": [hot("dataset.py __getitem__", 0.2), hot("PIL decode", 0.5, library=True)]})
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "cpu_preprocessing"
    assert f["fix"]["code"] is None
    # with workers the training thread only waits on their queue: its stack names no loading work
    assert f["evidence"]["hotspots"] == [] and f["evidence"]["focus"] is None
    assert "__getitem__" not in f["summary"]


def test_saturated_workers_on_idle_machine_are_too_few():
    facts = make_facts(make_step(data=0.3), make_host(cores=8, cpu_busy=0.5, workers=2, worker_busy=0.9),
                       make_loader(nw=2))
    assert rules.input_bound(facts)["evidence"]["cause"] == "too_few_workers"


def test_input_bound_thresholds():
    loader = make_loader(nw=0)
    assert rules.input_bound(make_facts(make_step(data=0.099), make_host(), loader)) is None
    f = rules.input_bound(make_facts(make_step(data=0.10, data_cpu_share=0.9), make_host(), loader))
    assert f["severity"] == "warning"
    assert f["est_speedup"] == pytest.approx(1.111)
    f = rules.input_bound(make_facts(make_step(data=0.249, data_cpu_share=0.9), make_host(), loader))
    assert f["severity"] == "warning"
    f = rules.input_bound(make_facts(make_step(data=0.25, data_cpu_share=0.9), make_host(), loader))
    assert f["severity"] == "critical"
    assert f["est_speedup"] == pytest.approx(1.333)
    # a data wait of the whole step: removing it is capped at 0.95 → 20×; what workers give is
    # bounded by the cores: 89.1 ms of loading CPU + 7.95 ms of compute CPU per batch (1 ms of
    # compute on at most 7.95 cores) over 7.95 usable cores at CPU_PARALLEL_EFFICIENCY
    f = rules.input_bound(make_facts(make_step(data=0.99, fwd=0.0, bwd=0.0, opt=0.0, data_cpu_share=0.9),
                                     make_host(), loader))
    assert f["evidence"]["est_speedup_if_removed"] == pytest.approx(20.0)
    cpu_s = (0.9 * 0.099 + 0.001 * 7.95) / (7.95 * T.CPU_PARALLEL_EFFICIENCY)
    assert f["est_speedup"] == pytest.approx(0.1 / cpu_s, rel=1e-3)
    assert rules.input_bound(make_facts(None, make_host(), loader)) is None


def test_input_bound_without_host_or_loader():
    # no DataLoader configuration was recorded: the cause cannot be narrowed down
    f = rules.input_bound(make_facts(make_step(data=0.5, data_cpu_share=0.9), None, None))
    assert_contract(f)
    assert f["evidence"]["cause"] == "unknown"
    assert f["evidence"]["cores"] == 1


# -- suggested_workers ---------------------------------------------------------------------------

def test_suggested_workers_cpu_bound_cap_is_the_cores():
    # need ⌈0.9 / 0.1 × 1.25⌉ = 12, but a CPU-bound loader gets one worker per core: the training
    # process mostly waits (measured on 2 cores: 2 workers 1.7-2.1x, 1 worker 1.0-1.15x), and its
    # intra-op threads step down to leave them the cores
    facts = make_facts(make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, mean=1.0, data_cpu_share=0.9),
                       make_host(cores=4), make_loader(nw=0))
    assert rules.suggested_workers(facts) == 4
    model = rules.loader_model(facts)
    assert model["threads"] == 1 and model["limit"] == "cores"
    # one core: still at least one worker
    facts.host = make_host(cores=1)
    assert rules.suggested_workers(facts) == 1


def test_suggested_workers_io_cap_is_four_per_core():
    facts = make_facts(make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, mean=1.0, data_cpu_share=0.1),
                       make_host(cores=2), make_loader(nw=0))
    assert rules.suggested_workers(facts) == 8  # min(12, 4 × 2)
    facts.host = make_host(cores=1)
    assert rules.suggested_workers(facts) == 4  # max(4, 4 × 1)
    # without data_cpu_share the loader is not known to be CPU-bound: I/O cap
    facts.step["data_cpu_share"] = None
    facts.host = make_host(cores=2)
    assert rules.suggested_workers(facts) == 8


def test_suggested_workers_never_above_max():
    # ⌈0.99 / 0.01 × 1.25⌉ = 124 under an I/O cap of 64 → 32
    facts = make_facts(make_step(data=0.99, fwd=0.01, bwd=0.0, opt=0.0, mean=1.0, data_cpu_share=0.1),
                       make_host(cores=16), make_loader(nw=0))
    assert rules.suggested_workers(facts) == T.MAX_SUGGESTED_WORKERS == 32
    # 0.95 / 0.05: ⌈23.75⌉ = 24 stays below both caps
    facts.step = make_step(data=0.95, fwd=0.05, bwd=0.0, opt=0.0, mean=1.0, data_cpu_share=0.1)
    assert rules.suggested_workers(facts) == 24


def test_suggested_workers_at_least_one_more_than_today():
    # 6 CPU-bound workers on 4 cores: the cap (3) is below today's count → 7
    facts = make_facts(make_step(data=0.5, mean=0.1), make_host(cores=4, workers=6, worker_busy=0.9),
                       make_loader(nw=6))
    assert rules.suggested_workers(facts) == 7
    # tiny need (data wait small next to compute) with workers: still nw + 1
    facts = make_facts(make_step(data=0.1, mean=1.0), make_host(cores=64, workers=1, worker_busy=0.1),
                       make_loader(nw=1))
    # ⌈1 × 1.0 / 0.9 × 1.25⌉ = ⌈1.39⌉ = 2 = nw + 1
    assert rules.suggested_workers(facts) == 2


def test_suggested_workers_with_workers_uses_nw_times_step_time():
    # 3 I/O-bound workers, step 0.2 s, compute 0.1 s: ⌈0.6 / 0.1 × 1.25⌉ = ⌈7.5⌉ = 8
    facts = make_facts(make_step(data=0.5, mean=0.2), make_host(cores=8, workers=3, worker_busy=0.2),
                       make_loader(nw=3))
    assert rules.suggested_workers(facts) == 8


def test_suggested_workers_per_batch_with_several_batches_per_step():
    # two batches per step (gradient accumulation): fetch and compute are both per batch, ratio unchanged
    one = make_facts(make_step(data=0.75, fwd=0.1, bwd=0.1, opt=0.05, mean=0.2, data_cpu_share=0.9),
                     make_host(cores=8), make_loader(nw=0))
    two = copy.deepcopy(one)
    two.step["batches_per_step"] = 2.0
    assert rules.suggested_workers(one) == rules.suggested_workers(two) == 4


# -- host_bound ----------------------------------------------------------------------------------

def test_host_bound_logging_hotspot():
    step = make_step(data=0.0, fwd=0.3, bwd=0.2, opt=0.1, mean=0.1)  # other_host 0.4
    facts = make_facts(step, make_host(), hotspots={"other": [
        hot("train.py log_metrics", 0.3, site="train.py:50 log_metrics", leaf="rich/console.py:1700 print"),
        hot("optimizer.py zero_grad", 0.05, library=True),
    ]})
    f = rules.host_bound(facts)
    assert_contract(f)
    assert f["severity"] == "critical"  # 0.4 ≥ 0.30
    assert f["evidence"]["kind"] == "logging"
    assert f["evidence"]["attributed_share"] == 0.3
    assert f["evidence"]["other_host_share"] == pytest.approx(0.4)
    assert f["est_speedup"] == pytest.approx(1.429)  # 1 / (1 − 0.3)
    assert [h["function"] for h in f["evidence"]["hotspots"]] == ["train.py log_metrics"]
    assert "every N steps" in f["fix"]["text"]
    assert "step % 50" in f["fix"]["code"]
    assert "`train.py log_metrics` takes 30% of step time (at train.py:50 log_metrics, inside rich/console.py:1700 print)" \
        in f["summary"]


def test_host_bound_compute_hotspots_sum_top_three_user_functions():
    step = make_step(fwd=0.4, bwd=0.3, opt=0.1, mean=0.1)  # other_host 0.2
    facts = make_facts(step, make_host(), hotspots={"other": [
        hot("train.py knn_loss", 0.12), hot("optimizer.py step", 0.1, library=True),
        hot("train.py assign", 0.05), hot("train.py match", 0.02), hot("train.py tiny", 0.01),
    ]})
    f = rules.host_bound(facts)
    assert_contract(f)
    assert f["severity"] == "info"  # the named functions explain 0.19 < HOST_SHARE_WARN (0.20)
    assert f["evidence"]["kind"] == "python_compute"
    assert f["fix"]["code"] is None
    assert "vectorize" in f["fix"]["text"]
    assert [h["function"] for h in f["evidence"]["hotspots"]] == ["train.py knn_loss", "train.py assign",
                                                                  "train.py match"]
    assert f["evidence"]["attributed_share"] == pytest.approx(0.19)
    assert f["est_speedup"] == pytest.approx(round(1 / (1 - 0.19), 3))


def test_host_bound_attributed_share_capped_at_other_host():
    step = make_step(fwd=0.3, bwd=0.2, opt=0.1)  # other_host 0.4
    facts = make_facts(step, make_host(), hotspots={"other": [hot("train.py a", 0.3), hot("train.py b", 0.25)]})
    f = rules.host_bound(facts)
    assert f["evidence"]["attributed_share"] == pytest.approx(0.55)
    assert f["est_speedup"] == pytest.approx(round(1 / 0.6, 3))


def test_host_bound_without_samples_uses_whole_share():
    facts = make_facts(make_step(fwd=0.3, bwd=0.2, opt=0.1), make_host())  # other_host 0.4
    f = rules.host_bound(facts)
    assert_contract(f)
    assert f["evidence"]["attributed_share"] is None
    assert f["evidence"]["hotspots"] == []
    assert f["est_speedup"] == pytest.approx(round(1 / 0.6, 3))
    assert "no stack samples" in f["summary"]


def test_host_bound_only_library_hotspots():
    facts = make_facts(make_step(fwd=0.3, bwd=0.2, opt=0.1), make_host(),
                       hotspots={"other": [hot("optimizer.py zero_grad", 0.1, library=True)]})
    f = rules.host_bound(facts)
    assert [h["function"] for h in f["evidence"]["hotspots"]] == ["optimizer.py zero_grad"]
    assert f["est_speedup"] == pytest.approx(round(1 / 0.9, 3))


def test_host_bound_thresholds():
    assert rules.host_bound(make_facts(make_step(fwd=0.5, bwd=0.3, opt=0.001, other=0.199), make_host())) is None
    f = rules.host_bound(make_facts(make_step(fwd=0.5, bwd=0.3, opt=0.0, other=0.2), make_host()))
    assert f is not None and f["severity"] == "warning"
    f = rules.host_bound(make_facts(make_step(fwd=0.4, bwd=0.2, opt=0.1, other=0.3), make_host()))
    assert f["severity"] == "critical"
    assert rules.host_bound(make_facts(None, make_host())) is None


def test_log_softmax_is_not_logging():
    step = make_step(fwd=0.3, bwd=0.2, opt=0.1)
    facts = make_facts(step, make_host(), hotspots={"other": [
        hot("train.py compute_logits", 0.3, site="train.py:30 compute_logits",
            leaf="torch/nn/functional.py:2140 log_softmax")]})
    assert rules.host_bound(facts)["evidence"]["kind"] == "python_compute"


# -- small_batch ---------------------------------------------------------------------------------

def test_small_batch_estimate_and_severity():
    # batch 2, fixed = optimizer 0.2 + other 0.3 = 0.5; k = 16 → 16 / (0.5 + 0.5 × 16)
    f = rules_batch.small_batch(make_facts(make_step(fwd=0.25, bwd=0.25, opt=0.2, other=0.3, batch=2.0)))
    assert_contract(f)
    assert f["est_speedup"] == pytest.approx(round(16 / 8.5, 3))
    assert f["severity"] == "warning"
    assert f["evidence"]["batch_size"] == 2.0
    assert f["evidence"]["fixed_share"] == pytest.approx(0.5)
    assert f["evidence"]["target_batch_size"] == 32
    assert "batch_size=32" in f["fix"]["code"] and "# was 2" in f["fix"]["code"]
    assert "Batches of 2 samples" in f["summary"]


def test_small_batch_info_below_1_3():
    # batch 8 (the largest checked), fixed 0.2: k = 4 → 4 / (0.2 + 3.2) = 1.176
    f = rules_batch.small_batch(make_facts(make_step(fwd=0.4, bwd=0.4, opt=0.1, other=0.1, batch=8.0)))
    assert f["est_speedup"] == pytest.approx(1.176)
    assert f["severity"] == "info"


def test_small_batch_one_sample():
    f = rules_batch.small_batch(make_facts(make_step(fwd=0.4, bwd=0.4, opt=0.1, other=0.1, batch=1.0)))
    assert "Batches of 1 sample:" in f["summary"]
    assert f["est_speedup"] == pytest.approx(round(32 / (0.2 + 0.8 * 32), 3))


def test_small_batch_not_raised():
    assert rules_batch.small_batch(make_facts(make_step(batch=9.0))) is None
    assert rules_batch.small_batch(make_facts(make_step(batch=None))) is None
    assert rules_batch.small_batch(make_facts(None)) is None


# -- cpu_contention ------------------------------------------------------------------------------

def test_cpu_contention_other_processes():
    top = [{"pid": 7, "command": "stress -c 4", "cores": 3.2}]
    facts = make_facts(make_step(), make_host(cores=4, run_delay=0.3, others=3.5), top_others=top)
    f = rules.cpu_contention(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "other_processes"
    assert f["severity"] == "critical"
    assert f["est_speedup"] == pytest.approx(round(1 / 0.7, 3))
    assert f["evidence"]["top_other_processes"] == top
    assert "`stress -c 4` (pid 7, 3.2 cores)" in f["summary"]
    assert "30%" in f["summary"]
    assert f["fix"]["code"] is None


def test_cpu_contention_oversubscription():
    facts = make_facts(make_step(), make_host(cores=8, run_delay=0.15, others=0.2, workers=4, worker_busy=0.5),
                       trainers=[100, 101])
    facts.devices = {"params": {"cpu": 10}, "threads": 8}
    f = rules.cpu_contention(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "oversubscription"
    assert f["severity"] == "warning"
    assert f["est_speedup"] == pytest.approx(round(1 / 0.85, 3))
    assert f["evidence"]["processes"] == 2 and f["evidence"]["intra_op_threads"] == 8
    assert "2 training processes × 8 threads + 4 loader workers compete for 8 cores" in f["summary"]
    assert "torch.set_num_threads(4)" in f["fix"]["code"]  # 8 cores ÷ 2 processes


def test_cpu_contention_threads_from_proc_record():
    facts = make_facts(make_step(), make_host(cores=4, run_delay=0.2, others=0.0))
    f = rules.cpu_contention(facts)
    assert f["evidence"]["intra_op_threads"] == 8  # proc["threads"]
    assert "torch.set_num_threads(4)" in f["fix"]["code"]


def test_cpu_contention_thresholds():
    assert rules.cpu_contention(make_facts(make_step(), make_host(run_delay=0.099, others=5.0))) is None
    assert rules.cpu_contention(make_facts(make_step(), make_host(run_delay=None, others=5.0))) is None
    assert rules.cpu_contention(make_facts(make_step(), None)) is None
    f = rules.cpu_contention(make_facts(make_step(), make_host(run_delay=0.1, others=0.5)))
    assert f["severity"] == "warning" and f["evidence"]["cause"] == "other_processes"
    f = rules.cpu_contention(make_facts(make_step(), make_host(cores=4, run_delay=0.25, others=0.49)))
    assert f["severity"] == "critical" and f["evidence"]["cause"] == "oversubscription"  # 8 threads, 4 cores
    # 8 compute threads on 8 cores, no workers: the wait is the job's other threads taking turns
    f = rules.cpu_contention(make_facts(make_step(), make_host(run_delay=0.13)))
    assert f["severity"] == "info" and f["evidence"]["cause"] == "own_threads" and f["est_speedup"] is None
    assert "fewer processes" not in f["fix"]["text"] and "torch.set_num_threads(7)" in f["fix"]["text"]
    f = rules.cpu_contention(make_facts(make_step(), make_host(run_delay=0.3)))
    assert f["severity"] == "warning" and f["evidence"]["cause"] == "own_threads"
    # no steps needed: contention is judged from the host alone
    assert rules.cpu_contention(make_facts(None, make_host(run_delay=0.5, others=2.0))) is not None


# -- wrong_device / gpu_not_visible --------------------------------------------------------------

CPU_MODEL = {"params": {"cpu": 1000}, "batch": ["cpu"], "inputs": ["cpu"], "cuda_initialized": False,
             "pinned": None, "threads": 8}


def test_wrong_device_gpu_present_params_on_cpu():
    f = rules.wrong_device(make_facts(make_step(), make_host(), devices=CPU_MODEL, gpus=1))
    assert_contract(f)
    assert f["id"] == "wrong_device" and f["severity"] == "critical"
    assert f["est_speedup"] is None
    assert "all 1,000 model parameters are on the CPU" in f["summary"]
    assert f["evidence"]["gpus"] == 1 and f["evidence"]["params"] == {"cpu": 1000}


def test_wrong_device_partial_and_inputs():
    dev = dict(CPU_MODEL, params={"cpu": 10, "cuda": 90}, cuda_initialized=True)
    f = rules.wrong_device(make_facts(make_step(), devices=dev, gpus=1))
    assert "10 of 100 parameters are on the CPU" in f["summary"]
    dev = dict(CPU_MODEL, params={"cuda": 90}, inputs=["cpu"], cuda_initialized=True)
    f = rules.wrong_device(make_facts(make_step(), devices=dev, gpus=1))
    assert "inputs arrive on the CPU" in f["summary"]
    dev = dict(CPU_MODEL, params={"cuda": 90}, inputs=["cuda"], batch=["cuda"], cuda_initialized=True)
    assert rules.wrong_device(make_facts(make_step(), devices=dev, gpus=1)) is None


def test_wrong_device_cuda_initialized_without_nvml():
    dev = dict(CPU_MODEL, cuda_initialized=True)
    f = rules.wrong_device(make_facts(make_step(), devices=dev, gpus=0))
    assert f is not None and "CUDA initialized" in f["summary"]


def test_no_gpu_no_wrong_device():
    assert rules.wrong_device(make_facts(make_step(), make_host(), devices=CPU_MODEL, gpus=0)) is None
    assert rules.wrong_device(make_facts(make_step(), make_host(), devices=None, gpus=1)) is None
    assert rules.gpu_not_visible(make_facts(make_step(), make_host(), devices=CPU_MODEL, gpus=0)) is None


def test_cpu_only_torch_build_is_gpu_not_visible():
    facts = make_facts(make_step(), make_host(), devices=CPU_MODEL, gpus=2, cuda_build=None)
    assert rules.wrong_device(facts) is None
    f = rules.gpu_not_visible(facts)
    assert_contract(f)
    assert f["severity"] == "critical" and f["est_speedup"] is None
    assert f["evidence"] == {"gpus": 2, "cuda_driver_version": "12.4", "torch": "2.4.0", "cuda_build": None}
    assert "2 NVIDIA GPUs are present" in f["summary"] and "CPU-only build" in f["summary"]
    # a CUDA build sees the GPU: not raised
    assert rules.gpu_not_visible(make_facts(make_step(), devices=CPU_MODEL, gpus=1)) is None


def test_verdict_wrong_device_when_nothing_else_limits():
    facts = make_facts(make_step(fwd=0.5, bwd=0.35, opt=0.1, batch=64.0), make_host(), devices=CPU_MODEL, gpus=1)
    verdict, findings = diagnose(facts)
    assert verdict == "wrong_device"
    assert findings[0]["id"] == "wrong_device"
    assert "device_bound" not in [f["id"] for f in findings]


def test_verdict_gpu_not_visible():
    facts = make_facts(make_step(fwd=0.5, bwd=0.35, opt=0.1, batch=64.0), make_host(), devices=CPU_MODEL,
                       gpus=1, cuda_build=None)
    verdict, findings = diagnose(facts)
    assert verdict == "gpu_not_visible"
    assert [f["id"] for f in findings] == ["gpu_not_visible"]


# -- input_pipeline_config -----------------------------------------------------------------------

CUDA_MODEL = {"params": {"cuda": 1000}, "batch": ["cpu"], "inputs": ["cuda"], "cuda_initialized": True,
              "pinned": False, "threads": 8}


def test_config_smells():
    facts = make_facts(make_step(data=0.06), make_host(), make_loader(nw=0, pin=False), devices=CUDA_MODEL, gpus=1)
    f = rules.input_pipeline_config(facts, set())
    assert_contract(f)
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert len(f["evidence"]["smells"]) == 2
    assert f["evidence"]["smells"][0].startswith("num_workers=0")
    assert f["evidence"]["smells"][1].startswith("pin_memory=False")
    assert f["evidence"]["loader"]["num_workers"] == 0
    assert "num_workers=1" in f["fix"]["code"]  # one worker to start with when not input-bound


def test_config_num_workers_smell_needs_some_data_wait():
    facts = make_facts(make_step(data=0.01), make_host(), make_loader(nw=0))
    assert rules.input_pipeline_config(facts, set()) is None


def test_config_no_worker_advice_where_a_worker_gains_nothing():
    """An in-memory TensorDataset: 0.46 ms of fetching in a 5.8 ms step (8 % data wait) costs less
    than a worker's hand-off (``WORKER_MIN_FETCH_S``): no num_workers smell (a fresh user measured
    the advised num_workers=1 at 0.79x)."""
    facts = make_facts(make_step(data=0.079, mean=0.0058), make_host(cores=2), make_loader(nw=0))
    assert rules.input_pipeline_config(facts, set()) is None
    slow = make_facts(make_step(data=0.079, mean=0.1, data_cpu_share=0.9), make_host(), make_loader(nw=0))
    f = rules.input_pipeline_config(slow, set())  # 8 ms of loading per batch on 8 cores: a worker gains
    assert f["evidence"]["smells"][0].startswith("num_workers=0") and "would give" in f["evidence"]["smells"][0]


def test_config_persistent_workers_smell():
    facts = make_facts(make_step(), make_host(), make_loader(nw=4, persistent=False),
                       iters={"count": 3, "seconds": [0.2, 0.4, 0.3]})
    f = rules.input_pipeline_config(facts, set())
    assert f["evidence"]["smells"] == [
        "persistent_workers=False: 4 workers are started again every epoch (3 times, 300 ms each to create the iterator)"]
    # one epoch only, or persistent: no smell
    facts.loader_iters = {"count": 1, "seconds": [0.2]}
    assert rules.input_pipeline_config(facts, set()) is None
    facts.loader_iters = {"count": 3, "seconds": [0.2, 0.4, 0.3]}
    facts.loader["persistent_workers"] = True
    assert rules.input_pipeline_config(facts, set()) is None


def test_config_without_loader():
    assert rules.input_pipeline_config(make_facts(make_step(data=0.5)), set()) is None


def test_config_does_not_repeat_input_bound_cause():
    facts = make_facts(make_step(data=0.5), make_host(), make_loader(nw=0, pin=False), devices=CUDA_MODEL, gpus=1)
    f = rules.input_pipeline_config(facts, {"loader_in_main_process"})
    assert len(f["evidence"]["smells"]) == 1 and f["evidence"]["smells"][0].startswith("pin_memory=False")


def test_diagnose_deduplicates_config_with_input_bound():
    facts = make_facts(make_step(data=0.5, data_cpu_share=0.9, batch=64.0), make_host(), make_loader(nw=0))
    verdict, findings = diagnose(facts)
    assert verdict == "input_bound"
    assert [f["id"] for f in findings] == ["input_bound"]  # no repeated num_workers=0 smell
    # with another cause the smell is reported
    facts = make_facts(make_step(data=0.5, data_cpu_share=0.1, batch=64.0), make_host(per_sample=10_000),
                       make_loader(nw=0))
    verdict, findings = diagnose(facts)
    assert findings[0]["evidence"]["cause"] == "storage"
    assert [f["id"] for f in findings] == ["input_bound", "input_pipeline_config"]


# -- verdict and order ---------------------------------------------------------------------------

def test_verdict_is_highest_speedup_and_leads():
    # input_bound warning 1.176 (0.15), host_bound critical 1.538 (0.35, no samples),
    # small_batch warning 1.882 (batch 2, fixed 0.5)
    step = make_step(data=0.15, fwd=0.2, bwd=0.15, opt=0.15, other=0.35, batch=2.0, data_cpu_share=0.9)
    verdict, findings = diagnose(make_facts(step, make_host(), make_loader(nw=0)))
    for f in findings:
        assert_contract(f)
    assert verdict == "small_batch"
    assert [f["id"] for f in findings] == ["small_batch", "host_bound", "input_bound"]
    assert [f["est_speedup"] for f in findings] == pytest.approx([1.882, 1.538, 1.176])


def test_highest_speedup_wins_across_severities():
    # cpu_contention warning at 1/(1−0.2) = 1.25 vs input_bound critical at 1/(1−0.4) = 1.667
    step = make_step(data=0.4, fwd=0.3, bwd=0.2, opt=0.05, data_cpu_share=0.9)
    facts = make_facts(step, make_host(run_delay=0.2, others=2.0), make_loader(nw=0))
    verdict, findings = diagnose(facts)
    assert verdict == "input_bound"
    assert [f["id"] for f in findings] == ["input_bound", "cpu_contention"]
    # now contention is worse: 1/(1−0.5) = 2.0
    facts.host["trainer_run_delay_share"] = 0.5
    verdict, findings = diagnose(facts)
    assert verdict == "cpu_contention"
    assert [f["id"] for f in findings] == ["cpu_contention", "input_bound"]


def test_device_bound_when_nothing_limits():
    facts = make_facts(make_step(data=0.02, fwd=0.5, bwd=0.35, opt=0.1, batch=64.0), make_host(), make_loader(nw=4))
    verdict, findings = diagnose(facts)
    assert verdict == "device_bound"
    assert [f["id"] for f in findings] == ["device_bound"]
    f = findings[0]
    assert_contract(f)
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert f["evidence"]["compute_share"] == pytest.approx(0.95)
    assert f["evidence"]["data_wait_share"] == pytest.approx(0.02)
    assert f["evidence"]["other_host_share"] == pytest.approx(0.03)
    assert "no GPU" in f["summary"]  # device kind cpu


def test_device_bound_names_the_gpu():
    facts = make_facts(make_step(fwd=0.5, bwd=0.4, opt=0.05, batch=64.0), make_host(), devices=CUDA_MODEL, gpus=1,
                       loader=make_loader(nw=4, pin=True, persistent=True))
    verdict, findings = diagnose(facts)
    assert verdict == "device_bound"
    assert "NVIDIA H200 is the limit" in findings[0]["summary"]


def test_device_bound_first_ahead_of_small_findings():
    # other_host is 0.2 but its sampled functions explain only 5 %: host_bound is info (severity
    # follows what the fix would gain, 1.053 < 1.10) → not the verdict; small_batch info (1.176)
    # neither; infos are ordered by est_speedup
    step = make_step(fwd=0.4, bwd=0.3, opt=0.1, batch=8.0)
    facts = make_facts(step, make_host(), hotspots={"other": [hot("train.py f", 0.05)]})
    verdict, findings = diagnose(facts)
    assert verdict == "device_bound"
    assert [f["id"] for f in findings] == ["device_bound", "small_batch", "host_bound"]
    assert findings[2]["severity"] == "info"
    assert findings[2]["est_speedup"] == pytest.approx(1.053)


def test_no_steps_without_instrumented_process():
    facts = make_facts(None, make_host(), primary=None)
    facts.instrumented = []
    verdict, findings = diagnose(facts)
    assert verdict == "unknown"
    assert [f["id"] for f in findings] == ["no_steps"]
    assert_contract(findings[0])
    assert "no Python process" in findings[0]["summary"]
    assert findings[0]["evidence"] == {"instrumented_processes": 0}


def test_no_steps_of_a_program_that_failed_names_its_exit_code_not_instrumentation():
    """``whyidle run -- python missing.py``: Python exits 2 before importing anything; the
    advice is its error, not to run the script under whyidle (which the user did)."""
    facts = make_facts(None, make_host(), primary=None)
    facts.instrumented = []
    facts.meta = {"exit_code": 2, "signal": None}
    verdict, findings = diagnose(facts)
    assert verdict == "unknown" and [f["id"] for f in findings] == ["no_steps"]
    assert "exit code 2 before its first training step" in findings[0]["summary"]
    assert "Fix the error" in findings[0]["fix"]["text"]


def test_no_steps_with_torch_imported():
    facts = make_facts(None, make_host(), primary=None)
    facts.instrumented = [123]
    verdict, findings = diagnose(facts)
    assert verdict == "unknown"
    assert findings[0]["id"] == "no_steps"
    assert "PyTorch was imported" in findings[0]["summary"]
    assert findings[0]["evidence"] == {"instrumented_processes": 1}


def test_too_few_steps_skips_step_rules():
    step = make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, steps=4, data_cpu_share=0.9)
    facts = make_facts(step, make_host(), None)
    facts.steps_info = {"total": 5, "warmup": 1, "boundary_excluded": 0, "boundary_s": 0.0}
    verdict, findings = diagnose(facts)
    assert verdict == "unknown"
    assert [f["id"] for f in findings] == ["too_few_steps"]
    assert_contract(findings[0])
    assert findings[0]["evidence"] == {"steps": 5, "analyzed": 4}
    assert "Only 5 steps" in findings[0]["summary"]


def test_too_few_steps_when_all_were_warm_up():
    facts = make_facts(None, make_host())
    facts.steps_info = {"total": 2, "warmup": 0, "boundary_excluded": 0, "boundary_s": 0.0}
    verdict, findings = diagnose(facts)
    assert verdict == "unknown"
    assert findings[0]["id"] == "too_few_steps"
    assert findings[0]["evidence"] == {"steps": 2, "analyzed": 0}


def test_min_steps_is_enough():
    facts = make_facts(make_step(data=0.5, data_cpu_share=0.9, steps=T.MIN_STEPS), make_host(), make_loader())
    assert diagnose(facts)[0] == "input_bound"


def test_diagnose_does_not_mutate_facts():
    facts = make_facts(make_step(data=0.4, data_cpu_share=0.9), make_host(run_delay=0.2), make_loader())
    before = copy.deepcopy(facts)
    diagnose(facts)
    assert facts == before


# -- end to end through analyze ------------------------------------------------------------------

def test_analyze_then_diagnose_synthetic_run():
    """A main-process loader that waits 60 ms of each 100 ms step, from raw records."""
    MS = 1_000_000
    recs = [{"k": "proc", "t": 0, "pid": 100, "ppid": 1, "argv": ["train.py"], "python": "3.11.7",
             "framework": "torch", "framework_version": "2.4.0", "cuda_build": None, "threads": 4},
            dict(make_loader(nw=0), t=1 * MS)]
    for i in range(30):
        t0 = 1000 * MS + i * 100 * MS
        recs.append({"k": "step", "t": t0 + 100 * MS, "i": i, "t0": t0, "t1": t0 + 100 * MS, "by": "optimizer",
                     "data": 60 * MS, "fwd": 15 * MS, "bwd": 15 * MS, "opt": 5 * MS, "eval": 0, "batches": 1,
                     "samples": 32, "cpu": 95 * MS, "data_cpu": 57 * MS, "boundary": False})
    run = RunData(path="/nonexistent", meta={"format": "whyidle.run/1", "whyidle_pid": 40,
                                              "command": ["python", "train.py"]},
                  host=[], gpu=[], procs={100: recs}, problems=[])
    facts = analyze(run)
    assert facts.primary == 100 and facts.step["steps"] == 28
    verdict, findings = diagnose(facts)
    assert verdict == "input_bound"
    ib = findings[0]
    assert ib["evidence"]["cause"] == "loader_in_main_process"
    # host unknown → 1 core: the 57 ms of loading and the 38 ms of compute are all CPU work on it,
    # so a worker gains nothing; cheaper samples come first, estimated (and said so) for a 2×
    # cheaper sample: the 60 ms wait halves, 100 ms → 70 ms
    assert ib["est_speedup"] == pytest.approx(1 / 0.7, rel=1e-3)
    first = ib["fix"]["options"][0]
    assert first["assumed"] and first["est_speedup"] == ib["est_speedup"]
    assert first["condition"].startswith("estimated for a 2× cheaper sample; up to 2.5×")
    assert ib["evidence"]["est_speedup_if_removed"] == pytest.approx(2.5)  # 1 / (1 − 0.6)
    assert "Make each sample cheaper" in ib["fix"]["text"]
    # the worker option gains nothing here (est. 1.00×): not offered, the summary says so
    assert not any("worker process" in o["text"] for o in ib["fix"]["options"])
    assert "More workers would not help here (est. 1.00×" in ib["summary"]
    assert ib["evidence"]["loader_cpu_busy_share"] == pytest.approx(0.95)
    assert ib["evidence"]["suggested_num_workers"] == 1
    for f in findings:
        assert_contract(f)


def test_contended_workers_make_data_wait_a_symptom_of_contention():
    # the training thread waits for a core 30 % of the time, the workers 40 %: removing the
    # contention would also remove the data wait (50 %), so contention leads with 1/(0.7·0.5)
    host = make_host(cores=2, cpu_busy=1.0, workers=2, worker_busy=0.5, run_delay=0.3)
    host["workers_run_delay_share"] = 0.4
    facts = make_facts(make_step(data=0.5, fwd=0.2, bwd=0.2, opt=0.05), host, make_loader(nw=2))
    verdict, findings = diagnose(facts)
    assert verdict == "cpu_contention"
    c = findings[0]
    assert c["id"] == "cpu_contention"
    assert c["est_speedup"] == pytest.approx(1 / 0.7 / 0.5, rel=1e-3)
    assert c["evidence"]["workers_run_delay_share"] == 0.4
    assert "loader workers wait for a core 40%" in c["summary"]
    inp = next(f for f in findings if f["id"] == "input_bound")
    assert "see cpu_contention" in inp["summary"]
    # uncontended workers: each finding keeps its own estimate
    host["workers_run_delay_share"] = 0.02
    verdict, findings = diagnose(facts)
    assert verdict == "input_bound"
    assert next(f for f in findings if f["id"] == "cpu_contention")["est_speedup"] == pytest.approx(1 / 0.7, rel=1e-3)


def test_placement_findings_are_the_verdict_even_against_bigger_estimates():
    # a huge data wait, but the model's parameters sit on the CPU next to a visible GPU
    devices = {"k": "devices", "params": {"cpu": 1000}, "inputs": ["cpu"], "batch": ["cpu"],
               "cuda_initialized": False, "threads": 8}
    facts = make_facts(make_step(data=0.8, fwd=0.1, bwd=0.05, opt=0.05, data_cpu_share=0.9), make_host(),
                       make_loader(nw=0), devices=devices, gpus=1)
    verdict, findings = diagnose(facts)
    assert verdict == "wrong_device"
    assert findings[0]["id"] == "wrong_device"
    assert next(f for f in findings if f["id"] == "input_bound")["est_speedup"] == pytest.approx(5.0)


def test_tiny_in_memory_fetch_gets_no_worker_advice():
    # 0.2 ms of loading per 1 ms step: a worker's IPC costs more than that
    facts = make_facts(make_step(data=0.2, fwd=0.3, bwd=0.3, opt=0.1, mean=0.001, data_cpu_share=0.95),
                       make_host(cores=2), make_loader(nw=0))
    f = rules.input_bound(facts)
    assert f["evidence"]["suggested_num_workers"] == 0
    assert f["fix"]["code"] is None and "workers would slow this loop down" in f["fix"]["text"]
    assert f["severity"] == "warning"


def test_saturated_machine_with_cpu_bound_workers_is_cpu_preprocessing():
    # workers busy 50 % and waiting for a core 40 %: CPU-bound; the machine is full
    host = make_host(cores=2, cpu_busy=0.97, workers=2, worker_busy=0.5)
    host["workers_run_delay_share"] = 0.4
    facts = make_facts(make_step(data=0.5, fwd=0.2, bwd=0.2, opt=0.05), host, make_loader(nw=2))
    f = rules.input_bound(facts)
    assert f["evidence"]["cause"] == "cpu_preprocessing"
    # only cheaper samples help: estimated for a 2× cheaper sample, with these workers on these cores
    # (the model's contended compute, 97.5 ms of the 100 ms step, is what is left)
    assert f["est_speedup"] == pytest.approx(rules.loader_model(facts)["est_speedup_cheaper"], rel=1e-3)
    assert f["est_speedup"] == pytest.approx(100 / 97.5, rel=1e-3)
    assert f["fix"]["options"][0]["assumed"] and "2× cheaper sample" in f["fix"]["options"][0]["condition"]
    assert f["est_speedup_if_removed"] == pytest.approx(2.0)  # 1/(1 − 0.5)
    assert f["fix"]["code"] is None


def test_loader_snippet_keeps_the_users_settings():
    loader = dict(make_loader(nw=0, batch=64), sampler="SequentialSampler", collate_fn="pad_batch",
                  drop_last=True, iterable=True)
    code = fixes.loader_code(RunFacts(loader=loader), 4)
    assert "shuffle" not in code  # no RandomSampler; an IterableDataset cannot shuffle
    assert "collate_fn=pad_batch" in code and "drop_last=True" in code and "batch_size=64" in code
    assert "get_worker_info" in code  # sharding note for an IterableDataset
    loader.update(sampler="RandomSampler", collate_fn="default_collate", iterable=False, drop_last=False)
    code = fixes.loader_code(RunFacts(loader=loader), 2)
    assert "shuffle=True" in code and "collate_fn" not in code and "get_worker_info" not in code


# -- hypervisor steal ------------------------------------------------------------------------------

def test_cpu_steal_is_contention_no_process_on_the_machine_caused():
    host = make_host(cores=2, run_delay=0.02, others=0.0)
    host["steal_share"] = 0.3
    f = rules.cpu_contention(make_facts(make_step(), host))
    assert_contract(f)
    assert f["evidence"]["cause"] == "hypervisor_steal" and f["evidence"]["steal_share"] == 0.3
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.3)
    assert f["est_speedup"] is None  # the host's other guests, not the job, decide it
    assert "other guests 30% of the time" in f["summary"]
    host["steal_share"] = 0.5
    assert rules.cpu_contention(make_facts(make_step(), host))["severity"] == "critical"
    host["steal_share"] = 0.15  # seen for minutes on shared VMs: a note, not what holds the job
    f = rules.cpu_contention(make_facts(make_step(), host))
    assert f["severity"] == "info" and f["evidence"]["cause"] == "hypervisor_steal"
    verdict, findings = diagnose(make_facts(make_step(data=0.02, fwd=0.5, bwd=0.35, opt=0.1), host, make_loader(nw=2)))
    assert verdict == "device_bound" and "cpu_contention" in [f["id"] for f in findings]
    host["steal_share"] = 0.09  # below the note: the run-queue wait alone decides, and it is small
    assert rules.cpu_contention(make_facts(make_step(), host)) is None
    host["steal_share"], host["trainer_run_delay_share"], host["other_procs_cores"] = 0.2, 0.4, 1.5
    assert rules.cpu_contention(make_facts(make_step(), host))["evidence"]["cause"] == "other_processes"


def test_loader_cpu_share_is_counted_against_the_cpu_the_hypervisor_gave():
    # a main-process loader computing all the time on 2 cores reads 0.45 busy when half the time was
    # stolen: the advice must be what it is on a quiet host, where it reads 0.9
    quiet = make_facts(make_step(data=0.5, fwd=0.3, bwd=0.15, opt=0.05, data_cpu_share=0.9),
                       make_host(cores=2, cpu_busy=0.55), make_loader(nw=0))
    stolen = copy.deepcopy(quiet)
    stolen.step["data_cpu_share"] = 0.45
    stolen.host["steal_share"] = 0.5
    assert rules.cpu_given(0.45, stolen.host) == pytest.approx(0.9)
    assert rules.cpu_given(None, stolen.host) is None
    assert rules.loader_model(stolen)["cpu_bound"] == rules.loader_model(quiet)["cpu_bound"] is True
    assert rules.suggested_workers(stolen) == rules.suggested_workers(quiet)
    without = copy.deepcopy(stolen)
    without.host["steal_share"] = 0.0
    assert rules.loader_model(without)["cpu_bound"] is False  # what the advice read before steal was counted


def test_cheaper_samples_advice_follows_what_the_data_phase_ran():
    from whyidle.analysis.facts import RunFacts
    from whyidle.diagnose.rules import _cheaper_sample

    images = RunFacts(framework="torch", hotspots={"data": [{"leaf": "PIL/ImageFile.py:300 load"}]})
    assert "Image.draft" in _cheaper_sample(images)
    # an innermost Image.convert is an in-memory conversion (ImageEnhance.Color): augmentation advice
    augmented = RunFacts(framework="torch", hotspots={"data": [{"leaf": "PIL/Image.py:900 convert"}]})
    assert "whole batches as tensor ops" in _cheaper_sample(augmented)
    tensors = RunFacts(framework="torch", loader={"dataset": "TensorDataset"},
                       hotspots={"data": [{"leaf": "torch/utils/data/dataset.py:206 <genexpr>"}]})
    text = _cheaper_sample(tensors)
    assert "BatchSampler" in text and "Image.draft" not in text
    text = _cheaper_sample(RunFacts(framework="torch", hotspots={"data": [{"leaf": "tok.py:3 encode"}]}))
    assert "tokenized ids" in text and "Image.draft" not in text
