"""Rank summaries (record/rank_summary.py): a merge of node runs reads them instead of the ranks'
records and finds what the full read finds; a stale or damaged summary is read in full."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics

import numpy as np
import pytest
from conftest import run_whyidle
from synthetic_run import write_job

from whyidle import pipeline
from whyidle.analysis import collectives as C
from whyidle.analysis.ranks import SUMMARY_VERSION
from whyidle.record import rank_summary
from whyidle.record.reader import load_run


def summarize(dirs: list[str]) -> None:
    """Each node's rank summaries, as its report at the end of its run writes them."""
    for d in dirs:
        assert pipeline.write_rank_summaries(load_run(d)) > 0


def digest(a) -> dict:
    s = a.facts.straggler or {}
    return {"straggler": s.get("rank"), "culprit_share": s.get("culprit_share"), "late_cause": s.get("late_cause"),
            "wait_s_by_rank": s.get("wait_s_by_rank"), "verdict": a.verdict, "findings": a.findings,
            "ranks": a.facts.ranks, "primary": a.facts.primary, "run_dir": a.run.path,
            "other_trainers": a.facts.other_trainers, "shares": (a.facts.step or {}).get("shares"),
            "notices": a.facts.notices, "instrumented": a.facts.instrumented, "problems": sorted(a.run.problems),
            "logged": a.facts.logged}


def assert_same(full, summed) -> None:
    want, got = digest(full), digest(summed)
    assert got == want, {k: (want[k], got[k]) for k in want if want[k] != got[k]}


def drop_colls(path: str, steps: set[int]) -> None:
    """Removes the ``colls`` rows of ``steps`` from a rank's file (it timed those steps' collectives not)."""
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    for r in recs:
        if r["k"] == "colls":
            r["rows"] = [row for row in r["rows"] if row[0] not in steps]
    with open(path, "w") as f:
        f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in recs)


@pytest.mark.parametrize("late", [5, None])
def test_a_merge_from_summaries_finds_what_the_full_read_finds(tmp_path, late):
    dirs = write_job(tmp_path, nodes=2, ranks_per_node=4, steps=80, late=late)
    drop_colls(os.path.join(dirs[0], "proc-4252.jsonl"), {10, 11, 40})  # rank 1: steps not one run
    with open(os.path.join(dirs[0], "proc-4262.jsonl"), "a") as f:  # rank 2: a notice, a metric, a cut line
        f.write('{"k":"notice","t":1,"msg":"rank 2 notice"}\n{"k":"metric","t":2,"name":"loss","value":0.5,'
                '"source":"log_metric"}\n{"k":"step","i":')
    full = pipeline.analyze_run(dirs)
    assert "rank 2 notice" in full.facts.notices and "loss" in full.facts.logged
    assert any("proc-4262.jsonl: skipped a truncated last line" in p for p in full.run.problems)
    summarize(dirs)
    summed = pipeline.analyze_run(dirs)
    assert len(summed.run.summaries) == 7  # every rank but the one described
    assert_same(full, summed)
    if late is not None:
        assert summed.facts.straggler["rank"] == late and summed.facts.straggler["measured"]
        assert summed.run.path == dirs[1] and any(f["id"] == "imbalance" for f in summed.findings)
    else:
        assert summed.facts.straggler is None and summed.facts.primary == 4242 and summed.run.path == dirs[0]


def test_ranks_kept_only_as_summaries_merge_like_ranks_on_disk(tmp_path):
    """The benchmark's lean job (most ranks without their step records) against the same job on disk."""
    on_disk = write_job(tmp_path / "a", nodes=3, ranks_per_node=2, steps=60, late=4)
    lean = write_job(tmp_path / "b", nodes=3, ranks_per_node=2, steps=60, late=4, summaries=True, full={0, 4})
    a, b = pipeline.analyze_run(on_disk), pipeline.analyze_run(lean)
    assert len(b.run.summaries) == 5
    assert digest(b) | {"run_dir": None} == digest(a) | {"run_dir": None}


def test_a_stale_or_damaged_summary_is_read_in_full(tmp_path):
    dirs = write_job(tmp_path, nodes=2, ranks_per_node=2, steps=60, late=3)
    full = pipeline.analyze_run(dirs)
    summarize(dirs)
    # a rank's file written since: that rank is read in full, the others from their summaries
    path = os.path.join(dirs[0], "proc-4252.jsonl")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    stale = pipeline.analyze_run(dirs)
    assert 4252 not in stale.run.summaries and 4242 in stale.run.summaries
    assert_same(full, stale)
    # damaged: an array cut short, JSON that is not JSON, another version, an array of other values
    array = os.path.join(dirs[0], rank_summary.ARRAY_NAME)
    head = os.path.join(dirs[0], rank_summary.JSON_NAME)
    with open(array, "rb") as f:
        good = f.read()
    with open(array, "wb") as f:
        f.write(good[:-7])
    assert rank_summary.read(dirs[0], SUMMARY_VERSION) == {}
    assert_same(full, pipeline.analyze_run(dirs))
    with open(array, "wb") as f:
        f.write(good[:-4] + b"\x01\x02\x03\x04")
    assert rank_summary.read(dirs[0], SUMMARY_VERSION) == {}
    os.remove(array)
    assert rank_summary.read(dirs[0], SUMMARY_VERSION) == {}
    with open(array, "wb") as f:
        f.write(good)
    assert rank_summary.read(dirs[0], SUMMARY_VERSION + 1) == {}
    with open(head, "rb") as f:
        text = f.read()
    for bad in (text[: len(text) // 2], b"\x00garbage", b"[]", text.replace(b'"pid":4242', b'"pid":"x"')):
        with open(head, "wb") as f:
            f.write(bad)
        assert rank_summary.read(dirs[0], SUMMARY_VERSION) == {}
        assert_same(full, pipeline.analyze_run(dirs))
    proc = run_whyidle(["report", *dirs])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr


def test_a_node_report_writes_the_summaries_once_the_run_ended(tmp_path):
    dirs = write_job(tmp_path, nodes=1, ranks_per_node=2, steps=40, late=1)
    live = tmp_path / "live"
    shutil.copytree(dirs[0], live)
    with open(live / "meta.json") as f:
        meta = json.load(f)
    del meta["end_t"]
    with open(live / "meta.json", "w") as f:
        json.dump(meta, f)
    pipeline.report_run(str(live))  # a live run's files still grow: no summary
    assert not os.path.exists(live / rank_summary.JSON_NAME)
    pipeline.report_run(dirs[0])
    got = rank_summary.read(dirs[0], SUMMARY_VERSION)
    assert sorted(got) == [4242, 4252]
    s = got[4242]  # rank 0, waiting 20 ms per step for rank 1
    assert s.steps == 40 and s.trains and s.figures["step_time_s"]["mean"] > 0
    assert s.wait_steps.tolist() == list(range(40)) and s.wait_ns.dtype == np.int32
    assert s.wait_ns.tolist() == [int(20.5e6)] * 40 and got[4252].wait_ns.tolist() == [500_000] * 40
    assert [r["k"] for r in s.records] == ["proc"] and s.records[0]["dist"]["rank"] == 0
    os.remove(os.path.join(dirs[0], "proc-4252.jsonl"))  # a summary whose file is gone is not used
    assert sorted(rank_summary.read(dirs[0], SUMMARY_VERSION)) == [4242]


def _culprit_loop(waits: dict, step_s: dict, skip: int = C.SKIP_STEPS, min_steps: int = C.MIN_STEPS):
    """The per-step loop :func:`whyidle.analysis.collectives.culprit` replaced (its figures are to
    equal these to the last bit)."""
    common = set.intersection(*(set(w) for w in waits.values()))
    steps = sorted(i for i in common if i >= skip)
    if len(waits) < 2 or len(steps) < min_steps:
        return None
    ranks = list(waits)
    wait_sum = dict.fromkeys(ranks, 0.0)
    caused = dict.fromkeys(ranks, 0.0)
    late_count = dict.fromkeys(ranks, 0)
    late_at: dict = {r: {} for r in ranks}
    late_steps = 0
    typical = statistics.median(v for v in step_s.values() if v) if any(step_s.values()) else 0.0
    for i in steps:
        step = {r: waits[r][i] for r in ranks}
        last = min(step, key=step.get)
        excess = {r: v - step[last] for r, v in step.items()}
        for r, e in excess.items():
            wait_sum[r] += e
        if max(excess.values()) >= max(C.LATE_MIN_S, C.LATE_MIN_SHARE * typical):
            late_steps += 1
            late_count[last] += 1
            late_at[last][i] = sum(excess.values())
            caused[last] += sum(excess.values())
    n = len(steps)
    top = max(ranks, key=lambda r: caused[r]) if late_steps else None
    if top is not None and caused[top] / sum(caused.values()) < C.MIN_CULPRIT_SHARE:
        top = None
    others = [r for r in ranks if r != top]
    net = ((caused[top] - statistics.median(caused[r] for r in others)) / n / len(others)
           if top is not None else 0.0)
    mean_step = statistics.fmean(step_s[r] for r in others if step_s.get(r)) if any(step_s.get(r) for r in others) else 0.0
    return {"rank": top, "steps": n, "late_steps": late_steps, "late_at": late_at.get(top, {}), "compared": steps,
            "culprit_share": late_count[top] / late_steps if top is not None else None,
            "caused_share": caused[top] / sum(caused.values()) if top is not None else None,
            "wait_s_by_rank": {str(r): wait_sum[r] / n for r in ranks},
            "collective_s_by_rank": {str(r): sum(waits[r][i] for i in steps) / n for r in ranks},
            "caused_s": net, "wait_share": net / mean_step if mean_step > 0 else 0.0}


def test_the_culprit_from_arrays_equals_the_per_step_loop_to_the_last_bit(monkeypatch):
    rng = random.Random(7)
    for trial in range(120):
        if trial == 60:
            monkeypatch.setattr(C, "BLOCK_CELLS", 7)  # many blocks of a few steps
        n_ranks, n = rng.randint(2, 7 if trial % 2 else 60), rng.randint(3, 150)
        late = rng.randrange(n_ranks)
        ns = {}
        for r in range(n_ranks):
            ns[10 * r + 3] = {i: rng.randint(100_000, 3_000_000) + (0 if r == late or rng.random() < 0.3
                                                                      else rng.randint(0, 30_000_000))
                              for i in range(n) if trial % 3 or rng.random() > 0.1}
        step_s = {r: rng.uniform(0.005, 0.05) for r in ns}
        want = _culprit_loop({r: {i: v / 1e9 for i, v in w.items()} for r, w in ns.items()}, step_s)
        arrays = {r: C.StepWaits(np.array(sorted(w), dtype=np.int64), np.array([w[i] for i in sorted(w)], dtype=np.int32))
                  for r, w in ns.items()}
        assert C.culprit(arrays, step_s) == want
        assert C.culprit({r: {i: v / 1e9 for i, v in w.items()} for r, w in ns.items()}, step_s) == want
