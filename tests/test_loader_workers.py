"""DataLoader workers timing their own batches (instrument/loader_workers.py), the reader's tallies
(record/loader_workers.py) and ``metrics.loader_workers`` (analysis/loader_workers.py)."""

from __future__ import annotations

import glob
import json
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset, IterableDataset  # noqa: E402

from whyidle.analysis.loader_workers import worker_facts  # noqa: E402
from whyidle.instrument import agent as wagent  # noqa: E402
from whyidle.record.loader_workers import BINS_PER_OCTAVE, read_loader_files  # noqa: E402

SLOW = 7  # the sample index that sleeps (and every 64th after it: always worker 0's batch at 16 × 2 workers)


class Slow(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        if i % 64 == SLOW:
            time.sleep(0.02)
        return torch.full((4,), float(i))


class Many(Dataset):  # fetched by __getitems__ (one call per batch: no per-sample times)
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([i])

    def __getitems__(self, indices):
        return [torch.tensor([i]) for i in indices]


class Uneven(IterableDataset):  # worker 0's shard 4× worker 1's
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        yield from (torch.tensor([i]) for i in range(40 if info.id == 0 else 10))


def slow_collate(batch):
    time.sleep(0.003)
    return torch.stack(batch)


@pytest.fixture
def watched(tmp_path):
    """This process observed by an in-process agent writing into ``tmp_path`` (stack sampler off)."""
    agent = wagent.start(str(tmp_path), 0)
    try:
        yield agent
    finally:
        agent.stop()


def records(run_dir) -> dict[int, list[dict]]:
    out = {}
    for f in glob.glob(os.path.join(run_dir, "loader-*.jsonl")):
        out[int(f.rsplit("-", 1)[1].split(".")[0])] = [json.loads(line) for line in open(f)]
    return out


def test_workers_record_each_batch_and_leave_it_unchanged(watched, tmp_path):
    loader = DataLoader(Slow(), batch_size=16, num_workers=2, collate_fn=slow_collate)
    got = list(loader)
    want = [torch.stack([Slow()[i] for i in range(k, k + 16)]) for k in range(0, 256, 16)]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    recs = records(tmp_path)
    assert len(recs) == 2  # one file per worker process
    by_worker = {rs[0]["w"]: rs for rs in recs.values()}
    assert sorted(by_worker) == [0, 1] and all(len(rs) == 8 for rs in by_worker.values())
    for rs in by_worker.values():
        assert [r["i"] for r in rs] == list(range(8))
        for r in rs:
            assert r["k"] == "wbatch" and r["ld"] == id(loader) and r["n"] == 16
            assert r["t1"] - r["t0"] >= r["s"] + r["c"] > 0
            assert r["c"] >= 3e6  # the collate's 3 ms sleep
            assert sum(count for _b, count in r["h"]) == 16
    # the slow samples: in worker 0's batches, each its batch's slowest
    slow = [r["slow"][0] for r in by_worker[0] if r["slow"][0][1] > 15e6]
    assert sorted(index for index, _ns in slow) == [7, 71, 135, 199]
    assert all(r["slow"][0][1] < 15e6 for r in by_worker[1])


def test_report_names_the_worker_that_holds_the_batches(watched, tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in DataLoader(Slow(), batch_size=16, num_workers=2):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    watched.stop()
    from whyidle.pipeline import report_run

    lw = report_run(str(tmp_path))["metrics"]["loader_workers"]
    assert lw["batches"] == 16
    w0, w1 = lw["workers"]
    assert (w0["worker"], w1["worker"]) == (0, 1) and w0["batches"] == w1["batches"] == 8
    assert w0["batch_ms"]["p95"] >= 15 > w1["batch_ms"]["p95"]  # half of worker 0's batches hold a 20 ms sample
    assert 0 < w1["busy_share"] < w0["busy_share"] <= 1
    assert w0["fetch_share"] > 0.8
    assert {e["index"] for e in lw["slowest"][:4]} == {7, 71, 135, 199}
    assert all(e["worker"] == 0 and 15 < e["ms"] < 200 for e in lw["slowest"][:4])
    assert lw["sample_ms"]["p99"] >= 10
    timeline = json.load(open(os.path.join(tmp_path, "timeline.json")))["traceEvents"]
    batches = [e for e in timeline if e.get("cat") == "loader_worker"]
    assert len(batches) == 16 and {e["pid"] for e in batches} == {w0["pid"], w1["pid"]}
    assert sorted(e["args"]["samples"] for e in batches) == [16] * 16
    names = {e["pid"]: e["args"]["name"] for e in timeline if e.get("name") == "process_name"}
    assert names[w0["pid"]] == f"DataLoader worker 0 ({w0['pid']})"
    slow = [e for e in batches if e["pid"] == w0["pid"] and e["dur"] >= 15_000]  # µs
    assert len(slow) == 4
    from whyidle.report.plots import workers_plot
    from whyidle.analysis.series import worker_batches
    from whyidle.record.reader import load_run

    rows = worker_batches(load_run(str(tmp_path)).loader_workers, 0)
    plot = workers_plot(rows)
    assert [t["name"] for t in plot.figure["data"]] == [f"worker 0 ({w0['pid']})", f"worker 1 ({w1['pid']})"]
    assert [len(t["x"]) for t in plot.figure["data"]] == [8, 8] and not plot.notes
    assert sum(d >= 0.015 for d in plot.figure["data"][0]["x"]) == 4
    assert "DataLoader workers: which worker built which batch" in open(os.path.join(tmp_path, "report.html")).read()
    assert workers_plot([]).why
    from whyidle.report.terminal import workers_line

    line = workers_line(lw)
    assert line.startswith("2 processes (their own time per batch: p50 ") and "building batches " in line
    assert "(worker 0)" in line and f"index {lw['slowest'][0]['index']} " in line
    assert workers_line(None) is None and workers_line({"workers": []}) is None


def test_iterable_unbatched_and_getitems_datasets(watched, tmp_path):
    assert sum(len(b) for b in DataLoader(Uneven(), batch_size=4, num_workers=2)) == 50
    per_worker = {rs[0]["w"]: rs for rs in records(tmp_path).values()}
    assert [r["n"] for r in per_worker[0]] == [4] * 10
    assert [r["n"] for r in per_worker[1]] == [4, 4, 2]  # the last, short batch; the ended fetch is not one
    for f in glob.glob(os.path.join(tmp_path, "loader-*.jsonl")):
        os.remove(f)
    assert len(list(DataLoader(Slow(), batch_size=None, num_workers=1, sampler=range(3)))) == 3  # no auto-collation
    (rs,) = records(tmp_path).values()
    assert [(r["n"], r["slow"][0][0]) for r in rs] == [(1, 0), (1, 1), (1, 2)]
    for f in glob.glob(os.path.join(tmp_path, "loader-*.jsonl")):
        os.remove(f)
    assert [b.flatten().tolist() for b in DataLoader(Many(), batch_size=32, num_workers=1)] == [
        list(range(32)), list(range(32, 64))]
    (rs,) = records(tmp_path).values()
    assert [(r["n"], r["h"], r["slow"]) for r in rs] == [(32, None, None)] * 2  # one call per batch: not per sample


def test_main_process_loading_and_a_stopped_agent_write_nothing(tmp_path):
    agent = wagent.start(str(tmp_path), 0)
    try:
        assert len(list(DataLoader(Slow(), batch_size=64))) == 4  # num_workers=0: the main process's data wait
        assert not records(tmp_path)
        agent.halt("recording stopped for the test")
        assert len(list(DataLoader(Slow(), batch_size=64, num_workers=1))) == 4
        assert not records(tmp_path)  # workers forked after the agent stopped record nothing
    finally:
        agent.stop()
    assert len(list(DataLoader(Slow(), batch_size=64, num_workers=1))) == 4  # PyTorch's own fetchers back
    assert not records(tmp_path)


def _line(**kw) -> str:
    rec = {"k": "wbatch", "t": 0, "w": 0, "ld": 5, "i": 0, "t0": 0, "t1": 0, "n": 2, "s": 0, "c": 0, "cpu": 0,
           "h": [[3, 2]], "slow": [[1, 10]]}
    rec.update(kw)
    return json.dumps(rec, separators=(",", ":"))


def test_reader_folds_batches_and_leaves_damage_out(tmp_path):
    lat = np.random.default_rng(1).lognormal(np.log(2e6), 0.5, 2000).astype(np.int64)
    lines = [_line(i=i, t0=10**9 + 3 * int(lat[:i].sum()), t1=10**9 + 3 * int(lat[:i].sum()) + int(v), s=int(v) // 2,
                   c=int(v) // 4, cpu=int(v) // 2, slow=[[i, int(v) // 3]]) for i, v in enumerate(lat)]
    lines.insert(10, "not json")
    lines.insert(20, _line(t0=5, t1=4))  # ends before it starts
    text = "\n".join(lines) + "\n" + _line()[:30]  # a last line cut short by a kill
    (tmp_path / "loader-42.jsonl").write_text(text)
    tallies, problems = read_loader_files(str(tmp_path))
    assert problems == ["loader-42.jsonl: 3 damaged lines left out"]
    tally = tallies[42]
    assert (tally.pid, tally.worker, tally.loader, tally.batches, tally.samples) == (42, 0, 5, 2000, 4000)
    assert tally.busy_ns == int(lat.sum()) and tally.samples_ns == int((lat // 2).sum())
    assert tally.sample_hist == {3: 4000}
    assert [e[0] for e in tally.slowest] == list(np.argsort(-lat, kind="stable")[:8])
    facts = worker_facts(tallies)
    (row,) = facts["workers"]
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        exact = np.quantile(lat, q) / 1e6
        assert abs(row["batch_ms"][name] / exact - 1) < 2 ** (1 / BINS_PER_OCTAVE) - 1  # within a bin
    assert abs(row["busy_share"] - 1 / 3) < 0.01 and row["fetch_share"] == pytest.approx(0.5, abs=0.01)
    assert facts["slowest"][0]["ms"] == pytest.approx(lat.max() // 3 / 1e6, rel=1e-6)
    assert worker_facts({}) is None
    from whyidle.analysis.loader_workers import queue_facts

    q = queue_facts([{"counts": [[5, 4, 0, 4, 3], [5, 4, 4, 4, 1], ["bad"], [6, 2, 1, 2, 1]]}, {"counts": None}])
    assert q == {"loader": 5, "cap": 4, "samples": 4, "ready_mean": 1.0, "empty_share": 0.75, "full_share": 0.25,
                 "outstanding_mean": 4.0, "wait_ms": None, "behind_share": None, "behind_wait_share": None,
                 "empty_wait_share": None}  # rows of 5 (before the fetches' waits were counted)
    # [loader, cap, ready, outstanding, behind, n, wait_ns]: 3 fetches found none ready (6 ms), one
    # found 2 ready and then waited 30 ms behind a slow batch
    q = queue_facts([{"counts": [[5, 4, 0, 4, 0, 3, 6_000_000], [5, 4, 2, 4, 1, 1, 30_000_000]]}])
    assert q["wait_ms"] == pytest.approx(9.0) and q["behind_share"] == 0.25
    assert q["behind_wait_share"] == pytest.approx(30 / 36) and q["empty_wait_share"] == pytest.approx(6 / 36)
    assert queue_facts([]) is None and worker_facts({}, [{"counts": [[5, 4, 0, 4, 3]]}])["queue"]["samples"] == 3


class Costly(Dataset):
    def __init__(self, cost_s):
        self.cost_s = cost_s

    def __len__(self):
        return 320

    def __getitem__(self, i):
        time.sleep(self.cost_s)
        return torch.full((4,), float(i))


@pytest.mark.parametrize("sample_s, loop_s, ahead", [(0.0001, 0.03, True), (0.003, 0.0, False)])
def test_the_queue_says_which_side_waits(tmp_path, sample_s, loop_s, ahead):
    """Workers far faster than the loop: nearly every fetch finds all prefetched batches ready;
    workers far slower: nearly none (the producer/consumer reading of issue 36, part 2)."""
    agent = wagent.start(str(tmp_path), 0)
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in DataLoader(Costly(sample_s), batch_size=16, num_workers=2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(loop_s)
    finally:
        agent.stop()
    from whyidle.pipeline import report_run

    lw = report_run(str(tmp_path))["metrics"]["loader_workers"]
    q = lw["queue"]
    assert q["cap"] == 4 and q["samples"] >= 5  # prefetch_factor 2 × 2 workers; every step detailed at ≥ 20 ms
    assert 0 <= q["outstanding_mean"] <= 4 and 0 <= q["ready_mean"] <= 4
    if ahead:
        assert q["full_share"] >= 0.6 and q["empty_share"] <= 0.3 and q["ready_mean"] >= 2.5
        assert max(w["busy_share"] for w in lw["workers"]) < 0.5
    else:
        assert q["empty_share"] >= 0.7 and q["full_share"] <= 0.1
        assert min(w["busy_share"] for w in lw["workers"]) > 0.8


class OneSlow(Dataset):
    """Worker 0's batches each hold one 60 ms read; the other samples cost nothing."""

    def __len__(self):
        return 480

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info().id == 0 and i % 16 == 0:
            time.sleep(0.06)
        return torch.full((4,), float(i))


@pytest.mark.parametrize("in_order", [True, False])
def test_the_queue_says_when_the_loop_waits_behind_a_slow_batch(tmp_path, in_order):
    """Head-of-line blocking (issue 36, part 3): in order, the loop waits for worker 0's slow batch
    with the other workers' batches received and held, so most of its wait is 'behind'; with
    in_order=False it takes those batches instead and never waits behind one."""
    agent = wagent.start(str(tmp_path), 0)
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in DataLoader(OneSlow(), batch_size=16, num_workers=3, in_order=in_order):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.005)
    finally:
        agent.stop()
    from whyidle.pipeline import report_run

    q = report_run(str(tmp_path))["metrics"]["loader_workers"]["queue"]
    assert q["samples"] >= 5 and q["wait_ms"] is not None
    if in_order:
        assert q["behind_wait_share"] >= 0.6
    else:
        assert q["behind_share"] == 0.0
    from whyidle.analysis.series import queue_depth
    from whyidle.record.reader import load_run
    from whyidle.report.plots import queue_plot

    run = load_run(str(tmp_path))
    depth = queue_depth([r for recs in run.procs.values() for r in recs], 0)
    assert depth["cap"] == 6 and len(depth["t_s"]) >= 1 and (depth["ready"] <= 6).all()
    assert (depth["behind"] >= 0.5).any() if in_order else not depth["behind"].any()
    plot = queue_plot(depth)
    assert [t["name"] for t in plot.figure["data"]] == ["batches ready", "prefetch_factor × num_workers"]
    assert queue_plot(None).why and queue_depth([], 0) is None
