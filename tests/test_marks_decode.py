"""The reader's typed path for ``gpu_marks`` lines (record/marks.py) keeps and leaves out what the
general path (json.loads + schema) does, with the same values, in compact columns."""

from __future__ import annotations

import array
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whyidle.analysis import gpu_idle
from whyidle.record import marks
from whyidle.record.reader import read_jsonl

BIG = 2**63
odd = st.one_of(st.just(BIG), st.just(-BIG - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=2),
                st.booleans(), st.none(), st.lists(st.integers(0, 3), max_size=2))
names = st.sampled_from(["step", "sync", "gap", "launch", "forward", None])


@st.composite
def marks_record(draw) -> dict:
    n = draw(st.integers(0, 6))
    cols = {"h": st.integers(0, 10**15), "g": st.one_of(st.floats(0, 1e15), st.integers(0, 10**15)),
            "phase": names, "kind": names, "step": st.one_of(st.integers(0, 10**7), st.none())}
    rec = {"k": "gpu_marks", "t": draw(st.integers(0, 10**15))}
    for key, values in cols.items():
        size = n if draw(st.integers(0, 9)) else draw(st.integers(0, 7))  # now and then a ragged column
        rec[key] = [draw(st.one_of(values, odd)) if draw(st.integers(0, 29)) == 0 else draw(values)
                    for _ in range(size)]
    if draw(st.booleans()):
        rec["extra"] = [[draw(st.integers(-1, n + 1)), draw(st.one_of(st.text(max_size=3), st.integers()))]
                        for _ in range(draw(st.integers(0, 2)))]
    if draw(st.integers(0, 19)) == 0:
        del rec[draw(st.sampled_from(["h", "g", "phase", "kind", "step"]))]
    return rec


def _plain(rec: dict) -> dict:
    """A record with its columns as plain lists (null steps as None) and no empty ``extra``."""
    out = dict(rec)
    for key in ("h", "g", "step"):
        if isinstance(out.get(key), array.array):
            out[key] = [None if key == "step" and v == marks.NULL else v for v in out[key]]
    if "g" in out:
        out["g"] = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in out["g"]]
    if out.get("extra") is None:
        out.pop("extra", None)
    return out


def _read(path, fast: bool):
    with pytest.MonkeyPatch.context() as m:
        if not fast:
            m.setattr(marks, "decode_marks", lambda raw, names: None)
        records, problems = read_jsonl(str(path))
    return [_plain(r) for r in records], problems


@settings(max_examples=150, deadline=None)
@given(st.lists(marks_record(), min_size=1, max_size=6))
def test_the_typed_path_keeps_and_leaves_out_what_the_general_path_does(tmp_path_factory, recs):
    path = tmp_path_factory.mktemp("gm") / "proc-1.jsonl"
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    assert _read(path, True) == _read(path, False)


def test_marks_are_compact_columns_the_idle_analysis_reads_alike(tmp_path):
    rec = {"k": "gpu_marks", "t": 9, "h": [1, 5, 9], "g": [2.0, 7.5, 12.0], "phase": ["forward", "forward", "data"],
           "kind": ["launch", "sync", "step"], "step": [0, None, 1], "extra": [[1, "x.py:3 f"]]}
    path = tmp_path / "proc-1.jsonl"
    path.write_text(json.dumps(rec, separators=(",", ":")) + "\n" + json.dumps(rec, separators=(",", ":")) + "\n")
    fast, slow = read_jsonl(str(path))[0], _read(path, False)[0]
    assert isinstance(fast[0]["h"], array.array) and fast[0]["phase"][0] is fast[1]["phase"][0]
    a, b = gpu_idle._marks(fast), gpu_idle._marks(slow)
    assert np.array_equal(a["h"], b["h"]) and np.array_equal(a["g"], b["g"])
    assert (a["phase"], a["kind"], a["extra"]) == (b["phase"], b["kind"], b["extra"])
