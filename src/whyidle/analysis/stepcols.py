"""Columns of a step list as numpy arrays, without a Python loop over the rows when the steps are
rows of one :class:`~whyidle.record.steptable.StepTable` (what
:func:`whyidle.record.reader.load_run` gives); plain step dicts are gathered row by row.

The analysis of a long run reads a million steps: a field read through a
:class:`~whyidle.record.steptable.StepView` costs ~0.3 µs, a gathered column ~5 ns a value.
"""

from __future__ import annotations

import array
import math

import numpy as np

from whyidle.record.intcolumn import CHUNK, IntColumn
from whyidle.record.steptable import NULL_INT, StepRows, StepView


#: Steps read at once where a long run is read a block at a time (:meth:`StepCols.part`): a
#: block's int64 column is 2 MB; a day of 86 ms steps as whole columns took ~25 MB a column.
STEP_BLOCK = 1 << 18


class StepCols:
    """Column access to ``steps`` (step dicts or ``StepView`` rows, in the list's order).

    ``ints(key)``: int64 array with :data:`NULL_INT` for null; ``flags(key)``: bool array (the
    truth of the field); ``gpu_ms()``: float64, NaN when not measured; ``n``: the number of steps.
    """

    def __init__(self, steps: list) -> None:
        self.steps = steps
        if type(steps) is StepRows:
            first = steps.positions.consecutive()
            if first is not None:  # one run of rows (a process's steps, as usual): no row numbers made
                self._on(steps.table, None, len(steps), first)
                return
            table, rows = steps.table, steps.positions.numpy()
        else:
            table, rows = _table_rows(steps)
        self._on(table, rows, len(steps))

    def _on(self, table, rows, n: int, first: int | None = None) -> None:
        """``rows``: the steps' row numbers (an int64 array), or None with ``first``: rows
        ``first`` to ``first + n``."""
        self.table, self.rows, self.n = table, rows, n
        # consecutive rows (the usual analyzed steps: after the warm-up, before the end) are a slice
        # of each column, not a gathered copy (a day of steps: 8 MB a column)
        self._span = None
        if self.table is not None and self.n and rows is None:
            self._lo, self._hi = first, first + n
            self._span = slice(first, first + n)
        elif self.table is not None and self.n:
            self._lo, self._hi = int(self.rows[0]), int(self.rows[-1]) + 1
            if self._hi - self._lo == self.n and (self.n < 3 or bool((np.diff(self.rows) == 1).all())):
                self._span = slice(self._lo, self._hi)

    def part(self, a: int, b: int) -> "StepCols":
        """The columns of the steps ``a`` to ``b`` of this list (positions, ``b`` excluded): a long
        run is read a block of steps at a time (a block's columns, not the run's, in memory)."""
        if self.table is None:
            return StepCols(self.steps[a:b])
        part = object.__new__(StepCols)
        part.steps = None
        if self.rows is None:
            a, b = min(a, self.n), min(b, self.n)
            part._on(self.table, None, b - a, (self._lo if self.n else 0) + a)
        else:
            part._on(self.table, self.rows[a:b], len(self.rows[a:b]))
        return part

    def blocks(self):
        """``(start, StepCols)`` of each :data:`STEP_BLOCK` steps in order (this one when it has
        no more): what a long run is summed over."""
        if self.n <= STEP_BLOCK:
            yield 0, self
            return
        for a in range(0, self.n, STEP_BLOCK):
            yield a, self.part(a, a + STEP_BLOCK)

    def _pick(self, column: np.ndarray) -> np.ndarray:
        """The steps' values of one whole-table column."""
        return column[self._span] if self._span is not None else column[self.rows]

    def ints(self, key: str) -> np.ndarray:
        if self.table is not None:
            if not self.n:
                return np.zeros(0, np.int64)
            lo, hi = self._lo, self._hi  # only the rows' range of the column is expanded
            col = self.table.dense(key, lo, hi)
            if col is None:
                rows, values = self.table.full_values(key, lo, hi)  # a field of fully recorded steps only
                col = np.full(hi - lo, NULL_INT, dtype=np.int64)
                col[rows - lo] = values
                del rows, values
            return col if self._span is not None else col[self.rows - lo]
        return np.array([_int(s.get(key)) for s in self.steps], dtype=np.int64)

    def values(self, key: str) -> np.ndarray:
        """The non-null values of an int field (int64), in step order."""
        v = self.ints(key)
        return v[v != NULL_INT]

    def durations(self) -> np.ndarray:
        """Each step's ``t1 - t0`` (int64 ns)."""
        return self.ints("t1") - self.ints("t0")

    def total_ns(self) -> int:
        """The steps' summed ``t1 - t0`` (ns), a block at a time."""
        return sum(int(b.durations().sum()) for _, b in self.blocks())

    def flags(self, key: str) -> np.ndarray:
        if self.table is not None:
            return self._pick(np.frombuffer(getattr(self.table, key), dtype=np.int8)).astype(bool) if self.n \
                else np.zeros(0, bool)
        return np.array([bool(s.get(key)) for s in self.steps], dtype=bool)

    def gpu_ms(self) -> np.ndarray:
        if self.table is not None:
            if not self.table.gpu_ms:  # no step has a GPU time
                return np.full(self.n, np.nan)
            return self._pick(np.frombuffer(self.table.gpu_ms, dtype=np.float64)).copy() if self.n else np.zeros(0)
        return np.array([np.nan if s.get("gpu_ms") is None else s["gpu_ms"] for s in self.steps], dtype=np.float64)


def unique_counts(parts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(values, return_index=True, return_counts=True)`` of a long array read in parts:
    ``parts`` yields ``(start, values)`` (the part's first index in the whole, its values, in
    order); returns the distinct values (sorted), the index of each one's first occurrence and its
    count, as numpy would over the whole array."""
    got = []
    for start, values in parts:
        v, first, counts = np.unique(values, return_index=True, return_counts=True)
        got.append((v, first + start, counts))
    if not got:
        return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
    values, at = np.unique(np.concatenate([v for v, _, _ in got]), return_inverse=True)
    first = np.full(len(values), np.iinfo(np.int64).max)
    np.minimum.at(first, at, np.concatenate([f for _, f, _ in got]))
    counts = np.zeros(len(values), np.int64)
    np.add.at(counts, at, np.concatenate([k for _, _, k in got]))
    return values, first, counts


def _int(v) -> int:
    """A dict step's field as an int64 value: null (and a non-finite float) as :data:`NULL_INT`,
    a float (an analysis-filled ns value) truncated."""
    if v is None or (type(v) is float and not math.isfinite(v)):
        return NULL_INT
    return int(v)


def _table_rows(steps: list) -> tuple:
    """``(table, row indices)`` when every step is a ``StepView`` of one ``StepTable``; else
    ``(None, None)``."""
    if not steps or type(steps[0]) is not StepView:
        return None, None
    table = steps[0]._table
    rows = np.empty(len(steps), dtype=np.int64)
    for n, s in enumerate(steps):
        if type(s) is not StepView or s._table is not table:
            return None, None
        rows[n] = s._row
    return table, rows


def take(steps: list, keep: np.ndarray) -> list:
    """The steps where the bool array ``keep`` is true, in order; rows of one table stay
    :class:`~whyidle.record.steptable.StepRows` (their columns are gathered without a loop)."""
    if type(steps) is StepRows:  # a block of rows at a time: a day of steps' rows is 25 MB
        out, rows = IntColumn(), steps.positions
        for a in range(0, len(rows), STEP_BLOCK):
            picked = rows.numpy(a, a + STEP_BLOCK)[keep[a:a + STEP_BLOCK]]
            out.extend(array.array("q", picked.tobytes()))
        return steps.table.rows(out)
    return [steps[j] for j in np.flatnonzero(keep).tolist()]


def positions(rows: np.ndarray) -> IntColumn:
    """Row numbers (an int array) as the :class:`IntColumn` a :class:`StepRows` holds, a chunk at
    a time (no Python int per row, no second copy of the rows)."""
    out = IntColumn()
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    for a in range(0, len(rows), CHUNK):
        out.extend(array.array("q", rows[a:a + CHUNK].tobytes()))
    return out
