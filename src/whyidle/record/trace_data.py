"""In-memory form of one PyTorch profiler (Kineto) trace: columns, not one object per event.

Produced by :func:`whyidle.record.kineto.read_trace`; read by :mod:`whyidle.analysis.trace`.
Times are microseconds (float64) as in the trace (``ts``, ``dur``; Kineto writes µs, newer traces
with ns-resolution fractions). Strings (names, categories) are interned into ``strings`` and
columns hold their index.

Event groups (Kineto ``cat`` values, old and new spellings):

* ``gpu``: device activities, ``cat`` ∈ ``kernel``/``Kernel``, ``gpu_memcpy``/``Memcpy``,
  ``gpu_memset``/``Memset``. Columns: ``ts``, ``dur``, ``kind`` (:data:`KERNEL`, :data:`MEMCPY`,
  :data:`MEMSET`), ``device`` (``args.device``, else ``pid``), ``stream`` (``args.stream``, -1
  unknown), ``name``, ``correlation`` (``args.correlation``, -1), ``bytes`` (``args.bytes``, -1),
  ``copy`` (memcpy direction and memory: :data:`COPY_KINDS` index from the name, e.g.
  ``"Memcpy HtoD (Pageable -> Device)"``; -1 for others), ``group`` (a collective kernel's
  ``args["Group size"]``: ranks in its process group, newer Kineto; -1 unknown).
* ``runtime``: host-side CUDA/HIP API calls, ``cat`` ∈ ``cuda_runtime``/``Runtime``/
  ``cuda_driver``. Columns: ``ts``, ``dur``, ``name``, ``tid``, ``correlation``.
* ``cpu``: host operators and annotations, ``cat`` ∈ ``cpu_op``/``Operator``/``user_annotation``/
  ``python_function``/``gpu_user_annotation`` excluded. Columns: ``ts``, ``dur``, ``name``, ``tid``,
  ``cat``.
* ``syncs``: ``cuda_sync`` events (``ph: X``, Kineto ≥ 2.1 "Stream Sync"/"Context Sync"/"Event
  Sync"/"Stream Wait Event"): ``ts``, ``dur``, ``name``, ``stream``.
* ``steps``: ``ProfilerStep#N`` annotations on the host: list of ``(N, ts, dur)``, by ``ts``.

Metadata: ``rank`` and ``world_size`` from ``distributedInfo`` (None when absent),
``device_properties`` (the trace's list, may list GPUs the job did not use), ``backend``,
``base_ns`` (``baseTimeNanoseconds``: newer Kineto writes ``ts`` relative to it; older traces'
``ts`` are wall-clock µs already).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KERNEL, MEMCPY, MEMSET = 0, 1, 2

#: Memcpy kinds read from the activity name ("Memcpy HtoD (Pageable -> Device)").
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")


@dataclass
class TraceData:
    """One rank's trace as columns (see the module docstring)."""

    path: str
    strings: list[str]
    gpu: dict[str, np.ndarray]
    runtime: dict[str, np.ndarray]
    cpu: dict[str, np.ndarray]
    syncs: dict[str, np.ndarray]
    steps: list[tuple[int, float, float]]
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device_properties: list[dict] = field(default_factory=list)
    events: int = 0  # events read (all phases), for speed figures
    base_ns: int | None = None  # ``baseTimeNanoseconds``: wall-clock epoch of ``ts`` 0, newer Kineto
    pageable: np.ndarray | None = None  # per gpu row: True when a memcpy touches pageable memory
    skipped: int = 0  # events left out: not an event object, ts/dur/cat unusable, damaged text (record/kineto.py)
    cut: str | None = None  # where the readable events ended early (a file cut short, damaged gzip), or None

    def name(self, idx: int) -> str:
        """The string of an interned index."""
        return self.strings[idx]
