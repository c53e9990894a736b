"""The reader's typed fast path for step lines (record/stepdecode.py) keeps and leaves out exactly
what the general path (json.loads + StepTable.add / add_lite) does, on well-typed lines and on
every kind of bad value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whyidle.record import reader, stepdecode
from whyidle.record.reader import read_jsonl
from whyidle.record.steptable import LITE_COLUMNS, StepTable

BIG = 2**63
values = st.one_of(st.integers(-5, 10**12), st.none(), st.just(BIG), st.just(-BIG - 1), st.just(2**64 + 3),
                   st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=2), st.booleans(),
                   st.lists(st.integers(0, 3), max_size=2))
ints = st.integers(0, 10**12)


@st.composite
def step_record(draw) -> dict:
    t0 = draw(ints)
    rec = {"k": "step", "t": t0, "i": draw(st.one_of(st.integers(0, 50), values)), "t0": t0,
           "t1": t0 + draw(st.integers(-3, 10**9)), "by": draw(st.sampled_from(["optimizer", "keras", "x", None, 3]))}
    for f in ("data", "fwd", "cpu", "samples", "ld", "wi"):
        if draw(st.booleans()):
            rec[f] = draw(st.one_of(ints, values))
    for f in ("boundary", "profiled", "lite"):
        if draw(st.booleans()):
            rec[f] = draw(st.one_of(st.booleans(), st.integers(0, 1), st.none()))
    if draw(st.booleans()):
        rec["ph"] = draw(st.one_of(st.lists(st.integers(0, 10**6), max_size=8), st.lists(values, max_size=4), values))
    return rec


@st.composite
def steps_record(draw) -> dict:
    rows = []
    for j in range(draw(st.integers(0, 6))):
        t0 = draw(ints)
        row = [draw(st.one_of(st.integers(0, 50), st.just(j))), t0, t0 + draw(st.integers(-2, 10**7)),
               draw(st.one_of(st.integers(-1, 8), st.none(), st.booleans()))]
        row += [draw(st.one_of(st.none(), ints)) if draw(st.booleans()) else draw(values) for _ in range(8)]
        row.append(draw(st.one_of(st.integers(0, 1), st.booleans(), st.none())))
        if draw(st.integers(0, 9)) == 0:
            row = row[:draw(st.integers(0, len(LITE_COLUMNS) + 1))]
        rows.append(row)
    return {"k": "steps", "t": 1, "rows": rows if draw(st.integers(0, 19)) else draw(values)}


def _read(path, fast: bool, batch: int = 4096) -> tuple[StepTable, list, list]:
    table = StepTable()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reader, "_STEP_BATCH", batch)
        m.setattr(reader, "_STEP_BATCH_MIN", 1)  # every batch, however short, decoded at once
        if not fast:
            m.setattr(stepdecode, "add_line", lambda table, raw: None)
            m.setattr(stepdecode, "add_lines", lambda table, raws: False)
        records, problems = read_jsonl(str(path), table)
    return table, records, problems


def _state(t: StepTable) -> tuple:
    return ({f: list(c) for f, c in t.cols.items()}, list(t.by), list(t.boundary), list(t.profiled), list(t.lite),
            [repr(v) for v in t.gpu_ms], list(t.ph), list(t.ph_end), t._first, t._moved,
            [t.row_of(i) for i in range(-1, 60)])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(step_record(), steps_record(), st.just({"k": "iter", "t": 5, "t0": 1, "t1": 2})),
                min_size=1, max_size=12))
def test_the_fast_path_keeps_and_leaves_out_what_the_general_path_does(tmp_path_factory, recs):
    path = tmp_path_factory.mktemp("sd") / "proc-1.jsonl"
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    slow = _read(path, False)
    for batch in (4096, 3):  # the typed decode of lines in batches, cut anywhere
        fast = _read(path, True, batch)
        assert _state(fast[0]) == _state(slow[0])
        assert fast[1:] == slow[1:]


def test_well_typed_lines_take_the_fast_path(tmp_path, monkeypatch):
    """The agent's own lines never fall back: one step record and one steps record of two rows."""
    lines = [{"k": "steps", "t": 9, "rows": [[0, 1, 5, 0, None, None, None, None, None, None, None, None, 0],
                                             [1, 5, 9, 0, 1, 2, 3, 4, 0, 1, 1, 77, 1]]},
             {"k": "step", "t": 12, "i": 2, "t0": 9, "t1": 12, "by": "optimizer", "data": 1, "boundary": False,
              "ph": [1, 0, 2, 1], "samples": 8}]
    path = tmp_path / "proc-1.jsonl"
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines))
    taken = []
    one, many = stepdecode.add_line, stepdecode.add_lines
    monkeypatch.setattr(stepdecode, "add_line", lambda t, raw: taken.append(("line", one(t, raw))) or taken[-1][1])
    monkeypatch.setattr(stepdecode, "add_lines", lambda t, raws: taken.append(("lines", many(t, raws))) or taken[-1][1])
    table, records, problems = _read(path, True)
    assert taken == [("line", True), ("lines", True)] and records == [] and problems == []
    assert len(table) == 3 and table.row_of(2) == 2 and [r["boundary"] for r in table.rows()] == [False, True, False]
    assert table.rows()[2]["ph"] == [1, 0, 2, 1] and table.rows()[1]["ld"] == 77 and table.rows()[0]["data"] is None


def test_phase_values_beyond_int32_widen_the_column():
    table = StepTable()
    lines = [json.dumps({"k": "step", "i": i, "t0": i, "t1": i + 1, "ph": [1, v]}).encode() for i, v in
             enumerate((3, 2**40, 2**64))]
    assert stepdecode.add_lines(table, lines[:1]) and stepdecode.add_lines(table, lines[1:2])
    assert not stepdecode.add_lines(table, lines[2:])  # beyond int64: the lines go one by one
    assert stepdecode.add_lines(table, lines[:1])  # int32 values after the widening
    assert table.ph.typecode == "q" and [r["ph"] for r in table.rows()] == [[1, 3], [1, 2**40], [1, 3]]
    table = StepTable()
    assert table.add({"k": "step", "i": 0, "t0": 0, "t1": 5, "ph": [1, 3, 2, 4]})
    assert table.add({"k": "step", "i": 1, "t0": 5, "t1": 2**41, "ph": [1, 7, 2, 2**40]})
    assert table.add({"k": "step", "i": 2, "t0": 2**41, "t1": 2**41 + 9, "ph": [3, 1]})
    assert [r["ph"] for r in table.rows()] == [[1, 3, 2, 4], [1, 7, 2, 2**40], [3, 1]]
