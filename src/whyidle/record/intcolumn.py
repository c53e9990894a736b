"""An append-only column of int64 values kept in chunks as narrow as their values allow.

A step table holds twenty int fields per step (docs/run-format.md); as plain int64 arrays a day of
86 ms steps took 160 MB for them. Most of them are narrow or constant: ``eval`` is 0 in a training
loop, ``batches`` and ``mb`` 1, ``ld`` one loader's id, ``wi``/``hk``/``fc`` 0 or null, step indices
count up by one, and the phase times (ns) of a step of a few seconds fit 32 bits. Values come in
through a tail array; every :data:`CHUNK` values the tail is sealed into the narrowest of:

- a constant (one value, ``CHUNK`` times): 0 bytes a value;
- a range (``first, first + 1, ...``): 0 bytes a value;
- sparse: one value (null, or the chunk's first) at all but at most an eighth of the places, the
  others as 16-bit positions and int64 values (a 1 kHz run's phase times, on one step in 20):
  ~0.5 bytes a value;
- 32-bit offsets from a base, :data:`NULL` as a reserved offset: 4 bytes a value;
- a line: 32-bit offsets from ``first + k·slope`` (no nulls; the start and end times of steps,
  which a chunk of slow steps spreads past 32 bits): 4 bytes a value, none when every value is on
  the line (a steady stride);
- the int64 values as they are: 8 bytes a value.

The column reads like a sequence of ints (``len``, ``col[k]``, iteration) and as a numpy array
(:meth:`IntColumn.numpy`, int64, made on demand). numpy is imported when a chunk is sealed or read
as an array (the trainer's agent never does: it imports this package for its constants only).
"""

from __future__ import annotations

import array
import bisect

#: Values per sealed chunk (a power of two: the chunk of a row is ``row >> CHUNK_BITS``).
CHUNK_BITS = 16
CHUNK = 1 << CHUNK_BITS
_MASK = CHUNK - 1
#: Null in an int64 column (:data:`whyidle.record.steptable.NULL_INT`).
NULL = -(2**63)
_I32_NULL = -(2**31)
_I64_MAX = 2**63 - 1
_CONST, _RANGE, _I32, _I64, _SPARSE, _LINE = range(6)


def _seal(tail: array.array) -> tuple:
    """``(kind, data, base)`` of one full chunk: the narrowest encoding that holds its values."""
    import numpy as np

    a = np.frombuffer(tail, dtype=np.int64)
    first = int(a[0])
    if (a == first).all():
        return _CONST, first, None
    if first != NULL and int(a[-1]) - first == len(a) - 1 and (np.diff(a) == 1).all():
        return _RANGE, first, None
    slope = int(a[1]) - first if len(a) > 1 else 0
    last = first + (len(a) - 1) * slope
    if first != NULL and -(2**63) < last < 2**63 and (a == first + np.arange(len(a), dtype=np.int64) * slope).all():
        return _LINE, None, (first, slope)  # a steady stride (a row's end of its phase pairs): no bytes
    nulls = a == NULL
    for common in (nulls, a == first):  # sparse: all but an eighth of the values the same
        others = np.flatnonzero(~common)
        if len(others) <= len(a) >> 3:
            return _SPARSE, (array.array("H", others.astype(np.uint16).tobytes()),
                             array.array("q", a[others].tobytes())), NULL if common is nulls else first
    values = a[~nulls] if nulls.any() else a
    low, high = int(values.min()), int(values.max())
    base = low + 2**31 - 1  # offsets in [-(2**31 - 1), 2**31 - 1]; -2**31 is null
    if high - low <= 2**32 - 2 and base <= _I64_MAX:
        with np.errstate(over="ignore"):  # a null's offset wraps: replaced below
            offsets = (a - base).astype(np.int32)
        offsets[nulls] = _I32_NULL
        return _I32, array.array("i", offsets.tobytes()), base
    if not nulls.any():  # a line: first + k·slope, each value within 32 bits of it (times of steps)
        slope = (int(a[-1]) - first) // (len(a) - 1)
        if abs(slope) * len(a) < 2**62:
            line = first + np.arange(len(a), dtype=np.int64) * slope  # between first and last: no overflow
            with np.errstate(over="ignore"):  # a wrapped difference reads back wrong: checked below
                residuals = a - line
            if int(residuals.min()) > -(2**31) and int(residuals.max()) < 2**31:
                narrow = residuals.astype(np.int32)
                if np.array_equal(narrow + line, a):
                    return _LINE, array.array("i", narrow.tobytes()), (first, slope)
    return _I64, tail, None


def _chunk_array(kind: int, data, base, n: int):
    """One sealed chunk's values as an int64 numpy array (read-only when it is a view)."""
    import numpy as np

    if kind == _CONST:
        return np.full(n, data, dtype=np.int64)
    if kind == _RANGE:
        return np.arange(data, data + n, dtype=np.int64)
    if kind == _I32:
        offsets = np.frombuffer(data, dtype=np.int32)
        out = offsets.astype(np.int64) + base
        out[offsets == _I32_NULL] = NULL
        return out
    if kind == _LINE:
        first, slope = base
        line = first + np.arange(n, dtype=np.int64) * slope
        return line if data is None else np.frombuffer(data, dtype=np.int32) + line
    if kind == _SPARSE:
        out = np.full(n, base, dtype=np.int64)
        out[np.frombuffer(data[0], dtype=np.uint16)] = np.frombuffer(data[1], dtype=np.int64)
        return out
    return np.frombuffer(data, dtype=np.int64)


class IntColumn:
    """Append-only int64 values (``NULL`` for null) in chunks (module docstring).

    ``append``/``extend`` add values (an int64 ``array("q")`` or ints; ``OverflowError`` for a
    value outside int64, nothing added then for ``extend``); ``col[k]`` reads one (negative ``k``
    from the end; ``IndexError`` outside), ``len``, iteration, :meth:`numpy` all of them,
    :meth:`position` the index of a value in an increasing column. ``nbytes``: the bytes held.
    """

    __slots__ = ("_sealed", "_firsts", "_tail")

    def __init__(self) -> None:
        self._sealed: list[tuple] = []  # (kind, data, base) per full chunk
        self._firsts = array.array("q")  # each sealed chunk's first value (for position)
        self._tail = array.array("q")

    def __len__(self) -> int:
        return (len(self._sealed) << CHUNK_BITS) + len(self._tail)

    def append(self, value: int) -> None:
        tail = self._tail
        tail.append(value)
        if len(tail) == CHUNK:
            self._close_tail()

    def extend(self, values) -> None:
        if type(values) is not array.array or values.typecode != "q":
            values = array.array("q", values)
        tail, k, n = self._tail, 0, len(values)
        if len(tail) + n < CHUNK:  # the usual case: into the tail
            tail.extend(values)
            return
        while k < n:
            room = CHUNK - len(tail)
            tail.extend(values[k:k + room] if k or n - k > room else values)
            k += room
            if len(tail) == CHUNK:
                self._close_tail()
                tail = self._tail

    def _close_tail(self) -> None:
        self._firsts.append(self._tail[0])
        self._sealed.append(_seal(self._tail))
        self._tail = array.array("q")

    def __getitem__(self, k: int) -> int:
        if k < 0:
            k += len(self)
        c = k >> CHUNK_BITS
        if c < len(self._sealed) and k >= 0:
            kind, data, base = self._sealed[c]
            j = k & _MASK
            if kind == _CONST:
                return data
            if kind == _RANGE:
                return data + j
            if kind == _I32:
                v = data[j]
                return NULL if v == _I32_NULL else base + v
            if kind == _LINE:
                return base[0] + j * base[1] + (data[j] if data is not None else 0)
            if kind == _SPARSE:
                at = bisect.bisect_left(data[0], j)
                return data[1][at] if at < len(data[0]) and data[0][at] == j else base
            return data[j]
        if k < 0:
            raise IndexError("IntColumn index out of range")
        return self._tail[k - (len(self._sealed) << CHUNK_BITS)]  # IndexError past the end

    def __iter__(self):
        for kind, data, base in self._sealed:
            if kind == _CONST:
                yield from (data,) * CHUNK
            elif kind == _RANGE:
                yield from range(data, data + CHUNK)
            elif kind == _I32:
                yield from (NULL if v == _I32_NULL else base + v for v in data)
            elif kind in (_SPARSE, _LINE):
                yield from _chunk_array(kind, data, base, CHUNK).tolist()
            else:
                yield from data
        yield from self._tail

    def numpy(self, start: int = 0, stop: int | None = None):
        """The values of rows ``start`` to ``stop`` (default: all; clipped to the column) as a new
        int64 numpy array (``NULL`` for null); only the chunks holding them are expanded."""
        import numpy as np

        n = len(self)
        stop = n if stop is None else min(stop, n)
        start = max(0, start)
        if start >= stop:
            return np.zeros(0, np.int64)
        first, last = start >> CHUNK_BITS, (stop - 1) >> CHUNK_BITS
        parts = [_chunk_array(*self._sealed[c], CHUNK) for c in range(first, min(last + 1, len(self._sealed)))]
        if last >= len(self._sealed):
            parts.append(np.frombuffer(self._tail, dtype=np.int64))
        whole = np.concatenate(parts) if len(parts) > 1 else parts[0]
        out = whole[start - (first << CHUNK_BITS):stop - (first << CHUNK_BITS)]
        return out.copy() if len(parts) == 1 else out

    def position(self, value: int) -> int | None:
        """The index of ``value`` in a column whose values increase (row numbers), or None."""
        c = bisect.bisect_right(self._firsts, value) - 1
        if c >= 0 and (c < len(self._sealed) - 1 or not self._tail or value < self._tail[0]):
            kind, data, base = self._sealed[c]
            if kind == _CONST:
                j = 0 if data == value else -1
            elif kind == _RANGE:
                j = value - data if value - data < CHUNK else -1
            elif kind in (_SPARSE, _LINE):
                chunk = _chunk_array(kind, data, base, CHUNK)
                j = int(chunk.searchsorted(value))
                j = j if j < CHUNK and chunk[j] == value else -1
            else:
                key = value - base if kind == _I32 else value
                j = bisect.bisect_left(data, key) if kind == _I64 or -(2**31) < key < 2**31 else -1
                j = j if 0 <= j < CHUNK and data[j] == key else -1
            return None if j < 0 else (c << CHUNK_BITS) + j
        j = bisect.bisect_left(self._tail, value)
        return (len(self._sealed) << CHUNK_BITS) + j if j < len(self._tail) and self._tail[j] == value else None

    def consecutive(self) -> int | None:
        """The first value when the values are ``first, first + 1, ...`` (rows of one run, an
        empty column's first being 0), else None; reads no chunk."""
        first = self._firsts[0] if self._sealed else (self._tail[0] if self._tail else 0)
        for c, (kind, data, _) in enumerate(self._sealed):
            if kind != _RANGE or data != first + (c << CHUNK_BITS):
                return None
        tail, start = self._tail, first + (len(self._sealed) << CHUNK_BITS)
        if tail and (tail[0] != start or tail[-1] != start + len(tail) - 1):
            return None
        if len(tail) > 2:
            import numpy as np

            if not (np.diff(np.frombuffer(tail, dtype=np.int64)) == 1).all():
                return None
        return first

    def bisect_left(self, value: int) -> int:
        """In a column whose values increase (row numbers): the index of the first value
        ``>= value`` (``len`` when none); one chunk is expanded."""
        import numpy as np

        if self._tail and value >= self._tail[0]:
            return (len(self._sealed) << CHUNK_BITS) + bisect.bisect_left(self._tail, value)
        c = bisect.bisect_right(self._firsts, value) - 1
        if c < 0:
            return 0
        return (c << CHUNK_BITS) + int(np.searchsorted(_chunk_array(*self._sealed[c], CHUNK), value))

    @property
    def nbytes(self) -> int:
        """Bytes of the values held (chunks and tail; the list of chunks not counted)."""
        held = self._tail.itemsize * len(self._tail) + 8 * len(self._firsts)
        for kind, data, _ in self._sealed:
            if kind in (_I32, _I64) or (kind == _LINE and data is not None):
                held += data.itemsize * len(data)
            elif kind == _SPARSE:
                held += sum(part.itemsize * len(part) for part in data)
        return held
