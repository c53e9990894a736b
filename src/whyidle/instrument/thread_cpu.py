"""CPU time of the program's background Python threads, by the package that runs them.

An experiment tracker's writer thread (TensorBoard's event-file writer serializing histograms,
an uploader) takes CPU, and the GIL, from the training thread without ever appearing in the
training thread's own phases or stack samples. :class:`ThreadCPU` reads each live Python thread's
CPU clock (``pthread_getcpuclockid``) at every flush of the agent, keeps the last reading of
threads that end (a writer thread stops at ``writer.close()``, before exit), and writes one
``threads`` record at exit. Standard library only; Linux and other POSIX systems with per-thread
CPU clocks (elsewhere it records nothing).
"""

from __future__ import annotations

import threading
import time

#: Threads listed in the record (the busiest).
MAX_THREADS = 16
#: Threads with less CPU than this (seconds) are left out.
MIN_CPU_S = 0.01


def owner_module(t: threading.Thread) -> str | None:
    """The module that runs thread ``t``: its class's, for a ``Thread`` subclass, else its
    target's (the function or the bound method's class)."""
    cls = type(t)
    if cls.__module__ != "threading":
        return cls.__module__
    target = getattr(t, "_target", None)
    if target is None:
        return None
    owner = getattr(target, "__self__", None)
    return getattr(target, "__module__", None) or (type(owner).__module__ if owner is not None else None)


class ThreadCPU:
    """Per-thread CPU seconds of the process's Python threads other than the main thread and
    whyidle's own (``whyidle-*`` names)."""

    def __init__(self) -> None:
        self.seen: dict[int, list] = {}  # ident → [name, module, cpu_s]
        self.ok = hasattr(time, "pthread_getcpuclockid")

    def poll(self) -> list:
        """Reads the live threads' CPU clocks; returns no record (an agent collector)."""
        if not self.ok:
            return []
        main = threading.main_thread()
        for t in threading.enumerate():
            if t is main or t.ident is None or t.name.startswith("whyidle"):
                continue
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ValueError, OverflowError):
                continue  # ended between enumerate() and the read
            row = self.seen.get(t.ident)
            if row is None or row[0] != t.name:  # a new thread (idents are reused)
                self.seen[t.ident] = [t.name, owner_module(t), cpu]
            else:
                row[2] = cpu
        return []

    def record(self, t: int) -> dict | None:
        """The ``threads`` record: the busiest threads' ``{name, module, cpu_s}`` (None when none used
        ``MIN_CPU_S``)."""
        rows = sorted((r for r in self.seen.values() if r[2] >= MIN_CPU_S), key=lambda r: -r[2])[:MAX_THREADS]
        if not rows:
            return None
        return {"k": "threads", "t": t, "threads": [{"name": n, "module": m, "cpu_s": round(c, 4)} for n, m, c in rows]}
