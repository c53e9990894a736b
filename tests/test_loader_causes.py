"""Which part of a multi-worker DataLoader holds the data wait (issue 36, parts 3-5): the
``input_bound`` causes ``uneven_shards``, ``main_process_receive`` and ``head_of_line`` from the
queue sampler's and the workers' own facts, each with estimates bounded by the loop's work and
the workers' pace."""

from __future__ import annotations

import pytest

from test_diagnose import assert_contract, make_facts, make_host, make_loader, make_step
from whyidle.diagnose import loader_order, rules


def worker(i, batches, mean_ms, p99_ms=None, loader=7, busy=0.5):
    return {"loader": loader, "worker": i, "pid": 100 + i, "batches": batches, "samples": batches * 32,
            "batch_ms": {"p50": mean_ms, "p95": mean_ms, "p99": p99_ms or mean_ms, "mean": mean_ms},
            "busy_share": busy, "fetch_share": 0.9, "collate_share": 0.05, "cpu_share": 0.2}


def queue(behind=0.0, empty=0.9, full=0.0, ready=0.2, cap=8):
    return {"loader": 7, "cap": cap, "samples": 100, "ready_mean": ready, "empty_share": empty, "full_share": full,
            "outstanding_mean": cap - 1, "wait_ms": 30.0, "behind_share": behind, "behind_wait_share": behind,
            "empty_wait_share": empty}


def facts_with(workers, q, data=0.6, mean=0.05, iterable=False, ipc=None, version="2.13.0"):
    """A 4-worker run whose step waits ``data`` (fraction) of ``mean`` seconds on its loader."""
    loader = make_loader(nw=4)
    loader["iterable"] = iterable
    facts = make_facts(make_step(data=data, fwd=0.15, bwd=0.15, opt=0.05, mean=mean), make_host(cores=8, cpu_busy=0.3),
                       loader)
    facts.proc["framework_version"] = version
    facts.loader_workers = {"workers": workers, "batches": sum(w["batches"] for w in workers),
                            "sample_ms": {"p50": 0.5, "p99": 40.0}, "slowest_1pct_share": 0.6,
                            "slowest": [{"index": 4800, "ms": 300.0, "worker": 0, "loader": 7}], "queue": q}
    facts.data_ipc_share = ipc
    return facts


def test_head_of_line_is_named_with_in_order_false_first():
    # worker 0 stalls (mean 80 ms a batch, p99 300 ms); the others 10 ms: together they could give a
    # batch every 80/4... the combined pace is 1/(1/80 + 3/10) / ... ≈ 3 ms a step, far under the 20 ms
    # of the loop's own work, so the wait behind worker 0 (90 % of the 30 ms wait) can all go
    workers = [worker(0, 50, 80.0, 300.0)] + [worker(i, 50, 10.0) for i in (1, 2, 3)]
    facts = facts_with(workers, queue(behind=0.9, empty=0.05, ready=5.0))
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "head_of_line"
    first = f["fix"]["options"][0]
    assert "in_order=False" in first["text"] and "in_order=False" in first["code"] and not first["assumed"]
    # 50 ms step, 27 ms waited behind: 50 / 23 ms = 2.17x
    assert first["est_speedup"] == pytest.approx(0.05 / (0.05 - 0.9 * 0.03), rel=0.01)
    # in order, worker 0 still delivers every 4th batch: 80 ms / 4 = 20 ms a step, under the 23 ms left
    pf = next(o for o in f["fix"]["options"] if "prefetch_factor" in o["text"])
    assert pf["est_speedup"] == pytest.approx(first["est_speedup"], rel=0.01)
    assert "worker 0" in f["summary"] and "4800" in f["summary"]
    part = f["evidence"]["loader_part"]
    assert part["slow_worker"] == 0 and part["behind_s_per_step"] == pytest.approx(0.027, rel=0.01)
    assert "# was" not in first["code"]  # only in_order changes


def test_head_of_line_prefetch_is_not_offered_when_the_slow_worker_cannot_keep_pace():
    workers = [worker(0, 50, 200.0, 400.0)] + [worker(i, 50, 10.0) for i in (1, 2, 3)]
    f = rules.input_bound(facts_with(workers, queue(behind=0.9, empty=0.05, ready=5.0)))
    assert f["evidence"]["cause"] == "head_of_line"
    assert not any("prefetch_factor=" in o["text"] for o in f["fix"]["options"])  # 200 / 4 = 50 ms: no gain


def test_a_throughput_bound_loader_is_not_head_of_line():
    # batches held now and then from jitter, but every worker takes 190 ms a batch: 47.5 ms a step at
    # best, the step is 50 ms: in_order=False would gain < 1.1x, so the workers' own cause stands
    workers = [worker(i, 50, 190.0, 200.0, busy=0.98) for i in range(4)]
    f = rules.input_bound(facts_with(workers, queue(behind=0.6, empty=0.4, ready=0.5)))
    assert f["evidence"]["cause"] not in ("head_of_line", "main_process_receive")
    assert loader_order.head_of_line(facts_with(workers, queue(behind=0.3, empty=0.7))) is None


def test_receiving_in_the_main_process_never_advises_more_workers():
    workers = [worker(i, 50, 5.0, busy=0.2) for i in range(4)]
    facts = facts_with(workers, queue(behind=0.5, empty=0.05, full=0.9, ready=7.6), data=0.3, ipc=0.8)
    facts.devices = {"batch_bytes": 0, "batch_tensors": None}  # batches of Python objects
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "main_process_receive" and f["evidence"]["loader_part"]["part"] == "objects"
    assert all("num_workers" not in (o["code"] or "") and "Raise num_workers" not in o["text"]
               for o in f["fix"]["options"])
    assert "7.6 of 8 batches were ready" in f["summary"] and f["evidence"]["suggested_num_workers"] == 4
    # 50 ms step, 15 ms wait, 80 % of it receiving: 50 / 38 ms
    assert f["est_speedup"] == pytest.approx(0.05 / (0.05 - 0.3 * 0.05 * 0.8), rel=0.01)
    # tensor batches: not "return tensors"; no estimate (what else they carry decides the fix)
    facts.devices = {"batch_bytes": 1 << 20, "batch_tensors": 2}
    f = rules.input_bound(facts)
    assert f["evidence"]["loader_part"]["part"] == "receive" and f["est_speedup"] is None
    assert "Return tensors" not in f["fix"]["text"] and "More workers would not help" in f["fix"]["text"]
    # a StatefulDataLoader snapshotting every batch: with tensor batches the receiving is the state
    facts.loader.update(snapshot_every_n_steps=1)
    facts.data_snapshot_share = 0.05
    f = rules.input_bound(facts)
    assert f["evidence"]["loader_part"]["part"] == "snapshot" and "snapshot_every_n_steps" in f["fix"]["text"]
    assert f["est_speedup"] == pytest.approx(0.05 / (0.05 - 0.3 * 0.05 * 0.85 * 0.99), rel=0.01)


def test_uneven_iterable_shards():
    # worker 0's shard 4x the others: 128 vs 32 batches of 65 ms; busy 8.3 vs 2.1 s, mean 3.6 s (2.3x)
    workers = [worker(0, 128, 65.0)] + [worker(i, 32, 65.0) for i in (1, 2, 3)]
    facts = facts_with(workers, queue(empty=0.9), data=0.55, mean=0.036, iterable=True)
    f = rules.input_bound(facts)
    assert_contract(f)
    assert f["evidence"]["cause"] == "uneven_shards"
    assert "worker 0 built 128 batches, the others 32 each" in f["summary"]
    # the loop's own 16 ms stay; the loader's pace gains 2.3x: 36 / max(16.2, 36 / 2.29) ms
    assert f["est_speedup"] == pytest.approx(0.036 / max(0.036 * 0.45, 0.036 / (128 / 56)), rel=0.01)
    facts.loader["iterable"] = False  # a map-style dataset: no shards
    assert rules.input_bound(facts)["evidence"]["cause"] != "uneven_shards"


def test_in_order_needs_pytorch_2_6():
    workers = [worker(0, 50, 80.0, 300.0)] + [worker(i, 50, 10.0) for i in (1, 2, 3)]
    f = rules.input_bound(facts_with(workers, queue(behind=0.9, empty=0.05, ready=5.0), version="2.4.1"))
    assert "PyTorch 2.6 or later; this run has 2.4.1" in f["fix"]["options"][0]["text"]


def test_settings_smells():
    loader = make_loader(nw=2, pin=True, persistent=True)
    loader.update(snapshot_every_n_steps=1, loader_class="StatefulDataLoader", dataset_set_epoch=True)
    facts = make_facts(make_step(data=0.02), make_host(), loader)
    f = rules.input_pipeline_config(facts, set())
    assert_contract(f)
    smells = " ".join(f["evidence"]["smells"])
    assert "snapshot_every_n_steps=1" in smells and "set_epoch" in smells and "pin_memory=True on a run without" in smells
    loader.update(snapshot_every_n_steps=1000, persistent_workers=False, pin_memory=False)
    f = rules.input_pipeline_config(facts, set())
    assert f is None or not any(w in " ".join(f["evidence"]["smells"]) for w in ("snapshot", "set_epoch", "pin_memory=True"))


def test_python_list_batches_converted_in_the_step():
    """Batches of Python lists: received and unpickled in the wait, then converted with torch.tensor in
    the step; both findings give the one fix (return tensors) with the same estimate."""
    workers = [worker(i, 50, 5.0, busy=0.2) for i in range(4)]
    facts = facts_with(workers, queue(empty=0.05, full=0.9, ready=7.6), data=0.25, ipc=0.8)
    facts.step = make_step(data=0.25, fwd=0.15, bwd=0.15, opt=0.05, other=0.4, mean=0.05)
    facts.devices = {"batch_bytes": 0, "batch_tensors": None}
    line = {"site": "train.py:85 main", "seconds": 2.0, "share": 0.38, "leaf": "train.py:85 main",
            "code": "x, y = torch.tensor(x), torch.tensor(y)"}
    facts.hotspots["other"] = [{"function": "train.py main", "site": "train.py:85 main", "seconds": 2.0, "share": 0.39,
                                "samples": 200, "leaf": "train.py:85 main", "library": False, "lines": [line]}]
    host = rules.host_bound(facts)
    assert host["evidence"]["kind"] == "batch_conversion" and "return tensors" in host["fix"]["text"]
    f = rules.input_bound(facts)
    assert f["evidence"]["cause"] == "main_process_receive" and "torch.tensor(x)" in f["summary"]
    # 0.25 x 0.8 received + 0.38 converted of the step
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.2 - 0.38), rel=0.01)
    assert host["est_speedup"] == pytest.approx(1 / (1 - 0.2 - 0.39), rel=0.02)
    facts.devices = {"batch_bytes": 4096, "batch_tensors": 2}  # tensors crossed: the line is other work
    assert rules.host_bound(facts)["evidence"]["kind"] == "python_compute"
