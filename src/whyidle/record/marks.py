"""``gpu_marks`` lines read into compact columns (pure).

A CUDA run's trainer writes its GPU marks in ``gpu_marks`` records of five columns
(docs/run-format.md): a million 1 ms steps hold ~2.5 million marks. Parsed by ``json.loads`` each
mark costs ~170 bytes (an int, a float, a step number and two strings as Python objects): ~400 MB
for that run. :func:`decode_marks` decodes a line in one typed msgspec pass whose types are the
schema's checks (:data:`whyidle.record.schema.SCHEMAS` ``gpu_marks`` and its column checks) and
keeps ``h`` as an int64 ``array``, ``g`` as a float64 ``array``, ``step`` as an int64 ``array``
(:data:`NULL` for null), and ``phase``/``kind`` as lists of one shared string per distinct value.
A line the types refuse is read the general way by the caller, which says what it leaves out.
"""

from __future__ import annotations

import array
from typing import Annotated, Any, Optional

import msgspec

from whyidle.record.compact import _NUM

#: How the agent's writer starts a ``gpu_marks`` line (compact JSON, ``k`` first).
MARKS_PREFIX = b'{"k":"gpu_marks",'
#: Null in the ``step`` column.
NULL = -(2**63)
_L = 2**63
_INT = Annotated[int, msgspec.Meta(ge=-_L + 1, le=_L - 1)]


class _Marks(msgspec.Struct):
    """A ``gpu_marks`` record's fields the analysis reads, typed as the schema checks them."""

    t: _NUM
    h: list[_INT]
    g: list[_NUM]
    phase: list[Optional[str]]
    kind: list[Optional[str]]
    step: list[Optional[_INT]]
    extra: Optional[list[tuple[_INT, Any]]] = None


_MARKS = msgspec.json.Decoder(_Marks)


def decode_marks(raw: bytes, names: dict[str, str]) -> dict | None:
    """A ``gpu_marks`` line as its record with compact columns (module docstring), or None when
    the line is not such a record or the schema would refuse it (a value of the wrong type,
    columns of different lengths, an ``extra`` index outside them). ``names``: the pool the
    ``phase``/``kind`` strings are taken from (one copy of each across the run's records)."""
    try:
        m = _MARKS.decode(raw)
    except msgspec.DecodeError:  # ValidationError included
        return None
    n = len(m.h)
    if not (len(m.g) == len(m.phase) == len(m.kind) == len(m.step) == n):
        return None
    if m.extra and not all(0 <= idx < n for idx, _ in m.extra):
        return None
    steps = m.step
    if None in steps:
        steps = [NULL if s is None else s for s in steps]
    pool = names.setdefault
    return {"k": "gpu_marks", "t": m.t, "h": array.array("q", m.h), "g": array.array("d", m.g),
            "phase": [None if p is None else pool(p, p) for p in m.phase],
            "kind": [None if k is None else pool(k, k) for k in m.kind],
            "step": array.array("q", steps), "extra": [list(e) for e in m.extra] if m.extra is not None else None}
