"""The sampler loop: one daemon thread in the whyidle process polls every sampler on its period.

Each poller's records go to ``RUN_DIR/<poller.name>.jsonl`` and are flushed after every tick, so
a kill loses at most one tick. A poller that raises is disabled with one ``*_notice`` record.
"""

from __future__ import annotations

import os
import threading
import time

from whyidle.record.writer import JsonlWriter
from whyidle.sampling.base import Poller


class SamplerLoop:
    """Runs pollers from one background thread until :meth:`stop`.

    Args:
        run_dir: the run directory.
        pollers: the samplers (``Poller`` protocol), each with its own ``period_s``.
    Attributes:
        latest: poller name → the records of its most recent tick (for the live status line).
    """

    def __init__(self, run_dir: str, pollers: list[Poller]) -> None:
        self.pollers = list(pollers)
        self.writers = {p.name: JsonlWriter(os.path.join(run_dir, f"{p.name}.jsonl")) for p in self.pollers}
        self.latest: dict[str, list[dict]] = {}
        self._due: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="whyidle-sampler", daemon=True)

    def start(self) -> None:
        now = time.monotonic_ns()
        for p in list(self.pollers):
            self._call(p, p.start, now)
            self._due[p.name] = now
        self._tick(now)
        self._thread.start()

    def _call(self, poller: Poller, fn, now: int) -> None:
        try:
            records = fn(now)
        except Exception as exc:
            self.pollers.remove(poller)
            records = [{"k": f"{poller.name}_notice", "t": now, "msg": f"{poller.name} sampler stopped: {exc!r}"}]
        writer = self.writers[poller.name]
        for rec in records:
            writer.add(rec)
        try:
            writer.flush()
        except OSError:
            pass
        if records:
            self.latest[poller.name] = records

    def _tick(self, now: int) -> None:
        for p in list(self.pollers):
            if now >= self._due[p.name]:
                self._call(p, p.poll, now)
                period = int(p.period_s * 1e9)
                # absolute deadlines; skip missed ticks instead of bursting
                self._due[p.name] = max(self._due[p.name] + period, now + period // 2)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.pollers:
                return
            wait = (min(self._due.values()) - time.monotonic_ns()) / 1e9
            if wait > 0 and self._stop.wait(wait):
                break
            self._tick(time.monotonic_ns())

    def stop(self) -> None:
        """Stops the thread, takes one last sample of each poller, closes files and pollers."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        now = time.monotonic_ns()
        for p in list(self.pollers):
            self._call(p, p.poll, now)
        for p in self.pollers:
            try:
                p.close()
            except Exception:
                pass
        for w in self.writers.values():
            try:
                w.close()
            except OSError:
                pass
