"""Collective timing (instrument/collectives.py) and the measured culprit
(analysis/collectives.py, analysis/ranks.py), the ``metric_collectives`` finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_diagnose import assert_contract
from test_ranks import dist_facts, row
from test_rules_work import make_facts, make_step

from whyidle.analysis import collectives as C
from whyidle.analysis import ranks as R
from whyidle.diagnose.rules_ranks import accumulation_all_reduce, imbalance, metric_collectives
from whyidle.instrument.collectives import CollectiveTimer


def waits_of(per_step: dict, n: int = 40) -> dict:
    """rank → step → seconds: ``per_step(rank, i)``."""
    return {r: {i: per_step(r, i) for i in range(n)} for r in (0, 1, 2)}


def test_the_rank_with_the_least_time_in_collectives_arrived_last():
    # rank 2 arrives 20 ms late every step: ranks 0 and 1 wait 20 ms more in the all-reduce
    w = waits_of(lambda r, i: 0.0005 + (0.0 if r == 2 else 0.020) + 0.0001 * (i % 3))
    m = C.culprit(w, {0: 0.030, 1: 0.030, 2: 0.030})
    assert m["rank"] == 2 and m["culprit_share"] == 1.0 and m["caused_share"] == 1.0 and m["steps"] == 40 - C.SKIP_STEPS
    assert m["late_steps"] == m["steps"] and m["wait_s_by_rank"]["0"] == pytest.approx(0.020)
    assert m["wait_s_by_rank"]["2"] == 0.0 and m["caused_s"] == pytest.approx(0.020)
    assert m["wait_share"] == pytest.approx(0.020 / 0.030)
    assert C.culprit({0: w[0]}, {0: 0.03}) is None  # one rank
    assert C.culprit({r: dict(list(v.items())[:5]) for r, v in w.items()}, {0: 0.03, 1: 0.03, 2: 0.03}) is None


def test_jitter_names_no_culprit():
    # each rank late now and then by ~3 ms (a loaded box): no rank stands out
    w = {r: {i: 0.001 + (0.003 if (i + r) % 2 else 0.0) for i in range(60)} for r in (0, 1)}
    m = C.culprit(w, {0: 0.01, 1: 0.01})
    assert m["rank"] is None and m["wait_share"] == 0.0 and m["late_steps"] > 0
    assert R.straggler([row(0), row(1)], measured=m) is None  # the measurement decides: no straggler


def test_an_intermittent_straggler_and_what_it_did_in_its_late_steps():
    # rank 0 evaluates alone every 10 steps (80 ms): rank 1 waits then
    w = {0: {i: 0.001 for i in range(60)}, 1: {i: 0.001 + (0.080 if i % 10 == 0 else 0.0) for i in range(60)}}
    m = C.culprit(w, {0: 0.012, 1: 0.012})
    assert m["rank"] == 0 and m["late_steps"] == 5 and sorted(m["late_at"]) == [10, 20, 30, 40, 50]
    ms = 1_000_000
    rows = [{"i": i, "t0": i * 100 * ms, "t1": i * 100 * ms + (84 if i % 10 == 0 else 4) * ms, "data": ms, "fwd": ms,
             "bwd": ms, "opt": 0, "eval": 0} for i in range(60)]
    regions = [{"k": "region", "kind": "evaluation", "t0": i * 100 * ms + 2 * ms, "t1": i * 100 * ms + 82 * ms}
               for i in range(10, 60, 10)]
    cause = R.late_cause(rows, m["late_at"], m["compared"], regions)
    assert cause["phase"] == "evaluation" and cause["extra_s"] == pytest.approx(0.080) and cause["steps"] == 5
    assert R.late_cause(rows, m["late_at"], m["compared"])["phase"] == "other_host"  # without the regions
    assert R.late_cause(rows, {i: 1.0 for i in range(2, 60)}, m["compared"]) is None  # late in most steps

    ranks = [row(0, mean=0.012, pid=10), row(1, mean=0.012, pid=11)]
    measured = R.measure_collectives(ranks, {10: w[0], 11: w[1]}, {10: rows}, {10: regions})
    assert ranks[1]["wait_s"] == pytest.approx(0.080 * 5 / 58) and ranks[0]["collective_s"] == pytest.approx(0.001)
    s = R.straggler(ranks, measured=measured)
    assert s["rank"] == 0 and s["measured"] and s["late_cause"]["phase"] == "evaluation"
    f = imbalance(dist_facts(ranks).replace(straggler=s), [])
    assert_contract(f)
    assert f["evidence"]["culprit_rank"] == 0 and f["evidence"]["culprit_share"] == 1.0
    assert f["evidence"]["wait_s_per_step"] == {"1": pytest.approx(0.080 * 5 / 58, abs=1e-4)}
    assert "evaluation took 80.0 ms more" in f["fix"]["text"] and "DistributedSampler" in f["fix"]["text"]
    # sharding the evaluation over 2 ranks removes half the wait
    assert f["est_speedup"] == pytest.approx(1 / (1 - f["bound"] / 2), rel=0.01)


def test_step_waits_skip_damaged_rows():
    recs = [{"k": "colls", "rows": [[3, 1, 2_000_000, 1, 0, 1, 500_000], [4, "x"], None, [5, 0, 0, -1, 0, 1, None]]},
            {"k": "colls", "rows": "bad"}, {"k": "step"}]
    assert C.step_waits(recs) == {3: pytest.approx(0.0025), 5: 0.0}


def test_timer_rows_resolve_the_first_buckets_completion_at_flush():
    out = []
    t = CollectiveTimer(out.append, tid=1)
    slot = t.arrive(0)
    assert t.arrive(1) is None and t.buckets == 2  # only the step's first bucket is timed
    t.backward_done()
    t.arrive(0)  # a second backward reduces the gradient again (accumulation without no_sync)
    t.n, t.ns, t.numel = 2, 3_000, 4
    t.end_step(7)
    t.end_step(8)  # nothing in it: no row
    t.arrive(0)
    t.end_step(9)  # its backward was not timed (a step with the hooks out): exposed unknown
    slot[1] = slot[0] + 1_500  # the backend's thread completes the bucket
    t.flush()
    rows = out[0]["rows"]
    assert rows[0][:8] == [7, 2, 3_000, 4, 0, 3, 1_500, 2] and rows[0][8] >= 0
    assert rows[1][0] == 9 and rows[1][7] == 1 and rows[1][8] is None


def test_accumulation_that_reduces_every_micro_batch():
    ms = 1_000_000
    recs = [{"k": "colls", "rows": [[i, 0, 0, -1, 0, 8, 2 * ms, 4, 80 * ms] for i in range(30)]}]
    steps = [{"i": i, "mb": 4} for i in range(30)]
    acc = C.accumulation(recs, steps)
    assert acc["micro"] == 4 and acc["rounds"] == 4 and acc["steps"] == 28
    assert acc["exposed_s"] == pytest.approx(0.080) and acc["redundant_s"] == pytest.approx(0.060)
    facts = make_facts(kind="cpu", step=make_step(mean=0.134)).replace(accumulation=acc)
    f = accumulation_all_reduce(facts)
    assert_contract(f)
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.060 / 0.134, rel=0.01)
    assert "no_sync" in f["fix"]["text"] and "set_requires_gradient_sync" in f["fix"]["text"]
    once = [{"k": "colls", "rows": [[i, 0, 0, -1, 0, 2, 2 * ms, 1, 5 * ms] for i in range(30)]}]
    assert C.accumulation(once, steps) is None  # no_sync on all but the last micro-batch
    assert C.accumulation(recs, [{"i": i, "mb": 1} for i in range(30)]) is None  # no accumulation
    old = [{"k": "colls", "rows": [[i, 0, 0, -1, 0, 1, 2 * ms] for i in range(30)]}]
    assert C.accumulation(old, steps) is None  # rows written before the rounds column


def metric_facts(per_step=4.0, s_per_step=0.0024, small=1.0, steps=58):
    facts = make_facts(kind="cpu", step=make_step(mean=0.0057))
    return facts.replace(collectives={"steps": steps, "per_step": per_step, "s_per_step": s_per_step,
                                      "small_share": small})


def test_metric_collectives_every_step_are_a_finding_with_their_measured_time():
    f = metric_collectives(metric_facts())
    assert_contract(f)
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.0024 / 0.0057, rel=0.01)
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.0024 / 0.0057), rel=0.01) and "sync_dist" in f["fix"]["text"]
    assert metric_collectives(metric_facts(s_per_step=0.0001))["severity"] == "info"  # cheap: still a smell
    assert metric_collectives(metric_facts(per_step=1.0, s_per_step=0.0001)) is None  # Lightning's own one
    assert metric_collectives(metric_facts(small=0.0)) is None  # large tensors: not metrics
    assert metric_collectives(metric_facts(steps=5)) is None  # not in most steps (make_step: 20)
    assert metric_collectives(make_facts(kind="cpu", step=make_step())) is None


SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from whyidle.instrument import collectives
    from whyidle.instrument.collectives import CollectiveTimer
    import threading
    rows, notices = [], []
    timer = CollectiveTimer(rows.append, threading.get_ident())
    collectives.install(torch, timer, notices.append)
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    model = DDP(torch.nn.Linear(4, 2))
    calls = []
    def my_hook(state, bucket):
        calls.append(state)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    if sys.argv[1] == "user":
        model.register_comm_hook("mine", my_hook)
    for i in range(3):
        model(torch.randn(8, 4)).sum().backward()
        t = torch.ones(1)
        dist.all_reduce(t)
        timer.end_step(i)
    again = None
    try:
        model.register_comm_hook(None, my_hook)
    except Exception as exc:
        again = type(exc).__name__
    timer.flush()
    print(json.dumps({"rows": rows, "calls": calls, "again": again, "notices": notices,
                      "hook": model._get_ddp_logging_data().get("comm_hook")}))
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("mode", ["default", "user"])
def test_ddp_gradient_buckets_are_timed_and_the_programs_hook_still_runs(tmp_path, mode):
    """The trampoline hook: without a program hook PyTorch's allreduce_hook runs; a hook the
    program registers later runs instead (DDP's logging names it) and a second one is refused, as
    DDP refuses it without whyidle."""
    script = tmp_path / "ddp_hook.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = out["rows"][0]["rows"]
    assert [r[0] for r in rows] == [0, 1, 2] and all(r[1] == 1 and r[3] == 1 and r[5] == 1 and r[7] == 1 for r in rows)
    assert all(isinstance(r[6], int) and r[6] >= 0 for r in rows) and not out["notices"]
    if mode == "user":
        assert out["calls"] == ["mine"] * 3 and out["hook"] == "my_hook"
        assert out["again"] == "RuntimeError"  # DDP takes one communication hook, as without whyidle
    else:
        assert out["calls"] == [] and out["again"] is None  # the program's first hook is taken, even late


def test_one_model_call_per_micro_batch_is_not_a_module_loop():
    from whyidle.diagnose.rules_work import module_loop

    loop = {"cls": "DistributedDataParallel", "calls_per_step": 4, "forward_s_per_step": 0.020,
            "share_of_step": 0.5, "params": 4_000_000, "batch": 4, "site": None}
    facts = make_facts(kind="cpu", step=make_step(fwd=0.3, bwd=0.6, data=0.0, opt=0.05)).replace(module_loops=[loop])
    assert module_loop(facts.replace(analyzed_steps=[{"i": i, "mb": 4} for i in range(10)])) is None
    assert module_loop(facts.replace(analyzed_steps=[{"i": i, "mb": 1} for i in range(10)]))["bound"] > 0.5


def test_data_parallel_and_distributed_settings_are_reported():
    from whyidle.diagnose.rules_ranks import data_parallel, dist_config
    from whyidle.instrument.torch import parallel_wrappers

    import torch

    dp = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    assert parallel_wrappers([dp, torch.nn.Linear(2, 2)]) == [{"kind": "DataParallel", "devices": 0}]
    base = make_facts(kind="cuda")
    f = data_parallel(base.replace(devices={"wrappers": [{"kind": "DataParallel", "devices": 4}]}))
    assert_contract(f)
    assert f["severity"] == "warning" and "DistributedDataParallel" in f["fix"]["code"]
    assert data_parallel(base.replace(devices={"wrappers": [{"kind": "DataParallel", "devices": 0}]}))["severity"] == "info"
    assert data_parallel(base.replace(devices={"wrappers": [{"kind": "DistributedDataParallel"}]})) is None
    cfg = dist_config(base.replace(devices={"params": {"cuda": 10}, "dist": {"backend": "gloo"},
                                            "nccl_env": {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"}}))
    assert_contract(cfg)
    assert cfg["severity"] == "info" and cfg["evidence"]["transports_off"] == ["NCCL_P2P_DISABLE"]
    assert "gloo" in cfg["summary"] and "peer-to-peer" in cfg["summary"]
    assert dist_config(base.replace(devices={"params": {"cpu": 10}, "dist": {"backend": "gloo"},
                                             "nccl_env": {"NCCL_P2P_DISABLE": "0"}})) is None


def test_which_backends_block_the_host():
    from whyidle.instrument.collectives import host_synchronous

    assert host_synchronous("gloo") and host_synchronous("mpi")
    assert not host_synchronous("nccl") and not host_synchronous("cpu:gloo,cuda:nccl")
    torch = __import__("torch")  # imported first: host_synchronous reads an imported torch only
    assert host_synchronous("undefined") is (not torch.cuda.is_available())


def test_the_stragglers_own_estimates_stop_at_the_other_ranks_pace():
    from whyidle.diagnose import _cap_at_the_others_pace

    own = {"id": "host_bound", "evidence": {}, "est_speedup": 3.5,
           "fix": {"options": [{"est_speedup": 3.5}, {"est_speedup": 1.2}]}}
    job = {"id": "eval_bound", "evidence": {"part_s": 4.0}, "est_speedup": 3.0, "fix": {"options": []}}
    _cap_at_the_others_pace([own, job], {"est_speedup": 2.45})
    assert own["est_speedup"] == 2.45 and [o["est_speedup"] for o in own["fix"]["options"]] == [2.45, 1.2]
    assert own["evidence"]["est_capped_by"] == "imbalance" and job["est_speedup"] == 3.0
