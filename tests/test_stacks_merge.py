"""Stack samples of a long run summed into coarser records while read (record/compact.py): every
sample is kept, the first and last 10 minutes stay as written, and the analysis of a window that
spans the run finds the same hotspots."""

from __future__ import annotations

import random

from whyidle.analysis import stacks as stack_analysis
from whyidle.record.compact import RAW_EDGE_NS, StacksMerger, merged

S = 1_000_000_000
SITES = [("data", "train.py:41 main", "torch/utils/data/dataset.py:206 __getitem__", ["train.py:12 load"]),
         ("forward", "model.py:18 forward", "torch/nn/functional.py:1704 relu", []),
         ("other", "train.py:48 main", "train.py:48 main", []),
         ("backward", None, "torch/autograd/graph.py:979 _engine_run_backward", [])]


def records(seconds: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for j in range(2 * seconds):  # a flush every 0.5 s
        sites = []
        for phase, user, leaf, callers in rng.sample(SITES, rng.randint(1, len(SITES))):
            count = rng.randint(1, 30)
            row = [phase, user, leaf, count, count * 10.0 + rng.random(), list(callers)]
            sites.append(row if rng.random() < 0.9 else row[:4])  # an older record: no ms, no callers
        out.append({"k": "stacks", "t": j * S // 2, "hz": 100.0, "n": sum(s[3] for s in sites), "mode": "signal",
                    "lost": rng.randint(0, 1), "lost_s": 0.0, "sites": sites})
    return out


def totals(recs: list[dict], window=None) -> dict:
    out: dict = {}
    for phase, user, leaf, count, seconds, callers in stack_analysis.sampled_sites(
            recs, {p for p, *_ in SITES}, window):
        key = (phase, user, leaf, tuple(callers))
        c, s = out.get(key, (0, 0.0))
        out[key] = (c + count, s + seconds)
    return out


def test_every_sample_is_kept_and_the_edges_stay_as_written():
    raw = records(3_600)
    m = StacksMerger(9)
    for r in raw:
        m.add(r)
    got = m.finish()
    edge = RAW_EDGE_NS // (S // 2) + 1  # records in the first (and last) 10 minutes, both ends included
    assert got[:edge] == raw[:edge] and got[-edge:] == raw[-edge:]
    assert len(got) == 2 * edge + -(-(len(raw) - 2 * edge) // 9)
    assert [r["t"] for r in got] == sorted(r["t"] for r in got)
    want, have = totals(raw), totals(got)
    assert want.keys() == have.keys()
    for key, (count, seconds) in want.items():
        assert have[key][0] == count and abs(have[key][1] - seconds) < 1e-6
    assert sum(r["n"] for r in got) == sum(r["n"] for r in raw)
    assert sum(r["lost"] for r in got) == sum(r["lost"] for r in raw)


def test_a_windows_hotspots_are_those_of_the_records_as_written():
    raw = records(3_600, seed=3)
    m = StacksMerger(9)
    for r in raw:
        m.add(r)
    got = m.finish()
    window = (30 * S, 3_500 * S)  # the analyzed steps of an hour: edges inside the raw stretches
    want, have = totals(raw, window), totals(got, window)
    assert want.keys() == have.keys()
    assert all(have[k][0] == c and abs(have[k][1] - s) < 1e-6 for k, (c, s) in want.items())
    inner = (1_200 * S, 2_400 * S)  # a window inside the merged stretch: its edges move by < one group
    lost = sum(c for c, _ in totals(raw, inner).values()) - sum(c for c, _ in totals(got, inner).values())
    per_group = 9 * max(r["n"] for r in raw)
    assert abs(lost) <= 2 * per_group
    a = stack_analysis.hotspots(raw, {"data"}, window)
    b = stack_analysis.hotspots(got, {"data"}, window)
    assert [h["function"] for h in a] == [h["function"] for h in b]
    assert [round(h["seconds"], 6) for h in a] == [round(h["seconds"], 6) for h in b]


def test_one_group_and_a_short_run_pass_through():
    raw = records(100)
    m = StacksMerger(1)
    for r in raw:
        m.add(r)
    assert m.finish() == raw
    m = StacksMerger(9)
    for r in raw:
        m.add(r)
    assert m.finish() == raw  # 100 s: all inside the first 10 minutes
    one = merged(raw[:3])
    assert one["t"] == raw[2]["t"] and one["merged"] == 3


def _value():
    from hypothesis import strategies as st
    return st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.none(),
                     st.booleans(), st.text(max_size=3), st.just(2**63), st.just(2.0**63), st.just(-(2**63) + 1))


def test_the_typed_stacks_decode_keeps_what_the_schema_keeps():
    import json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from whyidle.record import schema
    from whyidle.record.compact import decode_stacks

    row = st.lists(_value(), min_size=3, max_size=7).map(lambda r: r + [[]] if len(r) == 5 else r) | st.tuples(
        st.sampled_from(["data", "other"]), st.one_of(st.none(), st.text(max_size=3)), st.none(),
        st.integers(0, 50), st.floats(0, 1e3), st.lists(st.text(max_size=3), max_size=2)).map(list)

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.integers(0, 10**12), _value()), st.lists(row, max_size=3), st.one_of(st.none(), _value()))
    def check(t, sites, hz):
        rec = {"k": "stacks", "t": t, "hz": hz, "n": 3, "mode": "signal", "lost": 0, "lost_s": 0.0, "sites": sites}
        raw = json.dumps(rec, separators=(",", ":")).encode()
        got = decode_stacks(raw)
        if got is not None:  # taken: the schema would keep it, with the same values
            assert schema.problem(json.loads(raw)) is None
            assert [list(s) for s in got["sites"]] == sites and got["t"] == t and got["hz"] == hz
        elif all(isinstance(s, list) and len(s) == 6 for s in sites):
            assert schema.problem(json.loads(raw)) is not None, rec
    check()
