"""Columns of a step list as numpy arrays, without a Python loop over the rows when the steps are
rows of one :class:`~whyidle.record.steptable.StepTable` (what
:func:`whyidle.record.reader.load_run` gives); plain step dicts are gathered row by row.

The analysis of a long run reads a million steps: a field read through a
:class:`~whyidle.record.steptable.StepView` costs ~0.3 µs, a gathered column ~5 ns a value.
"""

from __future__ import annotations

import math

import numpy as np

from whyidle.record.steptable import NULL_INT, StepView


class StepCols:
    """Column access to ``steps`` (step dicts or ``StepView`` rows, in the list's order).

    ``ints(key)``: int64 array with :data:`NULL_INT` for null; ``flags(key)``: bool array (the
    truth of the field); ``gpu_ms()``: float64, NaN when not measured; ``n``: the number of steps.
    """

    def __init__(self, steps: list) -> None:
        self.steps = steps
        self.n = len(steps)
        self.table, self.rows = _table_rows(steps)

    def ints(self, key: str) -> np.ndarray:
        if self.table is not None:
            return np.frombuffer(self.table.cols[key], dtype=np.int64)[self.rows] if self.n else np.zeros(0, np.int64)
        return np.array([_int(s.get(key)) for s in self.steps], dtype=np.int64)

    def flags(self, key: str) -> np.ndarray:
        if self.table is not None:
            return np.frombuffer(getattr(self.table, key), dtype=np.int8)[self.rows].astype(bool) if self.n \
                else np.zeros(0, bool)
        return np.array([bool(s.get(key)) for s in self.steps], dtype=bool)

    def gpu_ms(self) -> np.ndarray:
        if self.table is not None:
            return np.frombuffer(self.table.gpu_ms, dtype=np.float64)[self.rows] if self.n else np.zeros(0)
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
