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

from whyidle.record.steptable import NULL_INT, StepRows, StepView


class StepCols:
    """Column access to ``steps`` (step dicts or ``StepView`` rows, in the list's order).

    ``ints(key)``: int64 array with :data:`NULL_INT` for null; ``flags(key)``: bool array (the
    truth of the field); ``gpu_ms()``: float64, NaN when not measured; ``n``: the number of steps.
    """

    def __init__(self, steps: list) -> None:
        self.steps = steps
        self.n = len(steps)
        if type(steps) is StepRows:
            self.table, self.rows = steps.table, np.frombuffer(steps.positions, dtype=np.int64)
        else:
            self.table, self.rows = _table_rows(steps)
        # consecutive rows (the usual analyzed steps: after the warm-up, before the end) are a slice
        # of each column, not a gathered copy (a day of steps: 8 MB a column)
        self._span = None
        if self.table is not None and self.n and int(self.rows[-1]) - int(self.rows[0]) == self.n - 1 \
                and (self.n < 3 or bool((np.diff(self.rows) == 1).all())):
            self._span = slice(int(self.rows[0]), int(self.rows[-1]) + 1)

    def _pick(self, column: np.ndarray) -> np.ndarray:
        """The steps' values of one whole-table column."""
        return column[self._span] if self._span is not None else column[self.rows]

    def ints(self, key: str) -> np.ndarray:
        if self.table is not None:
            if not self.n:
                return np.zeros(0, np.int64)
            col = self.table.dense(key)
            if col is not None:
                return self._pick(col)
            rows, values = self.table.full_values(key)  # a field of fully recorded steps only
            out = np.full(len(self.table), NULL_INT, dtype=np.int64)
            out[rows] = values
            del rows, values
            return self._pick(out)
        return np.array([_int(s.get(key)) for s in self.steps], dtype=np.int64)

    def values(self, key: str) -> np.ndarray:
        """The non-null values of an int field (int64), in step order."""
        v = self.ints(key)
        return v[v != NULL_INT]

    def durations(self) -> np.ndarray:
        """Each step's ``t1 - t0`` (int64 ns)."""
        return self.ints("t1") - self.ints("t0")

    def flags(self, key: str) -> np.ndarray:
        if self.table is not None:
            return self._pick(np.frombuffer(getattr(self.table, key), dtype=np.int8)).astype(bool) if self.n \
                else np.zeros(0, bool)
        return np.array([bool(s.get(key)) for s in self.steps], dtype=bool)

    def gpu_ms(self) -> np.ndarray:
        if self.table is not None:
            return self._pick(np.frombuffer(self.table.gpu_ms, dtype=np.float64)).copy() if self.n else np.zeros(0)
        return np.array([np.nan if s.get("gpu_ms") is None else s["gpu_ms"] for s in self.steps], dtype=np.float64)


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
    picked = np.flatnonzero(keep)
    if type(steps) is StepRows:
        return steps.table.rows(positions(np.frombuffer(steps.positions, dtype=np.int64)[picked]))
    return [steps[j] for j in picked.tolist()]


def positions(rows: np.ndarray) -> array.array:
    """Row numbers (an int array) as the ``array("q")`` a :class:`StepRows` holds, without a
    Python int per row."""
    out = array.array("q")
    out.frombytes(np.ascontiguousarray(rows, dtype=np.int64).tobytes())
    return out
