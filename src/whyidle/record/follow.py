"""Follows a live run directory's records as they are written (``whyidle run``'s parent process),
keeping what the current window of the rolling diagnosis needs (:mod:`whyidle.analysis.windows`).

Each look reads only the bytes appended since the last one (a line still being written waits for
the next look), parses them once, checks them as :func:`whyidle.record.reader.read_jsonl` does
(:mod:`whyidle.record.schema`; step records by the step table when the window is built) and keeps:
every setup record for good (they describe the whole process, few and small), series records
until :meth:`RunFollower.prune` drops those that end before the next window
(:mod:`whyidle.record.window`). Memory is bounded by one window of records, whatever the job's
length.
"""

from __future__ import annotations

import glob
import json
import os
import re

from whyidle.record import schema
from whyidle.record.reader import RunData
from whyidle.record.window import SERIES_KINDS, record_end, slice_run

_STEP_KINDS = ("step", "steps", "gpu_step")


class RunFollower:
    """Incremental reader of ``host.jsonl``, ``gpu.jsonl`` and ``proc-<pid>.jsonl`` of a run being
    written. Never raises on damaged input: a line that is not a JSON object, or a record with
    unusable values, is skipped and counted in :attr:`skipped`."""

    def __init__(self, run_dir: str, meta: dict) -> None:
        self.run_dir = run_dir
        self.meta = meta
        self._offsets: dict[str, int] = {}
        self.host: list[dict] = []
        self.gpu: list[dict] = []
        self.procs: dict[int, list[dict]] = {}
        self.steps: dict[int, list[dict]] = {}  # pid -> step, steps and gpu_step records
        self.skipped = 0
        self.new: list[tuple[int, dict]] = []  # (pid, record) of step and trace records since the last take_new

    def poll(self) -> None:
        """Reads what was appended to the run's record files since the last look."""
        self._read("host", self.host)
        self._read("gpu", self.gpu)
        for path in glob.glob(os.path.join(self.run_dir, "proc-*.jsonl")):
            m = re.search(r"proc-(\d+)\.jsonl$", path)
            if m:
                pid = int(m.group(1))
                self._read(f"proc-{pid}", self.procs.setdefault(pid, []), pid)

    def _read(self, name: str, out: list[dict], pid: int | None = None) -> None:
        path = os.path.join(self.run_dir, f"{name}.jsonl")
        offset = self._offsets.get(name, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offsets[name] = offset + end
        for raw in data[:end].split(b"\n"):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError):
                rec = None
            if not isinstance(rec, dict) or not isinstance(rec.get("k"), str):
                self.skipped += 1
                continue
            k = rec["k"]
            if pid is not None and k in _STEP_KINDS:
                self.steps.setdefault(pid, []).append(rec)
                if k != "gpu_step":
                    self.new.append((pid, rec))
                continue
            if schema.problem(rec):
                self.skipped += 1
                continue
            out.append(rec)
            if k == "trace_window" and pid is not None:
                self.new.append((pid, rec))

    def take_new(self) -> list[tuple[int, dict]]:
        """The ``step``/``steps`` and ``trace_window`` records read since the last call, with their
        process's pid, in the order read."""
        new, self.new = self.new, []
        return new

    def window(self, t0: int, t1: int) -> RunData:
        """The records read so far that fall in ``[t0, t1)`` (monotonic ns), as a run
        (:func:`whyidle.record.window.slice_run`)."""
        run = RunData(path=self.run_dir, meta=dict(self.meta), host=self.host, gpu=self.gpu, procs=self.procs,
                      problems=[])
        return slice_run(run, t0, t1, steps=self.steps)

    def prune(self, before: int) -> None:
        """Drops the series records that end before ``before`` (monotonic ns); setup records stay."""
        def keep(rec: dict) -> bool:
            if rec.get("k") not in SERIES_KINDS:
                return True
            t = record_end(rec)
            return t is None or t >= before

        self.host = [r for r in self.host if keep(r)]
        self.gpu = [r for r in self.gpu if keep(r)]
        for pid in self.procs:
            self.procs[pid] = [r for r in self.procs[pid] if keep(r)]
        for pid in self.steps:
            self.steps[pid] = [r for r in self.steps[pid] if keep(r)]
