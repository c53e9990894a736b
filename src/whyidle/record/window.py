"""A time slice of a run's records: the records of one window ``[t0, t1)`` of a run, as a
:class:`~whyidle.record.reader.RunData` the analysis reads like a whole run (the rolling
diagnosis of :mod:`whyidle.analysis.windows`).

Records are of two sorts (docs/run-format.md, "windows"): *series* records, stamped with the time
they describe (steps, host and GPU samples, stack samples, regions, iterator spans, compilations,
collectives), which a window keeps when they fall in it; and *setup* records (``proc``, ``loader``,
``api``, ``optimizers``, ``module_calls``, static host and GPU facts, ...), written once and kept by
every window, since they describe the whole process.
"""

from __future__ import annotations

import dataclasses

from whyidle.record.reader import RunData, traced_spans
from whyidle.record.steptable import StepTable

#: Record kinds that describe a moment or an interval of the run (kept by the window they fall in).
SERIES_KINDS = frozenset({
    "step", "steps", "gpu_step", "iter", "iter_first", "iter_end", "gpu_marks", "transfers", "graph", "stacks",
    "keras_call", "keras_done", "metric", "region", "colls", "compile", "host", "host_top", "gpu_util",
    "gpu_state", "gpu_counters", "gpm", "trace_window",
})


def record_end(rec: dict) -> int | None:
    """The monotonic ns a series record ends at: ``t1`` for an interval, else ``t`` (the time it
    was written); None without either. A ``steps``/``colls`` record is stamped when written, after
    its rows."""
    t = rec.get("t1")
    if not isinstance(t, int):
        t = rec.get("t")
    return t if isinstance(t, int) else None


def in_window(rec: dict, t0: int, t1: int) -> bool:
    """Whether a record belongs to the window ``[t0, t1)``: a setup record always, a series
    record when it ends inside it."""
    if rec.get("k") not in SERIES_KINDS:
        return True
    t = record_end(rec)
    return t is not None and t0 <= t < t1


def step_table(records: list[dict], t0: int, t1: int) -> StepTable:
    """The steps (``step`` records, ``steps`` rows, ``gpu_step`` times) among ``records`` that end in
    ``[t0, t1)``, as one :class:`StepTable`."""
    table = StepTable()
    for rec in records:
        k = rec.get("k")
        if k == "step":
            if isinstance(rec.get("t1"), int) and t0 <= rec["t1"] < t1:
                table.add(rec)
        elif k == "steps":
            rows = [r for r in rec.get("rows") or () if isinstance(r, list) and len(r) > 2
                    and isinstance(r[2], int) and t0 <= r[2] < t1]
            if rows:
                table.add_lite({"rows": rows})
        elif k == "gpu_step":
            table.add_gpu(rec)
    return table


def slice_run(run: RunData, t0: int, t1: int, steps: dict | None = None) -> RunData:
    """The records of ``run`` in the window ``[t0, t1)`` (monotonic ns) as a run of its own: its
    ``meta`` says the window is the command's life (``start_t`` = t0, ``exit_t`` = t1), so the
    analysis accounts for the window's wall time. ``steps``: pid → the step records (``step``,
    ``steps``, ``gpu_step``) when ``run.procs`` does not hold them (a loaded run keeps them in
    ``run.steps`` tables, which are sliced by time)."""
    meta = {**run.meta, "start_t": t0, "exit_t": t1, "window": [t0, t1]}
    procs = {pid: [r for r in recs if in_window(r, t0, t1)] for pid, recs in run.procs.items()}
    tables = {}
    for pid in run.procs:
        if steps is not None:
            tables[pid] = step_table(steps.get(pid, []), t0, t1)
            tables[pid].mark_profiled(traced_spans(run.procs[pid]))
        else:
            table = run.steps.get(pid)
            tables[pid] = _table_slice(table, t0, t1) if table is not None else StepTable()
    return dataclasses.replace(
        run, meta=meta, procs=procs, steps=tables, problems=[],
        host=[r for r in run.host if in_window(r, t0, t1)], gpu=[r for r in run.gpu if in_window(r, t0, t1)])


def _table_slice(table: StepTable, t0: int, t1: int) -> StepTable:
    out = StepTable()
    for row in table.rows():
        if t0 <= row["t1"] < t1:
            rec = dict(row)
            rec = {k: v for k, v in rec.items() if v is not None}
            out.add(rec)
            if row["lite"]:
                out.lite[-1] = 1
            out.profiled[-1] = 1 if row["profiled"] else 0
            if row["gpu_ms"] is not None:
                out.set_gpu_ms(len(out) - 1, row["gpu_ms"])
    return out
