"""The live status while the command runs: steps/s, data-wait share, CPU, GPU util.

On a terminal it is one line pinned to the bottom row: the rows above become a scroll region
(DECSTBM, the way apt draws its progress bar), so the command's own output scrolls above it
untouched. Elsewhere (a pipe, a CI log) it is a plain ``[whyidle]`` line every
:data:`PLAIN_PERIOD_S` seconds. Everything goes to whyidle's stderr; the command's stdout stays
the command's.
"""

from __future__ import annotations

import os
import time

#: Seconds between plain status lines when stderr is not a terminal.
PLAIN_PERIOD_S = 5.0


class LiveStatus:
    """Draws the status line; call :meth:`tick` about once a second and :meth:`close` at the end.

    Args:
        tail: a :class:`whyidle.record.tail.StepTail` of the run directory being written.
        sampler: the :class:`whyidle.sampling.loop.SamplerLoop` (its ``latest`` records).
        stream: where to draw (whyidle's stderr).
        tty: draw the pinned line (True) or plain periodic lines (False).
    """

    def __init__(self, tail, sampler, stream, tty: bool) -> None:
        self.tail = tail
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
        parts.append(f"{rate:.1f} steps/s ({1000 / rate:.0f} ms/step)" if rate else "– steps/s")
        parts.append(f"data wait {wait:.0%}" if wait is not None else "data wait –")
        parts.append(self._cpu_text)
        parts.append(self._gpu())
        return "[whyidle] " + " · ".join(parts)

    def text(self) -> str:
        """The current status text, following the host's latest tick (for a caller that shows it
        itself: the ``%%whyidle`` cell's output)."""
        self._cpu()
        return self.line()

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
