"""Columnar storage of ``step`` records, so a 100,000-step run loads in a few MB.

A step record as a dict costs ~1 KB in CPython; here each field is one ``array`` column: 8 bytes
per step for the fields every step has, 8 bytes per fully recorded step for those only they have
(``samples``, CPU times, ...), phase values as int32. :class:`StepView` gives read access to one row
with the same keys as the record (a ``Mapping``), so analysis code treats rows and plain dicts
alike; :class:`StepRows` is a list of rows made on access, and
:class:`whyidle.analysis.stepcols.StepCols` reads their columns without visiting each row.
"""

from __future__ import annotations

import array
import collections.abc
import itertools
import math
import operator

from whyidle.record.intcolumn import IntColumn

_INT_FIELDS = ("i", "t0", "t1", "data", "fwd", "bwd", "opt", "eval", "batches", "samples", "cpu", "data_cpu",
               "fn", "comp", "grad", "mb", "ld", "wi", "hk", "fc")
#: Step markers (a ``steps`` row's ``by`` is an index here; new ones are appended).
_BY = ("optimizer", "loader", None, "keras", "iterator", "backward", "forward")
_BY_CODE = {name: code for code, name in enumerate(_BY) if name is not None}
#: Stands for null in an int column (``cols[...]`` arrays hold int64 values).
NULL_INT = -(2**63)
_NONE = NULL_INT
_INT_MAX = 2**63 - 1

#: Columns of a ``steps`` record's rows (docs/run-format.md): the steps recorded with less detail
#: when steps are short (no ``ph`` spans, CPU times or sample counts; see
#: :mod:`whyidle.instrument.torch`, ``detail stride``). ``by`` is a code into ``_BY``.
LITE_COLUMNS = ("i", "t0", "t1", "by", "data", "fwd", "bwd", "opt", "eval", "batches", "mb", "ld", "boundary")
BY_CODES = _BY
#: The int columns a ``steps`` row holds (``i``, ``t0``, ``t1`` first) and their positions in it.
_LITE_INT = tuple(f for f in LITE_COLUMNS if f in _INT_FIELDS)
_LITE_POS = tuple(LITE_COLUMNS.index(f) for f in _LITE_INT)
_LITE_EMPTY = tuple(f for f in _INT_FIELDS if f not in _LITE_INT)
#: Staged int values (rows × fields) moved into the columns at once: ~10 MB.
_STAGED_MAX = 65_536 * len(_INT_FIELDS)


def _int_column(values: tuple) -> array.array:
    """A column of ints and nulls as int64 values (:data:`NULL_INT` for null); raises
    ``TypeError``/``OverflowError`` for a value that is not an int64 integer."""
    nulls = values.count(None)
    if not nulls:
        return array.array("q", values)
    if nulls == len(values):
        return array.array("q", [NULL_INT]) * nulls
    return array.array("q", [NULL_INT if v is None else v for v in values])


def expand_lite(rec: dict) -> list[dict]:
    """The ``step`` dicts of a ``steps`` record (``lite: True``; a malformed row is skipped)."""
    out = []
    rows = rec.get("rows")
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, list) or len(row) != len(LITE_COLUMNS):
            continue
        step = dict(zip(LITE_COLUMNS, row))
        by = step["by"]
        step.update(k="step", by=_BY[by] if isinstance(by, int) and 0 <= by < len(_BY) else None,
                    boundary=bool(step["boundary"]), lite=True, samples=None, cpu=None, data_cpu=None)
        out.append(step)
    return out


#: The fields of a full ``step`` record :meth:`StepTable.add_full_columns` takes, in its order.
FULL_COLUMNS = _INT_FIELDS + ("by", "boundary", "profiled", "lite", "ph")

#: A packed ``ph`` pair's offset bound (µs, either sign): past it an offset is past any step's end
#: (2**59 µs = 18,000 years), so :func:`phase_spans` reads the same spans.
_PH_OFFSET_MAX = 2**59


def _packed(codes, offsets) -> list[int]:
    """``ph`` pairs packed one value each: ``offset × 8 + code``. A code outside
    :data:`PHASE_CODES` is stored as ``other`` (6), which :func:`phase_spans` reads it as, and an
    offset is bounded by :data:`_PH_OFFSET_MAX`; a pair reads back as ``(v & 7, v >> 3)``."""
    top = _PH_OFFSET_MAX
    return [(top if o > top else -top if o < -top else o) * 8 + (c if 0 <= c < 8 else 6)
            for c, o in zip(codes, offsets)]


def _packed_array(flat: array.array) -> array.array:
    """:func:`_packed` of ``ph`` values (code, offset, code, ...) as int32 values, or int64 when
    one does not fit (numpy: a day of steps holds 8 million pairs)."""
    import numpy as np

    values = np.frombuffer(flat, dtype=np.int64)
    codes, offsets = values[0::2], values[1::2]
    codes = np.where((codes >= 0) & (codes < 8), codes, 6)
    packed = np.clip(offsets, -_PH_OFFSET_MAX, _PH_OFFSET_MAX) * 8 + codes
    if len(packed) and (packed.min() < -(2**31) or packed.max() >= 2**31):
        return array.array("q", packed.tobytes())
    return array.array("i", packed.astype(np.int32).tobytes())


#: Phase codes of a step's ``ph`` spans (docs/run-format.md): index → phase name.
PHASE_CODES = ("setup", "data", "forward", "backward", "optimizer", "eval", "other", "compute")
#: Most ``ph`` values (two per phase change) a step record holds; later changes are not recorded
#: (``ph_cut``). 64 values = 32 phase changes, several times a plain loop's 8–10.
MAX_PH_VALUES = 64


def phase_spans(t0: int, t1: int, ph: list[int], per_us: int) -> list[tuple[int, int, str]]:
    """``(start, end, phase)`` spans tiling one step ``[t0, t1]`` from its ``ph`` values
    (docs/run-format.md), in the unit of ``t0``/``t1``: ``per_us`` of those units per µs (1 for
    µs, 1000 for ns). Offsets never go back and never pass ``t1``; an unknown code reads ``other``."""
    spans = []
    code, start = "other", 0
    dur = t1 - t0
    for k in range(0, len(ph) - 1, 2):
        off = min(max(int(ph[k + 1]) * per_us, start), dur)
        if off > start:
            spans.append((t0 + start, t0 + off, code))
        c = int(ph[k])
        code, start = (PHASE_CODES[c] if 0 <= c < len(PHASE_CODES) else "other"), off
    if dur > start:
        spans.append((t0 + start, t1, code))
    return spans


class StepTable:
    """Append-only table of step records (``k == "step"``) plus per-step GPU times."""

    def __init__(self) -> None:
        # the fields every row has (those of a ``steps`` row): one value per row
        self._cols = {f: IntColumn() for f in _LITE_INT}
        # the fields only fully recorded steps have (_LITE_EMPTY: samples, CPU times, ...): one
        # value per row of ``_full_rows`` (a short-step run records 1 step in 20 in full: its
        # million steps keep 50,000 of them, not 9 columns of a million nulls)
        self._full = {f: IntColumn() for f in _LITE_EMPTY}
        self._full_rows = IntColumn()
        self._int_cols = [self._cols.get(f, self._full.get(f)) for f in _INT_FIELDS]
        # rows added by add_values, their int fields row after row (one C call per step instead
        # of 20 appends), moved into the columns before anything reads them (_settle)
        self._staged = array.array("q")
        self._staged_rows = array.array("q")
        self.by = array.array("b")
        self.boundary = array.array("b")
        self.profiled = array.array("b")
        self.lite = array.array("b")
        # GPU ms per row (NaN: not measured), made at the first ``gpu_step``: empty until then, then
        # one per row (a CPU run's day of steps held 8 MB of NaN)
        self.gpu_ms = array.array("d")
        # all steps' ph pairs (phase code, µs offset), concatenated, each packed into one value
        # (:func:`_packed`): a day of full step records holds 8 million pairs, 4 bytes each; an
        # offset past 2**28 µs widens the column to int64
        self.ph = array.array("i")
        # row → end of its pairs in ``ph`` (start = previous end): a steady loop's rows hold the same
        # number of pairs, a line without bytes
        self.ph_end = IntColumn()
        # row of a step ``i`` (for ``gpu_step``): ``i - _first`` as steps come in order, else in
        # ``_moved`` (no dict entry per step: 1,000,000 of them took ~100 MB)
        self._first: int | None = None
        self._moved: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.by)

    @property
    def cols(self) -> dict[str, array.array]:
        """Field name → its int64 column (:data:`NULL_INT` for null), one value per row, as new
        arrays (for tests and small tables; analysis reads :meth:`dense` and :meth:`full_values`)."""
        self._settle()
        out = {f: array.array("q", col.numpy().tobytes()) for f, col in self._cols.items()}
        for f, values in self._full.items():
            col = array.array("q", [_NONE]) * len(self)
            for row, v in zip(self._full_rows, values):
                col[row] = v
            out[f] = col
        return out

    def dense(self, key: str, start: int = 0, stop: int | None = None):
        """The column of a field every row has, rows ``start`` to ``stop`` (default: all), as a
        new int64 numpy array (:data:`NULL_INT` for null), or None for a field of full steps only
        (:meth:`full_values`)."""
        self._settle()
        col = self._cols.get(key)
        return None if col is None else col.numpy(start, stop)

    def full_values(self, key: str, start: int = 0, stop: int | None = None) -> tuple:
        """``(rows, values)`` of a field only fully recorded steps have, among rows ``start`` to
        ``stop`` (default: all), as new int64 numpy arrays: their row numbers (increasing) and the
        field's values (:data:`NULL_INT` for null); KeyError for another."""
        self._settle()
        values = self._full[key]
        if start <= 0 and stop is None:
            return self._full_rows.numpy(), values.numpy()
        rows = self._full_rows
        lo = rows.bisect_left(start) if start > 0 else 0
        hi = len(rows) if stop is None else rows.bisect_left(stop)
        return rows.numpy(lo, hi), values.numpy(lo, hi)

    @property
    def nbytes(self) -> int:
        """Bytes the table's values take (its columns and arrays)."""
        self._settle()
        cols = list(self._cols.values()) + list(self._full.values()) + [self._full_rows]
        arrays = (self.by, self.boundary, self.profiled, self.lite, self.gpu_ms, self.ph)
        return sum(c.nbytes for c in cols) + self.ph_end.nbytes + sum(a.itemsize * len(a) for a in arrays)

    def _settle(self) -> None:
        """Moves the staged rows' int fields into the columns (a strided copy per column)."""
        staged = self._staged
        if len(staged) == len(_INT_FIELDS):  # one row (a full step between lite ones): 20 appends
            for col, v in zip(self._int_cols, staged):
                col.append(v)
        elif staged:
            width = len(_INT_FIELDS)
            for j, col in enumerate(self._int_cols):
                col.extend(staged[j::width])
        if staged:
            self._full_rows.extend(self._staged_rows)
            self._staged = array.array("q")
            self._staged_rows = array.array("q")

    def add(self, rec: dict) -> bool:
        """Appends one ``step`` record (missing or null fields are stored as null). A record whose
        ``i``, ``t0`` or ``t1`` is missing, whose interval ends before it starts, or with a value
        that is not an int64 integer (text, NaN, a list, ...) is left out: returns False."""
        try:
            values = [_NONE if (v := rec.get(f)) is None else int(v) for f in _INT_FIELDS]
            ph = rec.get("ph")
            ph = [int(v) for v in ph] if isinstance(ph, list) and len(ph) % 2 == 0 else []
            step = int(rec["i"])
            t0, t1 = int(rec["t0"]), int(rec["t1"])
        except (TypeError, ValueError, OverflowError, KeyError):
            return False
        return self.add_values(values, rec.get("by"), rec.get("boundary"), rec.get("profiled"), rec.get("lite"),
                               ph, step, t0, t1)

    def add_values(self, values: list[int], by, boundary, profiled, lite, ph: list[int], step: int, t0: int,
                   t1: int) -> bool:
        """Appends one step from its :data:`_INT_FIELDS` values (ints, :data:`NULL_INT` for null), its
        marker ``by``, the truth of its ``boundary``/``profiled``/``lite`` flags and its ``ph`` values
        (what :meth:`add` reads from a record, or a typed decode of its line:
        :mod:`whyidle.record.stepdecode`). False (nothing appended) when the interval ends before it
        starts or a value is outside int64."""
        if t1 < t0 or min(values) < _NONE or max(values) > _INT_MAX or (ph and (min(ph) < _NONE or max(ph) > _INT_MAX)):
            return False
        self._staged.extend(values)
        self._staged_rows.append(len(self.by))
        if len(self._staged) >= _STAGED_MAX:
            self._settle()
        self.by.append(_BY.index(by) if isinstance(by, str) and by in _BY else 2)
        self.boundary.append(1 if boundary else 0)
        self.profiled.append(1 if profiled else 0)
        self.lite.append(1 if lite else 0)
        if self.gpu_ms:
            self.gpu_ms.append(math.nan)
        if ph:
            packed = _packed(ph[0::2], ph[1::2])
            try:
                packed = array.array(self.ph.typecode, packed)
            except OverflowError:  # beyond int32: the column widens
                self.ph = array.array("q", self.ph)
            self.ph.extend(packed)
        self.ph_end.append(len(self.ph))
        self._index(step)
        return True

    def _index(self, step: int) -> None:
        """Remembers the row of step ``i`` = ``step`` just appended (see :meth:`row_of`)."""
        self._index_at(len(self.by) - 1, step)

    def _index_at(self, row: int, step: int) -> None:
        """Remembers that step ``i`` = ``step`` is at ``row`` (the latest row of a step wins)."""
        if self._first is None:
            self._first = step - row
        if step - self._first != row:
            self._moved[step] = row
        elif self._moved:
            self._moved.pop(step, None)  # the latest row of a step wins

    def row_of(self, step: int) -> int | None:
        """The (latest) row of step ``i`` = ``step``, or None."""
        row = self._moved.get(step)
        if row is None and self._first is not None:
            row = step - self._first
            self._settle()
            if not (0 <= row < len(self.by) and self._cols["i"][row] == step):
                row = None
        return row

    def add_lite(self, rec: dict) -> int:
        """Appends the rows of one ``steps`` record (the steps :func:`expand_lite` reads, without
        building a dict per row: at 1 kHz these are 19 of 20 steps); returns the number of rows
        left out (not a row of :data:`LITE_COLUMNS`, or as :meth:`add` leaves out)."""
        rows = rec.get("rows")
        if not isinstance(rows, list):
            return 1
        bad = 0
        self._settle()
        lite = [self._cols[f] for f in _LITE_INT]
        n = len(LITE_COLUMNS)
        for row in rows:
            if type(row) is not list or len(row) != n:
                bad += 1
                continue
            try:
                values = [_NONE if (v := row[p]) is None else int(v) for p in _LITE_POS]
            except (TypeError, ValueError, OverflowError):
                bad += 1
                continue
            if _NONE in values[:3] or values[2] < values[1] or min(values) < _NONE or max(values) > _INT_MAX:
                bad += 1
                continue
            for col, v in zip(lite, values):
                col.append(v)
            by = row[3]
            self.by.append(int(by) if isinstance(by, int) and 0 <= by < len(_BY) else 2)
            self.boundary.append(1 if row[12] else 0)
            self.profiled.append(0)
            self.lite.append(1)
            if self.gpu_ms:
                self.gpu_ms.append(math.nan)
            self.ph_end.append(len(self.ph))
            self._index(values[0])
        return bad

    def add_lite_columns(self, columns: list[tuple]) -> bool:
        """Appends the rows of one ``steps`` record given column by column (``columns[j]`` holds
        every row's value of ``LITE_COLUMNS[j]``: a typed decode of its line transposed,
        :mod:`whyidle.record.stepdecode`), all or none: False, nothing appended, when a row would
        be left out by :meth:`add_lite` (null ``i``/``t0``/``t1``, an interval that ends before it
        starts, a value outside int64), so the caller can take the record the slow way and count."""
        n = len(columns[0])
        try:
            ints = [_int_column(columns[p]) for p in _LITE_POS]
        except (TypeError, OverflowError):
            return False
        i, t0, t1 = ints[0], ints[1], ints[2]
        if _NONE in i or _NONE in t0 or any(map(operator.lt, t1, t0)):
            return False
        self._settle()
        cols = self._cols
        for f, col in zip(_LITE_INT, ints):
            cols[f].extend(col)
        top = len(_BY)
        self.by.extend(array.array("b", [b if isinstance(b, int) and 0 <= b < top else 2 for b in columns[3]]))
        self.boundary.extend(array.array("b", [1 if b else 0 for b in columns[12]]))
        zeros = array.array("b", [0]) * n
        self.profiled.extend(zeros)
        self.lite.extend(array.array("b", [1]) * n)
        if self.gpu_ms:
            self.gpu_ms.extend(array.array("d", [math.nan]) * n)
        self.ph_end.extend(array.array("q", [len(self.ph)]) * n)
        self._index_rows(len(self.by) - n, i)
        return True

    def add_full_columns(self, columns: list[tuple]) -> bool:
        """Appends full ``step`` records given column by column (``columns[j]`` holds every row's
        value of field j of :data:`FULL_COLUMNS`: a typed decode of consecutive lines transposed,
        :func:`whyidle.record.stepdecode.add_lines`), all or none: False, nothing appended, when
        :meth:`add_values` would leave a row out (an interval that ends before it starts, a value
        outside int64), so the caller can take the lines one by one and count."""
        n_int = len(_INT_FIELDS)
        try:
            ints = [_int_column(c) for c in columns[:n_int]]
        except (TypeError, OverflowError):
            return False
        i, t0, t1 = ints[0], ints[1], ints[2]
        if any(map(operator.lt, t1, t0)):
            return False
        phs = columns[n_int + 4]
        lens = [len(p) if p and not len(p) % 2 else 0 for p in phs]
        try:
            flat = array.array("q", itertools.chain.from_iterable(p for p, k in zip(phs, lens) if k))
        except OverflowError:  # a value outside int64: add_values leaves the step out
            return False
        ph, packed = self.ph, _packed_array(flat)
        if "q" in (ph.typecode, packed.typecode):  # one of them past int32: both int64
            ph = ph if ph.typecode == "q" else array.array("q", ph)
            packed = packed if packed.typecode == "q" else array.array("q", packed)
        self._settle()
        n, first = len(i), len(self.by)
        for col, values in zip(self._int_cols, ints):
            col.extend(values)
        self._full_rows.extend(array.array("q", range(first, first + n)))
        self.by.extend(array.array("b", [_BY_CODE.get(b, 2) if type(b) is str else 2 for b in columns[n_int]]))
        for flags, col in zip((self.boundary, self.profiled, self.lite), columns[n_int + 1:n_int + 4]):
            flags.extend(array.array("b", [1 if v else 0 for v in col]))
        if self.gpu_ms:
            self.gpu_ms.extend(array.array("d", [math.nan]) * n)
        ends = itertools.accumulate((k >> 1 for k in lens), initial=len(ph))
        next(ends)
        self.ph_end.extend(array.array("q", ends))
        ph.extend(packed)
        self.ph = ph
        self._index_rows(first, i)
        return True

    def _index_rows(self, first: int, steps: array.array) -> None:
        """Remembers the rows of consecutive appended steps: ``steps[k]`` (their ``i``) is at row
        ``first + k`` (see :meth:`row_of`)."""
        if not steps:
            return
        if self._first is None:
            self._first = steps[0] - first
        start = steps[0]
        if not self._moved and start - self._first == first and steps == array.array("q", range(start, start + len(steps))):
            return  # rows in step order where expected: no index entry (the usual case)
        for row, step in enumerate(steps, start=first):
            self._index_at(row, step)

    def add_gpu(self, rec: dict) -> bool:
        """Attaches a ``gpu_step`` record's ``gpu_ms`` to its step (ignored if the step is unknown);
        False when its ``i`` or ``gpu_ms`` is not a number."""
        try:
            row = self.row_of(int(rec.get("i", -1)))
            gpu_ms = None if rec.get("gpu_ms") is None else float(rec["gpu_ms"])
        except (TypeError, ValueError, OverflowError):
            return False
        if gpu_ms is not None and not math.isfinite(gpu_ms):
            return False
        if row is not None and gpu_ms is not None:
            self.set_gpu_ms(row, gpu_ms)
        return True

    def set_gpu_ms(self, row: int, ms: float) -> None:
        """Sets the GPU time (ms) of ``row`` (``IndexError`` past the end)."""
        if not self.gpu_ms:
            self.gpu_ms = array.array("d", [math.nan]) * len(self)
        self.gpu_ms[row] = ms

    def mark_profiled(self, spans: list[tuple[int, int]]) -> int:
        """Marks ``profiled`` the steps inside one of ``spans`` (``(t0, t1)`` monotonic ns: the deep
        traces' windows, ``trace_window`` records), whose profiler start, stop and export slow them:
        the analysis leaves them out like the Keras profiler window's steps. Returns how many."""
        if not spans or not len(self):
            return 0
        t0s, t1s = self.dense("t0"), self.dense("t1")
        inside = (t0s >= spans[0][0]) & (t1s <= spans[0][1])
        for s, e in spans[1:]:
            inside |= (t0s >= s) & (t1s <= e)
        rows = inside.nonzero()[0].tolist()
        for row in rows:
            self.profiled[row] = 1
        return len(rows)

    def rows(self, which=None) -> "StepRows":
        """The rows ``which`` (row numbers: an iterable, an ``array("q")`` or an
        :class:`IntColumn`; default all, in file order) as :class:`StepView` objects
        (:class:`StepRows`)."""
        self._settle()
        if not isinstance(which, IntColumn):
            column = IntColumn()
            column.extend(which if isinstance(which, array.array) else
                          array.array("q", range(len(self)) if which is None else which))
            which = column
        return StepRows(self, which)


class StepRows(collections.abc.Sequence):
    """Rows of one table as a read-only sequence of :class:`StepView` objects, each made when it
    is read: a million steps cost their row numbers (``positions``, an :class:`IntColumn`: a run
    of consecutive rows takes no bytes a row, others 4 or 8), not a million objects (~90 bytes
    each with their row number), and their columns are gathered without visiting each row
    (:class:`whyidle.analysis.stepcols.StepCols`). Indexing, slicing (another ``StepRows``),
    iteration, ``len`` and ``+`` (a list) work as on a list of the rows."""

    __slots__ = ("table", "positions")

    def __init__(self, table: StepTable, positions: IntColumn) -> None:
        self.table = table
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return self.table.rows(array.array("q", self.positions.numpy()[k].tobytes()))
        return StepView(self.table, self.positions[k])

    def __iter__(self):
        table = self.table
        return (StepView(table, row) for row in self.positions)

    def __add__(self, other) -> list:
        return list(self) + list(other)

    def __radd__(self, other) -> list:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"StepRows({len(self)} rows)"


class StepView(collections.abc.Mapping):
    """One row of a :class:`StepTable`, read like the original record dict."""

    __slots__ = ("_table", "_row")

    _KEYS = _INT_FIELDS + ("by", "boundary", "profiled", "lite", "gpu_ms", "ph", "k")

    def __init__(self, table: StepTable, row: int) -> None:
        self._table = table
        self._row = row

    def __getitem__(self, key: str):
        col = self._table._cols.get(key)
        if col is not None:
            v = col[self._row]
            return None if v == _NONE else v
        return self._other(key)

    def get(self, key: str, default=None):
        """As ``Mapping.get`` (a null field reads None, an unknown key ``default``), without its
        exception round trip: analysis reads millions of fields this way."""
        col = self._table._cols.get(key)
        if col is not None:
            v = col[self._row]
            return None if v == _NONE else v
        try:
            return self._other(key)
        except KeyError:
            return default

    def _other(self, key: str):
        """The fields that are not int columns of every row."""
        t, r = self._table, self._row
        values = t._full.get(key)
        if values is not None:
            j = t._full_rows.position(r)
            v = _NONE if j is None else values[j]
            return None if v == _NONE else v
        if key == "by":
            return _BY[t.by[r]]
        if key == "boundary":
            return bool(t.boundary[r])
        if key == "profiled":
            return bool(t.profiled[r])
        if key == "lite":
            return bool(t.lite[r])
        if key == "gpu_ms":
            v = t.gpu_ms[r] if t.gpu_ms else math.nan
            return None if math.isnan(v) else v
        if key == "ph":
            start = t.ph_end[r - 1] if r else 0
            return [x for v in t.ph[start:t.ph_end[r]] for x in (v & 7, v >> 3)] or None
        if key == "k":
            return "step"
        raise KeyError(key)

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)
