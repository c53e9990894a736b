"""Reading a long run: the host ticks of a run longer than ``HOST_TICKS_MAX`` are read at one in k
(record/reader.py); the report's host figures stay those of reading every tick."""

from __future__ import annotations

import os
import re

import load_run
import pytest

from whyidle import pipeline
from whyidle.record import reader
from whyidle.record.reader import host_tick_stride, load_run as read_run, read_jsonl


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """40 minutes of host ticks (10,000 at 4 Hz) under 28,000 steps of 86.4 ms."""
    return load_run.write_run(str(tmp_path_factory.mktemp("long") / "run"), 28_000, 86.4)


def test_a_long_runs_host_figures_are_those_of_every_tick(long_run, monkeypatch):
    full = pipeline.analyze_run(long_run)
    monkeypatch.setattr(reader, "HOST_TICKS_MAX", 1_000)
    thin = pipeline.analyze_run(long_run)
    ticks = [r for r in thin.run.host if r["k"] == "host"]
    assert 900 <= len(ticks) <= 1_100 and ticks[-1]["t"] == [r for r in full.run.host if r["k"] == "host"][-1]["t"]
    assert any(re.search(r"one host tick and process scan in 1[01] read", p) for p in thin.run.problems)
    assert not any("host tick" in p for p in full.run.problems)
    assert (thin.verdict, [f["id"] for f in thin.findings]) == (full.verdict, [f["id"] for f in full.findings])
    for key, want in full.facts.host.items():  # counters: exact between the ticks read; gauges sampled
        got = thin.facts.host[key]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=0.02, abs=1e-3), key
    assert thin.facts.host["trainer_rss_max_bytes"] <= full.facts.host["trainer_rss_max_bytes"]


def test_the_stride_follows_the_files_size(long_run, monkeypatch):
    path = os.path.join(long_run, "host.jsonl")
    assert host_tick_stride(path) == 1  # 10,000 ticks: under HOST_TICKS_MAX
    monkeypatch.setattr(reader, "HOST_TICKS_MAX", 1_000)
    assert host_tick_stride(path, head_bytes=200_000) in (10, 11)  # ~10,000 ticks, estimated from the head
    assert host_tick_stride(os.path.join(long_run, "missing.jsonl")) == 1


def test_a_damaged_last_tick_is_still_said(tmp_path):
    tick = '{"k":"host","t":%d,"cpu":{"user":1.0},"procs":[[1,0,0.5,10,1]]}\n'
    path = tmp_path / "host.jsonl"
    path.write_text("".join(tick % t for t in range(10)) + tick[:30] % 10)
    records, problems = read_jsonl(str(path), tick_stride=4)
    assert [r["t"] for r in records] == [0, 4, 8]
    assert problems == ["host.jsonl: skipped a truncated last line"]
    path.write_text("".join(tick % t for t in range(10)))
    assert [r["t"] for r in read_jsonl(str(path), tick_stride=4)[0]] == [0, 4, 8, 9]
    path.write_text("".join(tick % t for t in range(9)) + tick[:30] % 9 + "\n" + '{"k":"host_static"\n')
    records, problems = read_jsonl(str(path), tick_stride=4)  # the last tick damaged, then a cut record
    assert [r["t"] for r in records] == [0, 4, 8]
    assert problems == ["host.jsonl: skipped a truncated last line", "host.jsonl: skipped 1 damaged line "
                        "(line 10: not a JSON record)"]
    run_dir = tmp_path
    assert read_run(str(run_dir)).host  # a directory of host ticks alone reads
