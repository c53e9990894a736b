"""A folder of rank traces: the culprit rank from its collectives' arrival, its cause, read in
parallel processes (analysis/trace_collectives.py, analysis/trace_job.py), and real gloo jobs
profiled under torchrun."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from whyidle.analysis import trace_collectives as tc
from whyidle.analysis import trace_job as tj
from whyidle.pipeline import trace_report

SCENARIOS = os.path.join(os.path.dirname(__file__), "scenarios")
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def rank_trace(rank, world, data=1000.0, compute=3000.0, host=500.0, steps=5, step_us=20_000.0, transfer=400.0,
               late=None, collectives=2, group=None, gpu=True, start=1_000_000.0):
    """One rank's Kineto trace (a dict) of a synchronous data-parallel job, in µs: per step the
    DataLoader (``data``), then ``compute`` of GPU kernels (of CPU operators without ``gpu``),
    then ``host`` of untraced Python, then ``collectives`` all-reduces on one stream: the first
    ends ``transfer`` after the latest rank arrives (``late``: that arrival offset in the step,
    the slowest rank's data + compute + host), the next ones follow in step on every rank."""
    late = late if late is not None else data + compute + host
    ev, corr = [], 1000
    for i in range(steps):
        t0 = start + i * step_us
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{10 + i}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": step_us})
        ev.append({"ph": "X", "cat": "user_annotation", "name": LOADER, "pid": 1, "tid": 1, "ts": t0, "dur": data})
        if gpu:
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t0 + data, "dur": 5, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t0 + data + 10,
                       "dur": compute, "args": {"device": 0, "stream": 7, "correlation": corr}})
        else:
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + data,
                       "dur": compute})
        start, end = t0 + data + compute + host + 20, t0 + late + 20 + transfer
        for k in range(collectives):
            if k:  # the next bucket follows on the same stream, every rank in step now
                start = end + 50
                end = start + transfer
            if gpu:
                corr += 1
                args = {"device": 0, "stream": 40, "correlation": corr}
                if group:
                    args["Group size"] = group
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": start - 15, "dur": 5, "args": {"correlation": corr}})
                ev.append({"ph": "X", "cat": "kernel", "name": NCCL, "pid": 0, "tid": 40, "ts": start,
                           "dur": end - start, "args": args})
            else:
                ev.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9,
                           "ts": start, "dur": end - start})
    out = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl" if gpu else "gloo", "rank": rank,
                                                   "world_size": world}, "traceEvents": ev}
    if gpu:
        out["deviceProperties"] = [{"id": 0, "name": "Fake GPU"}]
    return out


def write_job(folder, ranks: dict, world=None, prefix="rank", **common):
    """``ranks``: rank → overrides of :func:`rank_trace`; every rank's ``late`` is the slowest one's
    arrival. Files alternate .json / .json.gz."""
    os.makedirs(folder, exist_ok=True)
    world = world or len(ranks)
    spec = {r: {**common, **o} for r, o in ranks.items()}
    late = max(s.get("data", 1000.0) + s.get("compute", 3000.0) + s.get("host", 500.0) for s in spec.values())
    for r, s in spec.items():
        doc = json.dumps(rank_trace(r, world, late=late, **s)).encode()
        path = os.path.join(str(folder), f"{prefix}-{r}.json" + (".gz" if r % 2 else ""))
        with (gzip.open(path, "wb") if r % 2 else open(path, "wb")) as f:
            f.write(doc)
    return str(folder)


def imbalance_of(rep):
    return next((f for f in rep["findings"] if f["id"] == "imbalance"), None)


@pytest.mark.parametrize("part, slow", [("data_wait", {"data": 7000.0}), ("compute", {"compute": 9000.0}),
                                        ("host", {"host": 6500.0})])
def test_the_culprit_is_the_rank_that_arrives_last_and_its_cause_is_what_it_does_more(tmp_path, part, slow):
    folder = write_job(tmp_path / "job", {0: {}, 1: {}, 2: slow, 3: {}})
    rep = trace_report(folder, workers=2)
    s = rep["straggler"]
    assert s["rank"] == 2 and s["measured"] is True and s["culprit_share"] == 1.0
    assert s["steps"] == 5 and s["late_steps"] == 5
    assert s["excess_s"] == pytest.approx(0.006, abs=2e-4)          # 6 ms more than the others' 4.5 ms
    assert s["excess_share"] == pytest.approx(0.006 / 0.020, abs=0.01)
    assert s["cause"]["part"] == part
    if part != "host":
        assert s["cause"]["extra_s"] == pytest.approx(0.006, abs=2e-4)
    assert rep["collectives"]["kind"] == "nccl" and rep["collectives"]["matched"] == 10
    waits = {r["rank"]: r["wait_s"] for r in rep["ranks"]}
    assert waits[2] == pytest.approx(0.0) and all(waits[r] == pytest.approx(0.006, abs=2e-4) for r in (0, 1, 3))
    f = imbalance_of(rep)
    ev = f["evidence"]
    assert ev["culprit_rank"] == 2 and ev["culprit_share"] == 1.0 and ev["measured"] is True
    assert set(ev["wait_s_per_step"]) == {"0", "1", "3"}
    assert f["bound"] == pytest.approx(0.3, abs=0.01) and f["est_speedup"] == pytest.approx(1 / 0.7, rel=0.02)
    assert "Rank 2 is the straggler" in f["summary"]
    assert any("rank 2's (the straggler)" in n for n in rep["notes"])   # the report describes it


def test_a_balanced_job_has_no_straggler_and_is_described_by_its_first_rank(tmp_path):
    folder = write_job(tmp_path / "job", {0: {}, 1: {}, 2: {"host": 600.0}})   # 0.1 ms: jitter
    rep = trace_report(folder, workers=1)
    assert rep["straggler"] is None and imbalance_of(rep) is None
    assert rep["collectives"]["steps"] == 5 and rep["collectives"]["late_steps"] == 0
    assert any("rank 0's" in n for n in rep["notes"])


def test_collectives_that_do_not_match_fall_back_to_step_times_with_a_note(tmp_path):
    folder = write_job(tmp_path / "job", {0: {}, 1: {"collectives": 3, "data": 6000.0}})
    rep = trace_report(folder)
    assert rep["collectives"]["steps"] == 0 and rep["collectives"]["skipped"] == 5
    assert rep["straggler"]["measured"] is False
    assert any("did not match" in n for n in rep["notes"])


def test_sub_group_collectives_are_left_out(tmp_path):
    folder = write_job(tmp_path / "job", {0: {}, 1: {"host": 7000.0}}, world=8, group=4)  # tensor-parallel: 4 of 8
    rep = trace_report(folder)
    assert rep["collectives"] is None and rep["straggler"]["measured"] is False


def test_cpu_only_gloo_ranks_meet_at_their_gloo_executions(tmp_path):
    folder = write_job(tmp_path / "job", {0: {}, 1: {"compute": 8000.0}}, gpu=False)
    rep = trace_report(folder)
    assert rep["collectives"]["kind"] == "gloo"
    assert rep["straggler"]["rank"] == 1 and rep["straggler"]["cause"]["part"] == "compute"
    assert rep["verdict"] == "imbalance"
    assert "operators" in imbalance_of(rep)["summary"]


def test_an_unreadable_rank_file_is_skipped_with_a_note_and_all_unreadable_exits_2(tmp_path):
    folder = write_job(tmp_path / "job", {0: {}, 1: {}, 2: {"data": 7000.0}})
    with open(os.path.join(folder, "rank-3.json"), "w") as f:
        f.write('{"traceEvents": [{"ph": "X", "ts": 1')       # a rank killed mid-write
    rep = trace_report(folder, workers=2)
    assert rep["straggler"]["rank"] == 2 and len(rep["ranks"]) == 3
    assert any(n.startswith("skipped (unreadable):") and "rank-3.json" in n for n in rep["notes"])
    assert any(n.startswith("1 of 4 trace files could not be read") for n in rep["notes"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.json").write_text("{")
    (bad / "b.json.gz").write_bytes(b"\x1f\x8b\x08garbage")
    r = subprocess.run([sys.executable, "-m", "whyidle", "trace", str(bad)], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_parallel_and_sequential_reading_agree_and_workers_fit_memory(tmp_path):
    folder = write_job(tmp_path / "job", {r: ({"data": 6000.0} if r == 5 else {}) for r in range(8)})
    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    one, two = tj.read_ranks(paths, workers=1), tj.read_ranks(paths, workers=2)
    assert [s.rank for s in one] == [s.rank for s in two] and [s.collectives for s in one] == [s.collectives for s in two]
    size = tj.json_bytes(paths[1])                      # a .gz: the size its trailer records
    assert size == len(json.dumps(rank_trace(1, 8, late=7500.0)).encode())
    assert tj.plan_workers(paths, available=10**12) == min(len(os.sched_getaffinity(0)), 8)
    assert tj.plan_workers(paths, available=100 * 2**20) == 1   # 50 MB for workers of ≥ 64 MB each
    assert tj.plan_workers(paths, workers=3) == 3


def test_match_compares_only_groups_every_rank_holds_equally_and_counts_overlaps_once():
    rows = lambda *r: {"kind": "nccl", "rows": list(r), "outside": 0, "compute_s": {}}
    m = tc.match({0: rows((1, "a", 0.0, 10_000.0), (1, "b", 0.0, 2_000.0), (2, "a", 0.0, 11_000.0)),
                  1: rows((1, "a", 6_000.0, 4_000.0), (2, "a", 0.0, 3_000.0), (2, "a", 5_000.0, 1_000.0))})
    assert m["waits"] == {0: {1: pytest.approx(0.010)}, 1: {1: pytest.approx(0.004)}}
    assert m["matched"] == 1 and m["skipped"] == 2 and m["missing"] == []
    assert tc.match({0: rows((1, "a", 0.0, 10_000.0)), 1: rows()}) is None
    # gloo runs two gradient buckets on two threads at once: 10 ms of collectives, not 18
    both = tc.match({0: rows((1, "a", 0.0, 10_000.0), (1, "a", 2_000.0, 8_000.0)),
                     1: rows((1, "a", 7_000.0, 3_000.0), (1, "a", 7_500.0, 2_500.0))})
    assert both["waits"] == {0: {1: pytest.approx(0.010)}, 1: {1: pytest.approx(0.003)}}


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("kind, part, verdict", [("loader", "data_wait", "input_bound"), ("compute", "compute", "imbalance"),
                                                 ("host", "host", "imbalance"), ("fixed", None, None)])
def test_real_gloo_jobs_profiled_under_torchrun(tmp_path, kind, part, verdict):
    """Each rank writes a torch.profiler trace (2 ranks, gloo); rank 1 has a slow loader, more
    operator work in its forward or extra Python, or none (fixed)."""
    out = tmp_path / "traces"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(SCENARIOS, "ddp_straggler.py"), "--kind", "host" if kind == "fixed" else kind,
           "--steps", "64" if kind == "fixed" else "24", "--profile", str(out)] + (["--fixed"] if kind == "fixed" else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    rep = trace_report(str(out))
    # the balanced job runs longer: a lone hiccup of a shared 2-core box (30 ms once) then costs
    # less than 1 ms per step on average
    assert rep["collectives"]["kind"] == "gloo" and rep["collectives"]["steps"] == (60 if kind == "fixed" else 20)
    if part is None:
        assert rep["straggler"] is None and imbalance_of(rep) is None
        return
    s = rep["straggler"]
    assert s["rank"] == 1 and s["measured"] and s["culprit_share"] >= 0.8 and s["cause"]["part"] == part
    assert 0.015 < s["excess_s"] < 0.06               # ~25-32 ms of injected work per step
    assert rep["verdict"] == verdict                  # the slow loader: rank 1's own input_bound


def test_the_stragglers_own_estimates_stop_at_the_others_pace_unless_the_others_share_the_cause(tmp_path):
    own = trace_report(write_job(tmp_path / "own", {0: {}, 1: {}, 2: {"data": 7000.0}, 3: {}}))
    by_id = {f["id"]: f for f in own["findings"]}
    assert by_id["input_bound"]["evidence"]["est_capped_by"] == "imbalance"          # only rank 2 waits for data
    assert by_id["input_bound"]["est_speedup"] == pytest.approx(by_id["imbalance"]["est_speedup"])
    assert by_id["imbalance"]["severity"] == "info" and "input_bound" in by_id["imbalance"]["fix"]["text"]
    shared = trace_report(write_job(tmp_path / "shared", {0: {"data": 10000.0}, 1: {"data": 10000.0},
                                                           2: {"data": 10000.0, "host": 6500.0}}, step_us=30000.0))
    by_id = {f["id"]: f for f in shared["findings"]}
    assert "est_capped_by" not in by_id["input_bound"]["evidence"]                  # every rank waits for data
    assert by_id["input_bound"]["est_speedup"] > by_id["imbalance"]["est_speedup"]
    assert by_id["imbalance"]["severity"] == "warning" and by_id["imbalance"]["evidence"]["cause"]["part"] == "host"


def test_a_folder_of_two_runs_is_reported_by_the_newest_runs_ranks(tmp_path):
    folder = tmp_path / "runs"
    write_job(folder, {0: {}, 1: {"data": 7000.0}}, prefix="first")                        # rank 1 slow
    write_job(folder, {0: {"host": 7000.0}, 1: {}}, prefix="second", start=61_000_000.0)  # a minute later: rank 0
    rep = trace_report(str(folder))
    assert sorted(os.path.basename(f) for f in rep["files"]) == ["second-0.json", "second-1.json.gz"]
    assert rep["straggler"]["rank"] == 0 and any("newest run's 2 rank(s)" in n for n in rep["notes"])
    one = trace_report(str(folder / "second-1.json.gz"))
    assert "ranks" not in one
    alone = trace_report(str(tmp_path / "runs"), rank=1)
    assert [os.path.basename(f) for f in alone["files"]] == ["second-1.json.gz"]
    assert any(n.startswith("Rank 1's trace alone, of 2 ranks here") for n in alone["notes"])
