"""Follows the step records of a running command (``proc-*.jsonl`` files still being written),
for the live status line (:mod:`whyidle.report.live`)."""

from __future__ import annotations

import collections
import glob
import json
import os

from whyidle.record.steptable import expand_lite

#: Seconds of recent steps the live rates are computed over.
RECENT_S = 10.0


class StepTail:
    """Follows ``proc-*.jsonl`` files of a running command and keeps the recent steps: ``step``
    records and the rows of ``steps`` records (steps recorded without detail, see
    docs/run-format.md)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}
        self.recent: dict[str, collections.deque] = {}
        self.total: dict[str, int] = {}
        self.window_ratio: dict[str, float] = {}

    def poll(self) -> None:
        for path in glob.glob(os.path.join(self.run_dir, "proc-*.jsonl")):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(data)
            data = self._partial.pop(path, b"") + data
            lines = data.split(b"\n")
            if lines and lines[-1]:
                self._partial[path] = lines[-1]
            for raw in lines[:-1]:
                window = b'"k":"tf_window"' in raw
                if b'"k":"step' not in raw and not window:  # "step" and "steps"
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue
                if window:  # Keras: the profiler window's input-wait ratio of the train function
                    calls = rec.get("calls") or []
                    total = sum(c[0] for c in calls)
                    if total > 0:
                        self.window_ratio[path] = min(1.0, sum(min(c) for c in calls) / total)
                    continue
                steps = expand_lite(rec) if rec.get("k") == "steps" else [rec] if rec.get("k") == "step" else []
                self.recent.setdefault(path, collections.deque(maxlen=2000)).extend(steps)
                self.total[path] = self.total.get(path, 0) + len(steps)

    def summary(self, now_ns: int) -> tuple[int, float | None, float | None]:
        """(total steps of the busiest process, its steps/s and data-wait share over RECENT_S; the
        share is None for Keras steps until the profiler window's ratio is known)."""
        if not self.total:
            return 0, None, None
        path = max(self.total, key=self.total.get)
        cutoff = now_ns - int(RECENT_S * 1e9)
        steps = [s for s in self.recent[path] if s["t1"] >= cutoff]
        if not steps:
            return self.total[path], None, None
        span = (steps[-1]["t1"] - steps[0]["t0"]) / 1e9
        rate = len(steps) / span if span > 0 else None
        if steps[-1].get("by") == "keras":  # input wait known once the profiler window is read
            ratio = self.window_ratio.get(path)
            data = None if ratio is None else sum(s.get("fn") or 0 for s in steps) * ratio
        else:  # from the steps whose data wait was timed (not the rows of steps without detail)
            steps = [s for s in steps if s.get("data") is not None]
            data = sum(s["data"] for s in steps)
        busy = sum(s["t1"] - s["t0"] for s in steps)
        return self.total[path], rate, (data / busy if busy and data is not None else None)


class SamplerTail:
    """The most recent tick of the samplers of a run written by another process (the helper of
    :mod:`whyidle.sampling.helper`), read from ``host.jsonl`` and ``gpu.jsonl``: the
    :attr:`latest` that :class:`whyidle.report.live.LiveStatus` reads from a
    :class:`whyidle.sampling.loop.SamplerLoop` in ``whyidle run``. Reads only what was appended
    since the last look; never raises."""

    FILES = ("host", "gpu")

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._offsets: dict[str, int] = {}
        self._latest: dict[str, list[dict]] = {}

    @property
    def latest(self) -> dict[str, list[dict]]:
        """sampler name → the records of its last tick written so far (the records of the last
        time stamp)."""
        for name in self.FILES:
            path = os.path.join(self.run_dir, f"{name}.jsonl")
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(name, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next look
            self._offsets[name] = self._offsets.get(name, 0) + end
            recs = []
            for raw in data[:end].split(b"\n"):
                try:
                    recs.append(json.loads(raw))
                except ValueError:  # an empty or torn line
                    continue
            stamped = [r for r in recs if isinstance(r, dict) and isinstance(r.get("t"), (int, float))]
            if stamped:
                last = max(r["t"] for r in stamped)
                self._latest[name] = [r for r in stamped if r["t"] == last]
        return self._latest
