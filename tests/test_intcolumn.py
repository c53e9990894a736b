"""IntColumn (record/intcolumn.py) reads back exactly the int64 values appended, in every chunk
encoding (constant, range, 32-bit offsets with nulls, int64), however they were appended."""

from __future__ import annotations

import array
import bisect
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whyidle.record import intcolumn
from whyidle.record.intcolumn import NULL, IntColumn

I64 = st.integers(-(2**63) + 1, 2**63 - 1)
runs = st.one_of(
    st.tuples(st.just("const"), st.one_of(I64, st.just(NULL)), st.integers(1, 20)),
    st.tuples(st.just("range"), st.integers(-(2**40), 2**40), st.integers(1, 20)),
    st.tuples(st.just("narrow"), st.integers(-(2**62), 2**62), st.lists(st.one_of(st.integers(0, 2**32 - 2),
                                                                                    st.just(None)), max_size=20)),
    st.tuples(st.just("wide"), st.just(0), st.lists(st.one_of(I64, st.just(NULL)), max_size=20)),
    st.tuples(st.just("line"), st.tuples(st.integers(-(2**62), 2**62), st.integers(-(2**40), 2**40)),
              st.one_of(st.lists(st.integers(-(2**31), 2**31), max_size=20), st.lists(st.just(0), max_size=20))),
)


def _values(spec) -> list[int]:
    kind, start, n = spec
    if kind == "const":
        return [start] * n
    if kind == "range":
        return list(range(start, start + n))
    if kind == "line":  # start + k·slope + jitter (the times of steps; no jitter: a stride), clipped to int64
        (first, slope), jitter = start, n
        return [max(-(2**63) + 1, min(2**63 - 1, first + k * slope + j)) for k, j in enumerate(jitter)]
    if kind == "narrow":
        return [NULL if v is None else max(-(2**63) + 1, min(2**63 - 1, start + v)) for v in n]
    return list(n)


@contextlib.contextmanager
def small_chunks():
    """Chunks of 8 values, so a few dozen values cross several chunks and a tail."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(intcolumn, "CHUNK_BITS", 3)
        m.setattr(intcolumn, "CHUNK", 8)
        m.setattr(intcolumn, "_MASK", 7)
        yield


@settings(max_examples=200, deadline=None)
@given(st.lists(runs, max_size=12), st.lists(st.booleans(), max_size=12))
def test_values_read_back_exactly(specs, by_extend):
    with small_chunks():
        _check(specs, by_extend)


def _check(specs, by_extend) -> None:
    col, want = IntColumn(), []
    for spec, extend in zip(specs, by_extend + [False] * len(specs)):
        values = _values(spec)
        want += values
        if extend:
            col.extend(array.array("q", values))
        else:
            for v in values:
                col.append(v)
    assert len(col) == len(want)
    assert list(col) == want
    assert [col[k] for k in range(len(want))] == want
    assert col.numpy().tolist() == want
    if want:
        assert col[-1] == want[-1] and col[-len(want)] == want[0]
    with pytest.raises(IndexError):
        col[len(want)]
    with pytest.raises(IndexError):
        col[-len(want) - 1]
    for start in range(0, len(want) + 2, 3):  # row ranges: only the chunks holding them are read
        for stop in (start, start + 1, start + 7, start + 20, None):
            assert col.numpy(start, stop).tolist() == want[start:stop]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), unique=True), st.integers(-2, 60))
def test_position_finds_a_value_of_an_increasing_column(values, probe):
    values = sorted(values)
    with small_chunks():
        col = IntColumn()
        col.extend(values)
        assert col.position(probe) == (values.index(probe) if probe in values else None)
        assert col.bisect_left(probe) == bisect.bisect_left(values, probe)
        run = values == list(range(values[0], values[0] + len(values))) if values else True
        assert col.consecutive() == ((values[0] if values else 0) if run else None)
        steps = IntColumn()
        steps.extend(range(probe + 2, probe + 2 + 3 * len(values)))
        assert steps.consecutive() == probe + 2 or not values


def test_narrow_chunks_take_less_memory():
    steps = IntColumn()
    steps.extend(range(3 * intcolumn.CHUNK))  # a range: no bytes a value
    zeros, ns = IntColumn(), IntColumn()
    zeros.extend([0] * 3 * intcolumn.CHUNK)
    ns.extend(np.arange(3 * intcolumn.CHUNK, dtype=np.int64) * 7919 % 1_000_003)  # under 2**31, no line: 4 bytes
    assert steps.nbytes < 100 and zeros.nbytes < 100
    every_20th = IntColumn()  # a 1 kHz run's phase times: null but on the full steps
    every_20th.extend([k * 1000 if k % 20 == 0 else NULL for k in range(3 * intcolumn.CHUNK)])
    assert every_20th.nbytes < 0.6 * 3 * intcolumn.CHUNK
    assert every_20th[40] == 40_000 and every_20th[41] == NULL and every_20th.numpy()[60] == 60_000
    assert 4 * 3 * intcolumn.CHUNK <= ns.nbytes < 4.1 * 3 * intcolumn.CHUNK
    t0 = IntColumn()  # the starts of 86 ms steps (ns): a chunk spans past 32 bits, around a line
    starts = 10**15 + np.arange(3 * intcolumn.CHUNK, dtype=np.int64) * 86_400_000 + np.arange(3 * intcolumn.CHUNK) % 977
    t0.extend(array.array("q", starts.tobytes()))
    assert t0.numpy().tolist() == starts.tolist() and t0[70_000] == int(starts[70_000])
    assert t0.nbytes < 4.1 * 3 * intcolumn.CHUNK
    ends = IntColumn()  # the ends of the rows' phase pairs in a steady loop: 8 a row, no bytes
    ends.extend(array.array("q", range(8, 8 * 3 * intcolumn.CHUNK + 1, 8)))
    assert ends.nbytes < 100 and ends[70_000] == 8 * 70_001 and ends.numpy()[-1] == 8 * 3 * intcolumn.CHUNK
    with pytest.raises(OverflowError):
        steps.extend([2**63])
    assert len(steps) == 3 * intcolumn.CHUNK
