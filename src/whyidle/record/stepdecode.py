"""The reader's fast path for the step kinds: a ``step`` or ``steps`` line decoded by msgspec into
typed fields and appended to a :class:`~whyidle.record.steptable.StepTable` without building a
dict per step (a 24-hour job holds a million of them; ``json.loads`` plus a dict per step was
most of the time ``whyidle report`` spent reading it).

The types are the checks: ``i``, ``t0``, ``t1`` integers, the other int fields integers or null,
``ph`` a list of integers, a ``steps`` row a 13-item list. A line they do not fit — a float where
an integer belongs, text, a damaged line, a row of the wrong length — is not taken here
(:func:`add_line` returns None) and the reader takes it the general way
(:meth:`StepTable.add` / :meth:`StepTable.add_lite`), which keeps what it can and counts the rest,
so both paths keep and leave out exactly the same steps (``tests/test_stepdecode.py``).
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec

from whyidle.record.steptable import _INT_FIELDS, FULL_COLUMNS, LITE_COLUMNS, NULL_INT, StepTable

#: How the agent's writer starts the lines of the step kinds (compact JSON, ``k`` first:
#: :class:`whyidle.record.writer.JsonlWriter`). Other lines are never tried here.
STEP_PREFIX = b'{"k":"step",'
STEPS_PREFIX = b'{"k":"steps",'

_OPT_INT = Optional[int]


class _Step(msgspec.Struct):
    """A ``step`` record's fields the table keeps (docs/run-format.md); others are ignored."""

    i: int
    t0: int
    t1: int
    data: _OPT_INT = None
    fwd: _OPT_INT = None
    bwd: _OPT_INT = None
    opt: _OPT_INT = None
    eval: _OPT_INT = None
    batches: _OPT_INT = None
    samples: _OPT_INT = None
    cpu: _OPT_INT = None
    data_cpu: _OPT_INT = None
    fn: _OPT_INT = None
    comp: _OPT_INT = None
    grad: _OPT_INT = None
    mb: _OPT_INT = None
    ld: _OPT_INT = None
    wi: _OPT_INT = None
    hk: _OPT_INT = None
    fc: _OPT_INT = None
    by: Any = None
    boundary: Any = None
    profiled: Any = None
    lite: Any = None
    ph: Optional[list[int]] = None


assert _Step.__struct_fields__ == FULL_COLUMNS, "_Step's fields in StepTable.add_full_columns' order"

_ROW = tuple[(int, int, int) + (Any,) + (_OPT_INT,) * 8 + (Any,)]
assert len(_ROW.__args__) == len(LITE_COLUMNS)


class _Steps(msgspec.Struct):
    """A ``steps`` record's rows (:data:`~whyidle.record.steptable.LITE_COLUMNS` each)."""

    rows: list[_ROW]


_STEP = msgspec.json.Decoder(_Step)
_STEP_LIST = msgspec.json.Decoder(list[_Step])
_STEPS = msgspec.json.Decoder(_Steps)
_N_INT = len(_INT_FIELDS)


def add_line(table: StepTable, raw: bytes) -> bool | None:
    """Appends the step(s) of one JSON line to ``table`` when it is a well-typed ``step`` or
    ``steps`` record: True; None when the line is not one (another kind, or a value the types
    refuse: the caller reads it the general way). A ``step`` whose interval ends before it starts
    or with a value outside int64 returns None too, and so does a ``steps`` record with such a row
    (nothing of it appended), so the general path counts what it leaves out."""
    try:
        if raw.startswith(STEP_PREFIX):
            s = _STEP.decode(raw)
        elif raw.startswith(STEPS_PREFIX):
            rows = _STEPS.decode(raw).rows
            return (table.add_lite_columns(list(zip(*rows))) or None) if rows else True
        else:
            return None
    except msgspec.DecodeError:  # ValidationError included
        return None
    fields = msgspec.structs.astuple(s)
    values = [NULL_INT if v is None else v for v in fields[:_N_INT]]
    ph = s.ph
    if ph is None or len(ph) % 2:
        ph = []
    return table.add_values(values, s.by, s.boundary, s.profiled, s.lite, ph, s.i, s.t0, s.t1) or None


def add_lines(table: StepTable, raws: list[bytes]) -> bool:
    """Appends the steps of consecutive ``step`` lines (each starting with :data:`STEP_PREFIX`)
    to ``table`` in one typed decode, all or none: True when every line is a well-typed ``step``
    record that :func:`add_line` would take; False, nothing appended, otherwise (the caller then
    takes the lines one by one, so damage is counted per line). A million step lines decoded this
    way cost ~2 µs each instead of ~12 µs one by one."""
    if not raws:
        return True
    try:
        steps = _STEP_LIST.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.DecodeError:  # ValidationError included
        return False
    if len(steps) != len(raws):  # a damaged line swallowed the next: not one record per line
        return False
    return table.add_full_columns(list(zip(*map(msgspec.structs.astuple, steps))))
