"""Rules fed by the CUDA timeline and the transfer audit, on plain fact dicts."""

from __future__ import annotations

import pytest

from whyidle.analysis.facts import RunFacts
from whyidle.analysis.transfers import placement_summary, read_summary, transfer_summary
from whyidle.diagnose import diagnose, rules
from whyidle.diagnose.rules_gpu import (
    cpu_built_tensors,
    model_not_moved,
    pageable_transfers,
    sync_bound,
)


def step(mean=0.020, **shares):
    base = {"data_wait": 0.0, "forward": 0.3, "backward": 0.5, "optimizer": 0.1, "other_host": 0.1, "eval": 0.0}
    base.update(shares)
    return {"steps": 50, "step_time_s": {"p50": mean, "p90": mean, "mean": mean}, "shares": base,
            "batch_size": 32, "samples_per_s": 32 / mean, "data_wait_s_per_step": base["data_wait"] * mean,
            "batches_per_step": 1, "data_cpu_share": 0.9, "wall_s": 1.0, "steps_per_s": 1 / mean,
            "compute_s_per_step": (1 - base["data_wait"]) * mean}


def idle(covered=1.0, data=0.0, sync=0.0, host=0.0, launch=0.0, sync_sites=None, count=0, steps=50):
    by = {"data": data, "sync": sync, "host": host, "launch": launch, "other": 0.0}
    return {"method": "cuda_events", "covered_s": covered, "starved_s": sum(by.values()),
            "starved_share": sum(by.values()) / covered, "idle_s_by_cause": by,
            "idle_share_by_cause": {k: v / covered for k, v in by.items()}, "idle_sites": [],
            "syncs": {"count": count, "per_step": count / steps, "idle_s": sync, "sites": sync_sites or []},
            "per_step": None, "steps": steps, "marks": 100, "probe_s": 0.0}


def test_sync_bound_from_measured_syncs():
    sites = [{"site": "train.py:40 train", "leaf": "train.py:40 train", "op": "item", "count": 100, "per_step": 2.0,
              "idle_s": 0.25, "wait_s": None},
             {"site": "train.py:44 train", "leaf": "train.py:44 train", "op": "print/format", "count": 50,
              "per_step": 1.0, "idle_s": 0.05, "wait_s": None}]
    facts = RunFacts(gpu_idle=idle(sync=0.30, sync_sites=sites, count=150), step=step())
    f = sync_bound(facts)
    assert f["id"] == "sync_bound" and f["severity"] == "critical"
    assert f["est_speedup"] == pytest.approx(1 / 0.7, abs=1e-3)
    assert f["evidence"]["per_step"] == 3.0
    assert f["evidence"]["sites"][0]["share"] == pytest.approx(0.25)
    assert "train.py:40 train (item)" in f["summary"] and "2.0× per step" in f["summary"]
    assert ".item() only when you log" in f["fix"]["text"]


def test_sync_bound_silent_below_threshold_and_without_syncs():
    sites = [{"site": "a.py:1 f", "leaf": None, "op": "item", "count": 50, "per_step": 1.0, "idle_s": 0.04,
              "wait_s": None}]
    assert sync_bound(RunFacts(**{"gpu_idle": idle(sync=0.04, sync_sites=sites, count=50), "step": step()})) is None
    assert sync_bound(RunFacts(**{"gpu_idle": idle(), "step": step()})) is None


def test_sync_bound_on_a_cpu_run_counts_host_reads_as_info():
    recs = [{"k": "transfers", "step": s, "items": [], "reads": [
        ["train.py:40 train", "train.py:40 train", "item", 1],
        ["train.py:42 train", "train.py:42 train", "cpu", 1],
        ["train.py:42 train", "train.py:42 train", "numpy", 1]]} for s in range(3)]
    facts = RunFacts(gpu_idle=None, reads=read_summary(recs), step=step())
    f = sync_bound(facts)
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert f["evidence"]["per_step"] == 2.0  # x.cpu().numpy() is one read site
    assert [s["op"] for s in f["evidence"]["sites"]] == ["item", "cpu+numpy"]
    assert sync_bound(RunFacts(**{"gpu_idle": None, "reads": read_summary(recs[:0] or [{"k": "transfers", "step": 0}]),
                       "step": step()})) is None


def test_input_bound_on_a_gpu_uses_the_idle_the_gpu_felt():
    loader = {"num_workers": 4, "batch_size": 32, "pin_memory": True}
    host = {"cores": 8, "worker_busy_share": 0.9, "cpu_busy_share": 0.5}
    base = {"step": step(data_wait=0.30, forward=0.2, backward=0.3), "loader": loader, "host": host,
            "hotspots": {}, "focus": {}}
    # the host waits 30 % of the step for data but the GPU still has queued work: 3 % idle
    assert rules.input_bound(RunFacts(**{**base, "gpu_idle": idle(data=0.03)})) is None
    f = rules.input_bound(RunFacts(**{**base, "gpu_idle": idle(data=0.20)}))
    assert f["evidence"]["gpu_idle_share"] == 0.2 and f["evidence"]["data_wait_share"] == 0.3
    assert f["est_speedup"] <= 1 / 0.8 + 1e-9
    assert "the GPU sits idle 20% of the time" in f["summary"]


def test_transfer_summary_and_pageable_transfers():
    recs = [{"k": "transfers", "step": s, "items": [
        ["train.py:30 train", "train.py:30 train", "cuda", False, False, True, 2, 80 * 2**20, 6_000_000],
        ["train.py:31 train", "train.py:31 train", "cuda", False, False, False, 1, 24, 50_000],
        ["train.py:32 train", "train.py:32 train", "meta", False, False, False, 1, 24, 1000]], "reads": []}
        for s in range(2)]
    tr = transfer_summary(recs)
    assert tr["steps"] == 2
    assert tr["pageable_bytes_per_step"] == 80 * 2**20 + 24
    assert tr["pageable_host_s_per_step"] == pytest.approx(0.00605)
    assert tr["pageable_batch"] is True and tr["non_blocking_pageable"] is False
    assert [s["site"] for s in tr["cpu_built"]] == ["train.py:31 train"]  # meta is not a device copy
    f = pageable_transfers(RunFacts(**{"transfers": tr, "step": step(mean=0.1), "loader": {"pin_memory": False}}))
    assert f["severity"] == "warning"
    assert f["evidence"]["share_of_step"] == pytest.approx(0.0605)
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.0605), abs=1e-3)
    assert "pin_memory=True" in f["fix"]["code"]
    # the same copy on a 1 s step is off the critical path: info only (cases.md C21)
    assert pageable_transfers(RunFacts(**{"transfers": tr, "step": step(mean=1.0)}))["severity"] == "info"


def test_cpu_built_tensors_is_a_non_verdict_wrong_device():
    recs = [{"k": "transfers", "step": s, "items": [
        ["train.py:31 train", "train.py:31 train", "cuda", False, False, False, 1, 4096, 2_000_000]], "reads": []}
        for s in range(3)]
    facts = RunFacts(transfers=transfer_summary(recs), step=step(mean=0.02))
    f = cpu_built_tensors(facts)
    assert f["id"] == "wrong_device" and f["evidence"]["kind"] == "per_step_cpu_tensors"
    assert f["severity"] == "warning" and f["evidence"]["share_of_step"] == 0.1


def test_model_not_moved_on_a_cpu_box():
    recs = [{"k": "transfers", "step": 0, "items": [
        ["train.py:20 <module>", "train.py:20 <module>", "cpu", False, False, True, 2, 64, 1000]], "reads": []},
        {"k": "cuda_query", "site": "train.py:5 <module>", "leaf": "train.py:5 <module>", "result": False}]
    facts = RunFacts(placement=placement_summary(recs), devices={"params": {"cpu": 1234}, "cuda_initialized": False},
                     gpu_static=None)
    f = model_not_moved(facts)
    # not verifiable without a GPU (the move may sit in an `if torch.cuda.is_available():` branch)
    assert f["id"] == "wrong_device" and f["severity"] == "info"
    assert f["evidence"]["kind"] == "model_not_moved"
    assert "train.py:20 <module>" in f["summary"] and "1,234 parameters" in f["summary"]
    assert "torch.cuda.is_available() (train.py:5 <module>: False here)" in f["summary"]
    # the model was moved: fine
    moved = recs + [{"k": "module_to", "cls": "Net", "device": "cuda", "site": "train.py:9 <module>"}]
    assert model_not_moved(facts.replace(placement=placement_summary(moved))) is None
    # no CUDA query: the summary does not claim the script means to use a GPU
    no_query = placement_summary(recs[:1])
    assert "is_available" not in model_not_moved(facts.replace(placement=no_query))["summary"]
    # moved to the device its batches go to, here the CPU: fine
    to_cpu = recs + [{"k": "module_to", "cls": "Net", "device": "cpu", "site": "train.py:9 <module>"}]
    assert model_not_moved(facts.replace(placement=placement_summary(to_cpu))) is None
    # a GPU is there: the critical wrong_device speaks instead
    assert model_not_moved(facts.replace(gpu_static={"devices": [{"index": 0}]})) is None


def test_a_non_critical_wrong_device_does_not_force_the_verdict():
    facts = RunFacts(primary=1, instrumented=[1], steps_info={"total": 50}, step=step(mean=0.02),
                     transfers=transfer_summary([{"k": "transfers", "step": 0, "items": [
                         ["t.py:1 f", "t.py:1 f", "cuda", False, False, False, 1, 64, 100_000]], "reads": []}]),
                     host={}, loader=None, hotspots={}, focus={}, device={"kind": "cuda"})
    verdict, findings = diagnose(facts)
    assert any(f["id"] == "wrong_device" for f in findings)
    assert verdict == "device_bound"
