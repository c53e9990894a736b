"""The sampler loop: one daemon thread in the whyidle process polls every sampler on its period.

Each poller's records go to ``RUN_DIR/<poller.name>.jsonl`` and are flushed after every tick, so
a kill loses at most one tick. A poller that raises is disabled with one ``*_notice`` record. A file
that cannot be written (a full, read-only or removed run directory) or that was removed stops all
sampling for good, with one :attr:`SamplerLoop.problem`: the command goes on.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from whyidle.record.writer import JsonlWriter
from whyidle.sampling.base import Poller, SamplerStopped


class SamplerLoop:
    """Runs pollers from one background thread until :meth:`stop`.

    Args:
        run_dir: the run directory.
        pollers: the samplers (``Poller`` protocol), each with its own ``period_s``.
    Attributes:
        latest: poller name → the records of its most recent tick (for the live status line).
        problem: None, or why sampling stopped early because a file of the run directory could not
            be written or was removed (one line for the user, e.g. ``"cannot write RUN_DIR/host.jsonl
            (No space left on device): recording stopped, the command goes on"``).
    """

    def __init__(self, run_dir: str, pollers: list[Poller]) -> None:
        self.pollers = list(pollers)
        self.writers = {p.name: JsonlWriter(os.path.join(run_dir, f"{p.name}.jsonl")) for p in self.pollers}
        self.latest: dict[str, list[dict]] = {}
        self.problem: str | None = None
        self._written: set[str] = set()  # names of the files created so far
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
        if self.problem is not None:
            return
        try:
            records = fn(now)
        except Exception as exc:
            self.pollers.remove(poller)
            msg = str(exc) if isinstance(exc, SamplerStopped) else f"{poller.name} sampler stopped: {exc!r}"
            records = [{"k": f"{poller.name}_notice", "t": now, "msg": msg}]
            with contextlib.suppress(Exception):  # close() must not raise; a broken poller might
                poller.close()
        writer = self.writers[poller.name]
        for rec in records:
            writer.add(rec)
        try:
            if writer.flush():
                self._written.add(poller.name)
        except OSError as exc:
            self._give_up(f"cannot write {writer.path} ({exc.strerror or exc})")
            return
        if poller.name in self._written and not os.path.exists(writer.path):
            self._give_up(f"{writer.path} was removed")  # writes would go to a file nobody can read
            return
        if records:
            self.latest[poller.name] = records

    def _give_up(self, why: str) -> None:
        """Stops all sampling for good: closes pollers and files, sets :attr:`problem`."""
        self.problem = f"{why}: recording stopped, the command goes on"
        for p in self.pollers:
            with contextlib.suppress(Exception):
                p.close()
        self.pollers = []  # the thread ends at its next turn
        for w in self.writers.values():
            with contextlib.suppress(OSError, ValueError):  # closed even when its buffer cannot be written
                w.close()

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
            except (OSError, ValueError):
                pass
