"""The live status while the command runs: steps/s, data-wait share, CPU, GPU util.

On a terminal it is one line pinned to the bottom row: the rows above become a scroll region
(DECSTBM, the way apt draws its progress bar), so the command's own output scrolls above it
untouched. Elsewhere (a pipe, a CI log) it is a plain ``[whyidle]`` line every
:data:`PLAIN_PERIOD_S` seconds. Everything goes to whyidle's stderr; the command's stdout stays
the command's.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import time

from whyidle.record.steptable import expand_lite

#: Seconds of recent steps the live rates are computed over.
RECENT_S = 10.0
#: Seconds between plain status lines when stderr is not a terminal.
PLAIN_PERIOD_S = 5.0


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


class LiveStatus:
    """Draws the status line; call :meth:`tick` about once a second and :meth:`close` at the end.

    Args:
        run_dir: the run directory being written.
        sampler: the :class:`whyidle.sampling.loop.SamplerLoop` (its ``latest`` records).
        stream: where to draw (whyidle's stderr).
        tty: draw the pinned line (True) or plain periodic lines (False).
    """

    def __init__(self, run_dir: str, sampler, stream, tty: bool) -> None:
        self.tail = StepTail(run_dir)
        self.sampler = sampler
        self.stream = stream
        self.tty = tty
        self._prev_host: dict | None = None
        self._cpu_text = "CPU …"
        self._last_plain = time.monotonic()
        self._rows = None
        self._started = time.monotonic()

    def _cpu(self) -> str:
        ticks = [r for r in self.sampler.latest.get("host", []) if r.get("k") == "host"]
        if ticks:
            cur = ticks[-1]
            prev = self._prev_host
            if prev is not None and cur["t"] > prev["t"]:
                dt = (cur["t"] - prev["t"]) / 1e9
                busy = sum(b - a for a, b in zip(prev["percpu_busy_s"], cur["percpu_busy_s"])) / dt
                cores = len(cur["percpu_busy_s"]) or 1
                self._cpu_text = f"CPU {busy / cores:.0%} of {cores} cores"
            self._prev_host = cur
        return self._cpu_text

    def _gpu(self) -> str:
        recs = self.sampler.latest.get("gpu", [])
        vals = [s[1] for r in recs if r.get("k") == "gpu_util" and r.get("type") == "gpu" for s in r["samples"]]
        if vals:
            return f"GPU util {sum(vals) / len(vals):.0f}%"
        snaps = [r["util_pct"] for r in recs if r.get("k") == "gpu_state" and r.get("util_pct") is not None]
        return f"GPU util {snaps[-1]:.0f}%" if snaps else "GPU n/a"

    def line(self) -> str:
        """The current status text."""
        self.tail.poll()
        steps, rate, wait = self.tail.summary(time.monotonic_ns())
        elapsed = time.monotonic() - self._started
        parts = [f"{elapsed:5.0f}s", f"{steps} steps"]
        parts.append(f"{rate:.1f} steps/s" if rate else "– steps/s")
        parts.append(f"data wait {wait:.0%}" if wait is not None else "data wait –")
        parts.append(self._cpu_text)
        parts.append(self._gpu())
        return "[whyidle] " + " · ".join(parts)

    def tick(self) -> None:
        """Refreshes the status (pinned line) or prints a plain line when one is due."""
        try:
            self._cpu()  # follow every host tick, printed or not
            if self.tty:
                self._draw_pinned(self.line())
            elif time.monotonic() - self._last_plain >= PLAIN_PERIOD_S:
                self._last_plain = time.monotonic()
                self.stream.write(self.line() + "\n")
                self.stream.flush()
        except (OSError, ValueError):
            self.tty = False

    def _draw_pinned(self, text: str) -> None:
        rows, cols = _terminal_size(self.stream)
        if rows is None or rows < 3:
            return
        out = []
        if rows != self._rows:
            # Make room, keep the cursor inside the region, then reserve the last row.
            out.append("\n\x1b[1A\x1b7" + f"\x1b[1;{rows - 1}r" + "\x1b8")
            self._rows = rows
        out.append(f"\x1b7\x1b[{rows};1H\x1b[2K\x1b[2m{text[: cols - 1]}\x1b[0m\x1b8")
        self.stream.write("".join(out))
        self.stream.flush()

    def close(self) -> None:
        """Gives the terminal its full height back and clears the status row."""
        if self.tty and self._rows:
            try:
                self.stream.write(f"\x1b7\x1b[r\x1b8\x1b7\x1b[{self._rows};1H\x1b[2K\x1b8")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._rows = None


def _terminal_size(stream) -> tuple[int | None, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
        return size.lines, size.columns
    except (OSError, ValueError, AttributeError):
        return None, 80
