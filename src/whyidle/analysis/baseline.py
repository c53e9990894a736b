"""A running job's own baseline: what its steps and shares looked like while it was normal, for
the rolling diagnosis's departure test (:mod:`whyidle.diagnose.departure`).

Robust statistics, as Google's ml-goodput-measurement judges step anomalies: the median step time
and its median absolute deviation (MAD) over the baseline windows' steps, kept as a bounded
reservoir sample (:data:`MAX_DURATIONS` step times, Vitter's algorithm R) so a job of days costs
the same memory as one of minutes; the other figures are medians over the baseline windows.
"""

from __future__ import annotations

import random
import statistics

#: Step times kept for the median and MAD (a reservoir sample once more have been seen).
MAX_DURATIONS = 20_000
#: Window figures kept (the latest baseline windows).
MAX_WINDOWS = 64


class Baseline:
    """The baseline of one job: step times (seconds) and window figures of the windows judged
    normal. :meth:`add` takes one window; :meth:`reset` starts a new baseline (a new regime)."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self.reset()

    def reset(self) -> None:
        self.durations: list[float] = []
        self.seen = 0
        self.windows: list[dict] = []
        self._stats: tuple[float, float] | None = None

    def add(self, window: dict, durations: list[float]) -> None:
        """Adds one normal window (its ``window`` record) and its steps' durations (seconds)."""
        for d in durations:
            self.seen += 1
            if len(self.durations) < MAX_DURATIONS:
                self.durations.append(d)
            else:
                j = self._rng.randrange(self.seen)
                if j < MAX_DURATIONS:
                    self.durations[j] = d
        self.windows = (self.windows + [window])[-MAX_WINDOWS:]
        self._stats = None

    @property
    def steps(self) -> int:
        return self.seen

    def step_stats(self) -> tuple[float, float] | None:
        """(median, MAD) of the baseline's step times in seconds; None without steps."""
        if not self.durations:
            return None
        if self._stats is None:
            med = statistics.median(self.durations)
            self._stats = (med, statistics.median(abs(d - med) for d in self.durations))
        return self._stats

    def figure(self, key: str, sub: str | None = None) -> float | None:
        """The median over the baseline windows of a window figure (``samples_per_s``, or
        ``shares``/``gpu`` sub-key); None when no window has it."""
        vals = []
        for w in self.windows:
            v = w.get(key)
            if sub is not None:
                v = (v or {}).get(sub) if isinstance(v, dict) else None
            if isinstance(v, (int, float)):
                vals.append(float(v))
        return statistics.median(vals) if vals else None

    def verdict(self) -> str | None:
        """The latest baseline window's verdict."""
        return self.windows[-1].get("verdict") if self.windows else None

    def culprit(self) -> int | None:
        """The latest baseline window's culprit rank (distributed jobs), or None."""
        return ((self.windows[-1].get("collective") or {}).get("culprit_rank")) if self.windows else None
